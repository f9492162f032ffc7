//! The translation as config types (`config::raw`, the schema `load`
//! reads), written with serde, with the notes as comments where they apply.

use std::collections::BTreeMap;

use serde_yaml::{Mapping, Value};

use super::route::usable_key;
use super::{Action, Note, Out, Severity, NGINX_BODY};
use crate::config::raw::{
    RawCert, RawClientIp, RawConfig, RawListener, RawListenerTls, RawMatch, RawRoute, RawUpstream,
    RawUpstreamTls, RawZone, Text,
};

/// Comment lines above the `index`th item of a list section.
type Above = BTreeMap<(String, usize), Vec<String>>;
/// Comment lines above a section's key.
type Before = BTreeMap<&'static str, Vec<String>>;

const HEADER: &str = "\
# Written by tollgate import-nginx. Check it with: tollgate check --config <this file>
# Notes (not translated) are listed where they apply, and all together on stderr.
";

/// The YAML of `out`; notes found while writing it (zones whose key cannot
/// be translated) join `out.notes`.
pub(super) fn yaml(out: &mut Out) -> String {
    let mut above = Above::new();
    let mut before = Before::new();
    let config = config(out, &mut above, &mut before);
    // Zones that could not be translated are named where the zones are,
    // or where they would have been.
    if config.zones.is_empty() {
        if let Some(lines) = before.remove("zones") {
            let next = if config.upstreams.is_empty() {
                "routes"
            } else {
                "upstreams"
            };
            before.entry(next).or_default().extend(lines);
        }
    }
    let mut y = String::from(HEADER);
    y.push_str(&write(&config, &above, &before));
    let mut lost: Vec<&Note> = out
        .notes
        .iter()
        .filter(|n| n.severity == Severity::Lost)
        .collect();
    lost.sort_by(|a, b| (&a.at.file, a.at.line).cmp(&(&b.at.file, b.at.line)));
    if !lost.is_empty() {
        y.push_str("# NOT EQUIVALENT: these change who is limited, how, or where requests go:\n");
        for n in lost {
            y.push_str(&format!("#   {}: {}\n", n.at, n.message));
        }
    }
    y
}

fn config(out: &mut Out, above: &mut Above, before: &mut Before) -> RawConfig {
    if out.listeners.is_empty() {
        super::server::listen_default(out);
    }
    if out.server.max_body_size.is_none() {
        out.server.max_body_size = Some(Text(super::size(NGINX_BODY)));
    }
    let mut client_ip =
        (!out.trusted.is_empty() || out.real_ip_header.is_some()).then(|| RawClientIp {
            trusted_proxies: Some(out.trusted.iter().map(|t| Text(t.clone())).collect()),
            headers: Some(vec![out
                .real_ip_header
                .clone()
                .unwrap_or_else(|| "x-real-ip".into())]),
            ..RawClientIp::default()
        });
    let zones = zones(out, above, before);
    if zones.iter().any(|(_, z)| z.key.as_deref() == Some("ip")) {
        client_ip
            .get_or_insert_with(RawClientIp::default)
            .ipv6_prefix = Some(Text::from("128"));
        before.entry("client_ip").or_default().push(
            "ipv6_prefix 128: nginx's $binary_remote_addr keys each IPv6 address on its own (tollgate's default is the /64)".into(),
        );
    }
    RawConfig {
        listeners: listeners(out),
        server: Some(out.server.clone()),
        client_ip,
        zones,
        upstreams: upstreams(out),
        routes: routes(out, above),
        ..RawConfig::default()
    }
}

fn listeners(out: &Out) -> Vec<(String, RawListener)> {
    let listener = |(i, l): (usize, &super::Listener)| {
        let port = l.bind.rsplit(':').next().unwrap_or("0");
        let tls = l.tls.then(|| RawListenerTls {
            certs: l
                .certs
                .iter()
                .map(|(cert, key)| RawCert {
                    cert: cert.clone(),
                    key: key.clone(),
                })
                .collect(),
            session_tickets: (!l.session_tickets).then_some(false),
            ..RawListenerTls::default()
        });
        let raw = RawListener {
            name: Some(format!("port{port}-{i}")),
            bind: Text(l.bind.clone()),
            tls,
            proxy_protocol: l.proxy_protocol.then_some(true),
        };
        (String::new(), raw)
    };
    out.listeners.iter().enumerate().map(listener).collect()
}

fn zones(out: &mut Out, above: &mut Above, before: &mut Before) -> Vec<(String, RawZone)> {
    let mut zones = Vec::new();
    let mut untranslated = |kind: &str, name: &str, at: &crate::import::Place, why: &str| {
        before.entry("zones").or_default().push(format!(
            "zone {name} ({kind} at {at}) is NOT translated, and no route lists it: {why}"
        ));
    };
    for (name, (u, at)) in &out.used {
        let Some(z) = out.req_zones.get(name) else {
            continue;
        };
        if let Err(why) = &z.key {
            untranslated("limit_req_zone", name, &z.at, why);
        }
        let Some(key) = usable_key(&z.key, &z.at, &mut out.notes) else {
            continue;
        };
        above.insert(
            ("zones".into(), zones.len()),
            vec![
                format!("limit_req_zone at {}, limit_req at {at}", z.at),
                // (fail2ban is not in nginx.conf: say it where it would go)
                "fail2ban banning what this zone refuses? add penalty: { after: <maxretry>, within: <findtime>, ban: [<bantime>, ...] } here".to_owned(),
            ],
        );
        let zone = RawZone {
            name: name.clone(),
            rate: Text(z.rate.clone()),
            burst: Some(Text(u.burst.to_string())),
            nodelay: u.delay.is_none().then_some(true),
            delay: u.delay.filter(|&d| d > 0).map(|d| Text(d.to_string())),
            status: Some(Text(u.status.clone())),
            key: Some(key),
            size: Some(Text(z.size.clone())),
            dry_run: u.dry_run.then_some(true),
            ..RawZone::default()
        };
        zones.push((String::new(), zone));
    }
    for (name, (n, status, at)) in &out.conn_used {
        let Some(z) = out.conn_zones.get(name) else {
            continue;
        };
        if let Err(why) = &z.key {
            untranslated("limit_conn_zone", name, &z.at, why);
        }
        let Some(key) = usable_key(&z.key, &z.at, &mut out.notes) else {
            continue;
        };
        above.insert(
            ("zones".into(), zones.len()),
            vec![format!(
                "limit_conn only (the rate never limits): limit_conn_zone at {}, limit_conn at {at}",
                z.at
            )],
        );
        let zone = RawZone {
            name: format!("{name}_conn"),
            rate: Text::from("1000000r/s"),
            burst: Some(Text::from("1000000")),
            nodelay: Some(true),
            max_conn: Some(Text(n.to_string())),
            status: Some(Text(status.clone())),
            key: Some(key),
            size: Some(Text(z.size.clone())),
            ..RawZone::default()
        };
        zones.push((String::new(), zone));
    }
    zones
}

fn upstreams(out: &Out) -> Vec<(String, String, RawUpstream)> {
    let upstream = |(name, u): (&String, &super::Upstream)| {
        let raw = RawUpstream {
            targets: u.targets.clone(),
            tls: u.tls.then(RawUpstreamTls::default),
            connect_timeout: u.connect_timeout.clone(),
            timeout: u.read_timeout.clone(),
            max_idle_per_target: u.keepalive.as_ref().map(|k| Text(k.clone())),
            protocol: u.h2.then(|| "h2".to_owned()),
            idle_timeout: u.keepalive_timeout.clone(),
            balance: u.balance.clone(),
            next_upstream: u.next_upstream.clone().flatten(),
            queue: u.queue.clone(),
            // Only where a target resolves a name.
            resolver: u
                .targets
                .iter()
                .any(|t| matches!(t, crate::config::raw::RawTarget::With(m) if m.resolve == Some(true)))
                .then(|| u.resolver.clone().unwrap_or_else(|| out.resolver.clone())),
            ..RawUpstream::default()
        };
        (String::new(), yaml_safe(name), raw)
    };
    out.upstreams.iter().map(upstream).collect()
}

/// An upstream's name as written in the YAML: one that a YAML 1.1 reader
/// (PyYAML, Ansible, Go's yaml.v2 in many Helm tools) would read as a
/// number, a boolean or null unquoted (`127_0_0_1_9000`, `on`, `1e3`)
/// gets `upstream_` in front, so every reader keeps a string.
pub(crate) fn yaml_safe(name: &str) -> String {
    const WORDS: [&str; 14] = [
        "y", "n", "yes", "no", "on", "off", "true", "false", "null", "~", "", ".inf", ".nan",
        "-.inf",
    ];
    let lower = name.to_ascii_lowercase();
    let starts_numeric = name
        .trim_start_matches(['+', '-', '.'])
        .starts_with(|c: char| c.is_ascii_digit());
    if starts_numeric || WORDS.contains(&lower.as_str()) {
        format!("upstream_{name}")
    } else {
        name.to_owned()
    }
}

fn routes(out: &Out, above: &mut Above) -> Vec<(String, RawRoute)> {
    let default_body = out.server.max_body_size.as_ref().map(|t| t.0.as_str());
    let mut routes = Vec::new();
    for (i, r) in out.routes.iter().enumerate() {
        if !r.comments.is_empty() {
            above.insert(("routes".into(), i), r.comments.clone());
        }
        let path = Some(r.path.clone());
        let matcher = RawMatch {
            host: r.host.clone(),
            path: if r.exact { path.clone() } else { None },
            path_prefix: if r.exact { None } else { path },
            ..RawMatch::default()
        };
        let (upstream, respond) = match &r.action {
            Action::Upstream(name) => (Some(yaml_safe(name)), None),
            Action::Respond(respond) => (None, Some(respond.clone())),
        };
        let route = RawRoute {
            name: Some(r.name.clone()),
            matcher,
            upstream,
            respond,
            zones: Some(r.zones.clone()),
            max_body_size: r
                .body_size
                .as_ref()
                .filter(|b| default_body != Some(b.as_str()))
                .map(|b| Text(b.clone())),
            allow_sources: r
                .webhook
                .as_ref()
                .map(|(nets, _)| nets.iter().map(|n| Text(n.clone())).collect()),
            only_allowed_sources: r.webhook.as_ref().map(|(_, only)| *only),
            ..RawRoute::default()
        };
        routes.push((String::new(), route));
    }
    routes
}

/// `config` as YAML, each section on its own, with `above`'s comments over
/// list items. Keys the config leaves out (`None`) are not written.
fn write(config: &RawConfig, above: &Above, before: &Before) -> String {
    let value = match serde_yaml::to_value(config) {
        Ok(v) => without_nulls(v),
        Err(e) => return format!("# import-nginx could not write the config: {e}\n"),
    };
    let Value::Mapping(sections) = value else {
        return String::new();
    };
    let text = |v: &Value| serde_yaml::to_string(v).unwrap_or_default();
    let mut y = String::new();
    for (key, section) in sections {
        let name = key.as_str().unwrap_or_default();
        for line in before.get(name).into_iter().flatten() {
            y.push_str(&format!("# {line}\n"));
        }
        match section {
            Value::Sequence(items) => {
                y.push_str(name);
                y.push_str(":\n");
                for (i, item) in items.into_iter().enumerate() {
                    for line in above.get(&(name.to_owned(), i)).into_iter().flatten() {
                        y.push_str(&format!("# {line}\n"));
                    }
                    y.push_str(&text(&Value::Sequence(vec![item])));
                }
            }
            other => {
                let mut one = Mapping::new();
                one.insert(key, other);
                y.push_str(&text(&Value::Mapping(one)));
            }
        }
    }
    y
}

pub(crate) fn without_nulls(v: Value) -> Value {
    match v {
        Value::Mapping(m) => Value::Mapping(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Sequence(s) => Value::Sequence(s.into_iter().map(without_nulls).collect()),
        other => other,
    }
}
