//! The store call both limiting stages make (zones, then route limits): a
//! batch of checks, each remembering which zone or route limit it came
//! from, decided in one `Store::decide`. The outcome becomes the decisions
//! the response reports, a zone delay slept here, or a [`Rejection`] that
//! the response stage renders.
//!
//! Groups, in the order they are decided (each all or nothing; an enforced
//! group that refuses stops the ones after it, see `limiter::Store`):
//!
//! 1. zones keyed by `ip`, `header:<name>` or `global`: charged even when a
//!    later group refuses, so the per-IP tier counts every request;
//! 2. zones keyed by `user` / `user_or_ip` (they need the identity);
//! 3. the route's limits.
//!
//! Within a tier, enforced checks come before dry-run ones.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use ipnet::IpNet;
use smallvec::SmallVec;

use super::ctx::{Applied, Cause, Ctx, Rejection, Stop};
use super::key::Key;
use super::settle::Reserved;
use crate::config::limits::describe;
use crate::config::{RouteConfig, ZoneConfig};
use crate::error::ProxyError;
use crate::limiter::engine::Engine;
use crate::limiter::{most_restrictive, secs, verdict, Check, Limit, LimiterError, Store, Verdict};
use crate::metrics::Outcome;

pub const ZONE_GROUP: u8 = 0;
pub const USER_ZONE_GROUP: u8 = 1;
pub const ROUTE_GROUP: u8 = 2;

/// Where a check came from.
#[derive(Debug, Clone, Copy)]
pub enum Origin {
    /// Index into the zones.
    Zone(usize),
    /// Index into the route's limits.
    Route(usize),
}

#[derive(Debug)]
struct Item {
    group: u8,
    dry_run: bool,
    origin: Origin,
    /// Where its bucket (`ip:203.0.113.7`) is in `Batch::keys`.
    key: (u32, u32),
    /// A cost read from the request (`None`: the limit's own).
    cost: Option<u64>,
}

/// Checks waiting for one store call. Their keys are written one after
/// another into one string: one allocation per batch, not per check, and
/// a key several limits share (a zone and route limits keyed by `ip`) is
/// written once.
#[derive(Debug, Default)]
pub struct Batch {
    items: SmallVec<[Item; 4]>,
    keys: String,
    /// The last `ip` key written, and where: the next limit keyed by the
    /// same address reuses it without writing it again.
    ip: Option<(IpNet, (u32, u32))>,
}

impl Batch {
    /// Adds a check of `key`; returns the key as the store sees it.
    pub fn push(&mut self, group: u8, dry_run: bool, origin: Origin, key: &Key) -> &str {
        let range = match (key, self.ip) {
            (Key::Ip(net), Some((last, range))) if *net == last => range,
            _ => self.write(key),
        };
        self.items.push(Item {
            group,
            dry_run,
            origin,
            key: range,
            cost: None,
        });
        self.key(range)
    }

    /// The cost of the check pushed last, read from the request.
    pub fn set_cost(&mut self, cost: u64) {
        if let Some(item) = self.items.last_mut() {
            item.cost = Some(cost);
        }
    }

    /// Writes `key` after the others (unless it is there already): where
    /// it is.
    fn write(&mut self, key: &Key) -> (u32, u32) {
        if self.keys.capacity() == 0 {
            // Room for a request's few keys, so they are not moved as
            // they come.
            self.keys.reserve(64);
        }
        let start = self.keys.len();
        key.render_into(&mut self.keys);
        let all = self.keys.as_bytes();
        let same = self
            .items
            .iter()
            .map(|i| i.key)
            .find(|&(a, b)| all[a as usize..b as usize] == all[start..]);
        let range = match same {
            Some(range) => {
                self.keys.truncate(start);
                range
            }
            None => (start as u32, self.keys.len() as u32),
        };
        if let Key::Ip(net) = key {
            self.ip = Some((*net, range));
        }
        range
    }

    fn key(&self, (a, b): (u32, u32)) -> &str {
        &self.keys[a as usize..b as usize]
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// Decides the checks pending in `cx` in one store call, and empties it.
/// Route-limit decisions are added to `applied` (and those counting only
/// some statuses to `deferred`); the longest zone delay is slept here
/// (dropped, and so ended, if the client goes away); the first enforced
/// group that refuses is the rejection.
pub async fn decide(engine: &Engine, zones: &[ZoneConfig], cx: &mut Ctx<'_>) -> Result<(), Stop> {
    // Taken out of the context, which the decisions change.
    let mut batch = std::mem::take(&mut cx.pending);
    let route = cx.route;
    if batch.is_empty() {
        return Ok(());
    }
    if route.is_none() {
        // Route checks are only made for a matched route.
        batch.items.retain(|i| matches!(i.origin, Origin::Zone(_)));
    }
    // Stable: each tier's enforced checks, then its dry-run ones.
    batch.items.sort_by_key(|i| (i.group, i.dry_run));
    // The numbers of each check (a plan's, a key's override) and its
    // cost, chosen again when another replica changed the overrides since
    // (Redis says so: `Stale`); the third time without the version check.
    let mut tries = 0;
    loop {
        let version = (tries < 2).then(|| engine.overrides().version());
        let choices = choose(engine, zones, route, &batch, cx);
        let checks = checks(zones, route, &batch, &choices, version);
        let start_ns = cx.end.trace.is_some().then(crate::clock::unix_ns);
        let decided = engine.decide(&checks).await;
        super::traced::store_call(cx, start_ns, engine, checks.len(), &decided);
        match decided {
            Err(LimiterError::Stale) => tries += 1,
            decided => {
                let outcome = decided.map_err(ProxyError::LimitUnavailable)?;
                return apply(engine, zones, cx, &batch, &checks, &outcome).await;
            }
        }
    }
}

/// What the store decided for `checks` (the checks of `batch`): route
/// decisions and reservations into `cx`, the zone delay slept, or the
/// rejection.
async fn apply(
    engine: &Engine,
    zones: &[ZoneConfig],
    cx: &mut Ctx<'_>,
    batch: &Batch,
    checks: &[Check<'_>],
    outcome: &crate::limiter::Outcome,
) -> Result<(), Stop> {
    let route = cx.route;
    let mut delay = 0;
    for (start, group, decided) in outcome.decided_groups(checks) {
        let items = &batch.items[start..start + group.len()];
        if let (Some(route), Origin::Route(_)) = (route, items[0].origin) {
            for (k, (item, d)) in items.iter().zip(decided).enumerate() {
                let Origin::Route(i) = item.origin else {
                    continue;
                };
                let limit = &route.limits[i];
                cx.applied.push(Applied {
                    name: limit.limit.name.clone(),
                    decision: *d,
                });
                if limit.count_status.is_some() && d.admitted() {
                    cx.deferred.push((i, batch.key(item.key).to_owned()));
                }
                if d.admitted() && checks[start + k].limit.algorithm.calendar().is_some() {
                    let used = d.limit.saturating_sub(d.remaining);
                    let key = batch.key(item.key).to_owned();
                    cx.quotas.push((item.origin, key, used, d.limit));
                }
                if let (Some(settle), true) = (&limit.settle, d.admitted()) {
                    let check = &checks[start + k];
                    cx.reserved.push(Reserved {
                        limit: check.limit.clone(),
                        key: check.key.to_owned(),
                        units: check.cost,
                        settle: settle.clone(),
                        degraded: outcome.degraded,
                        metric: i,
                        plan: cx.plan,
                        at_ms: engine.clock().unix_ms(),
                    });
                }
            }
        }
        let dry = group[0].dry_run;
        for (item, d) in items.iter().zip(decided) {
            let outcome = match d.verdict {
                Verdict::Reject if dry => Outcome::DryRunRejected,
                Verdict::Reject => Outcome::Rejected,
                Verdict::Delay(_) if !dry => Outcome::Delayed,
                Verdict::Delay(_) | Verdict::Allow => Outcome::Allowed,
            };
            cx.counted.push((item.origin, outcome));
            if matches!(outcome, Outcome::Rejected | Outcome::DryRunRejected) {
                cx.rejected_keys
                    .push((item.origin, outcome, batch.key(item.key).to_owned()));
            }
        }
        match verdict(decided) {
            Verdict::Allow => {}
            Verdict::Delay(ms) if !dry => delay = delay.max(ms),
            Verdict::Delay(_) => {}
            Verdict::Reject if dry => {
                let worst = most_restrictive(decided.iter()).unwrap_or(0);
                tracing::info!(limit = %group[worst].limit.name, "dry run: would reject");
            }
            Verdict::Reject => {
                let worst = most_restrictive(decided.iter()).unwrap_or(0);
                let retry_ms = decided[worst].retry_after_ms;
                let rejection = match (items[worst].origin, route) {
                    (Origin::Route(i), Some(r)) => {
                        let l = &r.limits[i];
                        // A plan's or an override's numbers say their own.
                        let chosen = &checks[start + worst].limit;
                        let mut described = match chosen.base {
                            None => l.description.clone(),
                            Some(_) => Arc::from(describe(&chosen.algorithm, l.unit)),
                        };
                        // A quota says when its period ends, in its zone.
                        if let Some(cal) = chosen.algorithm.calendar() {
                            let at = engine.clock().unix_ms() + retry_ms;
                            described = format!("{described}, resets at {}", cal.local(at)).into();
                        }
                        rejected(
                            &l.limit.name,
                            &described,
                            retry_ms,
                            StatusCode::TOO_MANY_REQUESTS,
                            true,
                        )
                    }
                    (Origin::Zone(z), _) => {
                        let zone = &zones[z];
                        // A plan's or an override's numbers say their own.
                        let chosen = &checks[start + worst].limit;
                        let described = match chosen.base {
                            None => zone.rate_text.clone(),
                            Some(_) => Arc::from(describe(&chosen.algorithm, "requests")),
                        };
                        rejected(&zone.limit.name, &described, retry_ms, zone.status, false)
                    }
                    (Origin::Route(_), None) => continue,
                };
                // A limit with a penalty box records the strike; a ban in
                // force after it answers instead.
                let penalty = match (items[worst].origin, route) {
                    (Origin::Route(i), Some(r)) => r.limits[i].penalty.as_ref(),
                    (Origin::Zone(z), _) => zones[z].penalty.as_ref(),
                    (Origin::Route(_), None) => None,
                };
                if let Some(p) = penalty {
                    let key = checks[start + worst].key;
                    let name = rejection.limit.clone();
                    if let Some(banned) = super::penalty::sentence(engine, &name, key, p, cx).await
                    {
                        return Err(banned.into());
                    }
                }
                return Err(rejection.into());
            }
        }
    }
    if delay > 0 {
        cx.delayed_ms += delay;
        engine.clock().sleep(Duration::from_millis(delay)).await;
    }
    Ok(())
}

/// What a route check is decided under: the limit's own numbers, its
/// plan's, or a key's override (owned: made for this request).
enum Choice {
    Own,
    Plan(usize),
    Override(Box<Limit>),
}

/// Per item of `batch`: its numbers and cost.
fn choose(
    engine: &Engine,
    zones: &[ZoneConfig],
    route: Option<&RouteConfig>,
    batch: &Batch,
    cx: &Ctx<'_>,
) -> SmallVec<[(Choice, u64); 4]> {
    let overrides = engine.overrides();
    batch
        .items
        .iter()
        .map(|item| {
            let (limit, plans, cost) = match (item.origin, route) {
                (Origin::Zone(z), _) => (&zones[z].limit, &zones[z].plans[..], 1),
                (Origin::Route(i), Some(r)) => {
                    let l = &r.limits[i];
                    (&l.limit, &l.plans[..], item.cost.unwrap_or(l.cost))
                }
                (Origin::Route(_), None) => return (Choice::Own, 1),
            };
            let now = || engine.clock().unix_ms();
            if let (Some(numbers), _) = overrides.lookup(&limit.name, batch.key(item.key), now) {
                match numbers.apply(&limit.algorithm) {
                    Ok(a) => {
                        let mut limit = limit.with_numbers(a);
                        if let (Origin::Route(i), Some(r), Some(day)) = (item.origin, route, cx.billing_day) {
                            if r.limits[i].billing_day {
                                limit = billing_day(&limit, day).unwrap_or(limit);
                            }
                        }
                        return (Choice::Override(Box::new(limit)), cost);
                    }
                    Err(e) => tracing::warn!(limit = %limit.name, error = %e, "an override does not fit this limit; its own numbers apply"),
                }
            }
            // (a zone has plans only when keyed by user: decided after
            // the identity, which found the plan)
            let plan = cx
                .plan
                .map(usize::from)
                .filter(|&p| plans.get(p).is_some_and(Option::is_some));
            let anchored = match (item.origin, route, cx.billing_day) {
                (Origin::Route(i), Some(r), Some(day)) if r.limits[i].billing_day => {
                    let chosen = plan.and_then(|p| plans[p].as_ref()).unwrap_or(limit);
                    billing_day(chosen, day)
                }
                _ => None,
            };
            match (anchored, plan) {
                (Some(limit), _) => (Choice::Override(Box::new(limit)), cost),
                (None, Some(p)) => (Choice::Plan(p), cost),
                (None, None) => (Choice::Own, cost),
            }
        })
        .collect()
}

/// A monthly quota's numbers from the key's billing day, when not its own.
fn billing_day(limit: &Limit, day: u8) -> Option<Limit> {
    let crate::limiter::Algorithm::Quota { limit: n, calendar } = &limit.algorithm else {
        return None;
    };
    (calendar.day != day).then(|| {
        limit.with_numbers(crate::limiter::Algorithm::Quota {
            limit: *n,
            calendar: calendar.anchored(day),
        })
    })
}

/// The checks of `batch`, under `choices`.
fn checks<'a>(
    zones: &'a [ZoneConfig],
    route: Option<&'a RouteConfig>,
    batch: &'a Batch,
    choices: &'a [(Choice, u64)],
    version: Option<u64>,
) -> SmallVec<[Check<'a>; 4]> {
    let mut checks = SmallVec::new();
    for (item, (choice, cost)) in batch.items.iter().zip(choices) {
        let (limit, peek) = match (item.origin, route) {
            (Origin::Zone(z), _) => {
                let zone = &zones[z];
                match choice {
                    Choice::Own => (&zone.limit, false),
                    Choice::Plan(p) => (zone.plans[*p].as_ref().unwrap_or(&zone.limit), false),
                    Choice::Override(o) => (&**o, false),
                }
            }
            (Origin::Route(i), Some(r)) => {
                let l = &r.limits[i];
                let limit = match choice {
                    Choice::Own => &l.limit,
                    Choice::Plan(p) => l.plans[*p].as_ref().unwrap_or(&l.limit),
                    Choice::Override(o) => o,
                };
                // Limits that count only some statuses are charged later.
                (limit, l.count_status.is_some())
            }
            (Origin::Route(_), None) => continue,
        };
        checks.push(Check {
            peek,
            group: item.group,
            dry_run: item.dry_run,
            overrides: version,
            ..Check::new(limit, batch.key(item.key), *cost)
        });
    }
    checks
}

/// The rejection by the limit `name` ("5 requests per 60s").
fn rejected(
    name: &Arc<str>,
    what: &Arc<str>,
    retry_ms: u64,
    status: StatusCode,
    route_limit: bool,
) -> Rejection {
    Rejection {
        limit: name.clone(),
        cause: Cause::Rate(what.clone()),
        retry_after: secs(retry_ms),
        status,
        route_limit,
    }
}

/// Charges the route limits that count only some statuses, now that the
/// upstream answered `status`. Each is charged on its own (a group each,
/// dry-run so one over its limit does not stop the others), in one call.
pub async fn charge_outcome(
    engine: &Engine,
    route: &RouteConfig,
    deferred: &[(usize, String)],
    status: u16,
) {
    let checks: Vec<Check<'_>> = deferred
        .iter()
        .filter_map(|(i, key)| {
            let l = &route.limits[*i];
            l.count_status
                .as_ref()
                .is_some_and(|s| s.contains(&status))
                .then(|| Check::new(&l.limit, key, l.cost))
        })
        .enumerate()
        .map(|(i, c)| Check {
            group: (i % 2) as u8,
            dry_run: true,
            ..c
        })
        .collect();
    if !checks.is_empty() {
        let _ = engine.decide(&checks).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_check_gets_its_own_key_and_a_shared_key_is_written_once() {
        let ip = |a: &str| Key::Ip(a.parse().unwrap());
        let user = Key::User("jwt:alice".into());
        let mut b = Batch::default();
        let mut push = |origin, key: &Key| b.push(ROUTE_GROUP, false, origin, key).to_owned();
        assert_eq!(
            push(Origin::Zone(0), &ip("203.0.113.7/32")),
            "ip:203.0.113.7"
        );
        assert_eq!(push(Origin::Route(0), &user), "user:jwt:alice");
        assert_eq!(
            push(Origin::Route(1), &ip("203.0.113.7/32")),
            "ip:203.0.113.7"
        );
        assert_eq!(push(Origin::Route(2), &user), "user:jwt:alice");
        assert_eq!(
            push(Origin::Route(3), &ip("203.0.113.8/32")),
            "ip:203.0.113.8"
        );
        assert_eq!(
            push(Origin::Route(4), &ip("203.0.113.0/24")),
            "ip:203.0.113.0/24"
        );
        assert_eq!(
            push(Origin::Route(5), &ip("203.0.113.7/32")),
            "ip:203.0.113.7"
        );
        let keys: Vec<&str> = b.items.iter().map(|i| b.key(i.key)).collect();
        assert_eq!(
            keys,
            [
                "ip:203.0.113.7",
                "user:jwt:alice",
                "ip:203.0.113.7",
                "user:jwt:alice",
                "ip:203.0.113.8",
                "ip:203.0.113.0/24",
                "ip:203.0.113.7",
            ]
        );
        assert_eq!(
            b.keys, "ip:203.0.113.7user:jwt:aliceip:203.0.113.8ip:203.0.113.0/24",
            "each distinct key written once"
        );
    }
}
