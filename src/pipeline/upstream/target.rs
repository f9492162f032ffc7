//! One target of an upstream: where it is, its connections, its health,
//! its requests in flight (for `least_conn`, `max_conns` and the admin
//! API) and its figures; and opening a connection to it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::pipeline::protect::Gate;

use http::header::HeaderValue;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::balancer::Balancer;
use super::h1::{Conn, Io};
use super::h2::H2Pool;
use super::health::Health;
use super::pool::Pool;
use super::retry::Failure;
use crate::config::{Target, UpstreamConfig, UpstreamProtocol};
use crate::tls::SendOne;

pub(super) struct TargetState {
    pub authority: Arc<str>,
    pub host: String,
    pub port: u16,
    /// Set when the target is an IP literal: no resolver call per connect.
    pub addr: Option<SocketAddr>,
    /// The target as a `Host` header value, for `host_header: target`.
    pub host_value: HeaderValue,
    pub pool: Arc<Pool>,
    /// Its HTTP/2 connections (`protocol: h2` or `auto`).
    pub h2: Option<H2Pool>,
    /// `auto` over TLS: what the target chose when offered both (`ALPN_*`).
    pub alpn: AtomicU8,
    /// Failures counted, and whether it is marked down (ms since `epoch`).
    pub health: Health,
    /// Requests it takes at most at once (0: no cap).
    pub max_conns: u32,
    /// Requests sent to it whose answers have not ended, shared by every
    /// worker; each held by an [`InFlight`].
    pub in_flight: Arc<AtomicU32>,
    /// Drained by the admin API: no new requests until set back.
    pub draining: AtomicBool,
    /// Failing its active health checks (`checks`).
    pub check_failed: AtomicBool,
    /// Its slow start (ms, 0: none), and when it last came back (unix ms,
    /// 0: at its whole weight).
    pub slow_start_ms: u64,
    pub ramp_from_ms: AtomicU64,
    /// `ewma`: its peak-EWMA latency (µs, as f64 bits) and when it was
    /// last updated (ms on the upstream's clock).
    ewma_us: AtomicU64,
    ewma_at_ms: AtomicU64,
    pub backup: bool,
    /// `down` in the config.
    pub down: bool,
    pub stats: Stats,
}

/// A target's figures, for metrics and the admin API.
#[derive(Default)]
pub(super) struct Stats {
    /// Answer heads received.
    pub ok: AtomicU64,
    /// By [`Failure`].
    pub failures: [AtomicU64; Failure::COUNT],
    /// Requests that went on from it to another target, by [`Failure`];
    /// the last slot: sent again on a fresh connection because a kept one
    /// turned out closed.
    pub retries: [AtomicU64; Failure::COUNT + 1],
    /// Times its failures marked it down.
    pub marked_down: AtomicU64,
    /// Its last failure: unix ms times 16, plus the [`Failure`].
    pub last_failure: AtomicU64,
    /// Active health checks passed, failed.
    pub checks: [AtomicU64; 2],
}

/// `ewma`'s decay (ms) and the latency a failure counts as (µs).
const EWMA_DECAY_MS: f64 = 10_000.0;
const EWMA_PENALTY_US: f64 = 1_000_000.0;

/// The slot of `retries` for a request sent again on a fresh connection.
pub(super) const STALE: usize = Failure::COUNT;

pub(super) const ALPN_UNKNOWN: u8 = 0;
pub(super) const ALPN_H1: u8 = 1;
pub(super) const ALPN_H2: u8 = 2;

impl TargetState {
    pub fn new(t: &Target, cfg: &UpstreamConfig) -> Self {
        TargetState {
            authority: Arc::from(t.authority.as_str()),
            host: t.host.clone(),
            port: t.port,
            addr: t
                .addr
                .or_else(|| t.host.parse().ok().map(|ip| SocketAddr::new(ip, t.port))),
            host_value: HeaderValue::from_str(t.name())
                .unwrap_or_else(|_| HeaderValue::from_static("localhost")),
            pool: Arc::new(Pool::new(cfg.max_idle_per_target, cfg.idle_timeout)),
            h2: (cfg.protocol != UpstreamProtocol::Http1)
                .then(|| H2Pool::new(cfg.max_idle_per_target, cfg.max_streams, cfg.idle_timeout)),
            alpn: AtomicU8::new(ALPN_UNKNOWN),
            health: Health::new(
                t.max_fails,
                t.fail_timeout.unwrap_or(cfg.cooldown).as_millis() as u64,
            ),
            max_conns: t.max_conns,
            in_flight: Arc::default(),
            draining: AtomicBool::new(false),
            check_failed: AtomicBool::new(false),
            slow_start_ms: t.slow_start.map_or(0, |d| d.as_millis() as u64),
            ramp_from_ms: AtomicU64::new(0),
            ewma_us: AtomicU64::new(0f64.to_bits()),
            ewma_at_ms: AtomicU64::new(0),
            backup: t.backup,
            down: t.down,
            stats: Stats::default(),
        }
    }

    pub fn load(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Whether it is at its `max_conns`.
    pub fn full(&self) -> bool {
        self.max_conns != 0 && self.load() >= self.max_conns
    }

    /// One more request in flight, until the guard drops; then `wakes`
    /// (its upstream's queue, where requests wait for a slot under
    /// `max_conns`) hears of it.
    pub fn start(&self, wakes: Option<&Arc<Gate>>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.in_flight.clone(), wakes.cloned())
    }

    /// It comes back at `unix_ms` (after failures or failed checks): its
    /// slow start begins, if it has one.
    pub fn came_back(&self, unix_ms: u64) {
        if self.slow_start_ms != 0 {
            self.ramp_from_ms.store(unix_ms.max(1), Ordering::Relaxed);
        }
    }

    /// Its share of its weight at `unix_ms`, per mille: a tenth when it
    /// comes back, the whole once `slow_start` has passed.
    pub fn ramp(&self, unix_ms: u64) -> i64 {
        let from = self.ramp_from_ms.load(Ordering::Relaxed);
        if from == 0 {
            return super::balancer::FULL;
        }
        let elapsed = unix_ms.saturating_sub(from);
        if elapsed >= self.slow_start_ms {
            self.ramp_from_ms.store(0, Ordering::Relaxed);
            return super::balancer::FULL;
        }
        (100 + 900 * elapsed / self.slow_start_ms) as i64
    }

    /// Its peak-EWMA latency decayed to `now_ms` (linkerd's and Finagle's
    /// "peak EWMA", a 10 s decay) with `rtt_us` observed, when given: a
    /// slower answer than the average counts whole at once, a faster one
    /// pulls it down with time.
    fn ewma(&self, now_ms: u64, rtt_us: Option<f64>) -> f64 {
        let cost = f64::from_bits(self.ewma_us.load(Ordering::Relaxed));
        let then = self.ewma_at_ms.load(Ordering::Relaxed);
        let w = (-(now_ms.saturating_sub(then) as f64) / EWMA_DECAY_MS).exp();
        let rtt = rtt_us.unwrap_or(0.0);
        if rtt > cost {
            rtt
        } else {
            cost * w + rtt * (1.0 - w)
        }
    }

    /// `ewma`: an attempt took `rtt`; `failed` (an error, a 5xx, a 429)
    /// counts as a slow one, so a target that refuses fast attracts no
    /// more traffic for it.
    pub fn observe(&self, rtt: Duration, failed: bool, now_ms: u64) {
        let mut us = rtt.as_secs_f64() * 1e6;
        if failed {
            us = us.max(EWMA_PENALTY_US);
        }
        let cost = self.ewma(now_ms, Some(us));
        self.ewma_us.store(cost.to_bits(), Ordering::Relaxed);
        self.ewma_at_ms.store(now_ms, Ordering::Relaxed);
    }

    /// `ewma`'s score at `now_ms`: latency times (requests in flight + 1).
    pub fn score(&self, now_ms: u64) -> u32 {
        let score = self.ewma(now_ms, None) * f64::from(self.load() + 1);
        score.min(f64::from(u32::MAX)) as u32
    }

    pub fn note_failure(&self, failure: Failure, unix_ms: u64) {
        self.stats.failures[failure as usize].fetch_add(1, Ordering::Relaxed);
        self.stats
            .last_failure
            .store(unix_ms * 16 + failure as u64, Ordering::Relaxed);
    }

    /// Its last failure: when (unix ms) and why.
    pub fn last_failure(&self) -> Option<(u64, Failure)> {
        let v = self.stats.last_failure.load(Ordering::Relaxed);
        (v != 0).then(|| (v / 16, Failure::ALL[(v % 16) as usize % Failure::COUNT]))
    }

    /// Opens a connection (TCP, then TLS with `tls`) within `timeout`; a
    /// failure says why, as an error or a timeout.
    pub async fn connect(
        &self,
        timeout: Duration,
        tls: Option<&(TlsConnector, Option<rustls_pki_types::ServerName<'static>>)>,
    ) -> Result<Conn, (Failure, String)> {
        let deadline = tokio::time::Instant::now() + timeout;
        let tcp = match self.addr {
            Some(addr) => tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await,
            None => {
                tokio::time::timeout_at(
                    deadline,
                    TcpStream::connect((self.host.as_str(), self.port)),
                )
                .await
            }
        };
        let timed_out = |what: &str| {
            (
                Failure::Timeout,
                format!("{what} timed out after {}ms", timeout.as_millis()),
            )
        };
        let tcp = match tcp {
            Err(_) => return Err(timed_out("connect")),
            Ok(Err(e)) => return Err((Failure::Error, e.to_string())),
            Ok(Ok(s)) => s,
        };
        let _ = tcp.set_nodelay(true);
        let Some((connector, name)) = tls else {
            return Ok(Conn::new(Io::Tcp(tcp)));
        };
        let server_name = match name {
            Some(n) => n.clone(),
            None => rustls_pki_types::ServerName::try_from(self.host.clone()).map_err(|_| {
                (
                    Failure::Error,
                    format!("\"{}\" is not a valid TLS server name", self.host),
                )
            })?,
        };
        let tls = tokio::time::timeout_at(deadline, connector.connect(server_name, SendOne(tcp)))
            .await
            .map_err(|_| timed_out("TLS handshake"))?
            .map_err(|e| (Failure::Error, format!("TLS handshake failed: {e}")))?;
        Ok(Conn::new(Io::Tls(Box::new(tls))))
    }
}

/// An upstream's targets as they are now, and the balancer over them (a
/// new set when a name resolves to other addresses).
pub(super) struct TargetSet {
    pub targets: Box<[Arc<TargetState>]>,
    pub balancer: Balancer,
}

impl TargetSet {
    /// The set of `targets`, each keeping its state from `before` where
    /// it was there already.
    /// A new target's health checks start with it, where a runtime runs.
    pub fn new(cfg: &UpstreamConfig, targets: Vec<Target>, before: &[Arc<TargetState>]) -> Self {
        let checks = cfg
            .health_check
            .as_ref()
            .filter(|_| tokio::runtime::Handle::try_current().is_ok());
        TargetSet {
            balancer: Balancer::new(&targets, &cfg.balance),
            targets: targets
                .iter()
                .map(|t| {
                    if let Some(kept) = before.iter().find(|b| *b.authority == t.authority) {
                        return kept.clone();
                    }
                    let new = Arc::new(TargetState::new(t, cfg));
                    if let Some(check) = checks {
                        let tls = cfg
                            .tls
                            .as_ref()
                            .map(|t| (TlsConnector::from(t.config.clone()), t.server_name.clone()));
                        let name = Arc::from(cfg.name.as_str());
                        let (timeout, protocol) = (cfg.connect_timeout, cfg.protocol);
                        super::checks::start(&new, check.clone(), name, timeout, tls, protocol);
                    }
                    new
                })
                .collect(),
        }
    }
}

/// A request in flight at a target, counted until it is dropped (when
/// the answer's body has ended or was abandoned).
pub struct InFlight(Arc<AtomicU32>, Option<Arc<Gate>>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
        if let Some(gate) = &self.1 {
            gate.slot_freed();
        }
    }
}
