//! The adaptive concurrency limit: a gradient controller (Envoy's
//! adaptive concurrency filter, Netflix's gradient limits). Every
//! `interval`, off the request path, the mean latency of the answers that
//! came back is compared with the backend's unloaded latency (`min_rtt`):
//!
//! ```text
//! gradient = clamp((1 + tolerance) * min_rtt / latency, 0.5, 2)
//! target   = limit * gradient (+ sqrt(limit * gradient) while >= 1)
//! limit    = clamp(limit + 0.25 * (target - limit), min, max)
//! ```
//!
//! While latency stays within `tolerance` of the unloaded one the limit
//! grows (only when requests used half of it: an idle upstream's limit
//! does not climb to `max`), the square root being headroom to probe
//! upwards; once requests queue in the backend, latency rises and the
//! limit falls to where latency is `tolerance` above the unloaded one.
//! Each window moves a quarter of the way: answers lag the limit by a
//! round trip, and whole steps overshoot and swing (a 100 ms window over
//! a 100 ms backend swung between 7 and 28 for 10 workers).
//!
//! `min_rtt` is measured at the start (from the first few answers, at
//! `min`) and every `probe_every`: the limit
//! is held at `min` until the requests in flight are down to it (the
//! backend's own queue drained), then the mean latency of
//! `probe_requests` answers is the new `min_rtt`, and the limit goes back
//! to where it was. A faster window lowers it at once. Why a gradient and
//! not Vegas: both need `min_rtt`; the gradient's step is proportional to
//! how far latency is off, so after a capacity step it settles in a few
//! intervals where Vegas moves by one (or a log) per interval.
//!
//! Memory: a sum, a count and a peak (atomics) per window, and 300
//! one-second points of history for the dashboard's chart.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::gate::Gate;
use crate::config::Concurrency;

/// Fewer answers in a window than this leave the limit as it is.
const MIN_SAMPLES: u32 = 5;
/// Points of history kept (one a second).
const HISTORY: usize = 300;

pub struct Controller {
    cfg: Concurrency,
    sum_us: AtomicU64,
    count: AtomicU32,
    /// The most requests in flight at once in this window.
    pub(super) peak: AtomicU32,
    state: Mutex<State>,
}

struct State {
    /// The limit as the controller computes it (the gate holds it
    /// rounded): small steps add up rather than round away.
    estimate: f64,
    min_rtt_us: Option<u64>,
    phase: Phase,
    next_probe: Option<Instant>,
    history: VecDeque<(u64, u32)>,
}

enum Phase {
    /// Measuring `min_rtt`: waiting for the requests in flight to drain
    /// to `min` (`measuring` false), then summing `need` answers; the
    /// limit returns to `restore` after.
    Probing {
        measuring: bool,
        sum_us: u64,
        n: u32,
        need: u32,
        restore: f64,
    },
    Running,
}

impl Controller {
    pub fn new(cfg: &Concurrency) -> Controller {
        Controller {
            cfg: cfg.clone(),
            sum_us: AtomicU64::new(0),
            count: AtomicU32::new(0),
            peak: AtomicU32::new(0),
            state: Mutex::new(State {
                estimate: f64::from(cfg.min),
                min_rtt_us: None,
                // The first measure takes a few answers only: until it is
                // done the limit is `min`.
                phase: Phase::Probing {
                    measuring: true,
                    sum_us: 0,
                    n: 0,
                    need: MIN_SAMPLES.min(cfg.probe_requests),
                    restore: f64::from(cfg.min),
                },
                next_probe: None,
                history: VecDeque::new(),
            }),
        }
    }

    /// One answer's latency (time to its head), on the request path:
    /// two atomic adds.
    pub fn sample(&self, latency: Duration) {
        self.sum_us
            .fetch_add(latency.as_micros() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// The window ends: the limit of `gate` recomputed.
    fn tick(&self, gate: &Gate, now: Instant, unix_s: u64) {
        let in_flight = gate.in_flight.load(Ordering::Relaxed);
        let limit = gate.limit.load(Ordering::Relaxed);
        let cfg = &self.cfg;
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *guard;
        // A window with too few answers to judge goes on into the next
        // (at a low limit and a slow backend, one window holds one answer).
        let running = matches!(st.phase, Phase::Running);
        if running && self.count.load(Ordering::Relaxed) < MIN_SAMPLES {
            Self::record(st, unix_s, limit);
            return;
        }
        let n = self.count.swap(0, Ordering::Relaxed);
        let sum = self.sum_us.swap(0, Ordering::Relaxed);
        let peak = self.peak.swap(in_flight, Ordering::Relaxed);
        let probe_due = st.next_probe.is_some_and(|at| now >= at);
        st.estimate = match &mut st.phase {
            Phase::Probing {
                measuring,
                sum_us,
                n: got,
                need,
                restore,
            } => {
                if !*measuring {
                    // This window's answers may have queued in the backend.
                    *measuring = in_flight <= cfg.min;
                    st.estimate
                } else {
                    *sum_us += sum;
                    *got += n;
                    if *got >= *need {
                        let measured = (*sum_us / u64::from(*got)).max(1);
                        let back = *restore;
                        st.min_rtt_us = Some(measured);
                        st.phase = Phase::Running;
                        st.next_probe = Some(now + cfg.probe_every);
                        back
                    } else {
                        st.estimate
                    }
                }
            }
            Phase::Running if probe_due => {
                st.phase = Phase::Probing {
                    measuring: false,
                    sum_us: 0,
                    n: 0,
                    need: cfg.probe_requests,
                    restore: st.estimate,
                };
                st.estimate
            }
            Phase::Running => match st.min_rtt_us {
                Some(min_rtt) => {
                    let rtt = (sum / u64::from(n)).max(1);
                    let min_rtt = min_rtt.min(rtt);
                    st.min_rtt_us = Some(min_rtt);
                    next_estimate(cfg, st.estimate, min_rtt, rtt, peak)
                }
                None => st.estimate,
            },
        };
        let new = match st.phase {
            Phase::Probing { .. } => cfg.min,
            Phase::Running => (st.estimate.round() as u32).clamp(cfg.min, cfg.max),
        };
        Self::record(st, unix_s, new);
        drop(guard);
        gate.limit.store(new, Ordering::Relaxed);
        if new > limit {
            gate.admit_waiting();
        }
    }

    /// The limit at `unix_s`, for the chart: one point a second.
    fn record(st: &mut State, unix_s: u64, limit: u32) {
        if st.history.back().is_none_or(|(s, _)| *s != unix_s) {
            if st.history.len() == HISTORY {
                st.history.pop_front();
            }
            st.history.push_back((unix_s, limit));
        } else if let Some(last) = st.history.back_mut() {
            last.1 = limit;
        }
    }

    /// `min_rtt` (µs), whether it is being measured, and the history.
    pub fn report(&self) -> (Option<u64>, bool, Vec<(u64, u32)>) {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let probing = matches!(st.phase, Phase::Probing { .. });
        (st.min_rtt_us, probing, st.history.iter().copied().collect())
    }
}

/// The gradient step, smoothed: the limit after a window whose mean
/// latency was `rtt` (µs), the backend's unloaded one `min_rtt`, and at
/// most `peak` requests in flight. The headroom is added only while
/// latency allows growth, so under overload the limit rests where latency
/// is `tolerance` above the unloaded one.
fn next_estimate(cfg: &Concurrency, limit: f64, min_rtt: u64, rtt: u64, peak: u32) -> f64 {
    let gradient = ((1.0 + cfg.tolerance) * min_rtt as f64 / rtt as f64).clamp(0.5, 2.0);
    // Requests did not use the limit: latency says nothing about more.
    if gradient >= 1.0 && f64::from(peak) * 2.0 < limit {
        return limit;
    }
    let scaled = limit * gradient;
    let target = match gradient >= 1.0 {
        true => scaled + scaled.sqrt(),
        false => scaled,
    };
    let new = limit + SMOOTHING * (target - limit);
    new.clamp(f64::from(cfg.min), f64::from(cfg.max))
}

/// How far each window moves the limit towards what its gradient asks:
/// answers lag the limit by a round trip, and a full step each window
/// overshoots and swings.
const SMOOTHING: f64 = 0.25;

/// Runs the controller of the gate behind `gate` every `interval`, until
/// the gate is gone (a reload replaced its upstream).
pub fn spawn(gate: Weak<Gate>, interval: Duration) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            every.tick().await;
            let Some(gate) = gate.upgrade() else { break };
            if let Some(c) = &gate.controller {
                c.tick(&gate, Instant::now(), crate::clock::unix_ms() / 1000);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Concurrency {
        Concurrency {
            min: 2,
            max: 100,
            tolerance: 0.25,
            interval: Duration::from_millis(100),
            probe_every: Duration::from_secs(60),
            probe_requests: 10,
        }
    }

    /// A backend of `workers` serving in `service` µs: a request's
    /// latency at `limit` in flight.
    fn latency(limit: u32, workers: u32, service: u64) -> u64 {
        service * u64::from(limit.max(workers)) / u64::from(workers)
    }

    #[test]
    fn settles_above_the_backends_workers_and_follows_a_step() {
        let c = cfg();
        let mut limit = 2.0;
        let at = |workers: u32, limit: &mut f64| {
            for _ in 0..60 {
                let l = limit.round() as u32;
                *limit = next_estimate(&c, *limit, 50_000, latency(l, workers, 50_000), l);
            }
        };
        at(10, &mut limit);
        // Enough to keep every worker busy, not so many that a request
        // waits longer than the tolerance allows (plus the headroom).
        assert!(
            (10.0..=16.0).contains(&limit),
            "limit {limit} for 10 workers"
        );
        at(5, &mut limit);
        assert!((5.0..=8.0).contains(&limit), "limit {limit} for 5 workers");
        at(10, &mut limit);
        assert!(
            (10.0..=16.0).contains(&limit),
            "limit {limit} back at 10 workers"
        );
    }

    #[test]
    fn an_idle_limit_does_not_climb() {
        let c = cfg();
        assert_eq!(next_estimate(&c, 20.0, 50_000, 50_000, 3), 20.0);
        assert!(next_estimate(&c, 20.0, 50_000, 50_000, 15) > 20.0);
        // Never past its bounds.
        assert_eq!(next_estimate(&c, 100.0, 50_000, 50_000, 100), 100.0);
        assert_eq!(next_estimate(&c, 2.0, 50_000, 500_000, 2), 2.0);
    }
}
