//! The upstream stage: picks a target (nginx's smooth weighted round
//! robin, `balancer`: backups only when no primary can take it, never a
//! target marked `down` or marked down by its failures, `health`), takes a
//! pooled keep-alive connection or opens one (TCP, optionally TLS), and
//! sends the request over HTTP/1.1 or HTTP/2.
//!
//! Retries never replay a body that may have reached the upstream:
//! - a failed connect moves on to the next target (nothing was sent);
//! - a pooled connection that turns out closed before any of the request
//!   was written is retried once on a fresh connection;
//! - an idempotent, bodiless request whose pooled connection died before
//!   any response byte is retried once on a fresh connection (the race with
//!   an upstream closing an idle keep-alive connection);
//! - an idempotent, bodiless request that timed out or lost its connection
//!   on a target goes on to the next one (nginx's default
//!   `proxy_next_upstream error timeout`); any other is answered 504 or
//!   502 from the target that failed it.
//!
//! HTTP/1.1 itself is spoken by `h1`, in the request's own task.

mod balancer;
pub(crate) mod h1;
pub(crate) mod h2;
mod h2_attempt;
mod health;
mod held;
mod io;
pub(crate) mod pool;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{HeaderName, HeaderValue, HOST};
use http::{Method, Request, Response};
use hyper::body::Incoming;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use self::balancer::Balancer;
use self::h1::{Conn, Io, SendError};
use self::h2::H2Pool;
use self::h2_attempt::H2Sent;
use self::health::Health;
use self::pool::Pool;
use super::body::{HeadLines, RequestBody, RequestBodyError};
use super::conn::ConnState;
use crate::clock::Clock;
use crate::config::{HostHeader, UpstreamConfig, UpstreamProtocol};
use crate::error::ProxyError;
use crate::metrics::{Histogram, UpstreamReport, CALL_BOUNDS};
use crate::tls::SendOne;

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

/// A named pool of targets, built once from config.
pub struct Upstream {
    pub name: Arc<str>,
    targets: Box<[TargetState]>,
    /// Which target each attempt goes to (weights, backups, down).
    balancer: Balancer,
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

struct TargetState {
    authority: Arc<str>,
    host: String,
    port: u16,
    /// Set when the target is an IP literal: no resolver call per connect.
    addr: Option<SocketAddr>,
    /// The target as a `Host` header value, for `host_header: target`.
    host_value: HeaderValue,
    pool: Arc<Pool>,
    /// Its HTTP/2 connections (`protocol: h2` or `auto`).
    h2: Option<H2Pool>,
    /// `auto` over TLS: what the target chose when offered both (`ALPN_*`).
    alpn: AtomicU8,
    /// Failures counted, and whether it is marked down (ms since `epoch`).
    health: Health,
    /// For metrics: responses, errors, timeouts, retries, cool-downs.
    stats: [AtomicU64; 5],
}

const ALPN_UNKNOWN: u8 = 0;
const ALPN_H1: u8 = 1;
const ALPN_H2: u8 = 2;

const OK: usize = 0;
const ERROR: usize = 1;
const TIMEOUT: usize = 2;
const RETRY: usize = 3;
const COOLDOWN: usize = 4;

impl Upstream {
    /// Cool-downs and idle connections' ages are timed on `clock`.
    pub fn new(cfg: &UpstreamConfig, clock: Clock) -> Self {
        let targets = cfg
            .targets
            .iter()
            .map(|t| TargetState {
                authority: Arc::from(t.authority.as_str()),
                host: t.host.clone(),
                port: t.port,
                addr: t.host.parse().ok().map(|ip| SocketAddr::new(ip, t.port)),
                host_value: HeaderValue::from_str(&t.authority)
                    .unwrap_or_else(|_| HeaderValue::from_static("localhost")),
                pool: Arc::new(Pool::new(cfg.max_idle_per_target, cfg.idle_timeout)),
                h2: (cfg.protocol != UpstreamProtocol::Http1).then(|| {
                    H2Pool::new(cfg.max_idle_per_target, cfg.max_streams, cfg.idle_timeout)
                }),
                alpn: AtomicU8::new(ALPN_UNKNOWN),
                health: Health::new(
                    t.max_fails,
                    t.fail_timeout.unwrap_or(cfg.cooldown).as_millis() as u64,
                ),
                stats: Default::default(),
            })
            .collect();
        Upstream {
            name: Arc::from(cfg.name.as_str()),
            targets,
            balancer: Balancer::new(&cfg.targets),
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

    /// This upstream's figures, for metrics.
    pub fn report(&self) -> UpstreamReport {
        UpstreamReport {
            name: self.name.clone(),
            targets: self
                .targets
                .iter()
                .map(|t| {
                    (
                        t.authority.clone(),
                        t.stats.each_ref().map(|n| n.load(Ordering::Relaxed)),
                    )
                })
                .collect(),
            duration: self.duration.snapshot(),
            h2: self.may_speak_h2().then(|| self.h2_counts()),
        }
    }

    fn ms_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// Sends the request `head` with `body` and waits for the response
    /// head. With `held` (an HTTP/2 client's connection), each attempt
    /// holds one of its upstream slots until the upstream answers, even if
    /// the client stops waiting (`held`). `chosen` records the target used, for the access log, even
    /// when sending fails. A request without `Host` (`host_set` false: the
    /// caller knows, no lookup) gets the `host:port` of the target it is
    /// sent to, on every attempt (`host_header: target`). The head is
    /// borrowed: a request passes through several async frames, and a
    /// move into each would copy it (about 200 bytes) into memory the
    /// request has not touched yet.
    pub async fn send(
        &self,
        head: &mut Request<()>,
        body: RequestBody,
        host_set: bool,
        (added, call): (&[(HeaderName, HeaderValue)], Call),
        chosen: &mut Option<Arc<str>>,
        held: Option<&Arc<ConnState>>,
    ) -> Result<Answer, ProxyError> {
        let bodiless = http_body::Body::is_end_stream(&body);
        let replayable = is_idempotent(head.method()) && bodiless;
        let length = http_body::Body::size_hint(&body).exact();
        let chunked = !bodiless && length.is_none();
        let mut body = (!bodiless).then_some(body);
        // The one clock read of the attempt: cool-downs, the pool's idle
        // ages and the duration all measure from it.
        let sending = self.clock.now();
        let n = self.targets.len();
        // Written only when a connect fails: nothing allocated per request.
        let mut last_connect_error = None;
        // The last target's failure after the request was sent, answered
        // when no target is left.
        let mut last_error: Option<ProxyError> = None;
        // Targets already tried for this request (the first 64 are tracked;
        // past them the attempts are bounded by the number of targets).
        let mut tried: u64 = 0;
        // Pass 0 tries targets that are up (a backup only when no primary
        // is); pass 1 those in cool-down, in case they are back (better a
        // try than a certain 502).
        for pass in 0..2 {
            for _ in 0..n {
                let usable = |idx: usize| {
                    // The attempt's time in ms is worked out only for a
                    // target marked down (most requests meet none).
                    let down = self.targets[idx].health.down(|| self.ms_at(sending));
                    down == (pass == 1) && !(idx < 64 && tried & (1 << idx) != 0)
                };
                let Some(idx) = self.balancer.pick(usable) else {
                    break;
                };
                let target = &self.targets[idx];
                target.health.picked(|| self.ms_at(sending));
                if idx < 64 {
                    tried |= 1 << idx;
                }
                *chosen = Some(target.authority.clone());
                if self.speaks_h2(target) {
                    let sent = self.send_h2(target, head, &mut body, (added, call), sending, held);
                    match sent.await {
                        H2Sent::Done(Ok(answer)) => {
                            target.health.succeeded();
                            return Ok(answer);
                        }
                        H2Sent::Done(Err(e)) if !targets_fault(&e) => return Err(e),
                        H2Sent::Done(Err(e)) => {
                            last_error = Some(self.fail_over(target, e, replayable)?);
                            continue;
                        }
                        H2Sent::Down(e) => {
                            last_connect_error = Some(self.cool_down(target, e));
                            continue;
                        }
                        // `auto`: the target chose HTTP/1.1, and its
                        // connection waits in the pool below.
                        H2Sent::Http1 => {}
                    }
                }
                let mut pooled_first = true;
                loop {
                    let idle = if pooled_first {
                        target.pool.take(sending)
                    } else {
                        None
                    };
                    let reused = idle.is_some();
                    let conn = match idle {
                        Some(c) => c,
                        None => match self.connect(target).await {
                            Ok(c) => c,
                            Err(e) => {
                                last_connect_error = Some(self.cool_down(target, e));
                                break;
                            }
                        },
                    };
                    if !host_set {
                        head.headers_mut().insert(HOST, target.host_value.clone());
                    }
                    let encoded = if call.trailers {
                        // (RFC 9110 §10.1.4: `TE` is named in `Connection`)
                        let mut asked = added.to_vec();
                        asked.push((http::header::TE, HeaderValue::from_static("trailers")));
                        asked.push((http::header::CONNECTION, HeaderValue::from_static("te")));
                        crate::http1::encode_head(head, &asked, length, chunked)
                    } else {
                        crate::http1::encode_head(head, added, length, chunked)
                    };
                    let exchange = h1::exchange(
                        conn,
                        encoded,
                        body.take(),
                        chunked,
                        head.method().clone(),
                        (target.pool.clone(), sending),
                        call.head_timeout(self.timeout),
                    );
                    match held::run(exchange, held.map(|c| c.hold_upstream_slot())).await {
                        Err(SendError::Timeout) => {
                            let e = self.timed_out(target, call);
                            last_error = Some(self.fail_over(target, e, replayable)?);
                            break;
                        }
                        Ok(answer) => {
                            target.stats[OK].fetch_add(1, Ordering::Relaxed);
                            target.health.succeeded();
                            self.duration.observe(self.clock.now() - sending);
                            return Ok(answer);
                        }
                        Err(SendError::Body(e)) => return Err(body_error(&e)),
                        // A pooled connection the upstream closed under
                        // us: send again on a fresh one if nothing reached
                        // the upstream, or if the request is idempotent and
                        // bodiless.
                        Err(SendError::Io {
                            error,
                            wrote,
                            received,
                            unsent,
                        }) if reused && !received && (!wrote || replayable) => {
                            tracing::debug!(upstream = %self.name, target = %target.authority, error = %error, "pooled connection closed under us; retrying on a fresh one");
                            target.stats[RETRY].fetch_add(1, Ordering::Relaxed);
                            body = unsent;
                            pooled_first = false;
                            continue;
                        }
                        Err(e) => {
                            target.stats[ERROR].fetch_add(1, Ordering::Relaxed);
                            // (an answer that is not HTTP is not passed on)
                            let retry = replayable && matches!(e, SendError::Io { .. });
                            let e = self.send_failed(e);
                            last_error = Some(self.fail_over(target, e, retry)?);
                            break;
                        }
                    }
                }
            }
        }
        if let Some(e) = last_error {
            return Err(e);
        }
        Err(ProxyError::UpstreamUnreachable {
            upstream: self.name.to_string(),
            reason: last_connect_error.unwrap_or_else(|| "every target is marked down".to_owned()),
        })
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

    /// A target refused a connection (or its handshake failed): a failure
    /// ([`health`]); the reason, for the answer if no target is left.
    fn cool_down(&self, target: &TargetState, e: String) -> String {
        let reason = format!("{}: {e}", target.authority);
        self.count_failure(target, &reason);
        reason
    }

    /// A target failed after the request was sent (timed out, lost the
    /// connection, answered what is not HTTP): a failure ([`health`]).
    /// `Ok(e)` when the request may go on to the next target (nginx's
    /// `proxy_next_upstream error timeout`: `replayable`, an idempotent
    /// request without a body), `e` to answer if none is left; `Err(e)`
    /// when it may not.
    fn fail_over(
        &self,
        target: &TargetState,
        e: ProxyError,
        replayable: bool,
    ) -> Result<ProxyError, ProxyError> {
        self.count_failure(target, &e);
        if replayable {
            Ok(e)
        } else {
            Err(e)
        }
    }

    fn count_failure(&self, target: &TargetState, why: &dyn std::fmt::Display) {
        let alone = self.targets.len() == 1;
        if target.health.failed(self.ms_at(self.clock.now()), alone) {
            target.stats[COOLDOWN].fetch_add(1, Ordering::Relaxed);
            tracing::warn!(upstream = %self.name, target = %target.authority, error = %why, "target failed; marked down for its fail_timeout");
        }
    }

    fn timed_out(&self, target: &TargetState, call: Call) -> ProxyError {
        target.stats[TIMEOUT].fetch_add(1, Ordering::Relaxed);
        ProxyError::UpstreamTimeout {
            upstream: self.name.to_string(),
            seconds: call.head_timeout(self.timeout).as_secs_f64(),
        }
    }

    /// HTTP/2 connections and open streams to this upstream, for metrics.
    fn h2_counts(&self) -> (usize, usize) {
        self.targets
            .iter()
            .filter_map(|t| t.h2.as_ref().map(H2Pool::counts))
            .fold((0, 0), |(c, s), (tc, ts)| (c + tc, s + ts))
    }

    async fn connect(&self, target: &TargetState) -> Result<Conn, String> {
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let tcp = match target.addr {
            Some(addr) => tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await,
            None => {
                tokio::time::timeout_at(
                    deadline,
                    TcpStream::connect((target.host.as_str(), target.port)),
                )
                .await
            }
        };
        let tcp = match tcp {
            Err(_) => {
                return Err(format!(
                    "connect timed out after {}ms",
                    self.connect_timeout.as_millis()
                ))
            }
            Ok(Err(e)) => return Err(e.to_string()),
            Ok(Ok(s)) => s,
        };
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => Ok(Conn::new(Io::Tcp(tcp))),
            Some((connector, name)) => {
                let server_name = match name {
                    Some(n) => n.clone(),
                    None => rustls_pki_types::ServerName::try_from(target.host.clone()).map_err(
                        |_| format!("\"{}\" is not a valid TLS server name", target.host),
                    )?,
                };
                let tls =
                    tokio::time::timeout_at(deadline, connector.connect(server_name, SendOne(tcp)))
                        .await
                        .map_err(|_| "TLS handshake timed out".to_owned())?
                        .map_err(|e| format!("TLS handshake failed: {e}"))?;
                Ok(Conn::new(Io::Tls(Box::new(tls))))
            }
        }
    }

    fn send_failed(&self, err: SendError) -> ProxyError {
        ProxyError::UpstreamFailed {
            upstream: self.name.to_string(),
            reason: err.to_string(),
        }
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
}

impl Call {
    fn head_timeout(&self, upstream: Duration) -> Duration {
        self.timeout.map_or(upstream, |t| t.min(upstream))
    }
}

/// Whether `e` is the target's failure (nginx's `error` or `timeout`),
/// not the client's own doing (its body too large, cut off, too slow).
fn targets_fault(e: &ProxyError) -> bool {
    matches!(
        e,
        ProxyError::UpstreamTimeout { .. } | ProxyError::UpstreamFailed { .. }
    )
}

/// A client body that failed on its way upstream, as the client's error.
fn body_error(e: &RequestBodyError) -> ProxyError {
    e.as_client_error()
}

fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}
