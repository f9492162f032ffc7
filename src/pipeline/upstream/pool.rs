//! Keep-alive connections to one upstream target.
//!
//! Each worker event loop keeps its own idle connections (like nginx's
//! `keepalive`, which is per worker process): a connection is only ever used
//! by the thread whose reactor it is registered with, so reusing it costs
//! no cross-thread wake-up. Idle connections sit on a stack: the most
//! recently used is handed out first (it is the least likely to have been
//! closed by the upstream), one idle for longer than `idle_timeout` is
//! dropped rather than reused, and one the upstream closed meanwhile is
//! noticed and dropped. The lock is held only to push or pop, and only the
//! owning thread takes it but for metrics.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::h1::Conn;

/// Idle stacks per pool; threads beyond this many share them.
pub(super) const SHARDS: usize = 16;

pub struct Pool {
    shards: Box<[Mutex<Vec<Idle>>]>,
    /// Beyond this many idle connections (per worker), finished ones are
    /// closed.
    max_idle: usize,
    /// Older idle connections are dropped instead of reused.
    idle_timeout: Duration,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// This thread's shard, assigned on first use.
pub(super) fn shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SHARD.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
        }
        s.get()
    })
}

impl Pool {
    pub fn new(max_idle: usize, idle_timeout: Duration) -> Self {
        Pool {
            shards: (0..SHARDS).map(|_| Mutex::new(Vec::new())).collect(),
            max_idle,
            idle_timeout,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Idle>> {
        // A panic while holding this lock cannot leave the Vec inconsistent.
        self.shards[shard()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Puts a connection back for the next request, if there is room;
    /// `since` is when it was last used (no clock is read here).
    pub fn put(&self, mut conn: Conn, since: Instant) {
        conn.park();
        let mut idle = self.lock();
        if idle.len() < self.max_idle {
            idle.push(Idle { conn, since });
        }
    }

    /// The freshest idle connection that is still open at `now`.
    pub fn take(&self, now: Instant) -> Option<Conn> {
        let mut idle = self.lock();
        while let Some(mut c) = idle.pop() {
            if now.saturating_duration_since(c.since) > self.idle_timeout {
                // Everything below is older still.
                idle.clear();
                return None;
            }
            if !c.conn.is_stale() {
                return Some(c.conn);
            }
        }
        None
    }
}
