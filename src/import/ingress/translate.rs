//! Ingresses -> the tollgate config, as ingress-nginx reads them.
//!
//! - A path of type `Prefix` (and `ImplementationSpecific`, which
//!   ingress-nginx reads as `Prefix`) `/a` is nginx's `location /a/` plus
//!   `location = /a` (unless an `Exact` `/a` exists on the host): a
//!   `path_prefix: /a/` route and a `path: /a` route. `Exact` is `path`.
//! - A backend is an upstream of one target,
//!   `<service>.<namespace>.svc.<domain>:<port>`, resolved by DNS
//!   (`resolve: true`) like any name, with ingress-nginx's timeouts.
//! - `limit-rps` / `limit-rpm` are zones of that rate per client address,
//!   burst `rate * limit-burst-multiplier` (default 5), `nodelay`, status
//!   503 (ingress-nginx's `limit-req-status-code`); `limit-connections` a
//!   zone's `max_conn` (503). Each Ingress's zones are its own, listed by
//!   its routes only; `limit-allowlist` is the routes' `allow_sources`.

use std::collections::{BTreeMap, BTreeSet};

use serde_yaml::{Mapping, Value};

use super::annotations::{self, Annotations};
use super::{Backend, Ingress, IngressImport, IngressNote, Manifests, Options};
use crate::config::raw::{
    RawClientIp, RawConfig, RawMatch, RawRespond, RawRoute, RawServer, RawTarget, RawTargetMap,
    RawUpstream, RawZone, Text,
};
use crate::import::translate::{without_nulls, yaml_safe};
use crate::import::Severity;

/// Its zones' shared memory (5m).
const ZONE_SIZE: &str = "5MB";

#[derive(Default)]
struct Out {
    zones: Vec<RawZone>,
    upstreams: Vec<(String, RawUpstream)>,
    routes: Vec<RawRoute>,
    /// (host, exact, path) -> the Ingress whose route it is.
    taken: BTreeMap<(String, bool, String), String>,
    secrets: Vec<String>,
    notes: Vec<IngressNote>,
    /// The statuses of refusals: `limit_req`'s, `limit_conn`'s.
    statuses: (String, String),
    /// Trusted peers and the header naming the client, from the
    /// controller's ConfigMap.
    real_ip: Option<(Vec<String>, String)>,
    /// The body cap and the upstream timeouts where no annotation says:
    /// ingress-nginx's (1m, 5 s, 60 s) or its controller ConfigMap's.
    defaults: (String, String, String),
}

impl Out {
    fn note(&mut self, at: &str, severity: Severity, message: impl Into<String>) {
        self.notes.push(IngressNote {
            at: at.to_owned(),
            severity,
            message: message.into(),
        });
    }
}

/// Letters, digits, `_` and `-` only (zone, route and upstream names).
fn label(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

pub fn translate(m: &Manifests, o: &Options) -> IngressImport {
    let mut out = Out::default();
    // ingress-nginx adds `= /a` for a Prefix `/a` only where no Exact
    // `/a` exists on the same host, whichever Ingress has it.
    let mut exact = BTreeSet::new();
    for ing in &m.ingresses {
        for rule in &ing.spec.rules {
            for p in rule.http.iter().flat_map(|h| &h.paths) {
                if p.path_type.as_deref() == Some("Exact") {
                    let host = rule.host.clone().unwrap_or_default();
                    exact.insert((host, p.path.clone().unwrap_or_else(|| "/".into())));
                }
            }
        }
    }
    let controller = super::controller::read(m, &mut out.notes);
    out.statuses = (controller.req_status, controller.conn_status);
    out.real_ip = controller.real_ip;
    out.defaults = (
        controller.body_size,
        controller.connect_timeout,
        controller.read_timeout,
    );
    for ing in &m.ingresses {
        ingress(ing, m, o, &exact, &mut out);
    }
    not_found(&mut out);
    let unread = m.configmaps.len() - usize::from(controller.read.is_some());
    if unread > 0 {
        out.note(
            "input",
            Severity::Skipped,
            format!("{unread} ConfigMap object(s) ignored"),
        );
    }
    for (kind, n) in &m.others {
        out.note(
            "input",
            Severity::Skipped,
            format!("{n} {kind} object(s) ignored"),
        );
    }
    if m.ingresses.is_empty() {
        out.note("input", Severity::Lost, "no Ingress objects found");
    }
    render(out)
}

fn ingress(
    ing: &Ingress,
    m: &Manifests,
    o: &Options,
    exact: &BTreeSet<(String, String)>,
    out: &mut Out,
) {
    let ns = ing
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let who = format!("Ingress {ns}/{}", ing.metadata.name);
    let class = ing.spec.ingress_class_name.clone().or_else(|| {
        ing.metadata
            .annotations
            .get("kubernetes.io/ingress.class")
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    if let Some(class) = class.filter(|c| *c != o.class) {
        out.note(
            &who,
            Severity::Skipped,
            format!("ingress class {class}, not {}: not imported", o.class),
        );
        return;
    }
    let a = annotations::read(ing, &who, &mut out.notes);
    let zones = zones(&ns, &ing.metadata.name, &a, out);
    let (allow, only) = sources(&a, &who, out);

    for tls in &ing.spec.tls {
        if let Some(secret) = &tls.secret_name {
            if !out.secrets.contains(secret) {
                out.secrets.push(secret.clone());
            }
        }
    }
    if !ing.spec.tls.is_empty() && a.ssl_redirect {
        out.note(&who, Severity::Skipped, "ingress-nginx redirects plain HTTP to HTTPS for its TLS hosts (ssl-redirect); tollgate serves both: expose only the TLS port if plain HTTP must not reach the backend");
    }

    let mut n = 0;
    let mut route = |out: &mut Out,
                     host: Option<&str>,
                     is_exact: bool,
                     path: &str,
                     upstream: &str| {
        let key = (
            host.unwrap_or_default().to_owned(),
            is_exact,
            path.to_owned(),
        );
        if let Some(first) = out.taken.get(&key) {
            let message = format!("{} {path} on host {} is already {first}'s: ingress-nginx keeps the oldest Ingress's; this one is dropped", if is_exact { "Exact" } else { "Prefix" }, host.unwrap_or("*"));
            out.note(&who, Severity::Lost, message);
            return;
        }
        out.taken.insert(key, who.clone());
        n += 1;
        out.routes.push(RawRoute {
            name: Some(label(&format!("{ns}-{}-{n}", ing.metadata.name))),
            matcher: RawMatch {
                host: host.filter(|h| !h.is_empty()).map(str::to_owned),
                path: is_exact.then(|| path.to_owned()),
                path_prefix: (!is_exact).then(|| path.to_owned()),
                ..RawMatch::default()
            },
            upstream: Some(upstream.to_owned()),
            zones: Some(zones.clone()),
            max_body_size: a.body_size.clone().map(Text),
            allow_sources: allow.clone(),
            only_allowed_sources: only,
            ..RawRoute::default()
        });
    };

    for rule in &ing.spec.rules {
        let host = rule.host.as_deref();
        for p in rule.http.iter().flat_map(|h| &h.paths) {
            let Some(upstream) = upstream(&p.backend, &ns, &who, &a, m, o, out) else {
                continue;
            };
            let path = p.path.clone().unwrap_or_else(|| "/".into());
            if !path.starts_with('/') {
                out.note(
                    &who,
                    Severity::Lost,
                    format!("path \"{path}\" does not start with /: not translated"),
                );
                continue;
            }
            match p.path_type.as_deref().unwrap_or("Prefix") {
                "Exact" => route(out, host, true, &path, &upstream),
                "Prefix" | "ImplementationSpecific" => {
                    if path.ends_with('/') {
                        route(out, host, false, &path, &upstream);
                    } else {
                        route(out, host, false, &format!("{path}/"), &upstream);
                        if !exact.contains(&(host.unwrap_or_default().to_owned(), path.clone())) {
                            route(out, host, true, &path, &upstream);
                        }
                    }
                }
                other => out.note(&who, Severity::Lost, format!("pathType {other} is not Exact, Prefix or ImplementationSpecific: not translated")),
            }
        }
    }
    if let Some(backend) = &ing.spec.default_backend {
        if let Some(upstream) = upstream(backend, &ns, &who, &a, m, o, out) {
            out.note(
                &who,
                Severity::Skipped,
                "defaultBackend: a route for every host and path no other route takes",
            );
            route(out, None, false, "/", &upstream);
        }
    }
}

/// ingress-nginx answers 404 from its default backend, unlimited, where
/// no path matches: a `location /` on each host without one, and the
/// default server for other hosts. Without these routes every zone would
/// count those requests (a request no route takes meets every zone).
fn not_found(out: &mut Out) {
    let mut hosts: Vec<String> = Vec::new();
    for (host, _, _) in out.taken.keys() {
        if !hosts.contains(host) {
            hosts.push(host.clone());
        }
    }
    // Hosts first, then the catch-all (the empty host).
    hosts.sort_by_key(|h| h.is_empty());
    if !hosts.iter().any(String::is_empty) {
        hosts.push(String::new());
    }
    for host in hosts {
        if out.taken.contains_key(&(host.clone(), false, "/".into())) {
            continue;
        }
        let mut headers = BTreeMap::new();
        headers.insert(
            "content-type".to_owned(),
            "application/problem+json".to_owned(),
        );
        out.routes.push(RawRoute {
            name: Some(if host.is_empty() { "not-found".into() } else { label(&format!("not-found-{host}")) }),
            matcher: RawMatch {
                host: (!host.is_empty()).then(|| host.clone()),
                path_prefix: Some("/".into()),
                ..RawMatch::default()
            },
            respond: Some(RawRespond {
                status: Some(Text::from("404")),
                body: Some("{\"type\":\"about:blank\",\"title\":\"Not Found\",\"status\":404,\"detail\":\"no Ingress path matches this request\"}\n".into()),
                headers: Some(headers),
            }),
            zones: Some(Vec::new()),
            ..RawRoute::default()
        });
    }
}

/// The Ingress's zones (added to `out`), by name.
fn zones(ns: &str, name: &str, a: &Annotations, out: &mut Out) -> Vec<String> {
    let base = label(&format!("{ns}_{name}"));
    let mut names = Vec::new();
    let (req_status, conn_status) = out.statuses.clone();
    let mut zone = |suffix: &str, rate: String, burst: u64, max_conn: Option<u64>| {
        let name = format!("{base}_{suffix}");
        let status = if max_conn.is_some() {
            &conn_status
        } else {
            &req_status
        };
        names.push(name.clone());
        out.zones.push(RawZone {
            name,
            rate: Text(rate),
            burst: Some(Text(burst.to_string())),
            nodelay: Some(true),
            status: Some(Text(status.clone())),
            key: Some("ip".into()),
            size: Some(Text::from(ZONE_SIZE)),
            max_conn: max_conn.map(|n| Text(n.to_string())),
            ..RawZone::default()
        });
    };
    for (per_second, n, unit) in [("rps", a.rps, "s"), ("rpm", a.rpm, "m")] {
        if n > 0 {
            zone(
                per_second,
                format!("{n}r/{unit}"),
                n * a.burst_multiplier,
                None,
            );
        }
    }
    if a.connections > 0 {
        // limit_conn only: a rate that never limits.
        zone("conn", "1000000r/s".into(), 1_000_000, Some(a.connections));
    }
    names
}

/// The routes' `allow_sources` and `only_allowed_sources`.
fn sources(a: &Annotations, who: &str, out: &mut Out) -> (Option<Vec<Text>>, Option<bool>) {
    let texts = |nets: &[String]| Some(nets.iter().map(|n| Text(n.clone())).collect());
    match &a.source_range {
        None if a.limit_allowlist.is_empty() => (None, None),
        None => (texts(&a.limit_allowlist), None),
        Some(range) if !a.limited() => (texts(range), Some(true)),
        Some(range) => {
            let set = |v: &[String]| v.iter().cloned().collect::<BTreeSet<_>>();
            if set(range) == set(&a.limit_allowlist) {
                out.note(who, Severity::Skipped, "clients outside the source range get 403 at once; ingress-nginx counts them against the limits first (503 past the burst)");
            } else {
                out.note(who, Severity::Lost, "a source range with limits: tollgate's allow_sources also skip the limits, which ingress-nginx applies to the allowed sources; the range is translated, the limits skip it");
            }
            (texts(range), Some(true))
        }
    }
}

/// The upstream for a backend (added to `out` once), by name.
#[allow(clippy::too_many_arguments)]
fn upstream(
    b: &Backend,
    ns: &str,
    who: &str,
    a: &Annotations,
    m: &Manifests,
    o: &Options,
    out: &mut Out,
) -> Option<String> {
    let (service, port) = match (&b.service, &b.service_name) {
        (Some(s), _) => (
            s.name.clone(),
            s.port.number.map(Ok).or(s.port.name.clone().map(Err)),
        ),
        (None, Some(name)) => {
            let port = match &b.service_port {
                Some(Value::Number(n)) => n.as_u64().and_then(|n| u16::try_from(n).ok()).map(Ok),
                Some(Value::String(s)) => Some(s.parse::<u16>().map_err(|_| s.clone())),
                _ => None,
            };
            (name.clone(), port)
        }
        (None, None) => {
            let what = if b.resource.is_some() {
                "a resource backend"
            } else {
                "a backend without a service"
            };
            out.note(who, Severity::Lost, format!("{what} is not translated"));
            return None;
        }
    };
    let port = match port {
        Some(Ok(n)) => n,
        Some(Err(name)) => match m
            .services
            .get(&(ns.to_owned(), service.clone()))
            .and_then(|p| p.get(&name))
        {
            Some(n) => *n,
            None => {
                out.note(who, Severity::Lost, format!("Service {ns}/{service}'s port \"{name}\": no Service in the input gives its number; add the Service's manifest to the input"));
                return None;
            }
        },
        None => {
            out.note(
                who,
                Severity::Lost,
                format!("the backend Service {ns}/{service} has no port"),
            );
            return None;
        }
    };
    let name = yaml_safe(&label(&format!("{ns}-{service}-{port}")));
    let wanted = RawUpstream {
        targets: vec![RawTarget::With(RawTargetMap {
            address: Text(format!("{service}.{ns}.svc.{}:{port}", o.cluster_domain)),
            resolve: Some(true),
            ..RawTargetMap::default()
        })],
        connect_timeout: Some(Text(
            a.connect_timeout
                .clone()
                .unwrap_or_else(|| out.defaults.1.clone()),
        )),
        timeout: Some(Text(
            a.read_timeout
                .clone()
                .unwrap_or_else(|| out.defaults.2.clone()),
        )),
        protocol: a.h2.then(|| "h2".into()),
        ..RawUpstream::default()
    };
    match out.upstreams.iter().find(|(n, _)| *n == name) {
        None => out.upstreams.push((name.clone(), wanted)),
        Some((_, had)) => {
            let same = had.connect_timeout == wanted.connect_timeout
                && had.timeout == wanted.timeout
                && had.protocol == wanted.protocol;
            if !same {
                out.note(who, Severity::Skipped, format!("Service {ns}/{service}:{port} is reached with other timeouts or protocol by an earlier Ingress; the first one's apply to both"));
            }
        }
    }
    Some(name)
}

const HEADER: &str = "\
# Written by tollgate import-ingress: Helm values for deploy/helm/tollgate.
#   helm install edge deploy/helm/tollgate -f <this file>
# `config` is a tollgate config without listeners (the chart sets them);
# for a tollgate outside the chart, add listeners and check it with
#   tollgate check --config <file>
";

fn render(out: Out) -> IngressImport {
    let ip_zones = !out.zones.is_empty();
    let config = RawConfig {
        server: Some(RawServer {
            max_body_size: Some(Text(out.defaults.0.clone())),
            ..RawServer::default()
        }),
        // nginx's $binary_remote_addr: one key per whole address.
        client_ip: (ip_zones || out.real_ip.is_some()).then(|| RawClientIp {
            ipv6_prefix: ip_zones.then(|| Text::from("128")),
            trusted_proxies: out
                .real_ip
                .as_ref()
                .map(|(t, _)| t.iter().map(|c| Text(c.clone())).collect()),
            headers: out.real_ip.as_ref().map(|(_, h)| vec![h.clone()]),
            ..RawClientIp::default()
        }),
        zones: out.zones.into_iter().map(|z| (String::new(), z)).collect(),
        upstreams: out
            .upstreams
            .into_iter()
            .map(|(name, u)| (String::new(), name, u))
            .collect(),
        routes: out.routes.into_iter().map(|r| (String::new(), r)).collect(),
        ..RawConfig::default()
    };
    let mut config = serde_yaml::to_value(&config)
        .map(without_nulls)
        .unwrap_or_default();
    // The chart's own zones and routes are replaced, not kept (Helm
    // replaces lists it is given).
    if let Value::Mapping(map) = &mut config {
        for key in ["zones", "routes"] {
            map.entry(key.into())
                .or_insert_with(|| Value::Sequence(Vec::new()));
        }
    }
    let mut values = Mapping::new();
    if !out.secrets.is_empty() {
        let mut tls = Mapping::new();
        let secrets = out
            .secrets
            .iter()
            .map(|s| Value::String(s.clone()))
            .collect();
        tls.insert("secrets".into(), Value::Sequence(secrets));
        values.insert("tls".into(), Value::Mapping(tls));
    }
    values.insert("config".into(), config.clone());
    let mut yaml = String::from(HEADER);
    let mut notes = out.notes;
    notes.sort_by_key(|n| std::cmp::Reverse(n.severity));
    for (severity, title) in [
        (
            Severity::Lost,
            "NOT EQUIVALENT: these change who is limited, how, who gets in, or where requests go:",
        ),
        (
            Severity::Skipped,
            "Not translated, and nothing about limiting or routing depends on it:",
        ),
    ] {
        let mut these = notes.iter().filter(|n| n.severity == severity).peekable();
        if these.peek().is_some() {
            yaml.push_str(&format!("# {title}\n"));
            for n in these {
                yaml.push_str(&format!("#   {}: {}\n", n.at, n.message));
            }
        }
    }
    yaml.push_str(&serde_yaml::to_string(&Value::Mapping(values)).unwrap_or_default());
    IngressImport {
        yaml,
        notes,
        config,
    }
}
