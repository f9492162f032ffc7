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
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
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
            self.started(self.in_flight.fetch_add(1, Ordering::AcqRel) + 1);
            return Ok(Permit(self.clone()));
        }
        let Some((cfg, waiting)) = &self.queue else {
            return match self.try_take() {
                true => Ok(Permit(self.clone())),
                false => Err(self.shed(class, ShedReason::Limit)),
            };
        };
        let (id, rx) = {
            let mut w = waiting.lock().unwrap_or_else(|e| e.into_inner());
            let queued = w.by_class.iter().flatten().any(|x| x.kind == Kind::Place);
            if !queued && self.try_take() {
                return Ok(Permit(self.clone()));
            }
            match self.enqueue(&mut w, cfg.size, class, never_shed, Kind::Place) {
                Some(entry) => entry,
                None => return Err(self.shed(class, ShedReason::QueueFull)),
            }
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
    /// at its `max_conns`); `Ok` means: pick again.
    pub async fn wait_slot(&self, class: u8, never_shed: bool, until: Instant) -> Result<(), Shed> {
        let Some((cfg, waiting)) = &self.queue else {
            return Err(self.shed(class, ShedReason::Limit));
        };
        let entry = {
            let mut w = waiting.lock().unwrap_or_else(|e| e.into_inner());
            self.enqueue(&mut w, cfg.size, class, never_shed, Kind::Slot)
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
        if let Some((_, waiting)) = &self.queue {
            waiting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .wake_first(Kind::Slot);
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
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
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
        if let Some((_, waiting)) = &self.queue {
            let mut w = waiting.lock().unwrap_or_else(|e| e.into_inner());
            let limit = self.limit.load(Ordering::Relaxed);
            if self.in_flight.load(Ordering::Acquire) <= limit && w.wake_first(Kind::Place) {
                return;
            }
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// The limit rose: waiters take the new places.
    pub(super) fn admit_waiting(&self) {
        let Some((_, waiting)) = &self.queue else {
            return;
        };
        let mut w = waiting.lock().unwrap_or_else(|e| e.into_inner());
        while self.in_flight.load(Ordering::Acquire) < self.limit.load(Ordering::Relaxed) {
            self.in_flight.fetch_add(1, Ordering::AcqRel);
            if !w.wake_first(Kind::Place) {
                self.in_flight.fetch_sub(1, Ordering::AcqRel);
                break;
            }
        }
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

    /// Its figures; `classes` is how many classes are configured.
    pub fn report(&self, classes: usize) -> ProtectReport {
        let queued = self.queue.as_ref().map_or(0, |(_, w)| {
            let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
            w.prune();
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
            shed: self.shed[..classes.clamp(1, MAX_CLASSES)]
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
