//! The rate-limit engine: "allow, delay or reject, and what to tell the
//! client", for several limits at once.
//!
//! - `algorithm`: the six algorithms as pure functions of (state, now, cost).
//! - `memory`: the embedded store (the default): sharded, bounded per zone,
//!   least-recently-used eviction, idle keys expired as it goes.
//! - [`Store`]: what a store must do, shaped so a Redis store can run every
//!   algorithm for every limit of a request in one atomic round trip.
//!
//! Several limits on one request are all-or-nothing: the request is charged
//! to every limit only when every limit allows it, so a rejection by one
//! burns no quota in the others (as nginx does).

pub mod algorithm;
pub mod memory;

use std::future::Future;
use std::sync::Arc;

pub use algorithm::{Algorithm, State};

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
}

/// The decisions for all limits of a request, in the order checked.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub decisions: Vec<Decision>,
}

impl Outcome {
    /// Rejected when any limit rejects; otherwise delayed by the longest delay.
    pub fn verdict(&self) -> Verdict {
        let mut delay = 0;
        for d in &self.decisions {
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

    /// The index of the limit to report in headers; see [`most_restrictive`].
    pub fn most_restrictive(&self) -> Option<usize> {
        most_restrictive(self.decisions.iter())
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
/// (open / closed / local) is applied by the caller, in one place.
#[derive(Debug, thiserror::Error)]
pub enum LimiterError {
    #[error("rate-limit store unavailable: {0}")]
    Unavailable(String),
    #[error("rate-limit store did not answer within {0}ms")]
    Timeout(u64),
}

/// A place where limit state lives.
pub trait Store: Send + Sync {
    /// Decides every check for one request at once, all-or-nothing: either
    /// every limit is charged (all allowed or delayed) or none is.
    fn decide<'a>(
        &'a self,
        checks: &'a [Check<'a>],
    ) -> impl Future<Output = Result<Outcome, LimiterError>> + Send + 'a;
}
