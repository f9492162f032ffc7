//! `penalty:` on a zone or a route limit: the penalty box. A key the limit
//! refused `after` times within `within` is banned for the first of `ban`
//! (then the next, capped at the last), refused with `status` before any
//! limit is consulted; `forgive` of good behaviour takes a level off.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use super::checker::Checker;
use super::raw::RawPenalty;
use crate::limiter::penalty::Rules;

/// A limit's penalty box.
#[derive(Debug, Clone, PartialEq)]
pub struct Penalty {
    pub rules: Rules,
    /// 429 (the default) or 403.
    pub status: StatusCode,
}

impl Penalty {
    /// "5 refusals within 1m: banned 1m, 10m, 1h"
    pub fn describe(&self) -> String {
        let bans: Vec<String> = self
            .rules
            .bans_ms
            .iter()
            .map(|b| super::units::format_duration(Duration::from_millis(*b)))
            .collect();
        format!(
            "{} refusals within {}: banned {}",
            self.rules.after,
            super::units::format_duration(Duration::from_millis(self.rules.within_ms)),
            bans.join(", ")
        )
    }
}

pub fn penalty(path: &str, raw: Option<&RawPenalty>, c: &mut Checker) -> Option<Arc<Penalty>> {
    let raw = raw?;
    let path = format!("{path}.penalty");
    let after = c.number(&format!("{path}.after"), &raw.after, 5u32, 1, 1_000_000);
    let within = c.positive_duration(
        &format!("{path}.within"),
        &raw.within,
        Duration::from_secs(60),
    );
    let forgive = c.positive_duration(
        &format!("{path}.forgive"),
        &raw.forgive,
        Duration::from_secs(86_400),
    );
    let bans: Vec<u64> = match &raw.ban {
        None => vec![60_000, 600_000, 3_600_000],
        Some(list) if list.is_empty() => {
            c.report(
                format!("{path}.ban"),
                "list at least one ban length, e.g. [1m, 10m, 1h]",
            );
            return None;
        }
        Some(list) => list
            .iter()
            .enumerate()
            .map(|(i, t)| {
                c.positive_duration(
                    &format!("{path}.ban[{i}]"),
                    &Some(t.clone()),
                    Duration::from_secs(60),
                )
                .as_millis() as u64
            })
            .collect(),
    };
    let status = match raw.status.as_ref().map(|t| t.0.trim()) {
        None | Some("429") => StatusCode::TOO_MANY_REQUESTS,
        Some("403") => StatusCode::FORBIDDEN,
        Some(other) => {
            c.report(
                format!("{path}.status"),
                format!("expected 429 or 403, got \"{other}\""),
            );
            StatusCode::TOO_MANY_REQUESTS
        }
    };
    Some(Arc::new(Penalty {
        rules: Rules {
            after,
            within_ms: within.as_millis() as u64,
            bans_ms: bans.into(),
            forgive_ms: forgive.as_millis() as u64,
        },
        status,
    }))
}
