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

use std::collections::BTreeMap;
use std::fmt::Write;

use super::reader::{Directive, Place};

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
    "proxy_next_upstream",
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
    "resolver",
    "resolver_timeout",
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
    connect_timeout: Option<String>,
    read_timeout: Option<String>,
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

struct Route {
    name: String,
    host: Option<String>,
    exact: bool,
    path: String,
    action: String,
    zones: Vec<String>,
    body_size: Option<String>,
    webhook: Option<(Vec<String>, bool)>,
    comments: Vec<String>,
}

#[derive(Default)]
struct Upstream {
    targets: Vec<String>,
    tls: bool,
    keepalive: Option<String>,
    connect_timeout: Option<String>,
    read_timeout: Option<String>,
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
    server: BTreeMap<&'static str, String>,
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
            "ssl_session_tickets" => inh.session_tickets = Some(arg(0) == "on"),
            "allow" | "deny" => inh.allow.push((d.name.clone(), arg(0), d.at.clone())),
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
            "client_header_timeout" => {
                self.server.insert("header_read_timeout", duration(&arg(0)));
            }
            "client_body_timeout" => {
                self.server.insert("body_read_timeout", duration(&arg(0)));
            }
            "keepalive_timeout" => {
                self.server.insert("idle_timeout", duration(&arg(0)));
            }
            "large_client_header_buffers" => {
                let n: u64 = arg(0).parse().unwrap_or(4);
                let each = crate::config::units::parse_size(&arg(1)).unwrap_or(8 << 10);
                self.server
                    .insert("max_header_size", format!("{}KB", n * each / 1024));
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
fn duration(v: &str) -> String {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        format!("{v}s")
    } else {
        v.to_owned()
    }
}

/// nginx size (`10m`, `8k`, `1024`) as tollgate writes it.
fn size(v: &str) -> String {
    let lower = v.to_ascii_lowercase();
    match lower.chars().last() {
        Some('k') | Some('m') | Some('g') => format!("{}B", lower.to_ascii_uppercase()),
        _ => v.to_owned(),
    }
}

fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
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
    let yaml = render(&mut out);
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
            ("upstream", Some(b)) => upstream(d, b, out),
            ("server", Some(_)) => {}
            _ => out.other(d, "http"),
        }
    }
    if let Some(b) = &inh.body_size {
        out.server.insert("max_body_size", b.clone());
    }
    for d in block {
        if let ("server", Some(b)) = (d.name.as_str(), &d.block) {
            server(d, b, out, inh.clone());
        }
    }
}

fn upstream(d: &Directive, block: &[Directive], out: &mut Out) {
    let name = d.args.first().cloned().unwrap_or_default();
    let mut u = Upstream::default();
    for s in block {
        match s.name.as_str() {
            "server" => {
                let target = s.args.first().cloned().unwrap_or_default();
                if target.starts_with("unix:") {
                    out.note(
                        &s.at,
                        Severity::Lost,
                        "tollgate reaches upstreams over TCP only",
                    );
                    continue;
                }
                let has_port = target
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.ends_with(':') && p.parse::<u16>().is_ok());
                u.targets.push(if has_port {
                    target
                } else {
                    format!("{target}:80")
                });
                for p in &s.args[1..] {
                    let what = p.split('=').next().unwrap_or(p);
                    let why = match what {
                        "weight" => "tollgate balances round robin with equal weights",
                        "backup" => "tollgate has no backup targets: this one takes traffic like the others",
                        "down" => "a target marked down is still used",
                        "max_fails" | "fail_timeout" => "tollgate puts a target that refused a connection in cool-down (upstreams.<name>.cooldown) instead",
                        _ => "not translated",
                    };
                    out.note(
                        &s.at,
                        Severity::Skipped,
                        format!("upstream {name}: {p}: {why}"),
                    );
                }
            }
            "keepalive" => u.keepalive = s.args.first().cloned(),
            _ => out.note(
                &s.at,
                Severity::Skipped,
                format!(
                    "upstream {name}: {} is not translated (round robin)",
                    s.name
                ),
            ),
        }
    }
    out.upstreams.insert(name, u);
}

fn server(d: &Directive, block: &[Directive], out: &mut Out, inh: Inherited) {
    let mut names: Vec<String> = Vec::new();
    let mut binds: Vec<usize> = Vec::new();
    let mut cert: Option<String> = None;
    let mut key: Option<String> = None;
    let mut returns: Option<&Directive> = None;
    let mut marked_default = false;
    let mut own = inh.child();
    for s in block {
        if out.inheritable(s, &mut own) {
            continue;
        }
        match (s.name.as_str(), &s.block) {
            ("listen", None) => {
                if let Some(i) = listen(s, out) {
                    binds.push(i);
                    marked_default |= s
                        .args
                        .iter()
                        .any(|a| a == "default_server" || a == "default");
                }
            }
            ("server_name", None) => names.extend(s.args.iter().cloned()),
            ("ssl_certificate", None) => cert = s.args.first().cloned(),
            ("ssl_certificate_key", None) => key = s.args.first().cloned(),
            ("ssl", None) => {}
            ("location", Some(_)) => {}
            ("return", None) => returns = Some(s),
            _ => out.other(s, "server"),
        }
    }
    let merged = inh.under(own);
    if binds.is_empty() {
        binds.extend(listen_default(out));
    }
    if merged.session_tickets == Some(false) {
        for &i in &binds {
            out.listeners[i].session_tickets = false;
        }
    }
    if let (Some(c), Some(k)) = (&cert, &key) {
        for &i in &binds {
            if out.listeners[i].tls && !out.listeners[i].certs.contains(&(c.clone(), k.clone())) {
                out.listeners[i].certs.push((c.clone(), k.clone()));
            }
        }
    }
    // The server nginx gives requests for unknown hosts answers them here
    // too: its routes match any host (tollgate prefers routes with a
    // matching host, as nginx prefers a server with a matching name).
    let is_default = binds
        .iter()
        .any(|&i| marked_default || !out.listeners[i].has_default);
    for &i in &binds {
        out.listeners[i].has_default |= is_default;
    }
    let hosts = if is_default {
        vec![None]
    } else {
        hosts(&names, d, out)
    };
    let locations: Vec<&Directive> = block.iter().filter(|s| s.name == "location").collect();
    if locations.is_empty() {
        match returns {
            Some(r) => {
                let action = return_action(r, out);
                for host in &hosts {
                    add_route(out, host, false, "/", action.clone(), &merged, &r.at);
                }
            }
            None => out.note(
                &d.at,
                Severity::Lost,
                "a server without locations serves files from disk; tollgate does not",
            ),
        }
        return;
    }
    if let Some(r) = returns {
        out.note(
            &r.at,
            Severity::Lost,
            "a server-level return answers every location; not translated",
        );
    }
    for l in locations {
        location(l, &hosts, out, &merged);
    }
}

/// The route hosts of a server's names: `None` is the catch-all.
fn hosts(names: &[String], d: &Directive, out: &mut Out) -> Vec<Option<String>> {
    let mut hosts = Vec::new();
    for n in names {
        if n.is_empty() || n == "_" || n == "localhost" && names.len() == 1 {
            hosts.push(None);
        } else if n.starts_with('~') {
            out.note(
                &d.at,
                Severity::Lost,
                format!("regex server_name {n} is not translated"),
            );
        } else if let Some(rest) = n.strip_prefix('.') {
            hosts.push(Some(rest.to_owned()));
            hosts.push(Some(format!("*.{rest}")));
        } else {
            hosts.push(Some(n.clone()));
        }
    }
    if hosts.is_empty() {
        hosts.push(None);
    }
    hosts.dedup();
    hosts
}

/// Adds (or finds) the listener of a `listen` directive.
fn listen(d: &Directive, out: &mut Out) -> Option<usize> {
    let addr = d.args.first()?;
    if addr.starts_with("unix:") {
        out.note(&d.at, Severity::Lost, "tollgate listens on TCP only");
        return None;
    }
    let bind = if addr.bytes().all(|b| b.is_ascii_digit()) {
        format!("0.0.0.0:{addr}")
    } else if let Some(port) = addr.strip_prefix("*:") {
        format!("0.0.0.0:{port}")
    } else if (addr.starts_with('[') && !addr.contains("]:")) || !addr.contains(':') {
        format!("{addr}:80")
    } else {
        addr.clone()
    };
    let tls = d.args.iter().any(|a| a == "ssl");
    let proxy_protocol = d.args.iter().any(|a| a == "proxy_protocol");
    for a in &d.args[1..] {
        if ![
            "ssl",
            "http2",
            "proxy_protocol",
            "default_server",
            "default",
            "reuseport",
            "ipv6only=on",
            "ipv6only=off",
        ]
        .contains(&a.as_str())
            && !a.starts_with("backlog=")
        {
            out.note(
                &d.at,
                Severity::Skipped,
                format!("listen parameter {a} is not translated"),
            );
        }
    }
    if let Some(i) = out.listeners.iter().position(|l| l.bind == bind) {
        if out.listeners[i].tls != tls || out.listeners[i].proxy_protocol != proxy_protocol {
            out.note(
                &d.at,
                Severity::Lost,
                format!("{bind} is listened on with different ssl / proxy_protocol settings"),
            );
        }
        return Some(i);
    }
    out.listeners.push(Listener {
        bind,
        tls,
        proxy_protocol,
        certs: Vec::new(),
        session_tickets: true,
        has_default: false,
    });
    Some(out.listeners.len() - 1)
}

fn listen_default(out: &mut Out) -> Option<usize> {
    let d = Directive {
        name: "listen".into(),
        args: vec!["80".into()],
        block: None,
        at: Place {
            file: std::sync::Arc::from(std::path::Path::new("-")),
            line: 0,
        },
    };
    listen(&d, out)
}

fn return_action(r: &Directive, out: &mut Out) -> Option<String> {
    let code = r.args.first().cloned().unwrap_or_default();
    let text = r.args.get(1).cloned();
    if !code.bytes().all(|b| b.is_ascii_digit()) {
        // `return URL`: a 302.
        return redirect("302", &code, r, out);
    }
    match code.as_str() {
        "301" | "302" | "303" | "307" | "308" => {
            redirect(&code, text.as_deref().unwrap_or(""), r, out)
        }
        _ => {
            if text.as_deref().is_some_and(|t| t.contains('$')) {
                out.note(
                    &r.at,
                    Severity::Lost,
                    "a return body with variables is not translated",
                );
                return None;
            }
            let body = text
                .map(|t| format!(", body: {}", q(&t)))
                .unwrap_or_default();
            Some(format!("respond: {{ status: {code}{body} }}"))
        }
    }
}

fn redirect(code: &str, url: &str, r: &Directive, out: &mut Out) -> Option<String> {
    if url.contains('$') {
        out.note(
            &r.at,
            Severity::Lost,
            format!("redirect to {url}: tollgate answers fixed redirects only (no variables)"),
        );
        return None;
    }
    Some(format!(
        "respond: {{ status: {code}, headers: {{ location: {} }} }}",
        q(url)
    ))
}

fn location(l: &Directive, hosts: &[Option<String>], out: &mut Out, parent: &Inherited) {
    let Some(block) = &l.block else { return };
    let (exact, path) = match l.args.as_slice() {
        [m, p] if m == "=" => (true, p.clone()),
        [m, p] if m == "^~" => (false, p.clone()),
        [m, _] if m == "~" || m == "~*" => {
            let limited = block.iter().any(|d| d.name.starts_with("limit_"));
            let what = if limited {
                "a regex location with limits"
            } else {
                "a regex location"
            };
            out.note(
                &l.at,
                Severity::Lost,
                format!(
                    "{what} ({}) is not translated: tollgate matches exact paths and prefixes",
                    l.args.join(" ")
                ),
            );
            return;
        }
        [p] if p.starts_with('@') => {
            out.note(
                &l.at,
                Severity::Skipped,
                format!("named location {p} is not translated"),
            );
            return;
        }
        [p] => (false, p.clone()),
        _ => {
            out.note(
                &l.at,
                Severity::Lost,
                format!("location {} is not translated", l.args.join(" ")),
            );
            return;
        }
    };
    let mut own = parent.child();
    let mut action: Option<Option<String>> = None;
    let mut upstream_used: Option<String> = None;
    let mut comments = Vec::new();
    let notes_before = out.notes.len();
    for d in block {
        if out.inheritable(d, &mut own) {
            continue;
        }
        match (d.name.as_str(), &d.block) {
            ("proxy_pass", None) => {
                let found = proxy_pass(d, out);
                upstream_used = found.as_ref().map(|(_, u)| u.clone());
                action = Some(found.map(|(a, _)| a));
            }
            ("return", None) => action = Some(return_action(d, out)),
            ("location", Some(_)) => {}
            _ => out.other(d, &format!("location {path}")),
        }
    }
    let merged = parent.under(own);
    for n in &out.notes[notes_before..] {
        comments.push(format!("{}: {}", n.at, n.message));
    }
    // proxy_*_timeout are per location in nginx, per upstream here: the
    // first location's values are the upstream's.
    if let Some(u) = upstream_used.and_then(|u| out.upstreams.get_mut(&u)) {
        if u.connect_timeout.is_none() {
            u.connect_timeout = merged.connect_timeout.clone();
        }
        if u.read_timeout.is_none() {
            u.read_timeout = merged.read_timeout.clone();
        }
    }
    match action {
        Some(Some(a)) => {
            for host in hosts {
                let before = out.routes.len();
                add_route(out, host, exact, &path, Some(a.clone()), &merged, &l.at);
                if let Some(r) = out.routes.get_mut(before) {
                    r.comments.extend(comments.iter().cloned());
                }
            }
        }
        Some(None) => {}
        None => {
            if !block.iter().any(|d| d.name == "location") {
                out.note(&l.at, Severity::Lost, format!("location {path} has no proxy_pass or return: it serves files from disk, which tollgate does not"));
            }
        }
    }
    for inner in block.iter().filter(|d| d.name == "location") {
        location(inner, hosts, out, &merged);
    }
}

/// The route action and the upstream's name.
fn proxy_pass(d: &Directive, out: &mut Out) -> Option<(String, String)> {
    let url = d.args.first().cloned().unwrap_or_default();
    if url.contains('$') {
        out.note(
            &d.at,
            Severity::Lost,
            format!("proxy_pass {url}: variables are not translated"),
        );
        return None;
    }
    let (tls, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
        (Some(r), _) => (false, r),
        (_, Some(r)) => (true, r),
        _ => {
            out.note(
                &d.at,
                Severity::Lost,
                format!("proxy_pass {url} is not translated"),
            );
            return None;
        }
    };
    let (authority, uri) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if !uri.is_empty() {
        out.note(&d.at, Severity::Lost, format!("proxy_pass {url} replaces the matched prefix with {uri}; tollgate forwards the path as it is"));
    }
    if out.upstreams.contains_key(authority) {
        if tls {
            if let Some(u) = out.upstreams.get_mut(authority) {
                u.tls = true;
            }
        }
        return Some((format!("upstream: {}", q(authority)), authority.to_owned()));
    }
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok());
    let target = if has_port {
        authority.to_owned()
    } else {
        format!("{authority}:{}", if tls { 443 } else { 80 })
    };
    let name: String = target
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let u = out.upstreams.entry(name.clone()).or_default();
    if u.targets.is_empty() {
        u.targets.push(target);
        u.tls = tls;
    }
    Some((format!("upstream: {}", q(&name)), name))
}

fn add_route(
    out: &mut Out,
    host: &Option<String>,
    exact: bool,
    path: &str,
    action: Option<String>,
    inh: &Inherited,
    at: &Place,
) {
    let Some(action) = action else { return };
    if let Some(other) = out
        .routes
        .iter()
        .find(|r| r.host == *host && r.exact == exact && r.path == path)
    {
        let message = format!(
            "location {path} for host {} is already answered by route {} (servers on other listeners?): tollgate routes by host and path, not by listener",
            host.as_deref().unwrap_or("(any)"),
            other.name
        );
        out.note(at, Severity::Lost, message);
        return;
    }
    let mut zones = Vec::new();
    let status = inh
        .req_status
        .clone()
        .unwrap_or_else(|| NGINX_STATUS.into());
    for (args, place) in inh.limit_req.iter().flatten() {
        let named = |p: &str| {
            args.iter()
                .find_map(|a| a.strip_prefix(p))
                .map(str::to_owned)
        };
        let Some(zone) = named("zone=") else {
            out.note(place, Severity::Lost, "limit_req without zone=");
            continue;
        };
        let u = Use {
            burst: named("burst=").and_then(|b| b.parse().ok()).unwrap_or(0),
            delay: if args.iter().any(|a| a == "nodelay") {
                None
            } else {
                Some(named("delay=").and_then(|b| b.parse().ok()).unwrap_or(0))
            },
            status: status.clone(),
            dry_run: inh.dry_run.unwrap_or(false),
        };
        match out.req_zones.get(&zone) {
            None => {
                out.note(
                    place,
                    Severity::Lost,
                    format!("limit_req zone={zone}: no limit_req_zone defines it"),
                );
                continue;
            }
            // Reported once, with the zone (a route cannot list it).
            Some(z) if z.key.is_err() => {
                out.used.entry(zone.clone()).or_insert((u, place.clone()));
                continue;
            }
            Some(_) => {}
        }
        match out.used.get(&zone) {
            Some((first, first_at)) if *first != u => {
                let message = format!(
                    "zone {zone} is used here with other settings than at {first_at} (burst, delay, status or dry run); a tollgate zone has one of each: this location uses the first"
                );
                out.note(place, Severity::Lost, message);
            }
            Some(_) => {}
            None => {
                out.used.insert(zone.clone(), (u, place.clone()));
            }
        }
        zones.push(zone);
    }
    let conn_status = inh
        .conn_status
        .clone()
        .unwrap_or_else(|| NGINX_STATUS.into());
    for (zone, n, place) in inh.limit_conn.iter().flatten() {
        match out.conn_zones.get(zone) {
            None => {
                out.note(
                    place,
                    Severity::Lost,
                    format!("limit_conn {zone}: no limit_conn_zone defines it"),
                );
                continue;
            }
            Some(z) if z.key.is_err() => {
                let first = (n.parse().unwrap_or(1), conn_status.clone(), place.clone());
                out.conn_used.entry(zone.clone()).or_insert(first);
                continue;
            }
            Some(_) => {}
        }
        let n: u32 = n.parse().unwrap_or(1);
        match out.conn_used.get(zone) {
            Some((m, s, first_at)) if (*m, s.as_str()) != (n, conn_status.as_str()) => {
                let message = format!("limit_conn {zone} is used here with another number or status than at {first_at}; this location uses the first");
                out.note(place, Severity::Lost, message);
            }
            Some(_) => {}
            None => {
                out.conn_used
                    .insert(zone.clone(), (n, conn_status.clone(), place.clone()));
            }
        }
        zones.push(format!("{zone}_conn"));
    }
    // nginx runs `return` in its rewrite phase, before allow / deny: they
    // never apply to a location that returns.
    let webhook = if action.starts_with("respond:") {
        if let Some((_, _, place)) = inh.allow.first() {
            let message = "allow / deny have no effect where nginx answers with return (its rewrite phase runs before access checks); not translated";
            out.note(place, Severity::Skipped, message);
        }
        None
    } else {
        allow_deny(inh, !zones.is_empty(), out)
    };
    let base = if exact {
        path.to_owned()
    } else {
        path.trim_end_matches('/').to_owned()
    };
    let mut name: String = base
        .trim_start_matches('/')
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    if name.is_empty() {
        name = "root".into();
    }
    if exact {
        name.push_str("-exact");
    }
    if let Some(h) = host {
        name = format!("{}-{name}", h.replace('*', "any").replace('.', "-"));
    }
    let mut unique = name.clone();
    let mut i = 2;
    while out.routes.iter().any(|r| r.name == unique) {
        unique = format!("{name}-{i}");
        i += 1;
    }
    out.routes.push(Route {
        name: unique,
        host: host.clone(),
        exact,
        path: path.to_owned(),
        action,
        zones,
        body_size: inh.body_size.clone(),
        webhook,
        comments: Vec::new(),
    });
}

/// `allow` / `deny` as webhook sources, when the meaning is the same:
/// `allow <nets>; deny all;` on a location without limits.
fn allow_deny(inh: &Inherited, limited: bool, out: &mut Out) -> Option<(Vec<String>, bool)> {
    if inh.allow.is_empty() {
        return None;
    }
    let at = inh.allow[0].2.clone();
    let (last, allows) = inh.allow.split_last()?;
    let shape = allows.iter().all(|(k, _, _)| k == "allow") && last.0 == "deny" && last.1 == "all";
    if !shape {
        out.note(
            &at,
            Severity::Lost,
            "allow / deny other than \"allow ...; deny all;\" is not translated",
        );
        return None;
    }
    if limited {
        out.note(&at, Severity::Lost, "allow / deny on a limited location: tollgate's allow_sources also skip the limits, which nginx does not");
        return None;
    }
    Some((allows.iter().map(|(_, net, _)| net.clone()).collect(), true))
}

/// A zone's key kind, or `None` with the reason noted (once per zone).
fn usable_key(key: &Result<String, String>, at: &Place, notes: &mut Vec<Note>) -> Option<String> {
    match key {
        Ok(k) => Some(k.clone()),
        Err(why) => {
            notes.push(Note {
                at: at.clone(),
                severity: Severity::Lost,
                message: why.clone(),
            });
            None
        }
    }
}

fn render(out: &mut Out) -> String {
    let mut y = String::new();
    let _ = writeln!(
        y,
        "# Written by tollgate import-nginx. Check it with: tollgate check --config <this file>"
    );
    let _ = writeln!(
        y,
        "# Notes (not translated) are listed where they apply, and all together on stderr."
    );
    let _ = writeln!(y, "listeners:");
    if out.listeners.is_empty() {
        listen_default(out);
    }
    for (i, l) in out.listeners.iter().enumerate() {
        let port = l.bind.rsplit(':').next().unwrap_or("0");
        let _ = write!(
            y,
            "  - {{ name: {}, bind: {}",
            q(&format!("port{port}-{i}")),
            q(&l.bind)
        );
        if l.proxy_protocol {
            let _ = write!(y, ", proxy_protocol: true");
        }
        if l.tls {
            let certs: Vec<String> = l
                .certs
                .iter()
                .map(|(c, k)| format!("{{ cert: {}, key: {} }}", q(c), q(k)))
                .collect();
            let tickets = if l.session_tickets {
                ""
            } else {
                ", session_tickets: false"
            };
            let _ = write!(y, ", tls: {{ certs: [{}]{tickets} }}", certs.join(", "));
        }
        let _ = writeln!(y, " }}");
    }
    if !out.server.contains_key("max_body_size") {
        out.server.insert("max_body_size", size(NGINX_BODY));
    }
    let _ = writeln!(y, "server:");
    for (k, v) in &out.server {
        let _ = writeln!(y, "  {k}: {}", q(v));
    }
    if !out.trusted.is_empty() || out.real_ip_header.is_some() {
        let _ = writeln!(y, "client_ip:");
        let nets: Vec<String> = out.trusted.iter().map(|t| q(t)).collect();
        let _ = writeln!(y, "  trusted_proxies: [{}]", nets.join(", "));
        let header = out
            .real_ip_header
            .clone()
            .unwrap_or_else(|| "x-real-ip".into());
        let _ = writeln!(y, "  headers: [{header}]");
    }
    let mut zones = Vec::new();
    for (name, (u, at)) in &out.used {
        let Some(z) = out.req_zones.get(name) else {
            continue;
        };
        let Some(key) = usable_key(&z.key, &z.at, &mut out.notes) else {
            continue;
        };
        let delay = match u.delay {
            None => ", nodelay: true".to_owned(),
            Some(0) => String::new(),
            Some(d) => format!(", delay: {d}"),
        };
        let dry = if u.dry_run { ", dry_run: true" } else { "" };
        zones.push(format!(
            "  - {{ name: {}, rate: {}, burst: {}{delay}, status: {}, key: {}, size: {}{dry} }}   # {} and {}",
            q(name), q(&z.rate), u.burst, u.status, q(&key), q(&z.size), z.at, at
        ));
    }
    for (name, (n, status, at)) in &out.conn_used {
        let Some(z) = out.conn_zones.get(name) else {
            continue;
        };
        let Some(key) = usable_key(&z.key, &z.at, &mut out.notes) else {
            continue;
        };
        zones.push(format!(
            "  - {{ name: {}, rate: \"1000000r/s\", burst: 1000000, nodelay: true, max_conn: {n}, status: {status}, key: {}, size: {} }}   # limit_conn only (the rate never limits): {} and {}",
            q(&format!("{name}_conn")), q(&key), q(&z.size), z.at, at
        ));
    }
    if !zones.is_empty() {
        let _ = writeln!(y, "zones:");
        for z in zones {
            let _ = writeln!(y, "{z}");
        }
    }
    if !out.upstreams.is_empty() {
        let _ = writeln!(y, "upstreams:");
        for (name, u) in &out.upstreams {
            let targets: Vec<String> = u.targets.iter().map(|t| q(t)).collect();
            let _ = write!(y, "  {}: {{ targets: [{}]", q(name), targets.join(", "));
            if let Some(k) = &u.keepalive {
                let _ = write!(y, ", max_idle_per_target: {k}");
            }
            if let Some(t) = &u.connect_timeout {
                let _ = write!(y, ", connect_timeout: {}", q(t));
            }
            if let Some(t) = &u.read_timeout {
                let _ = write!(y, ", timeout: {}", q(t));
            }
            if u.tls {
                let _ = write!(y, ", tls: {{}}");
            }
            let _ = writeln!(y, " }}");
        }
    }
    let _ = writeln!(y, "routes:");
    for r in &out.routes {
        for c in &r.comments {
            let _ = writeln!(y, "  # {c}");
        }
        let key = if r.exact { "path" } else { "path_prefix" };
        let host = r
            .host
            .as_ref()
            .map(|h| format!(", host: {}", q(h)))
            .unwrap_or_default();
        let _ = writeln!(y, "  - name: {}", q(&r.name));
        let _ = writeln!(y, "    match: {{ {key}: {}{host} }}", q(&r.path));
        let _ = writeln!(y, "    {}", r.action);
        let zones: Vec<String> = r.zones.iter().map(|z| q(z)).collect();
        let _ = writeln!(y, "    zones: [{}]", zones.join(", "));
        if let Some(b) = r
            .body_size
            .as_ref()
            .filter(|b| out.server.get("max_body_size") != Some(b))
        {
            let _ = writeln!(y, "    max_body_size: {}", q(b));
        }
        if let Some((nets, only)) = &r.webhook {
            let nets: Vec<String> = nets.iter().map(|n| q(n)).collect();
            let _ = writeln!(y, "    allow_sources: [{}]", nets.join(", "));
            let _ = writeln!(y, "    only_allowed_sources: {only}");
        }
    }
    let mut lost: Vec<&Note> = out
        .notes
        .iter()
        .filter(|n| n.severity == Severity::Lost)
        .collect();
    lost.sort_by(|a, b| (&a.at.file, a.at.line).cmp(&(&b.at.file, b.at.line)));
    if !lost.is_empty() {
        let _ = writeln!(
            y,
            "# NOT EQUIVALENT: these change who is limited, how, or where requests go:"
        );
        for n in lost {
            let _ = writeln!(y, "#   {}: {}", n.at, n.message);
        }
    }
    y
}
