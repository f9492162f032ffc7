//! Validation of `routes`: the match (host, exact path or prefix,
//! methods), the action (`upstream` or `respond`), the body limit, and the
//! precedence order routes are sorted in so the first match wins.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Method, StatusCode};

use super::checker::Checker;
use super::compiled::*;
use super::raw::RawRoute;

pub(super) fn routes(
    c: &mut Checker,
    raw: Vec<(String, RawRoute)>,
    upstreams: &HashMap<String, usize>,
    default_body: u64,
    shared: &super::limits::Shared<'_>,
    store_zones: &mut Vec<crate::limiter::memory::ZoneSpec>,
) -> Vec<RouteConfig> {
    let mut out: Vec<(RouteConfig, String)> = Vec::new();
    for (i, (path, r)) in raw.into_iter().enumerate() {
        let extras = super::limits::route(&path, &r, shared, store_zones, c);
        let m = &r.matcher;
        let path_match = match (&m.path, &m.path_prefix, &m.grpc) {
            (Some(p), None, None) => Some(PathMatch::Exact(p.clone())),
            (None, Some(p), None) => Some(PathMatch::Prefix(p.clone())),
            (None, None, Some(g)) => match grpc_path(g) {
                Ok(m) => Some(m),
                Err(e) => {
                    c.report(format!("{path}.match.grpc"), e);
                    None
                }
            },
            (None, None, None) => {
                c.report(
                    format!("{path}.match"),
                    "needs path (exact), path_prefix or grpc",
                );
                None
            }
            _ => {
                c.report(
                    format!("{path}.match"),
                    "give one of path, path_prefix and grpc",
                );
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
        // gRPC calls are POSTs: a grpc route takes only them, unless it
        // names its methods.
        let methods = methods.or_else(|| m.grpc.as_ref().map(|_| vec![Method::POST]));
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
            index: 0,
            name: Arc::from(r.name.unwrap_or_else(|| format!("routes[{i}]"))),
            host,
            path: path_match,
            methods,
            action,
            max_body_bytes,
            case_insensitive: r.matcher.case_insensitive.unwrap_or(false),
            zones: extras.zones,
            policy: PolicyHeader::of(&extras.limits),
            limits: extras.limits,
            headers: extras.headers,
            warn_at: extras.warn_at,
            webhook: extras.webhook,
            upgrades: upgrades(c, &path, r.upgrades.as_deref()),
            priority: r.priority.as_ref().and_then(|p| {
                super::protect::class(shared.priorities, &format!("{path}.priority"), p, c)
            }),
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
    for (i, r) in routes.iter_mut().enumerate() {
        r.index = i;
    }
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

pub(super) fn parse_host(text: &str) -> Result<HostMatch, String> {
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

/// A route's `upgrades`: protocol names (RFC 9110 §7.8 tokens), lower
/// case; `websocket` when not given. `h2c` is refused: an upgrade to it
/// would carry any number of HTTP/2 requests past routing and every limit,
/// and RFC 9113 §3.1 deprecates it.
fn upgrades(c: &mut Checker, path: &str, list: Option<&[String]>) -> Vec<Box<str>> {
    let Some(list) = list else {
        return vec![Box::from("websocket")];
    };
    let mut out = Vec::with_capacity(list.len());
    for (j, name) in list.iter().enumerate() {
        let at = format!("{path}.upgrades[{j}]");
        let lower = name.trim().to_ascii_lowercase();
        if lower == "h2c" {
            c.report(
                at,
                "h2c is never tunnelled: one upgraded request would carry unlimited HTTP/2 requests past every limit (RFC 9113 section 3.1 deprecates it); clients should use h2 over TLS or prior knowledge",
            );
        } else if lower.is_empty()
            || lower.contains('/')
            || HeaderName::from_bytes(lower.as_bytes()).is_err()
        {
            c.report(
                at,
                format!("expected a protocol name like \"websocket\", got \"{name}\""),
            );
        } else {
            out.push(Box::from(lower));
        }
    }
    out
}

/// Fields a `respond:` answer may not set: the writer frames the body and
/// manages the connection, and a length beside a body of another size
/// would desynchronise the client.
const FRAMING: [&str; 8] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
];

fn respond(c: &mut Checker, path: &str, r: &super::raw::RawRespond) -> Option<Respond> {
    // No 1xx: an interim answer is not a response, and the client would
    // wait for the real one (or read the body as the next response).
    let status = c.number(&format!("{path}.status"), &r.status, 200u16, 200, 599);
    let status = StatusCode::from_u16(status).ok()?;
    let body = Bytes::from(r.body.clone().unwrap_or_default());
    let mut headers = HeaderMap::new();
    let empty = BTreeMap::new();
    for (name, value) in r.headers.as_ref().unwrap_or(&empty) {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            (Ok(n), _) if FRAMING.contains(&n.as_str()) => c.report(
                format!("{path}.headers.{name}"),
                format!(
                    "\"{name}\" is framing or hop-by-hop: tollgate frames the body itself (remove it)"
                ),
            ),
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

/// The path a gRPC service (`pkg.Service`: every method, a prefix) or
/// method (`pkg.Service/Method`: exactly) is called on.
fn grpc_path(name: &str) -> Result<PathMatch, String> {
    let bad = || {
        format!(
            "expected a gRPC service like \"shop.Cart\" or method like \"shop.Cart/Add\", got \"{name}\""
        )
    };
    let word = |s: &str, dots: bool| {
        !s.is_empty()
            && !s.starts_with('.')
            && !s.ends_with('.')
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || (dots && b == b'.'))
    };
    match name.split_once('/') {
        None if word(name, true) => Ok(PathMatch::Prefix(format!("/{name}/"))),
        Some((service, method)) if word(service, true) && word(method, false) => {
            Ok(PathMatch::Exact(format!("/{service}/{method}")))
        }
        _ => Err(bad()),
    }
}
