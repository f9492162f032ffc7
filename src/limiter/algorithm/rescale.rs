//! A key's state carried across a config reload that changed its limit's
//! numbers: the client keeps the share of its budget it had used, rounded
//! against it (it never gains from a reload). A changed algorithm starts
//! fresh.
//!
//! | algorithm | what is scaled |
//! |---|---|
//! | `fixed_window` | the count, by new limit / old limit; a new window length starts a window now |
//! | `sliding_window` | the weighted count (previous window's share + current), by new limit / old limit, into a window starting now when the length changed |
//! | `sliding_log` | each entry's cost, by new limit / old limit; entries keep their times |
//! | `token_bucket` | the level (refilled to now), by new burst / old burst |
//! | `gcra` | the budget used (arrival time ahead of now), by new burst / old burst |
//! | `leaky_bucket` | the requests the excess stands for (drained to now), by (new burst + 1) / (old burst + 1) |

use super::{buckets, windows, Algorithm, Log, State};

/// `state`, written under `old`, as `new` should read it at `now`.
pub fn rescale(new: &Algorithm, old: &Algorithm, state: &State, now: u64) -> State {
    if new == old || matches!(state, State::Empty) {
        return state.clone();
    }
    // used x num / den, rounded up (against the client)
    let up = |used: u128, num: u64, den: u64| {
        used * num as u128 / den.max(1) as u128
            + u128::from(!(used * num as u128).is_multiple_of(den.max(1) as u128))
    };
    match (new, old, state) {
        (
            Algorithm::Quota { limit, calendar },
            Algorithm::Quota {
                limit: l0,
                calendar: c0,
            },
            _,
        ) => {
            // The count of the period current now, moved to the new
            // calendar's period (a new billing day) and scaled.
            let (count, _) = super::quota_used(c0, state, now);
            State::Window {
                start: calendar.bounds(now).0,
                count: up(count as u128, *limit, *l0) as u64,
            }
        }
        (
            Algorithm::FixedWindow { limit, window_ms },
            Algorithm::FixedWindow {
                limit: l0,
                window_ms: w0,
            },
            _,
        ) => {
            let (start, count) = windows::fixed_roll(state, now, *w0);
            let count = up(count as u128, *limit, *l0) as u64;
            let start = if window_ms == w0 {
                start
            } else {
                now - now % window_ms
            };
            State::Window { start, count }
        }
        (
            Algorithm::SlidingWindow { limit, window_ms },
            Algorithm::SlidingWindow {
                limit: l0,
                window_ms: w0,
            },
            _,
        ) => {
            let (start, prev, curr) = windows::sliding_roll(state, now, *w0);
            let u32_of = |v: u128| u32::try_from(v).unwrap_or(u32::MAX);
            if window_ms == w0 {
                return State::Sliding {
                    start,
                    prev: u32_of(up(prev as u128, *limit, *l0)),
                    curr: u32_of(up(curr as u128, *limit, *l0)),
                };
            }
            // The estimate now, in a window of the new length starting now.
            let left = (start + w0 - now) as u128;
            let used = (prev as u128 * left).div_ceil(*w0 as u128) + curr as u128;
            State::Sliding {
                start: now - now % window_ms,
                prev: 0,
                curr: u32_of(up(used, *limit, *l0)),
            }
        }
        (
            Algorithm::SlidingLog { limit, .. },
            Algorithm::SlidingLog { limit: l0, .. },
            State::Log(log),
        ) => {
            let mut scaled = Log::default();
            for &(t, cost) in &log.entries {
                let c = u32::try_from(up(cost as u128, *limit, *l0)).unwrap_or(u32::MAX);
                scaled.entries.push_back((t, c));
                scaled.total += c as u64;
            }
            State::Log(Box::new(scaled))
        }
        (
            Algorithm::TokenBucket {
                period_ms, burst, ..
            },
            Algorithm::TokenBucket {
                amount: a0,
                period_ms: p0,
                burst: b0,
            },
            _,
        ) => {
            let capacity0 = *b0 as u128 * *p0 as u128;
            let level0 = buckets::bucket_level(state, now, *a0 as u128, capacity0);
            // The share left, rounded down: level x new capacity / old.
            let capacity = *burst as u128 * *period_ms as u128;
            State::Bucket {
                level: (level0 * capacity / capacity0.max(1)) as u64,
                last: now,
            }
        }
        (
            Algorithm::Gcra {
                amount,
                period_ms,
                burst,
            },
            Algorithm::Gcra {
                amount: a0,
                period_ms: p0,
                burst: b0,
            },
            _,
        ) => {
            let scaled_now0 = now as u128 * *a0 as u128;
            let used0 = buckets::gcra_tat(state, scaled_now0) - scaled_now0;
            let used = up(
                used0 * (*burst as u128 * *period_ms as u128),
                1,
                (*b0 as u128 * *p0 as u128).min(u64::MAX as u128) as u64,
            );
            State::Tat((now as u128 * *amount as u128 + used) as u64)
        }
        (
            Algorithm::Leaky { burst, .. },
            Algorithm::Leaky {
                rate_milli: r0,
                burst: b0,
                ..
            },
            State::Leaky { excess, last },
        ) => {
            let drained = *r0 as u128 * now.saturating_sub(*last) as u128 / 1000;
            let excess = (*excess as u128).saturating_sub(drained);
            // A key with an excess has used (excess / 1000) + 1 requests of
            // its burst + 1: scale that count, then back to an excess.
            let excess = if excess == 0 {
                0
            } else {
                up(excess + 1000, burst + 1, b0 + 1).saturating_sub(1000)
            };
            State::Leaky {
                excess: excess as u64,
                last: now,
            }
        }
        // Another algorithm: its state means nothing here.
        _ => State::Empty,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Charges `n` requests at `now`, each checked first.
    fn used(alg: &Algorithm, n: u64, now: u64) -> State {
        let mut s = State::Empty;
        for _ in 0..n {
            assert!(alg.check(&mut s, now, 1).admitted());
            alg.charge(&mut s, now, 1);
        }
        s
    }

    /// How many more requests `alg` admits on `state` at `now`.
    fn left(alg: &Algorithm, mut state: State, now: u64) -> u64 {
        let mut n = 0;
        while alg.check(&mut state, now, 1).admitted() {
            alg.charge(&mut state, now, 1);
            n += 1;
            assert!(n < 10_000);
        }
        n
    }

    #[test]
    fn four_of_five_used_is_eight_of_ten_on_every_algorithm() {
        let now = 1_000_000;
        let pairs = crate::testing::five_then_ten();
        for (old, new) in pairs {
            let state = used(&old, 4, now);
            assert_eq!(left(&old, state.clone(), now), 1, "{old:?}");
            let carried = rescale(&new, &old, &state, now);
            assert_eq!(left(&new, carried, now), 2, "{old:?} -> {new:?}");
            // Unchanged: the same state.
            assert_eq!(rescale(&old, &old, &state, now), state);
            // Halved: 4 of 5 is 2 of 2.5, rounded against the client.
            let half = old.divided(2);
            let carried = rescale(&half, &old, &state, now);
            assert_eq!(left(&half, carried, now), 0, "{old:?} -> {half:?}");
        }
    }

    #[test]
    fn another_algorithm_starts_fresh() {
        let now = 1_000_000;
        let old = Algorithm::FixedWindow {
            limit: 5,
            window_ms: 60_000,
        };
        let new = Algorithm::SlidingLog {
            limit: 5,
            window_ms: 60_000,
        };
        let state = used(&old, 5, now);
        assert_eq!(rescale(&new, &old, &state, now), State::Empty);
    }

    #[test]
    fn a_new_window_length_keeps_the_share_used_now() {
        let old = Algorithm::FixedWindow {
            limit: 10,
            window_ms: 60_000,
        };
        let new = Algorithm::FixedWindow {
            limit: 10,
            window_ms: 3_600_000,
        };
        let now = 7_200_000 + 30_000;
        let state = used(&old, 6, now);
        let carried = rescale(&new, &old, &state, now);
        assert_eq!(left(&new, carried, now), 4);
    }
}
