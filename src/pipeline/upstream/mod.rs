//! The upstream stage: picks a target (round robin, skipping targets in
//! cool-down after a failed connect), takes a pooled keep-alive connection or
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

pub(crate) mod h1;
mod io;
pub(crate) mod pool;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{HeaderName, HeaderValue, HOST};
use http::{Method, Request};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use self::h1::{Answer, Conn, Io, SendError};
use self::pool::Pool;
use super::body::{RequestBody, RequestBodyError};
use crate::clock::Clock;
use crate::config::{HostHeader, UpstreamConfig};
use crate::error::ProxyError;
use crate::metrics::{Histogram, UpstreamReport, CALL_BOUNDS};
use crate::tls::SendOne;

/// A named pool of targets, built once from config.
pub struct Upstream {
    pub name: Arc<str>,
    targets: Box<[TargetState]>,
    /// Round-robin cursor.
    next: AtomicUsize,
    connect_timeout: Duration,
    /// Time for the response head; also the body's idle timeout.
    pub timeout: Duration,
    cooldown: Duration,
    pub host_header: HostHeader,
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
    /// Milliseconds since `epoch` until which this target is skipped.
    down_until_ms: AtomicU64,
    /// For metrics: responses, errors, timeouts, retries, cool-downs.
    stats: [AtomicU64; 5],
}

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
                down_until_ms: AtomicU64::new(0),
                stats: Default::default(),
            })
            .collect();
        Upstream {
            name: Arc::from(cfg.name.as_str()),
            targets,
            next: AtomicUsize::new(0),
            connect_timeout: cfg.connect_timeout,
            timeout: cfg.timeout,
            cooldown: cfg.cooldown,
            host_header: cfg.host_header.clone(),
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
        }
    }

    fn ms_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// Sends the request `head` with `body` and waits for the response
    /// head. `chosen` records the target used, for the access log, even
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
        added: &[(HeaderName, HeaderValue)],
        chosen: &mut Option<Arc<str>>,
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
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        // Written only when a connect fails: nothing allocated per request.
        let mut last_connect_error = None;
        // Targets already tried for this request (the first 64 are tracked).
        let mut tried: u64 = 0;
        // Pass 0 tries targets that are up; pass 1 those in cool-down, in
        // case they are back (better a try than a certain 502).
        for pass in 0..2 {
            for i in 0..n {
                let idx = (first + i) % n;
                let target = &self.targets[idx];
                // The attempt's time in ms is worked out only for a target
                // with a cool-down deadline (0 while it is up: most requests
                // meet none).
                let until = target.down_until_ms.load(Ordering::Relaxed);
                let cooling = until != 0 && until > self.ms_at(sending);
                if cooling != (pass == 1) || (idx < 64 && tried & (1 << idx) != 0) {
                    continue;
                }
                if idx < 64 {
                    tried |= 1 << idx;
                }
                *chosen = Some(target.authority.clone());
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
                                target.down_until_ms.store(
                                    self.ms_at(self.clock.now()) + self.cooldown.as_millis() as u64,
                                    Ordering::Relaxed,
                                );
                                target.stats[COOLDOWN].fetch_add(1, Ordering::Relaxed);
                                tracing::warn!(upstream = %self.name, target = %target.authority, error = %e, "connect failed; target cooling down");
                                last_connect_error = Some(format!("{}: {e}", target.authority));
                                break;
                            }
                        },
                    };
                    if !host_set {
                        head.headers_mut().insert(HOST, target.host_value.clone());
                    }
                    let encoded = crate::http1::encode_head(head, added, length, chunked);
                    let exchange = h1::exchange(
                        conn,
                        encoded,
                        body.take(),
                        chunked,
                        head.method(),
                        (&target.pool, sending),
                        self.timeout,
                    );
                    match exchange.await {
                        Err(SendError::Timeout) => {
                            target.stats[TIMEOUT].fetch_add(1, Ordering::Relaxed);
                            return Err(ProxyError::UpstreamTimeout {
                                upstream: self.name.to_string(),
                                seconds: self.timeout.as_secs_f64(),
                            });
                        }
                        Ok(answer) => {
                            target.stats[OK].fetch_add(1, Ordering::Relaxed);
                            self.duration.observe(self.clock.now() - sending);
                            return Ok(answer);
                        }
                        Err(SendError::Body(e)) => return Err(body_error(e)),
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
            reason: last_connect_error.unwrap_or_else(|| "no target configured".to_owned()),
        })
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

/// A client body that failed on its way upstream, as the client's error.
fn body_error(e: RequestBodyError) -> ProxyError {
    match e {
        RequestBodyError::TooLarge { limit } => ProxyError::BodyTooLarge { limit },
        RequestBodyError::Timeout(d) => ProxyError::BodyTimeout(d.as_secs().max(1)),
        // A body hyper could not parse is the client's fault (400); any
        // other failure is the client going away: it closed the
        // connection or reset its HTTP/2 stream (nginx's 499).
        RequestBodyError::Client(e) if malformed(&*e) => {
            ProxyError::BadRequest("the client's request body is malformed")
        }
        RequestBodyError::Client(_) => ProxyError::ClientClosed,
    }
}

/// Whether a client body failed on its framing (hyper's decoder reports a
/// bad chunk as invalid data or input), not on the client going away.
fn malformed(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput
            );
        }
        cause = e.source();
    }
    false
}

fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}
