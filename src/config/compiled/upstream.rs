//! The runtime configuration of upstreams: targets, timeouts, pools, the
//! protocol spoken and TLS to them.

use std::sync::Arc;
use std::time::Duration;

pub use crate::metrics::Failure;

#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    pub name: String,
    pub targets: Vec<Target>,
    /// Present when tollgate speaks HTTPS to this upstream.
    pub tls: Option<UpstreamTls>,
    pub connect_timeout: Duration,
    /// Time allowed for the response head, and for each gap between body
    /// chunks afterwards (nginx `proxy_read_timeout`).
    pub timeout: Duration,
    /// Pooled connections idle longer than this are not reused; keep it
    /// below the upstream's own keep-alive timeout.
    pub idle_timeout: Duration,
    /// HTTP/1.1: idle keep-alive connections kept per target, per worker;
    /// HTTP/2: connections kept per target, per worker.
    pub max_idle_per_target: usize,
    /// The targets' `fail_timeout` where they give none.
    pub cooldown: Duration,
    pub host_header: HostHeader,
    pub protocol: UpstreamProtocol,
    /// HTTP/2: streams one connection carries before another is opened.
    pub max_streams: usize,
    /// Which target a request goes to (nginx's balancing methods).
    pub balance: Balance,
    /// When a request goes on to another target (nginx
    /// `proxy_next_upstream`).
    pub next_upstream: NextUpstream,
    /// How targets with `resolve` are looked up (nginx `resolver`).
    pub resolver: Resolver,
    /// Active health checks (nginx Plus `health_check`), if any.
    pub health_check: Option<HealthCheck>,
    /// An adaptive concurrency limit, if any.
    pub concurrency: Option<super::Concurrency>,
    /// Where requests over it or `max_conns` wait, if anywhere.
    pub queue: Option<super::QueueConfig>,
}

/// A request to each target at an interval: `fails` failed checks in a
/// row take it out, `passes` passed ones bring it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub fails: u32,
    pub passes: u32,
    /// The statuses that pass, both ends included.
    pub status: (u16, u16),
}

/// nginx `resolver address valid=... ` and `resolver_timeout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolver {
    /// The DNS server asked (`None`: the system's, from /etc/resolv.conf).
    pub address: Option<std::net::SocketAddr>,
    /// How long an answer is used before it is asked again (`None`: its
    /// records' TTL, within 1 s and 1 h).
    pub valid: Option<Duration>,
    /// How long one lookup may take.
    pub timeout: Duration,
}

impl Default for Resolver {
    fn default() -> Self {
        Resolver {
            address: None,
            valid: None,
            timeout: Duration::from_secs(5),
        }
    }
}

/// nginx's balancing methods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Balance {
    /// Smooth weighted round robin (the default).
    RoundRobin,
    /// Fewest requests in flight, weighted; ties by round robin.
    LeastConn,
    /// A target drawn by weight; `two`: two drawn, the one with fewer in
    /// flight taken (`random two least_conn`).
    Random { two: bool },
    /// The key's CRC32 (nginx `hash`); `consistent`: on a ketama ring of
    /// 160 points per unit of weight.
    Hash { key: HashKey, consistent: bool },
    /// The client address: an IPv4 one by its first three octets, an
    /// IPv6 one whole (nginx `ip_hash`).
    IpHash,
    /// Two targets drawn, the one with the lower peak-EWMA latency times
    /// requests in flight taken (linkerd's and Finagle's); a failure or a
    /// refusal counts as a slow answer.
    Ewma,
}

impl std::fmt::Display for Balance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Balance::RoundRobin => f.write_str("round_robin"),
            Balance::LeastConn => f.write_str("least_conn"),
            Balance::Random { two: false } => f.write_str("random"),
            Balance::Random { two: true } => f.write_str("random two least_conn"),
            Balance::Hash { key, consistent } => {
                write!(
                    f,
                    "hash {key}{}",
                    if *consistent { " consistent" } else { "" }
                )
            }
            Balance::IpHash => f.write_str("ip_hash"),
            Balance::Ewma => f.write_str("ewma"),
        }
    }
}

impl std::fmt::Display for HashKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for part in &self.0 {
            match part {
                KeyPart::Text(t) => f.write_str(t)?,
                KeyPart::Ip => f.write_str("$remote_addr")?,
                KeyPart::User => f.write_str("$remote_user")?,
                KeyPart::Path => f.write_str("$uri")?,
                KeyPart::RequestUri => f.write_str("$request_uri")?,
                KeyPart::Args => f.write_str("$args")?,
                KeyPart::Arg(a) => write!(f, "$arg_{a}")?,
                KeyPart::Cookie(c) => write!(f, "$cookie_{c}")?,
                KeyPart::Header(h) => write!(f, "${{http_{}}}", h.as_str().replace('-', "_"))?,
                KeyPart::Host => f.write_str("$host")?,
            }
        }
        Ok(())
    }
}

/// A hash key: literal text and request values, concatenated (nginx's
/// `hash $host$request_uri`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashKey(pub Vec<KeyPart>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    Text(String),
    /// The client address as resolved (`ip`, `$remote_addr`).
    Ip,
    /// The verified user id (`user`), empty when anonymous.
    User,
    /// The path without the query (`path`, `$uri`).
    Path,
    /// Path and query as sent (`request_uri`, `$request_uri`).
    RequestUri,
    /// The query (`$args`).
    Args,
    /// One query argument (`arg:<name>`, `$arg_<name>`).
    Arg(String),
    /// One cookie (`cookie:<name>`, `$cookie_<name>`).
    Cookie(String),
    /// A request header (`header:<name>`, `$http_<name>`).
    Header(http::HeaderName),
    /// The `Host` (`$host`).
    Host,
}

/// nginx `proxy_next_upstream`, `_tries` and `_timeout`, and how much of
/// a request body is kept so it can be sent again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextUpstream {
    /// The conditions listed, as bits of [`NextUpstream::bit`].
    pub on: u16,
    /// Targets tried at most for one request (0: every target once).
    pub tries: u32,
    /// Time after the first attempt past which no other is started.
    pub timeout: Option<Duration>,
    /// A body of this size or less (with a `Content-Length`) is read
    /// whole before it is sent, so a retry can send it again.
    pub max_body: u64,
    /// Retries allowed only within a budget (`None`: as nginx, no budget).
    pub budget: Option<RetryBudget>,
}

/// linkerd's retry budget: retries of the last `window` stay under
/// `per_mille` / 1000 of its requests plus `min_per_second` a second.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryBudget {
    pub per_mille: u32,
    pub min_per_second: u32,
    pub window: Duration,
}

impl NextUpstream {
    /// The conditions in the order of their bits.
    pub const CONDITIONS: [&'static str; 11] = [
        "error",
        "timeout",
        "invalid_header",
        "http_500",
        "http_502",
        "http_503",
        "http_504",
        "http_403",
        "http_404",
        "http_429",
        "non_idempotent",
    ];

    pub fn bit(condition: &str) -> Option<u16> {
        Self::CONDITIONS
            .iter()
            .position(|c| *c == condition)
            .map(|i| 1 << i)
    }

    /// The conditions listed, by name.
    pub fn on_names(&self) -> Vec<&'static str> {
        (0..Self::CONDITIONS.len())
            .filter(|i| self.on & (1 << i) != 0)
            .map(|i| Self::CONDITIONS[i])
            .collect()
    }

    pub fn lists(&self, condition: &str) -> bool {
        Self::bit(condition).is_some_and(|b| self.on & b != 0)
    }
}

impl Default for NextUpstream {
    /// nginx's: `error timeout`, every target, no time limit; 64 KiB kept.
    fn default() -> Self {
        NextUpstream {
            on: 0b11,
            tries: 0,
            timeout: None,
            max_body: 64 * 1024,
            budget: None,
        }
    }
}

/// The HTTP version tollgate speaks to an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamProtocol {
    Http1,
    /// HTTP/2: ALPN `h2` over TLS, prior knowledge (h2c) over TCP.
    H2,
    /// TLS offers `h2` and `http/1.1` and the target picks; plain TCP
    /// speaks HTTP/1.1.
    Auto,
}

#[derive(Debug, Clone)]
pub struct Target {
    /// `host:port` as written, used to connect and in logs.
    pub authority: String,
    pub host: String,
    pub port: u16,
    /// Its share of the requests against the others' (nginx `weight`).
    pub weight: u32,
    /// Takes requests only while no primary target can (nginx `backup`).
    pub backup: bool,
    /// Takes no requests (nginx `down`).
    pub down: bool,
    /// Failures within `fail_timeout` that mark it down (0: never).
    pub max_fails: u32,
    /// How long those failures add up, and how long it is then down
    /// (`None`: the upstream's `cooldown`).
    pub fail_timeout: Option<Duration>,
    /// Requests in flight it takes at most (0: no cap; nginx `max_conns`).
    pub max_conns: u32,
    /// Its host name is looked up in the background and each address is a
    /// target of its own (nginx `server ... resolve`).
    pub resolve: bool,
    /// A target an address of a `resolve` entry became: that address (its
    /// `host` stays the name, for TLS and `Host`).
    pub addr: Option<std::net::SocketAddr>,
    /// ... and the entry's `host:port`.
    pub entry: Option<String>,
    /// Coming back (after its failures or failed checks), it ramps from a
    /// tenth of its weight to the whole over this long (nginx Plus
    /// `slow_start`).
    pub slow_start: Option<Duration>,
}

#[derive(Clone)]
pub struct UpstreamTls {
    pub config: Arc<rustls::ClientConfig>,
    /// Overrides the name sent in SNI and checked against the certificate.
    pub server_name: Option<rustls_pki_types::ServerName<'static>>,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl Target {
    /// The name it was configured by, which `hash ... consistent` places
    /// on its ring (nginx's server name).
    pub fn name(&self) -> &str {
        self.entry.as_deref().unwrap_or(&self.authority)
    }
}

/// Which `Host` header the upstream sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostHeader {
    /// The client's own `Host` (nginx `proxy_set_header Host $host`).
    Preserve,
    /// The target's `host:port` (nginx's default `$proxy_host`).
    Target,
    /// A fixed value.
    Fixed(http::HeaderValue),
}
