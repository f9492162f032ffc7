//! The upstream stage: picks a target (`balancer`: nginx's round robin,
//! `least_conn`, `random`, `hash`, `ip_hash`; backups only when no primary
//! can take it; never a target marked `down`, marked down by its failures
//! (`health`), drained by the admin API or at its `max_conns`), sends the
//! request to it (`attempt`: HTTP/1.1 on a pooled keep-alive connection or
//! a new one, or HTTP/2) and passes it on to the next target by nginx's
//! `proxy_next_upstream` rules (`retry`), never sending twice what may not
//! be.
//!
//! When every target is marked down, the request is answered 502 naming
//! the upstream and the targets are given their chance again, so the next
//! request tries them (Envoy's panic mode; nginx answers "no live
//! upstreams" until `fail_timeout` passes).
//!
//! HTTP/1.1 itself is spoken by `h1`, in the request's own task.

mod attempt;
mod balancer;
mod budget;
mod checks;
pub(crate) mod h1;
pub(crate) mod h2;
mod h2_attempt;
pub(crate) mod hash_key;
mod health;
mod held;
mod io;
pub(crate) mod pool;
mod report;
mod resolver;
mod retry;
mod target;

pub use self::attempt::Chosen;
pub use self::balancer::BalanceKey;
pub use self::retry::Failure;
pub use self::target::InFlight;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Method, Request, Response};
use hyper::body::Incoming;
use tokio_rustls::TlsConnector;

use self::attempt::{Send, Tried};
use self::balancer::Pick;
use self::h1::Conn;
use self::resolver::Resolving;
use self::retry::Retries;
use self::target::{TargetSet, TargetState, ALPN_H1};
use super::body::{HeadLines, RequestBody};
use super::conn::ConnState;
use crate::clock::Clock;
use crate::config::{HashKey, HostHeader, NextUpstream, UpstreamConfig, UpstreamProtocol};
use crate::error::ProxyError;
use crate::metrics::{Histogram, CALL_BOUNDS};

/// What an upstream answered.
pub enum Answer {
    /// A response whose body is read as the client takes it (or already
    /// complete), and the fields to pass on ([`HeadLines`]).
    Response(Response<h1::ResponseBody>, HeadLines),
    /// `101 Switching Protocols`: the connection now belongs to the tunnel.
    Upgrade(Response<()>, Conn),
    /// An HTTP/2 response: its fields in the map, its body (trailers
    /// included) streamed from the connection's stream, which `Stream`
    /// holds open in the pool's count until the body is dropped.
    H2(Response<Incoming>, h2::Stream),
}

impl Answer {
    fn status(&self) -> u16 {
        match self {
            Answer::Response(r, _) => r.status().as_u16(),
            Answer::Upgrade(r, _) => r.status().as_u16(),
            Answer::H2(r, _) => r.status().as_u16(),
        }
    }
}

/// A named pool of targets, built once from config.
pub struct Upstream {
    pub name: Arc<str>,
    /// The targets and the balancer over them.
    set: Set,
    /// The balancer picks by a key read from the request.
    keyed: bool,
    /// What a keyed method (`hash`) hashes.
    hash_key: Option<HashKey>,
    next: NextUpstream,
    /// Retries allowed only within it (`next_upstream.budget`).
    budget: Option<self::budget::Budget>,
    /// Targets are checked (`health_check`); whether every one failed its
    /// checks when last looked, and the requests sent to them all then.
    checks: bool,
    /// Some target has a `slow_start`.
    slow_start: bool,
    /// `balance: ewma`: latencies are observed.
    ewma: bool,
    /// Its concurrency limit and queue (`protect`), if configured.
    pub gate: Option<Arc<crate::pipeline::protect::Gate>>,
    all_failing: std::sync::atomic::AtomicBool,
    sent_all_failing: std::sync::atomic::AtomicU64,
    /// `balance` as written, for the admin API.
    balance_name: String,
    connect_timeout: Duration,
    /// Time for the response head; also the body's idle timeout.
    pub timeout: Duration,
    pub host_header: HostHeader,
    protocol: UpstreamProtocol,
    tls: Option<(TlsConnector, Option<rustls_pki_types::ServerName<'static>>)>,
    /// Origin for the cool-down clock kept in atomics.
    clock: Clock,
    epoch: Instant,
    /// Time to the response head, for metrics.
    duration: Histogram,
    /// The config it was built from, for a reload to tell whether it
    /// changed (`None` with TLS: its roots cannot be compared, so a reload
    /// always builds it anew).
    config: Option<String>,
}

/// An upstream's targets: as configured, or as its names resolve now.
enum Set {
    Fixed(TargetSet),
    Resolved(Resolving),
}

/// The targets one request works with: borrowed, or held while names
/// resolve (a new set may replace it meanwhile).
enum Now<'a> {
    Fixed(&'a TargetSet),
    Held(Arc<TargetSet>),
}

impl std::ops::Deref for Now<'_> {
    type Target = TargetSet;
    fn deref(&self) -> &TargetSet {
        match self {
            Now::Fixed(s) => s,
            Now::Held(s) => s,
        }
    }
}

impl Upstream {
    /// Cool-downs and idle connections' ages are timed on `clock`.
    pub fn new(cfg: &UpstreamConfig, clock: Clock) -> Self {
        // Names are resolved by a task, so only where one can run (not,
        // say, in `tollgate check`).
        let resolves =
            cfg.targets.iter().any(|t| t.resolve) && tokio::runtime::Handle::try_current().is_ok();
        let set = if resolves {
            Set::Resolved(Resolving::start(cfg))
        } else {
            let fixed = cfg.targets.iter().filter(|t| !t.resolve).cloned().collect();
            Set::Fixed(TargetSet::new(cfg, fixed, &[]))
        };
        Upstream {
            name: Arc::from(cfg.name.as_str()),
            set,
            keyed: matches!(
                cfg.balance,
                crate::config::Balance::Hash { .. } | crate::config::Balance::IpHash
            ),
            hash_key: match &cfg.balance {
                crate::config::Balance::Hash { key, .. } => Some(key.clone()),
                _ => None,
            },
            next: cfg.next_upstream.clone(),
            budget: cfg
                .next_upstream
                .budget
                .as_ref()
                .map(self::budget::Budget::new),
            checks: cfg.health_check.is_some(),
            slow_start: cfg.targets.iter().any(|t| t.slow_start.is_some()),
            ewma: cfg.balance == crate::config::Balance::Ewma,
            gate: (cfg.concurrency.is_some() || cfg.queue.is_some()).then(|| {
                crate::pipeline::protect::Gate::new(cfg.concurrency.as_ref(), cfg.queue.as_ref())
            }),
            all_failing: Default::default(),
            sent_all_failing: Default::default(),
            balance_name: cfg.balance.to_string(),
            connect_timeout: cfg.connect_timeout,
            timeout: cfg.timeout,
            host_header: cfg.host_header.clone(),
            protocol: cfg.protocol,
            tls: cfg
                .tls
                .as_ref()
                .map(|t| (TlsConnector::from(t.config.clone()), t.server_name.clone())),
            epoch: clock.now(),
            clock,
            duration: Histogram::new(&CALL_BOUNDS),
            config: cfg.tls.is_none().then(|| format!("{cfg:?}")),
        }
    }

    /// Whether `cfg` would build this very upstream (name and settings).
    pub fn same_config(&self, cfg: &UpstreamConfig) -> bool {
        cfg.tls.is_none() && self.config.as_deref() == Some(format!("{cfg:?}").as_str())
    }

    /// The targets now.
    fn now(&self) -> Now<'_> {
        match &self.set {
            Set::Fixed(s) => Now::Fixed(s),
            Set::Resolved(r) => Now::Held(r.current.load_full()),
        }
    }

    fn ms_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// What the balancer picks this request's target by: `None` unless
    /// the method is keyed (`hash`, `ip_hash`), so the others build
    /// nothing. `part` renders one part of the key.
    pub fn balance_key(
        &self,
        client: std::net::IpAddr,
        part: impl Fn(&crate::config::KeyPart, &mut Vec<u8>),
    ) -> BalanceKey {
        if !self.keyed {
            return BalanceKey::None;
        }
        match &self.hash_key {
            None => BalanceKey::Ip(client),
            Some(key) => {
                let mut out = Vec::new();
                for p in &key.0 {
                    part(p, &mut out);
                }
                BalanceKey::Bytes(out)
            }
        }
    }

    /// Sends the request `head` with `body` and waits for the response
    /// head; the answer comes with its place in the target's requests in
    /// flight, to hold until the answer has been relayed. With `held` (an
    /// HTTP/2 client's connection), each attempt holds one of its upstream
    /// slots until the upstream answers, even if the client stops waiting
    /// (`held`). `chosen` records the target used, for the access log,
    /// even when sending fails. A request without `Host` (`host_set`
    /// false: the caller knows, no lookup) gets the `host:port` of the
    /// target it is sent to, on every attempt (`host_header: target`). The
    /// head is borrowed: a request passes through several async frames,
    /// and a move into each would copy it (about 200 bytes) into memory
    /// the request has not touched yet.
    #[allow(clippy::too_many_arguments)]
    pub async fn send(
        &self,
        head: &mut Request<()>,
        body: RequestBody,
        host_set: bool,
        (added, call): (&[(HeaderName, HeaderValue)], Call),
        chosen: &mut Chosen,
        held: Option<&Arc<ConnState>>,
        key: BalanceKey,
    ) -> Result<(Answer, InFlight), ProxyError> {
        if let Set::Resolved(r) = &self.set {
            // Until every name has been asked once (the first moments
            // after start), a request waits for the answers.
            if !*r.first.borrow() {
                let mut first = r.first.clone();
                let asked = first.wait_for(|done| *done);
                let _ = tokio::time::timeout(self.connect_timeout, asked).await;
            }
        }
        let set = self.now();
        let n = set.targets.len();
        let bodiless = http_body::Body::is_end_stream(&body);
        let length = http_body::Body::size_hint(&body).exact();
        // A small body is read whole first where a retry could send it
        // again (nginx reads every body first by default).
        let (kept, mut body) =
            if !bodiless && Retries::keeps_body(&self.next, head.method(), length, n) {
                (Some(read_whole(body).await?), None)
            } else {
                (None, (!bodiless).then_some(body))
            };
        // The one clock read of the attempt: cool-downs, the pool's idle
        // ages, the retries' time and the duration all measure from it.
        let sending = self.clock.now();
        let mut retries = Retries::new(
            &self.next,
            head.method(),
            bodiless || kept.is_some(),
            n,
            sending,
        );
        let ignore_checks = self.checks && self.all_failing_checks(&set);
        let mut pick = Pick::new(key);
        // Targets already tried (the first 64 are tracked; past them the
        // attempts are bounded by the number of targets).
        let mut tried: u64 = 0;
        let mut last_error = None;
        let mut waited = None;
        loop {
            let usable = |i: usize| {
                let t = &set.targets[i];
                let skipped = (i < 64 && tried & (1 << i) != 0)
                    || t.draining.load(Ordering::Relaxed)
                    || (t.check_failed.load(Ordering::Relaxed) && !ignore_checks)
                    || t.full();
                !skipped && !t.health.down(|| self.ms_at(sending))
            };
            // Weights shrink for targets in their slow start (only
            // upstreams with one read the time).
            let now_ms = if self.slow_start {
                self.clock.unix_ms()
            } else {
                0
            };
            let scale = |i: usize| set.targets[i].ramp(now_ms);
            let load = |i: usize| match self.ewma {
                true => set.targets[i].score(self.ms_at(sending)),
                false => set.targets[i].load(),
            };
            let Some(idx) = set.balancer.pick_scaled(&mut pick, usable, load, &scale) else {
                // Every target at its max_conns: wait in the queue for one.
                match self.gate.as_ref().filter(|g| g.has_queue() && tried == 0) {
                    Some(g) if set.targets.iter().any(|t| t.full()) => {
                        let until = *waited.get_or_insert_with(|| g.wait_until(call.deadline()));
                        let full = || (0..n).all(|i| !usable(i));
                        g.wait_slot(call.class.0, call.class.1, until, full)
                            .await
                            .map_err(|shed| self.shed(shed))?;
                        continue;
                    }
                    _ => break,
                }
            };
            let target = &*set.targets[idx];
            target.health.picked(|| self.ms_at(sending));
            tried |= 1u64.checked_shl(idx as u32).unwrap_or(0);
            if retries.tried == 0 {
                if let Some(b) = &self.budget {
                    b.deposit(self.ms_at(sending) / 1000);
                }
            }
            retries.tried += 1;
            chosen.target = Some(target.authority.clone());
            let attempt_ns = chosen.attempts.is_some().then(crate::clock::unix_ns);
            let wakes = self
                .gate
                .as_ref()
                .filter(|g| g.has_queue() && target.max_conns != 0);
            let in_flight = target.start(wakes);
            if let Some(kept) = &kept {
                body = Some(RequestBody::buffered(kept.clone()));
            }
            let to = Send {
                target,
                host_set,
                added,
                call,
                sending,
                held,
                replayable: bodiless || kept.is_some(),
                kept: kept.as_ref(),
                length,
                chunked: !bodiless && length.is_none(),
            };
            // `answered`: an answer's status sent it on, its latency and budget
            // already seen to.
            let tried = self.attempt(to, head, &mut body).await;
            chosen.attempted(attempt_ns, &target.authority, &tried);
            let (failure, sent, error, answered) = match tried {
                Tried::Answer(answer) => {
                    let now = self.clock.now();
                    let status = answer.status();
                    if self.ewma {
                        let failed = status >= 500 || status == 429;
                        target.observe(now - sending, failed, self.ms_at(now));
                    }
                    // A listed status goes on, within the retry budget;
                    // past it, the answer is passed on as it came.
                    let next = retries.on_status(status, now).filter(|_| {
                        self.budget
                            .as_ref()
                            .is_none_or(|b| b.withdraw(self.ms_at(now) / 1000))
                    });
                    match next {
                        None => {
                            target.stats.ok.fetch_add(1, Ordering::Relaxed);
                            if target.health.succeeded() {
                                target.came_back(self.clock.unix_ms());
                            }
                            self.duration.observe(now - sending);
                            if let Some(g) = &self.gate {
                                g.sample(now - sending);
                            }
                            return Ok((answer, in_flight));
                        }
                        // A listed status: dropped, and on to the next.
                        Some(failure) => (
                            failure,
                            true,
                            ProxyError::UpstreamUnreachable {
                                upstream: self.name.to_string(),
                                reason: format!(
                                    "{} answered {status}, and no other target could take the request",
                                    target.authority
                                ),
                            },
                            true,
                        ),
                    }
                }
                Tried::Client(e) => return Err(e),
                Tried::Failed {
                    failure,
                    sent,
                    error,
                } => (failure, sent, error, false),
            };
            let now = self.clock.now();
            if self.ewma && !answered {
                target.observe(now - sending, true, self.ms_at(now));
            }
            // A timeout is the slowest answer there is.
            if let (Some(g), Failure::Timeout) = (&self.gate, failure) {
                g.sample(now - sending);
            }
            self.failed(target, failure, now, n == 1);
            if !retries.go_on(failure, sent, now) {
                return Err(error);
            }
            if let (Some(b), false) = (&self.budget, answered) {
                if !b.withdraw(self.ms_at(now) / 1000) {
                    tracing::debug!(upstream = %self.name, target = %target.authority, reason = failure.name(), "retry budget spent: not passing the request on");
                    return Err(error);
                }
            }
            target.stats.retries[failure as usize].fetch_add(1, Ordering::Relaxed);
            chosen.retried(failure.name());
            tracing::debug!(upstream = %self.name, target = %target.authority, reason = failure.name(), "passing the request on to the next target");
            last_error = Some(error);
        }
        Err(last_error.unwrap_or_else(|| self.none_live(&set, sending)))
    }

    /// Whether every target fails its health checks, in which case they
    /// all take requests anyway (logged when it starts and ends, and the
    /// requests counted).
    fn all_failing_checks(&self, set: &TargetSet) -> bool {
        let all = !set.targets.is_empty()
            && set
                .targets
                .iter()
                .all(|t| t.check_failed.load(Ordering::Relaxed));
        if self.all_failing.swap(all, Ordering::Relaxed) != all {
            if all {
                tracing::error!(upstream = %self.name, "every target fails its health checks; sending requests to all of them anyway");
            } else {
                tracing::warn!(upstream = %self.name, "a target passes its health checks again; failing ones take no requests");
            }
        }
        if all {
            self.sent_all_failing.fetch_add(1, Ordering::Relaxed);
        }
        all
    }

    /// No target could take the request: why, for the 502. When every
    /// target left out is marked down by its failures, they are all given
    /// their chance again for the next request (Envoy's panic mode).
    fn none_live(&self, set: &TargetSet, at: Instant) -> ProxyError {
        let now = self.ms_at(at);
        let up = |t: &TargetState| !t.down && !t.draining.load(Ordering::Relaxed);
        let marked: Vec<&Arc<TargetState>> = set
            .targets
            .iter()
            .filter(|t| up(t) && t.health.down(|| now))
            .collect();
        let reason = if !marked.is_empty() {
            for t in &marked {
                t.health.revive();
            }
            tracing::warn!(upstream = %self.name, "every live target is marked down by its failures; answering 502 and trying them all again from the next request");
            "every target is marked down after failures; the next request tries them again"
        } else if set.targets.iter().any(|t| up(t) && t.full()) {
            "every target is at its max_conns"
        } else if set.targets.is_empty() {
            "no target: its names have not resolved"
        } else {
            "every target is down or drained"
        };
        ProxyError::UpstreamUnreachable {
            upstream: self.name.to_string(),
            reason: reason.to_owned(),
        }
    }

    /// A request shed while every target was at its `max_conns`: its
    /// class is named by the protect stage, which knows the classes
    /// (`protect::named`).
    fn shed(&self, shed: crate::pipeline::protect::Shed) -> ProxyError {
        ProxyError::Shed {
            upstream: self.name.to_string(),
            class: Arc::from(""),
            reason: shed.reason,
            retry_after: 1,
        }
    }

    /// A failure of `target` at `now`: counted, and towards its
    /// `max_fails` unless nginx does not count it (403, 404).
    /// `alone`: the upstream has no other target.
    fn failed(&self, target: &TargetState, failure: Failure, now: Instant, alone: bool) {
        target.note_failure(failure, self.clock.unix_ms());
        if failure.marks() && target.health.failed(self.ms_at(now), alone) {
            target.stats.marked_down.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(upstream = %self.name, target = %target.authority, reason = failure.name(), "target failed; marked down for its fail_timeout");
        }
    }

    /// Whether any request to this upstream may go over HTTP/2
    /// (`protocol: h2`, or `auto`).
    pub fn may_speak_h2(&self) -> bool {
        self.protocol != UpstreamProtocol::Http1
    }

    /// Whether requests to `target` go over HTTP/2 (for `auto`, until the
    /// target picks HTTP/1.1 in a TLS handshake).
    fn speaks_h2(&self, target: &TargetState) -> bool {
        match self.protocol {
            UpstreamProtocol::Http1 => false,
            UpstreamProtocol::H2 => true,
            UpstreamProtocol::Auto => {
                self.tls.is_some() && target.alpn.load(Ordering::Relaxed) != ALPN_H1
            }
        }
    }

    /// HTTP/2 connections and open streams to this upstream, for metrics.
    fn h2_counts(&self) -> (usize, usize) {
        self.now()
            .targets
            .iter()
            .filter_map(|t| t.h2.as_ref().map(h2::H2Pool::counts))
            .fold((0, 0), |(c, s), (tc, ts)| (c + tc, s + ts))
    }
}

/// A body read whole (it has a length within `max_body`), to be sent
/// again if a retry needs it.
async fn read_whole(body: RequestBody) -> Result<Bytes, ProxyError> {
    match http_body_util::BodyExt::collect(body).await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) => Err(e.as_client_error()),
    }
}

/// What one request asks of the upstream beyond its head.
#[derive(Debug, Default, Clone, Copy)]
pub struct Call {
    /// The request is a gRPC call (`content-type: application/grpc...`).
    pub grpc: bool,
    /// The client asked for trailers (`TE: trailers`, as gRPC does), or a
    /// cost is settled from one: asked of the upstream in turn (of an
    /// HTTP/1.1 one with `TE: trailers` and `Connection: TE`).
    pub trailers: bool,
    /// A deadline of the call's own (gRPC's `grpc-timeout`), when shorter
    /// than the upstream's `timeout`.
    pub timeout: Option<Duration>,
    /// Its priority class and whether it is never shed, should it wait
    /// for a target under `max_conns`.
    pub class: (u8, bool),
}

impl Call {
    /// Its own deadline (gRPC's), as an instant from now.
    fn deadline(&self) -> Option<tokio::time::Instant> {
        self.timeout.map(|t| tokio::time::Instant::now() + t)
    }

    fn head_timeout(&self, upstream: Duration) -> Duration {
        self.timeout.map_or(upstream, |t| t.min(upstream))
    }
}

fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}
