//! The upstream stage: picks a target (nginx's smooth weighted round
//! robin, `balancer`: backups only when no primary can take it, never a
//! target marked down, skipping targets in cool-down after a failed
//! connect), takes a pooled keep-alive connection or
//! opens one (TCP, optionally TLS), and sends the request over HTTP/1.1.
//!
//! Retries never replay a body that may have reached the upstream:
//! - a failed connect moves on to the next target (nothing was sent);
//! - a pooled connection that turns out closed before any of the request
//!   was written is retried once on a fresh connection;
//! - an idempotent, bodiless request whose pooled connection died before
//!   any response byte is retried once on a fresh connection (the race with
//!   an upstream closing an idle keep-alive connection).
//!
//! HTTP/1.1 itself is spoken by `h1`, in the request's own task.

mod balancer;
pub(crate) mod h1;
pub(crate) mod h2;
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
use self::h2::{H2Pool, SendFailure};
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
    cooldown: Duration,
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
    /// Milliseconds since `epoch` until which this target is skipped.
    down_until_ms: AtomicU64,
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
                down_until_ms: AtomicU64::new(0),
                stats: Default::default(),
            })
            .collect();
        Upstream {
            name: Arc::from(cfg.name.as_str()),
            targets,
            balancer: Balancer::new(&cfg.targets),
            connect_timeout: cfg.connect_timeout,
            timeout: cfg.timeout,
            cooldown: cfg.cooldown,
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
                    // target with a cool-down deadline (0 while it is up:
                    // most requests meet none).
                    let until = self.targets[idx].down_until_ms.load(Ordering::Relaxed);
                    let cooling = until != 0 && until > self.ms_at(sending);
                    cooling == (pass == 1) && !(idx < 64 && tried & (1 << idx) != 0)
                };
                let Some(idx) = self.balancer.pick(usable) else {
                    break;
                };
                let target = &self.targets[idx];
                if idx < 64 {
                    tried |= 1 << idx;
                }
                *chosen = Some(target.authority.clone());
                if self.speaks_h2(target) {
                    let sent = self.send_h2(target, head, &mut body, (added, call), sending, held);
                    match sent.await {
                        H2Sent::Done(answer) => return answer,
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
                            Ok(c) => {
                                target.down_until_ms.store(0, Ordering::Relaxed);
                                c
                            }
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
                        Err(SendError::Timeout) => return Err(self.timed_out(target, call)),
                        Ok(answer) => {
                            target.stats[OK].fetch_add(1, Ordering::Relaxed);
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
                            return Err(self.failed(e));
                        }
                    }
                }
            }
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

    /// Sends the request over HTTP/2: on a kept connection with room, else
    /// on a new one. A request the kept connection never sent (it was
    /// closing) goes once more on a new connection; nothing that may have
    /// reached the upstream is sent twice.
    async fn send_h2(
        &self,
        target: &TargetState,
        head: &Request<()>,
        body: &mut Option<RequestBody>,
        (added, call): (&[(HeaderName, HeaderValue)], Call),
        sending: Instant,
        held: Option<&Arc<ConnState>>,
    ) -> H2Sent {
        let Some(pool) = target.h2.as_ref() else {
            return H2Sent::Http1;
        };
        let until = tokio::time::Instant::now() + call.head_timeout(self.timeout);
        let mut taken = pool.take(sending);
        let mut retried = false;
        let mut unsent = None;
        let mut body_failed = None;
        loop {
            let mut opening = None;
            if taken.is_none() {
                // One connection opened at a time per worker: the requests
                // that queued behind it share it.
                let guard = pool.opening().await;
                if !retried {
                    taken = pool.take(sending);
                }
                if taken.is_none() {
                    opening = Some(guard);
                }
            }
            let new = taken.is_none();
            let (conn, stream) = match taken.take() {
                Some(kept) => kept,
                None => match self.connect(target).await {
                    Err(e) => return H2Sent::Down(e),
                    Ok(c) if self.protocol == UpstreamProtocol::Auto && !h2::negotiated(&c.io) => {
                        target.alpn.store(ALPN_H1, Ordering::Relaxed);
                        target.pool.put(c, sending);
                        return H2Sent::Http1;
                    }
                    Ok(c) => {
                        target.alpn.store(ALPN_H2, Ordering::Relaxed);
                        let handshake =
                            tokio::time::timeout(self.connect_timeout, h2::handshake(c.io));
                        match handshake.await {
                            Ok(Ok(send)) => {
                                let kept = pool.put(send, sending);
                                drop(opening);
                                kept
                            }
                            Ok(Err(e)) => return H2Sent::Down(e),
                            Err(_) => return H2Sent::Down("HTTP/2 handshake timed out".into()),
                        }
                    }
                },
            };
            let req = match unsent.take() {
                Some(req) => req,
                None => {
                    let mut body = body.take().unwrap_or_else(RequestBody::empty);
                    // hyper's HTTP/2 client answers a body that failed
                    // with the stream's reset only: the note keeps why.
                    if !http_body::Body::is_end_stream(&body) {
                        body_failed = Some(body.note_failure());
                    }
                    let built = h2::request(
                        head,
                        added,
                        self.tls.is_some(),
                        &target.authority,
                        call.trailers,
                        body,
                    );
                    match built {
                        Ok(req) => req,
                        Err(e) => return H2Sent::Done(Err(ProxyError::BadRequest(e))),
                    }
                }
            };
            let sent = h2::send(conn, req, until);
            let failure = match held::run(sent, held.map(|c| c.hold_upstream_slot())).await {
                Ok(response) => {
                    target.stats[OK].fetch_add(1, Ordering::Relaxed);
                    self.duration.observe(self.clock.now() - sending);
                    return H2Sent::Done(Ok(Answer::H2(response, stream)));
                }
                Err(SendFailure::Unsent(req, e)) if !new && !retried => {
                    tracing::debug!(upstream = %self.name, target = %target.authority, error = %e, "HTTP/2 connection closing; sending on a fresh one");
                    target.stats[RETRY].fetch_add(1, Ordering::Relaxed);
                    unsent = Some(*req);
                    retried = true;
                    continue;
                }
                Err(SendFailure::Timeout) => {
                    return H2Sent::Done(Err(self.timed_out(target, call)))
                }
                Err(SendFailure::Unsent(_, e) | SendFailure::Failed(e)) => e,
            };
            let cause = std::error::Error::source(&failure);
            if let Some(e) = cause.and_then(|c| c.downcast_ref::<RequestBodyError>()) {
                return H2Sent::Done(Err(body_error(e)));
            }
            if let Some(e) = body_failed.as_ref().and_then(|n| n.take()) {
                return H2Sent::Done(Err(e));
            }
            target.stats[ERROR].fetch_add(1, Ordering::Relaxed);
            return H2Sent::Done(Err(ProxyError::UpstreamFailed {
                upstream: self.name.to_string(),
                reason: format!("HTTP/2: {failure}"),
            }));
        }
    }

    /// Puts a target that refused a connection in cool-down: the reason,
    /// for the answer if no target is left.
    fn cool_down(&self, target: &TargetState, e: String) -> String {
        target.down_until_ms.store(
            self.ms_at(self.clock.now()) + self.cooldown.as_millis() as u64,
            Ordering::Relaxed,
        );
        target.stats[COOLDOWN].fetch_add(1, Ordering::Relaxed);
        tracing::warn!(upstream = %self.name, target = %target.authority, error = %e, "connect failed; target cooling down");
        format!("{}: {e}", target.authority)
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

    fn failed(&self, err: SendError) -> ProxyError {
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

/// How an HTTP/2 attempt at one target ended.
enum H2Sent {
    Done(Result<Answer, ProxyError>),
    /// It could not be reached (the target cools down).
    Down(String),
    /// `auto`: it speaks HTTP/1.1.
    Http1,
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
