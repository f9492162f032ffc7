//! The Prometheus exposition: one scrape encodes the counters of
//! `Metrics` and what the `Sources` report, family by family.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use super::*;

mod upstreams;

/// One scrape: the counters and the sources, encoded.
pub(super) struct Scrape {
    pub(super) metrics: Arc<Metrics>,
    pub(super) sources: Arc<dyn Sources>,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scrape")
    }
}

fn counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Vec<(&'static str, String)>, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in series {
        ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Vec<(&'static str, String)>, i64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in series {
        ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn histograms(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Vec<(&'static str, String)>, HistogramSnapshot)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, (sum, count, buckets)) in series {
        family
            .encode_family(&labels)?
            .encode_histogram::<Vec<(&str, String)>>(sum, count, &buckets, None)?;
    }
    Ok(())
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.requests(&mut e)?;
        self.limits(&mut e)?;
        self.store(&mut e)?;
        self.connections(&mut e)?;
        self.upstreams(&mut e)?;
        self.operations(&mut e)?;
        Ok(())
    }
}

/// The families, by what they measure.
impl Scrape {
    /// Requests answered and how long they took.
    fn requests(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let m = &self.metrics;
        let routes = m.routes.len();
        let mut requests = Vec::new();
        for (l, listener) in m.listeners.iter().enumerate() {
            for (r, route) in m.routes.iter().enumerate() {
                for code in 0..CODES {
                    let n = m.requests[l * routes + r][code].load(Ordering::Relaxed);
                    if n > 0 {
                        let labels = vec![
                            ("listener", listener.to_string()),
                            ("route", route.to_string()),
                            ("code", (code + 100).to_string()),
                        ];
                        requests.push((labels, n));
                    }
                }
            }
        }
        counter(
            e,
            "tollgate_requests",
            "Requests answered, by listener, route and status code.",
            requests,
        )?;
        let mut grpc = Vec::new();
        for (route, codes) in m.routes.iter().zip(m.grpc.iter()) {
            for (code, n) in codes.iter().enumerate() {
                let n = n.load(Ordering::Relaxed);
                if n > 0 {
                    let status = match code {
                        17 => "other".to_owned(),
                        code => code.to_string(),
                    };
                    grpc.push((
                        vec![("route", route.to_string()), ("grpc_status", status)],
                        n,
                    ));
                }
            }
        }
        counter(
            e,
            "tollgate_grpc_calls",
            "gRPC calls answered, by route and grpc-status (other: a value outside 0-16).",
            grpc,
        )?;
        counter(
            e,
            "tollgate_plan_requests",
            "Requests whose limits were decided on a plan, by plan (names from the config).",
            m.plan_counts()
                .into_iter()
                .map(|(p, n)| (vec![("plan", p.to_string())], n)),
        )?;
        let mut units = Vec::new();
        for ((limit, route, plan), row) in m.costs() {
            for (kind, n) in ["reserved", "settled", "refunded", "extra"]
                .into_iter()
                .zip(row)
            {
                units.push((
                    vec![
                        ("limit", limit.to_string()),
                        ("route", route.to_string()),
                        ("plan", plan.to_string()),
                        ("kind", kind.to_owned()),
                    ],
                    n,
                ));
            }
        }
        counter(
            e,
            "tollgate_cost_units",
            "Cost units of limits that settle after the answer, by limit, route, plan (- for none) and kind: reserved at admission, settled in the end, refunded (reserved but not used), extra (used past the reservation).",
            units,
        )?;
        histograms(
            e,
            "tollgate_request_duration_seconds",
            "Time from the request head to the end of the response, by route.",
            m.routes
                .iter()
                .zip(m.durations.iter())
                .map(|(r, h)| (vec![("route", r.to_string())], h.snapshot())),
        )?;
        Ok(())
    }

    /// What the limits decided, delays, bypasses, and the memory zones' keys.
    fn limits(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let m = &self.metrics;
        let s = &self.sources;
        let mut decisions = Vec::new();
        for (i, limit) in m.limits.iter().enumerate() {
            for (o, outcome) in OUTCOMES.iter().enumerate() {
                for (u, user) in USER_TYPES.iter().enumerate() {
                    let cell = o * USER_TYPES.len() + u;
                    let labels = vec![
                        ("tier", limit.tier.to_owned()),
                        ("route", limit.route.to_string()),
                        ("limit", limit.name.to_string()),
                        ("outcome", (*outcome).to_owned()),
                        ("user_type", (*user).to_owned()),
                    ];
                    decisions.push((labels, m.decisions[i][cell].load(Ordering::Relaxed)));
                }
            }
        }
        counter(e, "tollgate_limit_decisions", "What the zones and route limits decided, by limit, outcome and whether the user was verified.", decisions)?;
        histograms(
            e,
            "tollgate_limit_delay_seconds",
            "How long zone delays (nginx burst without nodelay) held requests.",
            [(Vec::new(), m.global.delays.snapshot())],
        )?;
        counter(
            e,
            "tollgate_bypass",
            "Requests that skipped every limit, by reason.",
            BYPASS_REASONS
                .iter()
                .zip(&m.global.bypass)
                .map(|(r, c)| (vec![("reason", (*r).to_owned())], c.load(Ordering::Relaxed))),
        )?;
        let stats = s.zone_stats();
        gauge(
            e,
            "tollgate_zone_keys",
            "Keys tracked in this process's memory store, by limit.",
            m.limits.iter().zip(&stats).map(|(l, (keys, _))| {
                (
                    vec![
                        ("tier", l.tier.to_owned()),
                        ("route", l.route.to_string()),
                        ("limit", l.name.to_string()),
                    ],
                    *keys as i64,
                )
            }),
        )?;
        counter(
            e,
            "tollgate_zone_evictions",
            "Keys evicted from a full memory zone (least recently used), by limit.",
            m.limits.iter().zip(&stats).map(|(l, (_, ev))| {
                (
                    vec![
                        ("tier", l.tier.to_owned()),
                        ("route", l.route.to_string()),
                        ("limit", l.name.to_string()),
                    ],
                    *ev,
                )
            }),
        )?;
        Ok(())
    }

    /// The rate-limit store: calls, fallbacks, the breaker.
    fn store(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = &self.sources;
        counter(
            e,
            "tollgate_store_calls",
            "Calls to the rate-limit store, by store and result.",
            s.store_calls().into_iter().map(|(st, res, n)| {
                (
                    vec![("store", st.to_owned()), ("result", res.to_owned())],
                    n,
                )
            }),
        )?;
        counter(
            e,
            "tollgate_store_fallback",
            "Requests decided by a failure mode (on_error) because Redis failed.",
            s.store_fallbacks()
                .into_iter()
                .map(|(mode, n)| (vec![("mode", mode.to_owned())], n)),
        )?;
        counter(
            e,
            "tollgate_store_unsettled",
            "Settlements of reserved costs that Redis failed or did not answer in time; the reservation stands (never retried).",
            [(Vec::new(), s.store_unsettled())],
        )?;
        if let Some(n) = s.script_calls() {
            counter(
                e,
                "tollgate_store_script_calls",
                "Redis script calls (EVALSHA); one may decide a batch of requests.",
                [(Vec::new(), n)],
            )?;
        }
        if let Some([taken, returned, spent]) = s.lease_units() {
            counter(
                e,
                "tollgate_store_lease_units",
                "Lease slices of hot keys: units taken from Redis, given back unspent, and requests decided from a slice.",
                [("taken", taken), ("returned", returned), ("spent", spent)]
                    .map(|(kind, n)| (vec![("kind", kind.to_owned())], n)),
            )?;
        }
        if let Some((held, lost)) = s.conn_leases() {
            gauge(
                e,
                "tollgate_store_conn_slots",
                "Shared max_conn slots (max_conn_lease) this process holds in Redis now.",
                [(Vec::new(), held as i64)],
            )?;
            counter(
                e,
                "tollgate_store_conn_slots_lost",
                "Shared max_conn slots whose lease ended before this process renewed it (Redis lost it, or renewal was late): the request ran on uncounted.",
                [(Vec::new(), lost)],
            )?;
        }
        if let Some(h) = s.store_durations() {
            histograms(
                e,
                "tollgate_store_call_duration_seconds",
                "Time the Redis store took to decide a request.",
                [(vec![("store", "redis".to_owned())], h)],
            )?;
        }
        if let Some(open) = s.breaker_open() {
            gauge(
                e,
                "tollgate_store_breaker_open",
                "1 while the Redis circuit breaker is open.",
                [(Vec::new(), i64::from(open))],
            )?;
        }
        Ok(())
    }

    /// Client connections: open, TLS, the HTTP/1 fast path's hand-overs, protocol errors.
    fn connections(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let m = &self.metrics;
        gauge(
            e,
            "tollgate_connections_open",
            "Client connections open, by listener.",
            m.listeners
                .iter()
                .zip(m.listener_stats.iter())
                .map(|(l, c)| {
                    (
                        vec![("listener", l.to_string())],
                        c.open.load(Ordering::Relaxed),
                    )
                }),
        )?;
        counter(
            e,
            "tollgate_tls_handshake_failures",
            "TLS handshakes that failed or timed out, by listener.",
            m.listeners
                .iter()
                .zip(m.listener_stats.iter())
                .map(|(l, n)| {
                    (
                        vec![("listener", l.to_string())],
                        n.tls_failures.load(Ordering::Relaxed),
                    )
                }),
        )?;
        counter(
            e,
            "tollgate_tls_handshakes",
            "TLS handshakes done, by listener and kind (full, or resumed from a session ticket or the session cache).",
            m.by_listener_and("kind", &["full", "resumed"], |n, i| {
                n.tls_done[i].load(Ordering::Relaxed)
            }),
        )?;
        counter(
            e,
            "tollgate_http1_handovers",
            "HTTP/1.x connections tollgate's fast path handed to hyper for the rest of their life, by listener and why (chunked, expect, upgrade, head, http2).",
            m.by_listener_and("reason", &Handover::ALL.map(Handover::label), |n, i| {
                n.handovers[i].load(Ordering::Relaxed)
            }),
        )?;
        counter(
            e,
            "tollgate_http_protocol_errors",
            "Requests refused and connections ended because the client broke the HTTP rules, by listener and kind (head_too_large, too_many_headers, transfer_coding, http2).",
            m.by_listener_and(
                "kind",
                &ProtocolError::ALL.map(ProtocolError::label),
                |n, i| n.protocol_errors[i].load(Ordering::Relaxed),
            ),
        )?;
        counter(
            e,
            "tollgate_http2_resets",
            "HTTP/2 streams reset (RST_STREAM), by listener, side that sent it (client, tollgate) and error code (cancel: a client gave up; protocol_error or stream_closed from tollgate: a client that broke the rules on a stream; refused_stream: upstreams still busy with the connection's earlier requests). Only the codes seen are listed.",
            m.by_listener_side_code(|n| &n.h2_resets),
        )?;
        counter(
            e,
            "tollgate_http2_goaways",
            "HTTP/2 connections ended with GOAWAY, by listener, side and error code (enhance_your_calm from tollgate: too many streams reset for the client's errors, server.h2_max_reset_streams). Only the codes seen are listed.",
            m.by_listener_side_code(|n| &n.h2_goaways),
        )?;
        counter(
            e,
            "tollgate_http2_peer_noise",
            "Protocol warnings HTTP/2 peers caused (a PING ACK nobody asked for, a frame on a closed stream): counted here, not logged per frame.",
            [(Vec::new(), listener::H2_NOISE.load(Ordering::Relaxed))],
        )?;
        counter(
            e,
            "tollgate_connections_at_cap",
            "Connections accepted only after waiting because max_connections were open, by listener.",
            m.listeners.iter().zip(m.listener_stats.iter()).map(|(l, n)| (vec![("listener", l.to_string())], n.at_cap.load(Ordering::Relaxed))),
        )?;
        Ok(())
    }

    /// Alerts, the admin API, reloads and the build.
    fn operations(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let m = &self.metrics;
        let s = &self.sources;
        counter(
            e,
            "tollgate_alerts",
            "Times each alert rule fired.",
            s.alerts()
                .into_iter()
                .map(|(rule, n)| (vec![("rule", rule.to_string())], n)),
        )?;
        let boxes = s.penalties();
        let per = |i: usize| {
            boxes
                .iter()
                .map(move |(l, c)| (vec![("limit", l.to_string())], c[i]))
        };
        counter(
            e,
            "tollgate_penalty_bans",
            "Bans the penalty box started in this process, by limit.",
            per(0),
        )?;
        counter(
            e,
            "tollgate_penalty_refused",
            "Requests refused because their key served a ban, by limit.",
            per(1),
        )?;
        gauge(
            e,
            "tollgate_penalty_boxed",
            "Keys serving a ban now (every replica's, on Redis), by limit.",
            per(2).map(|(l, n)| (l, n as i64)),
        )?;
        counter(
            e,
            "tollgate_alert_deliveries",
            "Alert webhook deliveries, by result (dropped: the queue was full).",
            s.alert_deliveries()
                .into_iter()
                .map(|(r, n)| (vec![("result", r.to_owned())], n)),
        )?;
        let spans = s.trace_spans();
        if !spans.is_empty() {
            counter(
                e,
                "tollgate_trace_spans",
                "Spans of traced requests, by result: exported to the collector, or dropped (queue_full: the export queue was full; export_failed: the collector failed or timed out).",
                spans
                    .into_iter()
                    .map(|(r, n)| (vec![("result", r.to_owned())], n)),
            )?;
        }
        counter(
            e,
            "tollgate_admin_unauthorized",
            "Admin requests refused for a missing or wrong token.",
            [(
                Vec::new(),
                m.global.admin_unauthorized.load(Ordering::Relaxed),
            )],
        )?;
        counter(
            e,
            "tollgate_admin_key_resets",
            "Rate-limit keys reset through the admin API.",
            [(Vec::new(), m.global.key_resets.load(Ordering::Relaxed))],
        )?;
        counter(
            e,
            "tollgate_config_reloads",
            "Config reloads, by result (error: the file was refused and the running config kept).",
            ["ok", "error"]
                .into_iter()
                .zip(&m.global.reloads)
                .map(|(r, n)| (vec![("result", r.to_owned())], n.load(Ordering::Relaxed))),
        )?;
        gauge(
            e,
            "tollgate_build_info",
            "The running version (always 1).",
            [(vec![("version", env!("CARGO_PKG_VERSION").to_owned())], 1)],
        )?;
        Ok(())
    }
}
