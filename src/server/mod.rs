//! The composition root: binds every configured address up front (so a
//! port clash fails at start, not at the first request), starts the
//! listeners' accept loops and the admin listener, and owns the server's
//! life: reloads (validate, then swap the request path and the listeners),
//! and shutdown.
//!
//! A global semaphore caps open connections across listeners: at the cap
//! tollgate stops calling `accept` and the kernel backlog queues newcomers.
//! Shutdown stops the accept loops, asks every connection to finish its
//! in-flight requests, and waits up to `server.shutdown_grace`.

mod carry;
mod watch_config;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::admin;
use crate::clock::Clock;
use crate::config::{Config, ListenerConfig, ServerConfig};
use crate::error::ConfigError;
use crate::limiter::engine::Engine;
use crate::listener::workers::Workers;
use crate::listener::{accept_loop, ListenerCtx};
use crate::pipeline::{Live, Pipeline};
use crate::reload::{ReloadError, ReloadHandle, ReloadReport, ReloadResult};

/// Bound sockets plus everything needed to serve them.
pub struct Server {
    listeners: Vec<Bound>,
    /// The admin listener, and who may use its protected endpoints.
    admin: Option<(TcpListener, admin::AdminAuth)>,
    live: Live,
    server: ServerConfig,
    /// What a reload cannot change (it warns instead): the admin
    /// listener's address and the log format and level.
    fixed: (Option<SocketAddr>, String),
    /// The file a reload reads (`None`: reloads are refused).
    source: Option<PathBuf>,
    reloads: (
        mpsc::Sender<oneshot::Sender<ReloadResult>>,
        mpsc::Receiver<oneshot::Sender<ReloadResult>>,
    ),
}

struct Bound {
    name: Arc<str>,
    bind: SocketAddr,
    listener: TcpListener,
    /// TLS acceptor and handshake timeout, for HTTPS listeners.
    tls: Option<(TlsAcceptor, Duration)>,
    proxy_protocol: bool,
}

/// A listener accepting: its context (swapped by reloads) and its stop.
struct Running {
    name: Arc<str>,
    bind: SocketAddr,
    /// Where it really listens (`bind` with port 0 resolved).
    addr: SocketAddr,
    ctx: Arc<ArcSwap<ListenerCtx>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
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

/// Binds every listener of `config` not in `skip` (already bound).
fn bind_listeners(
    config: &Config,
    skip: impl Fn(&str, SocketAddr) -> bool,
) -> Result<Vec<Bound>, BindError> {
    let mut bound = Vec::new();
    for l in &config.listeners {
        if skip(&l.name, l.bind) {
            continue;
        }
        let listener = bind_socket(l.bind).map_err(|source| BindError::Listen {
            name: l.name.clone(),
            addr: l.bind,
            source,
        })?;
        bound.push(Bound {
            name: Arc::from(l.name.as_str()),
            bind: l.bind,
            listener,
            tls: tls_of(l),
            proxy_protocol: l.proxy_protocol,
        });
    }
    Ok(bound)
}

fn tls_of(l: &ListenerConfig) -> Option<(TlsAcceptor, Duration)> {
    l.tls
        .as_ref()
        .map(|t| (TlsAcceptor::from(t.config.clone()), t.handshake_timeout))
}

impl Server {
    /// Binds all listeners and the admin port.
    pub async fn bind(config: Config) -> Result<Server, BindError> {
        Self::bind_with_clock(config, Clock::system()).await
    }

    /// Binds like [`Server::bind`], with every limit, expiry and cool-down
    /// on `clock` (tests pass a frozen one and advance it).
    pub async fn bind_with_clock(mut config: Config, clock: Clock) -> Result<Server, BindError> {
        let engine = Engine::open(config.store.redis.as_ref(), &config.store_zones, clock)
            .await
            .map_err(BindError::Store)?;
        let listeners = bind_listeners(&config, |_, _| false)?;
        let pipeline = Arc::new(Pipeline::new(&mut config, engine));
        let admin = match &config.admin {
            Some(a) => {
                let listener = bind_socket(a.bind).map_err(|source| BindError::Listen {
                    name: "admin".into(),
                    addr: a.bind,
                    source,
                })?;
                Some((listener, admin_auth(a)))
            }
            None => None,
        };
        Ok(Server {
            listeners,
            admin,
            live: Arc::new(ArcSwap::from(pipeline)),
            fixed: fixed_of(&config),
            server: config.server,
            source: None,
            reloads: mpsc::channel(8),
        })
    }

    /// Reloads read their config from `path` (what `run --config` names).
    pub fn with_source(mut self, path: PathBuf) -> Self {
        self.source = Some(path);
        self
    }

    /// Reloads the config file whenever it changes (`run --watch`), within
    /// a moment by notification, within `every` at worst.
    pub fn watch_source(&self, every: Duration) {
        if let Some(path) = &self.source {
            watch_config::watch(path.clone(), self.reload_handle(), every);
        }
    }

    /// A handle that asks the running server to reload its config file.
    pub fn reload_handle(&self) -> ReloadHandle {
        ReloadHandle {
            tx: self.reloads.0.clone(),
        }
    }

    /// `(listener name, bound address)`; the port is real even for `:0`.
    pub fn addrs(&self) -> Vec<(String, SocketAddr)> {
        addrs_of(&self.listeners)
    }

    /// The request path this server runs now, for in-process inspection.
    pub fn pipeline(&self) -> Arc<Pipeline> {
        self.live.load_full()
    }

    /// The running request path, as reloads swap it.
    pub fn live(&self) -> Live {
        self.live.clone()
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|(a, _)| a.local_addr().ok())
    }

    /// Serves until `shutdown` resolves, then drains. Reloads asked through
    /// [`Server::reload_handle`] are applied one at a time meanwhile.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server {
            listeners,
            admin,
            live,
            server,
            fixed,
            source,
            reloads: (reload_tx, mut reload_rx),
        } = self;
        let max = server.max_connections;
        let workers = match Workers::start(server.workers) {
            Ok(w) => Arc::new(w),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the worker threads; serving on one");
                Arc::new(Workers::single())
            }
        };
        tracing::info!(workers = workers.count(), "event loops serving connections");
        let mut state = State {
            workers,
            slots: Arc::new(Semaphore::new(max)),
            max,
            running: Vec::new(),
            live: live.clone(),
            server,
            fixed,
            source,
            listed: Arc::default(),
            drain: {
                let (tx, rx) = watch::channel(false);
                let on = Arc::new(AtomicBool::new(false));
                (tx, crate::listener::Drain { on, started: rx })
            },
        };
        let ready = Arc::new(AtomicBool::new(true));
        for b in listeners {
            state.start(b);
        }
        state.list();
        let admin_auth = Arc::new(ArcSwap::from_pointee(
            admin.as_ref().map(|(_, a)| a.clone()).unwrap_or_default(),
        ));
        let admin_task = admin.map(|(l, _)| {
            tokio::spawn(admin::serve(
                l,
                admin::AdminState {
                    ready: ready.clone(),
                    listeners: state.listed.clone(),
                    live: live.clone(),
                    auth: admin_auth.clone(),
                    reload: Some(ReloadHandle {
                        tx: reload_tx.clone(),
                    }),
                },
            ))
        });
        drop(reload_tx);

        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(reply) = reload_rx.recv() => {
                    let outcome = state.reload(&admin_auth).await;
                    let _ = reply.send(outcome);
                }
            }
        }
        ready.store(false, Ordering::SeqCst);
        // Drain: not ready, still serving, every answer moving its client
        // on; the load balancer stops sending meanwhile.
        let delay = state.server.drain_delay;
        if !delay.is_zero() {
            tracing::info!(
                drain_ms = delay.as_millis() as u64,
                "draining: /readyz answers 503, connections are served and told to close"
            );
            state.drain.1.on.store(true, Ordering::SeqCst);
            let _ = state.drain.0.send(true);
            tokio::time::sleep(delay).await;
        }
        tracing::info!(
            grace_ms = state.server.shutdown_grace.as_millis() as u64,
            "shutting down: no new connections, draining in-flight requests"
        );
        let mut stopped = Vec::new();
        for r in state.running.drain(..) {
            let _ = r.stop.send(true);
            stopped.push(r.task);
        }
        for t in stopped {
            let _ = t.await;
        }
        let all = u32::try_from(state.max).unwrap_or(u32::MAX);
        let slots = state.slots.clone();
        match tokio::time::timeout(state.server.shutdown_grace, slots.acquire_many(all)).await {
            Ok(_) => tracing::info!("all connections drained"),
            Err(_) => tracing::warn!(
                open = state.max - slots.available_permits(),
                "shutdown grace period over; closing the remaining connections"
            ),
        }
        if let Some(t) = admin_task {
            t.abort();
        }
    }
}

fn addrs_of(listeners: &[Bound]) -> Vec<(String, SocketAddr)> {
    listeners
        .iter()
        .filter_map(|b| {
            b.listener
                .local_addr()
                .ok()
                .map(|a| (b.name.to_string(), a))
        })
        .collect()
}

fn admin_auth(a: &crate::config::AdminConfig) -> admin::AdminAuth {
    admin::AdminAuth {
        token_hashes: a.token_hashes.clone(),
        protect_metrics: a.protect_metrics,
    }
}

/// What a running server changes on reload.
struct State {
    /// The event loops connections are served on.
    workers: Arc<Workers>,
    /// Connection slots across listeners (`max_connections`).
    slots: Arc<Semaphore>,
    max: usize,
    running: Vec<Running>,
    live: Live,
    server: ServerConfig,
    /// See `Server::fixed`.
    fixed: (Option<SocketAddr>, String),
    source: Option<PathBuf>,
    /// The listeners `/readyz` lists, kept current by reloads.
    listed: Arc<ArcSwap<Vec<(String, SocketAddr)>>>,
    /// The drain after SIGTERM: its signal, and what connections see.
    drain: (watch::Sender<bool>, crate::listener::Drain),
}

fn fixed_of(config: &Config) -> (Option<SocketAddr>, String) {
    (
        config.admin.as_ref().map(|a| a.bind),
        format!(
            "{:?} {} {}",
            config.log.format, config.log.level, config.server.workers
        ),
    )
}

impl State {
    fn ctx(
        &self,
        name: Arc<str>,
        index: usize,
        tls: Option<(TlsAcceptor, Duration)>,
        proxy_protocol: bool,
    ) -> ListenerCtx {
        let stats = self.live.load().metrics().listener_stats(index);
        ListenerCtx::new(
            name,
            tls,
            proxy_protocol,
            &self.server,
            self.live.clone(),
            stats,
            self.drain.1.clone(),
        )
    }

    /// Starts accepting on a bound listener.
    fn start(&mut self, b: Bound) {
        let addr = b.listener.local_addr().unwrap_or(b.bind);
        let index = self
            .live
            .load()
            .metrics()
            .listener_index(&b.name)
            .unwrap_or(usize::MAX);
        let ctx = Arc::new(ArcSwap::from_pointee(self.ctx(
            b.name.clone(),
            index,
            b.tls,
            b.proxy_protocol,
        )));
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(
            b.listener,
            self.workers.clone(),
            ctx.clone(),
            self.slots.clone(),
            stop_rx,
        ));
        self.running.push(Running {
            name: b.name,
            bind: b.bind,
            addr,
            ctx,
            stop,
            task,
        });
    }

    /// Reads the config file again and puts it in place, or keeps the
    /// running one and says why.
    async fn reload(&mut self, admin_auth: &ArcSwap<admin::AdminAuth>) -> ReloadResult {
        let outcome = match &self.source {
            None => Err(ReloadError::Failed(
                "this server was not started from a config file".into(),
            )),
            Some(path) => match Config::from_file(path) {
                Ok(config) => self.apply(config, admin_auth).await,
                Err(ConfigError::Invalid(problems)) => Err(ReloadError::Invalid(
                    problems.iter().map(|p| p.to_string()).collect(),
                )),
                Err(e) => Err(ReloadError::Failed(e.to_string())),
            },
        };
        let metrics = self.live.load().metrics().clone();
        metrics.reloaded(outcome.is_ok());
        match &outcome {
            Ok(r) => tracing::info!(
                listeners_added = ?r.listeners_added,
                listeners_removed = ?r.listeners_removed,
                routes_added = ?r.routes_added,
                routes_removed = ?r.routes_removed,
                limits_added = ?r.limits_added,
                limits_removed = ?r.limits_removed,
                limits_rescaled = ?r.limits_rescaled,
                limits_reset = ?r.limits_reset,
                warnings = ?r.warnings,
                "config reloaded"
            ),
            Err(ReloadError::Invalid(problems)) => {
                for p in problems {
                    tracing::error!(problem = %p, "config reload refused; the running config stays");
                }
            }
            Err(ReloadError::Failed(why)) => {
                tracing::error!(error = %why, "config reload failed; the running config stays")
            }
        }
        outcome
    }

    /// Puts `config` in place: new listeners bound first (a port in use
    /// fails the reload before anything changes), the request path
    /// swapped in one step, removed listeners drained.
    async fn apply(
        &mut self,
        mut config: Config,
        auth: &ArcSwap<admin::AdminAuth>,
    ) -> ReloadResult {
        let mut report = ReloadReport::default();
        let fixed = fixed_of(&config);
        if fixed.0 != self.fixed.0 {
            report
                .warnings
                .push("admin.bind and admin.enabled apply at the next restart".into());
        }
        if fixed.1 != self.fixed.1 {
            report
                .warnings
                .push("log.format, log.level and server.workers apply at the next restart".into());
        }
        let kept = |name: &str, bind: SocketAddr| {
            self.running
                .iter()
                .any(|r| &*r.name == name && r.bind == bind)
        };
        let added =
            bind_listeners(&config, kept).map_err(|e| ReloadError::Failed(e.to_string()))?;
        let old = self.live.load_full();
        let same_store = old.engine().redis().is_some() == config.store.redis.is_some();
        let carry = carry::carry(&old, &config, same_store, &mut report);
        let engine = old
            .engine()
            .reloaded(config.store.redis.as_ref(), &config.store_zones, &carry)
            .await
            .map_err(|e| ReloadError::Failed(format!("cannot set up the rate-limit store: {e}")))?;
        let old_routes: Vec<Arc<str>> = old.route_names();
        let new_routes: Vec<Arc<str>> = config.routes.iter().map(|r| r.name.clone()).collect();
        report.routes_added = new_routes
            .iter()
            .filter(|r| !old_routes.contains(r))
            .map(|r| r.to_string())
            .collect();
        report.routes_removed = old_routes
            .iter()
            .filter(|r| !new_routes.contains(r))
            .map(|r| r.to_string())
            .collect();
        let pipeline = Arc::new(Pipeline::reloaded(&mut config, engine, &old));
        // The swap: the next request sees the new config.
        self.live.store(pipeline);
        self.server = config.server.clone();
        self.resize_slots(config.server.max_connections);
        if let Some(a) = &config.admin {
            auth.store(Arc::new(admin_auth(a)));
        }
        // Listeners: keep (with new TLS and settings), stop, start.
        let mut still = Vec::new();
        for r in std::mem::take(&mut self.running) {
            match config
                .listeners
                .iter()
                .position(|l| *l.name == *r.name && l.bind == r.bind)
            {
                Some(i) => {
                    let l = &config.listeners[i];
                    r.ctx.store(Arc::new(self.ctx(
                        r.name.clone(),
                        i,
                        tls_of(l),
                        l.proxy_protocol,
                    )));
                    still.push(r);
                }
                None => {
                    report.listeners_removed.push(r.name.to_string());
                    // Stops accepting; its connections finish what they
                    // have in flight and close.
                    let _ = r.stop.send(true);
                }
            }
        }
        self.running = still;
        for b in added {
            report.listeners_added.push(b.name.to_string());
            self.start(b);
        }
        self.list();
        Ok(report)
    }

    /// Publishes the running listeners for `/readyz`.
    fn list(&self) {
        let listed = self
            .running
            .iter()
            .map(|r| (r.name.to_string(), r.addr))
            .collect();
        self.listed.store(Arc::new(listed));
    }

    /// Follows a changed `max_connections`: new slots at once; fewer as the
    /// open connections let them go.
    fn resize_slots(&mut self, max: usize) {
        if max > self.max {
            self.slots.add_permits(max - self.max);
        } else if max < self.max {
            let slots = self.slots.clone();
            let mut extra = self.max - max;
            extra -= slots.forget_permits(extra);
            if extra > 0 {
                tokio::spawn(async move {
                    if let Ok(p) = slots
                        .acquire_many_owned(u32::try_from(extra).unwrap_or(u32::MAX))
                        .await
                    {
                        p.forget();
                    }
                });
            }
        }
        self.max = max;
    }
}
