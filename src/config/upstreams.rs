//! Validation of `upstreams`: targets (`host:port`), timeouts, pool
//! sizes, `host_header` and TLS to the upstream; `balance` and
//! `next_upstream` in `balance`.

use std::collections::HashMap;
use std::time::Duration;

use http::header::HeaderValue;

use super::checker::Checker;
use super::compiled::*;
use super::raw::{RawTarget, RawUpstream};
use crate::tls;

pub(super) fn upstreams(
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
            .filter_map(|(i, t)| target(c, &format!("{path}.targets[{i}]"), t))
            .collect();
        let balance = super::balance::balance(c, &format!("{path}.balance"), u.balance.as_deref());
        if let (Some(method), Some(i)) = (
            super::balance::allows_backup(&balance),
            targets.iter().position(|t| t.backup),
        ) {
            c.report(
                format!("{path}.targets[{i}].backup"),
                format!(
                    "backup targets cannot be used with balance {method} (nginx refuses them too)"
                ),
            );
        }
        if let (Some(method), Some(i)) = (
            super::balance::allows_backup(&balance),
            targets.iter().position(|t| t.slow_start.is_some()),
        ) {
            c.report(
                format!("{path}.targets[{i}].slow_start"),
                format!("slow_start cannot be used with balance {method} (nginx refuses it too)"),
            );
        }
        let next_upstream = super::balance::next_upstream(
            c,
            &format!("{path}.next_upstream"),
            u.next_upstream.as_ref(),
        );
        if !targets.is_empty() && targets.iter().all(|t| t.backup) {
            c.report(
                format!("{path}.targets"),
                "every target is a backup: at least one must not be",
            );
        }
        let tls = u
            .tls
            .as_ref()
            .and_then(|t| match tls::client_config(t.ca.as_deref()) {
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
        let protocol = match u.protocol.as_deref() {
            None | Some("http1") => UpstreamProtocol::Http1,
            Some("h2") => UpstreamProtocol::H2,
            Some("auto") => UpstreamProtocol::Auto,
            Some(other) => {
                c.report(
                    format!("{path}.protocol"),
                    format!("expected \"http1\", \"h2\" or \"auto\", got \"{other}\""),
                );
                UpstreamProtocol::Http1
            }
        };
        let tls = tls.map(|t| with_alpn(t, protocol));
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
                1024usize,
                0,
                100_000,
            ),
            cooldown: c.duration(
                &format!("{path}.cooldown"),
                &u.cooldown,
                Duration::from_secs(10),
            ),
            host_header,
            protocol,
            max_streams: c.number(
                &format!("{path}.max_streams_per_connection"),
                &u.max_streams_per_connection,
                100usize,
                1,
                10_000,
            ),
            balance,
            next_upstream,
            resolver: super::balance::resolver(c, &format!("{path}.resolver"), u.resolver.as_ref()),
            health_check: u
                .health_check
                .as_ref()
                .map(|h| super::balance::health_check(c, &format!("{path}.health_check"), h)),
            concurrency: u
                .concurrency
                .as_ref()
                .map(|r| super::protect::concurrency(c, &format!("{path}.concurrency"), r)),
            queue: u
                .queue
                .as_ref()
                .map(|r| super::protect::queue(c, &format!("{path}.queue"), r)),
        };
        index.insert(name.clone(), out.len());
        out.push(upstream);
    }
    (out, index)
}

/// The TLS settings offering the ALPN protocols `protocol` speaks
/// (`http1` offers none, as before: any HTTPS server answers HTTP/1.1).
fn with_alpn(tls: UpstreamTls, protocol: UpstreamProtocol) -> UpstreamTls {
    let alpn: &[&[u8]] = match protocol {
        UpstreamProtocol::Http1 => return tls,
        UpstreamProtocol::H2 => &[b"h2"],
        UpstreamProtocol::Auto => &[b"h2", b"http/1.1"],
    };
    let mut config = (*tls.config).clone();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    UpstreamTls {
        config: std::sync::Arc::new(config),
        server_name: tls.server_name,
    }
}

/// A `Host` value: a name or address with an optional port.
fn is_host_with_port(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b))
}

/// `host:port`, `1.2.3.4:80` or `[::1]:80`; a scheme is a mistake worth naming.
/// One entry of `targets`, at `path`: its address, and a map's weight,
/// backup and down.
fn target(c: &mut Checker, path: &str, raw: &RawTarget) -> Option<Target> {
    let (address, map) = match raw {
        RawTarget::Address(a) => (a, None),
        RawTarget::With(m) => (&m.address, Some(m)),
    };
    let at = if map.is_some() {
        format!("{path}.address")
    } else {
        path.to_owned()
    };
    let mut t = match parse_target(&address.0) {
        Ok(t) => t,
        Err(e) => {
            c.report(at, e);
            return None;
        }
    };
    if let Some(m) = map {
        t.weight = c.number(&format!("{path}.weight"), &m.weight, 1u32, 1, 1000);
        t.backup = m.backup.unwrap_or(false);
        t.down = m.down.unwrap_or(false);
        t.max_fails = c.number(&format!("{path}.max_fails"), &m.max_fails, 1u32, 0, 1000);
        t.max_conns = c.number(
            &format!("{path}.max_conns"),
            &m.max_conns,
            0u32,
            0,
            1_000_000,
        );
        if m.slow_start.is_some() {
            t.slow_start = Some(c.positive_duration(
                &format!("{path}.slow_start"),
                &m.slow_start,
                Duration::from_secs(30),
            ));
        }
        t.resolve = m.resolve.unwrap_or(false);
        if t.resolve && t.host.parse::<std::net::IpAddr>().is_ok() {
            c.report(
                format!("{path}.resolve"),
                format!("\"{}\" is an address, not a name to resolve", t.host),
            );
        }
        if m.fail_timeout.is_some() {
            t.fail_timeout = Some(c.positive_duration(
                &format!("{path}.fail_timeout"),
                &m.fail_timeout,
                Duration::from_secs(10),
            ));
        }
    }
    Some(t)
}

pub(crate) fn parse_target(text: &str) -> Result<Target, String> {
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
        weight: 1,
        backup: false,
        down: false,
        max_fails: 1,
        fail_timeout: None,
        max_conns: 0,
        resolve: false,
        addr: None,
        entry: None,
        slow_start: None,
    })
}
