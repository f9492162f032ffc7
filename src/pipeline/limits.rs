//! The limiting stages: bypass, tier-1 zones (nginx `limit_req` and
//! `limit_conn` per key), tier-2 route limits (named limits, all or
//! nothing), and the rate-limit headers of the response.
//!
//! A rejection is a value that becomes a 429 (or a zone's 503) problem
//! response; it never reaches the upstream. Dry-run zones and limits decide,
//! count, log and add headers, but never reject or delay.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, StatusCode};
use sha2::{Digest, Sha256};

use super::key::{self, KeySource};
use crate::config::{BypassConfig, ClientIpConfig, HeaderStyle, RouteConfig, ZoneConfig};
use crate::error::ProxyError;
use crate::limiter::memory::MemoryStore;
use crate::limiter::{Check, Decision, Verdict};

const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const X_WARNING: HeaderName = HeaderName::from_static("x-ratelimit-warning");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// Limit state and the rules that are not per route.
pub struct Limiter {
    store: MemoryStore,
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
    ) -> Self {
        let conns = zones
            .iter()
            .map(|z| z.max_conn.map(|_| Arc::new(ConnCounter::default())))
            .collect();
        Limiter {
            store: MemoryStore::new(store_zones),
            zones,
            conns,
            bypass,
        }
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

    /// Tier 1: each zone in `which` decides on its key; a delay is slept
    /// here (dropped, and so ended, if the client goes away); a rejection is
    /// an error. Connection slots are returned through `hold`.
    pub async fn zones(
        &self,
        which: &[usize],
        src: &KeySource<'_>,
        cfg: &ClientIpConfig,
        hold: &mut Vec<ConnSlot>,
    ) -> Result<(), ProxyError> {
        let keys: Vec<(usize, String)> = which
            .iter()
            .filter_map(|&i| key::build(&self.zones[i].key, src, cfg).map(|k| (i, k.to_string())))
            .collect();
        for (i, key) in &keys {
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
        // Like nginx, the zones of a request are charged only if all admit.
        let items: Vec<(Check<'_>, bool)> = keys
            .iter()
            .map(|(i, k)| {
                let zone = &self.zones[*i];
                (
                    Check {
                        limit: &zone.limit,
                        key: k,
                        cost: 1,
                        peek: false,
                    },
                    zone.dry_run,
                )
            })
            .collect();
        let decided = self.decide_groups(&items, self.store.now_ms());
        if let Some((worst, d)) = decided.rejected_by {
            let zone = &self.zones[keys[worst].0];
            return Err(rejected(
                &zone.limit.name,
                &zone.rate_text,
                d.retry_after_ms,
                zone.status,
                HeaderMap::new(),
            ));
        }
        let delay = decided.delay;
        if delay > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        }
        Ok(())
    }

    /// Tier 2: every limit of the route at once, all or nothing. Limits
    /// that count only some statuses are checked now and charged later.
    pub fn route_limits(
        &self,
        route: &RouteConfig,
        src: &KeySource<'_>,
        cfg: &ClientIpConfig,
    ) -> Result<RouteOutcome, ProxyError> {
        let mut out = RouteOutcome::default();
        if route.limits.is_empty() {
            return Ok(out);
        }
        let keys: Vec<Option<String>> = route
            .limits
            .iter()
            .map(|l| key::build(&l.key, src, cfg).map(|k| k.to_string()))
            .collect();
        let items: Vec<(Check<'_>, bool)> = route
            .limits
            .iter()
            .zip(&keys)
            .filter_map(|(l, k)| {
                let check = Check {
                    limit: &l.limit,
                    key: k.as_deref()?,
                    cost: l.cost,
                    peek: l.count_status.is_some(),
                };
                Some((check, l.dry_run))
            })
            .collect();
        // Limits whose key does not apply to this request are skipped.
        let index: Vec<usize> = keys
            .iter()
            .enumerate()
            .filter(|(_, k)| k.is_some())
            .map(|(i, _)| i)
            .collect();
        let decided = self.decide_groups(&items, self.store.now_ms());
        for &(item, d) in &decided.decisions {
            let limit = &route.limits[index[item]];
            out.applied.push(Applied {
                name: limit.limit.name.clone(),
                decision: d,
            });
            if limit.count_status.is_some() && d.admitted() {
                out.deferred
                    .push((index[item], items[item].0.key.to_owned()));
            }
        }
        if let Some((worst, d)) = decided.rejected_by {
            let limit = &route.limits[index[worst]];
            let mut headers = HeaderMap::new();
            add_headers(
                &mut headers,
                route.headers,
                route.warn_at,
                &out.applied,
                true,
            );
            return Err(rejected(
                &limit.limit.name,
                &limit.description,
                d.retry_after_ms,
                StatusCode::TOO_MANY_REQUESTS,
                headers,
            ));
        }
        Ok(out)
    }

    /// Decides `items` (a check and whether it is a dry run) in two groups:
    /// the enforced checks together, all or nothing, then the dry-run ones
    /// apart, so a dry-run limit never changes what the others charge. An
    /// enforced rejection stops there: the dry-run limits do not count a
    /// request that is refused anyway.
    fn decide_groups(&self, items: &[(Check<'_>, bool)], now: u64) -> Decided {
        let mut out = Decided {
            decisions: Vec::with_capacity(items.len()),
            rejected_by: None,
            delay: 0,
        };
        for dry in [false, true] {
            let picked: Vec<usize> = (0..items.len()).filter(|&i| items[i].1 == dry).collect();
            if picked.is_empty() {
                continue;
            }
            let checks: Vec<Check<'_>> = picked.iter().map(|&i| items[i].0).collect();
            let outcome = self.store.decide_at(&checks, now);
            out.decisions.extend(
                picked
                    .iter()
                    .copied()
                    .zip(outcome.decisions.iter().copied()),
            );
            match outcome.verdict() {
                Verdict::Allow => {}
                Verdict::Delay(ms) => {
                    if !dry {
                        out.delay = ms;
                    }
                }
                Verdict::Reject => {
                    let Some(worst) = outcome.most_restrictive() else {
                        continue;
                    };
                    if dry {
                        tracing::info!(limit = %checks[worst].limit.name, "dry run: would reject");
                        continue;
                    }
                    out.rejected_by = Some((picked[worst], outcome.decisions[worst]));
                    return out;
                }
            }
        }
        out
    }

    /// Charges the limits that count only some statuses, now that the
    /// upstream answered `status`.
    pub fn charge_outcome(&self, route: &RouteConfig, deferred: &[(usize, String)], status: u16) {
        let now = self.store.now_ms();
        for (i, key) in deferred {
            let l = &route.limits[*i];
            if l.count_status.as_ref().is_some_and(|s| s.contains(&status)) {
                let check = Check {
                    limit: &l.limit,
                    key,
                    cost: l.cost,
                    peek: false,
                };
                let _ = self.store.decide_at(std::slice::from_ref(&check), now);
            }
        }
    }
}

/// What [`Limiter::decide_groups`] found.
struct Decided {
    /// (index into the items, decision), enforced group first.
    decisions: Vec<(usize, Decision)>,
    /// The enforced item that rejected (the most restrictive one).
    rejected_by: Option<(usize, Decision)>,
    /// How long the enforced group says to wait (nginx delay).
    delay: u64,
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
    let Some(worst) = crate::limiter::most_restrictive(applied.iter().map(|a| &a.decision)) else {
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
