//! Validation of everything that limits: `zones` (tier 1), each route's
//! `limits` (tier 2), `bypass`, and webhook `allow_sources` / `verify`.
//! Each zone and each route limit gets its own memory partition, sized by
//! its `size` (default 10MB, like nginx `zone=name:10m`).

use std::collections::HashMap;
use std::time::Duration;

use http::{HeaderName, StatusCode};
use sha2::{Digest, Sha256};

use super::client::parse_cidr;
use super::compiled::*;
use super::raw::{RawBypass, RawLimit, RawRoute, RawZone, Text};
use super::units::{format_duration, parse_duration};
use super::KeyKind;
use crate::limiter::memory::ZoneSpec;
use crate::limiter::{Algorithm, Limit, OnError};

use super::checker::Checker;

const DEFAULT_SIZE: u64 = 10 << 20;

fn count<T: std::str::FromStr>(v: &Option<Text>, path: &str, default: T, c: &mut Checker) -> T {
    match v {
        None => default,
        Some(t) => t.0.trim().parse().unwrap_or_else(|_| {
            c.report(path, format!("expected a whole number, got \"{t}\""));
            default
        }),
    }
}

/// The engine's limit, with its failure mode and its share for `local`.
fn limit(
    name: &str,
    algorithm: Algorithm,
    zone: usize,
    on_error: OnError,
    store: &StoreConfig,
) -> Limit {
    Limit {
        local: algorithm.divided(store.replicas),
        replicas: store.replicas,
        on_error,
        ..Limit::new(name, algorithm, zone)
    }
}

fn key_kind(v: &Option<String>, path: &str, default: KeyKind, c: &mut Checker) -> KeyKind {
    match v {
        None => default,
        Some(k) => k.parse().unwrap_or_else(|e| {
            c.report(path, e);
            default
        }),
    }
}

/// `10r/s`, `600r/m`, `5/s`, `100/h` -> (requests, period in ms).
pub fn parse_rate(text: &str) -> Result<(u64, u64), String> {
    let bad = || format!("expected a rate like \"10r/s\", \"600r/m\" or \"5/s\", got \"{text}\"");
    let (n, unit) = text.trim().split_once('/').ok_or_else(bad)?;
    let n: u64 = n.trim().trim_end_matches('r').parse().map_err(|_| bad())?;
    let period = match unit.trim() {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    if n == 0 {
        return Err(bad());
    }
    Ok((n, period))
}

pub fn zones(
    raw: &[(String, RawZone)],
    specs: &mut Vec<ZoneSpec>,
    store: &StoreConfig,
    plans: &[std::sync::Arc<str>],
    c: &mut Checker,
) -> Vec<ZoneConfig> {
    let mut out: Vec<ZoneConfig> = Vec::new();
    for (path, z) in raw {
        if out.iter().any(|o| &*o.limit.name == z.name.as_str()) {
            c.report(
                format!("{path}.name"),
                format!("zone \"{}\" is defined twice", z.name),
            );
        }
        let (n, period) = match parse_rate(&z.rate.0) {
            Ok(r) if r.1 <= 60_000 => r,
            Ok(_) => {
                c.report(format!("{path}.rate"), "zones take r/s or r/m, like nginx");
                (1, 1000)
            }
            Err(e) => {
                c.report(format!("{path}.rate"), e);
                (1, 1000)
            }
        };
        // nginx: rate in thousandths of a request per second, rounded down.
        let rate_milli = n * 1000 * 1000 / period;
        let burst = count(&z.burst, &format!("{path}.burst"), 0u64, c);
        let delay = match (z.nodelay, &z.delay) {
            (Some(true), Some(_)) => {
                c.report(path.clone(), "give nodelay or delay, not both");
                u64::MAX
            }
            (Some(true), None) => u64::MAX,
            (_, d) => count(d, &format!("{path}.delay"), 0u64, c),
        };
        let status = count(&z.status, &format!("{path}.status"), 429u16, c);
        let status = match status {
            429 | 503 => StatusCode::from_u16(status).unwrap_or(StatusCode::TOO_MANY_REQUESTS),
            other => {
                c.report(
                    format!("{path}.status"),
                    format!("expected 429 or 503, got {other}"),
                );
                StatusCode::TOO_MANY_REQUESTS
            }
        };
        let algorithm = Algorithm::Leaky {
            rate_milli,
            burst,
            delay,
        };
        if let Err(e) = algorithm.validate() {
            c.report(format!("{path}.rate"), e);
        }
        let max_conn = z
            .max_conn
            .as_ref()
            .map(|_| count(&z.max_conn, &format!("{path}.max_conn"), 0u32, c));
        if max_conn == Some(0) {
            c.report(format!("{path}.max_conn"), "must be at least 1");
        }
        let zone_index = specs.len();
        specs.push(ZoneSpec {
            name: z.name.as_str().into(),
            route: None,
            size_bytes: c.size(&format!("{path}.size"), &z.size, DEFAULT_SIZE),
        });
        let limit = limit(
            &z.name,
            algorithm,
            zone_index,
            super::store::on_error(&z.on_error, &format!("{path}.on_error"), store, c),
            store,
        );
        let key = key_kind(&z.key, &format!("{path}.key"), KeyKind::Ip, c);
        if z.plans.is_some() && !key.needs_identity() {
            c.report(
                format!("{path}.plans"),
                "a zone keyed by ip, header or global counts every request before any credential is read, so it cannot know the plan: key it by user or user_or_ip",
            );
        }
        out.push(ZoneConfig {
            plans: super::plans::limit_plans(path, z.plans.as_ref(), &limit, plans, c),
            penalty: super::penalty::penalty(path, z.penalty.as_ref(), c),
            limit,
            key,
            status,
            dry_run: z.dry_run.unwrap_or(false),
            max_conn_lease: super::lease::conn_lease(
                path,
                z.max_conn_lease.as_ref(),
                max_conn,
                store,
                c,
            ),
            max_conn,
            rate_text: z.rate.0.trim().into(),
        });
    }
    out
}

pub fn bypass(raw: Option<&RawBypass>, c: &mut Checker) -> BypassConfig {
    let Some(raw) = raw else {
        return BypassConfig::default();
    };
    let mut out = BypassConfig::default();
    for (i, p) in raw.paths.iter().flatten().enumerate() {
        if !p.starts_with('/') {
            c.report(
                format!("bypass.paths[{i}]"),
                format!("must start with \"/\", got \"{p}\""),
            );
        }
        out.paths.push(p.clone());
    }
    for (i, t) in raw.tokens.iter().flatten().enumerate() {
        if t.len() < 16 {
            // The token itself is never printed.
            c.report(
                format!("bypass.tokens[{i}]"),
                format!(
                    "a bypass token needs at least 16 characters, this one has {}",
                    t.len()
                ),
            );
        }
        out.token_hashes.push(Sha256::digest(t.as_bytes()).into());
    }
    if !out.token_hashes.is_empty() {
        let name = raw.header.as_deref().unwrap_or("x-bypass-token");
        match HeaderName::from_bytes(name.as_bytes()) {
            Ok(h) => out.header = Some(h),
            Err(_) => c.report(
                "bypass.header",
                format!("\"{name}\" is not a valid header name"),
            ),
        }
    }
    for (i, s) in raw.sources.iter().flatten().enumerate() {
        match parse_cidr(&s.0) {
            Ok(net) => out.sources.push(net),
            Err(e) => c.report(format!("bypass.sources[{i}]"), e),
        }
    }
    out
}

/// The limiting parts of one route.
pub struct RouteExtras {
    pub zones: Vec<usize>,
    pub limits: Vec<RouteLimit>,
    pub headers: HeaderStyle,
    pub warn_at: f64,
    pub webhook: Option<WebhookConfig>,
}

/// What every route's limits are checked against: the zones, the store
/// and the plan names.
pub struct Shared<'a> {
    pub zones: &'a [ZoneConfig],
    pub store: &'a StoreConfig,
    pub plans: &'a [std::sync::Arc<str>],
    pub priorities: &'a Priorities,
}

pub fn route(
    path: &str,
    r: &RawRoute,
    shared: &Shared<'_>,
    specs: &mut Vec<ZoneSpec>,
    c: &mut Checker,
) -> RouteExtras {
    let Shared {
        zones,
        store,
        plans,
        ..
    } = *shared;
    let zone_index: HashMap<&str, usize> = zones
        .iter()
        .enumerate()
        .map(|(i, z)| (&*z.limit.name, i))
        .collect();
    let route_zones = match &r.zones {
        None => (0..zones.len()).collect(),
        Some(names) => names
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                let found = zone_index.get(n.as_str()).copied();
                if found.is_none() {
                    c.report(
                        format!("{path}.zones[{i}]"),
                        format!("no zone named \"{n}\""),
                    );
                }
                found
            })
            .collect(),
    };
    let mut limits = Vec::new();
    if r.skip != Some(true) {
        for (i, l) in r.limits.iter().flatten().enumerate() {
            let lpath = format!("{path}.limits[{i}]");
            if limits
                .iter()
                .any(|x: &RouteLimit| &*x.limit.name == l.name.as_str())
            {
                c.report(
                    format!("{lpath}.name"),
                    format!("\"{}\" is used twice on this route", l.name),
                );
            }
            // The route's name as the route stage gives it.
            let route = r.name.as_deref().unwrap_or(path);
            if let Some(limit) = route_limit(&lpath, route, plans, l, specs, store, c) {
                limits.push(limit);
            }
        }
    }
    let headers = match r.headers.as_deref() {
        None | Some("both") => (true, true),
        Some("legacy") => (true, false),
        Some("ietf") => (false, true),
        Some("none") => (false, false),
        Some(other) => {
            c.report(
                format!("{path}.headers"),
                format!("expected both, legacy, ietf or none, got \"{other}\""),
            );
            (true, true)
        }
    };
    let reset_epoch = match r.reset.as_deref() {
        None | Some("seconds") => false,
        Some("epoch") => true,
        Some(other) => {
            c.report(
                format!("{path}.reset"),
                format!("expected seconds or epoch, got \"{other}\""),
            );
            false
        }
    };
    let warn_at = match &r.warn_at {
        None => 0.9,
        Some(t) => match t.0.trim().parse::<f64>() {
            Ok(f) if (0.0..=1.0).contains(&f) => f,
            _ => {
                c.report(
                    format!("{path}.warn_at"),
                    format!("expected a fraction from 0 to 1, got \"{t}\""),
                );
                0.9
            }
        },
    };
    let webhook = super::webhooks::webhook(path, r, c);
    RouteExtras {
        zones: route_zones,
        limits,
        headers: HeaderStyle {
            legacy: headers.0,
            ietf: headers.1,
            reset_epoch,
        },
        warn_at,
        webhook,
    }
}

fn route_limit(
    path: &str,
    route: &str,
    plans: &[std::sync::Arc<str>],
    l: &RawLimit,
    specs: &mut Vec<ZoneSpec>,
    store: &StoreConfig,
    c: &mut Checker,
) -> Option<RouteLimit> {
    let window = |c: &mut Checker| -> Option<(u64, u64)> {
        let limit = match &l.limit {
            Some(t) => {
                t.0.trim()
                    .parse::<u64>()
                    .map_err(|_| {
                        c.report(
                            format!("{path}.limit"),
                            format!("expected a whole number, got \"{t}\""),
                        );
                    })
                    .ok()?
            }
            None => {
                c.report(
                    format!("{path}.limit"),
                    format!("{} needs limit and window", l.algorithm),
                );
                return None;
            }
        };
        let window = match &l.window {
            Some(t) => parse_duration(&t.0)
                .map_err(|e| c.report(format!("{path}.window"), e))
                .ok()?,
            None => {
                c.report(
                    format!("{path}.window"),
                    format!("{} needs limit and window", l.algorithm),
                );
                return None;
            }
        };
        Some((limit, window.as_millis() as u64))
    };
    let bucket = |c: &mut Checker| -> Option<(u64, u64, u64)> {
        let (amount, period) = match &l.rate {
            Some(t) => parse_rate(&t.0)
                .map_err(|e| c.report(format!("{path}.rate"), e))
                .ok()?,
            None => {
                c.report(
                    format!("{path}.rate"),
                    format!("{} needs rate (e.g. 5/s) and burst", l.algorithm),
                );
                return None;
            }
        };
        let burst = count(&l.burst, &format!("{path}.burst"), amount, c);
        Some((amount, period, burst))
    };
    let mut billing_day = false;
    if l.algorithm != "quota" {
        super::quota::misplaced(path, l, c);
    }
    let algorithm = match l.algorithm.as_str() {
        "fixed_window" | "sliding_window" | "sliding_log" => {
            let (limit, window_ms) = window(c)?;
            match l.algorithm.as_str() {
                "fixed_window" => Algorithm::FixedWindow { limit, window_ms },
                "sliding_window" => Algorithm::SlidingWindow { limit, window_ms },
                _ => Algorithm::SlidingLog { limit, window_ms },
            }
        }
        "token_bucket" | "gcra" => {
            let (amount, period_ms, burst) = bucket(c)?;
            Algorithm::rated(l.algorithm == "gcra", amount, period_ms, burst)
        }
        "quota" => {
            let (algorithm, anchored) = super::quota::quota(path, l, c)?;
            billing_day = anchored;
            algorithm
        }
        other => {
            c.report(
                format!("{path}.algorithm"),
                format!("expected fixed_window, sliding_window, sliding_log, token_bucket, gcra or quota, got \"{other}\""),
            );
            return None;
        }
    };
    if let Err(e) = algorithm.validate() {
        c.report(path, e);
        return None;
    }
    let (cost, cost_from) =
        super::plans::cost(&format!("{path}.cost"), &l.cost, algorithm.policy().0, c);
    // A limit whose requests cost more than one counts units.
    let unit = if cost != 1 || cost_from.is_some() || l.settle.is_some() {
        "units"
    } else {
        "requests"
    };
    let description = describe(&algorithm, unit);
    let settle = super::plans::settle(&format!("{path}.settle"), l, &algorithm, c);
    let count_status = l.count.as_ref().map(|c| c.status.clone());
    if let Some(statuses) = &count_status {
        if statuses.is_empty() || statuses.iter().any(|s| !(100..=599).contains(s)) {
            c.report(
                format!("{path}.count.status"),
                "list HTTP statuses from 100 to 599, e.g. [401, 403]",
            );
        }
    }
    let zone = specs.len();
    specs.push(ZoneSpec {
        name: l.name.as_str().into(),
        route: Some(route.into()),
        size_bytes: c.size(&format!("{path}.size"), &l.size, DEFAULT_SIZE),
    });
    let lease = super::lease::lease(path, l.lease.as_ref(), &algorithm, c);
    let limit = Limit {
        lease,
        ..limit(
            &l.name,
            algorithm,
            zone,
            super::store::on_error(&l.on_error, &format!("{path}.on_error"), store, c),
            store,
        )
    };
    let plans = super::plans::limit_plans(path, l.plans.as_ref(), &limit, plans, c);
    Some(RouteLimit {
        limit,
        cost_from,
        plans,
        settle,
        billing_day,
        penalty: super::penalty::penalty(path, l.penalty.as_ref(), c),
        key: key_kind(&l.key, &format!("{path}.key"), KeyKind::UserOrIp, c),
        cost,
        dry_run: l.dry_run.unwrap_or(false),
        count_status,
        description: description.into(),
        unit,
    })
}

/// What a route limit allows, for a 429's detail: "5 requests per 60s",
/// "10 units per 1s, bursts of 20".
pub fn describe(algorithm: &Algorithm, unit: &str) -> String {
    match *algorithm {
        Algorithm::Quota {
            limit,
            ref calendar,
        } => format!("{limit} {unit} per {calendar}"),
        Algorithm::FixedWindow { limit, window_ms }
        | Algorithm::SlidingWindow { limit, window_ms }
        | Algorithm::SlidingLog { limit, window_ms } => format!(
            "{limit} {unit} per {}",
            format_duration(Duration::from_millis(window_ms))
        ),
        Algorithm::TokenBucket {
            amount,
            period_ms,
            burst,
        }
        | Algorithm::Gcra {
            amount,
            period_ms,
            burst,
        } => format!(
            "{amount} {unit} per {}, bursts of {burst}",
            format_duration(Duration::from_millis(period_ms))
        ),
        Algorithm::Leaky {
            rate_milli, burst, ..
        } => {
            format!(
                "{}.{:03}r/s, burst {burst}",
                rate_milli / 1000,
                rate_milli % 1000
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_like_nginx_and_nestjs() {
        assert_eq!(parse_rate("10r/s"), Ok((10, 1000)));
        assert_eq!(parse_rate("600r/m"), Ok((600, 60_000)));
        assert_eq!(parse_rate("5/s"), Ok((5, 1000)));
        assert_eq!(parse_rate("100/h"), Ok((100, 3_600_000)));
        for bad in ["10", "10r/x", "r/s", "0r/s", "ten/s"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn limit_problems_name_their_paths() {
        let found = crate::config::testing::problems(
            "listeners: [{ bind: '127.0.0.1:0' }]
zones:
  - { name: per_ip, rate: 10r/x, status: 404 }
  - { name: per_ip, rate: 1r/s, nodelay: true, delay: 2 }
bypass: { tokens: [short], sources: [10.0.0.1/8] }
routes:
  - match: { path_prefix: / }
    respond: {}
    zones: [nope]
    headers: sometimes
    limits:
      - { name: a, algorithm: leaky_bucket }
      - { name: b, algorithm: sliding_log, limit: 50000, window: 1m }
      - { name: c, algorithm: fixed_window, limit: 5, window: 1m, cost: 9 }
      - { name: d, algorithm: token_bucket }
    verify: { scheme: gitlab, secret: x }
",
        );
        crate::config::testing::assert_exactly(
            &found,
            &[
                "zones[0].rate: expected a rate like",
                "zones[0].status: expected 429 or 503, got 404",
                "zones[1].name: zone \"per_ip\" is defined twice",
                "zones[1]: give nodelay or delay, not both",
                "bypass.tokens[0]: a bypass token needs at least 16 characters, this one has 5",
                "bypass.sources[0]: \"10.0.0.1/8\" has host bits set",
                "routes[0].zones[0]: no zone named \"nope\"",
                "routes[0].limits[0].algorithm: expected fixed_window",
                "routes[0].limits[1]: sliding_log keeps one entry per request",
                "routes[0].limits[2].cost: must be from 1 to the limit (5), got 9",
                "routes[0].limits[3].rate: token_bucket needs rate",
                "routes[0].headers: expected both, legacy, ietf or none",
                "routes[0].verify.scheme: expected github, stripe or hmac-sha256",
            ],
        );
    }
}
