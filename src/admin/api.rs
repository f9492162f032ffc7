//! `/api/*`: what an operator asks at 3 a.m., as JSON.
//!
//! - `GET /api/limits`: every zone and route limit, its policy, store, keys
//!   tracked and what it decided over the last minute.
//! - `GET /api/keys/<limit>/<key>[?route=]`: one key's state as the store
//!   sees it, read without charging it.
//! - `DELETE /api/keys/<limit>/<key>[?route=]`: forget that state (unblock
//!   a customer); logged with who asked.
//! - `GET /api/top?limit=<name>[&route=][&n=10]`: the keys rejected most.
//! - `GET /api/overview`: everything the dashboard draws, in one call
//!   (traffic, limits, store, upstreams, listeners, alerts).
//!
//! A limit is named as in the config; several route limits may share a
//! name, and then every one of them answers unless `route=` picks one.

use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};

use super::keys;
use super::report::LimitView;
use super::{problem, Caller};
use crate::limiter::{Decision, Verdict};
use crate::metrics::history::{Step, STEP};
use crate::metrics::top::{display, CAPACITY, WINDOW};
use crate::metrics::{Handover, LimitLabel, ProtocolError};
use crate::pipeline::Pipeline;

type Reply = (StatusCode, Value);

/// The value of `name` in a query string, %-decoded.
pub(super) fn param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| decode(&v.replace('+', " ")))
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

fn label_json(l: &LimitLabel) -> Value {
    json!({ "tier": l.tier, "route": &*l.route, "limit": &*l.name })
}

fn outcomes(d: &[u64; 4]) -> Value {
    json!({ "allowed": d[0], "delayed": d[1], "rejected": d[2], "dry_run_rejected": d[3] })
}

/// Every zone and route limit with its labels, in metrics order.
fn labelled(p: &Pipeline) -> impl Iterator<Item = (&LimitLabel, LimitView<'_>)> {
    p.metrics().limits().iter().zip(p.limit_views())
}

/// A limit's labels, policy, key kind and dry run, as JSON.
fn limit_json(label: &LimitLabel, v: &LimitView<'_>) -> Value {
    let mut o = label_json(label);
    o["spec"] = json!(v.spec);
    o["key"] = json!(key_kind(v.key));
    o["dry_run"] = json!(v.dry_run);
    o
}

/// The limits named `name` (on `route` when given).
fn named<'p>(
    p: &'p Pipeline,
    name: &str,
    route: Option<&str>,
) -> Vec<(&'p LimitLabel, LimitView<'p>)> {
    labelled(p)
        .filter(|(l, _)| &*l.name == name && route.is_none_or(|r| &*l.route == r))
        .collect()
}

fn store_kind(p: &Pipeline) -> &'static str {
    match p.engine().redis() {
        None => "memory",
        Some(r) if r.is_cluster() => "redis_cluster",
        Some(_) => "redis",
    }
}

pub fn limits(p: &Pipeline) -> Reply {
    let minute = p
        .metrics()
        .history()
        .since(&p.sample(), Duration::from_secs(60));
    let memory = p.engine().redis().is_none();
    let limits: Vec<Value> = labelled(p)
        .enumerate()
        .map(|(i, (label, v))| {
            let now = p.engine().clock().unix_ms();
            let (quota, window_ms) = v.limit.algorithm.policy_at(now);
            let stats = p.engine().memory().stats(v.limit.zone);
            let mut o = limit_json(label, &v);
            o["algorithm"] = json!(v.limit.algorithm.name());
            o["quota"] = json!(quota);
            o["window_seconds"] = json!(window_ms as f64 / 1000.0);
            o["on_error"] = json!(v.limit.on_error.to_string());
            // With Redis the keys live there (this process only holds the
            // `local` fallback's): not counted.
            o["keys_tracked"] = if memory {
                json!(stats.keys)
            } else {
                Value::Null
            };
            o["evictions"] = if memory {
                json!(stats.evictions)
            } else {
                Value::Null
            };
            o["last_minute"] = outcomes(&minute.decisions.get(i).copied().unwrap_or_default());
            o["plans"] = plans_json(p, &v);
            o["settle"] = match v.settle {
                None => Value::Null,
                Some(s) => json!(s.from.to_string()),
            };
            // A quota's period ("month (Europe/Berlin)"); a penalty box.
            o["period"] = json!(v.limit.algorithm.calendar().map(ToString::to_string));
            o["penalty"] = penalty_json(&v);
            o["lease"] = lease_json(&v);
            o
        })
        .collect();
    (
        StatusCode::OK,
        json!({
            "store": store_kind(p),
            "last_minute_seconds": minute.seconds,
            "limits": limits,
        }),
    )
}

/// A limit's penalty box: `{after, within_seconds, ban_seconds,
/// forgive_seconds, status}`, or null.
fn penalty_json(v: &LimitView<'_>) -> Value {
    let Some(b) = v.penalty else {
        return Value::Null;
    };
    let seconds = |ms: u64| ms as f64 / 1000.0;
    json!({
        "after": b.rules.after,
        "within_seconds": seconds(b.rules.within_ms),
        "ban_seconds": b.rules.bans_ms.iter().map(|m| seconds(*m)).collect::<Vec<_>>(),
        "forgive_seconds": seconds(b.rules.forgive_ms),
        "status": b.status.as_u16(),
    })
}

/// A limit's lease: `{slice, hold_seconds}`, or null.
fn lease_json(v: &LimitView<'_>) -> Value {
    v.limit.lease.map_or(
        Value::Null,
        |l| json!({ "slice": l.slice, "hold_seconds": l.hold_ms as f64 / 1000.0 }),
    )
}

/// A limit's numbers per plan: `[{plan, quota, window_seconds}]`.
fn plans_json(p: &Pipeline, v: &LimitView<'_>) -> Value {
    let names = p.metrics().plan_counts();
    v.plans
        .iter()
        .map(|(i, l)| {
            let (quota, window_ms) = l.algorithm.policy();
            json!({
                "plan": names.get(*i).map(|(n, _)| n.to_string()),
                "quota": quota,
                "window_seconds": window_ms as f64 / 1000.0,
            })
        })
        .collect()
}

fn key_kind(k: &crate::config::KeyKind) -> String {
    use crate::config::KeyKind;
    match k {
        KeyKind::Ip => "ip".into(),
        KeyKind::User => "user".into(),
        KeyKind::UserOrIp => "user_or_ip".into(),
        KeyKind::Header(h) => format!("header:{h}"),
        KeyKind::Global => "global".into(),
    }
}

/// `<limit>/<key>` from the path, %-decoded; the key may hold `/`.
/// `endpoint` (`keys`, `overrides`) names the API in the message.
pub(super) fn limit_and_key(rest: &str, endpoint: &str) -> Result<(String, String), Reply> {
    match rest.split_once('/') {
        Some((l, k)) if !l.is_empty() && !k.is_empty() => Ok((decode(l), decode(k))),
        _ => Err(problem(
            StatusCode::BAD_REQUEST,
            format!("write /api/{endpoint}/<limit>/<key>, e.g. /api/{endpoint}/per_ip/203.0.113.7"),
        )),
    }
}

/// What `/api/keys/<limit>/<key>` names: the limit and key as written,
/// and each limit by that name with the bucket the key falls in there.
struct KeyRequest<'p> {
    limit: String,
    written: String,
    found: Vec<(&'p LimitLabel, LimitView<'p>, String)>,
}

fn targets<'p>(p: &'p Pipeline, rest: &str, query: &str) -> Result<KeyRequest<'p>, Reply> {
    let (limit, written) = limit_and_key(rest, "keys")?;
    let route = param(query, "route");
    let named = named(p, &limit, route.as_deref());
    if named.is_empty() {
        let on = route
            .map(|r| format!(" on route \"{r}\""))
            .unwrap_or_default();
        return Err(problem(
            StatusCode::NOT_FOUND,
            format!("no limit named \"{limit}\"{on}; GET /api/limits lists them"),
        ));
    }
    let mut found = Vec::with_capacity(named.len());
    for (label, view) in named {
        let key = keys::parse(&written, view.key, p.client_ip_config())
            .map_err(|why| problem(StatusCode::BAD_REQUEST, why))?;
        found.push((label, view, key));
    }
    Ok(KeyRequest {
        limit,
        written,
        found,
    })
}

pub(super) fn unavailable(e: crate::limiter::LimiterError) -> Reply {
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the rate-limit store cannot answer: {e}"),
    )
}

/// What a key request does to each limit it names.
#[derive(Clone, Copy, PartialEq)]
enum Op {
    Read,
    Reset,
}

/// Reads or resets the key in every limit the request names: the limits
/// that held state for it (as JSON), or the reply to give instead (404
/// when none did, 503 when the store cannot answer).
async fn each<'p>(
    p: &'p Pipeline,
    rest: &str,
    query: &str,
    op: Op,
) -> Result<(KeyRequest<'p>, Vec<Value>), Reply> {
    let req = targets(p, rest, query)?;
    let mut held = Vec::new();
    for (label, view, key) in &req.found {
        let mut o = label_json(label);
        o["key"] = json!(display(key));
        // A key with an override is read under its own numbers.
        let now = || p.engine().clock().unix_ms();
        let overridden = p
            .engine()
            .overrides()
            .lookup(&view.limit.name, key, now)
            .0
            .and_then(|n| n.apply(&view.limit.algorithm).ok())
            .map(|a| view.limit.with_numbers(a));
        let mut limit = overridden.as_ref().unwrap_or(view.limit);
        // A monthly quota from a billing day: `?billing_day=15`.
        let anchored = billing_day(query).and_then(|day| match &limit.algorithm {
            crate::limiter::Algorithm::Quota { limit: n, calendar } => {
                Some(limit.with_numbers(crate::limiter::Algorithm::Quota {
                    limit: *n,
                    calendar: calendar.anchored(day),
                }))
            }
            _ => None,
        });
        if let Some(a) = &anchored {
            limit = a;
        }
        let had_state = match op {
            Op::Read => match p.engine().inspect(limit, key).await {
                Ok(Some(d)) => {
                    state_json(&mut o, &d);
                    quota_json(&mut o, limit, &d, now());
                    o["override"] = json!(overridden.is_some());
                    true
                }
                // A quota untouched this period: all of it is left.
                Ok(None) if limit.algorithm.calendar().is_some() => {
                    let d = limit.algorithm.check(&mut Default::default(), now(), 1);
                    state_json(&mut o, &d);
                    quota_json(&mut o, limit, &d, now());
                    o["override"] = json!(overridden.is_some());
                    true
                }
                Ok(None) => false,
                Err(e) => return Err(unavailable(e)),
            },
            Op::Reset => p
                .engine()
                .reset(view.limit, key)
                .await
                .map_err(unavailable)?,
        };
        if had_state {
            held.push(o);
        }
    }
    if held.is_empty() {
        let what = match op {
            Op::Read => "its next request starts with the whole quota",
            Op::Reset => "nothing to reset",
        };
        return Err(problem(
            StatusCode::NOT_FOUND,
            format!(
                "\"{}\" holds no state for {}: {what}",
                req.limit, req.written
            ),
        ));
    }
    Ok((req, held))
}

/// `GET /api/keys/<limit>/<key>`.
pub async fn key(rest: &str, query: &str, p: &Pipeline) -> Reply {
    match each(p, rest, query, Op::Read).await {
        Ok((_, states)) => (
            StatusCode::OK,
            json!({ "store": store_kind(p), "states": states }),
        ),
        Err(reply) => reply,
    }
}

/// `billing_day=N` in a query string.
fn billing_day(query: &str) -> Option<u8> {
    param(query, "billing_day")
        .and_then(|d| d.parse().ok())
        .filter(|d| (1..=31).contains(d))
}

/// A quota's period and the instant it resets, in its zone and in Unix
/// seconds.
fn quota_json(o: &mut Value, limit: &crate::limiter::Limit, d: &Decision, now: u64) {
    if let Some(cal) = limit.algorithm.calendar() {
        let (start, end) = cal.bounds(now);
        let end = if d.reset_ms > 0 {
            now + d.reset_ms
        } else {
            end
        };
        o["period"] = json!(cal.to_string());
        o["period_start"] = json!(cal.local(start));
        o["resets_at"] = json!(cal.local(end));
        o["resets_at_unix"] = json!(end / 1000);
    }
}

/// A key's state from the decision its next request (cost 1) would get.
fn state_json(o: &mut Value, d: &Decision) {
    let remaining = if d.admitted() {
        (d.remaining + 1).min(d.limit)
    } else {
        0
    };
    let (next, delay_ms) = match d.verdict {
        Verdict::Allow => ("allow", 0),
        Verdict::Delay(ms) => ("delay", ms),
        Verdict::Reject => ("reject", 0),
    };
    o["quota"] = json!(d.limit);
    o["used"] = json!(d.limit.saturating_sub(remaining));
    o["remaining"] = json!(remaining);
    o["blocked"] = json!(!d.admitted());
    o["next_request"] = json!(next);
    o["delay_ms"] = json!(delay_ms);
    o["retry_after_ms"] = json!(d.retry_after_ms);
    o["reset_ms"] = json!(d.reset_ms);
    o["window_seconds"] = json!(d.window_ms as f64 / 1000.0);
}

/// `DELETE /api/keys/<limit>/<key>`: logged with who asked.
pub async fn reset(rest: &str, query: &str, p: &Pipeline, caller: &Caller) -> Reply {
    let (req, reset) = match each(p, rest, query, Op::Reset).await {
        Ok(done) => done,
        Err(reply) => return reply,
    };
    let key = display(&req.found[0].2).to_owned();
    p.metrics().key_reset();
    tracing::info!(
        limit = %req.limit,
        key = %key,
        limits = reset.len(),
        by = %caller,
        "admin: rate-limit key reset"
    );
    (StatusCode::OK, json!({ "key": key, "reset": reset }))
}

/// `GET /api/top?limit=<name>[&route=<route>][&n=10]`.
pub fn top(query: &str, p: &Pipeline) -> Reply {
    let Some(limit) = param(query, "limit") else {
        return problem(
            StatusCode::BAD_REQUEST,
            "name the limit: /api/top?limit=<name>&n=10",
        );
    };
    let n = param(query, "n")
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
        .clamp(1, CAPACITY);
    let found = p.metrics().top(&limit, param(query, "route").as_deref(), n);
    if found.is_empty() {
        return problem(StatusCode::NOT_FOUND, format!("no limit named \"{limit}\""));
    }
    let limits: Vec<Value> = found
        .into_iter()
        .map(|(l, offenders)| {
            let mut o = label_json(&l);
            o["window_seconds"] = json!(WINDOW.as_secs());
            o["top"] = offenders
                .iter()
                .map(|o| json!({ "key": o.key, "rejections": o.count, "error": o.error }))
                .collect();
            o
        })
        .collect();
    (StatusCode::OK, json!({ "limits": limits }))
}

/// Per-second rates over each step, rounded to hundredths.
fn rates(steps: &[Step], f: impl Fn(&Step) -> u64) -> Vec<f64> {
    steps
        .iter()
        .map(|s| {
            let secs = s.seconds.max(0.001);
            (f(s) as f64 / secs * 100.0).round() / 100.0
        })
        .collect()
}

/// `GET /api/overview[?n=5]`: what the dashboard draws.
pub fn overview(query: &str, p: &Pipeline) -> Reply {
    let n = param(query, "n")
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
        .clamp(1, 50);
    let now = p.sample();
    let steps = p.metrics().history().steps(&now);
    let minute = p.metrics().history().since(&now, Duration::from_secs(60));
    let limits: Vec<Value> = labelled(p)
        .enumerate()
        .map(|(i, (label, v))| {
            let d = |o: usize| move |s: &Step| s.decisions.get(i).map_or(0, |d| d[o]);
            let mut o = limit_json(label, &v);
            o["series"] = json!({
                "allowed": rates(&steps, d(0)),
                "delayed": rates(&steps, d(1)),
                "rejected": rates(&steps, d(2)),
                "dry_run_rejected": rates(&steps, d(3)),
            });
            o["last_minute"] = outcomes(&minute.decisions.get(i).copied().unwrap_or_default());
            o["top"] = p
                .metrics()
                .top_of(i, n)
                .into_iter()
                .map(|o| json!({ "key": o.key, "rejections": o.count }))
                .collect();
            o["plans"] = plans_json(p, &v);
            o["penalty"] = penalty_json(&v);
            o["lease"] = lease_json(&v);
            o
        })
        .collect();
    let plans: Vec<Value> = p
        .metrics()
        .plan_counts()
        .into_iter()
        .map(|(name, n)| json!({ "plan": &*name, "requests": n }))
        .collect();
    let costs: Vec<Value> = p
        .metrics()
        .costs()
        .into_iter()
        .map(|((limit, route, plan), n)| {
            json!({
                "limit": &*limit, "route": &*route, "plan": &*plan,
                "reserved": n[0], "settled": n[1], "refunded": n[2], "extra": n[3],
            })
        })
        .collect();
    let now_ms = p.engine().clock().unix_ms();
    let overrides: Vec<Value> = p
        .engine()
        .overrides()
        .list(now_ms)
        .into_iter()
        .take(50)
        .map(|(limit, key, o)| {
            let quota = labelled(p)
                .find(|(l, _)| l.name == limit)
                .and_then(|(_, v)| o.numbers.apply(&v.limit.algorithm).ok())
                .map(|a| a.policy());
            json!({
                "limit": &*limit,
                "key": display(&key),
                "quota": quota.map(|q| q.0),
                "window_seconds": quota.map(|q| q.1 as f64 / 1000.0),
                "expires_in_seconds": o.expires_ms.map(|e| e.saturating_sub(now_ms) / 1000),
            })
        })
        .collect();
    let upstreams: Vec<Value> = p
        .upstreams_report()
        .iter()
        .map(super::upstreams::overview_json)
        .collect();
    let listeners: Vec<Value> = p
        .listeners_report()
        .into_iter()
        .map(|(r, v)| {
            let handovers: serde_json::Map<String, Value> = Handover::ALL
                .iter()
                .map(|&h| (h.label().to_owned(), json!(r.handovers[h as usize])))
                .collect();
            json!({
                "name": &*r.name,
                "bind": v.bind.to_string(),
                "tls": v.tls,
                "proxy_protocol": v.proxy_protocol,
                "open": r.open,
                "waited_at_cap": r.waited_at_cap,
                "tls_handshakes": v.tls.then(|| json!({
                    "full": r.tls[0], "resumed": r.tls[1], "failed": r.tls[2],
                })),
                "handovers": handovers,
                "protocol_errors": ProtocolError::ALL
                    .iter()
                    .map(|&k| (k.label().to_owned(), json!(r.protocol_errors[k as usize])))
                    .collect::<serde_json::Map<String, Value>>(),
            })
        })
        .collect();
    let alerts: Vec<Value> = p
        .latest_alerts()
        .into_iter()
        .map(|(at_ms, a)| {
            json!({
                "at_ms": at_ms, "rule": &*a.rule, "limit": &*a.limit, "key": a.key,
                "count": a.count, "window_seconds": a.window.as_secs(),
            })
        })
        .collect();
    (
        StatusCode::OK,
        json!({
            "now_ms": now.at_ms,
            "step_seconds": STEP.as_secs(),
            "traffic": {
                "at_ms": steps.iter().map(|s| s.at_ms).collect::<Vec<_>>(),
                "requests": rates(&steps, |s| s.requests),
                "limited": rates(&steps, |s| s.limited),
                "upstream_errors": rates(&steps, |s| s.upstream_errors),
            },
            "last_minute": {
                "seconds": minute.seconds,
                "requests": minute.requests,
                "limited": minute.limited,
                "upstream_errors": minute.upstream_errors,
            },
            "totals": { "requests": now.requests, "limited": now.limited, "upstream_errors": now.upstream_errors },
            "store": p.store_health(),
            "limits": limits,
            "upstreams": upstreams,
            "listeners": listeners,
            "alerts": alerts,
            "plans": plans,
            "costs": costs,
            "overrides": overrides,
            "bans": super::bans::bans(p, 50),
        }),
    )
}
