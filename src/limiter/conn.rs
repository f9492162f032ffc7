//! Concurrent requests per key (nginx `limit_conn`): a slot is taken when a
//! request is admitted and given back when its response ends, however it
//! ends (finished, failed, or dropped by a client that went away). Per
//! process, or shared by every replica through Redis as a lease that the
//! request renews while it runs (`max_conn_lease`, see
//! `redis::conns`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The requests in flight per key, for one zone.
#[derive(Default)]
pub struct ConnCounter {
    counts: Mutex<HashMap<String, u32>>,
}

/// A held concurrency slot; released when dropped.
pub enum ConnSlot {
    /// One of this process's.
    Local(LocalSlot),
    /// A lease in Redis, shared by every replica.
    Shared(super::redis::SharedSlot),
    /// None held: admitted by `on_error: fail_open` while Redis failed.
    Open,
}

/// A slot of this process's counter.
pub struct LocalSlot {
    counter: Arc<ConnCounter>,
    key: String,
}

impl ConnCounter {
    /// Takes one of `max` slots for `key`, or `None` when all are held.
    pub fn acquire(self: &Arc<Self>, key: &str, max: u32) -> Option<ConnSlot> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(key.to_owned()).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(ConnSlot::Local(LocalSlot {
            counter: self.clone(),
            key: key.to_owned(),
        }))
    }
}

impl Drop for LocalSlot {
    fn drop(&mut self) {
        let mut counts = self
            .counter
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_given_back_when_dropped() {
        let c = Arc::new(ConnCounter::default());
        let a = c.acquire("ip:1", 2).unwrap();
        let _b = c.acquire("ip:1", 2).unwrap();
        assert!(c.acquire("ip:1", 2).is_none(), "third of two");
        assert!(c.acquire("ip:2", 2).is_some(), "another key has its own");
        drop(a);
        assert!(
            c.acquire("ip:1", 2).is_some(),
            "a dropped slot is free again"
        );
    }
}
