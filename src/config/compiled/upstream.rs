//! The runtime configuration of upstreams: targets, timeouts, pools, the
//! protocol spoken and TLS to them.

use std::sync::Arc;
use std::time::Duration;

#[derive(Debug)]
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
}

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
