//! One key's state, as the admin API reads and resets it: a peek that
//! charges nothing, a delete that every replica's rejection cache hears
//! of, and the single commands both are made of.

use super::{describe, resets, Check, Decision, LimiterError, RedisStore};

impl RedisStore {
    /// What the next request (cost 1) on `key` under `limit` would be told,
    /// read from Redis without charging it (the script's peek writes
    /// nothing); `None` when Redis holds no state for the key.
    pub async fn inspect(
        &self,
        limit: &crate::limiter::Limit,
        key: &str,
    ) -> Result<Option<Decision>, LimiterError> {
        let check = Check {
            peek: true,
            ..Check::new(limit, key, 1)
        };
        let exists: i64 = self
            .command(redis::cmd("EXISTS").arg(self.key(&check)))
            .await?;
        if exists == 0 {
            return Ok(None);
        }
        let (_, decided) = self.call(&[check], self.pinned()).await?;
        Ok(decided.into_iter().next())
    }

    /// Deletes `key`'s state under `limit` in Redis, forgets it in this
    /// replica's rejection cache and tells the other replicas to forget it
    /// too. Whether Redis held state for it.
    pub async fn reset(
        &self,
        limit: &crate::limiter::Limit,
        key: &str,
    ) -> Result<bool, LimiterError> {
        let rkey = self.key(&Check::new(limit, key, 1));
        let deleted: i64 = self.command(redis::cmd("DEL").arg(&rkey)).await?;
        self.forget_cached(limit, key).await;
        Ok(deleted > 0)
    }

    /// Forgets a rejection of `key` under `limit` that this replica's
    /// cache holds, and tells the other replicas to forget theirs (a
    /// reset, an override that changes the key's numbers).
    pub async fn forget_cached(&self, limit: &crate::limiter::Limit, key: &str) {
        if let Some(cache) = &self.cache {
            cache.forget(&self.suffixes[limit.zone], key);
            let channel = resets::channel(&self.prefix);
            let message = resets::message(&self.suffixes[limit.zone], key);
            let published = self
                .command::<i64>(redis::cmd("PUBLISH").arg(&channel).arg(message))
                .await;
            if let Err(e) = published {
                // The state is gone; only other replicas' caches may lag.
                tracing::warn!(error = %e, %channel, "rate-limit store: could not publish a reset; other replicas refuse the key from their caches until its retry time (may the Redis user publish to this channel?)");
            }
        }
    }

    /// One command on the shared connection, bounded by `timeout`; a
    /// failure counts toward the breaker like a decision's.
    pub(super) async fn command<T: redis::FromRedisValue>(
        &self,
        cmd: &mut redis::Cmd,
    ) -> Result<T, LimiterError> {
        let (generation, mut conn) = self
            .link
            .get()
            .map_err(|why| LimiterError::Unavailable(why.to_owned()))?;
        match tokio::time::timeout(self.timeout, cmd.query_async::<T>(&mut conn)).await {
            Ok(Ok(v)) => {
                self.link.succeeded();
                Ok(v)
            }
            Ok(Err(e)) => {
                let broken = (e.is_io_error() || e.is_unrecoverable_error()).then_some(generation);
                self.link.failed(broken);
                Err(LimiterError::Unavailable(describe(&e)))
            }
            Err(_) => {
                self.link.failed(None);
                Err(LimiterError::Timeout(self.timeout.as_millis() as u64))
            }
        }
    }
}
