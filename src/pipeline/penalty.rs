//! The penalty box: a key serving a ban is refused here, before any limit
//! is consulted (and so before the zones count it), with the box's status
//! (429, or 403 when configured), `Retry-After` to the ban's end and a
//! problem type of its own. Keys by address, header or `global` are
//! checked before the zones; keys by user once the identity is known,
//! before the route limits. This process's copy of the bans answers: no
//! store call.
//!
//! [`sentence`] is the other half: a limit that refused a key records a
//! strike, which may start a ban (logged, counted, alerted).

use http::HeaderMap;

use super::ctx::{Cause, Ctx, Rejection, Stop};
use super::key::{self, KeySource};
use crate::config::{ClientIpConfig, KeyKind, ZoneConfig};
use crate::limiter::engine::Engine;
use crate::limiter::penalty::Ban;

thread_local! {
    static KEY: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Refuses the request when its key serves a ban under a zone or route
/// limit it meets: those keyed by the identity when `users`, the others
/// otherwise.
pub fn check(
    engine: &Engine,
    zones: &[ZoneConfig],
    cx: &Ctx<'_>,
    headers: &HeaderMap,
    cfg: &ClientIpConfig,
    users: bool,
) -> Result<(), Stop> {
    if cx.bypass.is_some() || !engine.penalties().any() {
        return Ok(());
    }
    let src = KeySource {
        client: cx.client.client.ip,
        identity: &cx.identity,
        headers,
    };
    let boxed =
        |kind: &KeyKind,
         name,
         penalty: &Option<std::sync::Arc<crate::config::penalty::Penalty>>| {
            let p = penalty.as_ref()?;
            if kind.needs_identity() != users {
                return None;
            }
            let k = key::build(kind, &src, cfg)?;
            // (written into this thread's buffer: no string a request)
            let ban = KEY.with_borrow_mut(|buf| {
                use std::fmt::Write;
                buf.clear();
                let _ = write!(buf, "{k}");
                engine.banned(name, buf)
            })?;
            Some(refusal(engine, name, ban, p.status))
        };
    let every: Vec<usize>;
    let met = match cx.route {
        Some(r) => &r.zones[..],
        None => {
            every = (0..zones.len()).collect();
            &every[..]
        }
    };
    for &z in met {
        let zone = &zones[z];
        if let Some(r) = boxed(&zone.key, &zone.limit.name, &zone.penalty) {
            return Err(r.into());
        }
    }
    for l in cx.route.map_or(&[][..], |r| &r.limits[..]) {
        if let Some(r) = boxed(&l.key, &l.limit.name, &l.penalty) {
            return Err(r.into());
        }
    }
    Ok(())
}

/// The refusal for a key serving `ban` under limit `name`.
pub fn refusal(
    engine: &Engine,
    name: &std::sync::Arc<str>,
    ban: Ban,
    status: http::StatusCode,
) -> Rejection {
    let left = ban.until.saturating_sub(engine.clock().unix_ms());
    Rejection {
        limit: name.clone(),
        cause: Cause::Penalty(ban.level),
        retry_after: crate::limiter::secs(left),
        status,
        route_limit: false,
    }
}

/// Records that limit `name` refused `key` (its penalty box's strike):
/// the refusal of the ban in force after it, which answers the request
/// instead. A ban it starts is logged and kept in `cx` for the alerts.
pub async fn sentence(
    engine: &Engine,
    name: &std::sync::Arc<str>,
    key: &str,
    penalty: &crate::config::penalty::Penalty,
    cx: &mut Ctx<'_>,
) -> Option<Rejection> {
    let (ban, started) = engine.strike(name, key, &penalty.rules).await?;
    let refused = refusal(engine, name, ban, penalty.status);
    if started {
        let shown = crate::metrics::top::display(key).to_owned();
        tracing::warn!(limit = %name, key = %shown, ban = ban.level, seconds = refused.retry_after, "penalty box: key banned");
        cx.banned = Some((name.clone(), shown, ban.level, refused.retry_after));
    }
    Some(refused)
}
