//! The counting windows: `fixed_window` (a count per aligned window),
//! `sliding_window` (two counters, the previous one weighed by how much of
//! it still overlaps, Cloudflare's estimate) and `sliding_log` (one entry
//! per admitted request: exact).

use super::{div, div_ceil, Log, Policy, State};
use crate::limiter::{Decision, Verdict};

pub(super) fn fixed_check(
    limit: u64,
    w: u64,
    state: &mut State,
    now: u64,
    cost: u64,
    policy: Policy,
) -> Decision {
    let (start, count) = fixed_roll(state, now, w);
    let reset = start + w - now;
    if count + cost <= limit {
        policy.decide(Verdict::Allow, limit - count - cost, reset, 0)
    } else {
        policy.decide(Verdict::Reject, limit.saturating_sub(count), reset, reset)
    }
}

pub(super) fn fixed_charge(window_ms: u64, state: &mut State, now: u64, cost: u64) {
    let (start, count) = fixed_roll(state, now, window_ms);
    *state = State::Window {
        start,
        count: count + cost,
    };
}

pub(super) fn sliding_check(
    limit: u64,
    w: u64,
    state: &mut State,
    now: u64,
    cost: u64,
    policy: Policy,
) -> Decision {
    let (start, prev, curr) = sliding_roll(state, now, w);
    let elapsed = (now - start) as u128;
    let (w128, l128, c128) = (w as u128, limit as u128, cost as u128);
    let used = prev as u128 * (w128 - elapsed) + curr as u128 * w128;
    let reset = (w128 - elapsed) as u64;
    if used + c128 * w128 <= l128 * w128 {
        let remaining = div(l128 * w128 - used - c128 * w128, w128) as u64;
        policy.decide(Verdict::Allow, remaining, reset, 0)
    } else {
        let remaining = div((l128 * w128).saturating_sub(used), w128);
        let retry = sliding_retry(prev as u128, curr as u128, elapsed, w128, l128, c128);
        policy.decide(Verdict::Reject, remaining as u64, reset, retry)
    }
}

pub(super) fn sliding_charge(window_ms: u64, state: &mut State, now: u64, cost: u64) {
    let (start, prev, curr) = sliding_roll(state, now, window_ms);
    let curr = curr.saturating_add(u32::try_from(cost).unwrap_or(u32::MAX));
    *state = State::Sliding { start, prev, curr };
}

pub(super) fn log_check(
    limit: u64,
    w: u64,
    state: &mut State,
    now: u64,
    cost: u64,
    policy: Policy,
) -> Decision {
    let log = log_of(state);
    while log.entries.front().is_some_and(|&(t, _)| t + w <= now) {
        if let Some((_, c)) = log.entries.pop_front() {
            log.total -= c as u64;
        }
    }
    if log.total + cost <= limit {
        let oldest = log.entries.front().map_or(now, |&(t, _)| t);
        policy.decide(
            Verdict::Allow,
            limit - log.total - cost,
            oldest + w - now,
            0,
        )
    } else {
        // Wait until enough of the oldest entries leave the window.
        let mut freed = 0;
        let mut retry = w;
        for &(t, c) in &log.entries {
            freed += c as u64;
            if log.total - freed + cost <= limit {
                retry = t + w - now;
                break;
            }
        }
        let oldest = log.entries.front().map_or(now, |&(t, _)| t);
        policy.decide(
            Verdict::Reject,
            limit.saturating_sub(log.total),
            oldest + w - now,
            retry,
        )
    }
}

pub(super) fn log_charge(state: &mut State, now: u64, cost: u64) {
    let log = log_of(state);
    let c = u32::try_from(cost).unwrap_or(u32::MAX);
    match log.entries.back_mut() {
        Some((t, existing)) if *t == now => *existing = existing.saturating_add(c),
        _ => log.entries.push_back((now, c)),
    }
    log.total += cost;
}

pub(super) fn fixed_roll(state: &State, now: u64, w: u64) -> (u64, u64) {
    let start = now - now % w;
    match *state {
        State::Window { start: s, count } if s == start => (start, count),
        _ => (start, 0),
    }
}

pub(super) fn sliding_roll(state: &State, now: u64, w: u64) -> (u64, u32, u32) {
    let start = now - now % w;
    match *state {
        State::Sliding {
            start: s,
            prev,
            curr,
        } if s == start => (start, prev, curr),
        State::Sliding { start: s, curr, .. } if s + w == start => (start, curr, 0),
        _ => (start, 0, 0),
    }
}

/// Milliseconds until a rejected sliding-window request would fit.
fn sliding_retry(prev: u128, curr: u128, elapsed: u128, w: u128, l: u128, c: u128) -> u64 {
    // Later in this window, as the previous window's weight fades.
    if curr + c <= l && prev > 0 {
        // prev * (w - elapsed - t) + (curr + c) * w <= l * w
        let t = div_ceil(prev * (w - elapsed) + (curr + c) * w - l * w, prev) as u128;
        if t < w - elapsed {
            return t.max(1) as u64;
        }
    }
    // In the next window the current count becomes the previous one.
    let to_next = w - elapsed;
    if c > l {
        // Never fits (config refuses such costs); say "a window".
        return (to_next + w) as u64;
    }
    if curr == 0 || curr + c <= l {
        return to_next.max(1) as u64;
    }
    // curr * (w - u) + c * w <= l * w  =>  u >= w - (l - c) * w / curr
    let u = w - ((l - c) * w / curr).min(w);
    let u = if curr * (w - u) + c * w > l * w {
        u + 1
    } else {
        u
    };
    (to_next + u.min(w)) as u64
}

fn log_of(state: &mut State) -> &mut Log {
    if !matches!(state, State::Log(_)) {
        *state = State::Log(Box::default());
    }
    match state {
        State::Log(log) => log,
        _ => unreachable!("just set"),
    }
}
