//! Worker event loops, the way nginx runs one worker process per core: each
//! worker is a thread with a single-threaded runtime, and every connection
//! lives on one worker from accept to close. Nothing is stolen or handed
//! between threads on the request path, so a request costs no cross-thread
//! wake-up and no scheduler synchronisation.
//!
//! With one worker (`server.workers: 1`, or `auto` on one core) there are no
//! extra threads at all: connections run on the runtime that accepts them.
//! With more, the accepting runtime deals connections out in turn and each
//! socket is moved to its worker's reactor.
//!
//! Each event loop runs up to [`EVENT_INTERVAL`] ready tasks before it looks
//! for I/O again, so under load it takes its events in large batches, as
//! nginx does (it handles everything one `epoll_wait` returned before the
//! next).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::watch;

/// Tasks an event loop runs between two polls for I/O while tasks are
/// ready (tokio's default is 61; with none ready it polls at once).
///
/// Larger than tokio's default so that, under load, a loop handles more of
/// what one wait for I/O returned before it waits again, as nginx does:
/// fewer waits, and fewer wake-ups of the upstream and the client on the
/// other cores (measured in docs/benchmarks.md, "How often the event loop
/// polls for I/O"). An I/O event that comes while tasks are ready is seen
/// after at most this many of them have run; timers are checked on the
/// same polls.
pub const EVENT_INTERVAL: u32 = 255;

/// A single-threaded runtime for one event loop (workers, and the
/// accepting runtime, which serves connections with one worker).
pub fn event_loop() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .event_interval(EVENT_INTERVAL)
        .build()
}

pub struct Workers {
    handles: Vec<Handle>,
    next: AtomicUsize,
    /// Dropping it stops every worker (their remaining tasks are dropped).
    _stop: watch::Sender<bool>,
}

impl Workers {
    /// Connections run on the runtime that accepts them.
    pub fn single() -> Workers {
        Workers {
            handles: Vec::new(),
            next: AtomicUsize::new(0),
            _stop: watch::channel(false).0,
        }
    }

    /// Starts `n` workers (none for `n <= 1`).
    pub fn start(n: usize) -> std::io::Result<Workers> {
        if n <= 1 {
            return Ok(Workers::single());
        }
        let (stop, stopped) = watch::channel(false);
        let mut handles = Vec::new();
        for i in 0..n {
            let runtime = event_loop()?;
            handles.push(runtime.handle().clone());
            let mut stopped = stopped.clone();
            std::thread::Builder::new()
                .name(format!("tollgate-worker-{i}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        // Ends when the sender is dropped.
                        while stopped.changed().await.is_ok() {}
                    })
                })?;
        }
        Ok(Workers {
            handles,
            next: AtomicUsize::new(0),
            _stop: stop,
        })
    }

    /// How many threads serve connections (1: the accepting runtime).
    pub fn count(&self) -> usize {
        self.handles.len().max(1)
    }

    /// Serves `tcp` with `serve` on the next worker.
    pub fn spawn<F, Fut>(&self, tcp: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        if self.handles.is_empty() {
            tokio::spawn(serve(tcp));
            return;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        // The socket leaves this runtime's reactor for the worker's.
        let std = match tcp.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "cannot hand a connection to a worker");
                return;
            }
        };
        self.handles[i].spawn(async move {
            match TcpStream::from_std(std) {
                Ok(tcp) => serve(tcp).await,
                Err(e) => tracing::debug!(error = %e, "a worker cannot take a connection"),
            }
        });
    }
}
