//! The last 15 minutes at a glance: a sample of the running totals every
//! [`STEP`], kept in a ring of [`SAMPLES`]. The dashboard and
//! `GET /api/limits` read rates and per-limit outcomes from it. Sampling
//! reads the same atomics a scrape reads, off the request path: the
//! requests themselves pay nothing for it.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

/// Time between samples.
pub const STEP: Duration = Duration::from_secs(5);
/// 15 minutes of steps, and the sample they start from.
pub const SAMPLES: usize = 181;

/// Running totals at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    /// Unix time, ms.
    pub at_ms: u64,
    /// Requests answered.
    pub requests: u64,
    /// Requests refused by a zone or a route limit.
    pub limited: u64,
    /// Upstream errors and timeouts.
    pub upstream_errors: u64,
    /// Per limit (metrics order): allowed, delayed, rejected, dry-run rejected.
    pub decisions: Vec<[u64; 4]>,
}

/// What happened between two samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Step {
    /// Unix time at the end of the step, ms.
    pub at_ms: u64,
    pub seconds: f64,
    pub requests: u64,
    pub limited: u64,
    pub upstream_errors: u64,
    pub decisions: Vec<[u64; 4]>,
}

#[derive(Debug, Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    /// A history whose first sample is now, with every total at zero.
    pub fn starting(limits: usize) -> Self {
        let h = History::default();
        h.record(Sample {
            at_ms: crate::clock::unix_ms(),
            decisions: vec![[0; 4]; limits],
            ..Sample::default()
        });
        h
    }

    pub fn record(&self, sample: Sample) {
        let mut s = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if s.len() == SAMPLES {
            s.pop_front();
        }
        s.push_back(sample);
    }

    /// Re-indexes every sample's per-limit outcomes from the `old` limits'
    /// order to the `new` one's (a reload); a limit not in `old` has none.
    pub fn relabel<L: PartialEq>(&self, old: &[L], new: &[L]) {
        let map: Vec<Option<usize>> = new
            .iter()
            .map(|l| old.iter().position(|o| o == l))
            .collect();
        let mut s = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        for sample in s.iter_mut() {
            let before = std::mem::take(&mut sample.decisions);
            sample.decisions = map
                .iter()
                .map(|m| m.and_then(|i| before.get(i).copied()).unwrap_or_default())
                .collect();
        }
    }

    /// The steps between consecutive samples, oldest first, ending with
    /// one from the last sample to `now` (the live totals).
    pub fn steps(&self, now: &Sample) -> Vec<Step> {
        let s = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let mut steps: Vec<Step> = s
            .iter()
            .zip(s.iter().skip(1))
            .map(|(a, b)| between(a, b))
            .collect();
        if let Some(last) = s.back() {
            if now.at_ms > last.at_ms {
                steps.push(between(last, now));
            }
        }
        steps
    }

    /// What happened since the sample at least `span` before `now` (or
    /// the oldest one): the "last minute" of `GET /api/limits`.
    pub fn since(&self, now: &Sample, span: Duration) -> Step {
        let s = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let cut = now.at_ms.saturating_sub(span.as_millis() as u64);
        let from = s
            .iter()
            .rev()
            .find(|x| x.at_ms <= cut)
            .or(s.front())
            .cloned()
            .unwrap_or_else(|| now.clone());
        between(&from, now)
    }
}

fn between(a: &Sample, b: &Sample) -> Step {
    Step {
        at_ms: b.at_ms,
        seconds: b.at_ms.saturating_sub(a.at_ms) as f64 / 1000.0,
        requests: b.requests.saturating_sub(a.requests),
        limited: b.limited.saturating_sub(a.limited),
        upstream_errors: b.upstream_errors.saturating_sub(a.upstream_errors),
        decisions: b
            .decisions
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let before = a.decisions.get(i).copied().unwrap_or_default();
                std::array::from_fn(|o| d[o].saturating_sub(before[o]))
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_ms: u64, requests: u64, rejected: u64) -> Sample {
        Sample {
            at_ms,
            requests,
            limited: rejected,
            upstream_errors: 0,
            decisions: vec![[requests - rejected, 0, rejected, 0]],
        }
    }

    #[test]
    fn steps_are_differences_and_the_ring_keeps_fifteen_minutes() {
        let h = History::default();
        for i in 0..SAMPLES as u64 + 20 {
            h.record(sample(i * 5000, i * 10, i * 2));
        }
        let now = sample((SAMPLES as u64 + 20) * 5000 - 2500, 2000, 500);
        let steps = h.steps(&now);
        assert_eq!(steps.len(), SAMPLES, "180 full steps and the live one");
        assert_eq!(steps[0].requests, 10);
        assert_eq!(steps[0].decisions, vec![[8, 0, 2, 0]]);
        let live = steps.last().unwrap();
        assert_eq!(live.seconds, 2.5);
        let last = (SAMPLES as u64 + 19) * 10;
        assert_eq!(live.requests, 2000 - last);
    }

    #[test]
    fn the_last_minute_starts_at_the_sample_a_minute_back() {
        let h = History::default();
        for i in 0..30u64 {
            h.record(sample(i * 5000, i * 10, i));
        }
        // Now is 150 s; a minute back is 90 s: the sample at 90 s (i = 18).
        let now = sample(150_000, 300, 30);
        let m = h.since(&now, Duration::from_secs(60));
        assert_eq!(m.seconds, 60.0);
        assert_eq!(m.requests, 300 - 180);
        assert_eq!(m.decisions, vec![[120 - 12, 0, 12, 0]]);
        // With no history the span is empty; a history that starts at zero
        // counts everything since.
        let empty = History::default().since(&now, Duration::from_secs(60));
        assert_eq!((empty.requests, empty.seconds), (0, 0.0));
        let young = History::starting(1);
        let later = sample(u64::MAX / 2, 7, 3);
        let m = young.since(&later, Duration::from_secs(60));
        assert_eq!((m.requests, m.decisions[0]), (7, [4, 0, 3, 0]));
    }
}
