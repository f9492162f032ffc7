//! `max_conn` shared by every replica (`max_conn_lease` on a zone): each
//! request in flight holds a slot in Redis, a member of the key's sorted
//! set `<prefix>{<key>}:<zone>:conn` whose score is when its lease ends,
//! on Redis time (`conn.lua`).
//!
//! - Taken when the request is admitted (one call), freed when its
//!   response ends (one call, not waited for).
//! - Renewed while the request runs: every 250 ms this process renews, per
//!   key in one call, the slots whose lease is a third gone, so a long
//!   request or stream keeps its slot however long it runs.
//! - A replica that dies stops renewing: its slots end with their leases
//!   (at most `max_conn_lease` later), and the next take on the key drops
//!   them. The set's TTL is its last lease's end: no key outlives its
//!   slots.
//! - Every call is idempotent (a member names one request's slot), so a
//!   cluster client's retry changes nothing more.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Script;

use super::batch;
use super::conn::Link;
use super::{LimiterError, RedisStore};

const CONN: &str = include_str!("conn.lua");
/// How often slots due for renewal are renewed.
const RENEW_EVERY: Duration = Duration::from_millis(250);

/// This process's shared slots.
pub struct Conns {
    link: Arc<Link>,
    timeout: Duration,
    script: Script,
    /// This process's name in members, and slots taken so far.
    process: u64,
    next: AtomicU64,
    /// Slots held now, by id.
    held: Mutex<HashMap<u64, Held>>,
    /// Renewals that found their slot gone (its lease ended first).
    pub lost: AtomicU64,
}

struct Held {
    key: Arc<str>,
    member: String,
    lease_ms: u64,
    max: u32,
    /// When it was last taken or renewed (local ms).
    renewed: u64,
}

/// A slot held in Redis; freed when dropped.
pub struct SharedSlot {
    id: u64,
    conns: Arc<Conns>,
}

impl Conns {
    pub fn new(link: Arc<Link>, timeout: Duration) -> Self {
        use std::hash::{BuildHasher, Hasher};
        Conns {
            link,
            timeout,
            script: Script::new(CONN),
            process: std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish(),
            next: AtomicU64::new(0),
            held: Mutex::new(HashMap::new()),
            lost: AtomicU64::new(0),
        }
    }

    /// Slots held now.
    pub fn held(&self) -> usize {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// One `conn.lua` call on `key`, counted in the breaker.
    async fn call(
        &self,
        key: &str,
        op: &str,
        (max, lease_ms): (u32, u64),
        members: &[&str],
    ) -> Result<i64, LimiterError> {
        let (generation, mut conn) = self
            .link
            .get()
            .map_err(|why| LimiterError::Unavailable(why.to_owned()))?;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash())
            .arg(1)
            .arg(key)
            .arg(op)
            .arg(max)
            .arg(lease_ms)
            .arg(members);
        match batch::evalsha::<i64>(&mut conn, &self.script, &cmd, self.timeout).await {
            Ok(n) => {
                self.link.succeeded();
                Ok(n)
            }
            Err((why, broken)) => {
                self.link.failed(broken.then_some(generation));
                Err(LimiterError::Unavailable(why))
            }
        }
    }

    /// Renews the slots a third into their lease, one call per key.
    async fn renew_due(&self, now: u64) {
        // Per key: its max and lease, and its slots due (id, member).
        type Due = (u32, u64, Vec<(u64, String)>);
        let mut due: HashMap<Arc<str>, Due> = HashMap::new();
        {
            let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            for (id, h) in held.iter() {
                if now >= h.renewed + h.lease_ms / 3 {
                    let e = due
                        .entry(h.key.clone())
                        .or_insert((h.max, h.lease_ms, Vec::new()));
                    e.2.push((*id, h.member.clone()));
                }
            }
        }
        for (key, (max, lease_ms, slots)) in due {
            let members: Vec<&str> = slots.iter().map(|(_, m)| m.as_str()).collect();
            match self.call(&key, "renew", (max, lease_ms), &members).await {
                Ok(kept) => {
                    if (kept as usize) < members.len() {
                        self.lost
                            .fetch_add((members.len() - kept as usize) as u64, Ordering::Relaxed);
                        tracing::warn!(
                            lost = members.len() - kept as usize,
                            "rate-limit store: shared max_conn slots ended before they were renewed (Redis lost them, or renewal was late); those requests run on uncounted"
                        );
                    }
                    let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
                    for (id, _) in &slots {
                        if let Some(h) = held.get_mut(id) {
                            h.renewed = now;
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "rate-limit store: renewing shared max_conn slots failed; retrying");
                }
            }
        }
    }
}

impl Drop for SharedSlot {
    fn drop(&mut self) {
        let held = self
            .conns
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
        if let Some(h) = held {
            let conns = self.conns.clone();
            tokio::spawn(async move {
                let _ = conns
                    .call(&h.key, "free", (h.max, h.lease_ms), &[&h.member])
                    .await;
            });
        }
    }
}

impl RedisStore {
    /// Takes one of `max` shared slots of `key` in zone `zone`, leased for
    /// `lease_ms`: `None` when all are held.
    pub async fn take_conn(
        &self,
        zone: usize,
        key: &str,
        max: u32,
        lease_ms: u64,
    ) -> Result<Option<SharedSlot>, LimiterError> {
        let suffix = &self.suffixes[zone];
        let set: Arc<str> = format!("{}{{{key}}}:{suffix}:conn", self.prefix).into();
        let id = self.conns.next.fetch_add(1, Ordering::Relaxed);
        let member = format!("{:x}:{id:x}", self.conns.process);
        let took = self
            .conns
            .call(&set, "take", (max, lease_ms), &[&member])
            .await?;
        if took == 0 {
            return Ok(None);
        }
        let renewed = self.clock.unix_ms();
        self.conns
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                id,
                Held {
                    key: set,
                    member,
                    lease_ms,
                    max,
                    renewed,
                },
            );
        Ok(Some(SharedSlot {
            id,
            conns: self.conns.clone(),
        }))
    }

    /// Shared slots held by this process now, and renewals that found
    /// their slot gone.
    pub fn conn_leases(&self) -> (usize, u64) {
        (self.conns.held(), self.conns.lost.load(Ordering::Relaxed))
    }

    /// Renews due slots every [`RENEW_EVERY`] while the store (or a reload
    /// of it) lives.
    pub(super) fn renew_conns(&self) {
        let conns = Arc::downgrade(&self.conns);
        let clock = self.clock.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RENEW_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(conns) = conns.upgrade() else {
                    return;
                };
                conns.renew_due(clock.unix_ms()).await;
            }
        });
    }
}
