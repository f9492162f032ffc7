//! Error types, one per boundary, and the one table that maps a request-time
//! error to the HTTP status and problem body the client sees.

use http::StatusCode;

use std::fmt;

/// One thing wrong with a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// YAML path such as `routes[2].limits[0].window`, or `(file)`.
    pub path: String,
    pub message: String,
    /// Known for syntax errors only.
    pub line: Option<usize>,
}

impl Problem {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Problem {
            path: path.into(),
            message: message.into(),
            line: None,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{} (line {line}): {}", self.path, self.message),
            None => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

/// A config file that cannot be used: unreadable, or a list of problems.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{} problem(s) in the config:\n{}", .0.len(), join(.0))]
    Invalid(Vec<Problem>),
}

fn join(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Why tollgate answered a request itself instead of relaying the upstream.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("no route matches {method} {path}")]
    NoRoute { method: String, path: String },
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed {
        method: String,
        path: String,
        allow: String,
    },
    /// The rate-limit store failed and a `fail_closed` limit refuses.
    /// (A limit that refuses a request is not an error: it is a value the
    /// response stage renders, see `pipeline::ctx::Rejection`.)
    #[error("{0}")]
    LimitUnavailable(crate::limiter::LimiterError),
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("the webhook signature is missing or wrong ({0})")]
    BadSignature(&'static str),
    #[error("the credential could not be verified ({0})")]
    Unauthorized(String),
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    #[error("request headers are {size} bytes; the limit is {limit}")]
    HeadersTooLarge { size: usize, limit: usize },
    #[error("request has {count} header fields; the limit is {limit}")]
    TooManyHeaders { count: usize, limit: usize },
    #[error("the client sent no request body bytes for {0}s")]
    BodyTimeout(u64),
    #[error("request body is larger than the {limit}-byte limit")]
    BodyTooLarge { limit: u64 },
    #[error("the client closed the connection or reset the stream before its request body ended")]
    ClientClosed,
    #[error("transfer codings other than chunked are not supported")]
    UnsupportedCoding,
    #[error("gRPC needs HTTP/2; this request came over HTTP/1.x")]
    GrpcNeedsHttp2,
    #[error("upstream \"{upstream}\" has no reachable target: {reason}")]
    UpstreamUnreachable { upstream: String, reason: String },
    #[error("upstream \"{upstream}\" failed: {reason}")]
    UpstreamFailed { upstream: String, reason: String },
    #[error("the upstream's answer failed before any of it was sent: {0}")]
    UpstreamBodyFailed(String),
    #[error("upstream \"{upstream}\" did not answer within {seconds}s")]
    UpstreamTimeout { upstream: String, seconds: f64 },
    /// The upstream is at its concurrency limit (or every target at its
    /// `max_conns`) and this request's class was shed.
    #[error("upstream \"{upstream}\" is overloaded: a request of class \"{class}\" was shed ({reason}); retry in {retry_after}s")]
    Shed {
        upstream: String,
        class: std::sync::Arc<str>,
        reason: crate::metrics::ShedReason,
        retry_after: u64,
    },
}

impl ProxyError {
    /// The single error -> status table. No catch-all arm: a new variant must
    /// be placed here on purpose.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoRoute { .. } => StatusCode::NOT_FOUND,
            ProxyError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ProxyError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ProxyError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ProxyError::BadSignature(_) => StatusCode::UNAUTHORIZED,
            ProxyError::Forbidden(_) => StatusCode::FORBIDDEN,
            ProxyError::LimitUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ProxyError::TooManyHeaders { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            // nginx's "client closed request": logged, never seen.
            ProxyError::ClientClosed => {
                StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST)
            }
            ProxyError::UnsupportedCoding => StatusCode::NOT_IMPLEMENTED,
            ProxyError::GrpcNeedsHttp2 => StatusCode::HTTP_VERSION_NOT_SUPPORTED,
            ProxyError::UpstreamUnreachable { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamFailed { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamBodyFailed(_) => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::Shed { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Whether the cause is the client (logged at debug) or us / the upstream
    /// (logged at warn).
    pub fn is_client_error(&self) -> bool {
        // A coding tollgate does not implement is the client's choice: its
        // 501 is no reason for a warning a client could flood the log with.
        self.status().is_client_error()
            || matches!(
                self,
                ProxyError::UnsupportedCoding | ProxyError::GrpcNeedsHttp2
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_maps_to_its_status() {
        let up = || "api".to_owned();
        let cases = [
            (
                ProxyError::NoRoute {
                    method: "GET".into(),
                    path: "/x".into(),
                },
                404,
            ),
            (
                ProxyError::MethodNotAllowed {
                    method: "PUT".into(),
                    path: "/x".into(),
                    allow: "GET".into(),
                },
                405,
            ),
            (ProxyError::BadRequest("no host"), 400),
            (ProxyError::Unauthorized("expired".into()), 401),
            (ProxyError::BadSignature("tampered"), 401),
            (ProxyError::Forbidden("not an allowed source"), 403),
            (
                ProxyError::LimitUnavailable(crate::limiter::LimiterError::Closed {
                    limit: "login".into(),
                    cause: "timed out".into(),
                }),
                503,
            ),
            (ProxyError::HeadersTooLarge { size: 9, limit: 8 }, 431),
            (ProxyError::TooManyHeaders { count: 9, limit: 8 }, 431),
            (ProxyError::BodyTooLarge { limit: 8 }, 413),
            (ProxyError::BodyTimeout(60), 408),
            (ProxyError::UnsupportedCoding, 501),
            (ProxyError::GrpcNeedsHttp2, 505),
            (ProxyError::ClientClosed, 499),
            (
                ProxyError::UpstreamUnreachable {
                    upstream: up(),
                    reason: "refused".into(),
                },
                502,
            ),
            (
                ProxyError::UpstreamFailed {
                    upstream: up(),
                    reason: "reset".into(),
                },
                502,
            ),
            (
                ProxyError::UpstreamTimeout {
                    upstream: up(),
                    seconds: 1.0,
                },
                504,
            ),
            (ProxyError::UpstreamBodyFailed("closed".into()), 502),
        ];
        for (err, status) in cases {
            assert_eq!(err.status().as_u16(), status, "{err}");
            let client = status < 500
                || matches!(
                    err,
                    ProxyError::UnsupportedCoding | ProxyError::GrpcNeedsHttp2
                );
            assert_eq!(err.is_client_error(), client, "{err}");
        }
    }
}
