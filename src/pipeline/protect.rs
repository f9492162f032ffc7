//! The protect stage: before a request goes to its upstream, the
//! upstream's gate admits it under its adaptive concurrency limit, lets
//! it wait in the upstream's queue, or sheds it (503 with Retry-After;
//! gRPC UNAVAILABLE with a RetryInfo). What is shed first is decided by
//! the request's priority class: a class named by a header from a
//! trusted proxy, else by its route, else by its plan, else the default.
//!
//! `gate` holds the limit and the queue, `controller` learns the limit.
//! An upstream with neither `concurrency` nor `queue` has no gate, and
//! this stage costs its requests one branch.

pub(crate) mod controller;
mod gate;

use std::sync::Arc;

use http::HeaderMap;

pub use self::gate::{Gate, Permit, Shed};
use super::ctx::Ctx;
use crate::config::Priorities;
use crate::error::ProxyError;

/// The priority class of a request.
pub fn class(p: &Priorities, cx: &Ctx<'_>, headers: &HeaderMap) -> u8 {
    if let (Some(h), true) = (&p.header, cx.client.peer_trusted) {
        if let Some(c) = headers.get(h).and_then(|v| p.find(v.as_bytes())) {
            return c;
        }
    }
    if let Some(c) = cx.route.and_then(|r| r.priority) {
        return c;
    }
    cx.plan
        .and_then(|i| p.plans.get(i as usize).copied().flatten())
        .unwrap_or(p.default)
}

/// Admits the request to `upstream`'s gate (if it has one), waiting in
/// its queue at most until its gRPC deadline (`grpc-timeout`) too; the
/// place is held in `cx.end` until the answer has been relayed.
pub async fn admit(
    gate: Option<&Arc<Gate>>,
    upstream: &str,
    p: &Priorities,
    cx: &mut Ctx<'_>,
    headers: &HeaderMap,
) -> Result<(), ProxyError> {
    let Some(gate) = gate else {
        return Ok(());
    };
    let class = self::class(p, cx, headers);
    cx.class = (class, p.never_shed(class));
    let deadline = super::response::grpc::timeout(headers).map(|t| tokio::time::Instant::now() + t);
    match gate.admit(class, p.never_shed(class), deadline).await {
        Ok(permit) => {
            cx.end.permit = Some(permit);
            Ok(())
        }
        Err(shed) => Err(shed_error(upstream, p, shed, cx)),
    }
}

/// A request the upstream shed while every target was at its
/// `max_conns` (its queue full, or its time up): named and logged as the
/// gate's are (`Upstream::send` knows no class names).
pub fn named(err: ProxyError, p: &Priorities, cx: &mut Ctx<'_>) -> ProxyError {
    match err {
        ProxyError::Shed {
            upstream, reason, ..
        } => {
            let shed = Shed {
                class: cx.class.0,
                reason,
            };
            shed_error(&upstream, p, shed, cx)
        }
        other => other,
    }
}

/// The answer to a shed request, logged with its class and reason, and
/// noted in its access-log line.
fn shed_error(upstream: &str, p: &Priorities, shed: Shed, cx: &mut Ctx<'_>) -> ProxyError {
    let class = p
        .names
        .get(shed.class as usize)
        .cloned()
        .unwrap_or_else(|| Arc::from("default"));
    let reason = shed.reason;
    tracing::info!(upstream, class = %class, %reason, "request shed: the upstream is overloaded");
    cx.end.set_rate_limit(|| format!("shed:{class}:{reason}"));
    ProxyError::Shed {
        upstream: upstream.to_owned(),
        class,
        reason,
        retry_after: 1,
    }
}
