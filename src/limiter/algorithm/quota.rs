//! `quota`: a count per calendar period (a day, week, month or year in a
//! time zone, or a month from a billing day; see `limiter::calendar`). The
//! state is the fixed window's: the period's start and its count. Exact;
//! at a period's start the count begins again at 0.

use super::{Policy, State};
use crate::limiter::calendar::Calendar;
use crate::limiter::{Decision, Verdict};

/// The count so far in the period holding `now`, and the period.
fn roll(cal: &Calendar, state: &State, now: u64) -> (u64, (u64, u64)) {
    let (start, end) = cal.bounds(now);
    let count = match state {
        State::Window { start: s, count } if *s == start => *count,
        _ => 0,
    };
    (count, (start, end))
}

pub(super) fn check(limit: u64, cal: &Calendar, state: &State, now: u64, cost: u64) -> Decision {
    let (count, (start, end)) = roll(cal, state, now);
    let policy = Policy {
        limit,
        window_ms: end - start,
    };
    let reset = end.saturating_sub(now).max(1);
    if count + cost <= limit {
        policy.decide(Verdict::Allow, limit - count - cost, reset, 0)
    } else {
        policy.decide(Verdict::Reject, limit.saturating_sub(count), reset, reset)
    }
}

pub(super) fn charge(cal: &Calendar, state: &mut State, now: u64, cost: u64) {
    let (count, (start, _)) = roll(cal, state, now);
    *state = State::Window {
        start,
        count: count.saturating_add(cost),
    };
}

/// Applies a settled `delta` (see `settle`): an extra is charged in the
/// period holding `now`; a refund only in the period reserved in (`at`).
pub(super) fn settle(cal: &Calendar, state: &mut State, now: u64, at: u64, delta: i64) {
    if delta > 0 {
        charge(cal, state, now, delta as u64);
    } else if let State::Window { start, count } = state {
        if *start == cal.bounds(at).0 {
            *count = count.saturating_sub(delta.unsigned_abs());
        }
    }
}

/// The count so far, its period, for the admin API.
pub fn used(cal: &Calendar, state: &State, now: u64) -> (u64, (u64, u64)) {
    roll(cal, state, now)
}

pub(super) fn is_idle(cal: &Calendar, state: &State, now: u64) -> bool {
    match state {
        State::Window { start, .. } => now >= cal.bounds(*start).1,
        _ => true,
    }
}
