//! Keys Redis has rejected, with the time until which they stay rejected.
//!
//! A rejection stands until its retry time whatever the other replicas do:
//! they can only add to a key's usage. So a request on a cached key is
//! refused here, without a round trip, and a flood from one key costs Redis
//! one command per retry period instead of one per request.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::clock::Clock;

use crate::limiter::{groups, Algorithm, Check, Decision, Verdict};

const SHARDS: usize = 16;
/// Entries a shard holds before it drops expired ones (then everything).
const SHARD_CAPACITY: usize = 8192;

pub struct RejectCache {
    shards: Box<[Mutex<HashMap<u64, Instant>>]>,
    /// The latest time any entry stays rejected, in ms after `origin`: once
    /// it has passed, every entry has expired and a request takes no lock.
    latest: AtomicU64,
    origin: Instant,
    clock: Clock,
    hasher: std::collections::hash_map::RandomState,
}

impl RejectCache {
    pub fn new(clock: Clock) -> Self {
        RejectCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            latest: AtomicU64::new(0),
            origin: clock.now(),
            clock,
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    /// `limit` is the limit's Redis key suffix (its name): stable across a
    /// reload, unlike its position.
    fn hash(&self, limit: &str, key: &str) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(limit.as_bytes());
        h.write_u8(0xff);
        h.write(key.as_bytes());
        h.finish()
    }

    fn shard(&self, hash: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Instant>> {
        self.shards[(hash >> 59) as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn ms(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.origin).as_millis() as u64
    }

    /// Now, on the clock its entries are timed by.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Whether no entry is still rejected at `now`.
    pub fn is_idle(&self, now: Instant) -> bool {
        self.latest.load(Ordering::Relaxed) <= self.ms(now)
    }

    /// How long `key` of limit `limit` stays rejected, if it is cached.
    pub fn rejected_for(&self, limit: &str, key: &str, now: Instant) -> Option<Duration> {
        let hash = self.hash(limit, key);
        let mut shard = self.shard(hash);
        let until = *shard.get(&hash)?;
        if until > now {
            Some(until - now)
        } else {
            shard.remove(&hash);
            None
        }
    }

    /// Forgets every key (resets may have been missed).
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            shard.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    /// Drops `key` of limit `limit` (its state was reset).
    pub fn forget(&self, limit: &str, key: &str) {
        let hash = self.hash(limit, key);
        self.shard(hash).remove(&hash);
    }

    pub fn insert(&self, limit: &str, key: &str, until: Instant) {
        // Rounded up: `is_idle` must never pass over a live entry.
        self.latest.fetch_max(self.ms(until) + 1, Ordering::Relaxed);
        let hash = self.hash(limit, key);
        let mut shard = self.shard(hash);
        if shard.len() >= SHARD_CAPACITY {
            let now = self.clock.now();
            shard.retain(|_, t| *t > now);
            if shard.len() >= SHARD_CAPACITY {
                shard.clear();
            }
        }
        shard.insert(hash, until);
    }
}

/// The first enforced group with a key cached as rejected: where it
/// starts, and per check of it how long it stays rejected.
/// `names[zone]` is each limit's Redis key suffix.
pub(super) fn cached_cut(
    cache: &RejectCache,
    names: &[String],
    checks: &[Check<'_>],
    now: Instant,
) -> Option<Cut> {
    if cache.is_idle(now) {
        return None;
    }
    let mut start = 0;
    for group in groups(checks) {
        if !group[0].dry_run {
            let waits: Vec<Option<Duration>> = group
                .iter()
                .map(|c| cache.rejected_for(&names[c.limit.zone], c.key, now))
                .collect();
            if waits.iter().any(Option::is_some) {
                return Some(Cut { start, waits });
            }
        }
        start += group.len();
    }
    None
}

/// Remembers the keys Redis rejected, until their retry time.
pub(super) fn remember(
    cache: &RejectCache,
    names: &[String],
    checks: &[Check<'_>],
    decisions: &[Decision],
    now: Instant,
) {
    for (c, d) in checks.iter().zip(decisions) {
        if !c.dry_run && !d.admitted() && d.retry_after_ms > 0 {
            cache.insert(
                &names[c.limit.zone],
                c.key,
                now + Duration::from_millis(d.retry_after_ms),
            );
        }
    }
}

/// A group answered partly from the rejection cache.
pub(super) struct Cut {
    /// Index of the group's first check.
    pub start: usize,
    /// Per check of the group: how long it stays rejected, if cached.
    pub waits: Vec<Option<Duration>>,
}

/// The decision for a key the cache knows is rejected for `wait`.
pub(super) fn cached_rejection(algorithm: &Algorithm, wait: Duration) -> Decision {
    let (limit, window_ms) = algorithm.policy();
    let ms = (wait.as_millis() as u64).max(1);
    Decision {
        verdict: Verdict::Reject,
        limit,
        remaining: 0,
        reset_ms: ms,
        retry_after_ms: ms,
        window_ms,
    }
}
