//! nginx `limit_req`'s leaky bucket, to the thousandth of a request: an
//! excess that drains at the rate; a request is admitted while the excess
//! it leaves stays within `burst`, and waits (`Verdict::Delay`) for the part
//! of that excess beyond `delay`.

use super::{div_ceil, div_signed, Policy, State};
use crate::limiter::{Decision, Verdict};

pub(super) fn check(
    rate_milli: u64,
    burst: u64,
    delay: u64,
    state: &mut State,
    now: u64,
    cost: u64,
    policy: Policy,
) -> Decision {
    let burst_m = burst as i128 * 1000;
    let rate = rate_milli as i128;
    match leaky_excess(state, now, rate, burst_m, cost) {
        Ok(excess) => {
            let wait = if excess <= delay as i128 * 1000 || delay == u64::MAX {
                0
            } else {
                div_signed((excess - delay as i128 * 1000) * 1000, rate) as u64
            };
            let verdict = if wait > 0 {
                Verdict::Delay(wait)
            } else {
                Verdict::Allow
            };
            let remaining = div_signed(burst_m - excess, 1000) as u64;
            policy.decide(
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
            policy.decide(Verdict::Reject, 0, reset, retry)
        }
    }
}

pub(super) fn charge(rate_milli: u64, burst: u64, state: &mut State, now: u64, cost: u64) {
    if let Ok(excess) = leaky_excess(state, now, rate_milli as i128, burst as i128 * 1000, cost) {
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
                (excess as i128 - div_signed(rate * ms as i128, 1000) + cost_m).max(0),
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
