//! What the operator reads off a running pipeline: the limits as the API
//! shows them, the alerts fired, the dashboard's samples, the store's and
//! the upstreams' health, the listeners' counters, and the sources the
//! metrics exposition reads at scrape time. Read-only views over the
//! request path; nothing here runs per request.

use std::sync::Arc;

use crate::metrics::Sources;
use crate::pipeline::{ListenerView, Pipeline};

/// A zone or route limit as the admin API shows it.
pub struct LimitView<'a> {
    pub limit: &'a crate::limiter::Limit,
    pub key: &'a crate::config::KeyKind,
    /// The policy as configured (`10r/s burst 20`, `5 per 1m (sliding_log)`).
    pub spec: String,
    pub dry_run: bool,
    /// The route of a route limit (`-` for a zone), and its numbers per
    /// plan.
    pub route: &'a str,
    pub plans: Vec<(usize, &'a crate::limiter::Limit)>,
    pub settle: Option<&'a crate::config::Settle>,
    pub penalty: Option<&'a crate::config::penalty::Penalty>,
}

impl Pipeline {
    /// Every zone, then every route's limits: the order of the metrics
    /// limit indices (`Metrics::limits`).
    pub fn limit_views(&self) -> Vec<LimitView<'_>> {
        let zones = self.zones.configs().iter().map(|z| LimitView {
            limit: &z.limit,
            key: &z.key,
            spec: match z.limit.algorithm {
                crate::limiter::Algorithm::Leaky { burst, delay, .. } => {
                    let delay = match delay {
                        u64::MAX => " nodelay".to_owned(),
                        0 => String::new(),
                        d => format!(" delay={d}"),
                    };
                    format!("rate={} burst={burst}{delay}", z.rate_text)
                }
                _ => z.rate_text.to_string(),
            },
            dry_run: z.dry_run,
            route: "-",
            plans: Vec::new(),
            settle: None,
            penalty: z.penalty.as_deref(),
        });
        let routes = self.routes.iter().flat_map(|r| {
            r.limits.iter().map(|l| LimitView {
                limit: &l.limit,
                key: &l.key,
                spec: l.description.to_string(),
                dry_run: l.dry_run,
                route: &r.name,
                plans: l
                    .plans
                    .iter()
                    .enumerate()
                    .filter_map(|(i, p)| Some((i, p.as_ref()?)))
                    .collect(),
                settle: l.settle.as_ref(),
                penalty: l.penalty.as_deref(),
            })
        });
        zones.chain(routes).collect()
    }

    /// The last alerts fired, newest first.
    pub fn latest_alerts(&self) -> Vec<(u64, crate::alerts::Alert)> {
        self.alerts.latest()
    }

    /// The running totals now (requests, rejections, decisions, upstream
    /// errors), for the dashboard's history.
    pub fn sample(&self) -> crate::metrics::history::Sample {
        let at_ms = crate::clock::unix_ms();
        let upstream_errors = self
            .upstreams_report()
            .into_iter()
            .flat_map(|u| u.targets)
            .map(|t| t.failures.iter().sum::<u64>())
            .sum();
        self.metrics.sample(at_ms, upstream_errors)
    }

    /// Every upstream's counters (dashboard, metrics).
    pub fn upstreams_report(&self) -> Vec<crate::metrics::UpstreamReport> {
        let mut all: Vec<_> = self.upstreams.iter().map(|u| u.report()).collect();
        for r in all.iter_mut().filter_map(|u| u.protect.as_mut()) {
            r.classes = self.priorities.names.clone();
        }
        all
    }

    /// Every listener with its connection counters (dashboard).
    pub fn listeners_report(&self) -> Vec<(crate::metrics::ListenerReport, &ListenerView)> {
        self.metrics
            .listeners_report()
            .into_iter()
            .zip(self.listeners.iter())
            .collect()
    }

    /// The store's health for the dashboard: `/readyz`'s report, plus its
    /// calls by result and the requests decided by a failure mode.
    pub fn store_health(&self) -> serde_json::Value {
        let mut report = self.store_report();
        let calls: serde_json::Map<String, serde_json::Value> = self
            .engine
            .calls()
            .into_iter()
            .map(|(_, result, n)| (result.to_owned(), n.into()))
            .collect();
        let fallbacks: serde_json::Map<String, serde_json::Value> = self
            .engine
            .fallbacks()
            .into_iter()
            .map(|(mode, n)| (mode.to_owned(), n.into()))
            .collect();
        if let Some(script_calls) = report.get_mut("calls").map(std::mem::take) {
            report["script_calls"] = script_calls;
        }
        report["calls"] = calls.into();
        report["fallbacks"] = fallbacks.into();
        report["breaker_open"] = self.engine.redis().map(|r| !r.is_up()).into();
        report
    }

    /// The rate-limit store's state, for `/readyz`.
    pub fn store_report(&self) -> serde_json::Value {
        match self.engine.redis() {
            None => serde_json::json!({ "kind": "memory", "up": true }),
            Some(r) => serde_json::json!({
                "kind": "redis",
                "up": r.is_up(),
                "calls": r.calls(),
                "sent_as": r.sent_as(),
            }),
        }
    }

    /// How many tokens the identity stage has verified (or tried to).
    pub fn token_verifications(&self) -> u64 {
        self.identity.verifications()
    }
}

impl Sources for Pipeline {
    fn script_calls(&self) -> Option<u64> {
        self.engine.redis().map(|r| r.calls())
    }

    fn lease_units(&self) -> Option<[u64; 3]> {
        self.engine.redis().map(|r| r.lease_units())
    }

    fn conn_leases(&self) -> Option<(usize, u64)> {
        self.engine.redis().map(|r| r.conn_leases())
    }

    fn store_durations(&self) -> Option<crate::metrics::HistogramSnapshot> {
        self.engine.durations()
    }

    fn upstreams(&self) -> Vec<crate::metrics::UpstreamReport> {
        self.upstreams_report()
    }

    fn store_calls(&self) -> Vec<(&'static str, &'static str, u64)> {
        self.engine.calls()
    }

    fn store_fallbacks(&self) -> Vec<(&'static str, u64)> {
        self.engine.fallbacks()
    }

    fn store_unsettled(&self) -> u64 {
        self.engine.unsettled()
    }

    fn breaker_open(&self) -> Option<bool> {
        self.engine.redis().map(|r| !r.is_up())
    }

    fn alerts(&self) -> Vec<(Arc<str>, u64)> {
        self.alerts.fired()
    }

    fn alert_deliveries(&self) -> Vec<(&'static str, u64)> {
        self.alerts.deliveries()
    }

    fn trace_spans(&self) -> Vec<(&'static str, u64)> {
        self.tracer.iter().flat_map(|t| t.counts()).collect()
    }

    fn penalties(&self) -> Vec<(Arc<str>, [u64; 3])> {
        let now = self.engine.clock().unix_ms();
        self.engine.penalties().counts(now)
    }

    fn zone_stats(&self) -> Vec<(u64, u64)> {
        self.partitions
            .iter()
            .map(|&p| {
                let s = self.engine.memory().stats(p);
                (s.keys as u64, s.evictions)
            })
            .collect()
    }
}
