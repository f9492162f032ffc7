//! Keep-alive connections to one upstream target.
//!
//! Each worker event loop keeps its own idle connections (like nginx's
//! `keepalive`, which is per worker process): a connection is only ever used
//! by the thread whose reactor it is registered with, so reusing it costs
//! no cross-thread wake-up. Idle connections sit on a stack: the most
//! recently used is handed out first (it is the least likely to have been
//! closed by the upstream), one idle for longer than `idle_timeout` is
//! dropped rather than reused (and the oldest is dropped as soon as it
//! is, when another comes back), and one the upstream closed meanwhile is
//! noticed and dropped. The lock is held only to push or pop, and only the
//! owning thread takes it but for metrics.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::h1::Conn;

/// Idle stacks per pool; threads beyond this many share them.
pub(super) const SHARDS: usize = 16;

pub struct Pool {
    shards: Box<[Mutex<VecDeque<Idle>>]>,
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
            shards: (0..SHARDS).map(|_| Mutex::new(VecDeque::new())).collect(),
            max_idle,
            idle_timeout,
        }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Idle>> {
        // A panic while holding this lock cannot leave the Vec inconsistent.
        self.shards[shard()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Puts a connection back for the next request, if there is room;
    /// `since` is when it was last used (no clock is read here). The
    /// oldest idle connection goes first if it has waited past
    /// `idle_timeout`: after a burst, the pool shrinks back to what the
    /// load keeps using instead of holding the burst's connections (and
    /// their read buffers) until it is drained to them.
    pub fn put(&self, mut conn: Conn, since: Instant) {
        conn.park();
        let mut idle = self.lock();
        if idle
            .front()
            .is_some_and(|old| since.saturating_duration_since(old.since) > self.idle_timeout)
        {
            idle.pop_front();
        }
        if idle.len() < self.max_idle {
            idle.push_back(Idle { conn, since });
        }
    }

    /// The freshest idle connection that is still open at `now`.
    pub fn take(&self, now: Instant) -> Option<Conn> {
        let mut idle = self.lock();
        while let Some(mut c) = idle.pop_back() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::upstream::h1::Io;
    use tokio::net::{TcpListener, TcpStream};

    /// Connections to one listener, kept open on its side.
    async fn conns(n: usize) -> (Vec<Conn>, Vec<TcpStream>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..n {
            ours.push(Conn::new(Io::Tcp(TcpStream::connect(addr).await.unwrap())));
            theirs.push(listener.accept().await.unwrap().0);
        }
        (ours, theirs)
    }

    #[tokio::test]
    async fn connections_a_burst_left_go_once_idle_past_the_timeout() {
        let start = tokio::time::Instant::now().into_std();
        let at = |s: u64| start + Duration::from_secs(s);
        let pool = Pool::new(3, Duration::from_secs(4));
        let (mut ours, _theirs) = conns(6).await;
        // A burst: four come back at 0 s, one more than the pool keeps.
        for _ in 0..4 {
            pool.put(ours.pop().unwrap(), at(0));
        }
        assert_eq!(pool.lock().len(), 3, "the cap holds");
        // Steady load after it: one connection in use, put back at 10 s,
        // takes the place of one the burst left behind.
        assert!(
            pool.take(at(10)).is_none(),
            "past the idle timeout, none is reused"
        );
        assert_eq!(pool.lock().len(), 0);
        pool.put(ours.pop().unwrap(), at(0));
        pool.put(ours.pop().unwrap(), at(10));
        assert_eq!(pool.lock().len(), 1, "the old one went as the new one came");
        assert!(pool.take(at(11)).is_some());
    }
}
