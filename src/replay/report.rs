//! What a replay found: per route and per limit, the requests, the
//! would-be refusals, the keys refused most, the first and last refusal
//! and the busiest second of refusals; how the replay's refusals compare
//! with the log's; and the lines it could not read. Rendered as text or
//! JSON, or as the difference between two configs on the same logs.

use std::fmt::Write;
use std::path::Path;

use serde::Serialize;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::log::Line;
use super::Options;
use crate::metrics::top::Sketch;
use crate::metrics::Outcome;
use crate::pipeline::{Pipeline, Replayed};

/// Malformed lines listed one by one; past them only counted.
const LISTED: usize = 20;
/// Keys shown per limit.
const SHOWN: usize = 10;

#[derive(Debug, Serialize)]
pub struct Report {
    pub config: String,
    pub logs: Vec<String>,
    /// Requests replayed.
    pub requests: u64,
    pub from: Option<String>,
    pub to: Option<String>,
    pub malformed: u64,
    /// The first malformed lines: `file:line: why`.
    pub malformed_lines: Vec<String>,
    /// The window a log's lines were put back in arrival order within
    /// (ms): the longest request in the logs, or `--window`.
    pub reorder_window_ms: i64,
    /// Requests that arrived earlier than one replayed before them even so
    /// (replayed at the later time: the clock never goes back).
    pub out_of_order: u64,
    /// What the config decides by that the logs do not hold.
    pub unknown: Vec<String>,
    /// The replay's refusals against the log's.
    pub agreement: Agreement,
    pub routes: Vec<RouteReport>,
    pub limits: Vec<LimitReport>,
    #[serde(skip)]
    refusal_statuses: Vec<u16>,
    #[serde(skip)]
    first_ms: Option<i64>,
    #[serde(skip)]
    last_ms: i64,
}

#[derive(Debug, Default, Serialize)]
pub struct Agreement {
    /// Requests the log says a limit refused (tollgate's log: its
    /// `rate_limit`; combined: a status a limit of the config refuses with).
    pub refused_in_log: u64,
    pub refused_in_replay: u64,
    /// Requests refused in one and not the other.
    pub differ: u64,
}

#[derive(Debug, Default, Serialize)]
pub struct RouteReport {
    pub route: String,
    pub requests: u64,
    pub refused: u64,
}

#[derive(Debug, Serialize)]
pub struct LimitReport {
    pub tier: &'static str,
    pub route: String,
    pub limit: String,
    /// Requests it decided on.
    pub requests: u64,
    pub refused: u64,
    pub dry_run_refused: u64,
    pub delayed: u64,
    pub first_refusal: Option<String>,
    pub last_refusal: Option<String>,
    /// The most refusals (dry run included) in one second, and when.
    pub peak_refusals_per_second: u64,
    pub peak_at: Option<String>,
    pub top_keys: Vec<KeyCount>,
    #[serde(skip)]
    state: LimitState,
}

#[derive(Debug, Serialize, Clone)]
pub struct KeyCount {
    pub key: String,
    pub refusals: u64,
}

#[derive(Debug, Default)]
struct LimitState {
    first_ms: Option<i64>,
    last_ms: i64,
    /// The second being counted, and its refusals so far.
    second: i64,
    in_second: u64,
    peak: u64,
    peak_ms: i64,
    /// The keys refused most: the top offenders' Space-Saving sketch
    /// ([`crate::metrics::top::CAPACITY`] keys; every key with more than
    /// 1/`CAPACITY` of the limit's refusals is among them).
    keys: Sketch,
}

impl Report {
    pub(super) fn new(
        config: &str,
        options: &Options,
        pipeline: &Pipeline,
        unknown: Vec<String>,
        refusal_statuses: Vec<u16>,
    ) -> Report {
        let mut routes: Vec<RouteReport> = pipeline
            .route_names()
            .into_iter()
            .map(|name| RouteReport {
                route: name.to_string(),
                ..RouteReport::default()
            })
            .collect();
        routes.push(RouteReport {
            route: "-".into(),
            ..RouteReport::default()
        });
        let limits = pipeline
            .metrics()
            .limits()
            .iter()
            .map(|l| LimitReport {
                tier: l.tier,
                route: l.route.to_string(),
                limit: l.name.to_string(),
                requests: 0,
                refused: 0,
                dry_run_refused: 0,
                delayed: 0,
                first_refusal: None,
                last_refusal: None,
                peak_refusals_per_second: 0,
                peak_at: None,
                top_keys: Vec::new(),
                state: LimitState::default(),
            })
            .collect();
        Report {
            config: config.to_owned(),
            logs: options
                .logs
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
            requests: 0,
            from: None,
            to: None,
            malformed: 0,
            malformed_lines: Vec::new(),
            reorder_window_ms: 0,
            out_of_order: 0,
            unknown,
            agreement: Agreement::default(),
            routes,
            limits,
            refusal_statuses,
            first_ms: None,
            last_ms: 0,
        }
    }

    pub(super) fn malformed(&mut self, log: &Path, number: u64, why: String) {
        self.malformed += 1;
        if self.malformed_lines.len() < LISTED {
            self.malformed_lines
                .push(format!("{}:{number}: {why}", log.display()));
        }
    }

    pub(super) fn set_window(&mut self, ms: i64) {
        self.reorder_window_ms = ms;
    }

    pub(super) fn out_of_order(&mut self) {
        self.out_of_order += 1;
    }

    /// Counts one replayed request at `at` (ms since the epoch); the name
    /// of the limit that refused it, if one did.
    pub(super) fn add(&mut self, line: &Line, at: i64, replayed: &Replayed) -> Option<&str> {
        self.requests += 1;
        self.first_ms.get_or_insert(at);
        let route = replayed.route.unwrap_or(self.routes.len() - 1);
        let mut refused_by = None;
        for &(limit, outcome) in &replayed.decisions {
            let Some(l) = self.limits.get_mut(limit) else {
                continue;
            };
            l.requests += 1;
            match outcome {
                Outcome::Allowed => {}
                Outcome::Delayed => l.delayed += 1,
                Outcome::Rejected => {
                    l.refused += 1;
                    refused_by.get_or_insert(limit);
                    l.state.refusal(at);
                }
                Outcome::DryRunRejected => {
                    l.dry_run_refused += 1;
                    l.state.refusal(at);
                }
            }
        }
        for (limit, _, key) in &replayed.rejected {
            if let Some(l) = self.limits.get_mut(*limit) {
                l.state.key(key);
            }
        }
        if let Some(r) = self.routes.get_mut(route) {
            r.requests += 1;
            r.refused += u64::from(refused_by.is_some());
        }
        let logged = line
            .refused
            .unwrap_or_else(|| self.refusal_statuses.contains(&line.status));
        let here = refused_by.is_some();
        self.agreement.refused_in_log += u64::from(logged);
        self.agreement.refused_in_replay += u64::from(here);
        self.agreement.differ += u64::from(logged != here);
        self.last_ms = at;
        refused_by.map(|i| &*self.limits[i].limit)
    }

    pub(super) fn finish(mut self) -> Report {
        self.from = self.first_ms.map(rfc3339);
        self.to = self.first_ms.map(|_| rfc3339(self.last_ms));
        for l in &mut self.limits {
            let s = &mut l.state;
            l.first_refusal = s.first_ms.map(rfc3339);
            l.last_refusal = s.first_ms.map(|_| rfc3339(s.last_ms));
            l.peak_refusals_per_second = s.peak;
            l.peak_at = s.first_ms.map(|_| rfc3339(s.peak_ms));
            l.top_keys = s
                .keys
                .top(SHOWN)
                .into_iter()
                .map(|o| KeyCount {
                    key: o.key,
                    refusals: o.count,
                })
                .collect();
        }
        self.routes.retain(|r| r.route != "-" || r.requests > 0);
        self
    }

    /// The report for a reader.
    pub fn text(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "replay of {} through {}",
            self.logs.join(", "),
            self.config
        );
        let span = match (&self.from, &self.to) {
            (Some(a), Some(b)) => format!(", {a} to {b}"),
            _ => String::new(),
        };
        let _ = writeln!(t, "{} requests{span}", self.requests);
        let a = &self.agreement;
        let _ = writeln!(
            t,
            "refused: {} in the replay, {} in the log; {} requests decided differently",
            a.refused_in_replay, a.refused_in_log, a.differ
        );
        if self.malformed > 0 {
            let _ = writeln!(t, "\n{} lines not read:", self.malformed);
            for l in &self.malformed_lines {
                let _ = writeln!(t, "  {l}");
            }
        }
        if self.out_of_order > 0 {
            let _ = writeln!(
                t,
                "{} requests arrived before one replayed ahead of them, past the {} ms window the logs were put in arrival order within (replayed at the time before them; --window widens it)",
                self.out_of_order, self.reorder_window_ms
            );
        }
        if !self.unknown.is_empty() {
            let _ = writeln!(t, "\nnot in the logs:");
            for u in &self.unknown {
                let _ = writeln!(t, "  - {u}");
            }
        }
        let _ = writeln!(t, "\n{:<28} {:>10} {:>10}", "route", "requests", "refused");
        for r in &self.routes {
            let _ = writeln!(t, "{:<28} {:>10} {:>10}", r.route, r.requests, r.refused);
        }
        let _ = writeln!(
            t,
            "\n{:<34} {:>9} {:>9} {:>9} {:>9}  first / last refusal, peak",
            "limit (tier route/name)", "requests", "refused", "dry run", "delayed"
        );
        for l in &self.limits {
            let name = format!("{} {}/{}", l.tier, l.route, l.limit);
            let _ = write!(
                t,
                "{name:<34} {:>9} {:>9} {:>9} {:>9}",
                l.requests, l.refused, l.dry_run_refused, l.delayed
            );
            if let (Some(first), Some(last), Some(peak)) =
                (&l.first_refusal, &l.last_refusal, &l.peak_at)
            {
                let _ = write!(
                    t,
                    "  {first} / {last}, {}/s at {peak}",
                    l.peak_refusals_per_second
                );
            }
            let _ = writeln!(t);
            for k in l.top_keys.iter().take(5) {
                let _ = writeln!(t, "    {:>9}  {}", k.refusals, k.key);
            }
        }
        t
    }
}

impl LimitState {
    fn refusal(&mut self, at: i64) {
        self.first_ms.get_or_insert(at);
        self.last_ms = at;
        let second = at.div_euclid(1000);
        if second != self.second {
            self.second = second;
            self.in_second = 0;
        }
        self.in_second += 1;
        if self.in_second > self.peak {
            self.peak = self.in_second;
            self.peak_ms = second * 1000;
        }
    }

    fn key(&mut self, key: &str) {
        self.keys.record(key);
    }
}

fn rfc3339(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| ms.to_string())
}

/// What changed from `old` to `new` on the same logs: per limit and per
/// route, the refusals of each.
pub fn diff(new: &Report, old: &Report) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{} requests; refused: {} with {} (was {} with {})",
        new.requests,
        new.agreement.refused_in_replay,
        new.config,
        old.agreement.refused_in_replay,
        old.config
    );
    let limits = |r: &Report| -> Vec<(String, u64)> {
        r.limits
            .iter()
            .map(|l| (format!("{} {}/{}", l.tier, l.route, l.limit), l.refused))
            .collect()
    };
    let routes = |r: &Report| -> Vec<(String, u64)> {
        r.routes
            .iter()
            .map(|r| (r.route.clone(), r.refused))
            .collect()
    };
    changes(
        &mut t,
        "limit (tier route/name)",
        &limits(new),
        &limits(old),
    );
    changes(&mut t, "route", &routes(new), &routes(old));
    t
}

/// One table of refusals by name: now, before, and the change (`new`
/// and `removed` for names only one side has).
fn changes(t: &mut String, what: &str, new: &[(String, u64)], old: &[(String, u64)]) {
    let _ = writeln!(
        t,
        "\n{what:<34} {:>9} {:>9} {:>9}",
        "refused", "was", "change"
    );
    for (name, now) in new {
        let (was, change) = match old.iter().find(|(o, _)| o == name) {
            Some((_, w)) => (w.to_string(), format!("{:+}", *now as i64 - *w as i64)),
            None => ("-".into(), "new".into()),
        };
        let _ = writeln!(t, "{name:<34} {now:>9} {was:>9} {change:>9}");
    }
    for (name, was) in old.iter().filter(|(o, _)| !new.iter().any(|(n, _)| n == o)) {
        let _ = writeln!(t, "{name:<34} {:>9} {was:>9} {:>9}", "-", "removed");
    }
}
