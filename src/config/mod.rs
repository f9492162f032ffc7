//! Configuration: YAML text -> `raw` serde types -> `validate` -> `compiled`
//! runtime types. The pipeline only ever sees `compiled::Config`.
//!
//! Every problem in a file is reported at once, each with its YAML path
//! (`routes[2].match.path: must start with "/", got "api"`), so `tollgate
//! check` is one edit-and-retry loop, not one per mistake.

pub(crate) mod alerts;
pub(crate) mod balance;
pub(crate) mod checker;
pub(crate) mod client;
pub(crate) mod compiled;
pub(crate) mod lease;
pub(crate) mod limits;
pub(crate) mod load;
pub(crate) mod penalty;
pub(crate) mod plans;
pub(crate) mod protect;
pub(crate) mod quota;
pub(crate) mod raw;
pub(crate) mod routes;
pub(crate) mod store;
pub(crate) mod traces;
pub(crate) mod units;
pub(crate) mod upstreams;
pub(crate) mod validate;
pub(crate) mod webhooks;

use std::path::Path;

pub use compiled::*;

use crate::error::ConfigError;

pub use crate::error::Problem;

/// A route limit in `check`'s summary: its name, and its plans, cost and
/// settlement when it has them ("tokens (cost 2000, settles from event
/// usage.total_tokens)").
fn describe_limit(l: &RouteLimit) -> String {
    let mut notes = Vec::new();
    if l.plans.iter().any(Option::is_some) {
        notes.push("plans".to_owned());
    }
    if l.cost != 1 || l.cost_from.is_some() {
        notes.push(format!(
            "cost {}{}",
            l.cost,
            if l.cost_from.is_some() {
                " or read"
            } else {
                ""
            }
        ));
    }
    if let Some(settle) = &l.settle {
        notes.push(format!("settles from {}", settle.from));
    }
    if let Some(cal) = l.limit.algorithm.calendar() {
        let anchor = if l.billing_day {
            ", from billing days"
        } else {
            ""
        };
        notes.push(format!("quota per {cal}{anchor}"));
    }
    if let Some(p) = &l.penalty {
        notes.push(format!("penalty box: {}", p.describe()));
    }
    if let Some(lease) = &l.limit.lease {
        notes.push(format!(
            "leased: slices of up to {} held {} (Redis only)",
            lease.slice,
            units::format_duration(std::time::Duration::from_millis(lease.hold_ms))
        ));
    }
    match notes.is_empty() {
        true => l.limit.name.to_string(),
        false => format!("{} ({})", l.limit.name, notes.join(", ")),
    }
}

impl Config {
    /// Reads and validates a file, taking `${VAR}` from the process environment.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            source: e,
        })?;
        Self::from_yaml(&text, &|name| std::env::var(name).ok())
    }

    /// Validates YAML text; `lookup` resolves `${VAR}`.
    pub fn from_yaml(
        text: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let (raw, problems) = load::load(text, lookup);
        validate::validate(raw, problems).map_err(ConfigError::Invalid)
    }

    /// The one-screen summary `tollgate check` prints for a good file.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "listeners:");
        for l in &self.listeners {
            match &l.tls {
                Some(t) => {
                    let _ = writeln!(
                        s,
                        "  {:<12} {:<22} https  certs for: {}",
                        l.name,
                        l.bind,
                        t.names.join(", ")
                    );
                }
                None => {
                    let _ = writeln!(s, "  {:<12} {:<22} http (HTTP/1.1 and h2c)", l.name, l.bind);
                }
            }
        }
        match &self.admin {
            Some(a) => {
                let _ = writeln!(s, "admin:     {} (/healthz, /readyz)", a.bind);
            }
            None => {
                let _ = writeln!(s, "admin:     disabled");
            }
        }
        let trusted: Vec<String> = self
            .client_ip
            .trusted_proxies
            .iter()
            .map(ToString::to_string)
            .collect();
        let _ = writeln!(
            s,
            "client_ip: trusted proxies: {}; keys: IPv4 /{}, IPv6 /{}",
            if trusted.is_empty() {
                "none (the TCP peer is the client)".to_owned()
            } else {
                trusted.join(", ")
            },
            self.client_ip.ipv4_prefix,
            self.client_ip.ipv6_prefix,
        );
        let _ = match &self.store.redis {
            None => writeln!(s, "store:     memory (this process only)"),
            Some(r) => writeln!(
                s,
                "store:     {r:?}, prefix {:?}, timeout {}, on_error {}, breaker after {} failures",
                r.prefix,
                units::format_duration(r.timeout),
                self.store.on_error,
                r.breaker_failures,
            ),
        };
        if let Some(t) = &self.traces {
            let parents = if t.trust_any_parent {
                "any client"
            } else {
                "trusted proxies"
            };
            let _ = writeln!(
                s,
                "traces:    OTLP/HTTP to {} as {:?}, ratio {}{}, parents from {parents}",
                t.uri,
                t.service_name,
                t.ratio,
                if t.keep_refused_and_failed {
                    " (+ every refused or failed request)"
                } else {
                    ""
                },
            );
        }
        if let Some(id) = &self.identity {
            let jwt = id.jwt.as_ref().map(|j| {
                let algs: Vec<String> = j
                    .validation
                    .algorithms
                    .iter()
                    .map(|a| format!("{a:?}"))
                    .collect();
                format!("jwt {} (claim {})", algs.join("/"), j.claim)
            });
            let key = id.api_key.as_ref().map(|h| format!("api key in {h}"));
            let parts: Vec<String> = jwt.into_iter().chain(key).collect();
            let _ = writeln!(
                s,
                "identity:  {}; invalid credentials: {:?}",
                parts.join(", "),
                id.on_invalid
            );
            if let Some(p) = &id.plans {
                let names: Vec<&str> = p.names.iter().map(|n| &**n).collect();
                let mut from: Vec<String> = Vec::new();
                from.extend(p.claim.as_ref().map(|c| format!("claim {c}")));
                if !id.key_plans.is_empty() {
                    from.push(format!("api key metadata ({} keys)", id.key_plans.len()));
                }
                from.extend(
                    p.header
                        .as_ref()
                        .map(|h| format!("header {h} (trusted proxies)")),
                );
                let default = p
                    .default
                    .map_or("the limits' own", |d| &*p.names[usize::from(d)]);
                let _ = writeln!(
                    s,
                    "plans:     {} from {}; default {default}",
                    names.join(", "),
                    from.join(", then ")
                );
            }
        }
        for z in &self.zones {
            let (q, _) = z.limit.algorithm.policy();
            let _ = writeln!(
                s,
                "zone:      {} {} (burst {}), key {:?}{}{}{}",
                z.limit.name,
                z.rate_text,
                q.saturating_sub(1),
                z.key,
                z.max_conn.map_or(String::new(), |m| format!(
                    ", max_conn {m}{}",
                    if z.max_conn_lease.is_some() {
                        " shared through Redis"
                    } else {
                        ""
                    }
                )),
                if z.dry_run { ", dry run" } else { "" },
                z.penalty.as_ref().map_or(String::new(), |p| format!(
                    ", penalty box: {}",
                    p.describe()
                )),
            );
        }
        let _ = writeln!(s, "upstreams:");
        for u in &self.upstreams {
            let targets: Vec<String> = u
                .targets
                .iter()
                .map(|t| {
                    let mut shown = t.authority.clone();
                    for (on, word) in [
                        (t.resolve, " (resolve)"),
                        (t.backup, " (backup)"),
                        (t.down, " (down)"),
                    ] {
                        if on {
                            shown.push_str(word);
                        }
                    }
                    shown
                })
                .collect();
            let retries = u.next_upstream.on_names().join(" ");
            let _ = writeln!(
                s,
                "  {:<12} {}{}{}  {}, next_upstream {}  connect {} / timeout {}",
                u.name,
                if u.tls.is_some() { "https " } else { "" },
                match u.protocol {
                    UpstreamProtocol::Http1 => "",
                    UpstreamProtocol::H2 => "h2 ",
                    UpstreamProtocol::Auto => "auto ",
                },
                targets.join(", "),
                u.balance,
                if retries.is_empty() { "off" } else { &retries },
                units::format_duration(u.connect_timeout),
                units::format_duration(u.timeout),
            );
            if let Some(c) = &u.concurrency {
                let _ = writeln!(
                    s,
                    "  {:<12} concurrency: adaptive (gradient) {}..{}, tolerance {}, every {}, min_rtt probed every {} over {} answers",
                    "",
                    c.min,
                    c.max,
                    c.tolerance,
                    units::format_duration(c.interval),
                    units::format_duration(c.probe_every),
                    c.probe_requests,
                );
            }
            if let Some(q) = &u.queue {
                let _ = writeln!(
                    s,
                    "  {:<12} queue: {} requests, {} each at most (highest class first)",
                    "",
                    q.size,
                    units::format_duration(q.timeout),
                );
            }
        }
        if self.priorities.names.len() > 1 || self.priorities.never_shed != 0 {
            let p = &self.priorities;
            let names: Vec<String> = p
                .names
                .iter()
                .enumerate()
                .map(|(i, n)| match p.never_shed(i as u8) {
                    true => format!("{n} (never shed)"),
                    false => n.to_string(),
                })
                .collect();
            let _ = writeln!(
                s,
                "priorities (shed lowest first): {}; default {}",
                names.join(" > "),
                p.names[p.default as usize]
            );
        }
        let _ = writeln!(s, "routes (in match order):");
        for r in &self.routes {
            let host = match &r.host {
                Some(HostMatch::Exact(h)) => h.clone(),
                Some(HostMatch::Suffix(h)) => format!("*{h}"),
                None => "*".to_owned(),
            };
            let path = match &r.path {
                PathMatch::Exact(p) => format!("= {p}"),
                PathMatch::Prefix(p) => format!("{p}*"),
            };
            let methods = r.methods.as_ref().map_or("any".to_owned(), |m| {
                m.iter().map(Method::as_str).collect::<Vec<_>>().join(",")
            });
            let action = match &r.action {
                RouteAction::Forward(i) => format!("-> {}", self.upstreams[*i].name),
                RouteAction::Respond(resp) => format!("respond {}", resp.status.as_u16()),
            };
            let mut extra = String::new();
            if !r.limits.is_empty() {
                let names: Vec<String> = r.limits.iter().map(describe_limit).collect();
                extra.push_str(&format!("  limits: {}", names.join(", ")));
            }
            if r.zones.len() != self.zones.len() {
                let names: Vec<&str> = r
                    .zones
                    .iter()
                    .map(|&z| &*self.zones[z].limit.name)
                    .collect();
                extra.push_str(&format!("  zones: [{}]", names.join(", ")));
            }
            let _ = writeln!(
                s,
                "  {:<14} {:<16} {:<20} {:<10} {}{}",
                r.name, host, path, methods, action, extra
            );
        }
        s
    }
}

use http::Method;

/// Test helpers shared by the config modules' tests.
#[cfg(test)]
pub(crate) mod testing {
    /// Every problem `yaml` has, as printed by `tollgate check`.
    pub fn problems(yaml: &str) -> Vec<String> {
        match crate::Config::from_yaml(yaml, &|_| None) {
            Ok(_) => Vec::new(),
            Err(crate::ConfigError::Invalid(p)) => p.iter().map(ToString::to_string).collect(),
            Err(e) => vec![e.to_string()],
        }
    }

    /// Asserts `found` is exactly the `expected` problems (by prefix).
    pub fn assert_exactly(found: &[String], expected: &[&str]) {
        for e in expected {
            assert!(
                found.iter().any(|f| f.starts_with(e)),
                "missing {e:?} in:\n{}",
                found.join("\n")
            );
        }
        assert_eq!(
            found.len(),
            expected.len(),
            "unexpected extra problems:\n{}",
            found.join("\n")
        );
    }
}
