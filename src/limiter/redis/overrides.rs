//! Overrides kept in Redis (see `limiter::overrides`): a hash of every
//! override and a version counter beside it, changed together by one
//! script; and the settlement of reserved costs (`settle.lua`).

use super::{LimiterError, RedisStore};

/// The Redis hash of the overrides and their version counter: one slot.
pub(super) fn overrides_keys(prefix: &str) -> (String, String) {
    (
        format!("{prefix}{{overrides}}"),
        format!("{prefix}{{overrides}}:v"),
    )
}

const PUT_OVERRIDE: &str = "
-- KEYS: the overrides hash, its version. ARGV: field, value ('' deletes).
-- Overrides past their expiry (Redis time) are dropped on the way.
local had
if ARGV[2] == '' then had = redis.call('HDEL', KEYS[1], ARGV[1])
else had = 1 - redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local ok, o = pcall(cjson.decode, all[i + 1])
  if ok and type(o) == 'table' and type(o.expires_ms) == 'number' and o.expires_ms <= now then
    redis.call('HDEL', KEYS[1], all[i])
    if all[i] == ARGV[1] then had = 0 end
  end
end
redis.call('INCR', KEYS[2])
return had
";

impl RedisStore {
    /// The overrides in Redis and their version.
    pub async fn load_overrides(
        &self,
    ) -> Result<(u64, crate::limiter::overrides::Table), LimiterError> {
        let (hash, version) = overrides_keys(&self.prefix);
        // The version first: a change between the two reads is caught by
        // the next decision (its version is then older than Redis's).
        let v: Option<u64> = self.command(redis::cmd("GET").arg(&version)).await?;
        let fields: Vec<(String, String)> = self.command(redis::cmd("HGETALL").arg(&hash)).await?;
        Ok((v.unwrap_or(0), crate::limiter::overrides::table_of(fields)))
    }

    /// Sets (`Some`) or deletes one override in Redis and moves the
    /// version on, in one script; whether one was there before.
    pub async fn put_override(
        &self,
        limit: &str,
        key: &str,
        value: Option<&crate::limiter::overrides::Override>,
    ) -> Result<bool, LimiterError> {
        let (hash, version) = overrides_keys(&self.prefix);
        let value = match value {
            Some(o) => serde_json::to_string(o).unwrap_or_default(),
            None => String::new(),
        };
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(PUT_OVERRIDE)
            .arg(2)
            .arg(hash)
            .arg(version)
            .arg(crate::limiter::overrides::field(limit, key))
            .arg(value);
        let had: i64 = self.command(&mut cmd).await?;
        Ok(had > 0)
    }
}

const SETTLE: &str = include_str!("settle.lua");

impl RedisStore {
    /// Settles reserved costs (`settle.lua`): per limit and key, `delta`
    /// units more than reserved `age_ms` ago (fewer when negative), in one
    /// atomic script on Redis time. Sent once: a call that times out may
    /// have landed, and is not repeated (nothing is charged twice).
    pub async fn settle(
        &self,
        items: &[(&crate::limiter::Limit, &str, i64)],
        age_ms: u64,
    ) -> Result<(), LimiterError> {
        if items.is_empty() {
            return Ok(());
        }
        // On a cluster, with a receipt: the client's retry settles once.
        static ONCE: std::sync::LazyLock<String> =
            std::sync::LazyLock::new(|| super::function::once(SETTLE));
        let keys: Vec<String> = items
            .iter()
            .map(|(limit, key, _)| self.key(&crate::limiter::Check::new(limit, key, 1)))
            .collect();
        let receipt = self.link.receipt(&keys[0], self.timeout);
        let mut cmd = redis::cmd("EVAL");
        let script = if receipt.is_some() {
            ONCE.as_str()
        } else {
            SETTLE
        };
        cmd.arg(script)
            .arg(keys.len() + usize::from(receipt.is_some()))
            .arg(keys);
        cmd.arg(&receipt).arg(age_ms);
        for (limit, _, delta) in items {
            let (tag, p1, p2, p3) = super::setup::params(&limit.algorithm, || self.clock.unix_ms());
            cmd.arg(tag).arg(p1).arg(p2).arg(p3).arg(*delta);
        }
        if let Some(r) = &receipt {
            cmd.arg(&r.last);
        }
        let _: i64 = self.command(&mut cmd).await?;
        Ok(())
    }
}
