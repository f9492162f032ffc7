//! The connection to Redis: one multiplexed, pipelined connection (one per
//! node for a cluster) that every request shares, a circuit breaker, and one
//! background task that reconnects and probes.
//!
//! - A request never opens a connection: when there is none, or the breaker
//!   is open, it fails at once and the limit's failure mode decides.
//! - `failures` consecutive errors or timeouts open the breaker. While it is
//!   open, one probe (reconnect if needed, then `PING`) runs every
//!   `probe_interval`; the first that succeeds closes it. One task, one
//!   attempt at a time: a Redis restart never meets a reconnect storm.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, RedisResult, Value};
use tokio::sync::Notify;

use crate::clock::Clock;

/// How to (re)connect.
// One per store: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Target {
    Single(redis::Client),
    Cluster(ClusterClient),
}

/// A live connection; cheap to clone, shared by concurrent requests.
#[derive(Clone)]
pub enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Target {
    pub async fn connect(&self, timeout: Duration) -> RedisResult<Conn> {
        let attempt = async {
            match self {
                Target::Single(client) => {
                    // Our own timeout bounds each call; the connection's
                    // must not cut a call we are still willing to wait for.
                    let config = AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(timeout))
                        .set_response_timeout(None);
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .map(Conn::Single)
                }
                Target::Cluster(client) => client.get_async_connection().await.map(Conn::Cluster),
            }
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(r) => r,
            Err(_) => Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connecting to Redis timed out",
            ))),
        }
    }
}

/// The current connection, the breaker, and the wake-up for the supervisor.
pub struct Link {
    pub target: Target,
    /// The connection and its generation: a late failure of an older
    /// connection must not drop a newer one.
    conn: Mutex<(u64, Option<Conn>)>,
    failures: AtomicU32,
    open: AtomicBool,
    threshold: u32,
    wake: Notify,
    /// Set when the store is dropped: the supervisor ends.
    closed: AtomicBool,
    /// A cluster's calls carry receipts (see `function::once`): this
    /// process's random name and its calls so far.
    receipts: Option<(u64, AtomicU64)>,
    /// What names a receipt's time bucket.
    clock: Clock,
}

/// Where a cluster call's answer is kept for its retries (see
/// `function::once`): a hash of the receipts of one time bucket, in the
/// slot of the call's keys, and the call's own field in it.
pub struct Receipt {
    /// The bucket's key: its first argument as a key.
    pub key: String,
    /// The call's last argument: `<field>:<ms to keep the bucket>`.
    pub last: String,
}

impl redis::ToRedisArgs for Receipt {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        self.key.write_redis_args(out);
    }
}

impl Link {
    pub fn new(target: Target, threshold: u32, clock: Clock) -> Self {
        use std::hash::{BuildHasher, Hasher};
        // Seeded from the OS's randomness, per process.
        let process = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Link {
            receipts: matches!(target, Target::Cluster(_)).then(|| (process, AtomicU64::new(0))),
            target,
            conn: Mutex::new((0, None)),
            failures: AtomicU32::new(0),
            open: AtomicBool::new(false),
            threshold,
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            clock,
        }
    }

    /// The connection to use now (with its generation), or why there is none.
    pub fn get(&self) -> Result<(u64, Conn), &'static str> {
        if self.open.load(Ordering::Relaxed) {
            return Err("circuit breaker open");
        }
        let slot = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        match &slot.1 {
            Some(c) => Ok((slot.0, c.clone())),
            None => {
                drop(slot);
                // Counts toward the breaker, so a lost Redis is reported
                // (and probed) even when no call was in flight as it went.
                self.failed(None);
                Err("not connected")
            }
        }
    }

    fn current(&self) -> Option<Conn> {
        self.conn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    pub fn set(&self, conn: Option<Conn>) {
        let mut slot = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        *slot = (slot.0 + 1, conn);
    }

    /// Drops the connection of generation `generation`, if still current.
    fn drop_generation(&self, generation: u64) {
        let mut slot = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if slot.0 == generation && slot.1.is_some() {
            *slot = (generation + 1, None);
            tracing::warn!("rate-limit store: connection to Redis lost; reconnecting");
        }
    }

    /// The receipt for a call whose first key is `key`, that may be
    /// retried for up to `timeout` (a cluster's calls only; none for a key
    /// without a hash tag).
    pub fn receipt(&self, key: &str, timeout: std::time::Duration) -> Option<Receipt> {
        let (process, calls) = self.receipts.as_ref()?;
        let call = calls.fetch_add(1, Ordering::Relaxed);
        let span = super::batch::keep(timeout);
        let bucket = self.clock.unix_ms() / span;
        Some(Receipt {
            key: super::function::receipt(key, bucket)?,
            last: format!("{process:x}.{call:x}:{}", 2 * span),
        })
    }

    pub fn is_cluster(&self) -> bool {
        self.receipts.is_some()
    }

    /// Connected and the breaker closed (asking counts as no failure).
    pub fn is_up(&self) -> bool {
        !self.open.load(Ordering::Relaxed) && self.current().is_some()
    }

    pub fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// Counts a failed call; `broken` names the generation of a connection
    /// that is itself gone.
    pub fn failed(&self, broken: Option<u64>) {
        if let Some(generation) = broken {
            self.drop_generation(generation);
            self.wake.notify_one();
        }
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.threshold && !self.open.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                failures = n,
                "rate-limit store: circuit breaker open; limits follow their on_error mode until Redis answers again"
            );
            self.wake.notify_one();
        }
    }

    /// Stops the supervisor and drops the connection.
    pub fn shut(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.set(None);
        self.wake.notify_one();
    }

    fn close_breaker(&self) {
        self.failures.store(0, Ordering::Relaxed);
        if self.open.swap(false, Ordering::Relaxed) {
            tracing::info!("rate-limit store: Redis answers again; circuit breaker closed");
        }
    }
}

/// Keeps `link` connected until it is shut: reconnects when the connection
/// broke, probes while the breaker is open.
pub async fn supervise(l: Arc<Link>, connect_timeout: Duration, probe_interval: Duration) {
    while !l.closed.load(Ordering::Relaxed) {
        let connected = l.current().is_some();
        if connected && !l.open.load(Ordering::Relaxed) {
            // Healthy: sleep until a call reports trouble.
            l.wake.notified().await;
            continue;
        }
        if !connected {
            match l.target.connect(connect_timeout).await {
                Ok(c) if !l.closed.load(Ordering::Relaxed) => {
                    l.set(Some(c));
                    tracing::info!("rate-limit store: connected to Redis");
                }
                Ok(_) => return,
                Err(e) => tracing::debug!(error = %e, "rate-limit store: reconnect failed"),
            }
        }
        if let Some(mut conn) = l.current() {
            let ping = tokio::time::timeout(
                connect_timeout,
                redis::cmd("PING").query_async::<String>(&mut conn),
            )
            .await;
            match ping {
                Ok(Ok(_)) => {
                    l.close_breaker();
                    continue;
                }
                Ok(Err(e)) if e.is_unrecoverable_error() || e.is_io_error() => l.set(None),
                _ => {}
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(probe_interval) => {}
            _ = l.wake.notified() => {}
        }
    }
}
