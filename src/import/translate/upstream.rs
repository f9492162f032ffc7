//! An `upstream {}` block -> an upstream: each `server` a target, its
//! `weight`, `backup`, `down`, `max_fails`, `fail_timeout` and
//! `max_conns` a target map; `least_conn`, `random`, `hash` and `ip_hash`
//! its `balance`; `keepalive` and `keepalive_timeout` its pool; nginx
//! Plus's `queue` its queue; and a
//! location's `proxy_next_upstream`, `_tries` and `_timeout` its
//! `next_upstream`. What changes which target serves a request and is not
//! translated is a NOT EQUIVALENT note.

use super::{Out, Severity, Upstream};
use crate::config::raw::{RawNextUpstream, RawResolver, RawTarget, RawTargetMap, Text};
use crate::import::reader::Directive;

pub(super) fn upstream(d: &Directive, block: &[Directive], out: &mut Out) {
    let name = d.args.first().cloned().unwrap_or_default();
    let mut u = Upstream::default();
    for s in block {
        let lost = |out: &mut Out, why: String| {
            out.note(&s.at, Severity::Lost, format!("upstream {name}: {why}"))
        };
        match s.name.as_str() {
            "server" => {
                if let Some(t) = server(s, &name, out) {
                    u.targets.push(t);
                }
            }
            "keepalive" => u.keepalive = s.args.first().cloned(),
            "keepalive_timeout" => u.keepalive_timeout = s.args.first().map(|v| super::duration(v)),
            // Shared state is what tollgate keeps anyway; the pool's
            // request count per connection is not capped.
            "zone" | "keepalive_requests" | "keepalive_time" => {}
            "resolver" | "resolver_timeout" => {
                let mut own = u.resolver.take().unwrap_or_default();
                if let Some(why) = resolver(s, &mut own) {
                    out.note(&s.at, Severity::Skipped, why);
                }
                u.resolver = Some(own);
            }
            // nginx Plus: `queue 100 [timeout=60s]`.
            "queue" => match s.args.as_slice() {
                [n] | [n, _] if n.parse::<u32>().is_ok() => {
                    let timeout = s.args.get(1).and_then(|t| t.strip_prefix("timeout="));
                    u.queue = Some(crate::config::raw::RawQueue {
                        size: Some(Text(n.clone())),
                        timeout: Some(super::duration(timeout.unwrap_or("60s"))),
                    });
                }
                _ => lost(out, format!("queue {} is not translated", s.args.join(" "))),
            },
            "least_conn" | "ip_hash" => u.balance = Some(s.name.clone()),
            "random" => match s.args.as_slice() {
                [] => u.balance = Some("random".into()),
                [two] | [two, _] if two == "two" => {
                    u.balance = Some("random two least_conn".into())
                }
                _ => lost(
                    out,
                    format!("random {} is not translated", s.args.join(" ")),
                ),
            },
            "hash" => {
                let key = s.args.first().cloned().unwrap_or_default();
                match crate::config::balance::hash_key(&key) {
                    Ok(_) => {
                        let consistent = s.args.get(1).is_some_and(|a| a == "consistent");
                        u.balance = Some(if consistent {
                            format!("hash {key} consistent")
                        } else {
                            format!("hash {key}")
                        });
                    }
                    Err(why) => lost(
                        out,
                        format!("{why}; requests are balanced by round robin instead"),
                    ),
                }
            }
            other => lost(
                out,
                format!("{other} is not translated (weighted round robin)"),
            ),
        }
    }
    out.upstreams.insert(name, u);
}

/// One `server` line as a target; `None` (with a note) for what tollgate
/// cannot reach.
fn server(s: &Directive, name: &str, out: &mut Out) -> Option<RawTarget> {
    let target = s.args.first().cloned().unwrap_or_default();
    if target.starts_with("unix:") {
        out.note(
            &s.at,
            Severity::Lost,
            "tollgate reaches upstreams over TCP only",
        );
        return None;
    }
    let has_port = target
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.ends_with(':') && p.parse::<u16>().is_ok());
    let address = if has_port {
        target
    } else {
        format!("{target}:80")
    };
    let mut map = RawTargetMap {
        address: Text(address),
        ..RawTargetMap::default()
    };
    for p in &s.args[1..] {
        let (what, value) = p.split_once('=').unwrap_or((p, ""));
        let value = || Some(Text(value.to_owned()));
        match what {
            "weight" => map.weight = value(),
            "backup" => map.backup = Some(true),
            "down" => map.down = Some(true),
            "max_fails" => map.max_fails = value(),
            "fail_timeout" => map.fail_timeout = Some(super::duration(&value()?.0)),
            "max_conns" => map.max_conns = value(),
            "resolve" => map.resolve = Some(true),
            "slow_start" => map.slow_start = Some(super::duration(&value()?.0)),
            _ => out.note(
                &s.at,
                Severity::Lost,
                format!("upstream {name}: {p}: not translated"),
            ),
        }
    }
    let plain = map
        == RawTargetMap {
            address: map.address.clone(),
            ..RawTargetMap::default()
        };
    Some(if plain {
        RawTarget::Address(map.address)
    } else {
        RawTarget::With(map)
    })
}

/// `resolver address ... [valid=time]` or `resolver_timeout time` into
/// `r`; a note when something is left out.
pub(super) fn resolver(d: &Directive, r: &mut RawResolver) -> Option<String> {
    if d.name == "resolver_timeout" {
        r.timeout = d.args.first().map(|t| super::duration(t));
        return None;
    }
    let mut left = Vec::new();
    for a in &d.args {
        if let Some(valid) = a.strip_prefix("valid=") {
            r.valid = Some(super::duration(valid));
        } else if a.contains('=') {
            left.push(a.clone());
        } else if r.address.is_none() {
            r.address = Some(a.clone());
        } else {
            left.push(a.clone());
        }
    }
    (!left.is_empty()).then(|| {
        format!(
            "resolver: {} left out (tollgate asks the first server only)",
            left.join(" ")
        )
    })
}

/// A location's `proxy_next_upstream` (or `grpc_next_upstream`), `_tries`
/// and `_timeout` as the upstream's `next_upstream` (`None`: nginx's
/// defaults, tollgate's too).
pub(super) fn next_upstream(next: &RawNextUpstream) -> Option<RawNextUpstream> {
    if next.on.is_none() && next.tries.is_none() && next.timeout.is_none() {
        return None;
    }
    let zero = |t: &Option<Text>| t.as_ref().is_some_and(|t| t.0 == "0" || t.0 == "0s");
    Some(RawNextUpstream {
        // (`updating` is about a cache's stale answers: nothing here)
        on: next
            .on
            .as_ref()
            .map(|on| on.iter().filter(|c| *c != "updating").cloned().collect()),
        // nginx's 0 is "no limit", as tollgate's tries; its timeout 0
        // too, which tollgate writes by leaving it out.
        tries: next.tries.clone(),
        timeout: next.timeout.clone().filter(|_| !zero(&next.timeout)),
        max_body: None,
        budget: None,
    })
}
