//! The embedded store (the default): limit state in process memory.
//!
//! - One zone per limit, bounded by a size in bytes like nginx
//!   `zone=name:10m`. Each zone is split into shards, each behind its own
//!   mutex, so two cores rarely contend and no lock covers the whole zone.
//! - A shard is a hash map from a 63-bit key hash (SipHash with a per-process
//!   random key, so clients cannot aim collisions) to a slot in a slab.
//! - When a shard is full, a least-recently-used key is evicted (counted in
//!   `evictions`), chosen by the CLOCK approximation of LRU: each use marks
//!   the slot; the hand clears marks as it passes and evicts the first
//!   unmarked key, so a key used since the hand last passed is never
//!   evicted. This costs one write per decision instead of relinking a
//!   list through cold memory. Idle keys, whose state would decide like a
//!   fresh key, are expired as requests arrive: each decision looks at the
//!   two slots under the hand. Nothing ever scans a whole zone under a lock.
//! - Keys are hashes: two keys colliding in 63 bits would share a bucket
//!   (about one pair in 10^7 at a million keys).
//!
//! Memory per tracked key, measured by `benches/limiter.rs`: see docs/benchmarks.md.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use hashbrown::HashTable;
use smallvec::SmallVec;
use std::sync::{Mutex, MutexGuard, RwLock};
use std::time::Instant;

use crate::clock::Clock;

use super::algorithm::{Algorithm, State};
use super::{Check, Decision, LimiterError, Outcome, Store};
use numbers::{read, Numbers};

/// How many cold keys each decision inspects for expiry (nginx: 1-2).
const EXPIRE_PER_DECISION: usize = 2;

/// One zone: where one limit keeps its keys. The limit's algorithm comes
/// with each check, so the zone only knows its size.
#[derive(Debug, Clone)]
pub struct ZoneSpec {
    /// The limit's name (a Redis store builds its keys from it).
    pub name: std::sync::Arc<str>,
    /// The route of a route limit (`None`: a zone): tells apart the
    /// Redis keys of one limit name used on several routes.
    pub route: Option<std::sync::Arc<str>>,
    /// Upper bound for this zone's memory.
    pub size_bytes: u64,
}

pub struct MemoryStore {
    /// Shared with the store a reload replaced, for the limits it kept.
    zones: Box<[Arc<Zone>]>,
    /// Keyed per process, so key hashes cannot be predicted from outside.
    hasher: std::collections::hash_map::RandomState,
    clock: Clock,
    origin: Instant,
    /// Wall-clock ms at `origin`: windows align with real time.
    origin_ms: u64,
}

struct Zone {
    shards: Box<[Mutex<Shard>]>,
    /// The configured size, to tell a resize on reload.
    size_bytes: u64,
    /// The numbers keys were written under other than the limit's own (a
    /// plan's, an override's), by id; see [`Numbers`].
    numbers: RwLock<Numbers>,
}

/// How a limit of a new config takes over a limit's state from the store
/// it replaces (matched by name on reload).
#[derive(Debug, Clone)]
pub struct Carry {
    /// The limit's memory partition in the running store.
    pub from: usize,
    pub old: Algorithm,
    pub new: Algorithm,
}

/// Bytes one tracked key costs in a full shard: its slot plus its share of
/// the hash table (a 4-byte bucket and a control byte, at a load between
/// 7/16 and 7/8 as deletions come and go).
pub const ENTRY_BYTES: usize = std::mem::size_of::<Slot>() + 12;

struct Slot {
    /// The key's hash (63 bits) and the `REFERENCED` mark; `FREE` when empty.
    tag: u64,
    state: State,
}

struct Shard {
    /// Slot indices, found by the key hash the slot holds: 4 bytes a
    /// bucket, and key hashes are already uniform (no second hashing).
    map: HashTable<u32>,
    slots: Vec<Slot>,
    /// Reusable slot indices.
    free: Vec<u32>,
    /// The clock hand: next slot to consider for eviction and expiry.
    hand: u32,
    /// Slots this shard may hold.
    capacity: usize,
    /// Per slot, the id of the numbers its state was written under (see
    /// [`Numbers`]); empty while every state has the limit's own, and a
    /// slot past its end has them.
    variants: Vec<u16>,
    /// Heap bytes held by sliding logs, on top of the slots.
    log_bytes: usize,
    log_budget: usize,
    evictions: u64,
    expirations: u64,
}

/// Counters for tests and metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ZoneStats {
    pub keys: usize,
    pub capacity: usize,
    pub evictions: u64,
    pub expirations: u64,
    pub log_bytes: usize,
}

impl MemoryStore {
    /// A store on the system clock.
    pub fn new(zones: &[ZoneSpec]) -> Self {
        Self::with_clock(zones, Clock::system())
    }

    /// A store whose decisions read `clock`.
    pub fn with_clock(zones: &[ZoneSpec], clock: Clock) -> Self {
        let (origin, origin_ms) = (clock.now(), clock.unix_ms());
        MemoryStore {
            zones: zones.iter().map(|z| Arc::new(Zone::new(z))).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
            clock,
            origin,
            origin_ms,
        }
    }

    /// Milliseconds on a monotonic clock that starts at the wall time.
    pub fn now_ms(&self) -> u64 {
        self.origin_ms
            + self
                .clock
                .now()
                .saturating_duration_since(self.origin)
                .as_millis() as u64
    }

    /// The clock its decisions read.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The key's hash (each zone has its own table, so the zone is not
    /// part of it: a zone carried into a reloaded store keeps its hashes).
    fn hash(&self, key: &str) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(key.as_bytes());
        // 63 bits: the top bit of a slot's tag marks recent use.
        match h.finish() & !REFERENCED {
            FREE => 0,
            k => k,
        }
    }

    pub fn stats(&self, zone: usize) -> ZoneStats {
        let mut s = ZoneStats::default();
        for shard in self.zones[zone].shards.iter() {
            let g = lock(shard);
            s.keys += g.map.len();
            s.capacity += g.capacity;
            s.evictions += g.evictions;
            s.expirations += g.expirations;
            s.log_bytes += g.log_bytes;
        }
        s
    }

    /// The store for a reloaded config with zones `zones`: `carry[i]` says
    /// which zone of this store the new zone `i` takes over, if any. A zone
    /// of the same size is shared (requests still running on this store
    /// count in it too), its states rescaled when the limit's numbers
    /// changed; a resized zone is a copy that keeps the most recently used
    /// keys first. Same hash keys and clock: nothing else changes.
    pub fn reloaded(&self, zones: &[ZoneSpec], carry: &[Option<Carry>]) -> MemoryStore {
        let now = self.now_ms();
        let zones = zones
            .iter()
            .enumerate()
            .map(|(i, spec)| match carry.get(i).and_then(Option::as_ref) {
                Some(c) if self.zones[c.from].size_bytes == spec.size_bytes => {
                    let zone = self.zones[c.from].clone();
                    if c.old != c.new {
                        zone.rescale(&c.new, &c.old, now);
                    }
                    zone
                }
                Some(c) => {
                    let zone = Zone::new(spec);
                    zone.take_from(&self.zones[c.from], c, now);
                    Arc::new(zone)
                }
                None => Arc::new(Zone::new(spec)),
            })
            .collect();
        MemoryStore {
            zones,
            hasher: self.hasher.clone(),
            clock: self.clock.clone(),
            origin: self.origin,
            origin_ms: self.origin_ms,
        }
    }

    /// Decides `checks` at `now` (ms); see [`Store::decide`].
    pub fn decide_at(&self, checks: &[Check<'_>], now: u64) -> Outcome {
        // Per check decided so far, its key's hash: a key several checks
        // share (a zone and route limits by `ip`) is hashed once.
        let mut hashes: SmallVec<[u64; 4]> = SmallVec::new();
        super::decide_in_groups(checks, |group, decisions| {
            for c in group {
                let seen = checks[..hashes.len()].iter().position(|p| p.key == c.key);
                hashes.push(match seen {
                    Some(i) => hashes[i],
                    None => self.hash(c.key),
                });
            }
            let mine = &hashes[hashes.len() - group.len()..];
            self.decide_group(group, mine, now, decisions)
        })
    }

    /// One group, all or nothing, `hashes` its checks' key hashes; appends
    /// its decisions.
    fn decide_group(
        &self,
        checks: &[Check<'_>],
        hashes: &[u64],
        now: u64,
        decisions: &mut Vec<Decision>,
    ) {
        if let ([check], [hash]) = (checks, hashes) {
            decisions.push(self.decide_one(check, *hash, now));
            return;
        }
        // A request's groups hold a few checks: these live on the stack.
        let targets: SmallVec<[(usize, usize, u64); 4]> = checks
            .iter()
            .zip(hashes)
            .map(|(c, &hash)| (c.limit.zone, self.zones[c.limit.zone].shard_of(hash), hash))
            .collect();
        let mut order: SmallVec<[(usize, usize); 4]> =
            targets.iter().map(|&(z, s, _)| (z, s)).collect();
        order.sort_unstable();
        order.dedup();
        // Always locked in (zone, shard) order: no deadlock between requests.
        let mut guards: SmallVec<[MutexGuard<'_, Shard>; 4]> = order
            .iter()
            .map(|&(z, s)| lock(&self.zones[z].shards[s]))
            .collect();
        let mut slots: SmallVec<[(usize, u32); 4]> = SmallVec::new();
        let first = decisions.len();
        for (check, &(z, s, hash)) in checks.iter().zip(&targets) {
            let g = pos(&order, z, s);
            let shard = &mut guards[g];
            let idx = shard.entry(hash);
            self.zones[z].align(shard, idx, check.limit, now);
            decisions.push(shard.check(&check.limit.algorithm, idx, now, check.cost));
            slots.push((g, idx));
        }
        let all_admitted = decisions[first..].iter().all(Decision::admitted);
        for (check, &(g, idx)) in checks.iter().zip(&slots) {
            let shard = &mut guards[g];
            if all_admitted && !check.peek {
                shard.charge(&check.limit.algorithm, idx, now, check.cost);
            }
        }
        for (check, &(g, _)) in checks.iter().zip(&slots) {
            let numbers = &self.zones[check.limit.zone].numbers;
            guards[g].expire(check.limit.base_algorithm(), now, numbers);
        }
    }

    /// What the next request (cost 1) on `key` under `limit` would be told
    /// at `now`, read without charging the key, creating it or marking it
    /// as recently used; `None` when the key is not tracked or its state
    /// already decides like a fresh key.
    pub fn peek_at(&self, limit: &super::Limit, key: &str, now: u64) -> Option<Decision> {
        let zone = &self.zones[limit.zone];
        let hash = self.hash(key);
        let shard = lock(&zone.shards[zone.shard_of(hash)]);
        let idx = shard.find(hash)?;
        let mut state = shard.slots[idx as usize].state.clone();
        drop(shard);
        if limit.algorithm.is_idle(&state, now) {
            return None;
        }
        Some(limit.algorithm.check(&mut state, now, 1))
    }

    /// Forgets `key` in memory partition `zone`: its next request decides
    /// like a new client's. Whether the key was tracked.
    pub fn reset(&self, zone: usize, key: &str) -> bool {
        let z = &self.zones[zone];
        let hash = self.hash(key);
        let mut shard = lock(&z.shards[z.shard_of(hash)]);
        match shard.find(hash) {
            Some(idx) => {
                shard.remove(idx);
                true
            }
            None => false,
        }
    }

    fn decide_one(&self, check: &Check<'_>, hash: u64, now: u64) -> Decision {
        let zone = &self.zones[check.limit.zone];
        let mut shard = lock(&zone.shards[zone.shard_of(hash)]);
        let idx = shard.entry(hash);
        zone.align(&mut shard, idx, check.limit, now);
        let decision = shard.check(&check.limit.algorithm, idx, now, check.cost);
        if decision.admitted() && !check.peek {
            shard.charge(&check.limit.algorithm, idx, now, check.cost);
        }
        shard.expire(check.limit.base_algorithm(), now, &zone.numbers);
        decision
    }
}

impl Store for MemoryStore {
    fn decide<'a>(
        &'a self,
        checks: &'a [Check<'a>],
    ) -> impl std::future::Future<Output = Result<Outcome, LimiterError>> + Send + 'a {
        std::future::ready(Ok(self.decide_at(checks, self.now_ms())))
    }
}

fn pos(order: &[(usize, usize)], z: usize, s: usize) -> usize {
    order.binary_search(&(z, s)).unwrap_or(0)
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic under this lock leaves at worst one key's state stale.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Zone {
    fn new(spec: &ZoneSpec) -> Self {
        let total = (spec.size_bytes as usize / ENTRY_BYTES).max(16);
        // A hash table holds 7/8 of a power of two without growing: size the
        // shards to that, and use 8 to 16 of them so the whole budget is
        // used within a factor 8/7 and two cores rarely meet. Small zones
        // keep one shard.
        let (shards, per) = if total < 8 * 56 {
            (1, total)
        } else {
            let mut per = 56; // 64 buckets x 7/8
            while per * 2 * 8 <= total {
                per *= 2;
            }
            ((total / per).min(16), per)
        };
        // Sliding logs may spend up to the zone size again on their entries.
        let log_budget = spec.size_bytes as usize / shards;
        Zone {
            shards: (0..shards)
                .map(|_| Mutex::new(Shard::new(per, log_budget)))
                .collect(),
            size_bytes: spec.size_bytes,
            numbers: RwLock::default(),
        }
    }

    /// Rewrites every state written under `old` as `new` reads it.
    fn rescale(&self, new: &Algorithm, old: &Algorithm, now: u64) {
        for shard in self.shards.iter() {
            let mut g = lock(shard);
            for idx in 0..g.slots.len() as u32 {
                // (a plan's state is rescaled from its own numbers when next used)
                if g.slots[idx as usize].tag != FREE && g.variant(idx) == 0 {
                    g.with_state(idx, |s| *s = super::algorithm::rescale(new, old, s, now));
                }
            }
        }
    }

    /// Fills this (new, empty) zone from `old`'s keys, rescaled: keys used
    /// since the clock hand last passed first, then the rest, while there
    /// is room.
    fn take_from(&self, old: &Zone, c: &Carry, now: u64) {
        let mut keys: Vec<(u64, State, u16)> = Vec::new();
        for shard in old.shards.iter() {
            let g = lock(shard);
            keys.extend(
                g.slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.tag != FREE)
                    .map(|(i, s)| match g.variant(i as u32) {
                        0 => (
                            s.tag,
                            super::algorithm::rescale(&c.new, &c.old, &s.state, now),
                            0,
                        ),
                        id => (s.tag, s.state.clone(), id),
                    }),
            );
        }
        *self.numbers.write().unwrap_or_else(|e| e.into_inner()) = read(&old.numbers).clone();
        // Recently used first (the REFERENCED bit is the top one).
        keys.sort_by_key(|(tag, _, _)| std::cmp::Reverse(tag & REFERENCED));
        for (tag, state, variant) in keys {
            let hash = tag & !REFERENCED;
            let mut g = lock(&self.shards[self.shard_of(hash)]);
            if g.map.len() >= g.capacity {
                continue;
            }
            let idx = g.entry(hash);
            g.slots[idx as usize].tag |= tag & REFERENCED;
            g.with_state(idx, |s| *s = state);
            g.set_variant(idx, variant);
        }
    }

    fn shard_of(&self, hash: u64) -> usize {
        // Middle bits: the map uses the low bits for buckets and the top 7
        // as tags, so neither loses entropy within a shard.
        ((hash >> 32) as usize) % self.shards.len()
    }
}

/// Bit 63 of `Slot::tag`: used since the clock hand last passed.
const REFERENCED: u64 = 1 << 63;
/// `Slot::tag` of a free slot (key hashes never have all 63 bits set).
const FREE: u64 = REFERENCED - 1;

impl Shard {
    fn new(capacity: usize, log_budget: usize) -> Self {
        Shard {
            map: HashTable::with_capacity(capacity),
            slots: Vec::with_capacity(capacity),
            free: Vec::new(),
            hand: 0,
            variants: Vec::new(),
            capacity,
            log_bytes: 0,
            log_budget,
            evictions: 0,
            expirations: 0,
        }
    }

    /// The slot for `key` (63 bits), marked as recently used; created if
    /// new, evicting a key the clock hand finds unused since its last pass.
    fn entry(&mut self, key: u64) -> u32 {
        if let Some(idx) = self.find(key) {
            self.slots[idx as usize].tag |= REFERENCED;
            return idx;
        }
        let idx = if let Some(i) = self.free.pop() {
            i
        } else if self.slots.len() < self.capacity {
            self.slots.push(Slot {
                tag: FREE,
                state: State::Empty,
            });
            (self.slots.len() - 1) as u32
        } else {
            let victim = self.sweep(u32::MAX);
            self.remove(victim);
            self.evictions += 1;
            self.free.pop().unwrap_or(victim)
        };
        // New keys start unmarked: one that is never seen again is the first
        // to go, and a flood of new keys cannot push out a busy one.
        self.slots[idx as usize] = Slot {
            tag: key,
            state: State::Empty,
        };
        let slots = &self.slots;
        self.map
            .insert_unique(key, idx, |&i| slots[i as usize].tag & !REFERENCED);
        idx
    }

    /// The slot holding `key` (63 bits), if tracked; marks nothing.
    fn find(&self, key: u64) -> Option<u32> {
        let slots = &self.slots;
        self.map
            .find(key, |&i| slots[i as usize].tag & !REFERENCED == key)
            .copied()
    }

    /// Advances the clock hand to an occupied slot not used since the hand
    /// last passed (clearing use marks on the way), skipping `keep`.
    fn sweep(&mut self, keep: u32) -> u32 {
        let n = self.slots.len() as u32;
        loop {
            let i = self.hand % n;
            self.hand = (i + 1) % n;
            let tag = self.slots[i as usize].tag;
            if tag == FREE || i == keep {
                continue;
            }
            if tag & REFERENCED != 0 {
                self.slots[i as usize].tag &= !REFERENCED;
                continue;
            }
            return i;
        }
    }

    /// Runs `f` on a slot's state, keeping the log byte count exact.
    fn with_state<R>(&mut self, idx: u32, f: impl FnOnce(&mut State) -> R) -> R {
        let state = &mut self.slots[idx as usize].state;
        let before = log_heap(state);
        let r = f(state);
        let after = log_heap(state);
        self.log_bytes = (self.log_bytes + after).saturating_sub(before);
        r
    }

    fn check(&mut self, algorithm: &Algorithm, idx: u32, now: u64, cost: u64) -> Decision {
        self.with_state(idx, |s| algorithm.check(s, now, cost))
    }

    fn charge(&mut self, algorithm: &Algorithm, idx: u32, now: u64, cost: u64) {
        self.with_state(idx, |s| algorithm.charge(s, now, cost));
        // Logs over budget: forget cold keys (never the one just used).
        while self.log_bytes > self.log_budget && self.map.len() > 1 {
            let victim = self.sweep(idx);
            self.remove(victim);
            self.evictions += 1;
        }
    }

    /// Looks at the next two slots under the clock hand and forgets those
    /// whose state decides like a fresh key.
    fn expire(&mut self, algorithm: &Algorithm, now: u64, numbers: &RwLock<Numbers>) {
        let n = self.slots.len() as u32;
        for _ in 0..EXPIRE_PER_DECISION.min(n as usize) {
            let i = self.hand % n;
            self.hand = (i + 1) % n;
            let slot = &self.slots[i as usize];
            if slot.tag == FREE {
                continue;
            }
            let idle = match self.variants.get(i as usize).copied().unwrap_or(0) {
                0 => algorithm.is_idle(&slot.state, now),
                id => read(numbers)
                    .of(id)
                    .is_none_or(|own| own.is_idle(&slot.state, now)),
            };
            if idle {
                self.remove(i);
                self.expirations += 1;
            }
        }
    }

    fn remove(&mut self, idx: u32) {
        let slot = &mut self.slots[idx as usize];
        self.log_bytes = self.log_bytes.saturating_sub(log_heap(&slot.state));
        let key = slot.tag & !REFERENCED;
        slot.state = State::Empty;
        slot.tag = FREE;
        if let Some(v) = self.variants.get_mut(idx as usize) {
            *v = 0;
        }
        if let Ok(entry) = self.map.find_entry(key, |&i| i == idx) {
            entry.remove();
        }
        self.free.push(idx);
    }
}

fn log_heap(state: &State) -> usize {
    match state {
        State::Log(log) => log.heap_bytes() + std::mem::size_of::<super::algorithm::Log>(),
        _ => 0,
    }
}

mod numbers;
#[cfg(test)]
mod tests;
