//! OpenTelemetry traces: a request's span (and its store call's and each
//! upstream attempt's), continued from a trusted client's `traceparent` or
//! started here, passed on to the upstream as its parent, and exported as
//! OTLP/HTTP protobuf off the request path.
//!
//! - `context`: W3C Trace Context, ids.
//! - `otlp`: the protobuf messages.
//! - `export`: the bounded queue and the batches POSTed to the collector.
//!
//! A request holds a [`Trace`] (in its `RequestEnd`) from its first stage
//! to the end of its response body; the stages add attributes and child
//! spans; when it ends the spans are queued, if the trace is sampled or
//! the request was refused or failed (`keep_refused_and_failed`).

pub(crate) mod context;
mod export;
pub(crate) mod otlp;

use std::sync::Arc;

use http::{HeaderMap, HeaderValue};
use smallvec::SmallVec;

pub use self::context::{SpanId, TraceId};
/// The OTLP messages, for tests and tools that read an export.
pub use self::otlp::{ExportTraceServiceRequest, KeyValue, Span, Value};
use crate::config::TracesConfig;

/// The traces of one running config's requests; shared with the configs a
/// reload makes while `traces` stays the same.
pub struct Tracer {
    config: TracesConfig,
    exporter: export::Exporter,
}

impl Tracer {
    pub fn new(config: TracesConfig) -> Arc<Tracer> {
        Arc::new(Tracer {
            exporter: export::Exporter::new(&config),
            config,
        })
    }

    pub fn config(&self) -> &TracesConfig {
        &self.config
    }

    /// A request's trace: continued from its `traceparent` when the peer
    /// may set one (a malformed one is replaced), else started here.
    pub fn begin(self: &Arc<Self>, headers: &HeaderMap, peer_trusted: bool) -> Box<Trace> {
        let start_ns = crate::clock::unix_ns();
        let believed = peer_trusted || self.config.trust_any_parent;
        let parent = headers
            .get("traceparent")
            .filter(|_| believed)
            .and_then(|v| context::parse(v.as_bytes()));
        let (trace_id, parent_id, sampled) = match parent {
            Some(p) => (p.trace_id, Some(p.span_id), p.sampled),
            None => {
                let id = TraceId::random();
                (id, None, self.ratio_keeps(id))
            }
        };
        let state = parent
            .and(headers.get("tracestate"))
            .filter(|v| context::state_ok(v))
            .cloned();
        Box::new(Trace {
            tracer: self.clone(),
            trace_id,
            span_id: SpanId::random(),
            parent: parent_id,
            sampled,
            state,
            start_ns,
            kept: false,
            refused_by: None,
            error: None,
            limits: SmallVec::new(),
            delay_ms: 0,
            bypass: None,
            cost_reserved: None,
            store_calls: SmallVec::new(),
            attempts: SmallVec::new(),
        })
    }

    /// OpenTelemetry's TraceIdRatioBased: the same trace id, the same
    /// choice on every replica.
    fn ratio_keeps(&self, id: TraceId) -> bool {
        let r = self.config.ratio;
        r >= 1.0 || (r > 0.0 && (id.sample_value() as f64) < r * (u64::MAX as f64))
    }

    /// `(what, spans)`: exported, dropped because the queue was full, and
    /// dropped because their export failed.
    pub fn counts(&self) -> [(&'static str, u64); 3] {
        self.exporter.counts()
    }
}

/// One request's span, filled in as it moves along: plain fields (no
/// attribute is built, nothing is formatted) until it ends and is kept.
pub struct Trace {
    tracer: Arc<Tracer>,
    pub trace_id: TraceId,
    pub span_id: SpanId,
    parent: Option<SpanId>,
    pub sampled: bool,
    state: Option<HeaderValue>,
    start_ns: u64,
    /// Refused or failed: kept whatever the sampling said.
    kept: bool,
    /// The refusing limit and its Retry-After seconds.
    pub refused_by: Option<(Arc<str>, u64)>,
    pub error: Option<String>,
    /// Each limit's decision: (tier, name, outcome).
    pub limits: SmallVec<[(&'static str, Arc<str>, &'static str); 4]>,
    pub delay_ms: u64,
    pub bypass: Option<&'static str>,
    pub cost_reserved: Option<u64>,
    pub store_calls: SmallVec<[StoreCall; 1]>,
    pub attempts: SmallVec<[Attempt; 1]>,
}

/// What a request was found to be as it moved along, stage by stage: its
/// access-log line and its span both read it (the pipeline's
/// `AccessRecord`).
pub struct Seen {
    pub listener: Arc<str>,
    pub client: std::net::IpAddr,
    pub method: http::Method,
    pub path: String,
    pub tls: bool,
    pub version: http::Version,
    pub route: Option<Arc<str>>,
    /// The verified user (a JWT claim, or an API key hash), if any.
    pub user: Option<String>,
    /// The caller's plan, if any.
    pub plan: Option<Arc<str>>,
    /// What the limits did: `bypass`, `rejected:<limit>`, or nothing.
    pub rate_limit: Option<String>,
    pub upstream: Option<Arc<str>>,
    pub target: Option<Arc<str>>,
}

/// One call to the limit store.
pub struct StoreCall {
    pub start_ns: u64,
    pub end_ns: u64,
    /// `memory` or `redis`.
    pub store: &'static str,
    pub checks: usize,
    pub error: Option<String>,
}

/// One attempt at an upstream target.
pub struct Attempt {
    pub target: Arc<str>,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The answer's status, if one came.
    pub status: Option<u16>,
    /// Why it failed (a listed status counts), if it did.
    pub failure: Option<&'static str>,
    /// The request was passed on to another target after it.
    pub retried: bool,
}

impl Trace {
    /// What the upstream receives: tollgate's span as its parent.
    pub fn traceparent(&self) -> HeaderValue {
        context::header(self.trace_id, self.span_id, self.sampled)
    }

    /// A continued trace's `tracestate`, passed on unchanged.
    pub fn tracestate(&self) -> Option<&HeaderValue> {
        self.state.as_ref()
    }

    /// The request was refused (a limit, a ban, a shed) or failed.
    pub fn keep(&mut self) {
        self.kept = true;
    }

    fn child(
        &self,
        name: String,
        kind: i32,
        times: (u64, u64),
        attributes: Vec<KeyValue>,
        error: Option<String>,
    ) -> otlp::Span {
        otlp::Span {
            trace_id: self.trace_id.0.to_vec(),
            span_id: SpanId::random().0.to_vec(),
            parent_span_id: self.span_id.0.to_vec(),
            name,
            kind,
            start_time_unix_nano: times.0,
            end_time_unix_nano: times.1.max(times.0),
            attributes,
            status: error.map(|message| otlp::Status {
                message,
                code: otlp::STATUS_ERROR,
            }),
            flags: u32::from(self.sampled),
            ..otlp::Span::default()
        }
    }

    /// The request ended, `took_ns` after it began: its spans are built
    /// and queued for export if the trace is kept.
    pub fn finish(self, took_ns: u64, (status, grpc): (u16, Option<u16>), seen: Option<&Seen>) {
        let keep_anyway = self.tracer.config.keep_refused_and_failed
            && (self.kept || status >= 500 || status == 429);
        if !(self.sampled || keep_anyway) {
            return;
        }
        let method = seen.map_or("", |r| r.method.as_str());
        let mut spans: Vec<otlp::Span> = Vec::new();
        for c in &self.store_calls {
            let attrs = vec![
                KeyValue::string("tollgate.store", c.store),
                KeyValue::int("tollgate.store.checks", c.checks as i64),
                KeyValue::string(
                    "tollgate.store.outcome",
                    if c.error.is_none() { "ok" } else { "error" },
                ),
            ];
            let times = (c.start_ns, c.end_ns);
            spans.push(self.child(
                "tollgate.store".into(),
                otlp::KIND_INTERNAL,
                times,
                attrs,
                c.error.clone(),
            ));
        }
        for a in &self.attempts {
            let mut attrs = vec![
                KeyValue::string("server.address", &*a.target),
                KeyValue::string("http.request.method", method),
            ];
            if let Some(status) = a.status {
                attrs.push(KeyValue::int(
                    "http.response.status_code",
                    i64::from(status),
                ));
            }
            if a.retried {
                attrs.push(KeyValue::string(
                    "tollgate.retry_reason",
                    a.failure.unwrap_or("status"),
                ));
            }
            let error = a.failure.map(str::to_owned);
            spans.push(self.child(
                method.to_owned(),
                otlp::KIND_CLIENT,
                (a.start_ns, a.end_ns),
                attrs,
                error,
            ));
        }
        let name = match seen.and_then(|r| r.route.as_ref()) {
            Some(route) => format!("{method} {route}"),
            None => method.to_owned(),
        };
        let attributes = self.attributes((status, grpc), seen);
        let error = (status >= 500).then(|| format!("answered {status}"));
        spans.push(otlp::Span {
            trace_id: self.trace_id.0.to_vec(),
            span_id: self.span_id.0.to_vec(),
            trace_state: self
                .state
                .as_ref()
                .and_then(|s| s.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
            parent_span_id: self.parent.map(|p| p.0.to_vec()).unwrap_or_default(),
            name,
            kind: otlp::KIND_SERVER,
            start_time_unix_nano: self.start_ns,
            end_time_unix_nano: self.start_ns + took_ns,
            attributes,
            status: error.map(|message| otlp::Status {
                message,
                code: otlp::STATUS_ERROR,
            }),
            flags: u32::from(self.sampled),
        });
        self.tracer.exporter.queue(spans);
    }

    /// The server span's attributes (OpenTelemetry's HTTP semantic
    /// conventions where they have a name, `tollgate.*` where not).
    fn attributes(&self, (status, grpc): (u16, Option<u16>), seen: Option<&Seen>) -> Vec<KeyValue> {
        let mut a = Vec::with_capacity(16);
        let s = KeyValue::string;
        if let Some(r) = seen {
            a.push(s("http.request.method", r.method.as_str()));
            a.push(s("url.path", r.path.as_str()));
            a.push(s("url.scheme", if r.tls { "https" } else { "http" }));
            a.push(KeyValue::string("client.address", r.client.to_string()));
            let version = match r.version {
                http::Version::HTTP_2 => "2",
                http::Version::HTTP_10 => "1.0",
                _ => "1.1",
            };
            a.push(s("network.protocol.version", version));
            a.push(s("tollgate.listener", &r.listener));
        }
        a.push(KeyValue::int(
            "http.response.status_code",
            i64::from(status),
        ));
        let texts = [
            ("http.route", seen.and_then(|r| r.route.as_deref())),
            (
                "tollgate.rate_limit",
                seen.and_then(|r| r.rate_limit.as_deref()),
            ),
            (
                "tollgate.upstream",
                seen.and_then(|r| r.upstream.as_deref()),
            ),
            (
                "tollgate.upstream.target",
                seen.and_then(|r| r.target.as_deref()),
            ),
            ("tollgate.bypass", self.bypass),
            ("error.type", self.error.as_deref()),
        ];
        a.extend(texts.into_iter().filter_map(|(k, v)| Some(s(k, v?))));
        if let Some(r) = seen.filter(|_| self.tracer.config.user) {
            let who = [
                ("enduser.id", r.user.as_deref()),
                ("tollgate.plan", r.plan.as_deref()),
            ];
            a.extend(who.into_iter().filter_map(|(k, v)| Some(s(k, v?))));
        }
        if let Some((limit, retry)) = &self.refused_by {
            a.push(s("tollgate.refused_by", limit));
            a.push(KeyValue::int("tollgate.retry_after_s", *retry as i64));
        }
        if !self.limits.is_empty() {
            let decided = self
                .limits
                .iter()
                .map(|(tier, name, what)| format!("{tier}/{name}={what}"));
            a.push(KeyValue::strings("tollgate.limits", decided));
        }
        let ints = [
            (
                "tollgate.delay_ms",
                (self.delay_ms > 0).then_some(self.delay_ms as i64),
            ),
            (
                "tollgate.cost.reserved",
                self.cost_reserved.map(|c| c as i64),
            ),
            ("rpc.grpc.status_code", grpc.map(i64::from)),
        ];
        a.extend(
            ints.into_iter()
                .filter_map(|(k, v)| Some(KeyValue::int(k, v?))),
        );
        a
    }
}
