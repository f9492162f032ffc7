//! The six algorithms as pure functions of (state, now, cost): no clock, no
//! I/O, integer maths only, so every decision is reproducible to the
//! millisecond in tests and identical on every store.
//!
//! `check` decides without charging (it may tidy the state, e.g. forget log
//! entries that left the window, which changes no future decision);
//! `charge` records an admitted request. The store calls `check` on every
//! limit of a request and `charge` on all of them only if all allowed: a
//! rejected request burns no quota anywhere.
//!
//! Approximations, stated once:
//! - `fixed_window` admits up to 2 x limit across a window boundary (limit
//!   at the end of one window, limit at the start of the next).
//! - `sliding_window` weighs the previous window linearly (Cloudflare's
//!   estimate); it assumes the previous window's requests were evenly spread.
//! - `sliding_log` is exact and costs one entry per admitted request.
//! - `token_bucket` and `gcra` are exact and make the same decisions.
//! - `leaky` is nginx `limit_req` to the thousandth of a request.

use std::collections::VecDeque;

use super::{Decision, Verdict};

/// Largest `limit` a `sliding_log` may have: its memory grows with it.
pub const SLIDING_LOG_MAX_LIMIT: u64 = 10_000;
/// Largest intermediate value: the Redis store computes in Lua, whose
/// numbers are doubles, exact up to 2^53.
const EXACT: u128 = 1 << 53;
/// nginx keeps a drained leaky-bucket entry for a minute before expiring it
/// (a kept entry and a fresh one decide the next request differently).
const LEAKY_EXPIRE_MS: u64 = 60_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Algorithm {
    /// `limit` per aligned window of `window_ms`.
    FixedWindow { limit: u64, window_ms: u64 },
    /// Two-window weighted estimate.
    SlidingWindow { limit: u64, window_ms: u64 },
    /// One timestamp per admitted request.
    SlidingLog { limit: u64, window_ms: u64 },
    /// Refills `amount` tokens per `period_ms`, holds at most `burst`.
    TokenBucket {
        amount: u64,
        period_ms: u64,
        burst: u64,
    },
    /// The same policy as a token bucket, one timestamp per key.
    Gcra {
        amount: u64,
        period_ms: u64,
        burst: u64,
    },
    /// nginx `limit_req`: `rate_milli` thousandths of a request per second;
    /// `burst` requests may queue; the first `delay` of them pass at once
    /// (`u64::MAX` = `nodelay`), the rest wait to conform to the rate.
    Leaky {
        rate_milli: u64,
        burst: u64,
        delay: u64,
    },
}

/// Per-key state. Every variant but the log fits in 16 bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum State {
    /// Never seen, or forgotten: decides like a brand-new key.
    #[default]
    Empty,
    Window {
        start: u64,
        count: u64,
    },
    Sliding {
        start: u64,
        prev: u32,
        curr: u32,
    },
    Log(Box<Log>),
    /// Token level, scaled by `period_ms` so refill is `amount` per ms.
    Bucket {
        level: u64,
        last: u64,
    },
    /// GCRA theoretical arrival time, in ms x `amount`.
    Tat(u64),
    /// nginx: excess in thousandths of a request, and the last update.
    Leaky {
        excess: u64,
        last: u64,
    },
}

/// Admitted requests still in a `sliding_log` window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    /// (time admitted, cost), oldest first.
    entries: VecDeque<(u64, u32)>,
    total: u64,
}

impl Log {
    /// Heap bytes this log holds, for the store's memory budget.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<(u64, u32)>()
    }
}

fn div_ceil(a: u128, b: u128) -> u64 {
    a.div_ceil(b).min(u64::MAX as u128) as u64
}

impl Algorithm {
    /// Checks the numbers make sense; the message follows the YAML path.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            Algorithm::FixedWindow { limit, window_ms }
            | Algorithm::SlidingWindow { limit, window_ms } => {
                if limit == 0 || limit > u32::MAX as u64 {
                    return Err(format!("limit must be from 1 to {}, got {limit}", u32::MAX));
                }
                if window_ms == 0 {
                    return Err("window must be at least 1ms".into());
                }
                if limit as u128 * window_ms as u128 > EXACT {
                    return Err("limit x window (in ms) must stay below 2^53 so every store computes it exactly; shorten the window or lower the limit".into());
                }
            }
            Algorithm::SlidingLog { limit, window_ms } => {
                if limit == 0 || limit > SLIDING_LOG_MAX_LIMIT {
                    return Err(format!(
                        "sliding_log keeps one entry per request, so its limit must be from 1 to {SLIDING_LOG_MAX_LIMIT}, got {limit}; use sliding_window for large limits"
                    ));
                }
                if window_ms == 0 {
                    return Err("window must be at least 1ms".into());
                }
            }
            Algorithm::TokenBucket {
                amount,
                period_ms,
                burst,
            }
            | Algorithm::Gcra {
                amount,
                period_ms,
                burst,
            } => {
                if amount == 0 || amount > 1_000_000 || period_ms == 0 {
                    return Err(format!(
                        "rate must be from 1 to 1000000 per period, got {amount}"
                    ));
                }
                if burst == 0 || burst > u32::MAX as u64 {
                    return Err(format!("burst must be from 1 to {}, got {burst}", u32::MAX));
                }
                if burst as u128 * period_ms as u128 > EXACT {
                    return Err("burst x rate period (in ms) must stay below 2^53 so every store computes it exactly".into());
                }
            }
            Algorithm::Leaky {
                rate_milli, burst, ..
            } => {
                if rate_milli == 0 {
                    return Err(
                        "rate must be at least 1r/m (16 thousandths of a request per second)"
                            .into(),
                    );
                }
                if burst > u32::MAX as u64 {
                    return Err(format!("burst must be at most {}, got {burst}", u32::MAX));
                }
            }
        }
        Ok(())
    }

    /// The same policy with 1/`n` of the quota (at least one request), for
    /// one of `n` replicas deciding alone while the shared store is down.
    pub fn divided(&self, n: u64) -> Algorithm {
        let n = n.max(1);
        let part = |v: u64| (v / n).max(1);
        match *self {
            Algorithm::FixedWindow { limit, window_ms } => Algorithm::FixedWindow {
                limit: part(limit),
                window_ms,
            },
            Algorithm::SlidingWindow { limit, window_ms } => Algorithm::SlidingWindow {
                limit: part(limit),
                window_ms,
            },
            Algorithm::SlidingLog { limit, window_ms } => Algorithm::SlidingLog {
                limit: part(limit),
                window_ms,
            },
            Algorithm::TokenBucket {
                amount,
                period_ms,
                burst,
            } => Algorithm::TokenBucket {
                amount,
                period_ms: period_ms.saturating_mul(n),
                burst: part(burst),
            },
            Algorithm::Gcra {
                amount,
                period_ms,
                burst,
            } => Algorithm::Gcra {
                amount,
                period_ms: period_ms.saturating_mul(n),
                burst: part(burst),
            },
            Algorithm::Leaky {
                rate_milli,
                burst,
                delay,
            } => Algorithm::Leaky {
                rate_milli: part(rate_milli),
                burst: burst / n,
                delay: if delay == u64::MAX { delay } else { delay / n },
            },
        }
    }

    /// The quota and window the headers advertise (`q` and `w`).
    pub fn policy(&self) -> (u64, u64) {
        match *self {
            Algorithm::FixedWindow { limit, window_ms }
            | Algorithm::SlidingWindow { limit, window_ms }
            | Algorithm::SlidingLog { limit, window_ms } => (limit, window_ms),
            Algorithm::TokenBucket {
                amount,
                period_ms,
                burst,
            }
            | Algorithm::Gcra {
                amount,
                period_ms,
                burst,
            } => (
                burst,
                div_ceil(burst as u128 * period_ms as u128, amount as u128),
            ),
            Algorithm::Leaky {
                rate_milli, burst, ..
            } => (
                burst + 1,
                div_ceil((burst as u128 + 1) * 1_000_000, rate_milli as u128),
            ),
        }
    }

    /// Decides for one request of `cost` at `now` (ms) without charging it.
    pub fn check(&self, state: &mut State, now: u64, cost: u64) -> Decision {
        let (limit, window_ms) = self.policy();
        let d = |verdict, remaining, reset_ms, retry_after_ms| Decision {
            verdict,
            limit,
            remaining,
            reset_ms,
            retry_after_ms,
            window_ms,
        };
        match *self {
            Algorithm::FixedWindow {
                limit,
                window_ms: w,
            } => {
                let (start, count) = fixed_roll(state, now, w);
                let reset = start + w - now;
                if count + cost <= limit {
                    d(Verdict::Allow, limit - count - cost, reset, 0)
                } else {
                    d(Verdict::Reject, limit.saturating_sub(count), reset, reset)
                }
            }
            Algorithm::SlidingWindow {
                limit,
                window_ms: w,
            } => {
                let (start, prev, curr) = sliding_roll(state, now, w);
                let elapsed = (now - start) as u128;
                let (w128, l128, c128) = (w as u128, limit as u128, cost as u128);
                let used = prev as u128 * (w128 - elapsed) + curr as u128 * w128;
                let reset = (w128 - elapsed) as u64;
                if used + c128 * w128 <= l128 * w128 {
                    let remaining = ((l128 * w128 - used - c128 * w128) / w128) as u64;
                    d(Verdict::Allow, remaining, reset, 0)
                } else {
                    let remaining = (l128 * w128).saturating_sub(used) / w128;
                    let retry =
                        sliding_retry(prev as u128, curr as u128, elapsed, w128, l128, c128);
                    d(Verdict::Reject, remaining as u64, reset, retry)
                }
            }
            Algorithm::SlidingLog {
                limit,
                window_ms: w,
            } => {
                let log = log_of(state);
                while log.entries.front().is_some_and(|&(t, _)| t + w <= now) {
                    if let Some((_, c)) = log.entries.pop_front() {
                        log.total -= c as u64;
                    }
                }
                if log.total + cost <= limit {
                    let oldest = log.entries.front().map_or(now, |&(t, _)| t);
                    d(
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
                    d(
                        Verdict::Reject,
                        limit.saturating_sub(log.total),
                        oldest + w - now,
                        retry,
                    )
                }
            }
            Algorithm::TokenBucket {
                amount,
                period_ms,
                burst,
            } => {
                let (a, p) = (amount as u128, period_ms as u128);
                let capacity = burst as u128 * p;
                let level = bucket_level(state, now, a, capacity);
                let need = cost as u128 * p;
                if level >= need {
                    let after = level - need;
                    d(
                        Verdict::Allow,
                        (after / p) as u64,
                        div_ceil(capacity - after, a),
                        0,
                    )
                } else {
                    d(
                        Verdict::Reject,
                        (level / p) as u64,
                        div_ceil(capacity - level, a),
                        div_ceil(need - level, a),
                    )
                }
            }
            Algorithm::Gcra {
                amount,
                period_ms,
                burst,
            } => {
                let (a, p) = (amount as u128, period_ms as u128);
                let scaled_now = now as u128 * a;
                let tolerance = burst as u128 * p;
                let tat = gcra_tat(state, scaled_now);
                let new_tat = tat + cost as u128 * p;
                if new_tat - scaled_now <= tolerance {
                    let remaining = (tolerance - (new_tat - scaled_now)) / p;
                    d(
                        Verdict::Allow,
                        remaining as u64,
                        div_ceil(new_tat - scaled_now, a),
                        0,
                    )
                } else {
                    let remaining = tolerance.saturating_sub(tat - scaled_now) / p;
                    let retry = div_ceil(new_tat - scaled_now - tolerance, a);
                    d(
                        Verdict::Reject,
                        remaining as u64,
                        div_ceil(tat - scaled_now, a),
                        retry,
                    )
                }
            }
            Algorithm::Leaky {
                rate_milli,
                burst,
                delay,
            } => {
                let burst_m = burst as i128 * 1000;
                let rate = rate_milli as i128;
                match leaky_excess(state, now, rate, burst_m, cost) {
                    Ok(excess) => {
                        let wait = if excess <= delay as i128 * 1000 || delay == u64::MAX {
                            0
                        } else {
                            ((excess - delay as i128 * 1000) * 1000 / rate) as u64
                        };
                        let verdict = if wait > 0 {
                            Verdict::Delay(wait)
                        } else {
                            Verdict::Allow
                        };
                        let remaining = ((burst_m - excess) / 1000) as u64;
                        d(
                            verdict,
                            remaining,
                            div_ceil(excess as u128 * 1000, rate as u128),
                            0,
                        )
                    }
                    Err((excess_then, since_last)) => {
                        // Smallest wait after which the excess fits again.
                        let need = excess_then + 1000 * cost as i128 - burst_m;
                        let total = div_ceil((need * 1000) as u128, rate as u128) as i128;
                        let retry = (total - since_last as i128).max(1) as u64;
                        let reset = div_ceil((excess_then * 1000) as u128, rate as u128);
                        d(Verdict::Reject, 0, reset, retry)
                    }
                }
            }
        }
    }

    /// Records an admitted request: call only after `check` allowed it (or
    /// delayed it) at the same `now` on the same state.
    pub fn charge(&self, state: &mut State, now: u64, cost: u64) {
        match *self {
            Algorithm::FixedWindow { window_ms, .. } => {
                let (start, count) = fixed_roll(state, now, window_ms);
                *state = State::Window {
                    start,
                    count: count + cost,
                };
            }
            Algorithm::SlidingWindow { window_ms, .. } => {
                let (start, prev, curr) = sliding_roll(state, now, window_ms);
                let curr = curr.saturating_add(u32::try_from(cost).unwrap_or(u32::MAX));
                *state = State::Sliding { start, prev, curr };
            }
            Algorithm::SlidingLog { .. } => {
                let log = log_of(state);
                let c = u32::try_from(cost).unwrap_or(u32::MAX);
                match log.entries.back_mut() {
                    Some((t, existing)) if *t == now => *existing = existing.saturating_add(c),
                    _ => log.entries.push_back((now, c)),
                }
                log.total += cost;
            }
            Algorithm::TokenBucket {
                amount,
                period_ms,
                burst,
            } => {
                let (a, p) = (amount as u128, period_ms as u128);
                let level = bucket_level(state, now, a, burst as u128 * p);
                let after = level.saturating_sub(cost as u128 * p);
                *state = State::Bucket {
                    level: after as u64,
                    last: now,
                };
            }
            Algorithm::Gcra {
                amount, period_ms, ..
            } => {
                let scaled_now = now as u128 * amount as u128;
                let tat = gcra_tat(state, scaled_now);
                *state = State::Tat((tat + cost as u128 * period_ms as u128) as u64);
            }
            Algorithm::Leaky {
                rate_milli, burst, ..
            } => {
                if let Ok(excess) =
                    leaky_excess(state, now, rate_milli as i128, burst as i128 * 1000, cost)
                {
                    // nginx moves `last` only when time has passed.
                    let last = match state {
                        State::Leaky { last, .. } if now <= *last => *last,
                        _ => now,
                    };
                    *state = State::Leaky {
                        excess: excess as u64,
                        last,
                    };
                }
            }
        }
    }

    /// Whether the state now decides exactly like a fresh key, so the store
    /// may forget it.
    pub fn is_idle(&self, state: &State, now: u64) -> bool {
        match (self, state) {
            (_, State::Empty) => true,
            (Algorithm::FixedWindow { window_ms, .. }, State::Window { start, .. }) => {
                now >= start + window_ms
            }
            (Algorithm::SlidingWindow { window_ms, .. }, State::Sliding { start, .. }) => {
                now >= start + 2 * window_ms
            }
            (Algorithm::SlidingLog { window_ms, .. }, State::Log(log)) => log
                .entries
                .back()
                .is_none_or(|&(t, _)| t + window_ms <= now),
            (
                Algorithm::TokenBucket {
                    amount,
                    period_ms,
                    burst,
                },
                State::Bucket { level, last },
            ) => {
                let refill = now.saturating_sub(*last) as u128 * *amount as u128;
                *level as u128 + refill >= *burst as u128 * *period_ms as u128
            }
            (Algorithm::Gcra { amount, .. }, State::Tat(tat)) => {
                *tat as u128 <= now as u128 * *amount as u128
            }
            (Algorithm::Leaky { rate_milli, .. }, State::Leaky { excess, last }) => {
                let idle = now.saturating_sub(*last);
                idle >= LEAKY_EXPIRE_MS
                    && (*rate_milli as u128 * idle as u128 / 1000) >= *excess as u128
            }
            // A state written by another algorithm (a limit changed on
            // reload): worthless, forget it.
            _ => true,
        }
    }
}

fn fixed_roll(state: &State, now: u64, w: u64) -> (u64, u64) {
    let start = now - now % w;
    match *state {
        State::Window { start: s, count } if s == start => (start, count),
        _ => (start, 0),
    }
}

fn sliding_roll(state: &State, now: u64, w: u64) -> (u64, u32, u32) {
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

/// GCRA's theoretical arrival time, never in the past.
fn gcra_tat(state: &State, scaled_now: u128) -> u128 {
    match *state {
        State::Tat(t) => (t as u128).max(scaled_now),
        _ => scaled_now,
    }
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

fn bucket_level(state: &State, now: u64, a: u128, capacity: u128) -> u128 {
    match *state {
        State::Bucket { level, last } => {
            (level as u128 + now.saturating_sub(last) as u128 * a).min(capacity)
        }
        _ => capacity,
    }
}

/// nginx `ngx_http_limit_req_lookup`: the excess this request would leave,
/// or, when that is over `burst`, (the stored excess, ms since its last
/// update) so the caller can say when to retry. Rejections change nothing.
fn leaky_excess(
    state: &State,
    now: u64,
    rate: i128,
    burst_m: i128,
    cost: u64,
) -> Result<i128, (i128, u64)> {
    let cost_m = 1000 * cost as i128;
    let (excess, stored, ms) = match *state {
        State::Leaky { excess, last } => {
            let ms = now.saturating_sub(last);
            (
                (excess as i128 - rate * ms as i128 / 1000 + cost_m).max(0),
                excess as i128,
                ms,
            )
        }
        // A new key starts at excess 0: its first request adds nothing.
        _ => (cost_m - 1000, 0, 0),
    };
    if excess > burst_m {
        Err((stored, ms))
    } else {
        Ok(excess)
    }
}

#[cfg(test)]
mod tests;
