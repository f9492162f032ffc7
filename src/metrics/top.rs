//! Top offenders per limit: the keys with the most rejections in the last
//! few minutes, from a bounded heavy-hitter sketch (Space-Saving, Metwally
//! et al. 2005). Memory is fixed whatever the number of attacking keys:
//! [`CAPACITY`] entries per window, key strings reused in place.
//!
//! Space-Saving keeps at most `CAPACITY` keys. A key not in the sketch
//! replaces the one with the smallest count and starts from that count
//! plus one, remembering it as its `error`: every key rejected more than
//! 1/`CAPACITY` of the window's rejections is guaranteed to be listed, and
//! a count over-estimates by at most its `error`.
//!
//! Two windows rotate every [`WINDOW`]: a report merges the current one and
//! the previous one, so it covers the last one to two windows.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Keys tracked per window.
pub const CAPACITY: usize = 256;
/// How long a window lasts before it becomes the previous one.
pub const WINDOW: Duration = Duration::from_secs(300);

/// One offender as reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offender {
    pub key: String,
    /// Rejections counted (an over-estimate by at most `error`).
    pub count: u64,
    pub error: u64,
}

/// One window's Space-Saving sketch (also what alert rules count with).
#[derive(Debug, Default)]
pub(crate) struct Sketch {
    entries: Vec<Offender>,
    /// The entry hit last: a flood from one key finds it at once.
    last: usize,
}

impl Sketch {
    /// Counts one more for `key`: its (count, error) now.
    pub(crate) fn record(&mut self, key: &str) -> (u64, u64) {
        if let Some(e) = self.entries.get_mut(self.last).filter(|e| e.key == key) {
            e.count += 1;
            return (e.count, e.error);
        }
        if let Some(i) = self.entries.iter().position(|e| e.key == key) {
            self.entries[i].count += 1;
            self.last = i;
            return (self.entries[i].count, self.entries[i].error);
        }
        if self.entries.len() < CAPACITY {
            self.last = self.entries.len();
            self.entries.push(Offender {
                key: key.to_owned(),
                count: 1,
                error: 0,
            });
            return (1, 0);
        }
        // Replace the smallest, reusing its string's allocation.
        if let Some((i, min)) = self
            .entries
            .iter_mut()
            .enumerate()
            .min_by_key(|(_, e)| e.count)
        {
            min.error = min.count;
            min.count += 1;
            min.key.clear();
            min.key.push_str(key);
            self.last = i;
            return (min.count, min.error);
        }
        (1, 0)
    }

    /// The `n` keys counted most, most first (ties by key).
    pub(crate) fn top(&self, n: usize) -> Vec<Offender> {
        let mut top = self.entries.clone();
        sort(&mut top);
        top.truncate(n);
        top
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.last = 0;
    }
}

#[derive(Debug)]
struct Windows {
    current: Sketch,
    previous: Sketch,
    started: Instant,
}

/// The sketch of one limit.
#[derive(Debug)]
pub struct TopKeys {
    windows: Mutex<Windows>,
}

impl TopKeys {
    pub fn new(now: Instant) -> Self {
        TopKeys {
            windows: Mutex::new(Windows {
                current: Sketch::default(),
                previous: Sketch::default(),
                started: now,
            }),
        }
    }

    /// One rejection of `key` at `now`.
    pub fn record(&self, key: &str, now: Instant) {
        let mut w = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if now.duration_since(w.started) >= WINDOW {
            let w = &mut *w;
            std::mem::swap(&mut w.previous, &mut w.current);
            w.current.clear();
            w.started = now;
        }
        w.current.record(key);
    }

    /// The `n` keys with the most rejections over the current and the
    /// previous window, most first.
    pub fn top(&self, n: usize) -> Vec<Offender> {
        let w = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let mut merged: Vec<Offender> = w.current.entries.clone();
        for p in &w.previous.entries {
            match merged.iter_mut().find(|m| m.key == p.key) {
                Some(m) => {
                    m.count += p.count;
                    m.error += p.error;
                }
                None => merged.push(p.clone()),
            }
        }
        drop(w);
        sort(&mut merged);
        merged.truncate(n);
        merged
    }

    /// Entries held now, for tests of the memory bound.
    #[cfg(test)]
    fn len(&self) -> usize {
        let w = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        w.current.entries.len() + w.previous.entries.len()
    }
}

/// Most counted first, ties by key.
fn sort(offenders: &mut [Offender]) {
    offenders.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
}

/// A key as an operator reads it: `ip:203.0.113.7` is `203.0.113.7`, an
/// IPv6 prefix is `2001:db8:1:2::/64`; user, header and global keys are
/// shown as they are (they never hold a secret: header values and API keys
/// are hashed).
pub fn display(key: &str) -> &str {
    key.strip_prefix("ip:").unwrap_or(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavy_keys_stand_out_of_a_hundred_thousand_with_fixed_memory() {
        let t0 = crate::clock::FrozenClock::new().clock().now();
        let top = TopKeys::new(t0);
        let heavy = ["ip:198.51.100.1", "ip:198.51.100.2", "user:jwt:mallory"];
        for i in 0..100_000u32 {
            top.record(
                &format!("ip:10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255),
                t0,
            );
            if i % 50 == 0 {
                // 2,000 rejections each: 2% of the traffic.
                for h in heavy {
                    top.record(h, t0);
                }
            }
            assert!(top.len() <= CAPACITY);
        }
        let top10: Vec<String> = top.top(10).into_iter().map(|o| o.key).collect();
        for h in heavy {
            assert!(top10.iter().any(|k| k == h), "{h} not in {top10:?}");
        }
        assert_eq!(top.len(), CAPACITY, "memory is fixed");
    }

    #[test]
    fn windows_rotate_and_old_ones_are_forgotten() {
        let t0 = crate::clock::FrozenClock::new().clock().now();
        let top = TopKeys::new(t0);
        for _ in 0..5 {
            top.record("ip:1.2.3.4", t0);
        }
        top.record("ip:5.6.7.8", t0 + WINDOW);
        let now: Vec<(String, u64)> = top.top(5).into_iter().map(|o| (o.key, o.count)).collect();
        assert_eq!(
            now,
            [("ip:1.2.3.4".to_owned(), 5), ("ip:5.6.7.8".to_owned(), 1)],
            "previous window still counts"
        );
        top.record("ip:5.6.7.8", t0 + 2 * WINDOW);
        let later: Vec<String> = top.top(5).into_iter().map(|o| o.key).collect();
        assert_eq!(
            later,
            ["ip:5.6.7.8"],
            "two windows later the old key is gone"
        );
    }

    #[test]
    fn keys_read_as_operators_write_them() {
        assert_eq!(display("ip:203.0.113.7"), "203.0.113.7");
        assert_eq!(display("ip:2001:db8:1:2::/64"), "2001:db8:1:2::/64");
        assert_eq!(display("user:jwt:42"), "user:jwt:42");
        assert_eq!(display("global"), "global");
    }
}
