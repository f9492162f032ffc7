//! Tier 2, the route limits: the matched route's named limits (per user,
//! per route; several at once, all or nothing), decided after the identity
//! so they can key on the verified user. Zones keyed by the user, and any
//! zone checks still pending, go to the store in the same call: one store
//! call (one Redis round trip) for most requests.
//!
//! A rejection is a value (`Stop::Limited`) that the response stage renders
//! as a 429 with the route's rate-limit headers; it never reaches the
//! upstream. Dry-run limits decide, count, log and add headers, but never
//! reject.

use http::HeaderMap;

use super::identity::Claims;
use crate::config::CostFrom;

use super::ctx::{Ctx, Stop};
use super::decide::{self, Origin, ROUTE_GROUP};
use super::key::{self, KeySource};
use super::zones::Zones;
use crate::config::ClientIpConfig;
use crate::limiter::engine::Engine;

/// Decides the route limits, the zones keyed by user and the pending zone
/// checks, in one store call.
pub async fn decide(
    engine: &Engine,
    zones: &Zones,
    cx: &mut Ctx<'_>,
    headers: &HeaderMap,
    cfg: &ClientIpConfig,
) -> Result<(), Stop> {
    if cx.bypass.is_some() {
        return Ok(());
    }
    super::penalty::check(engine, zones.configs(), cx, headers, cfg, true)?;
    zones.count_users(engine, cx, headers, cfg).await?;
    if let Some(route) = cx.route {
        let src = KeySource {
            client: cx.client.client.ip,
            identity: &cx.identity,
            headers,
        };
        for (i, l) in route.limits.iter().enumerate() {
            // Limits whose key does not apply to this request are skipped.
            if let Some(k) = key::build(&l.key, &src, cfg) {
                cx.pending
                    .push(ROUTE_GROUP, l.dry_run, Origin::Route(i), &k);
                if let Some(from) = &l.cost_from {
                    let trusted = cx.client.peer_trusted;
                    cx.pending
                        .set_cost(cost(from, l.cost, headers, trusted, cx.claims.as_deref()));
                }
            }
        }
    }
    decide::decide(engine, zones.configs(), cx).await
}

/// A route limit's cost read from the request: a header from a trusted
/// proxy, or a verified token's claim, cut to `max`; `default` when
/// missing, zero or not a number.
fn cost(
    from: &CostFrom,
    default: u64,
    headers: &HeaderMap,
    peer_trusted: bool,
    claims: Option<&Claims>,
) -> u64 {
    let header = || {
        let v = headers.get(from.header.as_ref()?)?.to_str().ok()?;
        v.trim().parse::<u64>().ok()
    };
    let claim = || {
        let v = claims?.get(from.claim.as_ref()?)?;
        v.as_u64().or_else(|| v.as_str()?.trim().parse().ok())
    };
    peer_trusted
        .then(header)
        .flatten()
        .or_else(claim)
        .filter(|&n| n > 0)
        .map_or(default, |n| n.min(from.max))
}
