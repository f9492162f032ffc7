//! Which target a request goes to, by nginx's methods and in nginx's
//! order (`ngx_http_upstream_round_robin.c` and the `least_conn`,
//! `random`, `hash` and `ip_hash` modules):
//!
//! - round robin: smooth weighted: each pick adds every usable target's
//!   weight to its current weight, takes the highest (the first of
//!   equals) and takes the round's total off it: weights 5:1:1 give
//!   a a b a c a a, spread rather than bunched;
//! - `least_conn`: the fewest requests in flight for its weight, ties
//!   broken by the round robin among the tied;
//! - `random`: drawn by weight; `random two`: two drawn, the one with
//!   fewer in flight for its weight taken;
//! - `hash`: CRC32 of the key picks by weight, rehashed (with the try
//!   number in front) past an unusable target; `consistent`: a ketama
//!   ring of 160 points per unit of weight, each target's points the
//!   CRC32 of its `host\0port` and the point before;
//! - `ip_hash`: the client address (an IPv4 one's first three octets, an
//!   IPv6 one whole) folded as nginx does;
//! - `ewma` (beyond nginx): two drawn, the one with the lower score taken,
//!   the score (`target::Ewma`) read through `load`.
//!
//! The keyed and random methods fall back to the round robin after 20
//! unusable draws, as nginx does. Backup targets are a round of their own
//! (round robin and `least_conn` only), picked from only when no primary
//! is usable; a target marked `down` is never picked.
//!
//! One state per upstream, shared by every worker of the process (a
//! short lock per pick); an upstream of one target keeps none.

use std::net::IpAddr;
use std::sync::Mutex;

use crate::config::{Balance, Target};

pub struct Balancer {
    method: Method,
    /// Per target, from its config.
    weights: Box<[i64]>,
    backup: Box<[bool]>,
    down: Box<[bool]>,
    /// The primary targets' weights summed (those `down` included, as
    /// nginx's `total_weight`).
    total: u64,
    /// Smooth round robin's current weights, per target.
    current: Mutex<Box<[i64]>>,
}

enum Method {
    RoundRobin,
    LeastConn,
    Random { two: bool },
    Ewma,
    Hash,
    Consistent(Ring),
    IpHash,
}

/// A ketama ring: points sorted by hash, each naming the first target
/// with that server name (targets resolved from one name share it).
struct Ring {
    points: Box<[(u32, usize)]>,
    /// Per target, the index of the first target with its name.
    name_of: Box<[usize]>,
}

/// What a keyed method picks by, worked out once per request.
#[derive(Debug, Default)]
pub enum BalanceKey {
    #[default]
    None,
    Bytes(Vec<u8>),
    Ip(IpAddr),
}

/// One request's way through the balancer: a keyed method goes on from
/// where its last draw left off when the request is retried.
#[derive(Default)]
pub struct Pick {
    key: BalanceKey,
    hash: u64,
    rehash: u32,
    tries: u32,
    started: bool,
}

impl Pick {
    pub fn new(key: BalanceKey) -> Self {
        Pick {
            key,
            ..Pick::default()
        }
    }
}

const MAX_DRAWS: u32 = 20;

/// A target's whole weight, in thousandths.
pub const FULL: i64 = 1000;

impl Balancer {
    pub fn new(targets: &[Target], balance: &Balance) -> Self {
        let weights: Box<[i64]> = targets.iter().map(|t| i64::from(t.weight)).collect();
        let backup: Box<[bool]> = targets.iter().map(|t| t.backup).collect();
        let total = targets
            .iter()
            .filter(|t| !t.backup)
            .map(|t| u64::from(t.weight))
            .sum();
        let method = match balance {
            Balance::RoundRobin => Method::RoundRobin,
            Balance::LeastConn => Method::LeastConn,
            Balance::Random { two } => Method::Random { two: *two },
            Balance::Hash {
                consistent: false, ..
            } => Method::Hash,
            Balance::Hash {
                consistent: true, ..
            } => Method::Consistent(Ring::new(targets)),
            Balance::IpHash => Method::IpHash,
            Balance::Ewma => Method::Ewma,
        };
        Balancer {
            method,
            weights,
            backup,
            down: targets.iter().map(|t| t.down).collect(),
            total,
            current: Mutex::new(vec![0; targets.len()].into()),
        }
    }

    /// The next target among those `usable` says may take the request
    /// (not tried yet, not marked down, under its `max_conns`...): a
    /// primary if any is, else a backup; `None` when none is. `load` reads
    /// a target's requests in flight (for `least_conn`, `random two`; its
    /// EWMA score for `ewma`).
    #[cfg(test)]
    pub fn pick(
        &self,
        p: &mut Pick,
        usable: impl Fn(usize) -> bool,
        load: impl Fn(usize) -> u32,
    ) -> Option<usize> {
        self.pick_scaled(p, usable, load, &|_| FULL)
    }

    /// `pick`, with each target's weight scaled by `scale` (per mille,
    /// [`FULL`] for the whole weight: a target in its slow start takes
    /// less of the round robin's and `least_conn`'s share).
    pub fn pick_scaled(
        &self,
        p: &mut Pick,
        usable: impl Fn(usize) -> bool,
        load: impl Fn(usize) -> u32,
        scale: &dyn Fn(usize) -> i64,
    ) -> Option<usize> {
        let usable = |i: usize| !self.down[i] && usable(i);
        if self.weights.len() == 1 {
            return usable(0).then_some(0);
        }
        let drawn = match &self.method {
            Method::RoundRobin => None,
            Method::LeastConn => {
                let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
                return self
                    .least(&mut current, false, &usable, &load, scale)
                    .or_else(|| self.least(&mut current, true, &usable, &load, scale));
            }
            Method::Random { two } => self.random(p, *two, &usable, &load),
            // `load` is the EWMA score here (latency times in flight).
            Method::Ewma => self.random(p, true, &usable, &load),
            Method::Hash => self.hash(p, &usable),
            Method::Consistent(ring) => return self.consistent(p, ring, &usable, scale),
            Method::IpHash => self.ip_hash(p, &usable),
        };
        drawn.or_else(|| self.round_robin(&usable, scale))
    }

    fn round_robin(
        &self,
        usable: &impl Fn(usize) -> bool,
        scale: &dyn Fn(usize) -> i64,
    ) -> Option<usize> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        self.round(&mut current, false, usable, scale)
            .or_else(|| self.round(&mut current, true, usable, scale))
    }

    /// One pick of the smooth round robin; weights are counted in
    /// thousandths (`scale`), which picks the same as the weights alone
    /// while every target has its whole weight.
    fn round(
        &self,
        current: &mut [i64],
        backup: bool,
        usable: &impl Fn(usize) -> bool,
        scale: &dyn Fn(usize) -> i64,
    ) -> Option<usize> {
        let mut total = 0;
        let mut best: Option<usize> = None;
        for i in 0..self.weights.len() {
            if self.backup[i] != backup || !usable(i) {
                continue;
            }
            let weight = self.weights[i] * scale(i);
            current[i] += weight;
            total += weight;
            if best.is_none_or(|b| current[i] > current[b]) {
                best = Some(i);
            }
        }
        let best = best?;
        current[best] -= total;
        Some(best)
    }

    /// nginx's `least_conn` over the primaries (`backup` false) or the
    /// backups: the fewest in flight per unit of weight; among the tied,
    /// the smooth round robin.
    fn least(
        &self,
        current: &mut [i64],
        backup: bool,
        usable: &impl Fn(usize) -> bool,
        load: &impl Fn(usize) -> u32,
        scale: &dyn Fn(usize) -> i64,
    ) -> Option<usize> {
        let candidates =
            || (0..self.weights.len()).filter(|&i| self.backup[i] == backup && usable(i));
        let ratio = |i: usize| (i64::from(load(i)), self.weights[i] * scale(i));
        // a/b < c/d  <=>  a*d < c*b (weights are positive).
        let mut best: Option<(usize, (i64, i64))> = None;
        let mut tied = false;
        for i in candidates() {
            let (c, w) = ratio(i);
            match best {
                Some((_, (bc, bw))) if c * bw > bc * w => {}
                Some((_, (bc, bw))) if c * bw == bc * w => tied = true,
                _ => {
                    best = Some((i, (c, w)));
                    tied = false;
                }
            }
        }
        let (first, (bc, bw)) = best?;
        if !tied {
            return Some(first);
        }
        let tie = |i: usize| {
            i >= first && {
                let (c, w) = ratio(i);
                c * bw == bc * w
            }
        };
        self.round(current, backup, &|i| usable(i) && tie(i), scale)
    }

    /// A primary target drawn by weight, as nginx's `random`; `two`: the
    /// less loaded of two different ones.
    fn random(
        &self,
        p: &mut Pick,
        two: bool,
        usable: &impl Fn(usize) -> bool,
        load: &impl Fn(usize) -> u32,
    ) -> Option<usize> {
        let draw = |p: &mut Pick| -> Option<usize> {
            while p.tries < MAX_DRAWS {
                let i = self.by_weight(fastrand::u64(0..self.total.max(1)));
                if usable(i) {
                    return Some(i);
                }
                p.tries += 1;
            }
            None
        };
        let first = draw(p)?;
        if !two {
            return Some(first);
        }
        let mut second = first;
        while second == first {
            match draw(p) {
                Some(i) if i == first => p.tries += 1,
                Some(i) => second = i,
                // Only one usable target: it is the one.
                None => return Some(first),
            }
        }
        // nginx keeps the second unless the first has fewer per weight.
        let per =
            |i: usize| i64::from(load(i)) * self.weights[if i == first { second } else { first }];
        Some(if per(first) < per(second) {
            first
        } else {
            second
        })
    }

    /// nginx's `hash`: CRC32 of the key (after the draw's number from the
    /// second on), its top 15 bits added up draw by draw, picks by weight.
    fn hash(&self, p: &mut Pick, usable: &impl Fn(usize) -> bool) -> Option<usize> {
        let BalanceKey::Bytes(key) = &p.key else {
            return None;
        };
        if key.is_empty() {
            return None;
        }
        while p.tries <= MAX_DRAWS {
            let mut crc = crc32fast::Hasher::new();
            if p.rehash > 0 {
                crc.update(itoa::Buffer::new().format(p.rehash).as_bytes());
            }
            crc.update(key);
            p.hash += u64::from((crc.finalize() >> 16) & 0x7fff);
            p.rehash += 1;
            let i = self.by_weight(p.hash % self.total.max(1));
            if usable(i) {
                return Some(i);
            }
            p.tries += 1;
        }
        None
    }

    /// nginx's `ip_hash`: `hash = (hash * 113 + byte) % 6271` over the
    /// address's bytes, from 89, draw after draw.
    fn ip_hash(&self, p: &mut Pick, usable: &impl Fn(usize) -> bool) -> Option<usize> {
        let (bytes, len) = match p.key {
            BalanceKey::Ip(IpAddr::V4(v4)) => {
                let o = v4.octets();
                ([o[0], o[1], o[2], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 3)
            }
            BalanceKey::Ip(IpAddr::V6(v6)) => (v6.octets(), 16),
            _ => return None,
        };
        if !p.started {
            p.hash = 89;
            p.started = true;
        }
        while p.tries <= MAX_DRAWS {
            for b in &bytes[..len] {
                p.hash = (p.hash * 113 + u64::from(*b)) % 6271;
            }
            let i = self.by_weight(p.hash % self.total.max(1));
            if usable(i) {
                return Some(i);
            }
            p.tries += 1;
        }
        None
    }

    /// nginx's `hash ... consistent`: the first point at or after the
    /// key's CRC32, then the points after it; among the usable targets of
    /// the point's name, the smooth round robin.
    fn consistent(
        &self,
        p: &mut Pick,
        ring: &Ring,
        usable: &impl Fn(usize) -> bool,
        scale: &dyn Fn(usize) -> i64,
    ) -> Option<usize> {
        let BalanceKey::Bytes(key) = &p.key else {
            return self.round_robin(usable, scale);
        };
        if key.is_empty() || ring.points.is_empty() {
            return self.round_robin(usable, scale);
        }
        if !p.started {
            let hash = crc32fast::hash(key);
            p.hash = ring.points.partition_point(|(h, _)| *h < hash) as u64;
            p.started = true;
        }
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        while p.tries <= MAX_DRAWS {
            let name = ring.points[(p.hash % ring.points.len() as u64) as usize].1;
            let of_name = |i: usize| ring.name_of[i] == name && usable(i);
            if let Some(i) = self.round(&mut current, false, &of_name, scale) {
                return Some(i);
            }
            p.hash += 1;
            p.tries += 1;
        }
        drop(current);
        self.round_robin(usable, scale)
    }

    /// The primary target whose share of the total weight holds `w`.
    fn by_weight(&self, mut w: u64) -> usize {
        for (i, weight) in self.weights.iter().enumerate() {
            if self.backup[i] {
                continue;
            }
            let weight = *weight as u64;
            if w < weight {
                return i;
            }
            w -= weight;
        }
        0
    }
}

impl Ring {
    fn new(targets: &[Target]) -> Self {
        let name_of: Box<[usize]> = targets
            .iter()
            .map(|t| {
                targets
                    .iter()
                    .position(|o| o.name() == t.name())
                    .unwrap_or(0)
            })
            .collect();
        let mut points = Vec::new();
        for (i, t) in targets.iter().enumerate() {
            if t.backup || name_of[i] != i {
                continue;
            }
            // nginx: crc32(HOST \0 PORT PREV_HASH), PORT when the name
            // ends in `:digits`.
            let name = t.name();
            let (host, port) = match name.rsplit_once(':') {
                Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => (h, p),
                _ => (name, ""),
            };
            let mut base = crc32fast::Hasher::new();
            base.update(host.as_bytes());
            base.update(&[0]);
            base.update(port.as_bytes());
            let mut prev: u32 = 0;
            let weight: u32 = targets
                .iter()
                .enumerate()
                .filter(|(j, _)| name_of[*j] == i)
                .map(|(_, t)| t.weight)
                .max()
                .unwrap_or(1);
            for _ in 0..weight * 160 {
                let mut h = base.clone();
                h.update(&prev.to_le_bytes());
                prev = h.finalize();
                points.push((prev, i));
            }
        }
        points.sort_by_key(|(h, _)| *h);
        points.dedup_by_key(|(h, _)| *h);
        Ring {
            points: points.into(),
            name_of,
        }
    }
}

#[cfg(test)]
mod tests;
