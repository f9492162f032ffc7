//! Listeners: accept connections on a bound socket until told to stop
//! (the server, `server/`, binds them and owns their life), then serve
//! each: the PROXY protocol header from trusted peers, TLS, and HTTP
//! (`h1`, tollgate's HTTP/1.x server; `conn`, hyper for HTTP/2 and the
//! connections `h1` hands over), on one of the worker event loops.

pub(crate) mod conn;
pub(crate) mod h1;
mod h2frames;
pub(crate) mod linger;
pub(crate) mod proxy_protocol;
pub(crate) mod rewind;
pub(crate) mod workers;

// What the binary, the integration tests and the fuzz targets call.
pub use self::h1::{framing, read_request};
pub use self::proxy_protocol::{encode_v2, parse_v1, parse_v2};
pub use self::workers::event_loop;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::config::ServerConfig;
use crate::metrics::ListenerStats;
use crate::pipeline::client_ip::ClientIp;
use crate::pipeline::conn::{ConnInfo, ConnState};
use crate::pipeline::Live;
use workers::Workers;

/// Per-listener state shared by its connections; a reload that keeps the
/// listener replaces it (certificates re-read, new timeouts) for the
/// connections accepted after.
pub struct ListenerCtx {
    name: Arc<str>,
    tls: Option<(TlsAcceptor, Duration)>,
    builder: auto::Builder<TokioExecutor>,
    /// For connections whose TLS handshake chose `h2`: HTTP/2 only.
    builder_h2: auto::Builder<TokioExecutor>,
    live: Live,
    /// Connection counters, kept across reloads.
    stats: Arc<ListenerStats>,
    idle_timeout: Duration,
    /// Read a PROXY protocol header (from trusted peers only) first.
    proxy_protocol: bool,
    /// Time allowed for that header, and for the first request head.
    header_read_timeout: Duration,
    /// Bounds of a lingering close (see `linger`).
    lingering_time: Duration,
    lingering_timeout: Duration,
    /// A response the client takes nothing of for this long ends it.
    send_timeout: Duration,
    /// The largest request head and most headers the HTTP/1.1 fast path
    /// takes (what hyper would: past them the fast path answers 431).
    head_limits: h1::HeadLimits,
    /// The configured limits those are twice of, for the 431's detail.
    header_limits: h1::HeadLimits,
    /// The most requests of one HTTP/2 connection upstreams may be
    /// working on (`h2_max_concurrent_streams`): past it, new streams are
    /// refused.
    upstream_slots: usize,
    /// The server's drain after SIGTERM (`server.drain_delay`).
    drain: Drain,
}

/// The drain after SIGTERM as connections see it: while it lasts, every
/// HTTP/1.1 answer closes its connection and HTTP/2 connections are told
/// GOAWAY, so clients move to other replicas while nothing is refused.
#[derive(Clone, Debug)]
pub struct Drain {
    /// Read on each HTTP/1.1 answer of the fast path.
    pub on: Arc<std::sync::atomic::AtomicBool>,
    /// Woken when it starts, for connections hyper serves.
    pub started: watch::Receiver<bool>,
}

impl Drain {
    pub fn draining(&self) -> bool {
        self.on.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl ListenerCtx {
    /// The context of listener `name` on the server settings `s`.
    pub fn new(
        name: Arc<str>,
        tls: Option<(TlsAcceptor, Duration)>,
        proxy_protocol: bool,
        s: &ServerConfig,
        live: Live,
        stats: Arc<ListenerStats>,
        drain: Drain,
    ) -> ListenerCtx {
        ListenerCtx {
            drain,
            name,
            tls,
            builder: http_builder(s),
            builder_h2: http_builder(s).http2_only(),
            live,
            stats,
            idle_timeout: s.idle_timeout,
            proxy_protocol,
            header_read_timeout: s.header_read_timeout,
            lingering_time: s.lingering_time,
            lingering_timeout: s.lingering_timeout,
            send_timeout: s.send_timeout,
            head_limits: head_limits(s),
            header_limits: (s.max_header_bytes, s.max_headers),
            upstream_slots: s.h2_max_concurrent_streams as usize,
        }
    }
}

/// Headers past our own limit still get parsed, so the client gets
/// tollgate's 431 problem body from the pipeline; past these, the fast
/// path refuses the head itself, with the same body (hyper's bare 431 is
/// the backstop only on a connection already handed to it).
fn head_limits(s: &ServerConfig) -> h1::HeadLimits {
    (
        (s.max_header_bytes * 2).max(64 << 10),
        (s.max_headers * 2).max(100),
    )
}

/// Reads from `io` into `buf` and shows `seen` the bytes that arrived (a
/// stream wrapper that watches what passes).
pub(crate) fn poll_read_seen<I: tokio::io::AsyncRead + Unpin>(
    io: &mut I,
    cx: &mut std::task::Context<'_>,
    buf: &mut tokio::io::ReadBuf<'_>,
    seen: impl FnOnce(&[u8]),
) -> std::task::Poll<std::io::Result<()>> {
    let before = buf.filled().len();
    let polled = std::pin::Pin::new(io).poll_read(cx, buf);
    seen(&buf.filled()[before..]);
    polled
}

fn http_builder(s: &ServerConfig) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        // The connection watchdog times request heads (`conn`): hyper's
        // timer would cost a timer per request.
        .header_read_timeout(None)
        .keep_alive(true)
        .max_buf_size(head_limits(s).0)
        .max_headers(head_limits(s).1);
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(s.h2_max_concurrent_streams)
        .max_local_error_reset_streams(s.h2_max_reset_streams)
        .max_header_list_size(u32::try_from(s.max_header_bytes * 2).unwrap_or(u32::MAX));
    b
}

pub async fn accept_loop(
    listener: TcpListener,
    workers: Arc<Workers>,
    ctxs: Arc<ArcSwap<ListenerCtx>>,
    slots: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        if *stop.borrow() {
            return;
        }
        let at_cap = slots.available_permits() == 0;
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = stop.changed() => return,
        };
        if at_cap {
            ctxs.load().stats.waited_at_cap();
        }
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(listener = %ctxs.load().name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        // The context current when the connection arrives (a reload may
        // have replaced it while this loop waited).
        let ctx = ctxs.load_full();
        let stop = stop.clone();
        workers.spawn(tcp, move |tcp| async move {
            let _slot = permit;
            connection(tcp, peer, ctx, stop).await;
        });
    }
}

async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    ctx: Arc<ListenerCtx>,
    stop: watch::Receiver<bool>,
) {
    let _ = tcp.set_nodelay(true);
    if !ctx.proxy_protocol {
        return serve_stream(tcp, peer, ctx, stop).await;
    }
    // Boxed, like TLS below: a plain connection's task is sized for the
    // plain path alone (2.8 KiB rather than 6.6), which is what an
    // open connection costs between requests.
    Box::pin(proxied(tcp, peer, ctx, stop)).await
}

/// A connection on a PROXY protocol listener: the header first, then HTTP
/// for the client it names.
async fn proxied(
    tcp: TcpStream,
    peer: SocketAddr,
    ctx: Arc<ListenerCtx>,
    stop: watch::Receiver<bool>,
) {
    if !ctx.live.load().client_ip_config().is_trusted(peer.ip()) {
        tracing::debug!(%peer, listener = %ctx.name, "refusing a PROXY protocol connection from an untrusted peer");
        return;
    }
    let mut stream = BufReader::with_capacity(536, tcp);
    let source = tokio::time::timeout(
        ctx.header_read_timeout,
        proxy_protocol::read_header(&mut stream),
    )
    .await;
    match source {
        Ok(Ok(source)) => {
            let client = source.unwrap_or(peer);
            serve_stream(stream, client, ctx, stop).await
        }
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "bad PROXY protocol header; closing"),
        Err(_) => tracing::debug!(%peer, "no PROXY protocol header in time; closing"),
    }
}

/// TLS (when configured) and HTTP on a stream whose client is `peer`.
async fn serve_stream<I>(
    io: I,
    peer: SocketAddr,
    ctx: Arc<ListenerCtx>,
    stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let info = Arc::new(ConnInfo {
        listener: ctx.name.clone(),
        peer,
        client: ClientIp::new(peer.ip()),
        tls: ctx.tls.is_some(),
        state: Arc::new(ConnState::new(ctx.stats.clone())),
    });
    match &ctx.tls {
        // HTTP/1.x, or HTTP/2 with prior knowledge (which `h1` hands to
        // hyper on seeing its preface).
        None => h1::serve(io, &ctx, info, stop).await,
        // A TLS stream is large (its session state is inline): boxed, so
        // that plain connections' tasks do not carry room for it.
        Some((acceptor, handshake_timeout)) => {
            Box::pin(serve_tls(
                io,
                acceptor,
                *handshake_timeout,
                &ctx,
                info,
                stop,
            ))
            .await
        }
    }
}

/// The TLS handshake, then HTTP over it.
async fn serve_tls<I>(
    io: I,
    acceptor: &TlsAcceptor,
    handshake_timeout: Duration,
    ctx: &ListenerCtx,
    info: Arc<ConnInfo>,
    stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = info.peer;
    match tokio::time::timeout(handshake_timeout, acceptor.accept(crate::tls::SendOne(io))).await {
        Ok(Ok(tls)) => {
            let session = tls.get_ref().1;
            ctx.stats
                .tls_handshaked(session.handshake_kind() == Some(rustls::HandshakeKind::Resumed));
            if session.alpn_protocol() == Some(b"h2") {
                conn::serve_h2(tls, ctx, info, stop).await
            } else {
                h1::serve(tls, ctx, info, stop).await
            }
        }
        Ok(Err(e)) => {
            ctx.stats.tls_failed();
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
        }
        Err(_) => {
            ctx.stats.tls_failed();
            tracing::debug!(%peer, "TLS handshake timed out");
        }
    }
}
