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

mod encode;
mod histogram;
pub(crate) mod history;
mod listener;
pub(crate) mod top;
mod upstream;

pub use histogram::{Histogram, HistogramSnapshot, CALL_BOUNDS};
pub use listener::{h2_noise_seen, H2Side, Handover, ListenerReport, ListenerStats, ProtocolError};
pub use upstream::{Failure, ProtectReport, ShedReason, TargetReport, UpstreamReport};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use self::top::{Offender, TopKeys};
use crate::clock::Clock;

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

/// A zone or a route limit, as metrics name it.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitLabel {
    /// `zone` or `route`.
    pub tier: &'static str,
    pub name: Arc<str>,
    /// The route a route limit belongs to (`-` for zones).
    pub route: Arc<str>,
}

/// Read at scrape time from the parts that own them.
pub trait Sources: Send + Sync {
    /// Redis script calls (one per batch of requests), `None` without Redis.
    fn script_calls(&self) -> Option<u64>;
    /// Lease units `[taken, returned, spent]` (Redis only).
    fn lease_units(&self) -> Option<[u64; 3]>;
    /// Shared `max_conn` slots held now, and slots lost before renewal
    /// (Redis only).
    fn conn_leases(&self) -> Option<(usize, u64)>;
    /// Latency of the store's decisions (Redis only).
    fn store_durations(&self) -> Option<HistogramSnapshot>;
    fn upstreams(&self) -> Vec<UpstreamReport>;
    /// `(store, result, calls)`: `store` is memory or redis, `result` ok,
    /// error or timeout.
    fn store_calls(&self) -> Vec<(&'static str, &'static str, u64)>;
    /// `(mode, requests)` decided by a failure mode while Redis failed.
    fn store_fallbacks(&self) -> Vec<(&'static str, u64)>;
    /// Settlements of reserved costs that could not reach Redis.
    fn store_unsettled(&self) -> u64;
    /// Whether the Redis breaker is open (`None` without Redis).
    fn breaker_open(&self) -> Option<bool>;
    /// `(keys tracked, evictions)` per limit, in `limits` order.
    fn zone_stats(&self) -> Vec<(u64, u64)>;
    /// `(rule, times fired)`.
    fn alerts(&self) -> Vec<(Arc<str>, u64)>;
    /// `(result, webhook deliveries)`: ok, failed, dropped.
    fn alert_deliveries(&self) -> Vec<(&'static str, u64)>;
    /// `(result, spans)` of the trace exporter: exported, queue_full,
    /// export_failed (empty without `traces`).
    fn trace_spans(&self) -> Vec<(&'static str, u64)>;
    /// Per limit with a penalty box: bans started by this process, requests
    /// refused by a ban, bans in force.
    fn penalties(&self) -> Vec<(Arc<str>, [u64; 3])>;
}

/// Status codes 100..=599 of one (listener, route).
type Codes = [AtomicU64; CODES];
/// gRPC's 17 status codes, then one for any other value.
const GRPC_CODES: usize = 18;
type GrpcCodes = [AtomicU64; GRPC_CODES];
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
    /// Cost units of settled limits: per (limit, route, plan), reserved,
    /// settled, refunded and extra. Touched only when a cost is settled.
    costs: std::sync::Mutex<CostTable>,
}

/// Per (limit, route, plan): units reserved, settled, refunded, extra.
pub type CostTable = std::collections::BTreeMap<(Arc<str>, Arc<str>, Arc<str>), [u64; 4]>;

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
    /// Per route (and `-`): gRPC calls by `grpc-status` (0 to 16, then
    /// any other value).
    grpc: Box<[Arc<GrpcCodes>]>,
    limits: Box<[LimitLabel]>,
    /// Per limit.
    decisions: Box<[Arc<Cells>]>,
    /// Per limit: the keys with the most rejections lately.
    top: Box<[Arc<TopKeys>]>,
    /// The config's plan names, and per plan the requests decided on it.
    plans: Box<[Arc<str>]>,
    plan_requests: Box<[Arc<AtomicU64>]>,
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
        let grpc = route_names
            .iter()
            .map(|r| {
                series(r, previous.map(|p| (&p.routes[..], &p.grpc[..])), || {
                    std::array::from_fn(|_| AtomicU64::new(0))
                })
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
                costs: Default::default(),
            }),
        };
        Metrics {
            listeners: listeners.into(),
            listener_stats,
            requests: requests.into(),
            durations,
            grpc,
            routes: route_names.into(),
            decisions,
            top,
            limits: limits.into(),
            global,
            clock: clock.clone(),
            plans: Box::new([]),
            plan_requests: Box::new([]),
        }
    }

    /// The config's plan names (`identity.plans.names`), their counts
    /// carried from `previous` by name.
    pub fn with_plans(mut self, names: &[Arc<str>], previous: Option<&Metrics>) -> Self {
        self.plan_requests = names
            .iter()
            .map(|n| {
                series(
                    n,
                    previous.map(|p| (&p.plans[..], &p.plan_requests[..])),
                    || AtomicU64::new(0),
                )
            })
            .collect();
        self.plans = names.into();
        self
    }

    /// A request decided on plan `plan`.
    pub fn plan_request(&self, plan: u8) {
        if let Some(n) = self.plan_requests.get(usize::from(plan)) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `(plan, requests)`, in config order.
    pub fn plan_counts(&self) -> Vec<(Arc<str>, u64)> {
        self.plans
            .iter()
            .zip(self.plan_requests.iter())
            .map(|(p, n)| (p.clone(), n.load(Ordering::Relaxed)))
            .collect()
    }

    /// The name of plan `plan` (`-`: none).
    pub fn plan_name(&self, plan: Option<u8>) -> Arc<str> {
        plan.and_then(|p| self.plans.get(usize::from(p)))
            .cloned()
            .unwrap_or_else(|| Arc::from("-"))
    }

    /// A settled cost: `reserved` units at admission, `settled` in the end.
    pub fn cost_units(&self, limit: usize, plan: Option<u8>, settled: u64, reserved: u64) {
        let Some(l) = self.limits.get(limit) else {
            return;
        };
        let mut t = self.global.costs.lock().unwrap_or_else(|e| e.into_inner());
        let row = t
            .entry((l.name.clone(), l.route.clone(), self.plan_name(plan)))
            .or_default();
        row[0] += reserved;
        row[1] += settled;
        row[2] += reserved.saturating_sub(settled);
        row[3] += settled.saturating_sub(reserved);
    }

    /// The cost units table (see [`CostTable`]).
    pub fn costs(&self) -> CostTable {
        self.global
            .costs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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

    /// A gRPC call on `route` ended with `grpc-status` `status`.
    pub fn grpc_call(&self, route: usize, status: u16) {
        if let Some(c) = self.grpc.get(route) {
            c[usize::from(status).min(GRPC_CODES - 1)].fetch_add(1, Ordering::Relaxed);
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

    /// Per listener, side and HTTP/2 error code, the counts of `which`
    /// (resets or GOAWAYs) that are not zero.
    fn by_listener_side_code(
        &self,
        which: impl Fn(&ListenerStats) -> &[[AtomicU64; listener::H2_CODES.len() + 1]; 2],
    ) -> Vec<(Vec<(&'static str, String)>, u64)> {
        let mut series = Vec::new();
        for (l, n) in self.listeners.iter().zip(self.listener_stats.iter()) {
            for side in listener::H2Side::ALL {
                for (slot, count) in which(n)[side as usize].iter().enumerate() {
                    let count = count.load(Ordering::Relaxed);
                    if count > 0 {
                        let labels = vec![
                            ("listener", l.to_string()),
                            ("side", side.label().to_owned()),
                            ("code", listener::h2_code_label(slot).to_owned()),
                        ];
                        series.push((labels, count));
                    }
                }
            }
        }
        series
    }

    /// The exposition: OpenMetrics when `openmetrics`, else the Prometheus
    /// text format.
    pub fn encode(self: &Arc<Self>, sources: Arc<dyn Sources>, openmetrics: bool) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(encode::Scrape {
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
