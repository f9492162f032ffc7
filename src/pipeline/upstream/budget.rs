//! A retry budget, as linkerd's: retries to another target are allowed
//! only while those of the last `window` stay under `ratio` of the
//! requests sent in it plus `min_per_second` times the window's seconds.
//! Under a failure rate of 50%, the upstream then sees at most
//! `1 + ratio` times the client's requests plus the minimum, where
//! retries without a budget would double them (and make an overload
//! worse).
//!
//! One second a bucket, `window` buckets in a ring, under a short lock:
//! only upstreams with a budget take it, once per request and once per
//! retry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::config::RetryBudget;

pub(super) struct Budget {
    /// Retries allowed per 1,000 requests.
    per_mille: u64,
    /// Retries allowed besides, over the whole window.
    reserve: u64,
    /// Per second of the window: (which second, requests, retries).
    buckets: Mutex<Box<[(u64, u64, u64)]>>,
    /// Retries the budget refused.
    pub refused: AtomicU64,
}

impl Budget {
    pub fn new(cfg: &RetryBudget) -> Self {
        let seconds = cfg.window.as_secs().max(1);
        Budget {
            per_mille: u64::from(cfg.per_mille),
            reserve: u64::from(cfg.min_per_second) * seconds,
            buckets: Mutex::new(vec![(u64::MAX, 0, 0); seconds as usize].into()),
            refused: AtomicU64::new(0),
        }
    }

    /// A request was sent (its first attempt), in second `now`.
    pub fn deposit(&self, now: u64) {
        self.bucket(now, |b| b.1 += 1);
    }

    /// A retry in second `now`: true (and counted) when the budget has
    /// room for it.
    pub fn withdraw(&self, now: u64) -> bool {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let len = buckets.len() as u64;
        let (requests, retries) = buckets
            .iter()
            .filter(|(second, _, _)| *second != u64::MAX && now.saturating_sub(*second) < len)
            .fold((0, 0), |(q, r), b| (q + b.1, r + b.2));
        if (retries + 1) * 1000 > requests * self.per_mille + self.reserve * 1000 {
            drop(buckets);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        Self::at(&mut buckets, now).2 += 1;
        true
    }

    fn bucket(&self, now: u64, f: impl FnOnce(&mut (u64, u64, u64))) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        f(Self::at(&mut buckets, now));
    }

    /// Second `now`'s bucket, emptied if it last held an older second.
    fn at(buckets: &mut [(u64, u64, u64)], now: u64) -> &mut (u64, u64, u64) {
        let len = buckets.len() as u64;
        let b = &mut buckets[(now % len) as usize];
        if b.0 != now {
            *b = (now, 0, 0);
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn retries_stay_under_the_ratio_plus_the_reserve() {
        let b = Budget::new(&RetryBudget {
            per_mille: 200,
            min_per_second: 1,
            window: Duration::from_secs(10),
        });
        // 10 in reserve, then one for every five requests.
        let mut allowed = 0;
        for i in 0..1000 {
            b.deposit(i / 100);
            if i % 2 == 0 && b.withdraw(i / 100) {
                allowed += 1;
            }
        }
        // 1,000 requests over 10 s, one in two failing: 200 + 10 retries.
        assert!((205..=210).contains(&allowed), "{allowed}");
        assert_eq!(b.refused.load(Ordering::Relaxed), 500 - allowed);
        // A window later, the old seconds no longer count.
        assert!(b.withdraw(30));
    }
}
