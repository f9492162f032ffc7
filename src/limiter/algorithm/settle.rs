//! Settling a cost after the answer: a request reserved `reserved` units
//! at admission (`age` ms ago) and really cost `delta` more (or, when
//! negative, fewer). The unused part goes back; the extra is charged even
//! past the limit, so a key that went over waits until its balance
//! recovers (the next window, or the refill of its debt).
//!
//! | algorithm | refund | extra |
//! |---|---|---|
//! | `fixed_window` | from the count, if the reservation's window is still the current one | added to the current window |
//! | `sliding_window` | from the counter the reservation sits in (current, or previous) | added to the current counter |
//! | `token_bucket` | tokens back, up to the burst | tokens taken; below empty, refill starts later (a debt) |
//! | `gcra` | the arrival time moves back, never before now | the arrival time moves ahead |
//! | `sliding_log` | from the entry the reservation wrote (the newest at most `SLACK` ms after it), then older ones | a new entry now |
//!
//! The zones' leaky bucket does not settle (config refuses it): nginx's
//! excess has no cost to give back.

use super::{buckets, windows, Algorithm, State};

/// How far apart the reservation's time and the time it is settled for
/// may read (two clocks: the store's, and the proxy's measure of the
/// reservation's age), in ms.
const SLACK: u64 = 5;

/// Whether `settle` works for this algorithm.
pub fn settles(algorithm: &Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::FixedWindow { .. }
            | Algorithm::SlidingWindow { .. }
            | Algorithm::TokenBucket { .. }
            | Algorithm::Gcra { .. }
            | Algorithm::SlidingLog { .. }
            | Algorithm::Quota { .. }
    )
}

/// Applies `delta` units (refund when negative) to `state` at `now`, for a
/// reservation made at `now - age`.
pub fn settle(algorithm: &Algorithm, state: &mut State, now: u64, age: u64, delta: i64) {
    let at = now.saturating_sub(age);
    let (refund, extra) = if delta < 0 {
        (delta.unsigned_abs(), 0)
    } else {
        (0, delta as u64)
    };
    match *algorithm {
        Algorithm::Quota { ref calendar, .. } => {
            super::quota::settle(calendar, state, now, at, delta)
        }
        Algorithm::FixedWindow { window_ms: w, .. } => {
            if extra > 0 {
                let (start, count) = windows::fixed_roll(state, now, w);
                *state = State::Window {
                    start,
                    count: count.saturating_add(extra),
                };
            } else if let State::Window { start, count } = state {
                if *start == at - at % w {
                    *count = count.saturating_sub(refund);
                }
            }
        }
        Algorithm::SlidingWindow { window_ms: w, .. } => {
            let u32_of = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
            if extra > 0 {
                let (start, prev, curr) = windows::sliding_roll(state, now, w);
                *state = State::Sliding {
                    start,
                    prev,
                    curr: curr.saturating_add(u32_of(extra)),
                };
            } else if let State::Sliding { start, prev, curr } = state {
                let reserved_in = at - at % w;
                if *start == reserved_in {
                    *curr = curr.saturating_sub(u32_of(refund));
                } else if *start == reserved_in + w {
                    *prev = prev.saturating_sub(u32_of(refund));
                }
            }
        }
        Algorithm::TokenBucket {
            amount,
            period_ms,
            burst,
        } => {
            let (a, p) = (amount as i128, period_ms as i128);
            let capacity = burst as i128 * p;
            // The balance now, scaled by the period: a debt is negative.
            let balance = match *state {
                State::Bucket { level: 0, last } if last > now => -((last - now) as i128) * a,
                _ => buckets::bucket_level(state, now, amount as u128, capacity as u128) as i128,
            };
            let balance = (balance + refund as i128 * p - extra as i128 * p).min(capacity);
            *state = if balance >= 0 {
                State::Bucket {
                    level: balance as u64,
                    last: now,
                }
            } else {
                // Refill starts once the debt has been waited out.
                let wait = (-balance + a - 1) / a;
                State::Bucket {
                    level: 0,
                    last: now.saturating_add(wait as u64),
                }
            };
        }
        Algorithm::Gcra {
            amount, period_ms, ..
        } => {
            let scaled_now = now as u128 * amount as u128;
            let tat = buckets::gcra_tat(state, scaled_now);
            let p = period_ms as u128;
            let tat = (tat + extra as u128 * p)
                .saturating_sub(refund as u128 * p)
                .max(scaled_now);
            *state = State::Tat(tat.min(u64::MAX as u128) as u64);
        }
        Algorithm::SlidingLog { .. } => {
            if extra > 0 {
                windows::log_charge(state, now, extra);
            } else if let State::Log(log) = state {
                let mut left = refund;
                for entry in log.entries.iter_mut().rev() {
                    if left == 0 {
                        break;
                    }
                    if entry.0 <= at + SLACK {
                        let take = left.min(u64::from(entry.1));
                        entry.1 -= take as u32;
                        log.total -= take;
                        left -= take;
                    }
                }
                log.entries.retain(|&(_, c)| c > 0);
            }
        }
        Algorithm::Leaky { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(alg: &Algorithm, s: &mut State, now: u64, cost: u64) -> bool {
        let d = alg.check(s, now, cost);
        if d.admitted() {
            alg.charge(s, now, cost);
        }
        d.admitted()
    }

    #[test]
    fn a_refund_gives_back_the_unused_part_on_every_settling_algorithm() {
        for alg in [
            Algorithm::FixedWindow {
                limit: 100,
                window_ms: 60_000,
            },
            Algorithm::SlidingWindow {
                limit: 100,
                window_ms: 60_000,
            },
            Algorithm::TokenBucket {
                amount: 100,
                period_ms: 60_000,
                burst: 100,
            },
            Algorithm::Gcra {
                amount: 100,
                period_ms: 60_000,
                burst: 100,
            },
            Algorithm::SlidingLog {
                limit: 100,
                window_ms: 60_000,
            },
            Algorithm::Quota {
                limit: 100,
                calendar: crate::limiter::Calendar::new(
                    crate::limiter::Period::Day,
                    crate::limiter::Zone::utc(),
                ),
            },
        ] {
            let now = 6_000_000;
            let mut s = State::Empty;
            // Reserve 80, really cost 30: 70 left, not 20.
            assert!(take(&alg, &mut s, now, 80), "{alg:?}");
            settle(&alg, &mut s, now + 10, 10, -50);
            assert_eq!(alg.check(&mut s, now + 10, 1).remaining, 69, "{alg:?}");
            // Extra past the limit: 70 + 20 = 90 more than reserved, the key
            // is over and refused, and waits for its balance.
            assert!(take(&alg, &mut s, now + 10, 10), "{alg:?}");
            settle(&alg, &mut s, now + 20, 10, 80);
            let d = alg.check(&mut s, now + 20, 1);
            assert!(!d.admitted(), "{alg:?} admits while over");
            assert_eq!(d.remaining, 0, "{alg:?}");
            assert!(d.retry_after_ms > 0, "{alg:?}");
        }
    }

    #[test]
    fn a_token_bucket_in_debt_waits_for_the_debt_then_refills() {
        // 1 token a second, 10 at most.
        let alg = Algorithm::TokenBucket {
            amount: 1,
            period_ms: 1000,
            burst: 10,
        };
        let mut s = State::Empty;
        assert!(take(&alg, &mut s, 0, 10));
        // 5 more than reserved: 5 s of debt, then 1 s for the next token.
        settle(&alg, &mut s, 0, 0, 5);
        let d = alg.check(&mut s, 0, 1);
        assert!(!d.admitted());
        assert_eq!(d.retry_after_ms, 6000);
        assert!(!alg.check(&mut s, 5_999, 1).admitted());
        assert!(alg.check(&mut s, 6_000, 1).admitted());
        assert!(!alg.is_idle(&s, 6_000), "a debt is not forgotten");
    }

    #[test]
    fn a_refund_after_the_window_turned_gives_nothing_back() {
        let alg = Algorithm::FixedWindow {
            limit: 10,
            window_ms: 1000,
        };
        let mut s = State::Empty;
        assert!(take(&alg, &mut s, 900, 10));
        assert!(take(&alg, &mut s, 1000, 4));
        // Reserved at 900 (the window before): the new window keeps its 4.
        settle(&alg, &mut s, 1100, 200, -10);
        assert_eq!(alg.check(&mut s, 1100, 1).remaining, 5);
    }
}
