//! An upstream's gate: the requests it admits at once (its concurrency
//! limit, learned by `controller`), and the one bounded queue where
//! requests over that limit, or over every target's `max_conns`, wait:
//! highest class first, first come first served within a class. A full
//! queue makes room by shedding the newest waiter of the lowest class
//! below the newcomer's; else the newcomer is shed. A waiter is shed when
//! its time is up. Classes marked never-shed pass the limit and are never
//! displaced from the queue.
//!
//! A freed place goes straight to the first waiter (the count is handed
//! over, not released and raced for), so a newcomer never overtakes the
//! queue.

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::controller::Controller;
use crate::config::{Concurrency, QueueConfig, MAX_CLASSES};
use crate::metrics::{ProtectReport, ShedReason};

/// What a waiter waits for: a place under the limit, or a target slot
/// freed under `max_conns` (then it picks again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Place,
    Slot,
}

struct Waiter {
    id: u64,
    kind: Kind,
    /// Never shed to make room.
    keep: bool,
    /// `true`: go on; `false`: shed (a higher class took its place).
    wake: oneshot::Sender<bool>,
}

#[derive(Default)]
struct Waiting {
    by_class: [VecDeque<Waiter>; MAX_CLASSES],
    next_id: u64,
}

impl Waiting {
    fn len(&self) -> usize {
        self.by_class.iter().map(VecDeque::len).sum()
    }

    /// Wakes the first live waiter of `kind` (highest class first).
    fn wake_first(&mut self, kind: Kind) -> bool {
        for q in &mut self.by_class {
            while let Some(w) = q
                .iter()
                .position(|w| w.kind == kind)
                .and_then(|i| q.remove(i))
            {
                if w.wake.send(true).is_ok() {
                    return true;
                }
            }
        }
        false
    }

    fn remove(&mut self, class: u8, id: u64) -> bool {
        let q = &mut self.by_class[class as usize];
        match q.iter().position(|w| w.id == id) {
            Some(i) => {
                q.remove(i);
                true
            }
            None => false,
        }
    }

    /// Drops waiters whose requests went away.
    fn prune(&mut self) {
        for q in &mut self.by_class {
            q.retain(|w| !w.wake.is_closed());
        }
    }
}

/// One upstream's admission state.
pub struct Gate {
    /// The limit now (`u32::MAX`: no adaptive limit).
    pub(super) limit: AtomicU32,
    pub(super) in_flight: AtomicU32,
    queue: Option<(QueueConfig, Mutex<Waiting>)>,
    /// How many wait in the queue, as last written under its lock: while
    /// none do, places are taken and given back without the lock.
    waiters: AtomicUsize,
    pub(super) controller: Option<Controller>,
    dequeued: AtomicU64,
    shed: [[AtomicU64; 3]; MAX_CLASSES],
}

/// A place under the limit, held until the answer has been relayed.
pub struct Permit(Arc<Gate>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Permit")
    }
}

/// Why a request was not admitted, and its class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shed {
    pub class: u8,
    pub reason: ShedReason,
}

impl Gate {
    pub fn new(concurrency: Option<&Concurrency>, queue: Option<&QueueConfig>) -> Arc<Gate> {
        let gate = Arc::new(Gate {
            limit: AtomicU32::new(concurrency.map_or(u32::MAX, |c| c.min)),
            in_flight: AtomicU32::new(0),
            queue: queue.map(|q| (q.clone(), Mutex::new(Waiting::default()))),
            waiters: AtomicUsize::new(0),
            controller: concurrency.map(Controller::new),
            dequeued: AtomicU64::new(0),
            shed: Default::default(),
        });
        if let Some(c) = concurrency {
            if tokio::runtime::Handle::try_current().is_ok() {
                super::controller::spawn(Arc::downgrade(&gate), c.interval);
            }
        }
        gate
    }

    pub fn has_queue(&self) -> bool {
        self.queue.is_some()
    }

    /// A place for a request of `class` (`never_shed`: admitted past the
    /// limit), waiting in the queue until `until` at the latest.
    pub async fn admit(
        self: &Arc<Self>,
        class: u8,
        never_shed: bool,
        until: Option<Instant>,
    ) -> Result<Permit, Shed> {
        if never_shed {
            self.started(self.in_flight.fetch_add(1, Ordering::SeqCst) + 1);
            return Ok(Permit(self.clone()));
        }
        let Some((cfg, waiting)) = &self.queue else {
            return match self.try_take() {
                true => Ok(Permit(self.clone())),
                false => Err(self.shed(class, ShedReason::Limit)),
            };
        };
        // Nobody waits: no lock.
        if self.waiters.load(Ordering::SeqCst) == 0 && self.try_take() {
            return Ok(Permit(self.clone()));
        }
        let (id, rx) = {
            let mut w = waiting.lock().unwrap_or_else(|e| e.into_inner());
            // Waiters whose clients went away would keep a newcomer from
            // a free place that no release would then hand it.
            w.prune();
            let queued = w.by_class.iter().flatten().any(|x| x.kind == Kind::Place);
            if !queued && self.try_take() {
                self.waiters.store(w.len(), Ordering::SeqCst);
                return Ok(Permit(self.clone()));
            }
            let Some((id, rx)) = self.enqueue(&mut w, cfg.size, class, never_shed, Kind::Place)
            else {
                self.waiters.store(w.len(), Ordering::SeqCst);
                return Err(self.shed(class, ShedReason::QueueFull));
            };
            // A release that gave its place back before it could see this
            // waiter left the place free: take it.
            if self.try_take() {
                w.remove(class, id);
                self.waiters.store(w.len(), Ordering::SeqCst);
                return Ok(Permit(self.clone()));
            }
            (id, rx)
        };
        let until = deadline(cfg.timeout, until);
        match self.wait(id, class, rx, until).await {
            Ok(()) => {
                self.dequeued.fetch_add(1, Ordering::Relaxed);
                Ok(Permit(self.clone()))
            }
            Err(reason) => Err(self.shed(class, reason)),
        }
    }

    /// Waits, in the queue, for a target slot to free up (every target is
    /// at its `max_conns`: `full` says whether that still holds); `Ok`
    /// means: pick again.
    pub async fn wait_slot(
        &self,
        class: u8,
        never_shed: bool,
        until: Instant,
        full: impl Fn() -> bool,
    ) -> Result<(), Shed> {
        let Some((cfg, waiting)) = &self.queue else {
            return Err(self.shed(class, ShedReason::Limit));
        };
        let entry = {
            let mut w = waiting.lock().unwrap_or_else(|e| e.into_inner());
            let entry = self.enqueue(&mut w, cfg.size, class, never_shed, Kind::Slot);
            // A slot freed between the pick and the queue: a release after
            // this look finds the waiter, one before it shows here.
            fence(Ordering::SeqCst);
            if let Some((id, _)) = &entry {
                if !full() {
                    w.remove(class, *id);
                    self.waiters.store(w.len(), Ordering::SeqCst);
                    return Ok(());
                }
            }
            entry
        };
        let Some((id, rx)) = entry else {
            return Err(self.shed(class, ShedReason::QueueFull));
        };
        self.wait(id, class, rx, until)
            .await
            .map_err(|reason| self.shed(class, reason))?;
        self.dequeued.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// When a request waiting from now would be shed for its time.
    pub fn wait_until(&self, call: Option<Instant>) -> Instant {
        let timeout = self
            .queue
            .as_ref()
            .map_or(Duration::ZERO, |(c, _)| c.timeout);
        deadline(timeout, call)
    }

    /// A target slot was freed: the first waiter for one picks again.
    pub fn slot_freed(&self) {
        // The slot's count fell before this (a fence pairs with the
        // waiter's): either the waiter saw the slot free, or this sees it.
        fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) == 0 {
            return;
        }
        if let Some((_, waiting)) = &self.queue {
            let mut w = waiting.lock().unwrap_or_else(|e| e.into_inner());
            w.wake_first(Kind::Slot);
            self.waiters.store(w.len(), Ordering::SeqCst);
        }
    }

    /// Joins the queue, making room by shedding the newest waiter of the
    /// lowest class below `class` (never a never-shed one) when it is
    /// full; `None`: no room.
    fn enqueue(
        &self,
        w: &mut Waiting,
        size: usize,
        class: u8,
        never_shed: bool,
        kind: Kind,
    ) -> Option<(u64, oneshot::Receiver<bool>)> {
        if w.len() >= size {
            w.prune();
        }
        if w.len() >= size && !never_shed {
            let (c, i) = (class as usize + 1..MAX_CLASSES).rev().find_map(|c| {
                let q = &w.by_class[c];
                q.iter().rposition(|x| !x.keep).map(|i| (c, i))
            })?;
            if let Some(out) = w.by_class[c].remove(i) {
                let _ = out.wake.send(false);
            }
        }
        let (tx, rx) = oneshot::channel();
        let id = w.next_id;
        w.next_id += 1;
        w.by_class[class as usize].push_back(Waiter {
            id,
            kind,
            keep: never_shed,
            wake: tx,
        });
        self.waiters.store(w.len(), Ordering::SeqCst);
        Some((id, rx))
    }

    /// Waits for its turn until `until`.
    async fn wait(
        &self,
        id: u64,
        class: u8,
        mut rx: oneshot::Receiver<bool>,
        until: Instant,
    ) -> Result<(), ShedReason> {
        let woken = match tokio::time::timeout_at(until, &mut rx).await {
            Ok(r) => r.unwrap_or(false),
            Err(_) => {
                if let Some((_, waiting)) = &self.queue {
                    let mut w = waiting.lock().unwrap_or_else(|e| e.into_inner());
                    if w.remove(class, id) {
                        self.waiters.store(w.len(), Ordering::SeqCst);
                        return Err(ShedReason::Timeout);
                    }
                }
                // Woken as its time ran out: the wake-up stands.
                rx.try_recv().unwrap_or(false)
            }
        };
        match woken {
            true => Ok(()),
            false => Err(ShedReason::QueueFull),
        }
    }

    /// A place under the limit, if one is free.
    fn try_take(&self) -> bool {
        let limit = self.limit.load(Ordering::Relaxed);
        let taken = self
            .in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < limit).then_some(n + 1)
            });
        match taken {
            Ok(n) => {
                self.started(n + 1);
                true
            }
            Err(_) => false,
        }
    }

    fn started(&self, in_flight: u32) {
        if let Some(c) = &self.controller {
            c.peak.fetch_max(in_flight, Ordering::Relaxed);
        }
    }

    /// A place freed: handed to the first waiter for one while under the
    /// limit, else released.
    fn release(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        // Either a waiter that joined meanwhile took the place itself, or
        // it is seen here and handed the place.
        if self.queue.is_some() && self.waiters.load(Ordering::SeqCst) != 0 {
            self.admit_waiting();
        }
    }

    /// Places are free (one was given back, or the limit rose): the first
    /// waiters take them.
    pub(super) fn admit_waiting(&self) {
        let Some((_, waiting)) = &self.queue else {
            return;
        };
        let mut w = waiting.lock().unwrap_or_else(|e| e.into_inner());
        while self.try_take() {
            if !w.wake_first(Kind::Place) {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                break;
            }
        }
        self.waiters.store(w.len(), Ordering::SeqCst);
    }

    fn shed(&self, class: u8, reason: ShedReason) -> Shed {
        self.shed[class as usize][reason as usize].fetch_add(1, Ordering::Relaxed);
        Shed { class, reason }
    }

    /// An answer's latency, for the controller.
    pub fn sample(&self, latency: Duration) {
        if let Some(c) = &self.controller {
            c.sample(latency);
        }
    }

    /// Its figures (shed counts for every class index; the admin API
    /// names the configured ones).
    pub fn report(&self) -> ProtectReport {
        let queued = self.queue.as_ref().map_or(0, |(_, w)| {
            let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
            w.prune();
            self.waiters.store(w.len(), Ordering::SeqCst);
            w.len() as u32
        });
        let (min_rtt_us, probing, history) = match &self.controller {
            Some(c) => c.report(),
            None => (None, false, Vec::new()),
        };
        ProtectReport {
            limit: self
                .controller
                .as_ref()
                .map(|_| self.limit.load(Ordering::Relaxed)),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            queued,
            queue_size: self.queue.as_ref().map(|(c, _)| c.size as u32),
            min_rtt_us,
            probing,
            dequeued: self.dequeued.load(Ordering::Relaxed),
            shed: self
                .shed
                .iter()
                .map(|r| std::array::from_fn(|i| r[i].load(Ordering::Relaxed)))
                .collect(),
            history,
            classes: Vec::new(),
        }
    }
}

/// `timeout` from now, or the call's own deadline if sooner.
fn deadline(timeout: Duration, call: Option<Instant>) -> Instant {
    let own = Instant::now() + timeout;
    call.map_or(own, |c| c.min(own))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(limit: u32, size: usize, timeout: Duration) -> Arc<Gate> {
        let cfg = Concurrency {
            min: limit,
            max: limit,
            tolerance: 0.25,
            interval: Duration::from_secs(3600),
            probe_every: Duration::from_secs(3600),
            probe_requests: 1,
        };
        let queue = QueueConfig { size, timeout };
        Gate::new(Some(&cfg), Some(&queue))
    }

    /// 200 requests through a limit of 3 and a queue of 500: never more
    /// than 3 at once, every one served, nothing left waiting or counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_queue_hands_every_place_over_and_never_passes_the_limit() {
        let g = gate(3, 500, Duration::from_secs(30));
        let now = Arc::new(AtomicU32::new(0));
        let most = Arc::new(AtomicU32::new(0));
        let mut all = tokio::task::JoinSet::new();
        for i in 0..200u32 {
            let (g, now, most) = (g.clone(), now.clone(), most.clone());
            all.spawn(async move {
                let permit = g.admit((i % 3) as u8, false, None).await;
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                tokio::task::yield_now().await;
                now.fetch_sub(1, Ordering::SeqCst);
                drop(permit);
            });
        }
        let all = tokio::time::timeout(Duration::from_secs(20), all.join_all()).await;
        assert!(all.is_ok(), "a waiter was never woken");
        assert!(most.load(Ordering::SeqCst) <= 3, "{most:?} at once");
        let r = g.report();
        assert_eq!((r.in_flight, r.queued), (0, 0));
        assert_eq!(r.shed.iter().flatten().sum::<u64>(), 0);
    }

    /// A waiter whose client went away takes nothing: the place goes to
    /// the next, and a newcomer finds it free.
    #[tokio::test]
    async fn a_waiter_gone_away_is_passed_over() {
        let g = gate(1, 10, Duration::from_secs(30));
        let held = g.admit(0, false, None).await.unwrap();
        let gone = tokio::time::timeout(Duration::from_millis(20), g.admit(0, false, None)).await;
        assert!(gone.is_err(), "it waited, then its client went away");
        drop(held);
        let next = tokio::time::timeout(Duration::from_secs(1), g.admit(0, false, None)).await;
        assert!(matches!(next, Ok(Ok(_))), "the free place is taken at once");
    }
}
