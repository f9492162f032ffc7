//! Numbers other than a limit's own: a plan's (from the config) and a
//! key's override (set at run time through the admin API).
//!
//! - [`Numbers`]: the parts of a limit that may change (`limit`/`window`,
//!   `rate`/`burst`), each optional, laid over the limit's own algorithm.
//! - [`Overrides`]: per limit name and key, numbers and an optional expiry.
//!   On the memory store the table is the truth (it survives a reload, not
//!   a restart). On Redis the truth is a hash in Redis with a version
//!   counter; each replica keeps a copy, and a single Redis refuses a
//!   decision made under an older version than its own (see `decide.lua`),
//!   so every replica uses an override from the next request after it was
//!   set. A Redis Cluster cannot check the version in the same script (it
//!   lives in another slot): replicas there reload the table every second.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use super::Algorithm;

/// Numbers laid over a limit's own; `None` keeps the limit's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Numbers {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
    /// A rate: `amount` per `period_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
}

impl Numbers {
    /// `base` with these numbers, checked like a configured limit's; the
    /// message names the field the way the config writes it.
    pub fn apply(&self, base: &Algorithm) -> Result<Algorithm, String> {
        let windowed = self.amount.is_none() && self.period_ms.is_none() && self.burst.is_none();
        let rated = self.limit.is_none() && self.window_ms.is_none();
        let out = match *base {
            Algorithm::Quota {
                limit,
                ref calendar,
            } => {
                if !windowed || self.window_ms.is_some() {
                    return Err("a quota takes a limit (its period is the config's)".into());
                }
                Algorithm::Quota {
                    limit: self.limit.unwrap_or(limit),
                    calendar: calendar.clone(),
                }
            }
            Algorithm::FixedWindow { limit, window_ms }
            | Algorithm::SlidingWindow { limit, window_ms }
            | Algorithm::SlidingLog { limit, window_ms } => {
                if !windowed {
                    return Err(format!("{} takes limit and window", base.name()));
                }
                let (limit, window_ms) = (
                    self.limit.unwrap_or(limit),
                    self.window_ms.unwrap_or(window_ms),
                );
                match base {
                    Algorithm::FixedWindow { .. } => Algorithm::FixedWindow { limit, window_ms },
                    Algorithm::SlidingWindow { .. } => {
                        Algorithm::SlidingWindow { limit, window_ms }
                    }
                    _ => Algorithm::SlidingLog { limit, window_ms },
                }
            }
            Algorithm::TokenBucket {
                amount,
                period_ms,
                burst,
            }
            | Algorithm::Gcra {
                amount,
                period_ms,
                burst,
            } => {
                if !rated {
                    return Err(format!("{} takes rate and burst", base.name()));
                }
                let amount = self.amount.unwrap_or(amount);
                let period_ms = self.period_ms.unwrap_or(period_ms);
                // A new rate without a burst: a burst of one period's worth,
                // as the config's default.
                let burst =
                    self.burst
                        .unwrap_or(if self.amount.is_some() { amount } else { burst });
                Algorithm::rated(
                    matches!(base, Algorithm::Gcra { .. }),
                    amount,
                    period_ms,
                    burst,
                )
            }
            Algorithm::Leaky {
                rate_milli,
                burst,
                delay,
            } => {
                if !rated {
                    return Err("a zone takes rate and burst".into());
                }
                let rate_milli = match (self.amount, self.period_ms) {
                    (Some(n), Some(p)) => n * 1_000_000 / p.max(1),
                    _ => rate_milli,
                };
                Algorithm::Leaky {
                    rate_milli,
                    burst: self.burst.unwrap_or(burst),
                    delay,
                }
            }
        };
        out.validate()?;
        Ok(out)
    }
}

/// One key's override.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Override {
    pub numbers: Numbers,
    /// Unix ms after which it no longer applies; `None`: until deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
}

impl Override {
    pub fn live(&self, now_ms: u64) -> bool {
        self.expires_ms.is_none_or(|e| now_ms < e)
    }
}

/// Per limit name, per key.
pub type Table = HashMap<Arc<str>, HashMap<String, Override>>;

/// The overrides this process applies; see the module docs.
#[derive(Default)]
pub struct Overrides {
    /// `version << 1 | 1` when the table holds anything: one load tells a
    /// request without overrides all it needs.
    state: AtomicU64,
    table: RwLock<Table>,
}

impl Overrides {
    /// The override of `key` under the limit `limit` live at `now_ms`
    /// (asked only when there are overrides), and the version of the table
    /// it was read from.
    pub fn lookup(
        &self,
        limit: &str,
        key: &str,
        now_ms: impl FnOnce() -> u64,
    ) -> (Option<Numbers>, u64) {
        let state = self.state.load(Ordering::Acquire);
        if state & 1 == 0 {
            return (None, state >> 1);
        }
        let now_ms = now_ms();
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        let found = table
            .get(limit)
            .and_then(|keys| keys.get(key))
            .filter(|o| o.live(now_ms))
            .map(|o| o.numbers);
        (found, self.state.load(Ordering::Acquire) >> 1)
    }

    /// The version of the table.
    pub fn version(&self) -> u64 {
        self.state.load(Ordering::Acquire) >> 1
    }

    /// Replaces the whole table (read from Redis at `version`).
    pub fn replace(&self, version: u64, table: Table) {
        let mut t = self.table.write().unwrap_or_else(|e| e.into_inner());
        let filled = table.values().any(|k| !k.is_empty());
        *t = table;
        self.state
            .store(version << 1 | u64::from(filled), Ordering::Release);
    }

    /// Sets (`Some`) or deletes one override here (the memory store's
    /// table), and forgets those expired at `now_ms`; whether one was
    /// there before.
    pub fn put(&self, limit: &str, key: &str, value: Option<Override>, now_ms: u64) -> bool {
        let mut t = self.table.write().unwrap_or_else(|e| e.into_inner());
        for keys in t.values_mut() {
            keys.retain(|_, o| o.live(now_ms));
        }
        let before = match value {
            Some(o) => t
                .entry(Arc::from(limit))
                .or_default()
                .insert(key.to_owned(), o)
                .is_some(),
            None => t.get_mut(limit).and_then(|keys| keys.remove(key)).is_some(),
        };
        t.retain(|_, keys| !keys.is_empty());
        let version = (self.state.load(Ordering::Acquire) >> 1) + 1;
        self.state
            .store(version << 1 | u64::from(!t.is_empty()), Ordering::Release);
        before
    }

    /// Every override live at `now_ms`: (limit, key, override), sorted.
    pub fn list(&self, now_ms: u64) -> Vec<(Arc<str>, String, Override)> {
        let t = self.table.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = t
            .iter()
            .flat_map(|(limit, keys)| {
                keys.iter()
                    .filter(|(_, o)| o.live(now_ms))
                    .map(|(k, o)| (limit.clone(), k.clone(), o.clone()))
            })
            .collect();
        out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        out
    }
}

/// The Redis hash field of one override: limit name and key, which never
/// holds the unit separator.
pub fn field(limit: &str, key: &str) -> String {
    format!("{limit}\u{1f}{key}")
}

/// The table from the Redis hash's fields and values; entries it cannot
/// read are skipped (and logged).
pub fn table_of(entries: impl IntoIterator<Item = (String, String)>) -> Table {
    let mut table = Table::new();
    for (f, v) in entries {
        let parsed = f
            .split_once('\u{1f}')
            .zip(serde_json::from_str::<Override>(&v).ok());
        match parsed {
            Some(((limit, key), o)) => {
                table
                    .entry(Arc::from(limit))
                    .or_default()
                    .insert(key.to_owned(), o);
            }
            None => {
                tracing::warn!(field = %f.replace('\u{1f}', "/"), "rate-limit store: an override in Redis cannot be read; it is skipped")
            }
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_lay_over_a_limit_and_are_checked() {
        let window = Algorithm::SlidingWindow {
            limit: 60,
            window_ms: 60_000,
        };
        let more = Numbers {
            limit: Some(6000),
            ..Numbers::default()
        };
        assert_eq!(
            more.apply(&window),
            Ok(Algorithm::SlidingWindow {
                limit: 6000,
                window_ms: 60_000
            })
        );
        let rate = Numbers {
            amount: Some(10),
            period_ms: Some(1000),
            ..Numbers::default()
        };
        assert!(rate
            .apply(&window)
            .unwrap_err()
            .contains("limit and window"));
        let bucket = Algorithm::TokenBucket {
            amount: 1,
            period_ms: 1000,
            burst: 5,
        };
        assert_eq!(
            rate.apply(&bucket),
            Ok(Algorithm::TokenBucket {
                amount: 10,
                period_ms: 1000,
                burst: 10
            })
        );
        let zero = Numbers {
            limit: Some(0),
            ..Numbers::default()
        };
        assert!(zero.apply(&window).is_err());
    }

    #[test]
    fn a_lookup_sees_live_overrides_and_the_version_moves() {
        let o = Overrides::default();
        assert_eq!(o.lookup("api", "user:a", || 0), (None, 0));
        let n = Numbers {
            limit: Some(5),
            ..Numbers::default()
        };
        o.put(
            "api",
            "user:a",
            Some(Override {
                numbers: n,
                expires_ms: Some(1000),
            }),
            0,
        );
        assert_eq!(o.lookup("api", "user:a", || 999), (Some(n), 1));
        assert_eq!(o.lookup("api", "user:a", || 1000), (None, 1), "expired");
        assert_eq!(o.lookup("api", "user:b", || 0), (None, 1));
        assert!(o.put("api", "user:a", None, 0));
        assert_eq!(o.lookup("api", "user:a", || 0), (None, 2));
        assert!(o.list(0).is_empty());
    }
}
