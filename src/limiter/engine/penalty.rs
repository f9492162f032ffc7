//! The penalty box as the engine keeps it: on the memory store, this
//! process's records; on Redis, strikes and bans in Redis and a copy of
//! the bans in this process (see `redis::penalty`). While Redis fails, a
//! strike is recorded here, so a key is boxed all the same; the ban is
//! written to Redis when it answers again.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Engine;
use crate::limiter::penalty::{Ban, PenaltyBox, Rules};
use crate::limiter::LimiterError;

impl Engine {
    /// The ban `key` serves under limit `name`, from this process's copy:
    /// no store call.
    pub fn banned(&self, name: &Arc<str>, key: &str) -> Option<Ban> {
        self.penalties.banned(name, key, self.memory.now_ms())
    }

    /// Records that limit `name` refused `key`: the ban in force after it,
    /// and whether this strike started it.
    pub async fn strike(&self, name: &Arc<str>, key: &str, rules: &Rules) -> Option<(Ban, bool)> {
        let now = self.memory.now_ms();
        if let Some(redis) = &self.redis {
            match redis.strike(name, key, rules).await {
                Ok(Some((ban, started))) => {
                    // (a ban in force that this copy had not heard of yet:
                    // the request is refused by it all the same)
                    self.penalties.count(name, if started { 0 } else { 1 });
                    self.penalties.put(name, key, ban, now);
                    return Some((ban, started));
                }
                Ok(None) => return None,
                Err(e) => {
                    // Boxed here all the same; written back when Redis
                    // answers (the subscription's resync).
                    tracing::warn!(limit = %name, error = %e, "penalty box: Redis cannot record a strike; recorded in this replica");
                }
            }
        }
        let struck = self.penalties.strike(name, key, rules, now);
        match (struck, &self.redis) {
            (Some((_, false)), _) => self.penalties.count(name, 1),
            // Started here while Redis failed: written there once it
            // answers, for the other replicas.
            (Some((ban, true)), Some(redis)) => redis.restore_later(name, key, ban),
            _ => {}
        }
        struck
    }

    /// Lifts `key`'s ban under limit `name`, here and in the store (and so
    /// on every replica). Whether it was boxed.
    pub async fn lift(&self, name: &str, key: &str) -> Result<bool, LimiterError> {
        let here = self.penalties.lift(name, key, self.memory.now_ms());
        match &self.redis {
            Some(redis) => Ok(redis.lift(name, key).await? || here),
            None => Ok(here),
        }
    }

    /// The bans in force: (limit, key, ban), soonest end first.
    pub fn bans(&self) -> Vec<(Arc<str>, String, Ban)> {
        self.penalties.list(self.memory.now_ms())
    }

    /// Starts following the bans other replicas start and lift (Redis;
    /// once per process, whatever the reloads).
    pub fn watch_bans(&self) {
        if let (Some(redis), Ok(_)) = (&self.redis, tokio::runtime::Handle::try_current()) {
            if !self.penalties.watching.swap(true, Ordering::Relaxed) {
                redis.watch_bans(Arc::downgrade(&self.penalties));
            }
        }
    }

    /// Reads the bans Redis holds into this process's copy.
    pub(super) async fn load_bans(&self) {
        if let Some(redis) = &self.redis {
            if let Ok(bans) = redis.load_bans(self.memory.now_ms()).await {
                let now = self.memory.now_ms();
                for (name, key, ban) in bans {
                    self.penalties.put(&name, &key, ban, now);
                }
            }
        }
    }

    /// This process's table (kept across reloads).
    pub fn penalties(&self) -> &Arc<PenaltyBox> {
        &self.penalties
    }
}
