//! The runtime configuration: what the pipeline reads on every request.
//! Built once by `validate` from the raw YAML types; nothing here is serde,
//! every duration is a `Duration`, every address is parsed, every TLS key is
//! loaded, and routes are pre-sorted so the first match is the right one.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};

mod plans;
mod protect;
mod traces;
mod upstream;
pub use self::plans::*;
pub use self::protect::*;
pub use self::traces::*;
pub use self::upstream::*;

#[derive(Debug)]
pub struct Config {
    pub listeners: Vec<ListenerConfig>,
    /// `None` when `admin.enabled: false`.
    pub admin: Option<AdminConfig>,
    pub server: ServerConfig,
    /// Routes refer to upstreams by index into this list.
    pub upstreams: Vec<UpstreamConfig>,
    /// Sorted by precedence: the first route that matches a request wins.
    pub routes: Vec<RouteConfig>,
    pub log: LogConfig,
    pub client_ip: ClientIpConfig,
    /// `None` when no `identity` section is configured.
    pub identity: Option<IdentityConfig>,
    pub zones: Vec<ZoneConfig>,
    pub bypass: BypassConfig,
    /// One memory partition per zone, then one per route limit.
    pub store_zones: Vec<crate::limiter::memory::ZoneSpec>,
    pub store: StoreConfig,
    pub alerts: AlertsConfig,
    pub priorities: Priorities,
    /// `None`: no `traces` section, nothing traced.
    pub traces: Option<TracesConfig>,
}

/// Attack alerts: rules on limits, and where they are posted.
#[derive(Debug, Clone)]
pub struct AlertsConfig {
    pub rules: Vec<AlertRule>,
    /// A rule fires at most once per key (or limit) per cooldown.
    pub cooldown: Duration,
    pub webhook: Option<AlertWebhook>,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        AlertsConfig {
            rules: Vec::new(),
            cooldown: Duration::from_secs(300),
            webhook: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct AlertRule {
    pub name: Arc<str>,
    /// Every zone and route limit with this name is watched.
    pub limit: Arc<str>,
    pub kind: AlertKind,
    /// The window counts are taken over.
    pub per: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub enum AlertKind {
    /// One key rejected this many times within `per`.
    KeyRejections(u64),
    /// The limit's rejected share over `per` reaches `ratio`, once it has
    /// decided at least `min_requests`.
    RejectRatio { ratio: f64, min_requests: u64 },
    /// One key has used this share of a calendar quota (`algorithm: quota`).
    QuotaUsed(f64),
}

/// Where alerts are POSTed.
#[derive(Clone)]
pub struct AlertWebhook {
    pub uri: http::Uri,
    /// For https URLs.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub timeout: Duration,
    /// HMAC-SHA256 key for the `X-Tollgate-Signature` header; never printed.
    pub secret: Option<Vec<u8>>,
    /// A Slack-compatible `{"text": ...}` body.
    pub slack: bool,
}

impl std::fmt::Debug for AlertWebhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlertWebhook")
            .field("host", &self.uri.host())
            .field("slack", &self.slack)
            .finish()
    }
}

/// Where limit state lives: this process (`memory`) or Redis, shared by
/// every replica.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// `None`: the memory store. The options' Debug hides passwords.
    pub redis: Option<crate::limiter::redis::RedisOptions>,
    /// The default for limits that do not set their own `on_error`.
    pub on_error: crate::limiter::OnError,
    /// `local` mode divides every limit by this.
    pub replicas: u64,
}

#[derive(Debug)]
pub struct ListenerConfig {
    pub name: String,
    pub bind: SocketAddr,
    /// Present when this listener terminates TLS.
    pub tls: Option<ListenerTls>,
    /// Expect a PROXY protocol v1/v2 header first (from trusted peers only).
    pub proxy_protocol: bool,
}

pub struct ListenerTls {
    pub config: Arc<rustls::ServerConfig>,
    /// Names the SNI resolver answers for, for `tollgate check`.
    pub names: Vec<String>,
    /// A client that has not finished its handshake by then is dropped.
    pub handshake_timeout: Duration,
}

impl std::fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerTls")
            .field("names", &self.names)
            .finish()
    }
}

#[derive(Clone)]
pub struct AdminConfig {
    pub bind: SocketAddr,
    /// SHA-256 of each accepted bearer token (the tokens are not kept);
    /// empty: no token is asked for.
    pub token_hashes: Vec<[u8; 32]>,
    /// `/metrics` needs the token too.
    pub protect_metrics: bool,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("bind", &self.bind)
            .field("tokens", &self.token_hashes.len())
            .field("protect_metrics", &self.protect_metrics)
            .finish()
    }
}

/// Per-connection protections shared by every listener.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Slowloris guard: the whole request head must arrive within this time.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight and no bytes moving is closed.
    pub idle_timeout: Duration,
    /// Sum of header name and value lengths above which tollgate answers 431.
    pub max_header_bytes: usize,
    /// Header count above which the request is refused (431).
    pub max_headers: usize,
    /// Default request body cap (413); routes may override it.
    pub max_body_bytes: u64,
    /// Across all listeners; at the cap tollgate stops accepting and lets the
    /// kernel backlog queue new connections, like nginx `worker_connections`.
    pub max_connections: usize,
    /// Also the most requests of one HTTP/2 connection the upstreams may
    /// be working on at once, counted until each answer's head arrives
    /// even when the client reset its stream; new streams past it are
    /// refused (`REFUSED_STREAM`).
    pub h2_max_concurrent_streams: u32,
    /// Streams tollgate may reset for a client's errors over one HTTP/2
    /// connection before it ends the connection (GOAWAY
    /// `ENHANCE_YOUR_CALM`): hyper's default is 1,024.
    pub h2_max_reset_streams: usize,
    /// How long in-flight requests may run after SIGTERM before being cut.
    pub shutdown_grace: Duration,
    /// After SIGTERM, how long `/readyz` says 503 while the listeners
    /// still accept and serve (each HTTP/1.1 answer closing its
    /// connection, HTTP/2 connections told GOAWAY), before accepting stops.
    pub drain_delay: Duration,
    /// A client that sends no body bytes for this long gets 408 (nginx
    /// `client_body_timeout`).
    pub body_read_timeout: Duration,
    /// After an answer sent before the request body was read, how long
    /// tollgate goes on reading (and discarding) what the client still
    /// sends before it closes, so the client reads the answer instead of a
    /// reset (nginx `lingering_time`); 0 turns lingering off.
    pub lingering_time: Duration,
    /// ...and how long it waits for more of it each time (nginx
    /// `lingering_timeout`); also the longest wait for each piece of a
    /// small body discarded to keep the connection.
    pub lingering_timeout: Duration,
    /// A connection sending a response its client takes nothing of for
    /// this long is closed (nginx `send_timeout`): a reader that stopped
    /// reading, an HTTP/2 peer that never opens its flow-control window.
    pub send_timeout: Duration,
    /// Event loops serving connections, one thread each (nginx
    /// `worker_processes`); `auto` is one per core tollgate may run on.
    pub workers: usize,
}

#[derive(Debug)]
pub struct RouteConfig {
    /// For logs and `check`; defaults to the route's position.
    pub name: Arc<str>,
    /// Position in `Config::routes` (after sorting): metrics are indexed
    /// by it, so counting a request takes no lookup.
    pub index: usize,
    pub host: Option<HostMatch>,
    pub path: PathMatch,
    /// `None` matches every method.
    pub methods: Option<Vec<Method>>,
    pub action: RouteAction,
    pub max_body_bytes: u64,
    /// Compare paths ignoring ASCII case.
    pub case_insensitive: bool,
    /// Indices into `Config::zones` this route is subject to.
    pub zones: Vec<usize>,
    /// Empty when the route has no limits or `skip: true`.
    pub limits: Vec<RouteLimit>,
    pub headers: HeaderStyle,
    /// The `RateLimit-Policy` its limits give, rendered once.
    pub policy: PolicyHeader,
    /// Usage fraction past which `X-RateLimit-Warning` is sent.
    pub warn_at: f64,
    pub webhook: Option<WebhookConfig>,
    /// The protocols a client may switch to through this route (`Upgrade`,
    /// lower case; `websocket` unless configured): any other is dropped and
    /// the request served as plain HTTP/1.1. Never `h2c`.
    pub upgrades: Vec<Box<str>>,
    /// The priority class of its requests, if it names one.
    pub priority: Option<u8>,
}

impl RouteConfig {
    /// Whether every protocol an `Upgrade` value lists (`websocket`,
    /// `foo/2`: the name before any `/`) is one this route tunnels.
    pub fn allows_upgrade(&self, value: &[u8]) -> bool {
        let mut any = false;
        for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
            if token.is_empty() {
                continue;
            }
            any = true;
            let name = token.split(|&b| b == b'/').next().unwrap_or_default();
            if !self
                .upgrades
                .iter()
                .any(|p| p.as_bytes().eq_ignore_ascii_case(name))
            {
                return false;
            }
        }
        any
    }
}

/// A route's `RateLimit-Policy` value when every one of its limits is
/// reported with its configured quota, rendered once at load: responses
/// clone it instead of formatting it (a decision that differs, such as a
/// `local` fallback's divided quota, is formatted as it is).
#[derive(Debug, Clone, Default)]
pub struct PolicyHeader {
    /// Per limit, in the order its decisions are reported: name, quota,
    /// window in ms.
    pub items: Vec<(Arc<str>, u64, u64)>,
    pub value: Option<HeaderValue>,
}

impl PolicyHeader {
    /// For `limits`: enforced ones first, then dry-run ones, as they are
    /// decided.
    pub fn of(limits: &[RouteLimit]) -> Self {
        let ordered = limits
            .iter()
            .filter(|l| !l.dry_run)
            .chain(limits.iter().filter(|l| l.dry_run));
        let items: Vec<(Arc<str>, u64, u64)> = ordered
            .map(|l| {
                let (quota, window_ms) = l.limit.algorithm.policy();
                (l.limit.name.clone(), quota, window_ms)
            })
            .collect();
        let mut text = String::new();
        for (i, (name, quota, window_ms)) in items.iter().enumerate() {
            write_policy_item(&mut text, i == 0, name, *quota, *window_ms);
        }
        let value = (!items.is_empty())
            .then(|| HeaderValue::from_str(&text).ok())
            .flatten();
        PolicyHeader { items, value }
    }
}

/// One item of `RateLimit-Policy`: `"name";q=quota;w=window seconds`.
pub fn write_policy_item(out: &mut String, first: bool, name: &str, quota: u64, window_ms: u64) {
    use std::fmt::Write;
    let sep = if first { "" } else { ", " };
    let window = crate::limiter::secs(window_ms);
    let _ = write!(out, "{sep}\"{name}\";q={quota};w={window}");
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    /// Lower-case name without port.
    Exact(String),
    /// `*.example.com` stored as `.example.com`; matches one or more labels.
    Suffix(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    Exact(String),
    /// Plain string prefix, as nginx `location /prefix`.
    Prefix(String),
}

#[derive(Debug)]
pub enum RouteAction {
    /// Index into `Config::upstreams`.
    Forward(usize),
    Respond(Respond),
}

/// A canned answer, like nginx `return`.
#[derive(Debug, Clone)]
pub struct Respond {
    pub status: StatusCode,
    pub body: Bytes,
    pub headers: HeaderMap,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Pretty,
    Json,
}

#[derive(Debug, Clone)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A tracing filter directive such as `info` or `tollgate=debug`.
    pub level: String,
    pub access_log: bool,
}

/// Who may vouch for a client's address, and how clients are keyed.
#[derive(Debug, Clone)]
pub struct ClientIpConfig {
    /// Peers whose forwarding headers (and PROXY protocol) are believed.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Headers read from trusted peers, in order of preference.
    pub headers: Vec<ForwardHeader>,
    /// Rate-limit keys cover this many leading bits of an IPv4 address...
    pub ipv4_prefix: u8,
    /// ...and of an IPv6 address (64: one customer's /64 is one client).
    pub ipv6_prefix: u8,
}

impl Default for ClientIpConfig {
    fn default() -> Self {
        ClientIpConfig {
            trusted_proxies: Vec::new(),
            headers: vec![ForwardHeader::XForwardedFor],
            ipv4_prefix: 32,
            ipv6_prefix: 64,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardHeader {
    XForwardedFor,
    XRealIp,
    CfConnectingIp,
    TrueClientIp,
    Forwarded,
}

/// How requests are tied to a verified user.
#[derive(Debug)]
pub struct IdentityConfig {
    pub jwt: Option<JwtConfig>,
    /// Header carrying an API key; the key is hashed, never kept.
    pub api_key: Option<http::HeaderName>,
    /// What a presented but unverifiable credential means.
    pub on_invalid: OnInvalid,
    pub plans: Option<PlansConfig>,
    /// API-key metadata: per key hash (`identity::short_hash`), its plan.
    pub key_plans: std::collections::HashMap<String, u8>,
    /// API-key metadata: per key hash, its billing day (1-31).
    pub key_days: std::collections::HashMap<String, u8>,
    /// The claim holding a token's billing day (`identity.billing_day`).
    pub billing_day: Option<Arc<str>>,
    /// Keep a verified token's claims for the limits that read a cost.
    pub keep_claims: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnInvalid {
    /// Treated as anonymous (limited by IP).
    Anonymous,
    /// Answered with 401.
    Reject,
}

pub struct JwtConfig {
    pub keys: JwtKeys,
    /// Algorithms, exp/nbf with leeway, issuer and audience.
    pub validation: jsonwebtoken::Validation,
    /// The claim holding the user id (default `sub`).
    pub claim: String,
    pub source: TokenSource,
}

impl std::fmt::Debug for JwtConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtConfig")
            .field("claim", &self.claim)
            .field("source", &self.source)
            .finish()
    }
}

/// Verification keys; the secret itself is never printed.
pub enum JwtKeys {
    /// One key for every token (HMAC secret or a PEM public key).
    Single(jsonwebtoken::DecodingKey),
    /// Keys by `kid` from a JWKS file; a token without `kid` may use the
    /// only key when there is exactly one.
    Set(Vec<(Option<String>, jsonwebtoken::DecodingKey)>),
}

/// Where the token is read from.
#[derive(Debug, Clone)]
pub enum TokenSource {
    /// A header carrying the token, with or without a `Bearer ` prefix
    /// (default `Authorization`).
    Header(http::HeaderName),
    Cookie(String),
}

/// Tier 1: a coarse per-key zone with nginx `limit_req` / `limit_conn`
/// semantics, applied before route limits.
#[derive(Debug, Clone)]
pub struct ZoneConfig {
    /// The engine's view: name, leaky-bucket algorithm, store partition.
    pub limit: crate::limiter::Limit,
    pub key: KeyKind,
    /// 429 by default; 503 to mimic nginx.
    pub status: StatusCode,
    pub dry_run: bool,
    /// Concurrent requests per key (`limit_conn`).
    pub max_conn: Option<u32>,
    /// `max_conn` shared through Redis, each slot leased this long (ms).
    pub max_conn_lease: Option<u64>,
    /// As written (`10r/s`), for messages.
    pub rate_text: Arc<str>,
    /// Per plan (indexed like `identity.plans.names`): other numbers.
    pub plans: Vec<Option<crate::limiter::Limit>>,
    pub penalty: Option<Arc<super::penalty::Penalty>>,
}

/// Tier 2: one named limit on a route.
#[derive(Debug, Clone)]
pub struct RouteLimit {
    pub limit: crate::limiter::Limit,
    pub key: KeyKind,
    /// The cost reserved: a fixed one, or the default of `cost_from`.
    pub cost: u64,
    pub cost_from: Option<CostFrom>,
    /// Per plan (indexed like `identity.plans.names`): other numbers.
    pub plans: Vec<Option<crate::limiter::Limit>>,
    pub settle: Option<Settle>,
    /// A monthly quota from each key's billing day (`anchor: billing_day`).
    pub billing_day: bool,
    pub penalty: Option<Arc<super::penalty::Penalty>>,
    pub dry_run: bool,
    /// Charge only responses with these statuses (checked before, charged after).
    pub count_status: Option<Vec<u16>>,
    /// "5 requests per 60s", for the 429 detail.
    pub description: Arc<str>,
    /// What its quota counts: `requests`, or `units` for a limit with
    /// costs.
    pub unit: &'static str,
}

/// Which rate-limit headers a route's responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderStyle {
    pub legacy: bool,
    pub ietf: bool,
    /// `X-RateLimit-Reset` as a Unix time instead of seconds from now.
    pub reset_epoch: bool,
}

/// Webhook sources and signatures for one route.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Clients in these ranges skip the limits on this route.
    pub allow_sources: Vec<ipnet::IpNet>,
    /// Everyone else gets 403.
    pub only_allowed: bool,
    pub verify: Option<VerifyConfig>,
}

#[derive(Clone)]
pub struct VerifyConfig {
    pub scheme: VerifyScheme,
    pub secret: Vec<u8>,
    /// The signature header (defaults per scheme).
    pub header: http::HeaderName,
    /// Stripe: how old a signed timestamp may be.
    pub tolerance: Duration,
}

impl std::fmt::Debug for VerifyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyConfig")
            .field("scheme", &self.scheme)
            .field("header", &self.header)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyScheme {
    /// `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`.
    Github,
    /// `Stripe-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "t.body">`.
    Stripe,
    /// A header holding the hex HMAC-SHA256 of the body.
    HmacSha256,
}

/// Requests that skip every limit (they are still proxied and logged).
#[derive(Debug, Clone, Default)]
pub struct BypassConfig {
    /// Exact, normalised paths such as `/health`.
    pub paths: Vec<String>,
    /// SHA-256 of each accepted token: the tokens themselves are not kept.
    pub token_hashes: Vec<[u8; 32]>,
    pub header: Option<http::HeaderName>,
    pub sources: Vec<ipnet::IpNet>,
}

/// Which bucket a limit counts a request in (see `pipeline::key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind {
    Ip,
    User,
    UserOrIp,
    Header(http::HeaderName),
    Global,
}

impl std::str::FromStr for KeyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ip" => Ok(KeyKind::Ip),
            "user" => Ok(KeyKind::User),
            "user_or_ip" => Ok(KeyKind::UserOrIp),
            "global" => Ok(KeyKind::Global),
            _ => match s.strip_prefix("header:") {
                Some(name) => http::HeaderName::from_bytes(name.trim().as_bytes())
                    .map(KeyKind::Header)
                    .map_err(|_| format!("\"{name}\" is not a valid header name")),
                None => Err(format!(
                    "expected ip, user, user_or_ip, header:<name> or global, got \"{s}\""
                )),
            },
        }
    }
}

impl KeyKind {
    /// Whether the key depends on the verified identity (so a limit with
    /// it is decided after the identity stage).
    pub fn needs_identity(&self) -> bool {
        matches!(self, KeyKind::User | KeyKind::UserOrIp)
    }
}
