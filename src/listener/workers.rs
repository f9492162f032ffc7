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

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::watch;

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
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
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
