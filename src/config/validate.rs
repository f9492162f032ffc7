//! Raw YAML types -> runtime `Config`, collecting every problem with its YAML
//! path instead of stopping at the first. Defaults live here, next to the
//! checks, and are repeated in `config.example.yaml`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Method, StatusCode};

use super::checker::Checker;
use super::compiled::*;
use super::raw::{RawConfig, RawRoute, RawUpstream};
use super::Problem;
use crate::listener::tls;
use crate::pipeline::upstream::client_tls;

pub const DEFAULT_ADMIN_BIND: &str = "127.0.0.1:9090";

pub fn validate(raw: RawConfig, mut problems: Vec<Problem>) -> Result<Config, Vec<Problem>> {
    let mut c = Checker {
        problems: std::mem::take(&mut problems),
    };

    let server = server(&mut c, &raw);
    let listeners = listeners(&mut c, &raw);
    let admin = admin(&mut c, &raw, &listeners);
    let (upstreams, index) = upstreams(&mut c, &raw.upstreams);
    let log = log(&mut c, &raw);
    let client_ip = super::client::client_ip(raw.client_ip.as_ref(), &mut c);
    let identity = super::client::identity(raw.identity.as_ref(), &mut c);
    if client_ip.trusted_proxies.is_empty() {
        for (path, l) in &raw.listeners {
            if l.proxy_protocol == Some(true) {
                c.report(
                    format!("{path}.proxy_protocol"),
                    "needs client_ip.trusted_proxies: PROXY headers are accepted from trusted peers only",
                );
            }
        }
    }
    let store = super::store::store(raw.store.as_ref(), &mut c);
    let mut store_zones = Vec::new();
    let zones = super::limits::zones(&raw.zones, &mut store_zones, &store, &mut c);
    let bypass = super::limits::bypass(raw.bypass.as_ref(), &mut c);
    let routes = routes(
        &mut c,
        raw.routes,
        &index,
        server.max_body_bytes,
        &zones,
        &mut store_zones,
        &store,
    );

    if c.problems.is_empty() {
        Ok(Config {
            listeners,
            admin,
            server,
            upstreams,
            routes,
            log,
            client_ip,
            identity,
            zones,
            bypass,
            store_zones,
            store,
        })
    } else {
        Err(c.problems)
    }
}

fn server(c: &mut Checker, raw: &RawConfig) -> ServerConfig {
    let empty = super::raw::RawServer {
        header_read_timeout: None,
        idle_timeout: None,
        max_header_size: None,
        max_headers: None,
        max_body_size: None,
        max_connections: None,
        h2_max_concurrent_streams: None,
        shutdown_grace: None,
        body_read_timeout: None,
    };
    let s = raw.server.as_ref().unwrap_or(&empty);
    let max_header_bytes = c.size("server.max_header_size", &s.max_header_size, 32 << 10);
    if !(1024..=1 << 20).contains(&max_header_bytes) {
        c.report("server.max_header_size", "must be between 1KB and 1MB");
    }
    ServerConfig {
        header_read_timeout: c.positive_duration(
            "server.header_read_timeout",
            &s.header_read_timeout,
            Duration::from_secs(10),
        ),
        idle_timeout: c.positive_duration(
            "server.idle_timeout",
            &s.idle_timeout,
            Duration::from_secs(60),
        ),
        max_header_bytes: max_header_bytes as usize,
        max_headers: c.number("server.max_headers", &s.max_headers, 100usize, 1, 10_000),
        max_body_bytes: c.size("server.max_body_size", &s.max_body_size, 10 << 20),
        max_connections: c.number(
            "server.max_connections",
            &s.max_connections,
            10_000usize,
            1,
            10_000_000,
        ),
        h2_max_concurrent_streams: c.number(
            "server.h2_max_concurrent_streams",
            &s.h2_max_concurrent_streams,
            128u32,
            1,
            100_000,
        ),
        shutdown_grace: c.duration(
            "server.shutdown_grace",
            &s.shutdown_grace,
            Duration::from_secs(30),
        ),
        body_read_timeout: c.positive_duration(
            "server.body_read_timeout",
            &s.body_read_timeout,
            Duration::from_secs(60),
        ),
    }
}

fn listeners(c: &mut Checker, raw: &RawConfig) -> Vec<ListenerConfig> {
    if raw.listeners.is_empty() && !c.problems.iter().any(|p| p.path.starts_with("listeners")) {
        c.report(
            "listeners",
            "at least one listener is required, e.g. - { bind: \"0.0.0.0:8080\" }",
        );
    }
    let mut out: Vec<ListenerConfig> = Vec::new();
    let mut names: HashMap<String, String> = HashMap::new();
    for (i, (path, l)) in raw.listeners.iter().enumerate() {
        let name = l.name.clone().unwrap_or_else(|| format!("listener{i}"));
        if let Some(first) = names.insert(name.clone(), path.clone()) {
            c.report(
                format!("{path}.name"),
                format!("\"{name}\" is already used by {first}"),
            );
        }
        let Some(bind) = c.socket_addr(&format!("{path}.bind"), &l.bind.0) else {
            continue;
        };
        if bind.port() != 0 {
            if let Some(other) = out.iter().find(|o| o.bind == bind) {
                c.report(
                    format!("{path}.bind"),
                    format!("{bind} is already bound by listener \"{}\"", other.name),
                );
            }
        }
        let tls = l.tls.as_ref().and_then(|t| {
            let tls_path = format!("{path}.tls");
            let handshake_timeout = c.positive_duration(
                &format!("{tls_path}.handshake_timeout"),
                &t.handshake_timeout,
                Duration::from_secs(10),
            );
            if t.certs.is_empty() {
                c.report(
                    format!("{tls_path}.certs"),
                    "at least one certificate is required",
                );
                return None;
            }
            let pairs: Vec<(&str, &str)> = t
                .certs
                .iter()
                .map(|p| (p.cert.as_str(), p.key.as_str()))
                .collect();
            match tls::server_config(&pairs) {
                Ok((config, names)) => Some(ListenerTls {
                    config,
                    names,
                    handshake_timeout,
                }),
                Err(errors) => {
                    for (i, field, message) in errors {
                        c.report(format!("{tls_path}.certs[{i}].{field}"), message);
                    }
                    None
                }
            }
        });
        out.push(ListenerConfig {
            name,
            bind,
            tls,
            proxy_protocol: l.proxy_protocol.unwrap_or(false),
        });
    }
    out
}

fn admin(c: &mut Checker, raw: &RawConfig, listeners: &[ListenerConfig]) -> Option<AdminConfig> {
    let a = raw.admin.as_ref();
    if a.and_then(|a| a.enabled) == Some(false) {
        return None;
    }
    let text = a
        .and_then(|a| a.bind.as_ref())
        .map_or(DEFAULT_ADMIN_BIND, |t| t.0.as_str());
    let bind = c.socket_addr("admin.bind", text)?;
    if bind.port() != 0 {
        if let Some(l) = listeners.iter().find(|l| l.bind == bind) {
            c.report(
                "admin.bind",
                format!("{bind} is already bound by listener \"{}\"", l.name),
            );
        }
    }
    Some(AdminConfig { bind })
}

fn upstreams(
    c: &mut Checker,
    raw: &[(String, String, RawUpstream)],
) -> (Vec<UpstreamConfig>, HashMap<String, usize>) {
    let mut out = Vec::new();
    let mut index = HashMap::new();
    for (path, name, u) in raw {
        if u.targets.is_empty() {
            c.report(
                format!("{path}.targets"),
                "at least one \"host:port\" target is required",
            );
        }
        let targets: Vec<Target> = u
            .targets
            .iter()
            .enumerate()
            .filter_map(|(i, t)| match parse_target(&t.0) {
                Ok(t) => Some(t),
                Err(e) => {
                    c.report(format!("{path}.targets[{i}]"), e);
                    None
                }
            })
            .collect();
        let tls = u
            .tls
            .as_ref()
            .and_then(|t| match client_tls::client_config(t.ca.as_deref()) {
                Ok(config) => {
                    let server_name = t.server_name.as_ref().and_then(|n| {
                        match rustls_pki_types::ServerName::try_from(n.clone()) {
                            Ok(sn) => Some(sn),
                            Err(_) => {
                                c.report(
                                    format!("{path}.tls.server_name"),
                                    format!("\"{n}\" is not a valid DNS name or IP address"),
                                );
                                None
                            }
                        }
                    });
                    Some(UpstreamTls {
                        config,
                        server_name,
                    })
                }
                Err(e) => {
                    c.report(format!("{path}.tls.ca"), e);
                    None
                }
            });
        let host_header = match u.host_header.as_deref() {
            None | Some("preserve") => HostHeader::Preserve,
            Some("target") => HostHeader::Target,
            Some(other) => match HeaderValue::from_str(other) {
                Ok(v) if is_host_with_port(other) => HostHeader::Fixed(v),
                _ => {
                    c.report(
                        format!("{path}.host_header"),
                        format!(
                            "expected \"preserve\", \"target\" or a host name, got \"{other}\""
                        ),
                    );
                    HostHeader::Preserve
                }
            },
        };
        let upstream = UpstreamConfig {
            name: name.clone(),
            targets,
            tls,
            connect_timeout: c.positive_duration(
                &format!("{path}.connect_timeout"),
                &u.connect_timeout,
                Duration::from_secs(2),
            ),
            timeout: c.positive_duration(
                &format!("{path}.timeout"),
                &u.timeout,
                Duration::from_secs(30),
            ),
            idle_timeout: c.duration(
                &format!("{path}.idle_timeout"),
                &u.idle_timeout,
                Duration::from_secs(4),
            ),
            max_idle_per_target: c.number(
                &format!("{path}.max_idle_per_target"),
                &u.max_idle_per_target,
                64usize,
                0,
                100_000,
            ),
            cooldown: c.duration(
                &format!("{path}.cooldown"),
                &u.cooldown,
                Duration::from_secs(10),
            ),
            host_header,
        };
        index.insert(name.clone(), out.len());
        out.push(upstream);
    }
    (out, index)
}

/// A `Host` value: a name or address with an optional port.
fn is_host_with_port(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b))
}

/// `host:port`, `1.2.3.4:80` or `[::1]:80`; a scheme is a mistake worth naming.
fn parse_target(text: &str) -> Result<Target, String> {
    let t = text.trim();
    if t.contains("://") {
        return Err(format!(
            "expected \"host:port\" without a scheme (use tls: {{}} for https), got \"{text}\""
        ));
    }
    let bad = || format!("expected \"host:port\", got \"{text}\"");
    let (host, port) = if let Some(rest) = t.strip_prefix('[') {
        let (h, p) = rest.split_once("]:").ok_or_else(bad)?;
        h.parse::<std::net::Ipv6Addr>().map_err(|_| bad())?;
        (h, p)
    } else {
        t.rsplit_once(':').ok_or_else(bad)?
    };
    let port: u16 = port.parse().map_err(|_| bad())?;
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:_".contains(&b));
    if !host_ok || port == 0 {
        return Err(bad());
    }
    Ok(Target {
        authority: t.to_owned(),
        host: host.to_owned(),
        port,
    })
}

fn routes(
    c: &mut Checker,
    raw: Vec<(String, RawRoute)>,
    upstreams: &HashMap<String, usize>,
    default_body: u64,
    zones: &[ZoneConfig],
    store_zones: &mut Vec<crate::limiter::memory::ZoneSpec>,
    store: &StoreConfig,
) -> Vec<RouteConfig> {
    let mut out: Vec<(RouteConfig, String)> = Vec::new();
    for (i, (path, r)) in raw.into_iter().enumerate() {
        let extras = super::limits::route(&path, &r, zones, store_zones, store, c);
        let m = &r.matcher;
        let path_match = match (&m.path, &m.path_prefix) {
            (Some(p), None) => Some(PathMatch::Exact(p.clone())),
            (None, Some(p)) => Some(PathMatch::Prefix(p.clone())),
            (Some(_), Some(_)) => {
                c.report(
                    format!("{path}.match"),
                    "give either path or path_prefix, not both",
                );
                None
            }
            (None, None) => {
                c.report(format!("{path}.match"), "needs path (exact) or path_prefix");
                None
            }
        };
        if let Some(PathMatch::Exact(p) | PathMatch::Prefix(p)) = &path_match {
            if !p.starts_with('/') {
                let key = if m.path.is_some() {
                    "path"
                } else {
                    "path_prefix"
                };
                c.report(
                    format!("{path}.match.{key}"),
                    format!("must start with \"/\", got \"{p}\""),
                );
            }
        }
        let host = m.host.as_deref().and_then(|h| match parse_host(h) {
            Ok(h) => Some(h),
            Err(e) => {
                c.report(format!("{path}.match.host"), e);
                None
            }
        });
        let methods = m.methods.as_ref().map(|list| {
            list.iter()
                .enumerate()
                .filter_map(|(j, name)| {
                    let upper = name.to_ascii_uppercase();
                    match Method::from_bytes(upper.as_bytes()) {
                        Ok(method) if upper == *name => Some(method),
                        _ => {
                            c.report(
                                format!("{path}.match.methods[{j}]"),
                                format!(
                                    "expected an upper-case HTTP method like GET, got \"{name}\""
                                ),
                            );
                            None
                        }
                    }
                })
                .collect::<Vec<_>>()
        });
        let action = match (&r.upstream, &r.respond) {
            (Some(name), None) => match upstreams.get(name) {
                Some(&idx) => Some(RouteAction::Forward(idx)),
                None => {
                    let mut known: Vec<&str> = upstreams.keys().map(String::as_str).collect();
                    known.sort_unstable();
                    let known = if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    };
                    c.report(
                        format!("{path}.upstream"),
                        format!("no upstream named \"{name}\" (defined: {known})"),
                    );
                    None
                }
            },
            (None, Some(resp)) => {
                respond(c, &format!("{path}.respond"), resp).map(RouteAction::Respond)
            }
            (Some(_), Some(_)) => {
                c.report(path.clone(), "give either upstream or respond, not both");
                None
            }
            (None, None) => {
                c.report(
                    path.clone(),
                    "needs upstream (forward) or respond (answer directly)",
                );
                None
            }
        };
        let max_body_bytes = c.size(
            &format!("{path}.max_body_size"),
            &r.max_body_size,
            default_body,
        );
        let (Some(path_match), Some(action)) = (path_match, action) else {
            continue;
        };
        let route = RouteConfig {
            name: Arc::from(r.name.unwrap_or_else(|| format!("routes[{i}]"))),
            host,
            path: path_match,
            methods,
            action,
            max_body_bytes,
            case_insensitive: r.matcher.case_insensitive.unwrap_or(false),
            zones: extras.zones,
            limits: extras.limits,
            headers: extras.headers,
            warn_at: extras.warn_at,
            webhook: extras.webhook,
        };
        if let Some((_, first)) = out.iter().find(|(o, _)| {
            o.host == route.host && o.path == route.path && o.methods == route.methods
        }) {
            c.report(
                path.clone(),
                format!("matches exactly the same requests as {first}"),
            );
        }
        out.push((route, path));
    }
    let mut routes: Vec<RouteConfig> = out.into_iter().map(|(r, _)| r).collect();
    // Stable sort keeps file order among equals.
    routes.sort_by_key(|r| std::cmp::Reverse(precedence(r)));
    routes
}

/// Higher sorts first: a matching host beats no host (nginx picks the server
/// block first), then exact path beats prefix, longer prefix beats shorter,
/// and a method list beats "any method".
fn precedence(r: &RouteConfig) -> (u8, usize, u8, usize, bool) {
    let (host_rank, host_len) = match &r.host {
        Some(HostMatch::Exact(h)) => (2, h.len()),
        Some(HostMatch::Suffix(s)) => (1, s.len()),
        None => (0, 0),
    };
    let (path_rank, path_len) = match &r.path {
        PathMatch::Exact(p) => (1, p.len()),
        PathMatch::Prefix(p) => (0, p.len()),
    };
    (
        host_rank,
        host_len,
        path_rank,
        path_len,
        r.methods.is_some(),
    )
}

fn parse_host(text: &str) -> Result<HostMatch, String> {
    let h = text.trim().to_ascii_lowercase();
    let valid = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
    };
    if let Some(rest) = h.strip_prefix("*.") {
        if valid(rest) {
            return Ok(HostMatch::Suffix(format!(".{rest}")));
        }
    } else if valid(&h) {
        return Ok(HostMatch::Exact(h));
    }
    Err(format!("expected a host name like \"api.example.com\" or \"*.example.com\" (no port), got \"{text}\""))
}

fn respond(c: &mut Checker, path: &str, r: &super::raw::RawRespond) -> Option<Respond> {
    let status = c.number(&format!("{path}.status"), &r.status, 200u16, 100, 599);
    let status = StatusCode::from_u16(status).ok()?;
    let body = Bytes::from(r.body.clone().unwrap_or_default());
    let mut headers = HeaderMap::new();
    let empty = BTreeMap::new();
    for (name, value) in r.headers.as_ref().unwrap_or(&empty) {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            (Ok(n), Ok(v)) => {
                headers.append(n, v);
            }
            (Err(_), _) => c.report(
                format!("{path}.headers.{name}"),
                format!("\"{name}\" is not a valid header name"),
            ),
            (_, Err(_)) => c.report(
                format!("{path}.headers.{name}"),
                "the value has characters a header cannot carry",
            ),
        }
    }
    if !body.is_empty() && !headers.contains_key(CONTENT_TYPE) {
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
    }
    Some(Respond {
        status,
        body,
        headers,
    })
}

fn log(c: &mut Checker, raw: &RawConfig) -> LogConfig {
    let l = raw.log.as_ref();
    let format = match l.and_then(|l| l.format.as_deref()) {
        None | Some("pretty") => LogFormat::Pretty,
        Some("json") => LogFormat::Json,
        Some(other) => {
            c.report(
                "log.format",
                format!("expected \"pretty\" or \"json\", got \"{other}\""),
            );
            LogFormat::Pretty
        }
    };
    let level = l
        .and_then(|l| l.level.clone())
        .unwrap_or_else(|| "info".to_owned());
    if tracing_subscriber::EnvFilter::try_new(&level).is_err() {
        c.report(
            "log.level",
            format!("expected a level like \"info\" or \"tollgate=debug\", got \"{level}\""),
        );
    }
    LogConfig {
        format,
        level,
        access_log: l.and_then(|l| l.access_log).unwrap_or(true),
    }
}

#[cfg(test)]
mod tests;
