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

mod buckets;
mod leaky;
mod quota;
mod rescale;
mod settle;
mod windows;

#[cfg(test)]
pub(crate) mod properties;

pub use quota::used as quota_used;
pub use rescale::rescale;
pub use settle::{settle, settles};

use std::collections::VecDeque;

use super::calendar::Calendar;
use super::{Decision, Verdict};

/// Largest `limit` a `sliding_log` may have: its memory grows with it.
pub const SLIDING_LOG_MAX_LIMIT: u64 = 10_000;
/// Largest intermediate value: the Redis store computes in Lua, whose
/// numbers are doubles, exact up to 2^53.
const EXACT: u128 = 1 << 53;
/// nginx keeps a drained leaky-bucket entry for a minute before expiring it
/// (a kept entry and a fresh one decide the next request differently).
const LEAKY_EXPIRE_MS: u64 = 60_000;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
    /// `limit` per calendar period (see [`Calendar`]).
    Quota { limit: u64, calendar: Calendar },
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

/// The quota and window a limit advertises, for every decision it makes.
#[derive(Debug, Clone, Copy)]
struct Policy {
    limit: u64,
    window_ms: u64,
}

impl Policy {
    fn decide(
        self,
        verdict: Verdict,
        remaining: u64,
        reset_ms: u64,
        retry_after_ms: u64,
    ) -> Decision {
        Decision {
            verdict,
            limit: self.limit,
            remaining,
            reset_ms,
            retry_after_ms,
            window_ms: self.window_ms,
        }
    }
}

/// `a / b` for the algorithms' 128-bit intermediates (wide so that no
/// product overflows). They fit in 64 bits in practice, and a 64-bit
/// division is one instruction where a 128-bit one is a call into
/// compiler-builtins; the quotient is the same.
#[inline]
fn div(a: u128, b: u128) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => u128::from(a / b),
        _ => a / b,
    }
}

/// [`div`] for the signed intermediates (nginx's leaky bucket); `b > 0`.
#[inline]
fn div_signed(a: i128, b: i128) -> i128 {
    match (i64::try_from(a), i64::try_from(b)) {
        (Ok(a), Ok(b)) if b > 0 => i128::from(a / b),
        _ => a / b,
    }
}

/// `a / b` rounded up, at most `u64::MAX`.
fn div_ceil(a: u128, b: u128) -> u64 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => a.div_ceil(b),
        _ => a.div_ceil(b).min(u64::MAX as u128) as u64,
    }
}

impl Algorithm {
    /// A rate-and-burst algorithm: `gcra` or else `token_bucket`.
    pub fn rated(gcra: bool, amount: u64, period_ms: u64, burst: u64) -> Algorithm {
        if gcra {
            Algorithm::Gcra {
                amount,
                period_ms,
                burst,
            }
        } else {
            Algorithm::TokenBucket {
                amount,
                period_ms,
                burst,
            }
        }
    }

    /// Checks the numbers make sense; the message follows the YAML path.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            Algorithm::Quota { limit, .. } => {
                if limit == 0 || limit as u128 > EXACT {
                    return Err(format!("limit must be from 1 to 2^53, got {limit}"));
                }
            }
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
            Algorithm::Quota {
                limit,
                ref calendar,
            } => Algorithm::Quota {
                limit: part(limit),
                calendar: calendar.clone(),
            },
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

    /// The name it is configured by.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::FixedWindow { .. } => "fixed_window",
            Algorithm::SlidingWindow { .. } => "sliding_window",
            Algorithm::SlidingLog { .. } => "sliding_log",
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::Gcra { .. } => "gcra",
            Algorithm::Leaky { .. } => "leaky_bucket",
            Algorithm::Quota { .. } => "quota",
        }
    }

    /// The quota and window the headers advertise (`q` and `w`); a
    /// calendar quota's usual period length (see [`Algorithm::policy_at`]).
    pub fn policy(&self) -> (u64, u64) {
        match *self {
            Algorithm::Quota {
                limit,
                ref calendar,
            } => (limit, calendar.period.nominal_ms()),
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

    /// [`Algorithm::policy`] at `now` (ms): a calendar quota's period
    /// holding it, as long as it really is.
    pub fn policy_at(&self, now: u64) -> (u64, u64) {
        match self {
            Algorithm::Quota { limit, calendar } => {
                let (start, end) = calendar.bounds(now);
                (*limit, end - start)
            }
            _ => self.policy(),
        }
    }

    /// The calendar of a quota.
    pub fn calendar(&self) -> Option<&Calendar> {
        match self {
            Algorithm::Quota { calendar, .. } => Some(calendar),
            _ => None,
        }
    }

    /// Decides for one request of `cost` at `now` (ms) without charging it.
    pub fn check(&self, state: &mut State, now: u64, cost: u64) -> Decision {
        let (limit, window_ms) = self.policy();
        let policy = Policy { limit, window_ms };
        match *self {
            Algorithm::Quota {
                limit,
                ref calendar,
            } => quota::check(limit, calendar, state, now, cost),
            Algorithm::FixedWindow { limit, window_ms } => {
                windows::fixed_check(limit, window_ms, state, now, cost, policy)
            }
            Algorithm::SlidingWindow { limit, window_ms } => {
                windows::sliding_check(limit, window_ms, state, now, cost, policy)
            }
            Algorithm::SlidingLog { limit, window_ms } => {
                windows::log_check(limit, window_ms, state, now, cost, policy)
            }
            Algorithm::TokenBucket {
                amount,
                period_ms,
                burst,
            } => buckets::token_check(amount, period_ms, burst, state, now, cost, policy),
            Algorithm::Gcra {
                amount,
                period_ms,
                burst,
            } => buckets::gcra_check(amount, period_ms, burst, state, now, cost, policy),
            Algorithm::Leaky {
                rate_milli,
                burst,
                delay,
            } => leaky::check(rate_milli, burst, delay, state, now, cost, policy),
        }
    }

    /// Records an admitted request: call only after `check` allowed it (or
    /// delayed it) at the same `now` on the same state.
    pub fn charge(&self, state: &mut State, now: u64, cost: u64) {
        match *self {
            Algorithm::Quota { ref calendar, .. } => quota::charge(calendar, state, now, cost),
            Algorithm::FixedWindow { window_ms, .. } => {
                windows::fixed_charge(window_ms, state, now, cost)
            }
            Algorithm::SlidingWindow { window_ms, .. } => {
                windows::sliding_charge(window_ms, state, now, cost)
            }
            Algorithm::SlidingLog { .. } => windows::log_charge(state, now, cost),
            Algorithm::TokenBucket {
                amount,
                period_ms,
                burst,
            } => buckets::token_charge(amount, period_ms, burst, state, now, cost),
            Algorithm::Gcra {
                amount, period_ms, ..
            } => buckets::gcra_charge(amount, period_ms, state, now, cost),
            Algorithm::Leaky {
                rate_milli, burst, ..
            } => leaky::charge(rate_milli, burst, state, now, cost),
        }
    }

    /// Whether the state now decides exactly like a fresh key, so the store
    /// may forget it.
    pub fn is_idle(&self, state: &State, now: u64) -> bool {
        match (self, state) {
            (_, State::Empty) => true,
            (Algorithm::Quota { calendar, .. }, _) => quota::is_idle(calendar, state, now),
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

#[cfg(test)]
mod tests;
