//! Keys whose numbers are not their limit's own (a plan's, an override's):
//! each slot remembers the id of the numbers its state was written under,
//! so a key that changes plan is rescaled from them, as a reload rescales
//! a limit; and the settlement of reserved costs.

use std::sync::RwLock;

use super::{lock, MemoryStore, Shard, Zone};
use crate::limiter::algorithm::Algorithm;

/// Other numbers than the limit's own that states of a zone were written
/// under, each with an id (from 1) that the state's slot keeps: a key that
/// changes plan is rescaled from the numbers it was written under, as a
/// reload rescales it. Id 0 is the limit's own numbers; `UNKNOWN` (past
/// the table's size) is read as it is.
#[derive(Default, Clone)]
pub(super) struct Numbers {
    list: Vec<Algorithm>,
    ids: std::collections::HashMap<Algorithm, u16>,
}

pub(super) const UNKNOWN: u16 = u16::MAX;

impl Numbers {
    pub(super) fn of(&self, id: u16) -> Option<&Algorithm> {
        self.list.get(usize::from(id).checked_sub(1)?)
    }
}

pub(super) fn read(numbers: &RwLock<Numbers>) -> std::sync::RwLockReadGuard<'_, Numbers> {
    numbers.read().unwrap_or_else(|e| e.into_inner())
}

impl Zone {
    /// The id of `limit`'s numbers in this zone (0: the limit's own).
    pub(super) fn variant_of(&self, limit: &crate::limiter::Limit) -> u16 {
        if limit.base.is_none() || limit.algorithm == *limit.base_algorithm() {
            return 0;
        }
        if let Some(&id) = read(&self.numbers).ids.get(&limit.algorithm) {
            return id;
        }
        let mut n = self.numbers.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&id) = n.ids.get(&limit.algorithm) {
            return id;
        }
        if n.list.len() >= usize::from(UNKNOWN - 1) {
            return UNKNOWN;
        }
        n.list.push(limit.algorithm.clone());
        let id = n.list.len() as u16;
        n.ids.insert(limit.algorithm.clone(), id);
        id
    }

    /// Brings slot `idx`'s state to `limit`'s numbers (a key whose plan or
    /// override changed), rescaled from those it was written under.
    pub(super) fn align(
        &self,
        shard: &mut Shard,
        idx: u32,
        limit: &crate::limiter::Limit,
        now: u64,
    ) {
        let have = shard.variant(idx);
        if have == 0 && limit.base.is_none() {
            return;
        }
        let want = self.variant_of(limit);
        if have == want || have == UNKNOWN || want == UNKNOWN {
            shard.set_variant(idx, want);
            return;
        }
        let old = match have {
            0 => limit.base_algorithm().clone(),
            id => match read(&self.numbers).of(id) {
                Some(a) => a.clone(),
                None => limit.algorithm.clone(),
            },
        };
        shard.with_state(idx, |s| {
            *s = crate::limiter::algorithm::rescale(&limit.algorithm, &old, s, now)
        });
        shard.set_variant(idx, want);
    }
}

impl Shard {
    /// The id of the numbers slot `idx`'s state was written under.
    pub(super) fn variant(&self, idx: u32) -> u16 {
        self.variants.get(idx as usize).copied().unwrap_or(0)
    }

    pub(super) fn set_variant(&mut self, idx: u32, id: u16) {
        let i = idx as usize;
        if self.variants.len() <= i {
            if id == 0 {
                return;
            }
            self.variants.resize(self.slots.len().max(i + 1), 0);
        }
        self.variants[i] = id;
    }
}

impl MemoryStore {
    /// Settles a cost reserved `age` ms ago on `key` under `limit`: `delta`
    /// more units (fewer when negative); see `algorithm::settle`.
    pub fn settle(&self, limit: &crate::limiter::Limit, key: &str, age: u64, delta: i64) {
        self.settle_at(limit, key, self.now_ms(), age, delta)
    }

    /// [`MemoryStore::settle`] at `now` (ms).
    pub fn settle_at(
        &self,
        limit: &crate::limiter::Limit,
        key: &str,
        now: u64,
        age: u64,
        delta: i64,
    ) {
        let zone = &self.zones[limit.zone];
        let hash = self.hash(key);
        let mut shard = lock(&zone.shards[zone.shard_of(hash)]);
        let idx = match shard.find(hash) {
            Some(idx) => idx,
            // Nothing left to refund; an extra starts the key's state.
            None if delta <= 0 => return,
            None => shard.entry(hash),
        };
        zone.align(&mut shard, idx, limit, now);
        shard.with_state(idx, |s| {
            crate::limiter::algorithm::settle(&limit.algorithm, s, now, age, delta)
        });
    }
}
