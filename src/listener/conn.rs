//! One client connection served by hyper (HTTP/2, sniffed by hyper-util's
//! auto builder so h2c prior knowledge works on plain listeners and ALPN
//! `h2` on TLS ones; HTTP/1.x that `h1`'s fast path handed over) until it
//! ends, the server shuts down, or it sits idle; and the watchdog that
//! times every connection, whichever server it is on.
//!
//! Every connection must complete its first request head within
//! `server.header_read_timeout` of being accepted (after its TLS handshake)
//! or it is closed: hyper-util's auto builder waits for the first bytes
//! before hyper's own header timer starts, and an HTTP/2 client may send
//! nothing but its preface and SETTINGS, so a silent socket would otherwise
//! hold a connection slot for `idle_timeout`.
//!
//! The watchdog (one timer per connection, none per request) closes a
//! connection that has had no request in flight for `server.idle_timeout`
//! (nginx `keepalive_timeout`); an HTTP/1.1 connection whose next request
//! head started arriving but is not complete within
//! `server.header_read_timeout` (nginx `client_header_timeout`); and one
//! whose client has taken nothing of the responses it is being sent for
//! `server.send_timeout` (a reader that stopped reading, an HTTP/2 peer
//! that never opens its flow-control window), like nginx `send_timeout`.
//! Each is seen within a quarter of its value (half for `send_timeout`).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake};
use std::time::Duration;

use futures_util::task::AtomicWaker;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use super::linger::Linger;
use super::ListenerCtx;
use crate::pipeline::conn::{ConnInfo, ConnState};

/// How long an idle connection may take to close gracefully.
const IDLE_CLOSE_BOUND: Duration = Duration::from_secs(5);

/// Serves HTTP with hyper on an accepted (and, for TLS listeners,
/// handshaken) stream: HTTP/2, and HTTP/1.x connections the fast path
/// (`h1`) hands over.
pub(super) async fn serve<I>(
    io: I,
    ctx: &ListenerCtx,
    info: Arc<ConnInfo>,
    shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve_with(io, &ctx.builder, ctx, info, shutdown).await
}

/// The client's first bytes on an HTTP/2 connection (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// `GOAWAY`, last stream 0, `PROTOCOL_ERROR`: the answer to a connection
/// that does not open with the preface (RFC 9113 §3.4).
const GOAWAY_PROTOCOL_ERROR: [u8; 17] = [
    0, 0, 8, 0x7, 0, 0, 0, 0, 0, // length 8, GOAWAY, no flags, stream 0
    0, 0, 0, 0, // last stream id
    0, 0, 0, 1, // PROTOCOL_ERROR
];

/// Serves a connection whose TLS handshake chose `h2` (ALPN): HTTP/2 only.
/// A client that then opens with anything but the preface gets `GOAWAY
/// (PROTOCOL_ERROR)` and the close, never an HTTP/1.1 answer.
pub(super) async fn serve_h2<I>(
    mut io: I,
    ctx: &ListenerCtx,
    info: Arc<ConnInfo>,
    shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut preface = [0u8; PREFACE.len()];
    let mut got = 0;
    let read = tokio::time::timeout(ctx.header_read_timeout, async {
        while got < preface.len() {
            match io.read(&mut preface[got..]).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => got += n,
            }
            if preface[..got] != PREFACE[..got] {
                return false;
            }
        }
        true
    })
    .await;
    match read {
        Ok(true) => {
            info.state.mark_h2();
            let io = super::rewind::Rewind::new(io, bytes::Bytes::from_static(PREFACE));
            serve_with(io, &ctx.builder_h2, ctx, info, shutdown).await
        }
        // A client that said nothing, or hung up: nothing to answer.
        Err(_) | Ok(false) if got == 0 => {}
        _ => {
            info.state
                .protocol_error(crate::metrics::ProtocolError::Http2);
            tracing::debug!(peer = %info.peer, "no HTTP/2 connection preface after ALPN h2; GOAWAY");
            let _ = io.write_all(&GOAWAY_PROTOCOL_ERROR).await;
            let _ = io.shutdown().await;
        }
    }
}

async fn serve_with<I>(
    io: I,
    builder: &auto::Builder<hyper_util::rt::TokioExecutor>,
    ctx: &ListenerCtx,
    info: Arc<ConnInfo>,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let live = ctx.live.clone();
    let state = info.state.clone();
    let peer = info.peer;
    let slots = ctx.upstream_slots;
    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        // Each request runs on the config current when it arrives.
        let pipeline = live.load_full();
        let info = info.clone();
        async move {
            // Upstreams are still working on as many of this connection's
            // requests as it may have streams (its clients reset them, or
            // made tollgate reset them): no new one until they answer.
            if req.version() == http::Version::HTTP_2 && info.state.upstream_held() >= slots {
                return Err(h2::Error::from(h2::Reason::REFUSED_STREAM));
            }
            // Built in its box, as on the HTTP/1.x fast path: hyper moves
            // this future into a task of its own per HTTP/2 stream, and the
            // pipeline's future (kilobytes) would be copied along with it.
            let handled = Box::into_pin(Box::write(Box::new_uninit(), pipeline.handle(req, &info)));
            Ok::<_, h2::Error>(handled.await)
        }
    });
    let io = Linger::new(io, state.clone(), ctx.lingering_time, ctx.lingering_timeout);
    let io = super::h2frames::Counted::new(io, ctx.stats.clone());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    let graceful = |c: Pin<&mut _>| auto::UpgradeableConnection::graceful_shutdown(c);
    let drains = true;
    if let Some(Err(e)) = watch(conn, graceful, ctx, &state, peer, &mut shutdown, drains).await {
        // Logged once per connection, at debug: the client decides how
        // often this happens. An HTTP/2 connection that ended on anything
        // but an I/O error ended on the peer's protocol error (GOAWAY).
        if state.is_h2() && !caused_by_io(&*e) {
            state.protocol_error(crate::metrics::ProtocolError::Http2);
        }
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// Whether an I/O error is somewhere in `e`'s chain (a reset, a close).
fn caused_by_io(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if e.is::<std::io::Error>() {
            return true;
        }
        cause = e.source();
    }
    false
}

/// Drives `conn` (a connection being served) under the watchdog: its
/// output when it ends by itself, `None` when the watchdog closed it.
/// `graceful` asks it to finish what is in flight and close; with
/// `drains`, so does the server's drain (hyper's connections: HTTP/2 is
/// told GOAWAY, HTTP/1.1 closes after its answer; the fast path closes
/// after each answer by itself while draining, keeping idle connections
/// for their next request).
pub(super) async fn watch<C: Future>(
    mut conn: Pin<&mut C>,
    mut graceful: impl FnMut(Pin<&mut C>),
    ctx: &ListenerCtx,
    state: &ConnState,
    peer: SocketAddr,
    shutdown: &mut watch::Receiver<bool>,
    drains: bool,
) -> Option<C::Output> {
    let mut drain = ctx.drain.started.clone();
    let mut drain_live = drains;
    let idle_timeout = ctx.idle_timeout;
    let first_head = tokio::time::sleep(ctx.header_read_timeout);
    tokio::pin!(first_head);
    let mut awaiting_first = true;
    // Wakes the watchdog: idle connections, request heads that take too
    // long after the first, and responses nobody takes. Each limit is
    // seen within a quarter of it (half for send_timeout).
    let (send_timeout, head_timeout) = (ctx.send_timeout, ctx.header_read_timeout);
    let tick = (idle_timeout / 4)
        .min(send_timeout / 2)
        .min(head_timeout / 4)
        .max(Duration::from_millis(10));
    let idle = tokio::time::sleep(tick);
    tokio::pin!(idle);
    // The watchdog's last look: the activity count and since when it has
    // not moved; when a pending request head was first seen.
    let mut activity = 0;
    let mut quiet_since = tokio::time::Instant::now();
    let mut head_since: Option<tokio::time::Instant> = None;
    // Frames sent, and since when that count has not moved while a
    // response was being sent.
    let mut frames_seen = 0;
    let mut stalled_since: Option<tokio::time::Instant> = None;
    let mut closing = false;
    // An idle-closed HTTP/2 connection waits for the client to acknowledge
    // the GOAWAY ping; a client that never does is dropped after this.
    let hard_close = tokio::time::sleep(Duration::from_secs(3600));
    tokio::pin!(hard_close);
    let mut hard_close_armed = false;
    if *shutdown.borrow() || (drains && ctx.drain.draining()) {
        graceful(conn.as_mut());
        closing = true;
    }
    // The watchdog's timers and the shutdown signal wake the task through
    // their own waker, so the wake-ups a request's I/O causes (several per
    // request) poll the connection alone.
    let wake = Arc::new(WatchdogWake::default());
    let watchdog_waker = std::task::Waker::from(wake.clone());
    loop {
        // Every branch is (re)armed after an event: poll them all once.
        wake.woken.store(true, Ordering::Relaxed);
        let changed = shutdown.changed();
        tokio::pin!(changed);
        let live = drain_live;
        let drained = async {
            match live {
                true => drain.changed().await.is_ok(),
                false => std::future::pending().await,
            }
        };
        tokio::pin!(drained);
        let event = std::future::poll_fn(|cx| {
            if let Poll::Ready(res) = conn.as_mut().poll(cx) {
                return Poll::Ready(Event::Ended(res));
            }
            wake.task.register(cx.waker());
            if !wake.woken.swap(false, Ordering::AcqRel) {
                return Poll::Pending;
            }
            let mut cx = Context::from_waker(&watchdog_waker);
            if awaiting_first && first_head.as_mut().poll(&mut cx).is_ready() {
                return Poll::Ready(Event::FirstHead);
            }
            if hard_close_armed && hard_close.as_mut().poll(&mut cx).is_ready() {
                return Poll::Ready(Event::HardClose);
            }
            if !closing && changed.as_mut().poll(&mut cx).is_ready() {
                return Poll::Ready(Event::Shutdown);
            }
            if !closing {
                if let Poll::Ready(live) = drained.as_mut().poll(&mut cx) {
                    return Poll::Ready(Event::Drain(live));
                }
            }
            if !closing && idle.as_mut().poll(&mut cx).is_ready() {
                return Poll::Ready(Event::Tick);
            }
            Poll::Pending
        })
        .await;
        match event {
            Event::Ended(out) => return Some(out),
            Event::FirstHead => {
                awaiting_first = false;
                if !state.started() {
                    tracing::debug!(%peer, "no request head within header_read_timeout; closing");
                    break;
                }
            }
            Event::HardClose => {
                tracing::debug!(%peer, "idle connection did not close gracefully; dropping it");
                break;
            }
            Event::Shutdown => {
                graceful(conn.as_mut());
                closing = true;
            }
            // The server is gone (`false`): nothing more to hear.
            Event::Drain(false) => drain_live = false,
            Event::Drain(true) => {
                if ctx.drain.draining() {
                    graceful(conn.as_mut());
                    closing = true;
                }
            }
            Event::Tick => {
                let now = tokio::time::Instant::now();
                idle.as_mut().reset(now + tick);
                let seen = state.activity.load(Ordering::Relaxed);
                if seen != activity {
                    activity = seen;
                    quiet_since = now;
                    head_since = None;
                }
                if state.head_pending() {
                    // hyper's own per-request header timer is off (it costs
                    // a timer per request): this is the slowloris guard
                    // for every request head after the first.
                    if now - *head_since.get_or_insert(now) >= head_timeout {
                        tracing::debug!(%peer, "request head not complete within header_read_timeout; closing");
                        break;
                    }
                } else if !state.busy() && now - quiet_since >= idle_timeout {
                    tracing::debug!(%peer, "closing idle connection");
                    graceful(conn.as_mut());
                    closing = true;
                    hard_close.as_mut().reset(now + IDLE_CLOSE_BOUND);
                    hard_close_armed = true;
                }
                let frames = state.frames_sent.load(Ordering::Relaxed);
                if state.responding.load(Ordering::Relaxed) == 0 || frames != frames_seen {
                    frames_seen = frames;
                    stalled_since = None;
                } else if now - *stalled_since.get_or_insert(now) >= send_timeout {
                    tracing::debug!(%peer, "the client took nothing for send_timeout; closing");
                    break;
                }
            }
        }
    }
    None
}

/// What ended one wait of the connection loop.
enum Event<T> {
    Ended(T),
    FirstHead,
    HardClose,
    Shutdown,
    /// The drain's signal moved (`false`: its sender is gone).
    Drain(bool),
    Tick,
}

/// The waker of the watchdog's timers and of the shutdown signal: it
/// records that one of them (not the connection's I/O) woke the task.
#[derive(Default)]
struct WatchdogWake {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for WatchdogWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}
