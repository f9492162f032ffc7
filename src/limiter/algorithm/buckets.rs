//! The rate-and-burst algorithms: `token_bucket` (a level that refills
//! `amount` per period, up to `burst`) and `gcra` (the same policy kept as
//! one theoretical arrival time). Both are exact and decide alike.

use super::{div, div_ceil, Policy, State};
use crate::limiter::{Decision, Verdict};

pub(super) fn token_check(
    amount: u64,
    period_ms: u64,
    burst: u64,
    state: &mut State,
    now: u64,
    cost: u64,
    policy: Policy,
) -> Decision {
    let (a, p) = (amount as u128, period_ms as u128);
    let capacity = burst as u128 * p;
    let level = bucket_level(state, now, a, capacity);
    let need = cost as u128 * p;
    // A settled cost past empty is a debt: an empty bucket whose refill
    // starts later (a few ms ahead is only a concurrent request's clock).
    let debt = match *state {
        State::Bucket { level: 0, last } => last.saturating_sub(now),
        _ => 0,
    };
    if level >= need && debt == 0 {
        let after = level - need;
        policy.decide(
            Verdict::Allow,
            div(after, p) as u64,
            div_ceil(capacity - after, a),
            0,
        )
    } else {
        policy.decide(
            Verdict::Reject,
            div(level, p) as u64,
            div_ceil(capacity - level, a) + debt,
            div_ceil(need.saturating_sub(level), a).max(1) + debt,
        )
    }
}

pub(super) fn token_charge(
    amount: u64,
    period_ms: u64,
    burst: u64,
    state: &mut State,
    now: u64,
    cost: u64,
) {
    let (a, p) = (amount as u128, period_ms as u128);
    let level = bucket_level(state, now, a, burst as u128 * p);
    let after = level.saturating_sub(cost as u128 * p);
    *state = State::Bucket {
        level: after as u64,
        last: now,
    };
}

pub(super) fn gcra_check(
    amount: u64,
    period_ms: u64,
    burst: u64,
    state: &mut State,
    now: u64,
    cost: u64,
    policy: Policy,
) -> Decision {
    let (a, p) = (amount as u128, period_ms as u128);
    let scaled_now = now as u128 * a;
    let tolerance = burst as u128 * p;
    let tat = gcra_tat(state, scaled_now);
    let new_tat = tat + cost as u128 * p;
    if new_tat - scaled_now <= tolerance {
        let remaining = div(tolerance - (new_tat - scaled_now), p);
        policy.decide(
            Verdict::Allow,
            remaining as u64,
            div_ceil(new_tat - scaled_now, a),
            0,
        )
    } else {
        let remaining = div(tolerance.saturating_sub(tat - scaled_now), p);
        let retry = div_ceil(new_tat - scaled_now - tolerance, a);
        policy.decide(
            Verdict::Reject,
            remaining as u64,
            div_ceil(tat - scaled_now, a),
            retry,
        )
    }
}

pub(super) fn gcra_charge(amount: u64, period_ms: u64, state: &mut State, now: u64, cost: u64) {
    let scaled_now = now as u128 * amount as u128;
    let tat = gcra_tat(state, scaled_now);
    *state = State::Tat((tat + cost as u128 * period_ms as u128) as u64);
}

pub(super) fn bucket_level(state: &State, now: u64, a: u128, capacity: u128) -> u128 {
    match *state {
        State::Bucket { level, last } => {
            (level as u128 + now.saturating_sub(last) as u128 * a).min(capacity)
        }
        _ => capacity,
    }
}

/// GCRA's theoretical arrival time, never in the past.
pub(super) fn gcra_tat(state: &State, scaled_now: u128) -> u128 {
    match *state {
        State::Tat(t) => (t as u128).max(scaled_now),
        _ => scaled_now,
    }
}
