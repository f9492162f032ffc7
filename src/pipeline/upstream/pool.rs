//! Keep-alive connections to one upstream target.
//!
//! Idle connections sit on a stack: the most recently used is handed out
//! first (it is the least likely to have been closed by the upstream), and
//! one idle for longer than `idle_timeout` is dropped rather than reused, so
//! tollgate never writes into a connection the upstream is about to close.
//! The lock is held only to push or pop.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hyper::client::conn::http1::SendRequest;

use crate::pipeline::body::RequestBody;

pub struct Pool {
    idle: Mutex<Vec<Idle>>,
    /// Beyond this many idle connections, finished ones are closed.
    max_idle: usize,
    /// Older idle connections are dropped instead of reused.
    idle_timeout: Duration,
}

struct Idle {
    sender: SendRequest<RequestBody>,
    since: Instant,
}

/// A connection checked out for one exchange.
pub struct Pooled {
    pub sender: SendRequest<RequestBody>,
    pool: Arc<Pool>,
}

impl Pooled {
    pub fn new(sender: SendRequest<RequestBody>, pool: Arc<Pool>) -> Self {
        Pooled { sender, pool }
    }

    /// Puts the connection back for the next request (if it is still open
    /// and the pool has room). Dropping a `Pooled` instead closes it.
    pub fn release(self) {
        if self.sender.is_closed() {
            return;
        }
        let mut idle = self.pool.lock();
        if idle.len() < self.pool.max_idle {
            idle.push(Idle {
                sender: self.sender,
                since: Instant::now(),
            });
        }
    }
}

impl Pool {
    pub fn new(max_idle: usize, idle_timeout: Duration) -> Self {
        Pool {
            idle: Mutex::new(Vec::new()),
            max_idle,
            idle_timeout,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Idle>> {
        // A panic while holding this lock cannot leave the Vec inconsistent.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The freshest idle connection that is still open, with how long it
    /// has been idle.
    pub fn take(&self) -> Option<(SendRequest<RequestBody>, Duration)> {
        let mut idle = self.lock();
        while let Some(c) = idle.pop() {
            let age = c.since.elapsed();
            if age > self.idle_timeout {
                // Everything below is older still.
                idle.clear();
                return None;
            }
            if !c.sender.is_closed() {
                return Some((c.sender, age));
            }
        }
        None
    }
}
