//! The `traces` section as the request path reads it.

use std::sync::Arc;
use std::time::Duration;

/// OpenTelemetry traces: spans POSTed as OTLP/HTTP protobuf.
#[derive(Clone)]
pub struct TracesConfig {
    /// The collector's traces URL (`.../v1/traces`).
    pub uri: http::Uri,
    /// For https URLs.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub service_name: String,
    /// The share of traces started here (or without a sampled parent) kept.
    pub ratio: f64,
    /// Refused (a limit, a ban, a shed) and failed (5xx) requests are kept
    /// whatever the sampling said.
    pub keep_refused_and_failed: bool,
    /// Continue a `traceparent` from any client (else from trusted proxies
    /// only).
    pub trust_any_parent: bool,
    /// The user and plan on spans.
    pub user: bool,
    /// Spans waiting for export; past it new ones are dropped (counted).
    pub queue: usize,
    /// Spans per export request.
    pub batch: usize,
    /// The longest a span waits for its batch.
    pub interval: Duration,
    /// One export request's time limit.
    pub timeout: Duration,
}

impl PartialEq for TracesConfig {
    fn eq(&self, o: &Self) -> bool {
        self.uri == o.uri
            && self.service_name == o.service_name
            && self.ratio == o.ratio
            && self.keep_refused_and_failed == o.keep_refused_and_failed
            && self.trust_any_parent == o.trust_any_parent
            && self.user == o.user
            && (self.queue, self.batch) == (o.queue, o.batch)
            && (self.interval, self.timeout) == (o.interval, o.timeout)
    }
}

impl std::fmt::Debug for TracesConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TracesConfig")
            .field("host", &self.uri.host())
            .field("ratio", &self.ratio)
            .finish()
    }
}
