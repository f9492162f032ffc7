//! Validation of `alerts`: rules on a zone or route limit (rejections of one
//! key within a window, or a limit's rejected share), the cooldown, and the
//! webhook they are posted to.

use std::sync::Arc;
use std::time::Duration;

use super::checker::Checker;
use super::compiled::*;
use super::raw::RawAlerts;

/// A share above 0 and at most 1.
fn share(c: &mut Checker, path: &str, t: &crate::config::raw::Text) -> f64 {
    let v: f64 = t.0.trim().parse().unwrap_or(-1.0);
    if !(v > 0.0 && v <= 1.0) {
        c.report(
            path,
            format!("expected a share above 0 and at most 1, got \"{t}\""),
        );
    }
    v
}

pub(super) fn alerts(
    raw: Option<&RawAlerts>,
    zones: &[ZoneConfig],
    routes: &[RouteConfig],
    c: &mut Checker,
) -> AlertsConfig {
    let Some(raw) = raw else {
        return AlertsConfig::default();
    };
    let cooldown = c.positive_duration("alerts.cooldown", &raw.cooldown, Duration::from_secs(300));
    let webhook = raw.webhook.as_ref().and_then(|w| {
        let (uri, tls) = c.http_url("alerts.webhook.url", &w.url)?;
        let slack = match w.format.as_deref() {
            None | Some("json") => false,
            Some("slack") => true,
            Some(other) => {
                c.report(
                    "alerts.webhook.format",
                    format!("expected json or slack, got \"{other}\""),
                );
                false
            }
        };
        if w.secret.as_ref().is_some_and(|s| s.len() < 16) {
            c.report(
                "alerts.webhook.secret",
                "a signing secret needs at least 16 characters",
            );
        }
        Some(AlertWebhook {
            uri,
            tls,
            timeout: c.positive_duration(
                "alerts.webhook.timeout",
                &w.timeout,
                Duration::from_secs(2),
            ),
            secret: w.secret.as_ref().map(|s| s.as_bytes().to_vec()),
            slack,
        })
    });
    let mut rules = Vec::new();
    for (i, r) in raw.rules.iter().enumerate() {
        let path = format!("alerts.rules[{i}]");
        if r.name.is_empty() || rules.iter().any(|x: &AlertRule| *x.name == *r.name) {
            c.report(
                format!("{path}.name"),
                format!("needs a name of its own, got \"{}\"", r.name),
            );
        }
        let known = zones.iter().any(|z| *z.limit.name == *r.limit)
            || routes
                .iter()
                .flat_map(|rt| &rt.limits)
                .any(|l| *l.limit.name == *r.limit);
        if !known {
            c.report(
                format!("{path}.limit"),
                format!("no zone or route limit is named \"{}\"", r.limit),
            );
        }
        let per = c.positive_duration(&format!("{path}.per"), &r.per, Duration::from_secs(60));
        let kind = match (&r.rejections, &r.reject_ratio, &r.used) {
            (None, None, Some(t)) => {
                let share = share(c, &format!("{path}.used"), t);
                let quota = routes
                    .iter()
                    .flat_map(|rt| &rt.limits)
                    .any(|l| *l.limit.name == *r.limit && l.limit.algorithm.calendar().is_some());
                if known && !quota {
                    c.report(
                        format!("{path}.used"),
                        format!("\"{}\" is not a quota (algorithm: quota): use rejections or reject_ratio", r.limit),
                    );
                }
                AlertKind::QuotaUsed(share)
            }
            (Some(_), None, None) => AlertKind::KeyRejections(c.number(
                &format!("{path}.rejections"),
                &r.rejections,
                20u64,
                1,
                1_000_000_000,
            )),
            (None, Some(t), None) => {
                let ratio = share(c, &format!("{path}.reject_ratio"), t);
                AlertKind::RejectRatio {
                    ratio,
                    min_requests: c.number(
                        &format!("{path}.min_requests"),
                        &r.min_requests,
                        20u64,
                        1,
                        1_000_000_000,
                    ),
                }
            }
            _ => {
                c.report(
                    path.clone(),
                    "set exactly one of rejections (per key), reject_ratio (per limit) and used (per key, a quota's share)",
                );
                continue;
            }
        };
        rules.push(AlertRule {
            name: Arc::from(r.name.as_str()),
            limit: Arc::from(r.limit.as_str()),
            kind,
            per,
        });
    }
    AlertsConfig {
        rules,
        cooldown,
        webhook,
    }
}
