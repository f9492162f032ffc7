//! The store the proxy asks: the memory store, or Redis with the memory
//! store beside it for the `local` failure mode. When Redis fails or times
//! out, each limit follows its `on_error` here and nowhere else:
//!
//! - `fail_closed`: the request is refused ([`LimiterError::Closed`], a 503);
//! - `fail_open`: the limit admits, reporting its full quota;
//! - `local`: this process's memory store decides, with the limit divided by
//!   `store.replicas` so N replicas together stay near it.
//!
//! Groups keep their meaning in every mode (see [`Store::decide`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::memory::{Carry, MemoryStore, ZoneSpec};
use super::overrides::{Override, Overrides};
use super::penalty::PenaltyBox;
use super::redis::{RedisOptions, RedisStore};
use super::{
    decide_in_groups, Check, Decision, Limit, LimiterError, OnError, Outcome, Store, Verdict,
};
use crate::clock::Clock;
use crate::metrics::{Histogram, HistogramSnapshot, CALL_BOUNDS};

pub struct Engine {
    /// The store when no Redis is configured; the `local` fallback otherwise.
    memory: MemoryStore,
    redis: Option<RedisStore>,
    /// Kept across reloads.
    stats: Arc<Stats>,
    /// Per-key overrides (kept across reloads; on Redis, a copy of Redis's).
    overrides: Arc<Overrides>,
    /// The penalty box (kept across reloads; on Redis, a copy of the bans).
    penalties: Arc<PenaltyBox>,
}

mod conns;
mod penalty;

/// What the engine counts, for metrics and warnings.
struct Stats {
    /// Requests decided without Redis since the last warning, and the
    /// second that warning was logged in: at most one warning a second.
    degraded: (AtomicU64, AtomicU64),
    /// Store calls by result: ok, error, timeout (for metrics).
    calls: [AtomicU64; 3],
    /// Requests decided by each failure mode: fail_open, fail_closed, local.
    fallbacks: [AtomicU64; 3],
    /// How long Redis took to decide (only with Redis: a clock read a call).
    durations: Histogram,
    /// Settlements that could not reach Redis (their reservation stands).
    unsettled: AtomicU64,
    /// On a cluster: when the overrides were last read (ms).
    overrides_read: AtomicU64,
}

impl Engine {
    /// A memory store with one partition per zone spec, and `redis` when
    /// limits are shared.
    pub fn new(zones: &[ZoneSpec], redis: Option<RedisStore>, clock: Clock) -> Self {
        Engine {
            memory: MemoryStore::with_clock(zones, clock),
            redis,
            stats: Arc::new(Stats {
                degraded: (AtomicU64::new(0), AtomicU64::new(0)),
                calls: Default::default(),
                fallbacks: Default::default(),
                durations: Histogram::new(&CALL_BOUNDS),
                unsettled: AtomicU64::new(0),
                overrides_read: AtomicU64::new(0),
            }),
            overrides: Arc::default(),
            penalties: Arc::default(),
        }
    }

    /// The engine for a reloaded config: the memory store keeps the state
    /// of the limits `carry` matches (see [`MemoryStore::reloaded`]); Redis
    /// keeps its connection unless `redis` changed, in which case it
    /// connects anew. Counters go on.
    pub async fn reloaded(
        &self,
        redis: Option<&RedisOptions>,
        zones: &[ZoneSpec],
        carry: &[Option<Carry>],
    ) -> Result<Engine, String> {
        let store = match (redis, &self.redis) {
            (None, _) => None,
            (Some(o), Some(r)) if r.options() == o => Some(r.reloaded(zones)),
            (Some(o), _) => {
                // Another Redis: its bans are followed anew (the pipeline
                // built on this engine starts the subscription).
                self.penalties
                    .watching
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                Some(connect(o, zones, self.clock()).await?)
            }
        };
        Ok(Engine {
            memory: self.memory.reloaded(zones, carry),
            redis: store,
            stats: self.stats.clone(),
            overrides: self.overrides.clone(),
            penalties: self.penalties.clone(),
        })
    }

    /// Connects Redis when `redis` is set. An unreachable Redis is logged,
    /// not fatal: limits follow `on_error` until it answers.
    /// Every decision and expiry reads `clock`.
    pub async fn open(
        redis: Option<&RedisOptions>,
        zones: &[ZoneSpec],
        clock: Clock,
    ) -> Result<Self, String> {
        let store = match redis {
            Some(options) => Some(connect(options, zones, &clock).await?),
            None => None,
        };
        let engine = Engine::new(zones, store, clock);
        if engine.redis.is_some() {
            // Not fatal: the first decision finds the version stale and
            // reads them again.
            let _ = engine.refresh_overrides().await;
            // The bans in force, so a replica starting refuses them from
            // its first request (not fatal either: its subscription reads
            // them again).
            engine.load_bans().await;
        }
        Ok(engine)
    }

    /// The overrides this process applies.
    pub fn overrides(&self) -> &Overrides {
        &self.overrides
    }

    /// Reads the overrides from Redis again (nothing to do without it).
    pub async fn refresh_overrides(&self) -> Result<(), LimiterError> {
        if let Some(redis) = &self.redis {
            let (version, table) = redis.load_overrides().await?;
            self.overrides.replace(version, table);
            self.stats
                .overrides_read
                .store(self.memory.now_ms(), Ordering::Relaxed);
        }
        Ok(())
    }

    /// Sets (`Some`) or deletes the override of `key` under the limits
    /// `limits` (every limit of one name), in the store every replica
    /// reads; whether one was there before. Every replica forgets its
    /// cached rejections of the key under them (`store.cache_rejections`),
    /// so the new numbers hold at once there too.
    pub async fn put_override(
        &self,
        limits: &[&Limit],
        key: &str,
        value: Option<Override>,
    ) -> Result<bool, LimiterError> {
        let Some(name) = limits.first().map(|l| l.name.clone()) else {
            return Ok(false);
        };
        match &self.redis {
            None => Ok(self
                .overrides
                .put(&name, key, value, self.clock().unix_ms())),
            Some(redis) => {
                let had = redis.put_override(&name, key, value.as_ref()).await?;
                self.refresh_overrides().await?;
                for limit in limits {
                    redis.forget_cached(limit, key).await;
                }
                Ok(had)
            }
        }
    }

    /// Settles reserved costs: per limit and key, `delta` units more than
    /// reserved `age_ms` ago (fewer when negative), in the store that took
    /// the reservation (`degraded`: this process's memory, as the failure
    /// mode decided; a `fail_open` limit reserved nothing). A Redis that
    /// fails is logged and counted, never retried: the reservation stands.
    pub async fn settle(
        &self,
        items: &[(&Limit, &str, i64)],
        age_ms: u64,
        degraded: bool,
    ) -> Result<(), LimiterError> {
        match &self.redis {
            Some(redis) if !degraded => {
                let settled = redis.settle(items, age_ms).await;
                if let Err(e) = &settled {
                    self.stats.unsettled.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "rate-limit store: a reserved cost could not be settled; the reservation stands");
                }
                settled
            }
            Some(_) => {
                for (limit, key, delta) in items {
                    if limit.on_error == OnError::Local {
                        let local = local_limit(limit);
                        self.memory.settle(&local, key, age_ms, *delta);
                    }
                }
                Ok(())
            }
            None => {
                for (limit, key, delta) in items {
                    self.memory.settle(limit, key, age_ms, *delta);
                }
                Ok(())
            }
        }
    }

    /// Settlements that could not reach Redis, for metrics.
    pub fn unsettled(&self) -> u64 {
        self.stats.unsettled.load(Ordering::Relaxed)
    }

    /// The clock its decisions read (and what else the request path times).
    pub fn clock(&self) -> &Clock {
        self.memory.clock()
    }

    /// The Redis store, when limits are shared through Redis.
    pub fn redis(&self) -> Option<&RedisStore> {
        self.redis.as_ref()
    }

    pub fn memory(&self) -> &MemoryStore {
        &self.memory
    }

    /// `(store, result, calls)` for metrics.
    pub fn calls(&self) -> Vec<(&'static str, &'static str, u64)> {
        let store = if self.redis.is_some() {
            "redis"
        } else {
            "memory"
        };
        ["ok", "error", "timeout"]
            .into_iter()
            .zip(&self.stats.calls)
            .map(|(result, n)| (store, result, n.load(Ordering::Relaxed)))
            .collect()
    }

    /// Redis decision latency, for metrics (`None` without Redis).
    pub fn durations(&self) -> Option<HistogramSnapshot> {
        self.redis.as_ref().map(|_| self.stats.durations.snapshot())
    }

    /// `(mode, requests)` decided by each failure mode, for metrics.
    pub fn fallbacks(&self) -> Vec<(&'static str, u64)> {
        ["fail_open", "fail_closed", "local"]
            .into_iter()
            .zip(&self.stats.fallbacks)
            .map(|(mode, n)| (mode, n.load(Ordering::Relaxed)))
            .collect()
    }

    /// What the next request (cost 1) on `key` under `limit` would be told,
    /// as the store sees it, without charging it; `None` when the store
    /// holds nothing for the key. With Redis, Redis is asked (a Redis that
    /// fails is an error here, not a fallback).
    pub async fn inspect(
        &self,
        limit: &Limit,
        key: &str,
    ) -> Result<Option<Decision>, LimiterError> {
        match &self.redis {
            None => Ok(self.memory.peek_at(limit, key, self.memory.now_ms())),
            Some(redis) => redis.inspect(limit, key).await,
        }
    }

    /// Forgets `key` under `limit` everywhere this process keeps it: the
    /// memory store (the whole state, or the `local` fallback's) and Redis.
    /// Whether any state was there.
    pub async fn reset(&self, limit: &Limit, key: &str) -> Result<bool, LimiterError> {
        let local = self.memory.reset(limit.zone, key);
        match &self.redis {
            None => Ok(local),
            Some(redis) => Ok(redis.reset(limit, key).await? || local),
        }
    }

    /// Counts a request decided by `limit`'s failure mode; the 503 error a
    /// `fail_closed` one gets.
    fn fell_back(&self, limit: &Limit, err: &LimiterError) -> LimiterError {
        let n = match limit.on_error {
            OnError::FailOpen => 0,
            OnError::FailClosed => 1,
            OnError::Local => 2,
        };
        self.stats.fallbacks[n].fetch_add(1, Ordering::Relaxed);
        LimiterError::Closed {
            limit: limit.name.clone(),
            cause: err.to_string(),
        }
    }

    /// The decision without Redis, limit by limit as `on_error` says.
    fn fallback(&self, checks: &[Check<'_>], err: &LimiterError) -> Result<Outcome, LimiterError> {
        let now = self.memory.now_ms();
        self.warn_degraded(now, err);
        if let Some(c) = checks
            .iter()
            .find(|c| !c.dry_run && c.limit.on_error == OnError::FailClosed)
        {
            return Err(self.fell_back(c.limit, err));
        }
        for mode in [OnError::FailOpen, OnError::Local] {
            if let Some(c) = checks.iter().find(|c| c.limit.on_error == mode) {
                self.fell_back(c.limit, err);
            }
        }
        let local = |c: &Check<'_>| c.limit.on_error == OnError::Local;
        let mut outcome = decide_in_groups(checks, |group, decisions| {
            let scaled: Vec<Limit> = group
                .iter()
                .filter(|c| local(c))
                .map(|c| local_limit(c.limit))
                .collect();
            let local_checks: Vec<Check<'_>> = group
                .iter()
                .filter(|c| local(c))
                .zip(&scaled)
                .map(|(c, limit)| Check { limit, ..*c })
                .collect();
            let mut decided = self
                .memory
                .decide_at(&local_checks, now)
                .decisions
                .into_iter();
            for c in group {
                if local(c) {
                    decisions.extend(decided.next());
                } else {
                    decisions.push(open_decision(c));
                }
            }
        });
        outcome.degraded = true;
        Ok(outcome)
    }

    fn warn_degraded(&self, now_ms: u64, err: &LimiterError) {
        let (count, last) = &self.stats.degraded;
        count.fetch_add(1, Ordering::Relaxed);
        let second = now_ms / 1000;
        if last.load(Ordering::Relaxed) < second && last.swap(second, Ordering::Relaxed) < second {
            let n = count.swap(0, Ordering::Relaxed);
            tracing::warn!(
                error = %err,
                requests = n,
                "rate-limit store failed; these requests were decided by on_error (fail_open admits, fail_closed refuses with 503, local asks this process's memory)"
            );
        }
    }
}

/// Connects Redis; an unreachable Redis is logged, not fatal: limits
/// follow `on_error` until it answers.
async fn connect(
    options: &RedisOptions,
    zones: &[ZoneSpec],
    clock: &Clock,
) -> Result<RedisStore, String> {
    let (store, warning) = RedisStore::connect(options, zones, clock).await?;
    match warning {
        Some(why) => tracing::warn!(
            error = %why,
            "rate-limit store: Redis is not reachable yet; limits follow on_error until it is"
        ),
        None => tracing::info!(store = ?options, "rate-limit store: connected"),
    }
    Ok(store)
}

/// `limit` as this process's memory decides it for `on_error: local`: its
/// share of the numbers, a plan's kept against the limit's own share.
fn local_limit(limit: &Limit) -> Limit {
    Limit {
        algorithm: limit.local.clone(),
        base: limit
            .base
            .as_ref()
            .map(|b| Arc::new([b[1].clone(), b[1].clone()])),
        ..limit.clone()
    }
}

/// `fail_open`: admitted, with the whole quota left but this request.
fn open_decision(c: &Check<'_>) -> Decision {
    let (limit, window_ms) = c.limit.algorithm.policy();
    Decision {
        verdict: Verdict::Allow,
        limit,
        remaining: limit.saturating_sub(c.cost),
        reset_ms: 0,
        retry_after_ms: 0,
        window_ms,
    }
}

impl Engine {
    /// On a cluster (where the script cannot check the overrides'
    /// version): reads them again once a second.
    async fn refresh_due(&self) {
        let now = self.memory.now_ms();
        let last = self.stats.overrides_read.load(Ordering::Relaxed);
        if now >= last + 1000
            && self
                .stats
                .overrides_read
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let _ = self.refresh_overrides().await;
        }
    }
}

impl Store for Engine {
    async fn decide<'a>(&'a self, checks: &'a [Check<'a>]) -> Result<Outcome, LimiterError> {
        let Some(redis) = &self.redis else {
            self.stats.calls[0].fetch_add(1, Ordering::Relaxed);
            return Ok(self.memory.decide_at(checks, self.memory.now_ms()));
        };
        if redis.is_cluster() {
            self.refresh_due().await;
        }
        let started = self.clock().now();
        let decided = redis.decide(checks).await;
        self.stats.durations.observe(self.clock().now() - started);
        match decided {
            Ok(outcome) => {
                self.stats.calls[0].fetch_add(1, Ordering::Relaxed);
                Ok(outcome)
            }
            Err(LimiterError::Stale) => {
                // Another replica changed the overrides: read them, and
                // let the caller choose its numbers again.
                self.stats.calls[0].fetch_add(1, Ordering::Relaxed);
                match self.refresh_overrides().await {
                    Ok(()) => Err(LimiterError::Stale),
                    Err(e) => self.fallback(checks, &e),
                }
            }
            Err(e) => {
                let result = usize::from(matches!(e, LimiterError::Timeout(_))) + 1;
                self.stats.calls[result].fetch_add(1, Ordering::Relaxed);
                self.fallback(checks, &e)
            }
        }
    }
}
