//! Validation of `traces`: the collector's URL, the sampling ratio, whose
//! `traceparent` is continued, and the export queue's bounds.

use std::time::Duration;

use super::checker::Checker;
use super::compiled::TracesConfig;
use super::raw::RawTraces;

pub(super) fn traces(raw: Option<&RawTraces>, c: &mut Checker) -> Option<TracesConfig> {
    let raw = raw?;
    let endpoint = c.http_url("traces.endpoint", &raw.endpoint);
    let ratio = match &raw.ratio {
        None => 1.0,
        Some(t) => match t.0.trim().parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => r,
            _ => {
                c.report(
                    "traces.ratio",
                    format!("expected a share from 0 to 1, got \"{t}\""),
                );
                1.0
            }
        },
    };
    let trust_any_parent = match raw.trust_parent.as_deref() {
        None | Some("trusted") => false,
        Some("any") => true,
        Some(other) => {
            c.report(
                "traces.trust_parent",
                format!("expected trusted or any, got \"{other}\""),
            );
            false
        }
    };
    let service_name = raw
        .service_name
        .clone()
        .unwrap_or_else(|| "tollgate".into());
    if service_name.is_empty() {
        c.report("traces.service_name", "must not be empty");
    }
    let queue = c.number("traces.queue", &raw.queue, 4096usize, 1, 1_000_000);
    let batch = c.number("traces.batch", &raw.batch, 512usize, 1, 100_000);
    let interval = c.positive_duration("traces.interval", &raw.interval, Duration::from_secs(1));
    let timeout = c.positive_duration("traces.timeout", &raw.timeout, Duration::from_secs(5));
    let (uri, tls) = endpoint?;
    Some(TracesConfig {
        uri,
        tls,
        service_name,
        ratio,
        keep_refused_and_failed: raw.keep_refused_and_failed.unwrap_or(true),
        trust_any_parent,
        user: raw.user.unwrap_or(true),
        queue,
        batch,
        interval,
        timeout,
    })
}
