//! Support for the test suites (not used by the proxy): randomised tests
//! count the cases they really ran, so a strategy that rejects everything
//! or a loop that skips its body cannot pass unseen.

use std::cell::Cell;

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
