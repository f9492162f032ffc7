//! End-of-request bookkeeping, carried in the response body: one
//! access-log event and the connection's in-flight count, both settled when
//! the body is finished or dropped; and the `max_conn` slots the request
//! holds until then. Every stage records what it learnt here (route, user,
//! what the limits did, the target used), so a refused request is logged
//! with as much as was known when it was refused.

use std::sync::Arc;
use std::time::Instant;

use crate::clock::Clock;

use http::StatusCode;

use super::conn::ConnState;
use crate::config::RouteConfig;
use crate::limiter::conn::ConnSlot;
use crate::metrics::Metrics;

/// What the access log line (and the span) needs, filled in as the
/// request moves along.
pub use crate::traces::Seen as AccessRecord;

/// Settles a request when its response body is finished or dropped.
pub struct RequestEnd {
    started: Instant,
    clock: Clock,
    /// `None` when the access log and traces are off: nothing is
    /// allocated for it.
    record: Option<Box<AccessRecord>>,
    /// Whether the access log is on (the record may be the span's only).
    log: bool,
    bytes: u64,
    aborted: bool,
    /// Lets the connection's idle watchdog know a request is running.
    conn: Arc<ConnState>,
    /// A response was handed to the client and its body has not ended:
    /// the connection's send watchdog is watching it.
    responding: bool,
    /// For metrics: the tables of the config that served it, its listener
    /// there (`None`: a listener a reload removed), the route index
    /// (`Metrics::no_route` until one matches) and the status answered.
    metrics: Arc<Metrics>,
    listener: Option<usize>,
    route: usize,
    status: u16,
    /// The call's `grpc-status`, once known (a gRPC call's trailers, or
    /// tollgate's own gRPC answer).
    grpc_status: Option<u16>,
    /// Per-key concurrency slots (`max_conn`), released with the request.
    pub slots: Vec<ConnSlot>,
    /// Reserved costs waiting for the body's trailer or last event.
    pub watch: Option<Box<super::settle::Watch>>,
    /// The request's place in its target's requests in flight.
    pub in_flight: Option<super::upstream::InFlight>,
    /// Its place under the upstream's concurrency limit (`protect`).
    pub permit: Option<super::protect::Permit>,
    /// Its span, when traces are on (`traces`).
    pub trace: Option<Box<crate::traces::Trace>>,
}

impl RequestEnd {
    pub fn new(
        clock: &Clock,
        record: Option<Box<AccessRecord>>,
        conn: Arc<ConnState>,
        metrics: Arc<Metrics>,
        listener: Option<usize>,
        (h2, log): (bool, bool),
    ) -> Self {
        conn.request_started(h2);
        RequestEnd {
            started: clock.now(),
            clock: clock.clone(),
            record,
            log,
            bytes: 0,
            aborted: false,
            responding: false,
            route: metrics.no_route(),
            metrics,
            listener,
            status: 499,
            grpc_status: None,
            conn,
            slots: Vec::new(),
            in_flight: None,
            permit: None,
            watch: None,
            trace: None,
        }
    }

    /// A body frame's data, for a reserved cost read from an event.
    pub fn watch_data(&mut self, data: &bytes::Bytes) {
        if let Some(w) = self.watch.as_mut() {
            w.data(data);
        }
    }

    /// The body's trailers, for a reserved cost read from one.
    pub fn watch_trailers(&mut self, trailers: &http::HeaderMap) {
        if let Some(w) = self.watch.as_mut() {
            w.trailers(trailers);
        }
    }

    /// The caller's plan, named only when the access log is on.
    pub fn set_plan(&mut self, plan: impl FnOnce() -> Arc<str>) {
        if let Some(r) = self.record.as_mut() {
            r.plan = Some(plan());
        }
    }

    pub fn set_status(&mut self, status: StatusCode) {
        self.status = status.as_u16();
    }

    /// A gRPC call's status (`None`: none said yet; a later one wins).
    pub fn set_grpc_status(&mut self, status: Option<u16>) {
        if status.is_some() {
            self.grpc_status = status;
        }
    }

    pub fn set_route(&mut self, route: &RouteConfig) {
        self.route = route.index;
        if let Some(r) = self.record.as_mut() {
            r.route = Some(route.name.clone());
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

    /// The response body is about to be sent (see `responding`).
    pub fn start_response(&mut self) {
        if !self.responding {
            self.responding = true;
            self.conn.response_started();
        }
    }

    /// A body frame of `n` bytes went to the client.
    pub fn add_bytes(&mut self, n: u64) {
        self.bytes += n;
        self.conn.frame_sent();
    }

    /// The clock the request is timed by (its pipeline's).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn mark_aborted(&mut self) {
        self.aborted = true;
    }
}

impl Drop for RequestEnd {
    fn drop(&mut self) {
        if self.responding {
            self.conn.response_finished();
        }
        self.conn.request_finished();
        let took = self.clock.now() - self.started;
        if let Some(listener) = self.listener {
            self.metrics
                .request(listener, self.route, self.status, took);
        }
        if let Some(status) = self.grpc_status {
            self.metrics.grpc_call(self.route, status);
        }
        if let Some(watch) = self.watch.take() {
            watch.finish(self.metrics.clone(), self.clock.unix_ms(), self.aborted);
        }
        let ids = self.trace.take().map(|t| {
            let ids = self.log.then(|| (t.trace_id.hex(), t.span_id.hex()));
            let status = (self.status, self.grpc_status);
            t.finish(took.as_nanos() as u64, status, self.record.as_deref());
            ids
        });
        let Some(r) = self.record.take().filter(|_| self.log) else {
            return;
        };
        let (trace_id, span_id) = match ids.as_ref().and_then(|i| i.as_ref()) {
            Some((t, s)) => (Some(t.as_str()), Some(s.as_str())),
            None => (None, None),
        };
        let ms = took.as_secs_f64() * 1000.0;
        tracing::info!(
            target: "tollgate::access",
            listener = %r.listener,
            client = %r.client,
            method = %r.method,
            path = %r.path,
            status = self.status,
            grpc_status = self.grpc_status,
            route = r.route.as_deref().unwrap_or("-"),
            user = r.user.as_deref().unwrap_or("-"),
            plan = r.plan.as_deref().unwrap_or("-"),
            rate_limit = r.rate_limit.as_deref().unwrap_or("-"),
            upstream = r.upstream.as_deref().unwrap_or("-"),
            upstream_target = r.target.as_deref().unwrap_or("-"),
            duration_ms = (ms * 1000.0).round() / 1000.0,
            bytes = self.bytes,
            aborted = self.aborted,
            trace_id,
            span_id,
            "request"
        );
    }
}
