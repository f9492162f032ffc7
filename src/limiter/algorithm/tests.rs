//! Exact traces at chosen instants (the clock is an argument), computed by
//! hand from each algorithm's definition, and nginx's own `limit_req` rules.

use super::*;
use crate::limiter::Verdict::{Allow, Delay, Reject};

/// Runs a trace of (now, cost) on one key; returns (verdict, remaining,
/// retry_after_ms) per request, charging what was admitted.
fn run(alg: &Algorithm, trace: &[(u64, u64)]) -> Vec<(Verdict, u64, u64)> {
    let mut state = State::Empty;
    trace
        .iter()
        .map(|&(now, cost)| {
            let d = alg.check(&mut state, now, cost);
            if d.admitted() {
                alg.charge(&mut state, now, cost);
            }
            (d.verdict, d.remaining, d.retry_after_ms)
        })
        .collect()
}

fn ones(times: &[u64]) -> Vec<(u64, u64)> {
    times.iter().map(|&t| (t, 1)).collect()
}

#[test]
fn fixed_window_trace() {
    let alg = Algorithm::FixedWindow {
        limit: 3,
        window_ms: 1000,
    };
    let got = run(
        &alg,
        &ones(&[0, 10, 999, 999, 1000, 1000, 1000, 1000, 100_000]),
    );
    assert_eq!(
        got,
        vec![
            (Allow, 2, 0),
            (Allow, 1, 0),
            (Allow, 0, 0),
            (Reject, 0, 1), // window ends in 1 ms
            (Allow, 2, 0),  // new window: the documented boundary burst
            (Allow, 1, 0),
            (Allow, 0, 0),
            (Reject, 0, 1000), // clock not moving
            (Allow, 2, 0),     // long idle
        ]
    );
    let mut s = State::Empty;
    assert_eq!(alg.check(&mut s, 250, 1).reset_ms, 750);
}

#[test]
fn sliding_window_trace() {
    let alg = Algorithm::SlidingWindow {
        limit: 10,
        window_ms: 1000,
    };
    let mut trace = vec![(500, 1); 10];
    trace.extend([
        (500, 1),
        (1099, 1),
        (1100, 1),
        (1100, 1),
        (1199, 1),
        (1200, 1),
        (5000, 1),
    ]);
    let got = run(&alg, &trace);
    assert_eq!(
        got[..10].iter().map(|g| g.1).collect::<Vec<_>>(),
        vec![9, 8, 7, 6, 5, 4, 3, 2, 1, 0]
    );
    assert_eq!(
        got[10..],
        [
            (Reject, 0, 600), // fits again at 1100: 10 x 900/1000 + 1 = 10
            (Reject, 0, 1),   // 10 x 901/1000 + 1 > 10
            (Allow, 0, 0),
            (Reject, 0, 100), // 10 x 800/1000 + 1 + 1 = 10 at 1200
            (Reject, 0, 1),
            (Allow, 0, 0),
            (Allow, 9, 0), // long idle: both windows forgotten
        ]
    );
}

#[test]
fn sliding_log_trace() {
    let alg = Algorithm::SlidingLog {
        limit: 3,
        window_ms: 1000,
    };
    let got = run(
        &alg,
        &ones(&[0, 100, 200, 300, 999, 1000, 1000, 1100, 1100]),
    );
    assert_eq!(
        got,
        vec![
            (Allow, 2, 0),
            (Allow, 1, 0),
            (Allow, 0, 0),
            (Reject, 0, 700), // the request at 0 leaves the window at 1000
            (Reject, 0, 1),
            (Allow, 0, 0), // window is (now - 1000, now]
            (Reject, 0, 100),
            (Allow, 0, 0),
            (Reject, 0, 100),
        ]
    );
    // Weighted cost: a cost-2 request needs two free slots.
    let got = run(&alg, &[(0, 2), (1, 2), (1000, 2), (1000, 1)]);
    assert_eq!(
        got,
        vec![
            (Allow, 1, 0),
            (Reject, 1, 999),
            (Allow, 1, 0),
            (Allow, 0, 0)
        ]
    );
}

#[test]
fn token_bucket_and_gcra_traces() {
    let mut trace = vec![(0, 1); 11];
    trace.extend([(199, 1), (200, 1), (200, 1), (2200, 1)]);
    let mut expected: Vec<(Verdict, u64, u64)> = (0..10).rev().map(|r| (Allow, r, 0)).collect();
    expected.extend([
        (Reject, 0, 200), // one token every 200 ms
        (Reject, 0, 1),   // 995 of 1000 thousandths refilled
        (Allow, 0, 0),
        (Reject, 0, 200), // clock not moving
        (Allow, 9, 0),    // long idle: refilled to the burst, no more
    ]);
    for alg in [
        Algorithm::TokenBucket {
            amount: 5,
            period_ms: 1000,
            burst: 10,
        },
        Algorithm::Gcra {
            amount: 5,
            period_ms: 1000,
            burst: 10,
        },
    ] {
        assert_eq!(run(&alg, &trace), expected, "{alg:?}");
        // Reset: time until the bucket is full again.
        let mut s = State::Empty;
        let d = alg.check(&mut s, 0, 1);
        alg.charge(&mut s, 0, 1);
        assert_eq!(d.reset_ms, 200, "{alg:?}");
    }
}

#[test]
fn a_weighted_request_can_cost_more_than_one() {
    let alg = Algorithm::TokenBucket {
        amount: 1,
        period_ms: 1000,
        burst: 5,
    };
    let got = run(&alg, &[(0, 3), (0, 3), (1000, 3)]);
    assert_eq!(got, vec![(Allow, 2, 0), (Reject, 2, 1000), (Allow, 0, 0)]);
}

/// nginx `limit_req zone=z burst=5` with `rate=10r/s`, all at one instant
/// and then as time passes. Computed from ngx_http_limit_req_lookup:
/// excess = max(0, excess - rate * ms / 1000 + 1000); reject when
/// excess > burst * 1000; a new key starts at excess 0.
fn nginx(delay: u64) -> Algorithm {
    Algorithm::Leaky {
        rate_milli: 10_000,
        burst: 5,
        delay,
    }
}

#[test]
fn leaky_nodelay_admits_burst_plus_one_at_once() {
    let got = run(&nginx(u64::MAX), &ones(&[0, 0, 0, 0, 0, 0, 0]));
    let verdicts: Vec<Verdict> = got.iter().map(|g| g.0).collect();
    assert_eq!(
        verdicts,
        vec![Allow, Allow, Allow, Allow, Allow, Allow, Reject]
    );
    assert_eq!(got[6].2, 100, "excess 5000 drains 1000 in 100 ms at 10r/s");
}

#[test]
fn leaky_without_nodelay_delays_every_excess_request() {
    let got = run(&nginx(0), &ones(&[0, 0, 0, 0, 0, 0, 0]));
    let verdicts: Vec<Verdict> = got.iter().map(|g| g.0).collect();
    assert_eq!(
        verdicts,
        vec![
            Allow,
            Delay(100),
            Delay(200),
            Delay(300),
            Delay(400),
            Delay(500),
            Reject
        ]
    );
}

#[test]
fn leaky_with_delay_2_lets_three_through_then_delays() {
    let got = run(&nginx(2), &ones(&[0, 0, 0, 0, 0, 0, 0]));
    let verdicts: Vec<Verdict> = got.iter().map(|g| g.0).collect();
    assert_eq!(
        verdicts,
        vec![
            Allow,
            Allow,
            Allow,
            Delay(100),
            Delay(200),
            Delay(300),
            Reject
        ]
    );
}

#[test]
fn leaky_rejections_consume_nothing_and_the_limit_itself_is_admitted() {
    // Six at 0 fill the burst (excess 5000, last 0).
    let mut trace = ones(&[0, 0, 0, 0, 0, 0]);
    trace.extend(ones(&[100, 150, 200]));
    let got = run(&nginx(u64::MAX), &trace);
    // 100: 5000 - 1000 + 1000 = 5000, exactly the burst: admitted.
    assert_eq!(got[6].0, Allow);
    // 150: 5000 - 500 + 1000 = 5500 > 5000: rejected, nothing stored.
    assert_eq!(got[7], (Reject, 0, 50));
    // 200: computed from the state at 100, as if 150 never happened.
    assert_eq!(got[8].0, Allow);
}

#[test]
fn leaky_one_request_per_minute_is_sixteen_thousandths() {
    // nginx stores 1r/m as 16 (thousandths per second): one per 62.5 s.
    let alg = Algorithm::Leaky {
        rate_milli: 16,
        burst: 0,
        delay: u64::MAX,
    };
    let got = run(&alg, &ones(&[0, 1, 62_499, 62_500]));
    assert_eq!(
        got,
        vec![
            (Allow, 0, 0),
            (Reject, 0, 62_499),
            (Reject, 0, 1),
            (Allow, 0, 0)
        ]
    );
}

#[test]
fn leaky_state_forgets_only_after_a_minute_drained() {
    let alg = nginx(u64::MAX);
    let mut s = State::Empty;
    let _ = alg.check(&mut s, 0, 1);
    alg.charge(&mut s, 0, 1);
    let _ = alg.check(&mut s, 0, 1);
    alg.charge(&mut s, 0, 1); // excess 1000
    assert!(!alg.is_idle(&s, 59_999));
    assert!(alg.is_idle(&s, 60_000));
}

#[test]
fn idleness_means_deciding_like_a_fresh_key() {
    let cases = [
        (
            Algorithm::FixedWindow {
                limit: 3,
                window_ms: 1000,
            },
            1000,
        ),
        (
            Algorithm::SlidingWindow {
                limit: 3,
                window_ms: 1000,
            },
            2000,
        ),
        (
            Algorithm::SlidingLog {
                limit: 3,
                window_ms: 1000,
            },
            1000,
        ),
        (
            Algorithm::TokenBucket {
                amount: 1,
                period_ms: 1000,
                burst: 3,
            },
            1000,
        ),
        (
            Algorithm::Gcra {
                amount: 1,
                period_ms: 1000,
                burst: 3,
            },
            1000,
        ),
    ];
    for (alg, idle_at) in cases {
        let mut s = State::Empty;
        let _ = alg.check(&mut s, 0, 1);
        alg.charge(&mut s, 0, 1);
        assert!(!alg.is_idle(&s, idle_at - 1), "{alg:?}");
        assert!(alg.is_idle(&s, idle_at), "{alg:?}");
        let mut fresh = State::Empty;
        assert_eq!(
            alg.check(&mut s, idle_at, 1),
            alg.check(&mut fresh, idle_at, 1),
            "{alg:?}"
        );
    }
}

#[test]
fn bad_numbers_are_refused_with_a_reason() {
    assert!(Algorithm::SlidingLog {
        limit: 20_000,
        window_ms: 1000
    }
    .validate()
    .unwrap_err()
    .contains("sliding_window"));
    assert!(Algorithm::FixedWindow {
        limit: 0,
        window_ms: 1000
    }
    .validate()
    .is_err());
    assert!(Algorithm::TokenBucket {
        amount: 1,
        period_ms: 0,
        burst: 1
    }
    .validate()
    .is_err());
    assert!(Algorithm::Leaky {
        rate_milli: 0,
        burst: 1,
        delay: 0
    }
    .validate()
    .is_err());
    assert!(Algorithm::Gcra {
        amount: 5,
        period_ms: 1000,
        burst: 10
    }
    .validate()
    .is_ok());
}

#[test]
fn divisions_agree_with_128_bit_ones_on_both_sides_of_64_bits() {
    let wide = u128::from(u64::MAX);
    let values = [
        0,
        1,
        999,
        1000,
        1001,
        1 << 53,
        wide - 1,
        wide,
        wide + 1,
        wide * 3 + 7,
    ];
    for &a in &values {
        for &b in values.iter().filter(|&&b| b > 0) {
            assert_eq!(div(a, b), a / b, "{a} / {b}");
            let up = a.div_ceil(b).min(wide) as u64;
            assert_eq!(div_ceil(a, b), up, "{a} / {b} rounded up");
            for a in [a as i128, -(a as i128)] {
                assert_eq!(div_signed(a, b as i128), a / b as i128, "{a} / {b} signed");
            }
        }
    }
}
