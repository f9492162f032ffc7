//! Leases for hot keys (`lease:` on a route limit): a replica that sees a
//! key often takes a slice of the key's budget from Redis in one ordinary
//! decision (its cost the slice's size, all or nothing, on Redis time) and
//! spends it here, request by request, with no round trip; what is left
//! when the slice ends is given back (`refund.lua`).
//!
//! - **Never past the limit**: every unit is charged in Redis before it is
//!   spent, so the replicas together admit at most the limit. A slice never
//!   outlives the window it was charged in (a fixed or sliding window, a
//!   quota's period), so a unit is spent in the window that counted it.
//!   The price is early refusal: units held unspent by other replicas,
//!   at most replicas x `slice`, until they are spent or given back
//!   (within `hold`). Leases are refused in config for buckets and logs,
//!   where a slice spent later than it was taken could pass the limit.
//! - **Adaptive**: a key this replica saw fewer than [`HOT`] times in the
//!   last `hold` is decided in Redis request by request, exactly as without
//!   a lease (with the other checks, in the usual batches). A hot key's
//!   slice is what this replica spent of it in the last `hold`, at most
//!   `slice`: a slice lasts about one `hold` at the key's rate.
//! - **One refill at a time** per key and replica: requests that find the
//!   slice spent wait for the refill in flight. A refill Redis refuses is
//!   remembered until the key's retry time or `hold`, whichever is first,
//!   so an exhausted key costs one call per replica per `hold`.
//! - Groups stay all or nothing: a leased check refused here sends the
//!   rest of its group to Redis as peeks (never charged); a group Redis
//!   refused, or one the request never reached, gives its units back to
//!   their slices. Peeks and dry runs never take from a slice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use super::super::{groups, stops, Algorithm, Check, Decision, Lease, Limit, Verdict};
use super::{LimiterError, Outcome, RedisStore};

/// Requests a key must have had on this replica within the last `hold`
/// for its next one to take a slice.
pub const HOT: u64 = 4;
/// Keys tracked at most (about 250 bytes each); past it, new keys are
/// decided request by request until quiet ones are forgotten.
const MAX_KEYS: usize = 20_000;

type Entry = Arc<tokio::sync::Mutex<Slice>>;

/// This replica's slices, per limit (zone index) and key.
#[derive(Default)]
pub struct Leases {
    table: Mutex<HashMap<usize, HashMap<Box<str>, Entry>>>,
    /// Units taken from Redis, given back, and decisions made from a slice.
    pub taken: AtomicU64,
    pub returned: AtomicU64,
    pub spent: AtomicU64,
}

/// One key's slice, and what this replica saw of the key.
#[derive(Default)]
struct Slice {
    /// Requests in the current `hold` period (from `since`) and the last.
    since: u64,
    seen: u64,
    last: u64,
    /// Units left to spend, until `until` (local ms).
    left: u64,
    until: u64,
    /// Redis's clock when the units were charged (a give back names it).
    stamp: u64,
    /// The key's budget left in Redis after the slice was taken, and the
    /// end of its window (local ms).
    remaining: u64,
    window_end: u64,
    /// The decision the slice was taken with: its limit and window.
    taken: Option<Decision>,
    /// The lease's `hold` (ms), as last seen.
    hold: u64,
    /// Refills so far: a unit given back to a slice taken since is lost
    /// (it was charged in the earlier one's window).
    generation: u64,
    /// The limit and numbers the units were taken under.
    limit: Option<Limit>,
    /// A refill Redis refused: refused here until then (local ms).
    refused_until: u64,
    refused_at: u64,
    refused: Option<Decision>,
}

impl Slice {
    /// Counts one request at `now`; the slice this key has earned: what
    /// this replica saw of it in the last `hold` (0 while cold).
    fn observe(&mut self, now: u64, lease: Lease) -> u64 {
        self.hold = lease.hold_ms;
        if self.since == 0 {
            self.since = now;
        }
        if now >= self.since + lease.hold_ms {
            let periods = (now - self.since) / lease.hold_ms;
            self.last = if periods == 1 { self.seen } else { 0 };
            self.since += periods * lease.hold_ms;
            self.seen = 0;
        }
        self.seen += 1;
        let rate = self.last.max(self.seen);
        if rate < HOT {
            0
        } else {
            rate.min(lease.slice)
        }
    }

    fn same_numbers(&self, limit: &Limit) -> bool {
        self.limit
            .as_ref()
            .is_some_and(|l| l.algorithm == limit.algorithm)
    }

    /// A decision for a unit spent from the slice at `now`.
    fn spent(&self, now: u64, taken: Decision) -> Decision {
        Decision {
            verdict: Verdict::Allow,
            remaining: self.remaining + self.left,
            reset_ms: self.window_end.saturating_sub(now),
            retry_after_ms: 0,
            ..taken
        }
    }

    /// The refusal kept from the last refill, as of `now`.
    fn refusal(&self, now: u64) -> Option<Decision> {
        let d = self.refused?;
        let gone = now.saturating_sub(self.refused_at);
        (now < self.refused_until).then(|| Decision {
            retry_after_ms: d.retry_after_ms.saturating_sub(gone).max(1),
            reset_ms: d.reset_ms.saturating_sub(gone),
            ..d
        })
    }
}

/// A unit spent from a slice, to give back if the request does not use
/// it.
struct Spent {
    entry: Entry,
    cost: u64,
    generation: u64,
}

impl Leases {
    /// The key's slice, made when first seen (`None` once the table is
    /// full).
    fn entry(&self, zone: usize, key: &str) -> Option<Entry> {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = table.get(&zone).and_then(|keys| keys.get(key)) {
            return Some(e.clone());
        }
        // (counted only for a key not seen yet)
        if table.values().map(HashMap::len).sum::<usize>() >= MAX_KEYS {
            return None;
        }
        let e = Entry::default();
        table.entry(zone).or_default().insert(key.into(), e.clone());
        Some(e)
    }

    /// `[taken, returned, spent]` so far.
    pub fn units(&self) -> [u64; 3] {
        [&self.taken, &self.returned, &self.spent].map(|n| n.load(Ordering::Relaxed))
    }
}

/// A check decided here: its decision, and the unit spent from a slice
/// (to give back if the request does not use it).
type Here = Option<(Decision, Option<Spent>)>;

/// The lease of check `i`, when it may take from a slice: its limit has
/// one and it charges (no peek, no dry run).
fn lease_of(checks: &[Check<'_>], i: usize) -> Option<Lease> {
    let c = &checks[i];
    let lease = c.limit.lease?;
    (!c.peek && !c.dry_run).then_some(lease)
}

/// Whether any of `checks` may take from a slice.
pub fn leased(checks: &[Check<'_>]) -> bool {
    (0..checks.len()).any(|i| lease_of(checks, i).is_some())
}

impl RedisStore {
    /// Decides `checks`, the leased ones from their slices (see the module
    /// docs), the others in Redis as usual; one outcome, as if Redis had
    /// decided them all. A group is all or nothing as ever: a leased check
    /// refused here sends the rest of its group as peeks (never charged)
    /// and nothing after it; a group Redis refused gives its leased units
    /// back to their slices.
    pub(super) async fn decide_leased(
        &self,
        checks: &[Check<'_>],
        now: u64,
    ) -> Result<Outcome, LimiterError> {
        let local = self.clock.unix_ms();
        let mut here: SmallVec<[Here; 4]> = SmallVec::new();
        // The group a slice refused: its checks up to `end` are decided.
        let mut refused: Option<(usize, usize)> = None;
        let mut start = 0;
        for group in groups(checks) {
            let end = start + group.len();
            for i in start..end {
                let decided = match lease_of(checks, i) {
                    Some(lease) => match self.slice_decision(&checks[i], lease, local, now).await {
                        Ok(d) => d,
                        Err(e) => {
                            self.give_back_spent(&mut here);
                            return Err(e);
                        }
                    },
                    None => None,
                };
                here.push(decided);
            }
            if here[start..end]
                .iter()
                .any(|h| h.as_ref().is_some_and(|(d, _)| !d.admitted()))
            {
                refused = Some((start, end));
                break;
            }
            start = end;
        }
        let end = refused.map_or(checks.len(), |(_, e)| e);
        let sent: Vec<Check<'_>> = (0..end)
            .filter(|&i| here[i].is_none())
            .map(|i| Check {
                peek: checks[i].peek || refused.is_some_and(|(a, _)| i >= a),
                ..checks[i]
            })
            .collect();
        let mut degraded = false;
        let mut from_redis = if sent.is_empty() {
            Vec::new()
        } else {
            match self.decide_direct(&sent, now).await {
                Ok(o) => {
                    degraded = o.degraded;
                    o.decisions
                }
                Err(e) => {
                    self.give_back_spent(&mut here);
                    return Err(e);
                }
            }
        }
        .into_iter();
        let mut decisions = Vec::with_capacity(end);
        'groups: for group in groups(&checks[..end]) {
            let start = decisions.len();
            for i in start..start + group.len() {
                match &here[i] {
                    Some((d, _)) => decisions.push(*d),
                    None => match from_redis.next() {
                        Some(d) => decisions.push(d),
                        // Redis stopped at an earlier group.
                        None => {
                            decisions.truncate(start);
                            break 'groups;
                        }
                    },
                }
            }
            if !decisions[start..].iter().all(Decision::admitted) {
                // Not admitted as a whole: its leased units go back.
                self.give_back_spent(&mut here[start..start + group.len()]);
            }
            if stops(group, &decisions[start..]) {
                break;
            }
        }
        // Units spent for checks the outcome does not reach go back too.
        let reached = decisions.len().min(here.len());
        self.give_back_spent(&mut here[reached..]);
        Ok(Outcome {
            decisions,
            degraded,
        })
    }

    /// Check `c` decided from its key's slice: admitted from the slice
    /// (refilled first when spent or ended), refused as a refill was, or
    /// `None` for a cold key (decided in Redis with the others).
    async fn slice_decision(
        &self,
        c: &Check<'_>,
        lease: Lease,
        local: u64,
        now: u64,
    ) -> Result<Option<(Decision, Option<Spent>)>, LimiterError> {
        let Some(entry) = self.leases.entry(c.limit.zone, c.key) else {
            return Ok(None);
        };
        let mut s = entry.clone().lock_owned().await;
        let want = s.observe(local, lease);
        let same = s.same_numbers(c.limit);
        if same {
            if let Some(refused) = s.refusal(local) {
                return Ok(Some((refused, None)));
            }
            if let Some(taken) = s.taken.filter(|_| s.left >= c.cost && local < s.until) {
                s.left -= c.cost;
                self.leases.spent.fetch_add(1, Ordering::Relaxed);
                let d = s.spent(local, taken);
                let generation = s.generation;
                drop(s);
                let spent = Spent {
                    entry,
                    cost: c.cost,
                    generation,
                };
                return Ok(Some((d, Some(spent))));
            }
        }
        self.give_back(c.key, &mut s);
        if want <= c.cost {
            return Ok(None);
        }
        // Take `want`; near the budget's end, what is left of it.
        let (stamp, d) = self.take(c, want, now).await?;
        let (stamp, d, got) = if d.admitted() {
            (stamp, d, want)
        } else if d.remaining >= c.cost {
            let got = d.remaining.min(want);
            let (stamp, d) = self.take(c, got, now).await?;
            (stamp, d, if d.admitted() { got } else { 0 })
        } else {
            (stamp, d, 0)
        };
        s.limit = Some(c.limit.clone());
        if got == 0 {
            s.refused = Some(d);
            s.refused_at = local;
            s.refused_until = local + d.retry_after_ms.min(lease.hold_ms);
            return Ok(Some((d, None)));
        }
        self.leases.taken.fetch_add(got, Ordering::Relaxed);
        self.leases.spent.fetch_add(1, Ordering::Relaxed);
        let span = window_left(&c.limit.algorithm, stamp, d.reset_ms);
        s.refused = None;
        s.left = got - c.cost;
        s.stamp = stamp;
        s.remaining = d.remaining;
        s.window_end = local + span;
        s.until = local + span.min(lease.hold_ms);
        s.taken = Some(d);
        s.generation += 1;
        let decided = s.spent(local, d);
        let generation = s.generation;
        drop(s);
        Ok(Some((
            decided,
            Some(Spent {
                entry,
                cost: c.cost,
                generation,
            }),
        )))
    }

    /// One decision of `c` at cost `units`, in a call of its own.
    async fn take(
        &self,
        c: &Check<'_>,
        units: u64,
        now: u64,
    ) -> Result<(u64, Decision), LimiterError> {
        let check = Check { cost: units, ..*c };
        let (stamp, decided) = self.call(&[check], now).await?;
        let d = decided
            .first()
            .copied()
            .ok_or_else(|| LimiterError::Unavailable("no decision for a lease".into()))?;
        Ok((stamp, d))
    }

    /// Gives what is left of `s` back to Redis (if its window has not
    /// ended: the script checks by the clock the units were charged at).
    fn give_back(&self, key: &str, s: &mut Slice) {
        if s.left > 0 {
            if let Some(limit) = &s.limit {
                self.leases.returned.fetch_add(s.left, Ordering::Relaxed);
                self.spawn_refund(&[Check::new(limit, key, s.left)], s.stamp);
            }
        }
        s.left = 0;
    }

    /// Puts units spent for unused checks back in their slices.
    fn give_back_spent(&self, spent: &mut [Here]) {
        for taken in spent.iter_mut().filter_map(|h| h.as_mut()?.1.take()) {
            let (cost, generation) = (taken.cost, taken.generation);
            let back = move |s: &mut Slice| {
                if s.generation == generation {
                    s.left += cost;
                }
            };
            // Usually free at once; else a moment later.
            let now = taken.entry.try_lock().map(|mut s| back(&mut s));
            if now.is_err() {
                let entry = taken.entry.clone();
                tokio::spawn(async move { back(&mut *entry.lock().await) });
            }
            self.leases.spent.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Every `every`: gives back slices that ended with units left, and
    /// forgets keys quiet for ten of their `hold`s. Runs until the store
    /// and every reload of it are gone, or a reload replaced its table.
    pub(super) fn sweep_leases(&self, every: std::time::Duration) {
        let (mut store, alive) = self.handle();
        store.leases = self.leases.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if alive.strong_count() == 0 || Arc::strong_count(&store.leases) == 1 {
                    store.sweep(true);
                    return;
                }
                store.sweep(false);
            }
        });
    }

    /// Gives back ended slices (every slice when `all`: the table is being
    /// dropped).
    fn sweep(&self, all: bool) {
        let now = self.clock.unix_ms();
        let mut table = self.leases.table.lock().unwrap_or_else(|e| e.into_inner());
        for keys in table.values_mut() {
            keys.retain(|key, entry| {
                let Ok(mut s) = entry.try_lock() else {
                    return true;
                };
                if all || now >= s.until {
                    self.give_back(key, &mut s);
                }
                !all && now < s.since + 10 * s.hold
            });
        }
    }
}

/// How long the window that charged a slice at Redis time `stamp` still
/// runs: a fixed or sliding window's aligned end, a quota's period end.
fn window_left(algorithm: &Algorithm, stamp: u64, reset_ms: u64) -> u64 {
    match *algorithm {
        Algorithm::FixedWindow { window_ms, .. } | Algorithm::SlidingWindow { window_ms, .. } => {
            window_ms - stamp % window_ms
        }
        _ => reset_ms,
    }
}
