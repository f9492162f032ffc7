//! `/api/upstreams`: the upstreams' targets as the balancer sees them.
//!
//! - `GET /api/upstreams`: per upstream, its balancing method and each
//!   target's state (`up`, `down` until when, `draining`, `down` in the
//!   config), whether it is a backup, its requests in flight (and
//!   `max_conns`), answers, failures by reason, retries by reason, times
//!   marked down, and its last failure with its reason; with `concurrency`
//!   or `queue` configured, `protect`: the limit now and its history (one
//!   point a second), requests in flight and queued, the measured unloaded
//!   latency, and shed requests by class and reason.
//! - `PUT /api/upstreams/<upstream>/<target>` with `{"down": true}`
//!   drains the target (no new requests; those in flight finish) until it
//!   is set back with `{"down": false}` or the config is reloaded. Logged
//!   with who asked.

use http::StatusCode;
use serde_json::{json, Value};

use super::{problem, Caller};
use crate::metrics::{ProtectReport, ShedReason, TargetReport};
use crate::pipeline::upstream::Failure;
use crate::pipeline::Pipeline;

type Reply = (StatusCode, Value);

/// `GET /api/upstreams`.
pub fn list(p: &Pipeline) -> Reply {
    let upstreams: Vec<Value> = p
        .upstreams
        .iter()
        .zip(p.upstreams_report())
        .map(|(u, report)| {
            json!({
                "name": &*report.name,
                "balance": u.balance_name(),
                "retry_budget_refused": report.budget_refused,
                "resolve_failures": report.resolve_failures,
                "sent_while_all_failing_checks": report.all_failing_checks,
                "targets": report.targets.iter().map(target_json).collect::<Vec<_>>(),
                "protect": report.protect.as_ref().map(protect_json),
            })
        })
        .collect();
    (StatusCode::OK, json!({ "upstreams": upstreams }))
}

/// An upstream as `/api/overview` (the dashboard) shows it.
pub fn overview_json(u: &crate::metrics::UpstreamReport) -> Value {
    json!({
        "name": &*u.name,
        "targets": u.targets.iter().map(target_json).collect::<Vec<_>>(),
        "protect": u.protect.as_ref().map(protect_json),
    })
}

/// An upstream's concurrency limit, queue and shed requests by class.
pub fn protect_json(r: &ProtectReport) -> Value {
    let shed: serde_json::Map<String, Value> = r
        .classes
        .iter()
        .zip(&r.shed)
        .map(|(class, counts)| {
            let by: serde_json::Map<String, Value> = ShedReason::ALL
                .iter()
                .map(|why| (why.name().to_owned(), json!(counts[*why as usize])))
                .collect();
            (class.to_string(), Value::Object(by))
        })
        .collect();
    json!({
        "limit": r.limit,
        "in_flight": r.in_flight,
        "queued": r.queued,
        "queue_size": r.queue_size,
        "min_rtt_ms": r.min_rtt_us.map(|us| us as f64 / 1000.0),
        "measuring_min_rtt": r.probing,
        "dequeued": r.dequeued,
        "classes": r.classes.iter().map(|c| &**c).collect::<Vec<_>>(),
        "shed": shed,
        "history": r.history.iter().map(|(s, l)| json!([s, l])).collect::<Vec<_>>(),
    })
}

/// One target as `/api/upstreams` and `/api/overview` show it.
pub fn target_json(t: &TargetReport) -> Value {
    let state = if t.down {
        "down"
    } else if t.draining {
        "draining"
    } else if t.check_failed {
        "unhealthy"
    } else if t.down_until_unix_ms.is_some() {
        "failed"
    } else {
        "up"
    };
    let by_reason = |counts: &[u64]| -> serde_json::Map<String, Value> {
        Failure::ALL
            .iter()
            .map(|f| f.name())
            .chain(std::iter::once("stale_connection"))
            .zip(counts)
            .filter(|(_, n)| **n != 0)
            .map(|(name, n)| (name.to_owned(), json!(n)))
            .collect()
    };
    json!({
        "target": &*t.authority,
        "state": state,
        "backup": t.backup,
        "down_until_unix_ms": t.down_until_unix_ms,
        "in_flight": t.in_flight,
        "max_conns": t.max_conns,
        "responses": t.ok,
        "failures": by_reason(&t.failures),
        "retries": by_reason(&t.retries),
        "marked_down": t.marked_down,
        "health_checks": { "passed": t.checks[0], "failed": t.checks[1] },
        "slow_start_share": t.ramping.map(|r| f64::from(r) / 1000.0),
        "last_failure": t.last_failure.map(|(at, why)| json!({ "unix_ms": at, "reason": why.name() })),
    })
}

/// `PUT /api/upstreams/<upstream>/<target>` with `{"down": bool}`.
pub fn put(rest: &str, body: &[u8], p: &Pipeline, caller: &Caller) -> Reply {
    let Some((name, target)) = rest.split_once('/') else {
        return problem(
            StatusCode::NOT_FOUND,
            "expected /api/upstreams/<upstream>/<target>, the target as host:port",
        );
    };
    let down = match serde_json::from_slice::<Value>(body) {
        Ok(v) => v.get("down").and_then(Value::as_bool),
        Err(_) => None,
    };
    let Some(down) = down else {
        return problem(
            StatusCode::BAD_REQUEST,
            "expected a JSON body {\"down\": true} (drain) or {\"down\": false} (back)",
        );
    };
    let Some(upstream) = p.upstreams.iter().find(|u| &*u.name == name) else {
        return problem(
            StatusCode::NOT_FOUND,
            format!("no upstream named \"{name}\""),
        );
    };
    if !upstream.set_draining(target, down) {
        return problem(
            StatusCode::NOT_FOUND,
            format!("upstream \"{name}\" has no target \"{target}\""),
        );
    }
    tracing::info!(upstream = %name, target, down, by = %caller, "admin: target drain set");
    let report = upstream.report();
    let shown = report
        .targets
        .iter()
        .find(|t| &*t.authority == target)
        .map(target_json);
    (StatusCode::OK, json!({ "upstream": name, "target": shown }))
}
