//! The penalty box: a key its limit refused `after` times within `within`
//! is banned for the first of `bans`; each ban after that, while the key
//! has not been forgiven, is the next one (capped at the last). Good
//! behaviour decays the level: one step back for every `forgive` since the
//! last ban ended.
//!
//! [`strike`] is the rule, a pure function of (record, now), which
//! `redis/penalty.lua` follows step for step. [`PenaltyBox`] is this
//! process's table: on the memory store the records themselves; on Redis
//! a copy of the bans in force (every replica's, kept by a subscription),
//! so a boxed key is refused without a store call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Records kept at most (a flood of distinct keys forgets the oldest
/// strikes first, never a ban in force).
const MAX_RECORDS: usize = 100_000;

type Records = HashMap<Arc<str>, HashMap<String, Record>>;

/// When a key goes to the box and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// Refusals within `within_ms` that start a ban.
    pub after: u32,
    pub within_ms: u64,
    /// Ban lengths, one per repeat, the last repeated.
    pub bans_ms: Arc<[u64]>,
    /// Good behaviour that takes a level off.
    pub forgive_ms: u64,
}

/// A key's strikes and bans.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Record {
    pub strikes: u32,
    /// When the strikes counted began.
    pub since: u64,
    /// Bans served (after decay).
    pub level: u32,
    /// The end of the last ban (Unix ms; 0: none).
    pub until: u64,
}

/// A ban in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ban {
    /// Unix ms it ends at.
    pub until: u64,
    /// Which ban of the key's this is (1: its first).
    pub level: u32,
}

impl Rules {
    fn ban_ms(&self, level: u32) -> u64 {
        let i = (level as usize).min(self.bans_ms.len().saturating_sub(1));
        self.bans_ms.get(i).copied().unwrap_or(60_000)
    }

    /// How long a record must be kept to decide like this one.
    pub fn keep_ms(&self, r: &Record, now: u64) -> u64 {
        let strikes = (r.since + self.within_ms).saturating_sub(now);
        let bans =
            (r.until + self.forgive_ms.saturating_mul(u64::from(r.level))).saturating_sub(now);
        strikes.max(bans).max(1)
    }
}

/// Records a refusal of the key at `now`: the ban it starts, if any (or
/// the one in force).
pub fn strike(r: &mut Record, rules: &Rules, now: u64) -> Option<Ban> {
    if r.until > now {
        return Some(Ban {
            until: r.until,
            level: r.level,
        });
    }
    if r.strikes == 0 || now.saturating_sub(r.since) >= rules.within_ms {
        r.strikes = 0;
        r.since = now;
    }
    r.strikes += 1;
    if r.strikes < rules.after {
        return None;
    }
    if r.until > 0 && rules.forgive_ms > 0 {
        let good = (now - r.until) / rules.forgive_ms;
        r.level = r
            .level
            .saturating_sub(u32::try_from(good).unwrap_or(u32::MAX));
    }
    r.until = now + rules.ban_ms(r.level);
    r.level += 1;
    r.strikes = 0;
    Some(Ban {
        until: r.until,
        level: r.level,
    })
}

/// This process's records (memory store) or copy of the bans (Redis), by
/// (limit name, key). Kept across reloads.
#[derive(Debug, Default)]
pub struct PenaltyBox {
    /// Per limit name, per key (read by every request once any ban was
    /// put: a read lock).
    records: RwLock<Records>,
    /// Whether a ban was ever put in the table: until then
    /// [`PenaltyBox::banned`] answers without the lock.
    ever: AtomicBool,
    /// A subscription keeps this a copy of Redis's bans (started once).
    pub watching: AtomicBool,
    /// Per limit name: bans this process started, requests refused by a ban.
    counts: Mutex<HashMap<Arc<str>, [u64; 2]>>,
}

impl PenaltyBox {
    fn lock(&self) -> std::sync::RwLockWriteGuard<'_, Records> {
        self.records.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Records> {
        self.records.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether any ban was ever put in the table (else nothing is boxed).
    pub fn any(&self) -> bool {
        self.ever.load(Ordering::Relaxed)
    }

    /// The ban `key` serves under limit `name` at `now` (a request it
    /// refuses, counted).
    pub fn banned(&self, name: &Arc<str>, key: &str, now: u64) -> Option<Ban> {
        if !self.any() {
            return None;
        }
        let r = *self.read().get(&**name)?.get(key)?;
        if r.until <= now {
            return None;
        }
        self.count(name, 1);
        Some(Ban {
            until: r.until,
            level: r.level,
        })
    }

    /// Counts a ban started by this process (`what` 0) or a request
    /// refused by one (1).
    pub fn count(&self, name: &Arc<str>, what: usize) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        match counts.get_mut(&**name) {
            Some(c) => c[what] += 1,
            None => {
                let mut c = [0; 2];
                c[what] = 1;
                counts.insert(name.clone(), c);
            }
        }
    }

    /// Per limit name: bans started here, requests refused, bans in force.
    pub fn counts(&self, now: u64) -> Vec<(Arc<str>, [u64; 3])> {
        let mut out: Vec<(Arc<str>, [u64; 3])> = self
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(n, c)| (n.clone(), [c[0], c[1], 0]))
            .collect();
        for (name, _, _) in self.list(now) {
            match out.iter_mut().find(|(n, _)| *n == name) {
                Some((_, c)) => c[2] += 1,
                None => out.push((name, [0, 0, 1])),
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// [`strike`] on this process's record of the key: the ban in force
    /// after it, and whether this strike started it (counted).
    pub fn strike(
        &self,
        name: &Arc<str>,
        key: &str,
        rules: &Rules,
        now: u64,
    ) -> Option<(Ban, bool)> {
        let mut all = self.lock();
        let map = all.entry(name.clone()).or_default();
        if map.len() >= MAX_RECORDS {
            map.retain(|_, r| rules.keep_ms(r, now) > 1 || r.until > now);
            if map.len() >= MAX_RECORDS {
                map.retain(|_, r| r.until > now);
            }
        }
        let r = map.entry(key.to_owned()).or_default();
        let was = r.until;
        let ban = strike(r, rules, now)?;
        let started = r.until != was;
        drop(all);
        if started {
            self.ever.store(true, Ordering::Relaxed);
            self.count(name, 0);
        }
        Some((ban, started))
    }

    /// Puts a ban another replica started (or Redis holds) in the table
    /// (ended ones are dropped first when the table is full).
    pub fn put(&self, name: &str, key: &str, ban: Ban, now: u64) {
        let mut all = self.lock();
        let map = match all.get_mut(name) {
            Some(m) => m,
            None => all.entry(Arc::from(name)).or_default(),
        };
        if map.len() >= MAX_RECORDS {
            map.retain(|_, r| r.until > now);
        }
        let r = map.entry(key.to_owned()).or_default();
        if ban.until > r.until {
            r.until = ban.until;
            r.level = r.level.max(ban.level);
            r.strikes = 0;
            self.ever.store(true, Ordering::Relaxed);
        }
    }

    /// Lifts the key's ban (and forgets its strikes). Whether it was boxed.
    pub fn lift(&self, name: &str, key: &str, now: u64) -> bool {
        match self.lock().get_mut(name).and_then(|m| m.remove(key)) {
            Some(r) => r.until > now,
            None => false,
        }
    }

    /// The bans in force at `now`: (limit, key, ban), soonest end first.
    pub fn list(&self, now: u64) -> Vec<(Arc<str>, String, Ban)> {
        let all = self.read();
        let mut out: Vec<_> = all
            .iter()
            .flat_map(|(n, m)| m.iter().map(move |(k, r)| (n, k, r)))
            .filter(|(_, _, r)| r.until > now)
            .map(|(n, k, r)| {
                (
                    n.clone(),
                    k.clone(),
                    Ban {
                        until: r.until,
                        level: r.level,
                    },
                )
            })
            .collect();
        out.sort_by_key(|(n, k, b)| (b.until, n.clone(), k.clone()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules {
            after: 3,
            within_ms: 60_000,
            bans_ms: Arc::from([60_000, 600_000, 3_600_000]),
            forgive_ms: 86_400_000,
        }
    }

    #[test]
    fn bans_grow_with_each_repeat_and_cap_at_the_last() {
        let (rules, mut r) = (rules(), Record::default());
        let mut now = 1_000_000;
        let mut lengths = Vec::new();
        for _ in 0..4 {
            assert_eq!(strike(&mut r, &rules, now), None);
            assert_eq!(strike(&mut r, &rules, now + 1), None);
            let ban = strike(&mut r, &rules, now + 2).expect("the third refusal boxes");
            lengths.push(ban.until - (now + 2));
            now = ban.until + 1;
        }
        assert_eq!(lengths, [60_000, 600_000, 3_600_000, 3_600_000]);
        assert_eq!(r.level, 4);
    }

    #[test]
    fn strikes_outside_the_window_start_again() {
        let (rules, mut r) = (rules(), Record::default());
        assert_eq!(strike(&mut r, &rules, 0), None);
        assert_eq!(strike(&mut r, &rules, 30_000), None);
        assert_eq!(
            strike(&mut r, &rules, 60_000),
            None,
            "the first strike left the window"
        );
        assert_eq!(strike(&mut r, &rules, 61_000), None);
        assert!(strike(&mut r, &rules, 62_000).is_some());
    }

    #[test]
    fn good_behaviour_takes_a_level_off_per_forgive_period() {
        let (rules, mut r) = (rules(), Record::default());
        let ban = |r: &mut Record, at: u64| {
            strike(r, &rules, at);
            strike(r, &rules, at);
            strike(r, &rules, at).unwrap()
        };
        let b1 = ban(&mut r, 0);
        let b2 = ban(&mut r, b1.until);
        assert_eq!(b2.until - b1.until, 600_000);
        // two days after the second ban ended: two levels forgiven
        let b3 = ban(&mut r, b2.until + 2 * 86_400_000);
        assert_eq!(
            (b3.level, b3.until - (b2.until + 2 * 86_400_000)),
            (1, 60_000)
        );
    }

    #[test]
    fn the_table_lists_lifts_and_takes_other_replicas_bans() {
        let (rules, table) = (rules(), PenaltyBox::default());
        let login: Arc<str> = Arc::from("login");
        assert_eq!(table.banned(&login, "ip:192.0.2.1", 0), None);
        for t in 0..3 {
            table.strike(&login, "ip:192.0.2.1", &rules, t);
        }
        assert_eq!(
            table.banned(&login, "ip:192.0.2.1", 10).map(|b| b.until),
            Some(60_002)
        );
        assert_eq!(table.banned(&login, "ip:192.0.2.1", 60_002), None, "served");
        table.put(
            "login",
            "ip:192.0.2.9",
            Ban {
                until: 500,
                level: 2,
            },
            100,
        );
        let listed: Vec<_> = table.list(100).into_iter().map(|(_, k, _)| k).collect();
        assert_eq!(listed, ["ip:192.0.2.9", "ip:192.0.2.1"]);
        assert!(table.lift("login", "ip:192.0.2.1", 100));
        assert!(!table.lift("login", "ip:192.0.2.1", 100));
        assert_eq!(table.banned(&login, "ip:192.0.2.1", 100), None);
        assert_eq!(table.counts(100), [(login.clone(), [1, 1, 1])]);
    }
}
