//! One client connection: HTTP/1.1 or HTTP/2 (sniffed by hyper-util's auto
//! builder, so h2c prior knowledge works on plain listeners and ALPN `h2` on
//! TLS ones), served until it ends, the server shuts down, or it sits idle.
//!
//! The idle watchdog closes a connection that has had no request in flight
//! for `server.idle_timeout`. For HTTP/1.1, hyper's header-read timer also
//! runs while it waits for the next request head, so an idle keep-alive
//! connection closes after the shorter of the two.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use crate::pipeline::{ConnInfo, Pipeline};

/// How long an idle connection may take to close gracefully.
const IDLE_CLOSE_BOUND: Duration = Duration::from_secs(5);

/// Shared between a connection's requests and its idle watchdog.
pub struct ConnState {
    /// Requests whose response body has not finished yet.
    in_flight: AtomicUsize,
    /// Milliseconds since `opened` of the last request start or finish.
    last_change_ms: AtomicU64,
    opened: Instant,
}

impl ConnState {
    pub fn new() -> Self {
        ConnState {
            in_flight: AtomicUsize::new(0),
            last_change_ms: AtomicU64::new(0),
            opened: Instant::now(),
        }
    }

    fn touch(&self) {
        self.last_change_ms
            .store(self.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    pub fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.touch();
    }

    pub fn request_finished(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.touch();
    }

    /// How long the connection has had nothing in flight; `None` while a
    /// request runs.
    fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let last = Duration::from_millis(self.last_change_ms.load(Ordering::Relaxed));
        Some(self.opened.elapsed().saturating_sub(last))
    }
}

impl Default for ConnState {
    fn default() -> Self {
        Self::new()
    }
}

/// Serves HTTP on an accepted (and, for TLS listeners, handshaken) stream.
pub async fn serve<I>(
    io: I,
    builder: &auto::Builder<TokioExecutor>,
    pipeline: Arc<Pipeline>,
    info: Arc<ConnInfo>,
    idle_timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let state = info.state.clone();
    let peer = info.peer;
    let service = service_fn(move |req| {
        let pipeline = pipeline.clone();
        let info = info.clone();
        async move { Ok::<_, Infallible>(pipeline.handle(req, &info).await) }
    });
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    let idle = tokio::time::sleep(idle_timeout);
    tokio::pin!(idle);
    let mut closing = false;
    // An idle-closed HTTP/2 connection waits for the client to acknowledge
    // the GOAWAY ping; a client that never does is dropped after this.
    let hard_close = tokio::time::sleep(Duration::from_secs(3600));
    tokio::pin!(hard_close);
    let mut hard_close_armed = false;
    if *shutdown.borrow() {
        conn.as_mut().graceful_shutdown();
        closing = true;
    }
    loop {
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(e) = res {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                break;
            }
            () = &mut hard_close, if hard_close_armed => {
                tracing::debug!(%peer, "idle connection did not close gracefully; dropping it");
                break;
            }
            _ = shutdown.changed(), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            () = &mut idle, if !closing => {
                let now = tokio::time::Instant::now();
                match state.idle_for() {
                    Some(d) if d >= idle_timeout => {
                        tracing::debug!(%peer, "closing idle connection");
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                        hard_close.as_mut().reset(now + IDLE_CLOSE_BOUND);
                        hard_close_armed = true;
                    }
                    Some(d) => idle.as_mut().reset(now + (idle_timeout - d)),
                    None => idle.as_mut().reset(now + idle_timeout),
                }
            }
        }
    }
}
