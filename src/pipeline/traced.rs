//! What a request's span says (`traces`), gathered at the points of the
//! request path that know it: who and what at the start, each limit's
//! decision when they are counted, why it was refused or failed, the
//! store call and each upstream attempt as child spans.

use std::sync::Arc;

use http::Request;

use super::ctx::{Ctx, Rejection};
use crate::error::ProxyError;
use crate::metrics::{Metrics, Outcome};
use crate::traces::{StoreCall, Tracer};

/// Starts the request's span (when traces are on).
pub(super) fn begin(tracer: Option<&Arc<Tracer>>, cx: &mut Ctx<'_>, req: &Request<()>) {
    let Some(tracer) = tracer else { return };
    let t = tracer.begin(req.headers(), cx.client.peer_trusted);
    cx.end.trace = Some(t);
}

/// A limit (or a ban) refused the request: kept whatever the sampling.
pub(super) fn refused(cx: &mut Ctx<'_>, rejection: &Rejection) {
    if let Some(t) = cx.end.trace.as_mut() {
        t.keep();
        t.refused_by = Some((rejection.limit.clone(), rejection.retry_after));
    }
}

/// The request failed (or was shed): kept when the fault is not the
/// client's.
pub(super) fn failed(cx: &mut Ctx<'_>, err: &ProxyError) {
    if let Some(t) = cx.end.trace.as_mut() {
        if !err.is_client_error() || matches!(err, ProxyError::Shed { .. }) {
            t.keep();
        }
        t.error = Some(err.to_string());
    }
}

/// Every limit's decision (`zone/per_ip=allowed`, `route/login=refused`
/// on the span), the delay zones held it for, a bypass.
pub(super) fn decisions(
    cx: &mut Ctx<'_>,
    metrics: &Metrics,
    index: impl Fn(super::decide::Origin) -> Option<usize>,
) {
    let Some(t) = cx.end.trace.as_mut() else {
        return;
    };
    let labels = metrics.limits();
    for &(origin, outcome) in &cx.counted {
        let Some(label) = index(origin).and_then(|i| labels.get(i)) else {
            continue;
        };
        let what = match outcome {
            Outcome::Allowed => "allowed",
            Outcome::Delayed => "delayed",
            Outcome::Rejected => "refused",
            Outcome::DryRunRejected => "dry_run_refused",
        };
        t.limits.push((label.tier, label.name.clone(), what));
    }
    t.delay_ms = cx.delayed_ms;
    t.bypass = cx
        .bypass
        .map(|b| crate::metrics::BYPASS_REASONS[b as usize]);
}

/// One call to the limit store, `start_ns` to now.
pub(super) fn store_call<T, E: std::fmt::Display>(
    cx: &mut Ctx<'_>,
    start_ns: Option<u64>,
    engine: &crate::limiter::engine::Engine,
    checks: usize,
    result: &Result<T, E>,
) {
    let (Some(t), Some(start_ns)) = (cx.end.trace.as_mut(), start_ns) else {
        return;
    };
    t.store_calls.push(StoreCall {
        start_ns,
        end_ns: crate::clock::unix_ns(),
        store: if engine.redis().is_some() {
            "redis"
        } else {
            "memory"
        },
        checks,
        error: result.as_ref().err().map(|e| e.to_string()),
    });
}
