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

use std::cell::RefCell;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, ALLOW, CONTENT_LENGTH, WWW_AUTHENTICATE};
use http::{Method, Response, StatusCode};
use smallvec::SmallVec;

use super::body::{HeadLines, ProxyBody};
use super::ctx::{Applied, Cause, Rejection};
use crate::config::{write_policy_item, HeaderStyle, Respond, RouteConfig};
use crate::error::ProxyError;

pub(crate) mod grpc;
use crate::limiter::{most_restrictive, secs, LimiterError};

const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
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

/// The problem type of a penalty box's refusal (the IETF rate-limit
/// headers draft's).
pub const ABNORMAL_USAGE: &str =
    "https://iana.org/assignments/http-problem-types#abnormal-usage-detected";

fn problem_json(status: StatusCode, detail: &str, limit: Option<(&str, u64)>) -> Bytes {
    problem_json_of("about:blank", status, detail, limit)
}

fn problem_json_of(
    kind: &'static str,
    status: StatusCode,
    detail: &str,
    limit: Option<(&str, u64)>,
) -> Bytes {
    let problem = Problem {
        kind,
        title: status.canonical_reason().unwrap_or("Error"),
        status: status.as_u16(),
        detail,
        limit: limit.map(|(name, _)| name),
        retry_after: limit.map(|(_, after)| after),
    };
    let mut body = Vec::with_capacity(96 + detail.len());
    // Writing plain strings and numbers into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut body, &problem);
    body.into()
}

/// A problem response with `body` (see [`problem_json`]). Its fields
/// travel as encoded lines (see [`HeadLines`]), with room for `more`
/// bytes of them (a route's rate-limit fields): no header map is built
/// for the path a flood takes.
fn problem_response(
    status: StatusCode,
    body: Bytes,
    retry_after: Option<u64>,
    more: usize,
) -> Response<ProxyBody> {
    const TYPE_LINE: &[u8] = b"content-type: application/problem+json\r\n";
    let mut body = ProxyBody::full(body);
    let lines = &mut body.lines_mut().lines;
    lines.reserve(TYPE_LINE.len() + 36 + more);
    lines.extend_from_slice(TYPE_LINE);
    if let Some(retry_after) = retry_after {
        lines.extend_from_slice(b"retry-after: ");
        lines.extend_from_slice(itoa::Buffer::new().format(retry_after).as_bytes());
        lines.extend_from_slice(b"\r\n");
    }
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp
}

fn problem_body(
    status: StatusCode,
    detail: &str,
    limit: Option<(&str, u64)>,
) -> Response<ProxyBody> {
    let body = problem_json(status, detail, limit);
    problem_response(status, body, limit.map(|(_, after)| after), 0)
}

/// Rejection bodies rendered lately on this thread. A flood meets one
/// limit with a handful of retry times over and over: the body is
/// rendered once and shared. Entries hold their limit's strings, so a
/// reload's new ones never match an old body.
const REJECTION_BODIES: usize = 32;

struct CachedRejection {
    limit: Arc<str>,
    cause: Cause,
    retry_after: u64,
    status: StatusCode,
    body: Bytes,
}

impl CachedRejection {
    fn is_for(&self, r: &Rejection) -> bool {
        let same_cause = match (&self.cause, &r.cause) {
            // (the same Arc mostly; a quota's text names its reset and
            // is made per refusal: then the same words)
            (Cause::Rate(a), Cause::Rate(b)) => Arc::ptr_eq(a, b) || a == b,
            (a, b) => a == b,
        };
        Arc::ptr_eq(&self.limit, &r.limit)
            && same_cause
            && self.retry_after == r.retry_after
            && self.status == r.status
    }
}

/// `r`'s problem body, from this thread's recent ones when it is there.
fn rejection_body(r: &Rejection) -> Bytes {
    thread_local! {
        static RECENT: RefCell<(Vec<CachedRejection>, usize)> = const { RefCell::new((Vec::new(), 0)) };
    }
    RECENT.with(|recent| {
        let mut recent = recent.borrow_mut();
        let (entries, next) = &mut *recent;
        if let Some(hit) = entries.iter().find(|e| e.is_for(r)) {
            return hit.body.clone();
        }
        let kind = match r.cause {
            Cause::Penalty(_) => ABNORMAL_USAGE,
            _ => "about:blank",
        };
        let body = problem_json_of(kind, r.status, &r.detail(), Some((&r.limit, r.retry_after)));
        let entry = CachedRejection {
            limit: r.limit.clone(),
            cause: r.cause.clone(),
            retry_after: r.retry_after,
            status: r.status,
            body: body.clone(),
        };
        if entries.len() < REJECTION_BODIES {
            entries.push(entry);
        } else {
            entries[*next] = entry;
            *next = (*next + 1) % REJECTION_BODIES;
        }
        body
    })
}

/// The response for an error tollgate answers itself.
pub fn problem(err: &ProxyError) -> Response<ProxyBody> {
    let limit = match err {
        // A fail_closed limit that could not be checked: retry soon.
        ProxyError::LimitUnavailable(LimiterError::Closed { limit, .. }) => Some((&**limit, 1)),
        _ => None,
    };
    let mut resp = match err {
        // Shed by an overloaded upstream: retry soon, no limit to name.
        ProxyError::Shed { retry_after, .. } => {
            let body = problem_json(err.status(), &err.to_string(), None);
            problem_response(err.status(), body, Some(*retry_after), 0)
        }
        _ => problem_body(err.status(), &err.to_string(), limit),
    };
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
    let more = match (r.route_limit, route) {
        (true, Some(route)) => lines_room(route.headers, applied),
        _ => 0,
    };
    let mut resp = problem_response(r.status, rejection_body(r), Some(r.retry_after), more);
    if let (true, Some(route)) = (r.route_limit, route) {
        add_headers(&mut resp, route, applied);
    }
    resp
}

/// Adds the route's rate-limit headers to a response it allowed.
pub fn limit_headers(
    resp: &mut Response<ProxyBody>,
    route: Option<&RouteConfig>,
    applied: &[Applied],
) {
    if let Some(route) = route {
        add_headers(resp, route, applied);
    }
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
    if method == Method::HEAD {
        // The length a GET's answer would have (RFC 9110 section 9.3.2).
        resp.headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from(r.body.len()));
    }
    resp
}

/// The rate-limit headers for `applied`: the most restrictive limit in the
/// legacy fields, every limit in the IETF ones, a warning per limit past
/// the route's `warn_at`. They travel with the body as encoded lines (see
/// [`HeadLines`]): the HTTP/1 server writes them as they are,
/// no header map insert on the way; they replace any of the same names
/// the response has (an upstream's own `X-RateLimit-Limit`), but not its
/// warnings.
fn add_headers(resp: &mut Response<ProxyBody>, route: &RouteConfig, applied: &[Applied]) {
    let (style, warn_at) = (route.headers, route.warn_at);
    let Some(worst) = most_restrictive(applied.iter().map(|a| &a.decision)) else {
        return;
    };
    if !style.legacy && !style.ietf {
        return;
    }
    let w = &applied[worst];
    replace_own(resp, style);
    let lines = &mut resp.body_mut().lines_mut().lines;
    lines.reserve(lines_room(style, applied));
    // Numbers and punctuation are valid field values; a limit name may not
    // be (a control character in it, say): then each line is checked.
    let check = !applied.iter().all(|a| a.name.bytes().all(field_byte));
    let mut digits = itoa::Buffer::new();
    if style.legacy {
        // Numbers only: always valid values, each line written as it is.
        let reset = secs(w.decision.reset_ms.max(1));
        let reset = if style.reset_epoch {
            crate::clock::unix_ms() / 1000 + reset
        } else {
            reset
        };
        lines.extend_from_slice(b"x-ratelimit-limit: ");
        lines.extend_from_slice(digits.format(w.decision.limit).as_bytes());
        lines.extend_from_slice(b"\r\nx-ratelimit-remaining: ");
        lines.extend_from_slice(digits.format(w.decision.remaining).as_bytes());
        lines.extend_from_slice(b"\r\nx-ratelimit-reset: ");
        lines.extend_from_slice(digits.format(reset).as_bytes());
        lines.extend_from_slice(b"\r\n");
    }
    let mut lines = Lines { buf: lines, check };
    if style.ietf {
        // The policy is the route's as configured unless a decision says
        // otherwise (a `local` fallback divides quotas).
        let p = &route.policy;
        let configured = p.items.len() == applied.len()
            && p.items.iter().zip(applied).all(|((name, q, w), a)| {
                Arc::ptr_eq(name, &a.name) && a.decision.limit == *q && a.decision.window_ms == *w
            });
        match (&p.value, configured) {
            (Some(v), true) => {
                lines.line(b"ratelimit-policy: ", |b| b.extend_from_slice(v.as_bytes()))
            }
            _ => {
                let mut text = String::with_capacity(40 * applied.len());
                for (i, a) in applied.iter().enumerate() {
                    let d = &a.decision;
                    write_policy_item(&mut text, i == 0, &a.name, d.limit, d.window_ms);
                }
                lines.line(b"ratelimit-policy: ", |b| {
                    b.extend_from_slice(text.as_bytes())
                });
            }
        }
        lines.line(b"ratelimit: ", |b| {
            for (i, a) in applied.iter().enumerate() {
                let d = &a.decision;
                let t = if d.admitted() {
                    d.reset_ms.div_ceil(1000)
                } else {
                    secs(d.retry_after_ms)
                };
                b.extend_from_slice(if i > 0 { b", \"" } else { b"\"" });
                b.extend_from_slice(a.name.as_bytes());
                b.extend_from_slice(b"\";r=");
                b.extend_from_slice(digits.format(d.remaining).as_bytes());
                b.extend_from_slice(b";t=");
                b.extend_from_slice(digits.format(t).as_bytes());
            }
        });
    }
    for a in applied {
        let d = &a.decision;
        let used = d.limit.saturating_sub(d.remaining);
        if d.limit > 0 && used as f64 >= warn_at * d.limit as f64 {
            let text = format!("\"{}\": {used} of {} used", a.name, d.limit);
            lines.line(b"x-ratelimit-warning: ", |b| {
                b.extend_from_slice(text.as_bytes())
            });
        }
    }
}

/// What the rate-limit fields for `applied` usually take (small numbers):
/// within the room an upstream's lines were given (`upstream::h1`'s
/// `parse_head`), or a rejection's, so the lines are not moved.
fn lines_room(style: HeaderStyle, applied: &[Applied]) -> usize {
    let names: usize = applied.iter().map(|a| a.name.len()).sum();
    let legacy = if style.legacy { 80 } else { 0 };
    let ietf = if style.ietf {
        40 + 2 * names + 40 * applied.len()
    } else {
        0
    };
    legacy + ietf
}

/// Takes out of `resp` the fields `style` makes tollgate set: tollgate's
/// replace the response's own (an upstream's `X-RateLimit-Limit`, rarely
/// there), but not its warnings. One walk over the map's few fields, no
/// hashed lookup; the upstream's fields were looked at as they were read.
fn replace_own(resp: &mut Response<ProxyBody>, style: HeaderStyle) {
    static NAMES: [HeaderName; 5] = [X_LIMIT, X_REMAINING, X_RESET, RATELIMIT_POLICY, RATELIMIT];
    let ours = &NAMES[if style.legacy { 0 } else { 3 }..if style.ietf { 5 } else { 3 }];
    let headers = resp.headers_mut();
    let clash = |n: &HeaderName| {
        let s = n.as_str();
        (s.starts_with("x-ratelimit-") || s.starts_with("ratelimit")) && ours.contains(n)
    };
    if headers.keys().any(clash) {
        let gone: SmallVec<[HeaderName; 5]> =
            headers.keys().filter(|n| clash(n)).cloned().collect();
        for name in gone {
            headers.remove(name);
        }
    }
    let head = resp.body_mut().lines_mut();
    if head.rate_limit_names {
        let mut kept = HeadLines {
            lines: BytesMut::with_capacity(head.lines.capacity()),
            date: head.date,
            rate_limit_names: true,
        };
        for (name, value) in HeadLines::fields(&head.lines) {
            if !ours.iter().any(|n| n.as_str().as_bytes() == name) {
                kept.push(name, value);
            }
        }
        *head = kept;
    }
}

/// A byte a field value may hold (`HeaderValue`'s rule).
fn field_byte(b: u8) -> bool {
    b == b'\t' || (b >= 0x20 && b != 0x7f)
}

/// Header fields encoded as `name: value\r\n` lines into a response's
/// [`HeadLines`].
struct Lines<'a> {
    buf: &'a mut BytesMut,
    /// Whether values must be checked (see [`Lines::line`]).
    check: bool,
}

impl Lines<'_> {
    /// Adds the line `start` (a field's name and `: `) begins with the
    /// value `write` appends. With `check`, a value that is not a valid
    /// field value is left out, as `HeaderValue` would refuse it.
    fn line(&mut self, start: &'static [u8], write: impl FnOnce(&mut BytesMut)) {
        let at = self.buf.len();
        self.buf.extend_from_slice(start);
        let value = self.buf.len();
        write(self.buf);
        if self.check && !self.buf[value..].iter().all(|&b| field_byte(b)) {
            self.buf.truncate(at);
            return;
        }
        self.buf.extend_from_slice(b"\r\n");
    }
}

/// Moves the fields a response carries as encoded lines (the upstream's
/// and the rate-limit headers, see [`HeadLines`]) into its header map, for
/// hyper's servers (HTTP/2, and HTTP/1 connections handed over), which
/// write only the map.
pub fn fields_into_map(resp: &mut Response<ProxyBody>) {
    let lines = resp.body_mut().take_lines();
    if !lines.lines.is_empty() {
        lines.into_map(resp.headers_mut());
    }
}

#[cfg(test)]
mod tests;
