//! Validation of what makes limits follow the customer: `identity.plans`
//! (the plan names and where a request's plan is read), API-key metadata
//! files, a limit's numbers per plan, costs read from the request, and
//! costs settled after the answer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use http::HeaderName;

use super::checker::Checker;
use super::compiled::{CostFrom, OnSettleFailure, PlansConfig, Settle, SettleFrom};
use super::limits::parse_rate;
use super::raw::{RawCost, RawLimit, RawPlanNumbers, RawPlans, RawSettle, Text};
use super::units::parse_duration;
use crate::limiter::overrides::Numbers;
use crate::limiter::{Algorithm, Limit};

/// At most this many plans: a plan is a label value of some metrics.
const MAX_PLANS: usize = 32;

fn header(path: &str, name: &str, c: &mut Checker) -> Option<HeaderName> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| c.report(path, format!("\"{name}\" is not a valid header name")))
        .ok()
}

fn number(path: &str, t: &Option<Text>, c: &mut Checker) -> Option<u64> {
    let t = t.as_ref()?;
    t.0.trim()
        .parse::<u64>()
        .map_err(|_| c.report(path, format!("expected a whole number, got \"{t}\"")))
        .ok()
}

pub fn plans(raw: Option<&RawPlans>, c: &mut Checker) -> Option<PlansConfig> {
    let raw = raw?;
    let mut names: Vec<Arc<str>> = Vec::new();
    for (i, n) in raw.names.iter().enumerate() {
        c.label(format!("identity.plans.names[{i}]"), "plan", n);
        if names.iter().any(|x| &**x == n.as_str()) {
            c.report(
                format!("identity.plans.names[{i}]"),
                format!("\"{n}\" is listed twice"),
            );
        }
        names.push(n.as_str().into());
    }
    if names.is_empty() || names.len() > MAX_PLANS {
        c.report(
            "identity.plans.names",
            format!("list from 1 to {MAX_PLANS} plan names"),
        );
    }
    let default = raw.default.as_ref().and_then(|d| {
        let found = index(&names, d);
        if found.is_none() {
            c.report(
                "identity.plans.default",
                format!("\"{d}\" is not in identity.plans.names"),
            );
        }
        found
    });
    let header = raw
        .header
        .as_ref()
        .and_then(|h| header("identity.plans.header", h, c));
    Some(PlansConfig {
        names,
        claim: raw.claim.clone(),
        header,
        default,
    })
}

/// The index of plan `name`.
pub fn index(names: &[Arc<str>], name: &str) -> Option<u8> {
    names.iter().position(|n| &**n == name).map(|i| i as u8)
}

/// What `identity.api_key.metadata` says per key (by the first 32 hex
/// digits of its digest): its plan, its billing day.
#[derive(Debug, Default)]
pub struct KeyMetadata {
    pub plans: HashMap<String, u8>,
    pub days: HashMap<String, u8>,
}

/// `identity.api_key.metadata`: per key digest, its plan and billing day. The digest is the
/// key's SHA-256 in hex (`printf %s "$KEY" | sha256sum`); tollgate keys
/// users by its first 32 digits.
pub fn key_metadata(file: &str, names: &[Arc<str>], c: &mut Checker) -> KeyMetadata {
    let path = "identity.api_key.metadata";
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            c.report(path, format!("cannot read {file}: {e}"));
            return KeyMetadata::default();
        }
    };
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Meta {
        plan: Option<String>,
        billing_day: Option<serde_json::Value>,
    }
    let entries: HashMap<String, Meta> = match serde_yaml::from_str(&text) {
        Ok(Some(e)) => e,
        Ok(None) => HashMap::new(),
        Err(e) => {
            c.report(path, format!("{file}: {e}"));
            return KeyMetadata::default();
        }
    };
    let mut out = KeyMetadata::default();
    for (digest, meta) in entries {
        let hex = digest
            .strip_prefix("sha256:")
            .unwrap_or(&digest)
            .to_ascii_lowercase();
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            c.report(
                path,
                // (the entry is not shown: it may be a key in clear)
                format!("{file}: an entry is not a SHA-256 digest (64 hex digits): the file holds digests of keys (printf %s \"$KEY\" | sha256sum), never the keys"),
            );
            continue;
        }
        if let Some(v) = &meta.billing_day {
            match super::quota::billing_day(v) {
                Some(day) => {
                    out.days.insert(hex[..32].to_owned(), day);
                }
                None => c.report(
                    path,
                    format!("{file}: {digest}.billing_day: expected a day of the month from 1 to 31, got {v}"),
                ),
            }
        }
        let Some(plan) = meta.plan else { continue };
        match index(names, &plan) {
            Some(i) => {
                out.plans.insert(hex[..32].to_owned(), i);
            }
            None => c.report(
                path,
                format!("{file}: {digest}.plan: \"{plan}\" is not in identity.plans.names"),
            ),
        }
    }
    out
}

/// A route limit's numbers per plan (`None`: the limit's own), indexed
/// like the plan names.
pub fn limit_plans(
    path: &str,
    raw: Option<&BTreeMap<String, RawPlanNumbers>>,
    limit: &Limit,
    names: &[Arc<str>],
    c: &mut Checker,
) -> Vec<Option<Limit>> {
    let Some(raw) = raw else {
        return Vec::new();
    };
    let mut out = vec![None; names.len()];
    if names.is_empty() {
        c.report(
            format!("{path}.plans"),
            "no plans are defined: list them in identity.plans.names",
        );
        return Vec::new();
    }
    for (name, n) in raw {
        let p = format!("{path}.plans.{name}");
        let Some(i) = index(names, name) else {
            c.report(&p, format!("\"{name}\" is not in identity.plans.names"));
            continue;
        };
        let mut numbers = Numbers {
            limit: number(&format!("{p}.limit"), &n.limit, c),
            burst: number(&format!("{p}.burst"), &n.burst, c),
            ..Numbers::default()
        };
        if let Some(w) = &n.window {
            match parse_duration(&w.0) {
                Ok(d) => numbers.window_ms = Some(d.as_millis() as u64),
                Err(e) => c.report(format!("{p}.window"), e),
            }
        }
        if let Some(r) = &n.rate {
            match parse_rate(&r.0) {
                Ok((amount, period)) => {
                    numbers.amount = Some(amount);
                    numbers.period_ms = Some(period);
                }
                Err(e) => c.report(format!("{p}.rate"), e),
            }
        }
        match numbers.apply(&limit.algorithm) {
            Ok(a) => out[usize::from(i)] = Some(limit.with_numbers(a)),
            Err(e) => c.report(&p, e),
        }
    }
    out
}

/// `cost`: a number, or where to read it (with its default and maximum).
pub fn cost(
    path: &str,
    raw: &Option<RawCost>,
    quota: u64,
    c: &mut Checker,
) -> (u64, Option<CostFrom>) {
    let in_range = |n: u64, what: &str, c: &mut Checker| {
        if n == 0 || n > quota {
            c.report(
                format!("{path}{what}"),
                format!("must be from 1 to the limit ({quota}), got {n}"),
            );
        }
    };
    match raw {
        None => (1, None),
        Some(RawCost::Fixed(t)) => {
            let n = number(path, &Some(t.clone()), c).unwrap_or(1);
            in_range(n, "", c);
            (n, None)
        }
        Some(RawCost::From(f)) => {
            let default = number(&format!("{path}.default"), &f.default, c).unwrap_or(1);
            in_range(default, ".default", c);
            let max = number(&format!("{path}.max"), &f.max, c).unwrap_or(quota);
            in_range(max, ".max", c);
            let from = CostFrom {
                header: f
                    .header
                    .as_ref()
                    .and_then(|h| header(&format!("{path}.header"), h, c)),
                claim: f.claim.clone(),
                max,
            };
            if from.header.is_none() && from.claim.is_none() {
                c.report(
                    path,
                    "say where the cost is read: header (from trusted proxies) or claim (a verified JWT claim)",
                );
            }
            (default, Some(from))
        }
    }
}

pub fn settle(path: &str, l: &RawLimit, algorithm: &Algorithm, c: &mut Checker) -> Option<Settle> {
    let raw: &RawSettle = l.settle.as_ref()?;
    if !crate::limiter::algorithm::settles(algorithm) {
        c.report(
            path,
            format!(
                "{} cannot settle a cost after the answer; use fixed_window, sliding_window, sliding_log, token_bucket or gcra",
                algorithm.name()
            ),
        );
    }
    if l.count.is_some() {
        c.report(path, "give count or settle, not both");
    }
    let from = match (&raw.header, &raw.trailer, &raw.event) {
        (Some(h), None, None) => SettleFrom::Header(header(&format!("{path}.header"), h, c)?),
        (None, Some(t), None) => SettleFrom::Trailer(header(&format!("{path}.trailer"), t, c)?),
        (None, None, Some(e)) => {
            let fields: Vec<String> = e.split('.').map(str::to_owned).collect();
            if fields.iter().any(String::is_empty) {
                c.report(
                    format!("{path}.event"),
                    format!("expected a dotted field like usage.total_tokens, got \"{e}\""),
                );
            }
            SettleFrom::Event(fields)
        }
        _ => {
            c.report(
                path,
                "give one of header, trailer or event: where the upstream reports the real cost",
            );
            return None;
        }
    };
    let on_failure = match raw.on_failure.as_deref() {
        None | Some("keep") => OnSettleFailure::Keep,
        Some("refund") => OnSettleFailure::Refund,
        Some(other) => {
            c.report(
                format!("{path}.on_failure"),
                format!("expected keep or refund, got \"{other}\""),
            );
            OnSettleFailure::Keep
        }
    };
    let max = number(&format!("{path}.max"), &raw.max, c).unwrap_or(u32::MAX as u64);
    Some(Settle {
        from,
        on_failure,
        max,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::testing::{assert_exactly, problems};

    #[test]
    fn plan_and_cost_problems_name_their_paths() {
        let dir = tempfile::tempdir().unwrap();
        let meta = dir.path().join("keys.yaml");
        std::fs::write(
            &meta,
            format!(
                "{}: {{ plan: gold }}\nmy-secret-key: {{ plan: pro }}\n",
                "ab".repeat(32)
            ),
        )
        .unwrap();
        let found = problems(&format!(
            "listeners: [{{ bind: '127.0.0.1:0' }}]
identity:
  api_key: {{ header: x-api-key, metadata: '{}' }}
  plans: {{ names: [free, pro, 'no spaces'], claim: plan, default: basic }}
zones:
  - {{ name: per_ip, rate: 10r/s, plans: {{ pro: {{ rate: 20r/s }} }} }}
routes:
  - match: {{ path_prefix: / }}
    respond: {{}}
    limits:
      - {{ name: a, algorithm: fixed_window, limit: 10, window: 1m, plans: {{ gold: {{ limit: 5 }}, pro: {{ rate: 5/s }} }} }}
      - {{ name: b, algorithm: sliding_log, limit: 10, window: 1m, settle: {{ header: x-cost }}, count: {{ status: [401] }} }}
      - {{ name: c, algorithm: gcra, rate: 10/s, cost: {{ default: 2, max: 99 }} }}
      - {{ name: d, algorithm: token_bucket, rate: 10/s, settle: {{ header: x-a, trailer: x-b, on_failure: later }} }}
",
            meta.display()
        ));
        assert_exactly(
            &found,
            &[
                "identity.plans.names[2]: a plan name is 1 to 32 letters",
                "identity.plans.default: \"basic\" is not in identity.plans.names",
                "identity.api_key.metadata: ",
                "identity.api_key.metadata: ",
                "identity.plans.claim: needs identity.jwt",
                "zones[0].plans: a zone keyed by ip, header or global",
                "routes[0].limits[0].plans.gold: \"gold\" is not in identity.plans.names",
                "routes[0].limits[0].plans.pro: fixed_window takes limit and window",
                "routes[0].limits[1].settle: give count or settle, not both",
                "routes[0].limits[2].cost.max: must be from 1 to the limit (10), got 99",
                "routes[0].limits[2].cost: say where the cost is read",
                "routes[0].limits[3].settle: give one of header, trailer or event",
            ],
        );
        // The metadata problems: an unknown plan, and a key in clear.
        assert!(found
            .iter()
            .any(|f| f.contains(".plan: \"gold\" is not in")));
        assert!(found
            .iter()
            .any(|f| f.contains("an entry is not a SHA-256 digest")));
        assert!(
            !found.iter().any(|f| f.contains("my-secret-key")),
            "a key in clear is never echoed"
        );
    }
}

#[cfg(test)]
mod summary {
    #[test]
    fn check_says_where_plans_come_from_and_what_a_limit_settles() {
        let c = crate::Config::from_yaml(
            "listeners: [{ bind: '127.0.0.1:0' }]
client_ip: { trusted_proxies: [10.0.0.0/8] }
identity:
  jwt: { algorithms: [HS256], secret: '0123456789abcdef0123456789abcdef' }
  plans: { names: [free, pro], claim: plan, header: x-plan }
routes:
  - match: { path_prefix: / }
    respond: {}
    limits:
      - { name: calls, algorithm: fixed_window, limit: 10, window: 1m, plans: { pro: { limit: 99 } } }
      - { name: tokens, algorithm: gcra, rate: 100/s, burst: 500, cost: 50, settle: { trailer: x-used } }
",
            &|_| None,
        )
        .unwrap();
        let s = c.summary();
        assert!(
            s.contains("plans:     free, pro from claim plan, then header x-plan (trusted proxies); default the limits' own"),
            "{s}"
        );
        assert!(
            s.contains("limits: calls (plans), tokens (cost 50, settles from trailer x-used)"),
            "{s}"
        );
    }
}
