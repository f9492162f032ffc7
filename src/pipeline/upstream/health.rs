//! Passive health, by nginx's rules (`max_fails`, `fail_timeout`): a
//! target that failed `max_fails` times within `fail_timeout` (a connect
//! error, a timeout, a connection lost before the answer head, an answer
//! that is not HTTP) is marked down for `fail_timeout`; then one request
//! probes it (the others keep skipping it): an answer brings it back, a
//! failure marks it down again. An upstream of one target never marks it
//! down (nginx neither), and `max_fails: 0` never does.
//!
//! Atomics only, shared by every worker; times are ms on the upstream's
//! clock.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub struct Health {
    max_fails: u32,
    fail_timeout_ms: u64,
    /// Failures counted since the first of them, at `first_fail_ms`.
    fails: AtomicU32,
    first_fail_ms: AtomicU64,
    /// Until when it is skipped (0: up).
    down_until_ms: AtomicU64,
}

impl Health {
    pub fn new(max_fails: u32, fail_timeout_ms: u64) -> Self {
        Health {
            max_fails,
            fail_timeout_ms,
            fails: AtomicU32::new(0),
            first_fail_ms: AtomicU64::new(0),
            down_until_ms: AtomicU64::new(0),
        }
    }

    /// Whether it is marked down at `now` (read without a clock when it is
    /// up: most requests meet no down target).
    pub fn down(&self, now_ms: impl FnOnce() -> u64) -> bool {
        let until = self.down_until_ms.load(Ordering::Relaxed);
        until != 0 && until > now_ms()
    }

    /// It was picked (at `now`, read only for a target with failures): a
    /// target whose time down has passed takes this one request as its
    /// probe, and is skipped by the others until the probe ends.
    pub fn picked(&self, now_ms: impl FnOnce() -> u64) {
        if self.max_fails != 0 && self.fails.load(Ordering::Relaxed) >= self.max_fails {
            self.down_until_ms
                .store(now_ms() + self.fail_timeout_ms, Ordering::Relaxed);
        }
    }

    /// A failure at `now`; `alone`: its upstream has no other target.
    /// True when this failure marked it down.
    pub fn failed(&self, now_ms: u64, alone: bool) -> bool {
        if alone || self.max_fails == 0 {
            return false;
        }
        let first = self.first_fail_ms.load(Ordering::Relaxed);
        let fails = if self.fails.load(Ordering::Relaxed) == 0
            || now_ms.saturating_sub(first) > self.fail_timeout_ms
                && self.down_until_ms.load(Ordering::Relaxed) == 0
        {
            // The first failure of a new window.
            self.first_fail_ms.store(now_ms, Ordering::Relaxed);
            self.fails.store(1, Ordering::Relaxed);
            1
        } else {
            self.fails.fetch_add(1, Ordering::Relaxed) + 1
        };
        if fails >= self.max_fails {
            self.down_until_ms
                .store(now_ms + self.fail_timeout_ms, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Until when it is marked down (ms), if it has been.
    pub fn down_until(&self) -> Option<u64> {
        Some(self.down_until_ms.load(Ordering::Relaxed)).filter(|&u| u != 0)
    }

    /// Every target was down: its failures are forgotten so the next
    /// request tries it again (panic mode).
    pub fn revive(&self) {
        self.fails.store(0, Ordering::Relaxed);
        self.down_until_ms.store(0, Ordering::Relaxed);
    }

    /// An answer came: its failures are forgotten, and it is up. True
    /// when it had been marked down (it comes back).
    pub fn succeeded(&self) -> bool {
        if self.fails.load(Ordering::Relaxed) != 0 {
            self.fails.store(0, Ordering::Relaxed);
            return self.down_until_ms.swap(0, Ordering::Relaxed) != 0;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_fails_within_fail_timeout_mark_it_down_then_one_request_probes() {
        let h = Health::new(3, 2000);
        assert!(!h.failed(0, false));
        assert!(!h.failed(500, false));
        // The third within 2 s: down for 2 s.
        assert!(h.failed(1500, false));
        assert!(h.down(|| 3000) && !h.down(|| 3501));
        // The probe: picked, the others skip it; it fails, down again.
        h.picked(|| 3600);
        assert!(h.down(|| 3700));
        assert!(h.failed(3800, false));
        assert!(h.down(|| 5000));
        // A probe that is answered brings it back.
        h.picked(|| 6000);
        h.succeeded();
        assert!(!h.down(|| 6001));
        // Failures further apart than fail_timeout never add up.
        for t in [10_000, 12_500, 15_000] {
            assert!(!h.failed(t, false));
        }
    }

    #[test]
    fn alone_or_max_fails_zero_never_down() {
        let h = Health::new(1, 10_000);
        assert!(!h.failed(0, true));
        assert!(!h.down(|| 1));
        let never = Health::new(0, 10_000);
        assert!(!never.failed(0, false));
        assert!(!never.down(|| 1));
    }
}
