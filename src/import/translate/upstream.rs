//! An `upstream {}` block -> an upstream: each `server` a target, its
//! `weight`, `backup`, `down`, `max_fails` and `fail_timeout` a target
//! map; what changes which target
//! serves a request and is not translated is a NOT EQUIVALENT note.

use super::{Out, Severity, Upstream};
use crate::config::raw::{RawTarget, RawTargetMap, Text};
use crate::import::reader::Directive;

pub(super) fn upstream(d: &Directive, block: &[Directive], out: &mut Out) {
    let name = d.args.first().cloned().unwrap_or_default();
    let mut u = Upstream::default();
    for s in block {
        match s.name.as_str() {
            "server" => {
                let target = s.args.first().cloned().unwrap_or_default();
                if target.starts_with("unix:") {
                    out.note(
                        &s.at,
                        Severity::Lost,
                        "tollgate reaches upstreams over TCP only",
                    );
                    continue;
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
                    match what {
                        "weight" => map.weight = Some(Text(value.to_owned())),
                        "backup" => map.backup = Some(true),
                        "down" => map.down = Some(true),
                        "max_fails" => map.max_fails = Some(Text(value.to_owned())),
                        "fail_timeout" => map.fail_timeout = Some(super::duration(value)),
                        _ => {
                            let why = match what {
                                "max_conns" => "requests in flight per target are not capped",
                                _ => "not translated",
                            };
                            out.note(
                                &s.at,
                                Severity::Lost,
                                format!("upstream {name}: {p}: {why}"),
                            );
                        }
                    }
                }
                let plain = map
                    == RawTargetMap {
                        address: map.address.clone(),
                        ..RawTargetMap::default()
                    };
                u.targets.push(if plain {
                    RawTarget::Address(map.address)
                } else {
                    RawTarget::With(map)
                });
            }
            "keepalive" => u.keepalive = s.args.first().cloned(),
            _ => out.note(
                &s.at,
                Severity::Lost,
                format!(
                    "upstream {name}: {} is not translated (weighted round robin)",
                    s.name
                ),
            ),
        }
    }
    out.upstreams.insert(name, u);
}
