//! Tier 1, the zones (nginx `limit_req` / `limit_conn`): coarse limits
//! keyed by `ip`, `header:<name>` or `global`, met before anything looks at
//! a credential or a webhook rule. So every request a client sends is
//! counted, including the ones later refused with 401 or 403, and a client
//! over its zone is refused before any signature is checked.
//!
//! Zones keyed by `user` / `user_or_ip` need the verified identity: they
//! are counted by [`Zones::count_users`] after the identity stage, in the
//! same store call as the route limits.

use std::sync::Arc;

use http::HeaderMap;

use super::ctx::{Cause, Ctx, Rejection, Stop};
use super::decide::{self, Origin, USER_ZONE_GROUP, ZONE_GROUP};
use super::key::{self, KeySource};
use crate::config::{ClientIpConfig, ZoneConfig};
use crate::limiter::conn::{ConnCounter, ConnSlot};
use crate::limiter::engine::Engine;

pub struct Zones {
    zones: Vec<ZoneConfig>,
    /// Requests in flight per key, for zones with `max_conn`.
    conns: Vec<Option<Arc<ConnCounter>>>,
    /// `0..zones`: what a request that matches no route meets.
    all: Vec<usize>,
}

impl Zones {
    /// The zones of a config; `previous` (the running config's, on reload)
    /// lends its `max_conn` counts by zone name, so requests in flight
    /// across the reload still hold their slots.
    pub fn new(zones: Vec<ZoneConfig>, previous: Option<&Zones>) -> Self {
        let carried = |z: &ZoneConfig| {
            let p = previous?;
            let i = p.zones.iter().position(|o| o.limit.name == z.limit.name)?;
            p.conns[i].clone()
        };
        Zones {
            conns: zones
                .iter()
                .map(|z| {
                    z.max_conn
                        .map(|_| carried(z).unwrap_or_else(|| Arc::new(ConnCounter::default())))
                })
                .collect(),
            all: (0..zones.len()).collect(),
            zones,
        }
    }

    pub fn configs(&self) -> &[ZoneConfig] {
        &self.zones
    }

    /// Counts the request in the zones it meets that do not need the
    /// identity: takes their `max_conn` slots and adds their checks to
    /// `cx.pending`. With `now` the checks are decided at once (something
    /// before the route limits may refuse the request or cost real work,
    /// such as a signature check); otherwise they go to the store with the
    /// route limits, in one call.
    pub async fn count(
        &self,
        engine: &Engine,
        cx: &mut Ctx<'_>,
        headers: &HeaderMap,
        cfg: &ClientIpConfig,
        now: bool,
    ) -> Result<(), Stop> {
        self.collect(engine, cx, headers, cfg, false).await?;
        if now {
            decide::decide(engine, &self.zones, cx).await?;
        }
        Ok(())
    }

    /// Adds the zones keyed by the (now verified) identity to `cx.pending`.
    pub async fn count_users(
        &self,
        engine: &Engine,
        cx: &mut Ctx<'_>,
        headers: &HeaderMap,
        cfg: &ClientIpConfig,
    ) -> Result<(), Stop> {
        self.collect(engine, cx, headers, cfg, true).await
    }

    /// The zones met that need the identity (or not, per `users`).
    async fn collect(
        &self,
        engine: &Engine,
        cx: &mut Ctx<'_>,
        headers: &HeaderMap,
        cfg: &ClientIpConfig,
        users: bool,
    ) -> Result<(), Stop> {
        if cx.bypass.is_some() {
            return Ok(());
        }
        let met = cx.route.map_or(self.all.as_slice(), |r| r.zones.as_slice());
        let group = if users { USER_ZONE_GROUP } else { ZONE_GROUP };
        for &z in met {
            let zone = &self.zones[z];
            if zone.key.needs_identity() != users {
                continue;
            }
            let src = KeySource {
                client: cx.client.client.ip,
                identity: &cx.identity,
                headers,
            };
            let Some(key) = key::build(&zone.key, &src, cfg) else {
                continue;
            };
            let key = cx.pending.push(group, zone.dry_run, Origin::Zone(z), &key);
            if zone.max_conn.is_some() {
                self.hold(engine, z, key, &mut cx.end.slots).await?;
            }
        }
        Ok(())
    }

    /// `max_conn`: takes a concurrency slot for `key` (shared through
    /// Redis with `max_conn_lease`), or refuses.
    async fn hold(
        &self,
        engine: &Engine,
        z: usize,
        key: &str,
        slots: &mut Vec<ConnSlot>,
    ) -> Result<(), Stop> {
        let zone = &self.zones[z];
        let (Some(max), Some(counter)) = (zone.max_conn, &self.conns[z]) else {
            return Ok(());
        };
        let held = engine
            .hold_conn(&zone.limit, key, (max, zone.max_conn_lease), counter)
            .await
            .map_err(crate::error::ProxyError::LimitUnavailable)?;
        match held {
            Some(slot) => slots.push(slot),
            None if zone.dry_run => {
                tracing::info!(zone = %zone.limit.name, "dry run: would refuse, too many concurrent requests");
            }
            None => {
                let name = &zone.limit.name;
                return Err(Rejection {
                    limit: name.clone(),
                    cause: Cause::Concurrency(max),
                    retry_after: 1,
                    status: zone.status,
                    route_limit: false,
                }
                .into());
            }
        }
        Ok(())
    }
}
