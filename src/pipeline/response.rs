//! The last stage: responses tollgate writes itself (RFC 9457 problem
//! bodies, `respond` routes) and the end-of-request bookkeeping carried in
//! the response body: one access-log event and the connection's in-flight
//! count, both settled when the body is finished or dropped.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use http::header::{HeaderValue, ALLOW, CONTENT_TYPE, WWW_AUTHENTICATE};
use http::{Method, Response, StatusCode};

use super::body::ProxyBody;
use crate::config::Respond;
use crate::error::ProxyError;
use crate::listener::conn::ConnState;

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// Builds the RFC 9457 body for an error tollgate answers itself.
pub fn problem(err: &ProxyError) -> Response<ProxyBody> {
    let status = err.status();
    let mut body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": err.to_string(),
    });
    if let ProxyError::RateLimited {
        limit, retry_after, ..
    } = err
    {
        body["limit"] = serde_json::Value::from(limit.as_str());
        body["retry_after"] = serde_json::Value::from(*retry_after);
    }
    let mut resp = Response::new(ProxyBody::full(body.to_string()));
    *resp.status_mut() = status;
    if let ProxyError::RateLimited {
        headers,
        retry_after,
        ..
    } = err
    {
        resp.headers_mut().extend((**headers).clone());
        resp.headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from(*retry_after));
    }
    resp.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    if let ProxyError::Unauthorized(_) = err {
        resp.headers_mut().insert(
            WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer error=\"invalid_token\""),
        );
    }
    if let ProxyError::MethodNotAllowed { allow, .. } = err {
        if let Ok(v) = HeaderValue::from_str(allow) {
            resp.headers_mut().insert(ALLOW, v);
        }
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

/// What the access log line needs, filled in as the request moves along.
pub struct AccessRecord {
    pub listener: Arc<str>,
    pub client: IpAddr,
    pub method: Method,
    pub path: String,
    pub route: Option<Arc<str>>,
    /// The verified user (a JWT claim, or an API key hash), if any.
    pub user: Option<String>,
    /// What the limits did: `bypass`, `rejected:<limit>`, or nothing.
    pub rate_limit: Option<String>,
    pub upstream: Option<Arc<str>>,
    pub target: Option<Arc<str>>,
    pub status: StatusCode,
}

/// Settles a request when its response body is finished or dropped.
pub struct RequestEnd {
    started: Instant,
    /// `None` when the access log is off: nothing is allocated for it.
    record: Option<Box<AccessRecord>>,
    bytes: u64,
    aborted: bool,
    /// Lets the connection's idle watchdog know a request is running.
    conn: Arc<ConnState>,
    /// Per-key concurrency slots (`max_conn`), released with the request.
    pub slots: Vec<crate::pipeline::limits::ConnSlot>,
}

impl RequestEnd {
    pub fn new(started: Instant, record: Option<Box<AccessRecord>>, conn: Arc<ConnState>) -> Self {
        conn.request_started();
        RequestEnd {
            started,
            record,
            bytes: 0,
            aborted: false,
            conn,
            slots: Vec::new(),
        }
    }

    pub fn set_status(&mut self, status: StatusCode) {
        if let Some(r) = self.record.as_mut() {
            r.status = status;
        }
    }

    pub fn set_route(&mut self, name: &Arc<str>) {
        if let Some(r) = self.record.as_mut() {
            r.route = Some(name.clone());
        }
    }

    pub fn set_rate_limit(&mut self, what: impl FnOnce() -> String) {
        if let Some(r) = self.record.as_mut() {
            r.rate_limit = Some(what());
        }
    }

    pub fn set_user(&mut self, user: &str) {
        if let Some(r) = self.record.as_mut() {
            r.user = Some(user.to_owned());
        }
    }

    pub fn set_upstream(&mut self, name: &Arc<str>) {
        if let Some(r) = self.record.as_mut() {
            r.upstream = Some(name.clone());
        }
    }

    pub fn set_target(&mut self, target: Option<Arc<str>>) {
        if let Some(r) = self.record.as_mut() {
            r.target = target;
        }
    }

    pub fn add_bytes(&mut self, n: u64) {
        self.bytes += n;
    }

    pub fn mark_aborted(&mut self) {
        self.aborted = true;
    }
}

impl Drop for RequestEnd {
    fn drop(&mut self) {
        self.conn.request_finished();
        let Some(r) = self.record.take() else { return };
        let ms = self.started.elapsed().as_secs_f64() * 1000.0;
        tracing::info!(
            target: "tollgate::access",
            listener = %r.listener,
            client = %r.client,
            method = %r.method,
            path = %r.path,
            status = r.status.as_u16(),
            route = r.route.as_deref().unwrap_or("-"),
            user = r.user.as_deref().unwrap_or("-"),
            rate_limit = r.rate_limit.as_deref().unwrap_or("-"),
            upstream = r.upstream.as_deref().unwrap_or("-"),
            upstream_target = r.target.as_deref().unwrap_or("-"),
            duration_ms = (ms * 1000.0).round() / 1000.0,
            bytes = self.bytes,
            aborted = self.aborted,
            "request"
        );
    }
}
