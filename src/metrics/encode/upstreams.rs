//! The upstreams' families: attempts and their results, retries,
//! targets marked down, up, in flight, health checks, budgets, names
//! resolved, latency, HTTP/2 connections.

use prometheus_client::encoding::DescriptorEncoder;

use super::{counter, gauge, histograms, Scrape};
use crate::metrics::{Failure, ShedReason, TargetReport, UpstreamReport};

impl Scrape {
    /// Upstream requests, retries, cool-downs and latency.
    pub(super) fn upstreams(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = &self.sources;
        let upstreams = s.upstreams();
        let target_labels = |u: &'_ UpstreamReport, t: &TargetReport| {
            vec![
                ("upstream", u.name.to_string()),
                ("target", t.authority.to_string()),
            ]
        };
        let per_target = |value: fn(&TargetReport) -> i64| {
            upstreams.iter().flat_map(move |u| {
                u.targets
                    .iter()
                    .map(move |t| (target_labels(u, t), value(t)))
            })
        };
        counter(
            e,
            "tollgate_upstream_requests",
            "Attempts sent upstream, by upstream, target and result: ok (a response head came back and was used), or why the attempt failed (error, timeout, invalid_header, or a status listed in next_upstream.on that sent the request on).",
            upstreams.iter().flat_map(|u| {
                u.targets.iter().flat_map(move |t| {
                    let ok = std::iter::once(("ok", t.ok));
                    let failed = Failure::ALL.iter().map(move |f| (f.name(), t.failures[*f as usize]));
                    ok.chain(failed).map(move |(result, n)| {
                        let mut labels = target_labels(u, t);
                        labels.push(("result", result.to_owned()));
                        (labels, n)
                    })
                })
            }),
        )?;
        counter(
            e,
            "tollgate_upstream_retries",
            "Requests passed on from a target to the next, by reason (a next_upstream condition), and sent again to the same target on a fresh connection after a pooled one closed under them (stale_connection).",
            upstreams.iter().flat_map(|u| {
                u.targets.iter().flat_map(move |t| {
                    let reasons = Failure::ALL.iter().map(|f| f.name()).chain(std::iter::once("stale_connection"));
                    reasons.zip(t.retries).map(move |(reason, n)| {
                        let mut labels = target_labels(u, t);
                        labels.push(("reason", reason.to_owned()));
                        (labels, n)
                    })
                })
            }),
        )?;
        counter(
            e,
            "tollgate_upstream_cooldowns",
            "Times a target was marked down: max_fails failures (connect errors, timeouts, lost connections, answers that are not HTTP, listed statuses but 403 and 404) within fail_timeout.",
            per_target(|t| t.marked_down as i64).map(|(l, n)| (l, n as u64)),
        )?;
        counter(
            e,
            "tollgate_upstream_health_checks",
            "Active health checks of a target, by result (pass, fail).",
            upstreams.iter().flat_map(|u| {
                u.targets
                    .iter()
                    .filter(|_| u.all_failing_checks.is_some())
                    .flat_map(move |t| {
                        ["pass", "fail"]
                            .into_iter()
                            .zip(t.checks)
                            .map(move |(result, n)| {
                                let mut labels = target_labels(u, t);
                                labels.push(("result", result.to_owned()));
                                (labels, n)
                            })
                    })
            }),
        )?;
        counter(
            e,
            "tollgate_upstream_checks_all_failing",
            "Requests sent to an upstream while every one of its targets failed its health checks (they all take requests then, rather than none).",
            upstreams.iter().filter_map(|u| Some((vec![("upstream", u.name.to_string())], u.all_failing_checks?))),
        )?;
        counter(
            e,
            "tollgate_upstream_retry_budget_refused",
            "Retries to another target that the upstream's retry budget (next_upstream.budget) refused: the request was answered from the failed attempt.",
            upstreams.iter().filter_map(|u| Some((vec![("upstream", u.name.to_string())], u.budget_refused?))),
        )?;
        counter(
            e,
            "tollgate_upstream_resolve_failures",
            "DNS lookups of an upstream's resolve targets that failed or came back empty (the last good addresses were kept).",
            upstreams.iter().filter_map(|u| Some((vec![("upstream", u.name.to_string())], u.resolve_failures?))),
        )?;
        gauge(
            e,
            "tollgate_upstream_target_up",
            "1 while a target takes requests; 0 while it is marked down by its failures, drained by the admin API or down in the config.",
            per_target(|t| i64::from(t.up())),
        )?;
        gauge(
            e,
            "tollgate_upstream_in_flight",
            "Requests sent to a target whose answers have not ended, over all workers (what least_conn and max_conns read).",
            per_target(|t| i64::from(t.in_flight)),
        )?;
        let h2 = |pick: fn((usize, usize)) -> usize| {
            upstreams.iter().filter_map(move |u| {
                let n = pick(u.h2?) as i64;
                Some((vec![("upstream", u.name.to_string())], n))
            })
        };
        gauge(
            e,
            "tollgate_upstream_h2_connections",
            "HTTP/2 connections open to an upstream (protocol h2 or auto), over all workers.",
            h2(|(c, _)| c),
        )?;
        gauge(
            e,
            "tollgate_upstream_h2_streams",
            "Requests running on an upstream's HTTP/2 connections.",
            h2(|(_, s)| s),
        )?;
        self.protect(e, &upstreams)?;
        histograms(
            e,
            "tollgate_upstream_duration_seconds",
            "Time from sending a request upstream to its response head.",
            upstreams
                .into_iter()
                .map(|u| (vec![("upstream", u.name.to_string())], u.duration)),
        )?;
        Ok(())
    }
}

impl Scrape {
    /// Upstreams' concurrency limits, queues and shed requests.
    fn protect(
        &self,
        e: &mut DescriptorEncoder<'_>,
        upstreams: &[UpstreamReport],
    ) -> Result<(), std::fmt::Error> {
        let each = |value: fn(&crate::metrics::ProtectReport) -> Option<i64>| {
            upstreams.iter().filter_map(move |u| {
                let n = value(u.protect.as_ref()?)?;
                Some((vec![("upstream", u.name.to_string())], n))
            })
        };
        gauge(
            e,
            "tollgate_upstream_concurrency_limit",
            "An upstream's adaptive concurrency limit now (concurrency): requests admitted at once before the rest wait in its queue or are shed.",
            each(|p| p.limit.map(i64::from)),
        )?;
        gauge(
            e,
            "tollgate_upstream_admitted_in_flight",
            "Requests an upstream's gate admitted whose answers have not ended (what its concurrency limit bounds).",
            each(|p| Some(i64::from(p.in_flight))),
        )?;
        gauge(
            e,
            "tollgate_upstream_queue_length",
            "Requests waiting in an upstream's queue (for a place under its concurrency limit or a target under max_conns).",
            each(|p| p.queue_size.map(|_| i64::from(p.queued))),
        )?;
        let mut family = e.encode_descriptor(
            "tollgate_upstream_min_rtt_seconds",
            "The unloaded latency the concurrency controller measured for an upstream (the limit falls once latency rises past it by the tolerance).",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for u in upstreams {
            if let Some(us) = u.protect.as_ref().and_then(|p| p.min_rtt_us) {
                let labels = [("upstream", u.name.to_string())];
                let gauge = prometheus_client::metrics::gauge::ConstGauge::new(us as f64 / 1e6);
                prometheus_client::encoding::EncodeMetric::encode(
                    &gauge,
                    family.encode_family(&labels)?,
                )?;
            }
        }
        counter(
            e,
            "tollgate_upstream_dequeued",
            "Requests that waited in an upstream's queue and were then sent.",
            each(|p| p.queue_size.map(|_| p.dequeued as i64)).map(|(l, n)| (l, n as u64)),
        )?;
        counter(
            e,
            "tollgate_upstream_shed",
            "Requests an overloaded upstream shed (503, gRPC UNAVAILABLE), by priority class and reason: limit (over the concurrency limit, no queue), queue_full (the queue full, or a higher class took the place), timeout (waited the queue's timeout or the call's deadline).",
            upstreams.iter().flat_map(|u| {
                u.protect.iter().flat_map(move |p| {
                    p.classes.iter().zip(&p.shed).flat_map(move |(class, counts)| {
                        ShedReason::ALL.iter().map(move |why| {
                            let labels = vec![
                                ("upstream", u.name.to_string()),
                                ("class", class.to_string()),
                                ("reason", why.name().to_owned()),
                            ];
                            (labels, counts[*why as usize])
                        })
                    })
                })
            }),
        )?;
        Ok(())
    }
}
