//! nginx `server`, `listen` and `location` blocks -> listeners and routes.

use super::route::add_route;
use super::{Action, Inherited, Listener, Out, Severity};
use crate::config::raw::{RawRespond, RawTarget, Text};
use crate::import::reader::{Directive, Place};

pub(super) fn server(d: &Directive, block: &[Directive], out: &mut Out, inh: Inherited) {
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

pub(super) fn listen_default(out: &mut Out) -> Option<usize> {
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

fn return_action(r: &Directive, out: &mut Out) -> Option<Action> {
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
            Some(Action::Respond(RawRespond {
                status: Some(Text(code)),
                body: text,
                headers: None,
            }))
        }
    }
}

fn redirect(code: &str, url: &str, r: &Directive, out: &mut Out) -> Option<Action> {
    if url.contains('$') {
        out.note(
            &r.at,
            Severity::Lost,
            format!("redirect to {url}: tollgate answers fixed redirects only (no variables)"),
        );
        return None;
    }
    Some(Action::Respond(RawRespond {
        status: Some(Text(code.to_owned())),
        body: None,
        headers: Some([("location".to_owned(), url.to_owned())].into()),
    }))
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
    let mut action: Option<Option<Action>> = None;
    let mut upstream_used: Option<String> = None;
    let mut grpc = false;
    let mut comments = Vec::new();
    let notes_before = out.notes.len();
    for d in block {
        if out.inheritable(d, &mut own) {
            continue;
        }
        match (d.name.as_str(), &d.block) {
            ("proxy_pass" | "grpc_pass", None) => {
                let found = proxy_pass(d, out);
                upstream_used = found.as_ref().map(|(_, u)| u.clone());
                grpc = d.name == "grpc_pass";
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
        let next = Some(super::upstream::next_upstream(
            &merged.next[usize::from(grpc)],
        ));
        match &u.next_upstream {
            None => u.next_upstream = next,
            Some(first) if format!("{next:?}") != format!("{:?}", Some(first)) => {
                out.note(&l.at, Severity::Lost, format!("location {path}: proxy_next_upstream differs from that of the first location proxying to the same upstream; tollgate keeps one per upstream (the first's)"));
            }
            Some(_) => {}
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

/// The route action and the upstream's name, for `proxy_pass` or
/// `grpc_pass` (an upstream spoken to over HTTP/2: `protocol: h2`).
fn proxy_pass(d: &Directive, out: &mut Out) -> Option<(Action, String)> {
    let url = d.args.first().cloned().unwrap_or_default();
    let directive = d.name.as_str();
    if url.contains('$') {
        out.note(
            &d.at,
            Severity::Lost,
            format!("{directive} {url}: variables are not translated"),
        );
        return None;
    }
    let h2 = directive == "grpc_pass";
    let schemes = if h2 {
        ["grpc://", "grpcs://"]
    } else {
        ["http://", "https://"]
    };
    // `grpc_pass` may name an upstream without a scheme.
    let (tls, rest) = match (url.strip_prefix(schemes[0]), url.strip_prefix(schemes[1])) {
        (Some(r), _) => (false, r),
        (_, Some(r)) => (true, r),
        _ if h2 && !url.contains("://") => (false, url.as_str()),
        _ => {
            out.note(
                &d.at,
                Severity::Lost,
                format!("{directive} {url} is not translated"),
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
    if let Some(u) = out.upstreams.get_mut(authority) {
        u.tls |= tls;
        u.h2 |= h2;
        let name = authority.to_owned();
        return Some((Action::Upstream(name.clone()), name));
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
        u.targets.push(RawTarget::Address(Text(target)));
        u.tls = tls;
    }
    u.h2 |= h2;
    Some((Action::Upstream(name.clone()), name))
}
