//! The adaptive concurrency limit: a gradient controller (Envoy's
//! adaptive concurrency filter, Netflix's gradient limits). Every
//! `interval`, off the request path, the mean latency of the answers that
//! came back is compared with the backend's unloaded latency (`min_rtt`):
//!
//! ```text
//! gradient  = clamp((1 + tolerance) * min_rtt / latency, 0.5, 2)
//! new limit = clamp(limit * gradient + sqrt(limit * gradient), min, max)
//! ```
//!
//! While latency stays within `tolerance` of the unloaded one the limit
//! grows (by half as much again per step at most, and only when requests
//! used half of it: an idle upstream's limit does not climb to `max`);
//! once requests queue in the backend, latency rises and the limit falls
//! to what the backend serves without queueing. The square root is
//! headroom that lets the limit probe upwards.
//!
//! `min_rtt` is measured at the start and every `probe_every`: the limit
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
    min_rtt_us: Option<u64>,
    phase: Phase,
    next_probe: Option<Instant>,
    history: VecDeque<(u64, u32)>,
}

enum Phase {
    /// Measuring `min_rtt`: waiting for the requests in flight to drain
    /// to `min` (`measuring` false), then summing answers; the limit
    /// returns to `restore` after.
    Probing {
        measuring: bool,
        sum_us: u64,
        n: u32,
        restore: u32,
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
                min_rtt_us: None,
                phase: Phase::Probing {
                    measuring: false,
                    sum_us: 0,
                    n: 0,
                    restore: cfg.min,
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
        let new = match &mut st.phase {
            Phase::Probing {
                measuring,
                sum_us,
                n: got,
                restore,
            } => {
                if !*measuring {
                    // This window's answers may have queued in the backend.
                    *measuring = in_flight <= cfg.min;
                    cfg.min
                } else {
                    *sum_us += sum;
                    *got += n;
                    if *got >= cfg.probe_requests {
                        let measured = (*sum_us / u64::from(*got)).max(1);
                        let back = *restore;
                        st.min_rtt_us = Some(measured);
                        st.phase = Phase::Running;
                        st.next_probe = Some(now + cfg.probe_every);
                        back
                    } else {
                        cfg.min
                    }
                }
            }
            Phase::Running if probe_due => {
                st.phase = Phase::Probing {
                    measuring: false,
                    sum_us: 0,
                    n: 0,
                    restore: limit,
                };
                cfg.min
            }
            Phase::Running => match st.min_rtt_us {
                Some(min_rtt) => {
                    let rtt = (sum / u64::from(n)).max(1);
                    let min_rtt = min_rtt.min(rtt);
                    st.min_rtt_us = Some(min_rtt);
                    next_limit(cfg, limit, min_rtt, rtt, peak)
                }
                None => limit,
            },
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

/// The gradient step: the limit after a window whose mean latency was
/// `rtt` (µs), the backend's unloaded one `min_rtt`, and at most `peak`
/// requests in flight.
fn next_limit(cfg: &Concurrency, limit: u32, min_rtt: u64, rtt: u64, peak: u32) -> u32 {
    let gradient = ((1.0 + cfg.tolerance) * min_rtt as f64 / rtt as f64).clamp(0.5, 2.0);
    // Requests did not use the limit: latency says nothing about more.
    if gradient >= 1.0 && peak.saturating_mul(2) < limit {
        return limit;
    }
    let scaled = f64::from(limit) * gradient;
    let new = (scaled + scaled.sqrt()).round();
    (new as u32).clamp(cfg.min, cfg.max)
}

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
        let mut limit = 2;
        let at = |workers: u32, limit: &mut u32| {
            for _ in 0..40 {
                *limit = next_limit(&c, *limit, 50_000, latency(*limit, workers, 50_000), *limit);
            }
        };
        at(10, &mut limit);
        // Enough to keep every worker busy, not so many that a request
        // waits longer than the tolerance allows (plus the headroom).
        assert!((10..=18).contains(&limit), "limit {limit} for 10 workers");
        at(5, &mut limit);
        assert!((5..=10).contains(&limit), "limit {limit} for 5 workers");
        at(10, &mut limit);
        assert!(
            (10..=18).contains(&limit),
            "limit {limit} back at 10 workers"
        );
    }

    #[test]
    fn an_idle_limit_does_not_climb() {
        let c = cfg();
        assert_eq!(next_limit(&c, 20, 50_000, 50_000, 3), 20);
        assert!(next_limit(&c, 20, 50_000, 50_000, 15) > 20);
        // Never past its bounds.
        assert_eq!(next_limit(&c, 100, 50_000, 50_000, 100), 100);
        assert_eq!(next_limit(&c, 2, 50_000, 500_000, 2), 2);
    }
}
