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

pub use self::context::{Parent, SpanId, TraceId};
/// The OTLP messages, for tests and tools that read an export.
pub use self::otlp::{AnyValue, ExportTraceServiceRequest, KeyValue, Span, Value};
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
            attrs: Vec::new(),
            children: Vec::new(),
            kept: false,
            name: String::new(),
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

/// One request's span, filled in as it moves along.
pub struct Trace {
    tracer: Arc<Tracer>,
    pub trace_id: TraceId,
    pub span_id: SpanId,
    parent: Option<SpanId>,
    pub sampled: bool,
    state: Option<HeaderValue>,
    start_ns: u64,
    attrs: Vec<KeyValue>,
    children: Vec<otlp::Span>,
    /// Refused or failed: kept whatever the sampling said.
    kept: bool,
    /// `<method>` then `<method> <route>` (OpenTelemetry's HTTP span name).
    name: String,
}

/// One finished child span (a store call, an upstream attempt).
pub struct Child {
    pub name: String,
    /// `otlp::KIND_INTERNAL` or `otlp::KIND_CLIENT`.
    pub kind: i32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attrs: Vec<KeyValue>,
    /// Why it failed, if it did.
    pub error: Option<String>,
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

    /// The request's method: the span's name until a route matches.
    pub fn method(&mut self, method: &str) {
        self.name = method.to_owned();
        self.string("http.request.method", method);
    }

    /// The route that matched: `http.route`, and the span's name.
    pub fn route(&mut self, name: &str) {
        self.name = format!("{} {name}", self.name);
        self.string("http.route", name);
    }

    /// Whether the user and plan may go on the span.
    pub fn names_users(&self) -> bool {
        self.tracer.config.user
    }

    pub fn attr(&mut self, kv: KeyValue) {
        self.attrs.push(kv);
    }

    pub fn string(&mut self, key: &str, v: impl Into<String>) {
        self.attrs.push(KeyValue::string(key, v));
    }

    pub fn int(&mut self, key: &str, v: i64) {
        self.attrs.push(KeyValue::int(key, v));
    }

    /// The request was refused (a limit, a ban, a shed) or failed.
    pub fn keep(&mut self) {
        self.kept = true;
    }

    pub fn child(&mut self, c: Child) {
        self.children.push(otlp::Span {
            trace_id: self.trace_id.0.to_vec(),
            span_id: SpanId::random().0.to_vec(),
            parent_span_id: self.span_id.0.to_vec(),
            name: c.name,
            kind: c.kind,
            start_time_unix_nano: c.start_ns,
            end_time_unix_nano: c.end_ns.max(c.start_ns),
            attributes: c.attrs,
            status: c.error.map(|message| otlp::Status {
                message,
                code: otlp::STATUS_ERROR,
            }),
            flags: u32::from(self.sampled),
            ..otlp::Span::default()
        });
    }

    /// The request ended, `took_ns` after it began: its spans are queued
    /// for export if the trace is kept.
    pub fn finish(self, took_ns: u64, status: u16) {
        let keep_anyway = self.tracer.config.keep_refused_and_failed
            && (self.kept || status >= 500 || status == 429);
        if !(self.sampled || keep_anyway) {
            return;
        }
        let error = (status >= 500).then(|| format!("answered {status}"));
        let mut spans = self.children;
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
            name: self.name,
            kind: otlp::KIND_SERVER,
            start_time_unix_nano: self.start_ns,
            end_time_unix_nano: self.start_ns + took_ns,
            attributes: self.attrs,
            status: error.map(|message| otlp::Status {
                message,
                code: otlp::STATUS_ERROR,
            }),
            flags: u32::from(self.sampled),
        });
        self.tracer.exporter.queue(spans);
    }
}
