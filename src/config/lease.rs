//! `lease:` on a route limit: each replica may take a slice of a hot key's
//! budget from Redis in one call and spend it locally (see
//! `limiter::redis::lease`). Sound only where the state counts units
//! within a window that a slice never outlives: fixed and sliding windows
//! and calendar quotas.

use std::time::Duration;

use super::checker::Checker;
use super::raw::RawLease;
use crate::limiter::{Algorithm, Lease};

pub fn lease(
    path: &str,
    raw: Option<&RawLease>,
    algorithm: &Algorithm,
    c: &mut Checker,
) -> Option<Lease> {
    let raw = raw?;
    let path = format!("{path}.lease");
    if let Some(why) = unsound(algorithm) {
        c.report(&path, why);
        return None;
    }
    let limit = algorithm.policy().0;
    let slice = c.number(&format!("{path}.slice"), &raw.slice, 0u64, 1, limit.max(1));
    if raw.slice.is_none() {
        c.report(
            format!("{path}.slice"),
            "give the most units a replica takes at once, e.g. 50 (at most the limit)",
        );
        return None;
    }
    let hold = c.positive_duration(&format!("{path}.hold"), &raw.hold, Duration::from_secs(1));
    Some(Lease {
        slice,
        hold_ms: hold.as_millis() as u64,
    })
}

/// `max_conn_lease` on a zone: its `max_conn` shared by every replica
/// through Redis, each slot leased this long (ms) and renewed while its
/// request runs.
pub fn conn_lease(
    path: &str,
    raw: Option<&super::raw::Text>,
    max_conn: Option<u32>,
    store: &super::compiled::StoreConfig,
    c: &mut Checker,
) -> Option<u64> {
    let raw = raw?;
    let path = format!("{path}.max_conn_lease");
    if max_conn.is_none() {
        c.report(&path, "shares max_conn across replicas: set max_conn too");
        return None;
    }
    if store.redis.is_none() {
        c.report(
            &path,
            "shares max_conn through Redis: set store.kind to redis or redis_cluster (the memory store counts per process)",
        );
        return None;
    }
    let lease = c.positive_duration(&path, &Some(raw.clone()), Duration::from_secs(10));
    if lease < Duration::from_secs(1) {
        c.report(&path, "at least 1s: a slot is renewed every third of it");
        return None;
    }
    Some(lease.as_millis() as u64)
}

/// Why a slice of `algorithm` could let the replicas together pass the
/// limit, or `None` where leases are sound.
fn unsound(algorithm: &Algorithm) -> Option<&'static str> {
    match algorithm {
        Algorithm::FixedWindow { .. }
        | Algorithm::SlidingWindow { .. }
        | Algorithm::Quota { .. } => None,
        Algorithm::TokenBucket { .. } | Algorithm::Gcra { .. } | Algorithm::Leaky { .. } => Some(
            "leases work with fixed_window, sliding_window and quota only: a bucket refills while a slice taken from it is still unspent, so the replicas together could pass the burst",
        ),
        Algorithm::SlidingLog { .. } => Some(
            "leases work with fixed_window, sliding_window and quota only: a sliding log records each request's time, and a slice spent later than it was taken would be counted at the wrong time",
        ),
    }
}
