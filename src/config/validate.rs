//! Raw YAML types -> runtime `Config`, collecting every problem with its YAML
//! path instead of stopping at the first. Defaults live here, next to the
//! checks, and are repeated in `config.example.yaml`.

use std::collections::HashMap;
use std::time::Duration;

use super::checker::Checker;
use super::compiled::*;
use super::raw::RawConfig;
use super::Problem;
use crate::tls;

pub const DEFAULT_ADMIN_BIND: &str = "127.0.0.1:9090";

pub fn validate(raw: RawConfig, mut problems: Vec<Problem>) -> Result<Config, Vec<Problem>> {
    let mut c = Checker {
        problems: std::mem::take(&mut problems),
    };

    let server = server(&mut c, &raw);
    let listeners = listeners(&mut c, &raw);
    let admin = admin(&mut c, &raw, &listeners);
    let (upstreams, index) = super::upstreams::upstreams(&mut c, &raw.upstreams);
    let log = log(&mut c, &raw);
    let client_ip = super::client::client_ip(raw.client_ip.as_ref(), &mut c);
    let mut identity = super::client::identity(raw.identity.as_ref(), &mut c);
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
    let plan_names: Vec<std::sync::Arc<str>> = identity
        .as_ref()
        .and_then(|i| i.plans.as_ref())
        .map(|p| p.names.clone())
        .unwrap_or_default();
    let zones = super::limits::zones(&raw.zones, &mut store_zones, &store, &plan_names, &mut c);
    let bypass = super::limits::bypass(raw.bypass.as_ref(), &mut c);
    let priorities = super::protect::priorities(raw.priorities.as_ref(), &plan_names, &mut c);
    let routes = super::routes::routes(
        &mut c,
        raw.routes,
        &index,
        server.max_body_bytes,
        &super::limits::Shared {
            zones: &zones,
            store: &store,
            plans: &plan_names,
            priorities: &priorities,
        },
        &mut store_zones,
    );
    let claims = routes
        .iter()
        .flat_map(|r| &r.limits)
        .any(|l| l.cost_from.as_ref().is_some_and(|f| f.claim.is_some()));
    match identity.as_mut() {
        Some(i) => i.keep_claims = claims,
        None if claims => c.report(
            "routes",
            "a limit reads its cost from a claim: configure identity.jwt",
        ),
        None => {}
    }

    let alerts = super::alerts::alerts(raw.alerts.as_ref(), &zones, &routes, &mut c);
    let traces = super::traces::traces(raw.traces.as_ref(), &mut c);

    if c.problems.is_empty() {
        Ok(Config {
            alerts,
            traces,
            priorities,
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
        h2_max_reset_streams: None,
        shutdown_grace: None,
        drain_delay: None,
        body_read_timeout: None,
        lingering_time: None,
        lingering_timeout: None,
        send_timeout: None,
        workers: None,
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
        h2_max_reset_streams: c.number(
            "server.h2_max_reset_streams",
            &s.h2_max_reset_streams,
            200usize,
            1,
            100_000,
        ),
        shutdown_grace: c.duration(
            "server.shutdown_grace",
            &s.shutdown_grace,
            Duration::from_secs(30),
        ),
        drain_delay: c.duration("server.drain_delay", &s.drain_delay, Duration::ZERO),
        body_read_timeout: c.positive_duration(
            "server.body_read_timeout",
            &s.body_read_timeout,
            Duration::from_secs(60),
        ),
        lingering_time: c.duration(
            "server.lingering_time",
            &s.lingering_time,
            Duration::from_secs(30),
        ),
        lingering_timeout: c.positive_duration(
            "server.lingering_timeout",
            &s.lingering_timeout,
            Duration::from_secs(5),
        ),
        send_timeout: c.positive_duration(
            "server.send_timeout",
            &s.send_timeout,
            Duration::from_secs(60),
        ),
        workers: workers(c, &s.workers),
    }
}

/// `server.workers`: `auto` (one per core this process may run on) or a
/// count.
fn workers(c: &mut Checker, value: &Option<super::raw::Text>) -> usize {
    let auto = || std::thread::available_parallelism().map_or(1, |n| n.get());
    match value.as_ref().map(|t| t.0.trim()) {
        None | Some("auto") => auto(),
        Some(t) => match t.parse::<usize>() {
            Ok(n @ 1..=1024) => n,
            _ => {
                c.report(
                    "server.workers",
                    format!("expected auto or a whole number from 1 to 1024, got \"{t}\""),
                );
                auto()
            }
        },
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
            match tls::server_config(&pairs, t.session_tickets.unwrap_or(true)) {
                Ok((config, names)) => Some(ListenerTls {
                    config,
                    names,
                    handshake_timeout,
                }),
                Err(errors) => {
                    for (at, message) in errors {
                        let path = match at.as_str() {
                            "" => tls_path.clone(),
                            _ => format!("{tls_path}.{at}"),
                        };
                        c.report(path, message);
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
    let tokens: Vec<&String> = match a.and_then(|a| a.token.as_ref()) {
        None => Vec::new(),
        Some(super::raw::RawTokens::One(t)) => vec![t],
        Some(super::raw::RawTokens::Many(ts)) => ts.iter().collect(),
    };
    for (i, t) in tokens.iter().enumerate() {
        if t.len() < 16 {
            c.report(
                format!("admin.token[{i}]"),
                format!(
                    "an admin token needs at least 16 characters, this one has {}",
                    t.len()
                ),
            );
        }
    }
    if tokens.is_empty() && !bind.ip().is_loopback() {
        c.report(
            "admin.token",
            format!("the admin listener on {bind} is reachable beyond this host: set admin.token (or bind it to 127.0.0.1)"),
        );
    }
    use sha2::Digest;
    Some(AdminConfig {
        bind,
        token_hashes: tokens
            .iter()
            .map(|t| sha2::Sha256::digest(t.as_bytes()).into())
            .collect(),
        protect_metrics: a.and_then(|a| a.protect_metrics).unwrap_or(false),
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
