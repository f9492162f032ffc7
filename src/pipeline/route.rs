//! Route matching: host (exact or `*.` wildcard), then exact path or the
//! longest path prefix, then method. Routes arrive pre-sorted by precedence
//! (see `config::validate`), so the first full match wins and matching
//! allocates nothing.

use http::Method;

use crate::config::{HostMatch, PathMatch, RouteConfig};
use crate::error::ProxyError;

#[derive(Debug)]
pub enum RouteMatch<'a> {
    Found(&'a RouteConfig),
    /// Some route has this host and path, but not this method.
    MethodNotAllowed(String),
    NotFound,
}

/// The route a request needs past the limits: a 405 naming the methods
/// that path takes, or a 404, when there is none.
pub fn required<'a>(
    found: RouteMatch<'a>,
    method: &Method,
    path: &str,
) -> Result<&'a RouteConfig, ProxyError> {
    match found {
        RouteMatch::Found(r) => Ok(r),
        RouteMatch::MethodNotAllowed(allow) => Err(ProxyError::MethodNotAllowed {
            method: method.to_string(),
            path: path.to_owned(),
            allow,
        }),
        RouteMatch::NotFound => Err(ProxyError::NoRoute {
            method: method.to_string(),
            path: path.to_owned(),
        }),
    }
}

/// `host` is the request's host without port, any case.
pub fn find<'a>(
    routes: &'a [RouteConfig],
    host: Option<&str>,
    path: &str,
    method: &Method,
) -> RouteMatch<'a> {
    let mut allowed: Option<Vec<&'a Method>> = None;
    for route in routes {
        if !host_matches(route.host.as_ref(), host)
            || !path_matches(&route.path, path, route.case_insensitive)
        {
            continue;
        }
        match &route.methods {
            None => return RouteMatch::Found(route),
            Some(methods) if methods.contains(method) => return RouteMatch::Found(route),
            Some(methods) => allowed.get_or_insert_with(Vec::new).extend(methods.iter()),
        }
    }
    match allowed {
        Some(mut methods) => {
            methods.sort_by(|a, b| a.as_str().cmp(b.as_str()));
            methods.dedup();
            let list: Vec<&str> = methods.iter().map(|m| m.as_str()).collect();
            RouteMatch::MethodNotAllowed(list.join(", "))
        }
        None => RouteMatch::NotFound,
    }
}

fn host_matches(want: Option<&HostMatch>, host: Option<&str>) -> bool {
    match (want, host) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(HostMatch::Exact(h)), Some(got)) => got.eq_ignore_ascii_case(h),
        (Some(HostMatch::Suffix(s)), Some(got)) => {
            got.len() > s.len()
                && got.as_bytes()[got.len() - s.len()..].eq_ignore_ascii_case(s.as_bytes())
        }
    }
}

/// Paths arrive normalised (see `normalize`). An exact path also matches
/// with one trailing slash, so `/auth/login/` cannot dodge `/auth/login`.
fn path_matches(want: &PathMatch, path: &str, case_insensitive: bool) -> bool {
    let eq = |a: &str, b: &str| {
        if case_insensitive {
            a.eq_ignore_ascii_case(b)
        } else {
            a == b
        }
    };
    match want {
        PathMatch::Exact(p) => {
            eq(path, p)
                || (path.len() == p.len() + 1 && path.ends_with('/') && eq(&path[..p.len()], p))
        }
        PathMatch::Prefix(p) => {
            path.len() >= p.len() && path.is_char_boundary(p.len()) && eq(&path[..p.len()], p)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn routes(yaml_routes: &str) -> Vec<RouteConfig> {
        let yaml = format!(
            "listeners: [{{ bind: '127.0.0.1:0' }}]\nadmin: {{ enabled: false }}\nroutes:\n{yaml_routes}"
        );
        Config::from_yaml(&yaml, &|_| None).unwrap().routes
    }

    fn name(m: RouteMatch<'_>) -> String {
        match m {
            RouteMatch::Found(r) => r.name.to_string(),
            RouteMatch::MethodNotAllowed(allow) => format!("405 {allow}"),
            RouteMatch::NotFound => "404".into(),
        }
    }

    #[test]
    fn exact_beats_prefix_and_longest_prefix_wins() {
        let r = routes(
            "  - { name: root, match: { path_prefix: / }, respond: {} }
  - { name: api, match: { path_prefix: /api/ }, respond: {} }
  - { name: api-v2, match: { path_prefix: /api/v2/ }, respond: {} }
  - { name: login, match: { path: /api/login }, respond: {} }",
        );
        let get = Method::GET;
        assert_eq!(name(find(&r, None, "/", &get)), "root");
        assert_eq!(name(find(&r, None, "/api/x", &get)), "api");
        assert_eq!(name(find(&r, None, "/api/v2/x", &get)), "api-v2");
        assert_eq!(name(find(&r, None, "/api/login", &get)), "login");
        assert_eq!(name(find(&r, None, "/api/login/x", &get)), "api");
    }

    #[test]
    fn hosts_and_methods_narrow_the_match() {
        let r = routes(
            "  - { name: any, match: { path_prefix: /a }, respond: {} }
  - { name: exact-host, match: { host: api.example.com, path_prefix: / }, respond: {} }
  - { name: wild, match: { host: '*.example.com', path_prefix: / }, respond: {} }
  - { name: post, match: { path: /login, methods: [POST] }, respond: {} }",
        );
        assert_eq!(
            name(find(&r, Some("API.Example.com"), "/a", &Method::GET)),
            "exact-host"
        );
        assert_eq!(
            name(find(&r, Some("x.y.example.com"), "/a", &Method::GET)),
            "wild"
        );
        assert_eq!(
            name(find(&r, Some("example.com"), "/a", &Method::GET)),
            "any"
        );
        assert_eq!(name(find(&r, None, "/login", &Method::POST)), "post");
        assert_eq!(name(find(&r, None, "/login", &Method::GET)), "405 POST");
        assert_eq!(name(find(&r, None, "/nope", &Method::GET)), "404");
    }
}
