//! The one place tollgate reads the time.
//!
//! Everything whose outcome depends on how much time has passed (limit
//! decisions, the rejection cache, upstream cool-downs and pool ages,
//! alert windows, top-offender decay) asks the [`Clock`] it was given.
//! Production runs on [`Clock::system`]; tests build the server on the
//! clock of a [`FrozenClock`] and move it with [`FrozenClock::advance`],
//! so a test of a refill or an expiry takes no real time and cannot race
//! the machine.
//! Socket timeouts stay on `tokio::time`, which tests leave running.
//!
//! `.clippy.toml` bans `Instant::now` and `SystemTime::now` everywhere
//! else.

#![allow(clippy::disallowed_methods)] // the one reader of the real clock

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A monotonic clock plus the wall time it started at.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    /// `None`: the system's clock.
    frozen: Option<Arc<Frozen>>,
}

/// A clock that stands still until it is advanced (for tests): hand its
/// [`FrozenClock::clock`] to what is tested, keep this to move it.
#[derive(Clone, Debug)]
pub struct FrozenClock(Arc<Frozen>);

#[derive(Debug)]
struct Frozen {
    at: Instant,
    unix_ms: u64,
    /// Nanoseconds advanced since `at`.
    advanced: AtomicU64,
}

impl Clock {
    /// The machine's clock.
    pub fn system() -> Clock {
        Clock { frozen: None }
    }

    /// Now, on the monotonic clock.
    #[inline]
    pub fn now(&self) -> Instant {
        match &self.frozen {
            None => Instant::now(),
            Some(f) => f.at + Duration::from_nanos(f.advanced.load(Ordering::Relaxed)),
        }
    }

    /// Waits `d` on this clock: on the system's, a timer; on a frozen one,
    /// not at all (its time moves only when it is advanced, so a wait
    /// would never end on it, and a replay must not wait in real time).
    pub async fn sleep(&self, d: Duration) {
        if self.frozen.is_none() {
            tokio::time::sleep(d).await;
        }
    }

    /// Whether this is a test's frozen clock (a Redis store then pins its
    /// scripts' clock to it instead of Redis `TIME`).
    pub fn is_frozen(&self) -> bool {
        self.frozen.is_some()
    }

    /// Now, in milliseconds since the Unix epoch.
    pub fn unix_ms(&self) -> u64 {
        match &self.frozen {
            None => unix_ms(),
            Some(f) => f.unix_ms + f.advanced.load(Ordering::Relaxed) / 1_000_000,
        }
    }
}

impl FrozenClock {
    /// Stopped at the current time.
    pub fn new() -> FrozenClock {
        FrozenClock::at_unix_ms(unix_ms())
    }

    /// Stopped at `unix_ms` (milliseconds since the Unix epoch) on the
    /// wall clock: a replay's clock starts at its log's first request, so
    /// windows fall on the same wall-clock boundaries as they did live.
    pub fn at_unix_ms(unix_ms: u64) -> FrozenClock {
        FrozenClock(Arc::new(Frozen {
            at: Instant::now(),
            unix_ms,
            advanced: AtomicU64::new(0),
        }))
    }

    /// The clock to give to what is tested.
    pub fn clock(&self) -> Clock {
        Clock {
            frozen: Some(self.0.clone()),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0
            .advanced
            .fetch_add(by.as_nanos() as u64, Ordering::Relaxed);
    }
}

impl Default for FrozenClock {
    fn default() -> Self {
        Self::new()
    }
}

/// The wall time in milliseconds since the Unix epoch, for time stamps
/// that decide nothing (log lines, dashboard samples, alert payloads).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The wall time in nanoseconds since the Unix epoch, for span time
/// stamps (which decide nothing).
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frozen_clock_moves_only_when_advanced() {
        let frozen = FrozenClock::new();
        let clock = frozen.clock();
        let (t0, w0) = (clock.now(), clock.unix_ms());
        std::thread::sleep(Duration::from_millis(5)); // real time passes
        assert_eq!(clock.now(), t0);
        assert_eq!(clock.unix_ms(), w0);
        frozen.advance(Duration::from_millis(1500));
        assert_eq!(clock.now() - t0, Duration::from_millis(1500));
        assert_eq!(clock.unix_ms() - w0, 1500);
        // Clones share the time.
        frozen.clone().advance(Duration::from_millis(1));
        assert_eq!(clock.clone().now() - t0, Duration::from_millis(1501));
        assert_eq!(clock.now() - t0, Duration::from_millis(1501));
    }

    #[test]
    fn the_system_clock_runs() {
        let clock = Clock::system();
        let t0 = clock.now();
        std::thread::sleep(Duration::from_millis(5)); // real time passes
        assert!(clock.now() - t0 >= Duration::from_millis(5));
        assert!(clock.unix_ms() > 1_700_000_000_000);
    }
}
