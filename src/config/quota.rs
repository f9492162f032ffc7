//! `algorithm: quota`: a route limit counted over a calendar period (`day`,
//! `week`, `month`, `year`) starting at local midnight in `time_zone`, or
//! a month from each key's billing day (`anchor: billing_day`, read from
//! the token's `identity.billing_day.claim` or the API key's metadata).

use super::checker::Checker;
use super::raw::RawLimit;
use crate::limiter::calendar::{Calendar, Period, Zone};
use crate::limiter::Algorithm;

/// The quota a route limit at `path` configures, and whether it follows
/// each key's billing day.
pub fn quota(path: &str, l: &RawLimit, c: &mut Checker) -> Option<(Algorithm, bool)> {
    if l.window.is_some() || l.rate.is_some() || l.burst.is_some() {
        c.report(
            path,
            "a quota counts per calendar period: give limit and period (day, week, month or year), not window, rate or burst",
        );
        return None;
    }
    if l.limit.is_none() {
        c.report(format!("{path}.limit"), "a quota needs limit and period");
        return None;
    }
    let limit = c.number(&format!("{path}.limit"), &l.limit, 1u64, 1, 1 << 53);
    let period = match l.period.as_deref().map(str::parse::<Period>) {
        Some(Ok(p)) => p,
        Some(Err(e)) => {
            c.report(format!("{path}.period"), e);
            return None;
        }
        None => {
            c.report(
                format!("{path}.period"),
                "a quota needs limit and period (day, week, month or year)",
            );
            return None;
        }
    };
    let zone = match l.time_zone.as_deref() {
        None => Zone::utc(),
        Some(name) => match Zone::named(name) {
            Ok(z) => z,
            Err(e) => {
                c.report(format!("{path}.time_zone"), e);
                return None;
            }
        },
    };
    let billing_day = match l.anchor.as_deref() {
        None | Some("calendar") => false,
        Some("billing_day") if period == Period::Month => true,
        Some("billing_day") => {
            c.report(
                format!("{path}.anchor"),
                "a billing day anchors monthly quotas only (period: month)",
            );
            return None;
        }
        Some(other) => {
            c.report(
                format!("{path}.anchor"),
                format!("expected calendar or billing_day, got \"{other}\""),
            );
            return None;
        }
    };
    Some((
        Algorithm::Quota {
            limit,
            calendar: Calendar::new(period, zone),
        },
        billing_day,
    ))
}

/// Refuses the quota keys on a limit of another algorithm (a `period`
/// there would be silently ignored).
pub fn misplaced(path: &str, l: &RawLimit, c: &mut Checker) {
    for (field, set) in [
        ("period", l.period.is_some()),
        ("time_zone", l.time_zone.is_some()),
        ("anchor", l.anchor.is_some()),
    ] {
        if set {
            c.report(
                format!("{path}.{field}"),
                format!("only a quota (algorithm: quota) has a {field}"),
            );
        }
    }
}

/// A billing day from a claim or metadata: 1-31, a number or its digits.
pub fn billing_day(v: &serde_json::Value) -> Option<u8> {
    let n = match v {
        serde_json::Value::Number(n) => n.as_u64()?,
        serde_json::Value::String(s) => s.trim().parse().ok()?,
        _ => return None,
    };
    (1..=31).contains(&n).then_some(n as u8)
}
