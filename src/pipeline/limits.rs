//! The limiting stages: bypass, tier-1 zones (nginx `limit_req` and
//! `limit_conn` per key), tier-2 route limits (named limits, all or
//! nothing), and the rate-limit headers of the response.
//!
//! A rejection is a value that becomes a 429 (or a zone's 503) problem
//! response; it never reaches the upstream. Dry-run zones and limits decide,
//! count, log and add headers, but never reject or delay.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, StatusCode};
use sha2::{Digest, Sha256};

use super::key::{self, KeySource};
use crate::config::{
    BypassConfig, ClientIpConfig, HeaderStyle, RouteConfig, StoreConfig, ZoneConfig,
};
use crate::error::ProxyError;
use crate::limiter::memory::MemoryStore;
use crate::limiter::redis::RedisStore;
use crate::limiter::{
    groups, most_restrictive, verdict, Check, Decision, Limit, LimiterError, OnError, Outcome,
    Store, Verdict,
};

const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const X_WARNING: HeaderName = HeaderName::from_static("x-ratelimit-warning");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// Limit state and the rules that are not per route.
pub struct Limiter {
    /// The store when `store.kind` is memory; the `local` fallback otherwise.
    memory: MemoryStore,
    redis: Option<RedisStore>,
    /// Requests decided without Redis since the last warning, and when
    /// that was (s): at most one warning a second.
    degraded: (AtomicU64, AtomicU64),
    zones: Vec<ZoneConfig>,
    /// Concurrent requests per key, for zones with `max_conn`.
    conns: Vec<Option<Arc<ConnCounter>>>,
    bypass: BypassConfig,
}

/// One decided limit, for the headers.
#[derive(Debug, Clone)]
pub struct Applied {
    pub name: Arc<str>,
    pub decision: Decision,
}

/// What the route limits decided, kept until the response is built.
#[derive(Default)]
pub struct RouteOutcome {
    pub applied: Vec<Applied>,
    /// (route limit index, key) charged after the response, for limits that
    /// count only some statuses.
    pub deferred: Vec<(usize, String)>,
}

impl Limiter {
    pub fn new(
        zones: Vec<ZoneConfig>,
        bypass: BypassConfig,
        store_zones: &[crate::limiter::memory::ZoneSpec],
        redis: Option<RedisStore>,
    ) -> Self {
        let conns = zones
            .iter()
            .map(|z| z.max_conn.map(|_| Arc::new(ConnCounter::default())))
            .collect();
        Limiter {
            memory: MemoryStore::new(store_zones),
            redis,
            degraded: (AtomicU64::new(0), AtomicU64::new(0)),
            zones,
            conns,
            bypass,
        }
    }

    /// The Redis store, when limits are shared through Redis.
    pub fn redis(&self) -> Option<&RedisStore> {
        self.redis.as_ref()
    }

    /// Whether a request skips every limit: a bypass path, a bypass token
    /// (compared as SHA-256 digests, in constant time), or a bypass source.
    pub fn bypassed(&self, path: &str, headers: &HeaderMap, client: std::net::IpAddr) -> bool {
        let b = &self.bypass;
        if b.paths.iter().any(|p| p == path) {
            return true;
        }
        if let Some(name) = &b.header {
            if let Some(v) = headers.get(name) {
                let digest: [u8; 32] = Sha256::digest(v.as_bytes()).into();
                if b.token_hashes
                    .iter()
                    .fold(false, |hit, h| hit | ct_eq(h, &digest))
                {
                    return true;
                }
            }
        }
        b.sources.iter().any(|net| net.contains(&client))
    }

    /// Tiers 1 and 2 in one decision: the zones in `zones` (group 0), then
    /// the route's limits (group 1), each group all or nothing, enforced
    /// before dry run; a rejecting zone stops the route limits. With Redis
    /// this is one round trip. A zone delay is slept here (dropped, and so
    /// ended, if the client goes away); a rejection is an error.
    /// Connection slots (`max_conn`) are returned through `hold`.
    pub async fn limit(
        &self,
        zones: &[usize],
        route: Option<&RouteConfig>,
        src: &KeySource<'_>,
        cfg: &ClientIpConfig,
        hold: &mut Vec<ConnSlot>,
    ) -> Result<RouteOutcome, ProxyError> {
        let zone_keys: Vec<(usize, String)> = zones
            .iter()
            .filter_map(|&i| key::build(&self.zones[i].key, src, cfg).map(|k| (i, k.to_string())))
            .collect();
        self.hold_connections(&zone_keys, hold)?;
        let route_limits = route.map_or(&[][..], |r| r.limits.as_slice());
        let route_keys: Vec<(usize, String)> = route_limits
            .iter()
            .enumerate()
            .filter_map(|(i, l)| key::build(&l.key, src, cfg).map(|k| (i, k.to_string())))
            .collect();
        // Limits whose key does not apply to this request are skipped.
        let mut checks = Vec::with_capacity(zone_keys.len() + route_keys.len());
        let mut origin = Vec::with_capacity(checks.capacity());
        for dry_run in [false, true] {
            for (i, key) in &zone_keys {
                let z = &self.zones[*i];
                if z.dry_run == dry_run {
                    checks.push(Check {
                        group: 0,
                        dry_run,
                        ..Check::new(&z.limit, key, 1)
                    });
                    origin.push(*i);
                }
            }
        }
        for dry_run in [false, true] {
            for (i, key) in &route_keys {
                let l = &route_limits[*i];
                if l.dry_run == dry_run {
                    checks.push(Check {
                        peek: l.count_status.is_some(),
                        group: 1,
                        dry_run,
                        ..Check::new(&l.limit, key, l.cost)
                    });
                    origin.push(*i);
                }
            }
        }
        let mut out = RouteOutcome::default();
        if checks.is_empty() {
            return Ok(out);
        }
        let decisions = self.decide(&checks).await?.decisions;
        let mut delay = 0;
        let mut start = 0;
        for group in groups(&checks) {
            let end = start + group.len();
            let Some(decided) = decisions.get(start..end) else {
                break;
            };
            let (zone_tier, dry) = (group[0].group == 0, group[0].dry_run);
            if !zone_tier {
                for (k, d) in (start..end).zip(decided) {
                    let limit = &route_limits[origin[k]];
                    out.applied.push(Applied {
                        name: limit.limit.name.clone(),
                        decision: *d,
                    });
                    if limit.count_status.is_some() && d.admitted() {
                        out.deferred.push((origin[k], checks[k].key.to_owned()));
                    }
                }
            }
            match verdict(decided) {
                Verdict::Allow => {}
                Verdict::Delay(ms) if !dry => delay = delay.max(ms),
                Verdict::Delay(_) => {}
                Verdict::Reject => {
                    let worst = most_restrictive(decided.iter()).unwrap_or(0);
                    let (name, d) = (&group[worst].limit.name, decided[worst]);
                    if dry {
                        tracing::info!(limit = %name, "dry run: would reject");
                    } else if zone_tier {
                        let zone = &self.zones[origin[start + worst]];
                        return Err(rejected(
                            name,
                            &zone.rate_text,
                            d.retry_after_ms,
                            zone.status,
                            HeaderMap::new(),
                        ));
                    } else if let Some(route) = route {
                        let limit = &route_limits[origin[start + worst]];
                        let mut headers = HeaderMap::new();
                        add_headers(
                            &mut headers,
                            route.headers,
                            route.warn_at,
                            &out.applied,
                            true,
                        );
                        return Err(rejected(
                            name,
                            &limit.description,
                            d.retry_after_ms,
                            StatusCode::TOO_MANY_REQUESTS,
                            headers,
                        ));
                    }
                }
            }
            start = end;
        }
        if delay > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        }
        Ok(out)
    }

    /// `max_conn`: takes a concurrency slot per zone key, or refuses.
    fn hold_connections(
        &self,
        keys: &[(usize, String)],
        hold: &mut Vec<ConnSlot>,
    ) -> Result<(), ProxyError> {
        for (i, key) in keys {
            let zone = &self.zones[*i];
            let (Some(max), Some(counter)) = (zone.max_conn, &self.conns[*i]) else {
                continue;
            };
            match counter.acquire(key, max) {
                Some(slot) => hold.push(slot),
                None if zone.dry_run => {
                    tracing::info!(zone = %zone.limit.name, "dry run: would refuse, too many concurrent requests")
                }
                None => {
                    return Err(ProxyError::RateLimited {
                        limit: zone.limit.name.to_string(),
                        detail: format!(
                            "concurrency limit '{}' exceeded: at most {max} requests at once; retry in 1s",
                            zone.limit.name
                        ),
                        retry_after: 1,
                        status: zone.status,
                        headers: Box::default(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Asks the store; when Redis fails, each limit follows its `on_error`.
    async fn decide(&self, checks: &[Check<'_>]) -> Result<Outcome, ProxyError> {
        let Some(redis) = &self.redis else {
            return Ok(self.memory.decide_at(checks, self.memory.now_ms()));
        };
        match redis.decide(checks).await {
            Ok(outcome) => Ok(outcome),
            Err(e) => self.fallback(checks, &e),
        }
    }

    /// The decision without Redis: `fail_closed` refuses with a 503,
    /// `fail_open` admits, `local` asks this process's memory store (with
    /// the limit divided by `store.replicas`). Groups keep their meaning.
    fn fallback(&self, checks: &[Check<'_>], err: &LimiterError) -> Result<Outcome, ProxyError> {
        let now = self.memory.now_ms();
        let (count, last) = &self.degraded;
        count.fetch_add(1, Ordering::Relaxed);
        let second = now / 1000;
        if last.load(Ordering::Relaxed) < second && last.swap(second, Ordering::Relaxed) < second {
            let n = count.swap(0, Ordering::Relaxed);
            tracing::warn!(
                error = %err,
                requests = n,
                "rate-limit store failed; these requests were decided by on_error (fail_open admits, fail_closed refuses with 503, local asks this process's memory)"
            );
        }
        if let Some(c) = checks
            .iter()
            .find(|c| !c.dry_run && c.limit.on_error == OnError::FailClosed)
        {
            let name = &c.limit.name;
            return Err(ProxyError::RateLimited {
                limit: name.to_string(),
                detail: format!("rate limit '{name}' cannot be checked ({err}); retry in 1s"),
                retry_after: 1,
                status: StatusCode::SERVICE_UNAVAILABLE,
                headers: Box::default(),
            });
        }
        let local = |c: &Check<'_>| c.limit.on_error == OnError::Local;
        let mut decisions = Vec::with_capacity(checks.len());
        for group in groups(checks) {
            let scaled: Vec<Limit> = group
                .iter()
                .filter(|c| local(c))
                .map(|c| Limit {
                    algorithm: c.limit.local.clone(),
                    ..c.limit.clone()
                })
                .collect();
            let local_checks: Vec<Check<'_>> = group
                .iter()
                .filter(|c| local(c))
                .zip(&scaled)
                .map(|(c, limit)| Check { limit, ..*c })
                .collect();
            let mut decided = self
                .memory
                .decide_at(&local_checks, now)
                .decisions
                .into_iter();
            let before = decisions.len();
            for c in group {
                if local(c) {
                    decisions.extend(decided.next());
                } else {
                    let (limit, window_ms) = c.limit.algorithm.policy();
                    decisions.push(Decision {
                        verdict: Verdict::Allow,
                        limit,
                        remaining: limit.saturating_sub(c.cost),
                        reset_ms: 0,
                        retry_after_ms: 0,
                        window_ms,
                    });
                }
            }
            if !group[0].dry_run && !decisions[before..].iter().all(Decision::admitted) {
                break;
            }
        }
        Ok(Outcome { decisions })
    }

    /// Charges the limits that count only some statuses, now that the
    /// upstream answered `status`.
    pub async fn charge_outcome(
        &self,
        route: &RouteConfig,
        deferred: &[(usize, String)],
        status: u16,
    ) {
        let checks: Vec<Check<'_>> = deferred
            .iter()
            .filter_map(|(i, key)| {
                let l = &route.limits[*i];
                l.count_status
                    .as_ref()
                    .is_some_and(|s| s.contains(&status))
                    .then(|| Check::new(&l.limit, key, l.cost))
            })
            .enumerate()
            // Each is charged on its own, one over its limit not stopping
            // the others: a group each, never stopping the next (the
            // dry-run rule), all in one store call.
            .map(|(i, c)| Check {
                group: (i % 2) as u8,
                dry_run: true,
                ..c
            })
            .collect();
        if !checks.is_empty() {
            let _ = self.decide(&checks).await;
        }
    }
}

/// The 429 (or 503) for a limit that rejected, with its retry advice.
fn rejected(
    name: &str,
    what: &str,
    retry_ms: u64,
    status: StatusCode,
    headers: HeaderMap,
) -> ProxyError {
    let retry = secs(retry_ms);
    ProxyError::RateLimited {
        limit: name.to_owned(),
        detail: format!("rate limit '{name}' exceeded: {what}; retry in {retry}s"),
        retry_after: retry,
        status,
        headers: Box::new(headers),
    }
}

fn secs(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Adds the rate-limit headers for `applied` to a response.
pub fn add_headers(
    headers: &mut HeaderMap,
    style: HeaderStyle,
    warn_at: f64,
    applied: &[Applied],
    rejected: bool,
) {
    use std::fmt::Write;
    let Some(worst) = most_restrictive(applied.iter().map(|a| &a.decision)) else {
        return;
    };
    let w = &applied[worst];
    let num = |n: u64| HeaderValue::from(n);
    if style.legacy {
        headers.insert(X_LIMIT, num(w.decision.limit));
        headers.insert(X_REMAINING, num(w.decision.remaining));
        let reset = secs(w.decision.reset_ms.max(1));
        let reset = if style.reset_epoch {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
                + reset
        } else {
            reset
        };
        headers.insert(X_RESET, num(reset));
    }
    if style.ietf {
        let mut policy = String::with_capacity(40 * applied.len());
        let mut state = String::with_capacity(40 * applied.len());
        for (i, a) in applied.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let d = &a.decision;
            let t = if d.admitted() {
                d.reset_ms.div_ceil(1000)
            } else {
                secs(d.retry_after_ms)
            };
            let _ = write!(
                policy,
                "{sep}\"{}\";q={};w={}",
                a.name,
                d.limit,
                secs(d.window_ms)
            );
            let _ = write!(state, "{sep}\"{}\";r={};t={t}", a.name, d.remaining);
        }
        if let (Ok(p), Ok(s)) = (
            HeaderValue::from_str(&policy),
            HeaderValue::from_str(&state),
        ) {
            headers.insert(RATELIMIT_POLICY, p);
            headers.insert(RATELIMIT, s);
        }
    }
    if rejected {
        headers.insert(RETRY_AFTER, num(secs(w.decision.retry_after_ms)));
    }
    if style.legacy || style.ietf {
        for a in applied {
            let d = &a.decision;
            let used = d.limit.saturating_sub(d.remaining);
            if d.limit > 0 && used as f64 >= warn_at * d.limit as f64 {
                let text = format!("\"{}\": {used} of {} used", a.name, d.limit);
                if let Ok(v) = HeaderValue::from_str(&text) {
                    headers.append(X_WARNING, v);
                }
            }
        }
    }
}

/// Concurrent requests per key for one zone (nginx `limit_conn`).
#[derive(Default)]
pub struct ConnCounter {
    counts: Mutex<HashMap<String, u32>>,
}

/// A held concurrency slot; released when the request ends.
pub struct ConnSlot {
    counter: Arc<ConnCounter>,
    key: String,
}

impl ConnCounter {
    fn acquire(self: &Arc<Self>, key: &str, max: u32) -> Option<ConnSlot> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(key.to_owned()).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(ConnSlot {
            counter: self.clone(),
            key: key.to_owned(),
        })
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut counts = self
            .counter
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

/// Connects the Redis store when `store.kind` is redis or redis_cluster. An
/// unreachable Redis is logged, not fatal: limits follow `on_error` until
/// it answers.
pub async fn open_store(
    store: &StoreConfig,
    zones: &[crate::limiter::memory::ZoneSpec],
) -> Result<Option<RedisStore>, String> {
    let Some(options) = &store.redis else {
        return Ok(None);
    };
    let (redis, warning) = RedisStore::connect(options, zones).await?;
    match warning {
        Some(why) => tracing::warn!(
            error = %why,
            "rate-limit store: Redis is not reachable yet; limits follow on_error until it is"
        ),
        None => tracing::info!(store = ?options, "rate-limit store: connected"),
    }
    Ok(Some(redis))
}
