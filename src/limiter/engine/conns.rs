//! `max_conn` slots: this process's counter, or shared through Redis
//! (`max_conn_lease`), whose failure follows the zone's `on_error`.

use std::sync::Arc;

use super::super::conn::{ConnCounter, ConnSlot};
use super::super::{Limit, LimiterError, OnError};
use super::Engine;

impl Engine {
    /// A slot of `max` for `key`; `None` when all are held. Shared through
    /// Redis when `lease_ms` is set and Redis is there; else (and with
    /// `on_error: local` while Redis fails, at `max` / replicas) one of
    /// `local`'s. `fail_open` admits without a slot; `fail_closed` refuses
    /// with 503.
    pub async fn hold_conn(
        &self,
        limit: &Limit,
        key: &str,
        (max, lease_ms): (u32, Option<u64>),
        local: &Arc<ConnCounter>,
    ) -> Result<Option<ConnSlot>, LimiterError> {
        let (Some(lease), Some(redis)) = (lease_ms, &self.redis) else {
            return Ok(local.acquire(key, max));
        };
        let err = match redis.take_conn(limit.zone, key, max, lease).await {
            Ok(slot) => return Ok(slot.map(ConnSlot::Shared)),
            Err(e) => e,
        };
        self.warn_degraded(self.memory.now_ms(), &err);
        let closed = self.fell_back(limit, &err);
        match limit.on_error {
            OnError::FailClosed => Err(closed),
            OnError::FailOpen => Ok(Some(ConnSlot::Open)),
            OnError::Local => {
                let share = u64::from(max).div_ceil(limit.replicas.max(1)).max(1);
                Ok(local.acquire(key, u32::try_from(share).unwrap_or(max)))
            }
        }
    }
}
