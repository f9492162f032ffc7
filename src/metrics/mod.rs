//! The numbers the request path adds to, and their Prometheus exposition
//! (`GET /metrics` on the admin listener).
//!
//! Everything a request counts is an atomic in a table indexed by what the
//! config fixed at load: listener, route, limit, status code, outcome. The
//! hot path takes no lock and no hash lookup: a handful of relaxed atomic
//! adds per request. Labels only ever hold names from the config, codes and
//! outcomes, never a client IP, user, token or key (privacy, and a bounded
//! number of series).
//!
//! Families that live elsewhere (store calls, tracked keys) are read from
//! their owners at scrape time through [`Sources`].

pub mod history;
pub mod top;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use self::top::{Offender, TopKeys};
use crate::clock::Clock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// What a limit decided for a request, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed = 0,
    Delayed = 1,
    Rejected = 2,
    DryRunRejected = 3,
}

const OUTCOMES: [&str; 4] = ["allowed", "delayed", "rejected", "dry_run_rejected"];
const USER_TYPES: [&str; 2] = ["anonymous", "authenticated"];
/// The `reason` label of `tollgate_bypass_total`, by `Bypass` order.
pub const BYPASS_REASONS: [&str; 4] = ["path", "token", "source", "webhook_source"];
/// Status codes 100..=599, one counter each.
const CODES: usize = 500;
const DURATION_BOUNDS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const DELAY_BOUNDS: [f64; 10] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

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

/// A zone or a route limit, as metrics name it.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitLabel {
    /// `zone` or `route`.
    pub tier: &'static str,
    pub name: Arc<str>,
    /// The route a route limit belongs to (`-` for zones).
    pub route: Arc<str>,
}

/// One upstream's figures, read at scrape time.
#[derive(Debug)]
pub struct UpstreamReport {
    pub name: Arc<str>,
    /// Per target: responses, errors, timeouts, retries, cool-downs.
    pub targets: Vec<(Arc<str>, [u64; 5])>,
    /// Time to the response head.
    pub duration: HistogramSnapshot,
}

/// One listener's connection figures, read for the dashboard.
#[derive(Debug)]
pub struct ListenerReport {
    pub name: Arc<str>,
    /// Connections open now.
    pub open: i64,
    /// Connections accepted only after waiting for a slot.
    pub waited_at_cap: u64,
    /// TLS handshakes: full, resumed, failed or timed out.
    pub tls: [u64; 3],
    /// HTTP/1.x connections handed to hyper, by [`Handover::ALL`].
    pub handovers: [u64; Handover::ALL.len()],
    /// Protocol errors, by [`ProtocolError::ALL`].
    pub protocol_errors: [u64; ProtocolError::ALL.len()],
}

/// Read at scrape time from the parts that own them.
pub trait Sources: Send + Sync {
    /// Redis script calls (one per batch of requests), `None` without Redis.
    fn script_calls(&self) -> Option<u64>;
    /// Latency of the store's decisions (Redis only).
    fn store_durations(&self) -> Option<HistogramSnapshot>;
    fn upstreams(&self) -> Vec<UpstreamReport>;
    /// `(store, result, calls)`: `store` is memory or redis, `result` ok,
    /// error or timeout.
    fn store_calls(&self) -> Vec<(&'static str, &'static str, u64)>;
    /// `(mode, requests)` decided by a failure mode while Redis failed.
    fn store_fallbacks(&self) -> Vec<(&'static str, u64)>;
    /// Whether the Redis breaker is open (`None` without Redis).
    fn breaker_open(&self) -> Option<bool>;
    /// `(keys tracked, evictions)` per limit, in `limits` order.
    fn zone_stats(&self) -> Vec<(u64, u64)>;
    /// `(rule, times fired)`.
    fn alerts(&self) -> Vec<(Arc<str>, u64)>;
    /// `(result, webhook deliveries)`: ok, failed, dropped.
    fn alert_deliveries(&self) -> Vec<(&'static str, u64)>;
}

/// Per listener: connection counters, kept across reloads (the
/// connections outlive a config).
#[derive(Debug, Default)]
pub struct ListenerStats {
    open: AtomicI64,
    /// TLS handshakes failed or timed out.
    tls_failures: AtomicU64,
    /// TLS handshakes done: [full, resumed] (whether session resumption
    /// works for the clients).
    tls_done: [AtomicU64; 2],
    /// Connections accepted only after waiting for a slot.
    at_cap: AtomicU64,
    /// HTTP/1.x connections the fast path handed to hyper, by why
    /// (`Handover`): how much traffic takes the slower path.
    handovers: [AtomicU64; Handover::ALL.len()],
    /// Requests refused and connections ended for breaking the protocol,
    /// by kind (`ProtocolError`): counted, logged at most once each.
    protocol_errors: [AtomicU64; ProtocolError::ALL.len()],
}

/// Warnings the `h2` crate raised about a peer, ever: process-wide, since
/// the crate's log line names no connection (`logging` counts them).
static H2_NOISE: AtomicU64 = AtomicU64::new(0);

/// An HTTP/2 peer made the `h2` crate warn (see `logging`).
pub fn h2_noise_seen() {
    H2_NOISE.fetch_add(1, Ordering::Relaxed);
}

/// A client's breach of the HTTP rules that tollgate answered or ended
/// the connection for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// An HTTP/1.x head past twice `max_header_size` (431).
    HeadTooLarge,
    /// An HTTP/1.x head with more than twice `max_headers` fields (431).
    TooManyHeaders,
    /// A `Transfer-Encoding` other than exactly `chunked` (501).
    TransferCoding,
    /// An HTTP/2 connection the peer broke (a bad preface, a frame out of
    /// place, a flood): ended with GOAWAY.
    Http2,
}

impl ProtocolError {
    pub const ALL: [ProtocolError; 4] = [
        ProtocolError::HeadTooLarge,
        ProtocolError::TooManyHeaders,
        ProtocolError::TransferCoding,
        ProtocolError::Http2,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ProtocolError::HeadTooLarge => "head_too_large",
            ProtocolError::TooManyHeaders => "too_many_headers",
            ProtocolError::TransferCoding => "transfer_coding",
            ProtocolError::Http2 => "http2",
        }
    }
}

/// Why an HTTP/1.x connection left tollgate's fast path for hyper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handover {
    /// `Transfer-Encoding` (chunked) framing.
    Chunked,
    /// `Expect: 100-continue`.
    Expect,
    /// `Upgrade` (WebSocket, h2c).
    Upgrade,
    /// A head hyper answers itself: malformed, or past the size or count
    /// limits (its 400 or 431).
    Head,
    /// HTTP/2 with prior knowledge (the preface).
    Http2,
}

impl Handover {
    pub const ALL: [Handover; 5] = [
        Handover::Chunked,
        Handover::Expect,
        Handover::Upgrade,
        Handover::Head,
        Handover::Http2,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Handover::Chunked => "chunked",
            Handover::Expect => "expect",
            Handover::Upgrade => "upgrade",
            Handover::Head => "head",
            Handover::Http2 => "http2",
        }
    }
}

impl ListenerStats {
    pub fn opened(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
    }

    pub fn closed(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Connections open now.
    pub fn open(&self) -> i64 {
        self.open.load(Ordering::Relaxed)
    }

    pub fn tls_failed(&self) {
        self.tls_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A TLS handshake done, full or resumed.
    pub fn tls_handshaked(&self, resumed: bool) {
        self.tls_done[resumed as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A connection that waited because `max_connections` were open.
    pub fn waited_at_cap(&self) {
        self.at_cap.fetch_add(1, Ordering::Relaxed);
    }

    /// The HTTP/1.x fast path handed a connection to hyper.
    pub fn handed_over(&self, why: Handover) {
        self.handovers[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A client broke the protocol (see [`ProtocolError`]).
    pub fn protocol_error(&self, kind: ProtocolError) {
        self.protocol_errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Status codes 100..=599 of one (listener, route).
type Codes = [AtomicU64; CODES];
/// One limit's `[outcome][user type]`.
type Cells = [AtomicU64; OUTCOMES.len() * USER_TYPES.len()];

/// Counters that are not per series of the config.
#[derive(Debug)]
struct Global {
    /// How long zone delays held requests.
    delays: Histogram,
    bypass: [AtomicU64; 4],
    /// Admin requests refused for a missing or wrong token.
    admin_unauthorized: AtomicU64,
    /// Keys reset through the admin API.
    key_resets: AtomicU64,
    /// Requests refused by a zone or a route limit.
    limited: AtomicU64,
    /// Config reloads: ok, error.
    reloads: [AtomicU64; 2],
    /// Samples of the totals over the last 15 minutes (dashboard).
    history: history::History,
}

/// Every counter the request path adds to, in tables indexed by what the
/// config fixed at load. Each series is shared with the table of the
/// config a reload replaced, matched by its labels (listener, route,
/// limit): a reload loses no count, not even of the requests still running
/// on the old config, and a series of a removed route or limit goes away.
#[derive(Debug)]
pub struct Metrics {
    listeners: Box<[Arc<str>]>,
    listener_stats: Box<[Arc<ListenerStats>]>,
    /// Route names, then `-` for requests that matched none.
    routes: Box<[Arc<str>]>,
    /// `[listener * routes + route]`.
    requests: Box<[Arc<Codes>]>,
    /// Per route (and `-`).
    durations: Box<[Arc<Histogram>]>,
    limits: Box<[LimitLabel]>,
    /// Per limit.
    decisions: Box<[Arc<Cells>]>,
    /// Per limit: the keys with the most rejections lately.
    top: Box<[Arc<TopKeys>]>,
    global: Arc<Global>,
    /// What the top offenders' decay is timed by.
    clock: Clock,
}

/// The series of `previous` with the same label, or a new one.
fn series<L: PartialEq, T>(
    label: &L,
    previous: Option<(&[L], &[Arc<T>])>,
    new: impl FnOnce() -> T,
) -> Arc<T> {
    previous
        .and_then(|(labels, values)| {
            labels
                .iter()
                .position(|l| l == label)
                .map(|i| values[i].clone())
        })
        .unwrap_or_else(|| Arc::new(new()))
}

impl Metrics {
    /// The tables for a config, sharing every series `previous` (the
    /// running config's tables) has with the same labels.
    pub fn carried(
        listeners: &[&str],
        routes: &[Arc<str>],
        limits: Vec<LimitLabel>,
        previous: Option<&Metrics>,
        clock: &Clock,
    ) -> Self {
        let mut route_names: Vec<Arc<str>> = routes.to_vec();
        route_names.push(Arc::from("-"));
        let listeners: Vec<Arc<str>> = listeners.iter().map(|&l| Arc::from(l)).collect();
        let listener_stats = listeners
            .iter()
            .map(|l| {
                series(
                    l,
                    previous.map(|p| (&p.listeners[..], &p.listener_stats[..])),
                    ListenerStats::default,
                )
            })
            .collect();
        let pairs = |m: &Metrics| -> Vec<(Arc<str>, Arc<str>)> {
            m.listeners
                .iter()
                .flat_map(|l| m.routes.iter().map(move |r| (l.clone(), r.clone())))
                .collect()
        };
        let old_pairs = previous.map(pairs);
        let mut requests = Vec::new();
        // One row even without listeners (tests build tables without any).
        let rows: Vec<Arc<str>> = if listeners.is_empty() {
            vec![Arc::from("-")]
        } else {
            listeners.clone()
        };
        for l in &rows {
            for r in &route_names {
                requests.push(series(
                    &(l.clone(), r.clone()),
                    previous
                        .zip(old_pairs.as_deref())
                        .map(|(p, pairs)| (pairs, &p.requests[..])),
                    || std::array::from_fn(|_| AtomicU64::new(0)),
                ));
            }
        }
        let durations = route_names
            .iter()
            .map(|r| {
                series(
                    r,
                    previous.map(|p| (&p.routes[..], &p.durations[..])),
                    || Histogram::new(&DURATION_BOUNDS),
                )
            })
            .collect();
        let decisions = limits
            .iter()
            .map(|l| {
                series(
                    l,
                    previous.map(|p| (&p.limits[..], &p.decisions[..])),
                    || std::array::from_fn(|_| AtomicU64::new(0)),
                )
            })
            .collect();
        let top = limits
            .iter()
            .map(|l| {
                series(l, previous.map(|p| (&p.limits[..], &p.top[..])), || {
                    TopKeys::new(clock.now())
                })
            })
            .collect();
        let global = match previous {
            Some(p) => {
                p.global.history.relabel(&p.limits, &limits);
                p.global.clone()
            }
            None => Arc::new(Global {
                delays: Histogram::new(&DELAY_BOUNDS),
                bypass: Default::default(),
                admin_unauthorized: AtomicU64::new(0),
                key_resets: AtomicU64::new(0),
                limited: AtomicU64::new(0),
                reloads: Default::default(),
                // Counted from zero at start: the first minute is whole.
                history: history::History::starting(limits.len()),
            }),
        };
        Metrics {
            listeners: listeners.into(),
            listener_stats,
            requests: requests.into(),
            durations,
            routes: route_names.into(),
            decisions,
            top,
            limits: limits.into(),
            global,
            clock: clock.clone(),
        }
    }

    /// The connection counters of listener `listener` (an index into the
    /// config's listeners).
    pub fn listener_stats(&self, listener: usize) -> Arc<ListenerStats> {
        self.listener_stats
            .get(listener)
            .cloned()
            .unwrap_or_default()
    }

    /// The index of the listener named `name`, if the config has it.
    pub fn listener_index(&self, name: &str) -> Option<usize> {
        self.listeners.iter().position(|l| &**l == name)
    }

    /// A config reload, `ok` or not.
    pub fn reloaded(&self, ok: bool) {
        self.global.reloads[usize::from(!ok)].fetch_add(1, Ordering::Relaxed);
    }

    /// The index of `-`, for requests that matched no route.
    pub fn no_route(&self) -> usize {
        self.routes.len() - 1
    }

    /// A finished request: `route` from [`Metrics::no_route`] when none.
    pub fn request(&self, listener: usize, route: usize, status: u16, took: Duration) {
        let code = (status as usize).clamp(100, 599) - 100;
        if let Some(c) = self.requests.get(listener * self.routes.len() + route) {
            c[code].fetch_add(1, Ordering::Relaxed);
        }
        if let Some(h) = self.durations.get(route) {
            h.observe(took);
        }
    }

    /// One limit's decision for a request; `limit` indexes the labels given
    /// to [`Metrics::carried`].
    pub fn decision(&self, limit: usize, outcome: Outcome, authenticated: bool) {
        let cell = outcome as usize * USER_TYPES.len() + usize::from(authenticated);
        if let Some(c) = self.decisions.get(limit) {
            c[cell].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A rejection (enforced or dry run) of `key` by `limit`, for the top
    /// offenders. Called on the rejection path only.
    pub fn rejected_key(&self, limit: usize, key: &str) {
        if let Some(t) = self.top.get(limit) {
            t.record(top::display(key), self.clock.now());
        }
    }

    /// The top `n` offenders of every limit named `name` (and on `route`,
    /// when given): `(label, offenders)`; empty when no limit matches.
    pub fn top(
        &self,
        name: &str,
        route: Option<&str>,
        n: usize,
    ) -> Vec<(LimitLabel, Vec<Offender>)> {
        self.limits
            .iter()
            .zip(self.top.iter())
            .filter(|(l, _)| &*l.name == name && route.is_none_or(|r| &*l.route == r))
            .map(|(l, t)| (l.clone(), t.top(n)))
            .collect()
    }

    /// A request refused by a zone or a route limit.
    pub fn limited(&self) {
        self.global.limited.fetch_add(1, Ordering::Relaxed);
    }

    /// The zones and route limits, in the order of their indices.
    pub fn limits(&self) -> &[LimitLabel] {
        &self.limits
    }

    /// The running totals now, for [`history`]; `upstream_errors` is read
    /// from the upstreams by the caller.
    pub fn sample(&self, at_ms: u64, upstream_errors: u64) -> history::Sample {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        history::Sample {
            at_ms,
            requests: self.requests.iter().flat_map(|c| c.iter()).map(load).sum(),
            limited: load(&self.global.limited),
            upstream_errors,
            decisions: self
                .decisions
                .iter()
                .map(|cells| {
                    std::array::from_fn(|o| {
                        cells[o * USER_TYPES.len()..(o + 1) * USER_TYPES.len()]
                            .iter()
                            .map(load)
                            .sum()
                    })
                })
                .collect(),
        }
    }

    /// The samples of the last 15 minutes.
    pub fn history(&self) -> &history::History {
        &self.global.history
    }

    /// The top `n` offenders of limit `limit` (an index into `limits`).
    pub fn top_of(&self, limit: usize, n: usize) -> Vec<Offender> {
        self.top.get(limit).map(|t| t.top(n)).unwrap_or_default()
    }

    pub fn delay(&self, d: Duration) {
        self.global.delays.observe(d);
    }

    /// A bypassed request; `reason` indexes [`BYPASS_REASONS`].
    pub fn bypass(&self, reason: usize) {
        if let Some(c) = self.global.bypass.get(reason) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn admin_unauthorized(&self) {
        self.global
            .admin_unauthorized
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A key reset through `DELETE /api/keys/...`.
    pub fn key_reset(&self) {
        self.global.key_resets.fetch_add(1, Ordering::Relaxed);
    }

    /// Every listener's connection figures, in config order.
    pub fn listeners_report(&self) -> Vec<ListenerReport> {
        let read = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.listeners
            .iter()
            .zip(self.listener_stats.iter())
            .map(|(name, n)| ListenerReport {
                name: name.clone(),
                open: n.open(),
                waited_at_cap: read(&n.at_cap),
                tls: [
                    read(&n.tls_done[0]),
                    read(&n.tls_done[1]),
                    read(&n.tls_failures),
                ],
                handovers: n.handovers.each_ref().map(read),
                protocol_errors: n.protocol_errors.each_ref().map(read),
            })
            .collect()
    }

    /// The series of a per-listener counter split by `label`: one per
    /// listener and kind, `count` reading a listener's count of kind `i`.
    fn by_listener_and(
        &self,
        label: &'static str,
        kinds: &[&'static str],
        count: impl Fn(&ListenerStats, usize) -> u64,
    ) -> Vec<(Vec<(&'static str, String)>, u64)> {
        let mut series = Vec::new();
        for (l, n) in self.listeners.iter().zip(self.listener_stats.iter()) {
            for (i, kind) in kinds.iter().enumerate() {
                let labels = vec![("listener", l.to_string()), (label, (*kind).to_owned())];
                series.push((labels, count(n, i)));
            }
        }
        series
    }

    /// The exposition: OpenMetrics when `openmetrics`, else the Prometheus
    /// text format.
    pub fn encode(self: &Arc<Self>, sources: Arc<dyn Sources>, openmetrics: bool) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Scrape {
            metrics: self.clone(),
            sources,
        }));
        let mut out = String::new();
        let encoded = if openmetrics {
            prometheus_client::encoding::text::encode(&mut out, &registry)
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
        };
        if encoded.is_err() {
            tracing::warn!("metrics: encoding failed");
        }
        out
    }
}

/// One scrape: the counters and the sources, encoded.
struct Scrape {
    metrics: Arc<Metrics>,
    sources: Arc<dyn Sources>,
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
        let m = &self.metrics;
        let s = &self.sources;
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
            &mut e,
            "tollgate_requests",
            "Requests answered, by listener, route and status code.",
            requests,
        )?;
        histograms(
            &mut e,
            "tollgate_request_duration_seconds",
            "Time from the request head to the end of the response, by route.",
            m.routes
                .iter()
                .zip(m.durations.iter())
                .map(|(r, h)| (vec![("route", r.to_string())], h.snapshot())),
        )?;
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
        counter(&mut e, "tollgate_limit_decisions", "What the zones and route limits decided, by limit, outcome and whether the user was verified.", decisions)?;
        histograms(
            &mut e,
            "tollgate_limit_delay_seconds",
            "How long zone delays (nginx burst without nodelay) held requests.",
            [(Vec::new(), m.global.delays.snapshot())],
        )?;
        counter(
            &mut e,
            "tollgate_bypass",
            "Requests that skipped every limit, by reason.",
            BYPASS_REASONS
                .iter()
                .zip(&m.global.bypass)
                .map(|(r, c)| (vec![("reason", (*r).to_owned())], c.load(Ordering::Relaxed))),
        )?;
        counter(
            &mut e,
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
            &mut e,
            "tollgate_store_fallback",
            "Requests decided by a failure mode (on_error) because Redis failed.",
            s.store_fallbacks()
                .into_iter()
                .map(|(mode, n)| (vec![("mode", mode.to_owned())], n)),
        )?;
        if let Some(n) = s.script_calls() {
            counter(
                &mut e,
                "tollgate_store_script_calls",
                "Redis script calls (EVALSHA); one may decide a batch of requests.",
                [(Vec::new(), n)],
            )?;
        }
        if let Some(h) = s.store_durations() {
            histograms(
                &mut e,
                "tollgate_store_call_duration_seconds",
                "Time the Redis store took to decide a request.",
                [(vec![("store", "redis".to_owned())], h)],
            )?;
        }
        if let Some(open) = s.breaker_open() {
            gauge(
                &mut e,
                "tollgate_store_breaker_open",
                "1 while the Redis circuit breaker is open.",
                [(Vec::new(), i64::from(open))],
            )?;
        }
        let stats = s.zone_stats();
        gauge(
            &mut e,
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
            &mut e,
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
        gauge(
            &mut e,
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
        let upstreams = s.upstreams();
        const RESULTS: [&str; 3] = ["ok", "error", "timeout"];
        counter(
            &mut e,
            "tollgate_upstream_requests",
            "Requests sent upstream, by upstream, target and result (ok: a response head came back).",
            upstreams.iter().flat_map(|u| {
                u.targets.iter().flat_map(move |(t, n)| {
                    RESULTS.iter().enumerate().map(move |(i, r)| {
                        (vec![("upstream", u.name.to_string()), ("target", t.to_string()), ("result", (*r).to_owned())], n[i])
                    })
                })
            }),
        )?;
        // Per target: the counter at `i` of each target's five.
        let per_target = |i: usize| {
            upstreams.iter().flat_map(move |u| {
                u.targets.iter().map(move |(t, n)| {
                    let labels = vec![("upstream", u.name.to_string()), ("target", t.to_string())];
                    (labels, n[i])
                })
            })
        };
        counter(
            &mut e,
            "tollgate_upstream_retries",
            "Requests sent again on a fresh connection after a pooled one closed under them.",
            per_target(3),
        )?;
        counter(
            &mut e,
            "tollgate_upstream_cooldowns",
            "Times a target was put in cool-down after a failed connect.",
            per_target(4),
        )?;
        histograms(
            &mut e,
            "tollgate_upstream_duration_seconds",
            "Time from sending a request upstream to its response head.",
            upstreams
                .into_iter()
                .map(|u| (vec![("upstream", u.name.to_string())], u.duration)),
        )?;
        counter(
            &mut e,
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
            &mut e,
            "tollgate_tls_handshakes",
            "TLS handshakes done, by listener and kind (full, or resumed from a session ticket or the session cache).",
            m.by_listener_and("kind", &["full", "resumed"], |n, i| {
                n.tls_done[i].load(Ordering::Relaxed)
            }),
        )?;
        counter(
            &mut e,
            "tollgate_http1_handovers",
            "HTTP/1.x connections tollgate's fast path handed to hyper for the rest of their life, by listener and why (chunked, expect, upgrade, head, http2).",
            m.by_listener_and("reason", &Handover::ALL.map(Handover::label), |n, i| {
                n.handovers[i].load(Ordering::Relaxed)
            }),
        )?;
        counter(
            &mut e,
            "tollgate_http_protocol_errors",
            "Requests refused and connections ended because the client broke the HTTP rules, by listener and kind (head_too_large, too_many_headers, transfer_coding, http2).",
            m.by_listener_and(
                "kind",
                &ProtocolError::ALL.map(ProtocolError::label),
                |n, i| n.protocol_errors[i].load(Ordering::Relaxed),
            ),
        )?;
        counter(
            &mut e,
            "tollgate_http2_peer_noise",
            "Protocol warnings HTTP/2 peers caused (a PING ACK nobody asked for, a frame on a closed stream): counted here, not logged per frame.",
            [(Vec::new(), H2_NOISE.load(Ordering::Relaxed))],
        )?;
        counter(
            &mut e,
            "tollgate_connections_at_cap",
            "Connections accepted only after waiting because max_connections were open, by listener.",
            m.listeners.iter().zip(m.listener_stats.iter()).map(|(l, n)| (vec![("listener", l.to_string())], n.at_cap.load(Ordering::Relaxed))),
        )?;
        counter(
            &mut e,
            "tollgate_alerts",
            "Times each alert rule fired.",
            s.alerts()
                .into_iter()
                .map(|(rule, n)| (vec![("rule", rule.to_string())], n)),
        )?;
        counter(
            &mut e,
            "tollgate_alert_deliveries",
            "Alert webhook deliveries, by result (dropped: the queue was full).",
            s.alert_deliveries()
                .into_iter()
                .map(|(r, n)| (vec![("result", r.to_owned())], n)),
        )?;
        counter(
            &mut e,
            "tollgate_admin_unauthorized",
            "Admin requests refused for a missing or wrong token.",
            [(
                Vec::new(),
                m.global.admin_unauthorized.load(Ordering::Relaxed),
            )],
        )?;
        counter(
            &mut e,
            "tollgate_admin_key_resets",
            "Rate-limit keys reset through the admin API.",
            [(Vec::new(), m.global.key_resets.load(Ordering::Relaxed))],
        )?;
        counter(
            &mut e,
            "tollgate_config_reloads",
            "Config reloads, by result (error: the file was refused and the running config kept).",
            ["ok", "error"]
                .into_iter()
                .zip(&m.global.reloads)
                .map(|(r, n)| (vec![("result", r.to_owned())], n.load(Ordering::Relaxed))),
        )?;
        gauge(
            &mut e,
            "tollgate_build_info",
            "The running version (always 1).",
            [(vec![("version", env!("CARGO_PKG_VERSION").to_owned())], 1)],
        )?;
        Ok(())
    }
}
