//! Listeners: bind every configured address up front (so a port clash fails
//! at start, not at the first request), then accept until shutdown.
//!
//! A global semaphore caps open connections across listeners: at the cap
//! tollgate stops calling `accept` and the kernel backlog queues newcomers.
//! Shutdown stops the accept loops, asks every connection to finish its
//! in-flight requests, and waits up to `server.shutdown_grace`.

pub mod conn;
pub mod linger;
pub mod proxy_protocol;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::admin;
use crate::config::{Config, ServerConfig};
use crate::limiter::engine::Engine;
use crate::pipeline::client_ip::ClientIp;
use crate::pipeline::{ConnInfo, Pipeline};
use conn::ConnState;

/// Bound sockets plus everything needed to serve them.
pub struct Server {
    listeners: Vec<Bound>,
    /// The admin listener, and who may use its protected endpoints.
    admin: Option<(TcpListener, admin::AdminAuth)>,
    pipeline: Arc<Pipeline>,
    server: ServerConfig,
}

struct Bound {
    name: Arc<str>,
    listener: TcpListener,
    /// TLS acceptor and handshake timeout, for HTTPS listeners.
    tls: Option<(TlsAcceptor, Duration)>,
    proxy_protocol: bool,
}

/// Per-listener state shared by its connections.
struct ListenerCtx {
    name: Arc<str>,
    /// Position in the config's listeners, for metrics.
    index: usize,
    tls: Option<(TlsAcceptor, Duration)>,
    builder: auto::Builder<TokioExecutor>,
    pipeline: Arc<Pipeline>,
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
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("cannot listen on {addr} ({name}): {source}")]
    Listen {
        name: String,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot set up the rate-limit store: {0}")]
    Store(String),
}

fn bind_socket(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

impl Server {
    /// Binds all listeners and the admin port.
    pub async fn bind(mut config: Config) -> Result<Server, BindError> {
        let engine = Engine::open(config.store.redis.as_ref(), &config.store_zones)
            .await
            .map_err(BindError::Store)?;
        let pipeline = Arc::new(Pipeline::new(&mut config, engine));
        let mut listeners = Vec::new();
        for l in &config.listeners {
            let listener = bind_socket(l.bind).map_err(|source| BindError::Listen {
                name: l.name.clone(),
                addr: l.bind,
                source,
            })?;
            let tls = l
                .tls
                .as_ref()
                .map(|t| (TlsAcceptor::from(t.config.clone()), t.handshake_timeout));
            listeners.push(Bound {
                name: Arc::from(l.name.as_str()),
                listener,
                tls,
                proxy_protocol: l.proxy_protocol,
            });
        }
        let admin = match &config.admin {
            Some(a) => {
                let listener = bind_socket(a.bind).map_err(|source| BindError::Listen {
                    name: "admin".into(),
                    addr: a.bind,
                    source,
                })?;
                let auth = admin::AdminAuth {
                    token_hashes: a.token_hashes.clone(),
                    protect_metrics: a.protect_metrics,
                };
                Some((listener, auth))
            }
            None => None,
        };
        Ok(Server {
            listeners,
            admin,
            pipeline,
            server: config.server,
        })
    }

    /// `(listener name, bound address)`; the port is real even for `:0`.
    pub fn addrs(&self) -> Vec<(String, SocketAddr)> {
        self.listeners
            .iter()
            .filter_map(|b| {
                b.listener
                    .local_addr()
                    .ok()
                    .map(|a| (b.name.to_string(), a))
            })
            .collect()
    }

    /// The request path this server runs, for in-process inspection.
    pub fn pipeline(&self) -> Arc<Pipeline> {
        self.pipeline.clone()
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|(a, _)| a.local_addr().ok())
    }

    /// Serves until `shutdown` resolves, then drains.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let (stop_tx, stop_rx) = watch::channel(false);
        let max = self.server.max_connections;
        let slots = Arc::new(Semaphore::new(max));
        let ready = Arc::new(AtomicBool::new(true));
        let listed: Vec<(String, SocketAddr)> = self.addrs();

        let mut accept_loops = tokio::task::JoinSet::new();
        for (index, b) in self.listeners.into_iter().enumerate() {
            let ctx = Arc::new(ListenerCtx {
                name: b.name,
                index,
                tls: b.tls,
                builder: http_builder(&self.server),
                pipeline: self.pipeline.clone(),
                idle_timeout: self.server.idle_timeout,
                proxy_protocol: b.proxy_protocol,
                header_read_timeout: self.server.header_read_timeout,
                lingering_time: self.server.lingering_time,
                lingering_timeout: self.server.lingering_timeout,
                send_timeout: self.server.send_timeout,
            });
            accept_loops.spawn(accept_loop(b.listener, ctx, slots.clone(), stop_rx.clone()));
        }
        let admin_task = self.admin.map(|(l, auth)| {
            tokio::spawn(admin::serve(
                l,
                admin::AdminState {
                    ready: ready.clone(),
                    listeners: listed,
                    pipeline: self.pipeline.clone(),
                    auth,
                },
            ))
        });

        shutdown.await;
        tracing::info!(
            grace_ms = self.server.shutdown_grace.as_millis() as u64,
            "shutting down: no new connections, draining in-flight requests"
        );
        ready.store(false, Ordering::SeqCst);
        let _ = stop_tx.send(true);
        while accept_loops.join_next().await.is_some() {}

        let all = u32::try_from(max).unwrap_or(u32::MAX);
        match tokio::time::timeout(self.server.shutdown_grace, slots.acquire_many(all)).await {
            Ok(_) => tracing::info!("all connections drained"),
            Err(_) => tracing::warn!(
                open = max - slots.available_permits(),
                "shutdown grace period over; closing the remaining connections"
            ),
        }
        if let Some(t) = admin_task {
            t.abort();
        }
    }
}

fn http_builder(s: &ServerConfig) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(s.header_read_timeout)
        .keep_alive(true)
        // Headers past our own limit still get parsed, so the client gets
        // tollgate's 431 problem body; hyper's bare 431 is the backstop.
        .max_buf_size((s.max_header_bytes * 2).max(64 << 10))
        .max_headers((s.max_headers * 2).max(100));
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(s.h2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(s.max_header_bytes * 2).unwrap_or(u32::MAX));
    b
}

async fn accept_loop(
    listener: TcpListener,
    ctx: Arc<ListenerCtx>,
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
            ctx.pipeline.metrics().waited_at_cap(ctx.index);
        }
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(listener = %ctx.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let ctx = ctx.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
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
    if !ctx.pipeline.client_ip_config().is_trusted(peer.ip()) {
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
        state: Arc::new(ConnState::new(ctx.pipeline.metrics().clone(), ctx.index)),
    });
    match &ctx.tls {
        None => conn::serve(io, &ctx, info, stop).await,
        Some((acceptor, handshake_timeout)) => {
            match tokio::time::timeout(*handshake_timeout, acceptor.accept(io)).await {
                Ok(Ok(tls)) => conn::serve(tls, &ctx, info, stop).await,
                Ok(Err(e)) => {
                    ctx.pipeline.metrics().tls_failed(ctx.index);
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                }
                Err(_) => {
                    ctx.pipeline.metrics().tls_failed(ctx.index);
                    tracing::debug!(%peer, "TLS handshake timed out");
                }
            }
        }
    }
}
