//! nginx directives -> tollgate YAML, saying what was not translated.
//!
//! nginx locations become routes (`=` exact, prefix and `^~` prefix; regex
//! locations are reported, never guessed); `server_name`s become route
//! hosts; `listen`s become listeners; `limit_req_zone` + `limit_req`
//! become zones that each route lists (`zones: [...]`, as nginx applies to
//! a location only the `limit_req` it has or inherits); `limit_conn`
//! becomes a zone's `max_conn`; the real-IP module becomes `client_ip`.
//!
//! What is not translated is a [`Note`]: [`Severity::Lost`] when it changes
//! who is limited or how, the client's address, or where a request goes
//! (the import exits 2), [`Severity::Skipped`] otherwise.

mod render;
mod route;
mod server;
mod upstream;

pub(crate) use render::{without_nulls, yaml_safe};

use std::collections::BTreeMap;

use super::reader::{Directive, Place};
use crate::config::raw::{RawRespond, RawServer, RawTarget, Text};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Not translated, and nothing about limiting, real IP or routing
    /// depends on it.
    Skipped,
    /// Not translated, and it changes who is limited, how, the client's
    /// address or routing: the result is not equivalent.
    Lost,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub at: Place,
    pub severity: Severity,
    pub message: String,
}

/// The YAML and what it says about the nginx config.
#[derive(Debug)]
pub struct Import {
    pub yaml: String,
    pub notes: Vec<Note>,
}

impl Import {
    /// Whether something that changes limiting, real IP or routing was not
    /// translated.
    pub fn lost(&self) -> bool {
        self.notes.iter().any(|n| n.severity == Severity::Lost)
    }
}

/// nginx's `limit_req_status` / `limit_conn_status` default.
const NGINX_STATUS: &str = "503";
/// nginx's `client_max_body_size` default.
const NGINX_BODY: &str = "1m";

/// Directives that change nothing about limiting, real IP or routing and
/// that tollgate has no use for (or does by itself).
const HARMLESS: &[&str] = &[
    "user",
    "worker_processes",
    "worker_rlimit_nofile",
    "pid",
    "error_log",
    "access_log",
    "log_format",
    "events",
    "worker_connections",
    "multi_accept",
    "use",
    "include_mime",
    "types",
    "default_type",
    "sendfile",
    "tcp_nopush",
    "tcp_nodelay",
    "gzip",
    "gzip_types",
    "gzip_min_length",
    "gzip_proxied",
    "gzip_comp_level",
    "gzip_vary",
    "server_tokens",
    "charset",
    "proxy_set_header",
    "proxy_http_version",
    "proxy_buffering",
    "proxy_buffers",
    "proxy_buffer_size",
    "proxy_redirect",
    "proxy_send_timeout",
    "ssl_protocols",
    "ssl_ciphers",
    "ssl_prefer_server_ciphers",
    "ssl_session_cache",
    "ssl_session_timeout",
    "ssl_stapling",
    "ssl_stapling_verify",
    "ssl_dhparam",
    "ssl_ecdh_curve",
    "add_header",
    "expires",
    "etag",
    "keepalive_requests",
    "send_timeout",
    "reset_timedout_connection",
    "limit_req_log_level",
    "limit_conn_log_level",
    "server_names_hash_bucket_size",
    "client_body_buffer_size",
    "client_header_buffer_size",
    "open_file_cache",
    "http2",
    "proxy_hide_header",
    "proxy_pass_header",
    "proxy_intercept_errors",
    "error_page",
    "ssl_trusted_certificate",
    "ignore_invalid_headers",
    "underscores_in_headers",
];

/// Directives that decide routing or limiting in ways tollgate cannot
/// express.
const ROUTING: &[&str] = &[
    "rewrite",
    "try_files",
    "if",
    "root",
    "alias",
    "index",
    "autoindex",
    "internal",
    "proxy_cache",
    "split_clients",
    "auth_request",
    "limit_except",
];

struct ReqZone {
    key: Result<String, String>,
    rate: String,
    size: String,
    at: Place,
}

struct ConnZone {
    key: Result<String, String>,
    size: String,
    at: Place,
}

/// A zone as one location applies it.
#[derive(Debug, Clone, PartialEq)]
struct Use {
    burst: u64,
    /// `None`: nodelay; `Some(n)`: the first n excess requests pass at once.
    delay: Option<u64>,
    status: String,
    dry_run: bool,
}

/// What a level (http, server, location) sets for the levels inside it.
#[derive(Clone, Default)]
struct Inherited {
    /// `limit_req zone=... burst=... [nodelay|delay=N]`, as given.
    limit_req: Option<Vec<(Vec<String>, Place)>>,
    limit_conn: Option<Vec<(String, String, Place)>>,
    req_status: Option<String>,
    conn_status: Option<String>,
    dry_run: Option<bool>,
    body_size: Option<String>,
    connect_timeout: Option<Text>,
    read_timeout: Option<Text>,
    /// `proxy_next_upstream`, `_tries`, `_timeout`; then `grpc_`'s.
    next: [crate::config::raw::RawNextUpstream; 2],
    allow: Vec<(String, String, Place)>,
    /// `ssl_session_tickets on|off`.
    session_tickets: Option<bool>,
}

impl Inherited {
    /// What a level inside this one starts from: everything but the
    /// array-like directives (`limit_req`, `limit_conn`, `allow` / `deny`),
    /// which nginx inherits only when the inner level has none of its own.
    fn child(&self) -> Inherited {
        Inherited {
            limit_req: None,
            limit_conn: None,
            allow: Vec::new(),
            ..self.clone()
        }
    }

    /// The inner level `own` as it applies: its array-like directives, or
    /// when it has none, this level's.
    fn under(&self, own: Inherited) -> Inherited {
        Inherited {
            limit_req: own.limit_req.clone().or(self.limit_req.clone()),
            limit_conn: own.limit_conn.clone().or(self.limit_conn.clone()),
            allow: if own.allow.is_empty() {
                self.allow.clone()
            } else {
                own.allow.clone()
            },
            ..own
        }
    }
}

struct Listener {
    bind: String,
    tls: bool,
    proxy_protocol: bool,
    certs: Vec<(String, String)>,
    /// Cleared by a server on it with `ssl_session_tickets off` (tollgate
    /// sets it per listener, nginx per server).
    session_tickets: bool,
    /// Whether a server already answers requests for unknown hosts here
    /// (nginx: the first server of the address, or its default_server).
    has_default: bool,
}

/// What a route does with a request.
#[derive(Clone)]
enum Action {
    /// `proxy_pass`: forward to the upstream of this name.
    Upstream(String),
    /// `return`: answer from the config.
    Respond(RawRespond),
}

struct Route {
    name: String,
    host: Option<String>,
    exact: bool,
    path: String,
    action: Action,
    zones: Vec<String>,
    body_size: Option<String>,
    webhook: Option<(Vec<String>, bool)>,
    comments: Vec<String>,
}

#[derive(Default)]
struct Upstream {
    targets: Vec<RawTarget>,
    tls: bool,
    /// Reached by `grpc_pass`: HTTP/2.
    h2: bool,
    keepalive: Option<String>,
    keepalive_timeout: Option<Text>,
    connect_timeout: Option<Text>,
    read_timeout: Option<Text>,
    /// `least_conn`, `hash $x consistent`... in tollgate's words.
    balance: Option<String>,
    /// Its own `resolver` (nginx 1.27.3+), else the http level's.
    resolver: Option<crate::config::raw::RawResolver>,
    /// From the first location that proxies to it (`Some(None)`: nginx's
    /// defaults).
    next_upstream: Option<Option<crate::config::raw::RawNextUpstream>>,
    /// nginx Plus's `queue N timeout=T`.
    queue: Option<crate::config::raw::RawQueue>,
}

#[derive(Default)]
struct Out {
    notes: Vec<Note>,
    req_zones: BTreeMap<String, ReqZone>,
    conn_zones: BTreeMap<String, ConnZone>,
    /// Zones used, with how (first use wins; a different use is a note).
    used: BTreeMap<String, (Use, Place)>,
    conn_used: BTreeMap<String, (u32, String, Place)>,
    listeners: Vec<Listener>,
    upstreams: BTreeMap<String, Upstream>,
    routes: Vec<Route>,
    trusted: Vec<String>,
    real_ip_header: Option<String>,
    /// `resolver` and `resolver_timeout`, for upstreams with `resolve`.
    resolver: crate::config::raw::RawResolver,
    server: RawServer,
    /// Variables set by `map` / `geo` / `set`, and where.
    mapped: BTreeMap<String, Place>,
}

impl Out {
    fn note(&mut self, at: &Place, severity: Severity, message: impl Into<String>) {
        self.notes.push(Note {
            at: at.clone(),
            severity,
            message: message.into(),
        });
    }

    /// Handles a directive any level may carry (inherited settings);
    /// whether it was one.
    fn inheritable(&mut self, d: &Directive, inh: &mut Inherited) -> bool {
        let arg = |i: usize| d.args.get(i).cloned().unwrap_or_default();
        match d.name.as_str() {
            "limit_req" => inh
                .limit_req
                .get_or_insert_with(Vec::new)
                .push((d.args.clone(), d.at.clone())),
            "limit_conn" => {
                inh.limit_conn
                    .get_or_insert_with(Vec::new)
                    .push((arg(0), arg(1), d.at.clone()))
            }
            "limit_req_status" => inh.req_status = Some(arg(0)),
            "limit_conn_status" => inh.conn_status = Some(arg(0)),
            "limit_req_dry_run" => inh.dry_run = Some(arg(0) == "on"),
            "client_max_body_size" => inh.body_size = Some(size(&arg(0))),
            "proxy_connect_timeout" => inh.connect_timeout = Some(duration(&arg(0))),
            "proxy_read_timeout" => inh.read_timeout = Some(duration(&arg(0))),
            // [0] proxy_pass's, [1] grpc_pass's.
            "proxy_next_upstream" => inh.next[0].on = Some(d.args.clone()),
            "grpc_next_upstream" => inh.next[1].on = Some(d.args.clone()),
            "proxy_next_upstream_tries" => inh.next[0].tries = Some(Text(arg(0))),
            "grpc_next_upstream_tries" => inh.next[1].tries = Some(Text(arg(0))),
            "proxy_next_upstream_timeout" => inh.next[0].timeout = Some(duration(&arg(0))),
            "grpc_next_upstream_timeout" => inh.next[1].timeout = Some(duration(&arg(0))),
            "ssl_session_tickets" => inh.session_tickets = Some(arg(0) == "on"),
            "allow" | "deny" => inh.allow.push((d.name.clone(), arg(0), d.at.clone())),
            "resolver" | "resolver_timeout" => {
                if let Some(why) = upstream::resolver(d, &mut self.resolver) {
                    self.note(&d.at, Severity::Skipped, why);
                }
            }
            "set_real_ip_from" => {
                if arg(0).starts_with("unix:") {
                    self.note(
                        &d.at,
                        Severity::Skipped,
                        "unix sockets are not trusted proxies in tollgate",
                    );
                } else {
                    self.trusted.push(arg(0));
                }
            }
            "real_ip_header" => {
                let h = arg(0).to_ascii_lowercase();
                match h.as_str() {
                    "x-forwarded-for" | "x-real-ip" | "cf-connecting-ip" | "true-client-ip" => {
                        self.real_ip_header = Some(h)
                    }
                    "proxy_protocol" => self.note(
                        &d.at,
                        Severity::Skipped,
                        "the PROXY protocol address is used whenever a listener has proxy_protocol: true",
                    ),
                    other => self.note(
                        &d.at,
                        Severity::Lost,
                        format!("tollgate cannot take the client address from \"{other}\""),
                    ),
                }
            }
            "real_ip_recursive" => {
                if arg(0) != "on" {
                    self.note(
                        &d.at,
                        Severity::Skipped,
                        "tollgate always walks X-Forwarded-For past trusted proxies (real_ip_recursive on); with one proxy tier the client is the same",
                    );
                }
            }
            "client_header_timeout" => self.server.header_read_timeout = Some(duration(&arg(0))),
            "client_body_timeout" => self.server.body_read_timeout = Some(duration(&arg(0))),
            "keepalive_timeout" => self.server.idle_timeout = Some(duration(&arg(0))),
            "large_client_header_buffers" => {
                let n: u64 = arg(0).parse().unwrap_or(4);
                let each = crate::config::units::parse_size(&arg(1)).unwrap_or(8 << 10);
                self.server.max_header_size = Some(Text(format!("{}KB", n * each / 1024)));
            }
            _ => return false,
        }
        true
    }

    fn other(&mut self, d: &Directive, inside: &str) {
        let name = d.name.as_str();
        if ["map", "geo", "set"].contains(&name) {
            let var = if name == "set" {
                d.args.first()
            } else {
                d.args.get(1).or(d.args.first())
            };
            if let Some(v) = var {
                self.mapped.insert(v.clone(), d.at.clone());
            }
            self.note(
                &d.at,
                Severity::Skipped,
                format!("{name} is not translated (reported again where a limit uses it)"),
            );
        } else if ROUTING.contains(&name) {
            self.note(&d.at, Severity::Lost, format!("{name} in {inside} decides what a request gets; tollgate routes by host and path only"));
        } else if HARMLESS.contains(&name) {
            self.note(
                &d.at,
                Severity::Skipped,
                format!("{name}: nothing to translate"),
            );
        } else {
            self.note(
                &d.at,
                Severity::Skipped,
                format!("{name} in {inside} is not translated"),
            );
        }
    }
}

/// nginx duration (`60`, `60s`, `1m`, `500ms`) as tollgate writes it.
fn duration(v: &str) -> Text {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        Text(format!("{v}s"))
    } else {
        Text(v.to_owned())
    }
}

/// nginx size (`10m`, `8k`, `1024`) as tollgate writes it.
pub(crate) fn size(v: &str) -> String {
    let lower = v.to_ascii_lowercase();
    match lower.chars().last() {
        Some('k') | Some('m') | Some('g') => format!("{}B", lower.to_ascii_uppercase()),
        _ => v.to_owned(),
    }
}

/// The tollgate key kind for a `limit_req_zone` / `limit_conn_zone` key.
fn key_kind(key: &str, mapped: &BTreeMap<String, Place>) -> Result<String, String> {
    match key {
        "$binary_remote_addr" | "$remote_addr" => return Ok("ip".into()),
        "$server_name" | "$host" => return Ok("global".into()),
        _ => {}
    }
    if !key.contains('$') {
        return Ok("global".into());
    }
    if let Some(h) = key.strip_prefix("$http_") {
        if h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Ok(format!("header:{}", h.replace('_', "-")));
        }
    }
    if let Some(at) = mapped.get(key) {
        return Err(format!("key {key} comes from a map/geo/set at {at}; tollgate keys on ip, header:<name> or global"));
    }
    Err(format!(
        "key \"{key}\" is not one tollgate can key on (ip, header:<name>, global)"
    ))
}

/// Translates nginx's top-level directives.
pub fn translate(top: &[Directive]) -> Import {
    let mut out = Out::default();
    let mut inh = Inherited::default();
    // Zones and maps first: they may be declared after their use.
    collect_zones(top, &mut out);
    for d in top {
        match (d.name.as_str(), &d.block) {
            ("http", Some(block)) => http(block, &mut out, &mut inh),
            ("events", _) => {}
            _ if !out.inheritable(d, &mut inh) => out.other(d, "the main context"),
            _ => {}
        }
    }
    let yaml = render::yaml(&mut out);
    out.notes.sort_by_key(|n| (n.at.file.clone(), n.at.line));
    Import {
        yaml,
        notes: out.notes,
    }
}

fn collect_zones(ds: &[Directive], out: &mut Out) {
    for d in ds {
        if ["map", "geo"].contains(&d.name.as_str()) {
            if let Some(v) = d.args.last() {
                out.mapped.insert(v.clone(), d.at.clone());
            }
        }
        if let Some(b) = &d.block {
            collect_zones(b, out);
        }
    }
    for d in ds {
        let named = |prefix: &str| {
            d.args
                .iter()
                .find_map(|a| a.strip_prefix(prefix))
                .map(str::to_owned)
        };
        match d.name.as_str() {
            "limit_req_zone" | "limit_conn_zone" => {
                let key = d.args.first().cloned().unwrap_or_default();
                let Some(zone) = named("zone=") else {
                    out.note(
                        &d.at,
                        Severity::Lost,
                        format!("{} without zone=name:size", d.name),
                    );
                    continue;
                };
                let (name, sz) = zone.split_once(':').unwrap_or((&zone, "10m"));
                let key = key_kind(&key, &out.mapped);
                if d.name == "limit_req_zone" {
                    let rate = named("rate=").unwrap_or_default();
                    out.req_zones.insert(
                        name.to_owned(),
                        ReqZone {
                            key,
                            rate,
                            size: size(sz),
                            at: d.at.clone(),
                        },
                    );
                } else {
                    out.conn_zones.insert(
                        name.to_owned(),
                        ConnZone {
                            key,
                            size: size(sz),
                            at: d.at.clone(),
                        },
                    );
                }
            }
            _ => {}
        }
    }
}

fn http(block: &[Directive], out: &mut Out, inh: &mut Inherited) {
    for d in block {
        if out.inheritable(d, inh) {
            continue;
        }
        match (d.name.as_str(), &d.block) {
            ("limit_req_zone" | "limit_conn_zone", None) => {}
            ("map" | "geo", Some(_)) => out.other(d, "http"),
            ("upstream", Some(b)) => upstream::upstream(d, b, out),
            ("server", Some(_)) => {}
            _ => out.other(d, "http"),
        }
    }
    if let Some(b) = &inh.body_size {
        out.server.max_body_size = Some(Text(b.clone()));
    }
    for d in block {
        if let ("server", Some(b)) = (d.name.as_str(), &d.block) {
            server::server(d, b, out, inh.clone());
        }
    }
}
