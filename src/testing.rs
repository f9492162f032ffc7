//! Support for the test suites (not used by the proxy): randomised tests
//! count the cases they really ran, so a strategy that rejects everything
//! or a loop that skips its body cannot pass unseen.

use std::cell::Cell;

use crate::limiter::Algorithm;

thread_local! {
    static PASSED: Cell<u64> = const { Cell::new(0) };
}

/// Marks one case of the randomised test running on this thread as run to
/// its end (its last statement calls this).
pub fn case_passed() {
    PASSED.with(|c| c.set(c.get() + 1));
}

/// Runs the randomised test `run` on this thread, prints how many of its
/// cases ran to their end and asserts that at least `at_least` did.
pub fn count_cases(name: &str, at_least: u64, run: impl FnOnce()) -> u64 {
    PASSED.with(|c| c.set(0));
    run();
    let ran = PASSED.with(Cell::get);
    println!("{name}: {ran} cases ran");
    assert!(
        ran >= at_least,
        "{name}: only {ran} of {at_least} cases ran"
    );
    ran
}

/// Each algorithm at 5 requests a minute (a quota: a day), then at 10 (the leaky bucket in
/// nginx's terms: 5r/m burst 4, then 10r/m burst 9): the reload rescaling
/// cases the memory store's and Redis's tests share.
pub fn five_then_ten() -> [(Algorithm, Algorithm); 7] {
    [
        (
            Algorithm::FixedWindow {
                limit: 5,
                window_ms: 60_000,
            },
            Algorithm::FixedWindow {
                limit: 10,
                window_ms: 60_000,
            },
        ),
        (
            Algorithm::SlidingWindow {
                limit: 5,
                window_ms: 60_000,
            },
            Algorithm::SlidingWindow {
                limit: 10,
                window_ms: 60_000,
            },
        ),
        (
            Algorithm::SlidingLog {
                limit: 5,
                window_ms: 60_000,
            },
            Algorithm::SlidingLog {
                limit: 10,
                window_ms: 60_000,
            },
        ),
        (
            Algorithm::TokenBucket {
                amount: 5,
                period_ms: 60_000,
                burst: 5,
            },
            Algorithm::TokenBucket {
                amount: 10,
                period_ms: 60_000,
                burst: 10,
            },
        ),
        (
            Algorithm::Gcra {
                amount: 5,
                period_ms: 60_000,
                burst: 5,
            },
            Algorithm::Gcra {
                amount: 10,
                period_ms: 60_000,
                burst: 10,
            },
        ),
        (
            Algorithm::Leaky {
                rate_milli: 83,
                burst: 4,
                delay: u64::MAX,
            },
            Algorithm::Leaky {
                rate_milli: 166,
                burst: 9,
                delay: u64::MAX,
            },
        ),
        (quota(5), quota(10)),
    ]
}

/// A daily quota in UTC.
fn quota(limit: u64) -> Algorithm {
    let calendar =
        crate::limiter::Calendar::new(crate::limiter::Period::Day, crate::limiter::Zone::utc());
    Algorithm::Quota { limit, calendar }
}
