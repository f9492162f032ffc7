//! What a reload carries from the running request path to the new one.
//!
//! A zone or route limit is matched across the reload by its labels (zone
//! name, or route and limit name). The same algorithm and key kind keep
//! its state, rescaled when its numbers changed (`limiter::algorithm::rescale`);
//! another algorithm or key kind, or a new limit, starts fresh; a removed
//! limit's state is dropped.

use crate::config::{Config, KeyKind};
use crate::limiter::memory::Carry;
use crate::limiter::Limit;
use crate::metrics::LimitLabel;
use crate::pipeline::Pipeline;
use crate::reload::ReloadReport;

/// A limit as a reload matches it.
struct Named<'a> {
    label: LimitLabel,
    limit: &'a Limit,
    key: &'a KeyKind,
}

fn named_in(config: &Config) -> Vec<Named<'_>> {
    let zones = config.zones.iter().map(|z| Named {
        label: LimitLabel {
            tier: "zone",
            name: z.limit.name.clone(),
            route: "-".into(),
        },
        limit: &z.limit,
        key: &z.key,
    });
    let routes = config.routes.iter().flat_map(|r| {
        r.limits.iter().map(|l| Named {
            label: LimitLabel {
                tier: "route",
                name: l.limit.name.clone(),
                route: r.name.clone(),
            },
            limit: &l.limit,
            key: &l.key,
        })
    });
    zones.chain(routes).collect()
}

fn describe(l: &LimitLabel) -> String {
    match l.tier {
        "zone" => format!("zone {}", l.name),
        _ => format!("{}/{}", l.route, l.name),
    }
}

/// Which memory partition of `old` each partition of `new` takes over
/// (indexed like `new.store_zones`), and the limit changes for the report.
/// `same_store`: both configs keep state in the same kind of store (with
/// Redis, this process's memory holds the `local` fallback's state).
pub fn carry(
    old: &Pipeline,
    new: &Config,
    same_store: bool,
    report: &mut ReloadReport,
) -> Vec<Option<Carry>> {
    let redis = new.store.redis.is_some();
    let algorithm = |l: &Limit| {
        if redis {
            l.local.clone()
        } else {
            l.algorithm.clone()
        }
    };
    let running: Vec<_> = old
        .metrics()
        .limits()
        .iter()
        .zip(old.limit_views())
        .collect();
    let mut carry = vec![None; new.store_zones.len()];
    for n in named_in(new) {
        let Some((_, was)) = running.iter().find(|(l, _)| **l == n.label) else {
            report.limits_added.push(describe(&n.label));
            continue;
        };
        let same_kind = std::mem::discriminant(&was.limit.algorithm)
            == std::mem::discriminant(&n.limit.algorithm)
            && was.key == n.key;
        if !same_kind {
            report.limits_reset.push(describe(&n.label));
            continue;
        }
        if was.limit.algorithm != n.limit.algorithm {
            report.limits_rescaled.push(describe(&n.label));
        }
        if same_store {
            if let Some(slot) = carry.get_mut(n.limit.zone) {
                *slot = Some(Carry {
                    from: was.limit.zone,
                    old: algorithm(was.limit),
                    new: algorithm(n.limit),
                });
            }
        }
    }
    let kept: Vec<LimitLabel> = named_in(new).into_iter().map(|n| n.label).collect();
    for (label, _) in &running {
        if !kept.contains(label) {
            report.limits_removed.push(describe(label));
        }
    }
    carry
}
