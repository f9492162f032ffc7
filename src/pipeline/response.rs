//! The last stage: every response tollgate writes itself, and the
//! rate-limit headers of every response on a limited route.
//!
//! - [`problem`]: the RFC 9457 body for an error (status from the one
//!   error -> status table in `error.rs`);
//! - [`rejected`]: a rate-limit rejection, a value the limiting stages
//!   hand on: 429 (or a zone's status), `Retry-After`, a problem body that
//!   names the limit, and for a route limit the route's headers;
//! - [`limit_headers`]: `X-RateLimit-*`, the IETF `RateLimit` /
//!   `RateLimit-Policy` fields and `X-RateLimit-Warning`, from the route
//!   limits' decisions, on allowed and rejected requests alike;
//! - [`respond`]: a `respond` route's canned answer.

use http::header::{HeaderName, HeaderValue, ALLOW, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderMap, Method, Response, StatusCode};

use super::body::ProxyBody;
use super::ctx::{Applied, Rejection};
use super::decide::secs;
use crate::config::{HeaderStyle, Respond, RouteConfig};
use crate::error::ProxyError;
use crate::limiter::{most_restrictive, LimiterError};

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const X_WARNING: HeaderName = HeaderName::from_static("x-ratelimit-warning");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// An RFC 9457 problem body, plus `limit` and `retry_after` when a limit
/// is the cause. Serialised straight from borrowed fields: one buffer, no
/// intermediate JSON value.
#[derive(serde::Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after: Option<u64>,
}

fn problem_body(
    status: StatusCode,
    detail: &str,
    limit: Option<(&str, u64)>,
) -> Response<ProxyBody> {
    let problem = Problem {
        kind: "about:blank",
        title: status.canonical_reason().unwrap_or("Error"),
        status: status.as_u16(),
        detail,
        limit: limit.map(|(name, _)| name),
        retry_after: limit.map(|(_, after)| after),
    };
    let mut body = Vec::with_capacity(96 + detail.len());
    // Writing plain strings and numbers into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut body, &problem);
    let mut resp = Response::new(ProxyBody::full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    if let Some((_, retry_after)) = limit {
        resp.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(retry_after));
    }
    resp
}

/// The response for an error tollgate answers itself.
pub fn problem(err: &ProxyError) -> Response<ProxyBody> {
    let limit = match err {
        // A fail_closed limit that could not be checked: retry soon.
        ProxyError::LimitUnavailable(LimiterError::Closed { limit, .. }) => Some((&**limit, 1)),
        _ => None,
    };
    let mut resp = problem_body(err.status(), &err.to_string(), limit);
    match err {
        ProxyError::Unauthorized(_) => {
            resp.headers_mut().insert(
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer error=\"invalid_token\""),
            );
        }
        ProxyError::MethodNotAllowed { allow, .. } => {
            if let Ok(v) = HeaderValue::from_str(allow) {
                resp.headers_mut().insert(ALLOW, v);
            }
        }
        _ => {}
    }
    resp
}

/// The response for a rate-limit rejection. A route limit's carries the
/// route's rate-limit headers for the decisions made so far.
pub fn rejected(
    r: &Rejection,
    route: Option<&RouteConfig>,
    applied: &[Applied],
) -> Response<ProxyBody> {
    let mut resp = problem_body(r.status, &r.detail, Some((&r.limit, r.retry_after)));
    if let (true, Some(route)) = (r.route_limit, route) {
        add_headers(resp.headers_mut(), route.headers, route.warn_at, applied);
    }
    resp
}

/// Adds the route's rate-limit headers to a response it allowed.
pub fn limit_headers(
    mut resp: Response<ProxyBody>,
    route: Option<&RouteConfig>,
    applied: &[Applied],
) -> Response<ProxyBody> {
    if let Some(route) = route {
        add_headers(resp.headers_mut(), route.headers, route.warn_at, applied);
    }
    resp
}

/// A `respond` route's canned answer.
pub fn respond(r: &Respond, method: &Method) -> Response<ProxyBody> {
    let body = if method == Method::HEAD {
        ProxyBody::empty()
    } else {
        ProxyBody::full(r.body.clone())
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = r.status;
    *resp.headers_mut() = r.headers.clone();
    resp
}

/// The rate-limit headers for `applied`: the most restrictive limit in the
/// legacy fields, every limit in the IETF ones, a warning per limit past
/// `warn_at`.
fn add_headers(headers: &mut HeaderMap, style: HeaderStyle, warn_at: f64, applied: &[Applied]) {
    use std::fmt::Write;
    let Some(worst) = most_restrictive(applied.iter().map(|a| &a.decision)) else {
        return;
    };
    let w = &applied[worst];
    let num = |n: u64| HeaderValue::from(n);
    if style.legacy {
        headers.insert(X_LIMIT, num(w.decision.limit));
        headers.insert(X_REMAINING, num(w.decision.remaining));
        let reset = secs(w.decision.reset_ms.max(1));
        let reset = if style.reset_epoch {
            crate::clock::unix_ms() / 1000 + reset
        } else {
            reset
        };
        headers.insert(X_RESET, num(reset));
    }
    if style.ietf {
        let mut policy = String::with_capacity(40 * applied.len());
        let mut state = String::with_capacity(40 * applied.len());
        for (i, a) in applied.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let d = &a.decision;
            let t = if d.admitted() {
                d.reset_ms.div_ceil(1000)
            } else {
                secs(d.retry_after_ms)
            };
            let _ = write!(
                policy,
                "{sep}\"{}\";q={};w={}",
                a.name,
                d.limit,
                secs(d.window_ms)
            );
            let _ = write!(state, "{sep}\"{}\";r={};t={t}", a.name, d.remaining);
        }
        if let (Ok(p), Ok(s)) = (
            HeaderValue::from_str(&policy),
            HeaderValue::from_str(&state),
        ) {
            headers.insert(RATELIMIT_POLICY, p);
            headers.insert(RATELIMIT, s);
        }
    }
    if style.legacy || style.ietf {
        for a in applied {
            let d = &a.decision;
            let used = d.limit.saturating_sub(d.remaining);
            if d.limit > 0 && used as f64 >= warn_at * d.limit as f64 {
                let text = format!("\"{}\": {used} of {} used", a.name, d.limit);
                if let Ok(v) = HeaderValue::from_str(&text) {
                    headers.append(X_WARNING, v);
                }
            }
        }
    }
}
