//! `/api/overrides`: a key's own numbers for a limit, set at run time.
//!
//! - `GET /api/overrides`: every live override.
//! - `PUT /api/overrides/<limit>/<key>` with a JSON body of the numbers to
//!   change (`limit`, `window`, `rate`, `burst`, as the config writes
//!   them) and an optional `ttl` ("72h"): the key gets them from its next
//!   request, on every replica sharing the store. Its state is rescaled
//!   like a reload rescales it (no free burst, no debt lost).
//! - `DELETE /api/overrides/<limit>/<key>`: back to its plan's or the
//!   limit's own numbers.
//!
//! Keys are written as `/api/keys` takes them (`user:42`, `203.0.113.7`);
//! an override applies to every zone or route limit of that name. Changes
//! are logged with who made them.

use http::StatusCode;
use serde_json::{json, Value};

use super::api::unavailable;
use super::report::LimitView;
use super::{keys, problem, Caller};
use crate::config::limits::parse_rate;
use crate::config::units::parse_duration;
use crate::limiter::overrides::{Numbers, Override};
use crate::metrics::top::display;
use crate::pipeline::Pipeline;

type Reply = (StatusCode, Value);

/// `GET /api/overrides`.
pub async fn list(p: &Pipeline) -> Reply {
    let engine = p.engine();
    if let Err(e) = engine.refresh_overrides().await {
        return unavailable(e);
    }
    let now = engine.clock().unix_ms();
    let items: Vec<Value> = engine
        .overrides()
        .list(now)
        .into_iter()
        .map(|(limit, key, o)| {
            json!({
                "limit": &*limit,
                "key": display(&key),
                "numbers": numbers_json(&o.numbers),
                "expires_in_seconds": o.expires_ms.map(|e| e.saturating_sub(now) / 1000),
            })
        })
        .collect();
    (StatusCode::OK, json!({ "overrides": items }))
}

fn numbers_json(n: &Numbers) -> Value {
    json!({
        "limit": n.limit,
        "window_seconds": n.window_ms.map(|w| w as f64 / 1000.0),
        "rate": n.amount.zip(n.period_ms).map(|(a, p)| format!("{a} per {}s", p as f64 / 1000.0)),
        "burst": n.burst,
    })
}

/// The numbers and expiry a PUT body asks for, or why not.
fn parse_body(body: &[u8], now_ms: u64) -> Result<Override, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body must be a JSON object: {e}"))?;
    let Value::Object(map) = v else {
        return Err(
            "the body must be a JSON object, e.g. {\"limit\": 20000, \"ttl\": \"72h\"}".into(),
        );
    };
    let mut n = Numbers::default();
    let mut expires_ms = None;
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let whole = |k: &str, v: &Value| {
        v.as_u64()
            .or_else(|| v.as_str()?.trim().parse().ok())
            .ok_or_else(|| format!("{k}: expected a whole number, got {v}"))
    };
    for (k, v) in &map {
        match k.as_str() {
            "limit" => n.limit = Some(whole(k, v)?),
            "burst" => n.burst = Some(whole(k, v)?),
            "window" => {
                let d = parse_duration(&text(v)).map_err(|e| format!("window: {e}"))?;
                n.window_ms = Some(d.as_millis() as u64);
            }
            "rate" => {
                let (a, p) = parse_rate(&text(v)).map_err(|e| format!("rate: {e}"))?;
                n.amount = Some(a);
                n.period_ms = Some(p);
            }
            "ttl" => {
                let d = parse_duration(&text(v)).map_err(|e| format!("ttl: {e}"))?;
                expires_ms = Some(now_ms + d.as_millis() as u64);
            }
            other => {
                return Err(format!(
                    "unknown field \"{other}\"; give limit, window, rate, burst and ttl"
                ))
            }
        }
    }
    if n == Numbers::default() {
        return Err("give the numbers to change: limit and window, or rate and burst".into());
    }
    Ok(Override {
        numbers: n,
        expires_ms,
    })
}

/// The limits named `limit` and the bucket `written` falls in (the same
/// for each), or the reply to give instead.
/// The limits named in `<limit>/<key>` (of `/api/<endpoint>/`) and the
/// key as they count it.
pub(super) fn target<'p>(
    p: &'p Pipeline,
    rest: &str,
    endpoint: &str,
) -> Result<(String, String, Vec<LimitView<'p>>), Reply> {
    let (limit, written) = super::api::limit_and_key(rest, endpoint)?;
    let views: Vec<LimitView<'p>> = p
        .limit_views()
        .into_iter()
        .filter(|v| &*v.limit.name == limit.as_str())
        .collect();
    if views.is_empty() {
        return Err(problem(
            StatusCode::NOT_FOUND,
            format!("no limit named \"{limit}\"; GET /api/limits lists them"),
        ));
    }
    let mut bucket: Option<String> = None;
    for v in &views {
        let b = keys::parse(&written, v.key, p.client_ip_config())
            .map_err(|why| problem(StatusCode::BAD_REQUEST, why))?;
        if bucket.as_ref().is_some_and(|x| *x != b) {
            return Err(problem(
                StatusCode::BAD_REQUEST,
                format!("the limits named \"{limit}\" read \"{written}\" as different keys; write the key as the limit counts it (user:<id> or an address)"),
            ));
        }
        bucket = Some(b);
    }
    Ok((limit, bucket.unwrap_or_default(), views))
}

/// `PUT /api/overrides/<limit>/<key>`.
pub async fn put(rest: &str, body: &[u8], p: &Pipeline, caller: &Caller) -> Reply {
    let (limit, key, views) = match target(p, rest, "overrides") {
        Ok(t) => t,
        Err(reply) => return reply,
    };
    let engine = p.engine();
    let o = match parse_body(body, engine.clock().unix_ms()) {
        Ok(o) => o,
        Err(why) => return problem(StatusCode::BAD_REQUEST, why),
    };
    let mut policies = Vec::new();
    for v in &views {
        match o.numbers.apply(&v.limit.algorithm) {
            Ok(a) => {
                let (q, w) = a.policy();
                policies.push(
                    json!({ "route": v.route, "quota": q, "window_seconds": w as f64 / 1000.0 }),
                );
            }
            Err(e) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    format!("\"{limit}\" ({}): {e}", v.limit.algorithm.name()),
                )
            }
        }
    }
    let ttl = o
        .expires_ms
        .map(|e| e.saturating_sub(engine.clock().unix_ms()) / 1000);
    let limits: Vec<_> = views.iter().map(|v| v.limit).collect();
    if let Err(e) = engine.put_override(&limits, &key, Some(o)).await {
        return unavailable(e);
    }
    tracing::info!(limit = %limit, key = %display(&key), ttl_seconds = ?ttl, by = %caller, "admin: override set");
    (
        StatusCode::OK,
        json!({ "limit": limit, "key": display(&key), "policies": policies, "expires_in_seconds": ttl }),
    )
}

/// `DELETE /api/overrides/<limit>/<key>`.
pub async fn delete(rest: &str, p: &Pipeline, caller: &Caller) -> Reply {
    let (limit, key, views) = match target(p, rest, "overrides") {
        Ok(t) => t,
        Err(reply) => return reply,
    };
    let limits: Vec<_> = views.iter().map(|v| v.limit).collect();
    match p.engine().put_override(&limits, &key, None).await {
        Ok(true) => {
            tracing::info!(limit = %limit, key = %display(&key), by = %caller, "admin: override deleted");
            (
                StatusCode::OK,
                json!({ "limit": limit, "key": display(&key), "deleted": true }),
            )
        }
        Ok(false) => problem(
            StatusCode::NOT_FOUND,
            format!("\"{limit}\" has no override for {}", display(&key)),
        ),
        Err(e) => unavailable(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_body_reads_like_the_config_and_names_what_is_wrong() {
        let o = parse_body(br#"{"limit": 20000, "window": "1m", "ttl": "72h"}"#, 1000).unwrap();
        assert_eq!(o.numbers.limit, Some(20000));
        assert_eq!(o.numbers.window_ms, Some(60_000));
        assert_eq!(o.expires_ms, Some(1000 + 72 * 3_600_000));
        let o = parse_body(br#"{"rate": "10/s", "burst": "50"}"#, 0).unwrap();
        assert_eq!(
            (o.numbers.amount, o.numbers.period_ms, o.numbers.burst),
            (Some(10), Some(1000), Some(50))
        );
        assert_eq!(o.expires_ms, None);
        for (bad, says) in [
            (&b"[1]"[..], "JSON object"),
            (b"{}", "give the numbers"),
            (b"{\"limit\": -1}", "limit: expected a whole number"),
            (b"{\"limt\": 5}", "unknown field \"limt\""),
            (b"{\"window\": \"soon\"}", "window:"),
        ] {
            let e = parse_body(bad, 0).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }
}
