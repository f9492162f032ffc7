//! Properties of the algorithms over random traces: no window ever holds
//! more than its limit, the buckets never pass more than burst plus rate
//! times the time elapsed, and the token bucket and GCRA agree.

use proptest::prelude::*;

use super::*;

/// Random traces of (instant, cost), instants never decreasing.
pub(crate) fn increasing_times(max_gap: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0..max_gap, 1u64..4), 1..300).prop_map(|v| {
        let mut t = 0;
        v.into_iter()
            .map(|(gap, cost)| {
                t += gap;
                (t, cost)
            })
            .collect()
    })
}

fn admitted(alg: &Algorithm, trace: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut s = State::Empty;
    trace
        .iter()
        .copied()
        .filter(|&(t, c)| {
            let d = alg.check(&mut s, t, c);
            if d.admitted() {
                alg.charge(&mut s, t, c);
            }
            d.admitted()
        })
        .collect()
}

proptest! {
    fn sliding_log_never_admits_more_than_the_limit_in_any_window_cases(
        limit in 1u64..20, window in 1u64..500, trace in increasing_times(50)
    ) {
        let alg = Algorithm::SlidingLog { limit, window_ms: window };
        let ok = admitted(&alg, &trace);
        for &(end, _) in &ok {
            let in_window: u64 = ok.iter().filter(|&&(t, _)| t + window > end && t <= end).map(|&(_, c)| c).sum();
            prop_assert!(in_window <= limit, "{in_window} > {limit} in the window ending at {end}");
        }
        crate::testing::case_passed();
    }

    fn buckets_never_admit_more_than_burst_plus_rate_times_elapsed_cases(
        amount in 1u64..10, period in 1u64..2000, burst in 1u64..20, trace in increasing_times(300)
    ) {
        for alg in [
            Algorithm::TokenBucket { amount, period_ms: period, burst },
            Algorithm::Gcra { amount, period_ms: period, burst },
        ] {
            let ok = admitted(&alg, &trace);
            for (i, &(start, _)) in ok.iter().enumerate() {
                let mut sum = 0u64;
                for &(t, c) in &ok[i..] {
                    sum += c;
                    let bound = burst as u128 + (t - start) as u128 * amount as u128 / period as u128;
                    prop_assert!(sum as u128 <= bound, "{alg:?}: {sum} admitted in [{start}, {t}] > {bound}");
                }
            }
        }
        crate::testing::case_passed();
    }

    fn token_bucket_and_gcra_decide_alike_cases(
        amount in 1u64..10, period in 1u64..2000, burst in 1u64..20, trace in increasing_times(300)
    ) {
        let tb = Algorithm::TokenBucket { amount, period_ms: period, burst };
        let gcra = Algorithm::Gcra { amount, period_ms: period, burst };
        let (mut a, mut b) = (State::Empty, State::Empty);
        for &(t, c) in &trace {
            let (da, db) = (tb.check(&mut a, t, c), gcra.check(&mut b, t, c));
            prop_assert_eq!(da.verdict, db.verdict, "at {}", t);
            prop_assert_eq!(da.remaining, db.remaining, "at {}", t);
            prop_assert_eq!(da.retry_after_ms, db.retry_after_ms, "at {}", t);
            if da.admitted() {
                tb.charge(&mut a, t, c);
                gcra.charge(&mut b, t, c);
            }
        }
        crate::testing::case_passed();
    }
}

#[test]
fn sliding_log_never_admits_more_than_the_limit_in_any_window() {
    crate::testing::count_cases(
        "sliding_log_never_admits_more_than_the_limit_in_any_window",
        256,
        sliding_log_never_admits_more_than_the_limit_in_any_window_cases,
    );
}

#[test]
fn buckets_never_admit_more_than_burst_plus_rate_times_elapsed() {
    crate::testing::count_cases(
        "buckets_never_admit_more_than_burst_plus_rate_times_elapsed",
        256,
        buckets_never_admit_more_than_burst_plus_rate_times_elapsed_cases,
    );
}

#[test]
fn token_bucket_and_gcra_decide_alike() {
    crate::testing::count_cases(
        "token_bucket_and_gcra_decide_alike",
        256,
        token_bucket_and_gcra_decide_alike_cases,
    );
}
