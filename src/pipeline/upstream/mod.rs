//! The upstream stage: picks a target (round robin, skipping targets in
//! cool-down after a failed connect), takes a pooled keep-alive connection or
//! opens one (TCP, optionally TLS), and sends the request over HTTP/1.1.
//!
//! Retries never replay a body that may have reached the upstream:
//! - a failed connect moves on to the next target (nothing was sent);
//! - a pooled connection that turns out closed before the request was
//!   written is retried once on a fresh connection;
//! - an idempotent, bodiless request whose pooled connection died before
//!   any response byte is retried once on a fresh connection (the race with
//!   an upstream closing an idle keep-alive connection).

pub mod client_tls;
pub mod pool;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{HeaderValue, HOST};
use http::{Method, Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use self::pool::{Pool, Pooled};
use super::body::{RequestBody, RequestBodyError};
use crate::config::{HostHeader, UpstreamConfig};
use crate::error::ProxyError;
use crate::metrics::{Histogram, UpstreamReport, CALL_BOUNDS};

/// Idle connections younger than this are reused without keeping a copy of
/// the request for a retry: no upstream closes a keep-alive connection that
/// quickly, so the close race cannot happen and the copy would be waste.
const RACE_FREE_IDLE: Duration = Duration::from_secs(1);

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

/// A response head from the upstream, with the connection to return to the
/// pool once its body has been read.
pub struct Exchange {
    pub response: Response<Incoming>,
    pub conn: Pooled,
}

impl Upstream {
    pub fn new(cfg: &UpstreamConfig) -> Self {
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
            epoch: Instant::now(),
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

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Sends `req` and waits for the response head. `chosen` records the
    /// target used, for the access log, even when sending fails. A request
    /// without `Host` gets the `host:port` of the target it is sent to, on
    /// every attempt (`host_header: target`).
    pub async fn send(
        &self,
        mut req: Request<RequestBody>,
        chosen: &mut Option<Arc<str>>,
    ) -> Result<Exchange, ProxyError> {
        let replayable = is_idempotent(req.method()) && http_body::Body::is_end_stream(req.body());
        let target_host = !req.headers().contains_key(HOST);
        let sending = Instant::now();
        let n = self.targets.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        let mut last_connect_error = String::from("no target configured");
        // Targets already tried for this request (the first 64 are tracked).
        let mut tried: u64 = 0;
        // Pass 0 tries targets that are up; pass 1 those in cool-down, in
        // case they are back (better a try than a certain 502).
        for pass in 0..2 {
            for i in 0..n {
                let target = &self.targets[(first + i) % n];
                let idx = (first + i) % n;
                let cooling = target.down_until_ms.load(Ordering::Relaxed) > now;
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
                        self.take_ready(target).await
                    } else {
                        None
                    };
                    let (sender, idle_for) = match idle {
                        Some((s, age)) => (s, Some(age)),
                        None => match self.connect(target).await {
                            Ok(s) => {
                                target.down_until_ms.store(0, Ordering::Relaxed);
                                (s, None)
                            }
                            Err(e) => {
                                target.down_until_ms.store(
                                    self.now_ms() + self.cooldown.as_millis() as u64,
                                    Ordering::Relaxed,
                                );
                                target.stats[COOLDOWN].fetch_add(1, Ordering::Relaxed);
                                tracing::warn!(upstream = %self.name, target = %target.authority, error = %e, "connect failed; target cooling down");
                                last_connect_error = format!("{}: {e}", target.authority);
                                break;
                            }
                        },
                    };
                    let retry_head = match idle_for {
                        Some(age) if replayable && age >= RACE_FREE_IDLE => Some(clone_head(&req)),
                        _ => None,
                    };
                    if target_host {
                        req.headers_mut().insert(HOST, target.host_value.clone());
                    }
                    let mut conn = Pooled::new(sender, target.pool.clone());
                    let sent =
                        tokio::time::timeout(self.timeout, conn.sender.try_send_request(req)).await;
                    match sent {
                        Err(_) => {
                            target.stats[TIMEOUT].fetch_add(1, Ordering::Relaxed);
                            return Err(ProxyError::UpstreamTimeout {
                                upstream: self.name.to_string(),
                                seconds: self.timeout.as_secs_f64(),
                            });
                        }
                        Ok(Ok(response)) => {
                            target.stats[OK].fetch_add(1, Ordering::Relaxed);
                            self.duration.observe(sending.elapsed());
                            return Ok(Exchange { response, conn });
                        }
                        Ok(Err(mut e)) => {
                            let reused = idle_for.is_some();
                            if let Some(back) = e.take_message() {
                                if reused {
                                    target.stats[RETRY].fetch_add(1, Ordering::Relaxed);
                                    req = back;
                                    pooled_first = false;
                                    continue;
                                }
                            } else if let (true, Some(head)) = (reused, retry_head) {
                                tracing::debug!(upstream = %self.name, target = %target.authority, "pooled connection closed under us; retrying on a fresh one");
                                target.stats[RETRY].fetch_add(1, Ordering::Relaxed);
                                req = head;
                                pooled_first = false;
                                continue;
                            }
                            target.stats[ERROR].fetch_add(1, Ordering::Relaxed);
                            return Err(self.classify(e.into_error()));
                        }
                    }
                }
            }
        }
        Err(ProxyError::UpstreamUnreachable {
            upstream: self.name.to_string(),
            reason: last_connect_error,
        })
    }

    /// Pops idle connections until one is ready to take a request.
    async fn take_ready(
        &self,
        target: &TargetState,
    ) -> Option<(SendRequest<RequestBody>, Duration)> {
        while let Some((mut sender, age)) = target.pool.take() {
            if sender.ready().await.is_ok() {
                return Some((sender, age));
            }
        }
        None
    }

    async fn connect(&self, target: &TargetState) -> Result<SendRequest<RequestBody>, String> {
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
            None => handshake(TokioIo::new(tcp)).await,
            Some((connector, name)) => {
                let server_name = match name {
                    Some(n) => n.clone(),
                    None => rustls_pki_types::ServerName::try_from(target.host.clone()).map_err(
                        |_| format!("\"{}\" is not a valid TLS server name", target.host),
                    )?,
                };
                let tls = tokio::time::timeout_at(deadline, connector.connect(server_name, tcp))
                    .await
                    .map_err(|_| "TLS handshake timed out".to_owned())?
                    .map_err(|e| format!("TLS handshake failed: {e}"))?;
                handshake(TokioIo::new(tls)).await
            }
        }
    }

    fn classify(&self, err: hyper::Error) -> ProxyError {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
        while let Some(e) = source {
            if let Some(body_err) = e.downcast_ref::<RequestBodyError>() {
                return match body_err {
                    RequestBodyError::TooLarge { limit } => {
                        ProxyError::BodyTooLarge { limit: *limit }
                    }
                    RequestBodyError::Timeout(d) => ProxyError::BodyTimeout(d.as_secs().max(1)),
                    RequestBodyError::Client(_) => {
                        ProxyError::BadRequest("the client's request body was cut off")
                    }
                };
            }
            source = e.source();
        }
        ProxyError::UpstreamFailed {
            upstream: self.name.to_string(),
            reason: err.to_string(),
        }
    }
}

async fn handshake<T>(io: T) -> Result<SendRequest<RequestBody>, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, conn) = http1::Builder::new()
        .handshake(io)
        .await
        .map_err(|e| format!("HTTP handshake failed: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "upstream connection ended with an error");
        }
    });
    Ok(sender)
}

fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// A copy of a bodiless request, kept in case it must be sent again.
fn clone_head(req: &Request<RequestBody>) -> Request<RequestBody> {
    let mut copy = Request::new(RequestBody::empty());
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    copy
}
