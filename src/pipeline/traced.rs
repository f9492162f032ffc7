//! What a request's span says (`traces`), gathered at the points of the
//! request path that know it: who and what at the start, each limit's
//! decision when they are counted, why it was refused or failed, the
//! store call and each upstream attempt as child spans.

use std::sync::Arc;

use http::Request;

use super::conn::ConnInfo;
use super::ctx::{Ctx, Rejection};
use super::upstream::Attempt;
use crate::error::ProxyError;
use crate::metrics::{Metrics, Outcome};
use crate::traces::{otlp, Child, Tracer};

/// Starts the request's span (when traces are on).
pub(super) fn begin(
    tracer: Option<&Arc<Tracer>>,
    cx: &mut Ctx<'_>,
    req: &Request<()>,
    conn: &ConnInfo,
) {
    let Some(tracer) = tracer else { return };
    let mut t = tracer.begin(req.headers(), cx.client.peer_trusted);
    t.method(req.method().as_str());
    t.string("url.path", req.uri().path());
    t.string("url.scheme", if conn.tls { "https" } else { "http" });
    t.string("client.address", cx.client.client.ip.to_string());
    let version = match req.version() {
        http::Version::HTTP_2 => "2",
        http::Version::HTTP_10 => "1.0",
        _ => "1.1",
    };
    t.string("network.protocol.version", version);
    t.string("tollgate.listener", &*conn.listener);
    cx.end.trace = Some(t);
}

/// A limit (or a ban) refused the request: kept whatever the sampling.
pub(super) fn refused(cx: &mut Ctx<'_>, rejection: &Rejection) {
    if let Some(t) = cx.end.trace.as_mut() {
        t.keep();
        t.string("tollgate.refused_by", &*rejection.limit);
        t.int("tollgate.retry_after_s", rejection.retry_after as i64);
    }
}

/// The request failed (or was shed): kept when the fault is not the
/// client's.
pub(super) fn failed(cx: &mut Ctx<'_>, err: &ProxyError) {
    if let Some(t) = cx.end.trace.as_mut() {
        if !err.is_client_error() || matches!(err, ProxyError::Shed { .. }) {
            t.keep();
        }
        t.string("error.type", err.to_string());
    }
}

/// Every limit's decision, as `tier/name=outcome` (`zone/per_ip=allowed`,
/// `route/login=rejected`), and the delay zones held it for.
pub(super) fn decisions(
    cx: &mut Ctx<'_>,
    metrics: &Metrics,
    index: impl Fn(super::decide::Origin) -> Option<usize>,
) {
    let Some(t) = cx.end.trace.as_mut() else {
        return;
    };
    let labels = metrics.limits();
    let decided: Vec<String> = cx
        .counted
        .iter()
        .filter_map(|&(origin, outcome)| {
            let label = labels.get(index(origin)?)?;
            let what = match outcome {
                Outcome::Allowed => "allowed",
                Outcome::Delayed => "delayed",
                Outcome::Rejected => "refused",
                Outcome::DryRunRejected => "dry_run_refused",
            };
            Some(format!("{}/{}={what}", label.tier, label.name))
        })
        .collect();
    if !decided.is_empty() {
        t.attr(otlp::KeyValue::strings("tollgate.limits", decided));
    }
    if cx.delayed_ms > 0 {
        t.int("tollgate.delay_ms", cx.delayed_ms as i64);
    }
    if let Some(b) = cx.bypass {
        t.string(
            "tollgate.bypass",
            crate::metrics::BYPASS_REASONS[b as usize],
        );
    }
}

/// One call to the limit store, `start_ns` to now.
pub(super) fn store_call<T, E: std::fmt::Display>(
    cx: &mut Ctx<'_>,
    start_ns: Option<u64>,
    store: &'static str,
    checks: usize,
    result: &Result<T, E>,
) {
    let (Some(t), Some(start_ns)) = (cx.end.trace.as_mut(), start_ns) else {
        return;
    };
    t.child(Child {
        name: "tollgate.store".into(),
        kind: otlp::KIND_INTERNAL,
        start_ns,
        end_ns: crate::clock::unix_ns(),
        attrs: vec![
            otlp::KeyValue::string("tollgate.store", store),
            otlp::KeyValue::int("tollgate.store.checks", checks as i64),
            otlp::KeyValue::string(
                "tollgate.store.outcome",
                if result.is_ok() { "ok" } else { "error" },
            ),
        ],
        error: result.as_ref().err().map(|e| e.to_string()),
    });
}

/// Each upstream attempt, a client span: its target, its answer or
/// failure, and whether the request was passed on to another.
pub(super) fn attempts(cx: &mut Ctx<'_>, method: &str, attempts: Vec<Attempt>) {
    let Some(t) = cx.end.trace.as_mut() else {
        return;
    };
    for a in attempts {
        let mut attrs = vec![
            otlp::KeyValue::string("server.address", &*a.target),
            otlp::KeyValue::string("http.request.method", method),
        ];
        if let Some(status) = a.status {
            attrs.push(otlp::KeyValue::int(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        if a.retried {
            attrs.push(otlp::KeyValue::string(
                "tollgate.retry_reason",
                a.failure.unwrap_or("status"),
            ));
        }
        t.child(Child {
            name: method.to_owned(),
            kind: otlp::KIND_CLIENT,
            start_ns: a.start_ns,
            end_ns: a.end_ns,
            attrs,
            error: a.failure.map(str::to_owned),
        });
    }
}
