//! Validation of backend protection: `priorities` (the classes shed
//! lowest first), an upstream's adaptive `concurrency` limit and its
//! `queue`.

use std::sync::Arc;
use std::time::Duration;

use super::checker::Checker;
use super::compiled::{Concurrency, Priorities, QueueConfig, MAX_CLASSES};
use super::raw::{RawConcurrency, RawPriorities, RawQueue};

/// `priorities`; `plans` are the names of `identity.plans`.
pub(super) fn priorities(
    raw: Option<&RawPriorities>,
    plans: &[Arc<str>],
    c: &mut Checker,
) -> Priorities {
    let Some(raw) = raw else {
        return Priorities::default();
    };
    let mut p = Priorities {
        names: Vec::new(),
        default: 0,
        never_shed: 0,
        plans: vec![None; plans.len()],
        header: None,
    };
    for (i, n) in raw.classes.iter().enumerate() {
        let path = format!("priorities.classes[{i}]");
        if c.label(path.clone(), "class", n) && p.find(n.as_bytes()).is_some() {
            c.report(path, format!("\"{n}\" is listed twice"));
        }
        p.names.push(Arc::from(n.as_str()));
    }
    if p.names.is_empty() || p.names.len() > MAX_CLASSES {
        c.report(
            "priorities.classes",
            format!("list from 1 to {MAX_CLASSES} classes, highest first"),
        );
        return Priorities::default();
    }
    p.default = match &raw.default {
        Some(d) => class(&p, "priorities.default", d, c).unwrap_or(0),
        None => (p.names.len() - 1) as u8,
    };
    for (i, n) in raw.never_shed.iter().flatten().enumerate() {
        if let Some(k) = class(&p, &format!("priorities.never_shed[{i}]"), n, c) {
            p.never_shed |= 1 << k;
        }
    }
    for (plan, name) in raw.plans.iter().flatten() {
        let path = format!("priorities.plans.{plan}");
        let k = class(&p, &path, name, c);
        match plans.iter().position(|x| **x == **plan) {
            Some(i) => p.plans[i] = k,
            None => c.report(path, format!("\"{plan}\" is not in identity.plans.names")),
        }
    }
    p.header = raw.header.as_ref().and_then(|h| {
        http::HeaderName::from_bytes(h.as_bytes())
            .map_err(|_| {
                c.report(
                    "priorities.header",
                    format!("\"{h}\" is not a valid header name"),
                )
            })
            .ok()
    });
    p
}

/// The class `name` of `p`, or a problem at `path` naming the classes.
pub(super) fn class(p: &Priorities, path: &str, name: &str, c: &mut Checker) -> Option<u8> {
    let found = p.find(name.as_bytes());
    if found.is_none() {
        let known: Vec<&str> = p.names.iter().map(|n| &**n).collect();
        c.report(
            path,
            format!(
                "unknown priority class \"{name}\"; priorities.classes has: {}",
                known.join(", ")
            ),
        );
    }
    found
}

/// An upstream's `concurrency` at `path`.
pub(super) fn concurrency(c: &mut Checker, path: &str, raw: &RawConcurrency) -> Concurrency {
    let min = c.number(&format!("{path}.min"), &raw.min, 4u32, 1, 100_000);
    let max = c.number(&format!("{path}.max"), &raw.max, 1000u32, 1, 100_000);
    if min > max {
        c.report(
            format!("{path}.min"),
            format!("min ({min}) is above max ({max})"),
        );
    }
    let tolerance = match raw.tolerance.as_ref().map(|t| t.0.trim().parse::<f64>()) {
        None => 0.25,
        Some(Ok(t)) if (0.0..=10.0).contains(&t) => t,
        Some(_) => {
            c.report(
                format!("{path}.tolerance"),
                format!(
                    "expected a fraction from 0 to 10 (0.25: latency may rise by a quarter), got \"{}\"",
                    raw.tolerance.as_ref().map_or("", |t| t.0.as_str())
                ),
            );
            0.25
        }
    };
    let interval = c.positive_duration(
        &format!("{path}.interval"),
        &raw.interval,
        Duration::from_millis(100),
    );
    let probe_every = c.positive_duration(
        &format!("{path}.probe_every"),
        &raw.probe_every,
        Duration::from_secs(60),
    );
    if interval > probe_every {
        c.report(
            format!("{path}.interval"),
            "interval is longer than probe_every",
        );
    }
    Concurrency {
        min,
        max,
        tolerance,
        interval,
        probe_every,
        probe_requests: c.number(
            &format!("{path}.probe_requests"),
            &raw.probe_requests,
            25u32,
            1,
            10_000,
        ),
    }
}

/// An upstream's `queue` at `path`: a size and a timeout, which is
/// required (a queue without one holds a request for ever).
pub(super) fn queue(c: &mut Checker, path: &str, raw: &RawQueue) -> QueueConfig {
    if raw.timeout.is_none() {
        c.report(
            format!("{path}.timeout"),
            "a queue needs a timeout (how long a request may wait, e.g. 1s)",
        );
    }
    QueueConfig {
        size: c.number(&format!("{path}.size"), &raw.size, 100usize, 1, 100_000),
        timeout: c.positive_duration(
            &format!("{path}.timeout"),
            &raw.timeout,
            Duration::from_secs(1),
        ),
    }
}
