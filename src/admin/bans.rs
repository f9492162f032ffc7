//! `/api/bans`: the penalty box.
//!
//! - `GET /api/bans`: every ban in force (on Redis, every replica's):
//!   limit, key, which ban of the key's it is, and when it ends.
//! - `DELETE /api/bans/<limit>/<key>`: lifts the ban and forgets the key's
//!   strikes, on every replica sharing the store. Logged with who asked.

use http::StatusCode;
use serde_json::{json, Value};

use super::api::unavailable;
use super::{problem, Caller};
use crate::metrics::top::display;
use crate::pipeline::Pipeline;

type Reply = (StatusCode, Value);

/// `GET /api/bans[?n=1000]`: the first `n` (at most 100000), soonest end
/// first, and how many there are.
pub fn list(p: &Pipeline, query: &str) -> Reply {
    let n = super::api::param(query, "n")
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(1000)
        .clamp(1, 100_000);
    let total = p.engine().bans().len();
    (
        StatusCode::OK,
        json!({ "bans": bans(p, n), "total": total }),
    )
}

/// The first `n` bans in force, soonest end first, as JSON.
pub(super) fn bans(p: &Pipeline, n: usize) -> Vec<Value> {
    let engine = p.engine();
    let now = engine.clock().unix_ms();
    engine
        .bans()
        .into_iter()
        .take(n)
        .map(|(limit, key, ban)| {
            json!({
                "limit": &*limit,
                "key": display(&key),
                "ban": ban.level,
                "ends_in_seconds": ban.until.saturating_sub(now).div_ceil(1000),
                "ends_at_unix": ban.until / 1000,
            })
        })
        .collect()
}

/// `DELETE /api/bans/<limit>/<key>`.
pub async fn lift(rest: &str, p: &Pipeline, caller: &Caller) -> Reply {
    let (limit, key, _) = match super::overrides::target(p, rest, "bans") {
        Ok(t) => t,
        Err(reply) => return reply,
    };
    match p.engine().lift(&limit, &key).await {
        Ok(true) => {
            tracing::info!(limit = %limit, key = %display(&key), by = %caller, "admin: penalty box ban lifted");
            (
                StatusCode::OK,
                json!({ "limit": limit, "key": display(&key), "lifted": true }),
            )
        }
        Ok(false) => problem(
            StatusCode::NOT_FOUND,
            format!("{} serves no ban of \"{limit}\"", display(&key)),
        ),
        Err(e) => unavailable(e),
    }
}
