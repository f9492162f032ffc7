//! A fixed-bucket histogram of atomics: request durations, zone delays,
//! store and upstream call latencies.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A fixed-bucket histogram of atomics.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One per bound, then +Inf; not cumulative.
    buckets: Box<[AtomicU64]>,
    sum_us: AtomicU64,
}

/// `(sum in seconds, count, non-cumulative buckets with their bounds)`.
pub type HistogramSnapshot = (f64, u64, Vec<(f64, u64)>);

/// Bounds for the latency of one call (store, upstream response head).
pub const CALL_BOUNDS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = self
            .bounds
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(self.bounds.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut count = 0;
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let n = b.load(Ordering::Relaxed);
                count += n;
                (self.bounds.get(i).copied().unwrap_or(f64::INFINITY), n)
            })
            .collect();
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        (sum, count, buckets)
    }
}
