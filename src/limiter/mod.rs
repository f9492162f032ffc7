//! The rate-limit engine: "allow, delay or reject, and what to tell the
//! client", for several limits at once.
//!
//! - `algorithm`: the six algorithms as pure functions of (state, now, cost).
//! - `memory`: the embedded store (the default): sharded, bounded per zone,
//!   least-recently-used eviction, idle keys expired as it goes.
//! - [`Store`]: what a store must do, shaped so a Redis store can run every
//!   algorithm for every limit of a request in one atomic round trip.
//! - `engine`: the store the proxy asks: memory or Redis, with each limit's
//!   failure mode (`on_error`) applied in one place when Redis fails.
//!
//! Several limits on one request are all-or-nothing: the request is charged
//! to every limit only when every limit allows it, so a rejection by one
//! burns no quota in the others (as nginx does).

pub(crate) mod algorithm;
pub(crate) mod calendar;
pub(crate) mod conn;
pub(crate) mod engine;
pub(crate) mod memory;
pub(crate) mod overrides;
pub(crate) mod penalty;
pub(crate) mod redis;

use std::future::Future;
use std::sync::Arc;

pub use algorithm::{Algorithm, State};
pub use calendar::{Calendar, Period, Zone};
// What the binary, the integration tests and the benches open directly.
pub use engine::Engine;
pub use memory::{MemoryStore, ZoneSpec, ENTRY_BYTES};
pub use redis::{cluster_decide, cluster_node_decide, decide_forms, RedisOptions, RedisStore};

/// What one limit says about one request.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    /// The quota advertised (`X-RateLimit-Limit`, IETF `q`).
    pub limit: u64,
    /// Requests (cost units) still allowed right now, after this one.
    pub remaining: u64,
    /// Milliseconds until the quota is fully available again.
    pub reset_ms: u64,
    /// Milliseconds to wait before retrying; 0 unless rejected.
    pub retry_after_ms: u64,
    /// The window the quota applies to (IETF `w`).
    pub window_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Admitted after waiting this many ms (nginx `limit_req` burst).
    Delay(u64),
    Reject,
}

impl Decision {
    pub fn admitted(&self) -> bool {
        !matches!(self.verdict, Verdict::Reject)
    }
}

/// A configured limit.
#[derive(Debug, Clone)]
pub struct Limit {
    /// For headers (`"medium";q=300;w=60`), logs and metrics.
    pub name: Arc<str>,
    pub algorithm: Algorithm,
    /// Which memory partition (zone) holds this limit's keys.
    pub zone: usize,
    /// What to do when the shared store cannot decide.
    pub on_error: OnError,
    /// The policy used with `OnError::Local`: `algorithm` divided by the
    /// number of replicas, so N replicas together stay near the limit.
    pub local: Algorithm,
    /// Set when `algorithm` is not the limit's own numbers (a plan's or a
    /// key's override): the numbers a key's state is kept under otherwise,
    /// so a store can rescale a state written under the one for the other:
    /// `[algorithm, local]` of the limit itself.
    pub base: Option<Arc<[Algorithm; 2]>>,
    /// The replicas `local` is divided among (`store.replicas`).
    pub replicas: u64,
    /// Slices of a hot key's budget a replica may take from Redis.
    pub lease: Option<Lease>,
}

/// A limit's leases (`lease:` in the config): a replica takes at most
/// `slice` units of a key's budget at once and spends them locally for at
/// most `hold_ms`, giving back what is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub slice: u64,
    pub hold_ms: u64,
}

impl Limit {
    /// A limit that falls back to the memory store at its full size.
    pub fn new(name: &str, algorithm: Algorithm, zone: usize) -> Self {
        Limit {
            name: Arc::from(name),
            local: algorithm.clone(),
            algorithm,
            zone,
            on_error: OnError::Local,
            base: None,
            replicas: 1,
            lease: None,
        }
    }

    /// The numbers a state of this limit's key is kept under when no plan
    /// or override applies.
    pub fn base_algorithm(&self) -> &Algorithm {
        self.base.as_ref().map_or(&self.algorithm, |b| &b[0])
    }

    /// The same limit with other numbers (a plan's, an override's).
    pub fn with_numbers(&self, algorithm: Algorithm) -> Limit {
        let base = self
            .base
            .clone()
            .unwrap_or_else(|| Arc::new([self.algorithm.clone(), self.local.clone()]));
        Limit {
            name: self.name.clone(),
            local: algorithm.divided(self.replicas),
            algorithm,
            zone: self.zone,
            on_error: self.on_error,
            base: Some(base),
            replicas: self.replicas,
            lease: self.lease,
        }
    }
}

/// What a limit does when the shared store (Redis) fails or times out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Admit the request (and log it).
    FailOpen,
    /// Refuse it: 503 with `Retry-After` and a problem body.
    FailClosed,
    /// Decide with this process's memory store.
    Local,
}

impl std::fmt::Display for OnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OnError::FailOpen => "fail_open",
            OnError::FailClosed => "fail_closed",
            OnError::Local => "local",
        })
    }
}

impl std::str::FromStr for OnError {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fail_open" => Ok(OnError::FailOpen),
            "fail_closed" => Ok(OnError::FailClosed),
            "local" => Ok(OnError::Local),
            _ => Err(format!(
                "expected fail_open, fail_closed or local, got \"{s}\""
            )),
        }
    }
}

/// One limit to apply to one request.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    pub limit: &'a Limit,
    /// The bucket, e.g. `ip:203.0.113.7` (never a secret in clear).
    pub key: &'a str,
    pub cost: u64,
    /// Decide but never charge (limits that count only some outcomes are
    /// charged later, once the outcome is known).
    pub peek: bool,
    /// Consecutive checks with the same group and `dry_run` are decided
    /// together, all or nothing; see [`Store::decide`].
    pub group: u8,
    /// A dry-run group never stops the groups after it.
    pub dry_run: bool,
    /// The version of the overrides its numbers were chosen under
    /// ([`overrides::Overrides`]): a single Redis refuses to decide when
    /// another replica changed them since (`LimiterError::Stale`), so the
    /// caller chooses again. `None`: not checked.
    pub overrides: Option<u64>,
}

impl<'a> Check<'a> {
    /// A check in group 0, enforced, charged when admitted.
    pub fn new(limit: &'a Limit, key: &'a str, cost: u64) -> Self {
        Check {
            limit,
            key,
            cost,
            peek: false,
            group: 0,
            dry_run: false,
            overrides: None,
        }
    }
}

/// The groups of `checks`: runs of consecutive checks with the same group
/// and `dry_run`.
pub fn groups<'c, 'a>(checks: &'c [Check<'a>]) -> impl Iterator<Item = &'c [Check<'a>]> {
    checks.chunk_by(|a, b| a.group == b.group && a.dry_run == b.dry_run)
}

/// The group walk every store follows: decides each group in order with
/// `decide_group` (which appends one decision per check) and stops after
/// the first enforced group that did not admit (see [`Store::decide`]).
pub fn decide_in_groups<'a>(
    checks: &[Check<'a>],
    mut decide_group: impl FnMut(&[Check<'a>], &mut Vec<Decision>),
) -> Outcome {
    let mut decisions = Vec::with_capacity(checks.len());
    for group in groups(checks) {
        let before = decisions.len();
        decide_group(group, &mut decisions);
        if stops(group, &decisions[before..]) {
            break;
        }
    }
    Outcome::of(decisions)
}

/// Whether a decided group ends the walk: it is enforced (not dry run)
/// and some check in it was rejected.
pub fn stops(group: &[Check<'_>], decided: &[Decision]) -> bool {
    !group.first().is_some_and(|c| c.dry_run) && !decided.iter().all(Decision::admitted)
}

/// The decisions for the limits of a request, in the order checked: every
/// check up to the end of the first enforced group that rejected (the
/// checks after it were not decided and not charged).
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub decisions: Vec<Decision>,
    /// Decided without the shared store (its failure mode applied): what
    /// was charged, if anything, was charged in this process's memory.
    pub degraded: bool,
}

impl Outcome {
    /// The shared store's (or the only store's) decisions.
    pub fn of(decisions: Vec<Decision>) -> Self {
        Outcome {
            decisions,
            degraded: false,
        }
    }

    /// See [`verdict`].
    pub fn verdict(&self) -> Verdict {
        verdict(&self.decisions)
    }

    /// The index of the limit to report in headers; see [`most_restrictive`].
    pub fn most_restrictive(&self) -> Option<usize> {
        most_restrictive(self.decisions.iter())
    }

    /// The groups that were decided, each with the index of its first check:
    /// `checks` must be the checks this outcome answers.
    pub fn decided_groups<'o, 'c, 'a>(
        &'o self,
        checks: &'c [Check<'a>],
    ) -> impl Iterator<Item = (usize, &'c [Check<'a>], &'o [Decision])> {
        let mut start = 0;
        groups(checks).map_while(move |group| {
            let at = start;
            start += group.len();
            self.decisions.get(at..start).map(|d| (at, group, d))
        })
    }
}

/// Whole seconds, rounded up, at least 1: how durations are reported
/// (`Retry-After`, header resets and windows, 429 details).
pub fn secs(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

/// Rejected when any decision rejects; otherwise delayed by the longest delay.
pub fn verdict(decisions: &[Decision]) -> Verdict {
    let mut delay = 0;
    for d in decisions {
        match d.verdict {
            Verdict::Reject => return Verdict::Reject,
            Verdict::Delay(ms) => delay = delay.max(ms),
            Verdict::Allow => {}
        }
    }
    if delay > 0 {
        Verdict::Delay(delay)
    } else {
        Verdict::Allow
    }
}

/// The decision to report in headers: a rejecting one with the longest
/// wait, else the one with the fewest remaining (ties: the later reset).
pub fn most_restrictive<'a>(
    decisions: impl Iterator<Item = &'a Decision> + Clone,
) -> Option<usize> {
    let rejecting = decisions
        .clone()
        .enumerate()
        .filter(|(_, d)| !d.admitted())
        .max_by_key(|(_, d)| d.retry_after_ms)
        .map(|(i, _)| i);
    rejecting.or_else(|| {
        decisions
            .enumerate()
            .min_by(|(_, a), (_, b)| {
                a.remaining
                    .cmp(&b.remaining)
                    .then(b.reset_ms.cmp(&a.reset_ms))
            })
            .map(|(i, _)| i)
    })
}

/// A store failed to decide (Redis down, timeout). The failure mode
/// (open / closed / local) is applied in one place, [`engine::Engine`];
/// what it cannot absorb is `Closed`.
#[derive(Debug, thiserror::Error)]
pub enum LimiterError {
    #[error("rate-limit store unavailable: {0}")]
    Unavailable(String),
    #[error("rate-limit store did not answer within {0}ms")]
    Timeout(u64),
    /// Another replica changed the overrides since the numbers were
    /// chosen: choose them again (the store has reloaded them).
    #[error("the overrides changed since the numbers were chosen")]
    Stale,
    /// A `fail_closed` limit could not be checked: the request is refused.
    #[error("rate limit '{limit}' cannot be checked ({cause}); retry in 1s")]
    Closed { limit: Arc<str>, cause: String },
}

/// A place where limit state lives.
pub trait Store: Send + Sync {
    /// Decides every check for one request at once, group by group (see
    /// [`groups`]). Within a group it is all or nothing: either every limit
    /// of the group is charged (all allowed or delayed) or none is. When an
    /// enforced group rejects, the groups after it are neither decided nor
    /// charged; a dry-run group is decided and charged on its own and never
    /// stops the others. This is what lets a proxy decide its zones and its
    /// route limits in one round trip.
    fn decide<'a>(
        &'a self,
        checks: &'a [Check<'a>],
    ) -> impl Future<Output = Result<Outcome, LimiterError>> + Send + 'a;
}
