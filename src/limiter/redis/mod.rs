//! The Redis store: N replicas enforce one limit exactly.
//!
//! - Every algorithm runs inside one Lua script (`decide.lua`) that decides
//!   all the limits of a request atomically, clocked by Redis `TIME`, and
//!   writes every key with a TTL in the same step. It is called as a Redis
//!   function where the server has them, else by `EVALSHA` ([`function`]);
//!   after a restart or a flush the "not found" answer makes the client load
//!   it once more and retry.
//! - Keys are `<prefix>{<key>}:<limit>`, e.g. `tollgate:{ip:203.0.113.7}:api`:
//!   the client key is the hash tag, so on Redis Cluster all limits of one
//!   client key share a slot.
//! - On a single node a request costs at most one round trip, whatever its
//!   limits; under load concurrent requests share script calls ([`batch`]),
//!   on a cluster one call per slot, calls to one node written together.
//!   On a cluster, checks on different client keys (a zone by IP and a limit
//!   by user) live in different slots: each slot's part is decided by its
//!   own script call, all in parallel, each all-or-nothing within itself;
//!   when one part refuses a group that another part admitted, the admitted
//!   part's charges are given back (`refund.lua`). A limit is never
//!   exceeded; for an instant a refused request may hold quota that a
//!   concurrent request on the admitted key could then not get.
//! - Every call is bounded by `timeout`; failures feed the circuit breaker
//!   in [`conn`]. What a failed decision turns into is the caller's
//!   business (the limit's `on_error`).
//! - Keys Redis rejected are remembered until their retry time ([`cache`]).

mod batch;
mod cache;
mod cluster;
mod conn;
mod conns;
mod function;
mod keys;
mod lease;
mod nodes;
mod overrides;
mod penalty;
mod resets;
mod setup;
mod spec;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Script;

use super::memory::ZoneSpec;
use super::{Check, Decision, LimiterError, Outcome, Store};
use crate::clock::Clock;
use batch::Batcher;
use cache::{cached_cut, cached_rejection, remember, Cut, RejectCache};
use conn::Link;
pub use conns::SharedSlot;
use function::Decide;

use overrides::overrides_keys;
use setup::{describe, parse, subscriber, suffixes, target};

const DECIDE: &str = include_str!("decide.lua");
/// How often ended lease slices are given back.
const SWEEP: Duration = Duration::from_millis(200);
const REFUND: &str = include_str!("refund.lua");
/// Numbers per decision in the script's answer: its code, remaining and
/// reset (see [`parse`]).
const STRIDE: usize = 3;

/// How to reach Redis and how patient to be (`store` in the config).
#[derive(Clone, PartialEq)]
pub struct RedisOptions {
    /// One URL, or a cluster's seed nodes.
    pub nodes: Vec<String>,
    pub cluster: bool,
    pub prefix: String,
    pub timeout: Duration,
    pub connect_timeout: Duration,
    pub breaker_failures: u32,
    pub probe_interval: Duration,
    pub cache_rejections: bool,
    /// PEM of a private CA, for `rediss://`.
    pub tls_ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for RedisOptions {
    // URLs may carry a password: never print them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(|n| redact_url(n)).collect();
        write!(
            f,
            "{}({})",
            if self.cluster { "Cluster" } else { "Redis" },
            nodes.join(", ")
        )
    }
}

/// `decide.lua` as this store sends it, for tests that call it directly:
/// the function library, the name of its function, and the script.
pub fn decide_forms() -> (String, String, Script) {
    let decide = Decide::new(DECIDE);
    let (library, function) = (decide.library(), decide.function());
    (
        library.to_owned(),
        function.to_owned(),
        decide.script().clone(),
    )
}

/// `decide.lua` as a cluster is sent it, run once per receipt (see
/// `function::once`): keys, then the receipt's key; arguments, then how
/// long to keep the receipt (ms). For tests that call it directly.
pub fn cluster_decide() -> Script {
    Decide::for_cluster(DECIDE).script().clone()
}

/// The function library a cluster's node calls load on each primary (see
/// `nodes`), and its function's name: `FCALL <name> 0 <n> <keys...>
/// <receipt> <clock> <specs...> <keep ms>`. For tests.
pub fn cluster_node_decide() -> (String, String) {
    let decide = Decide::for_cluster(DECIDE);
    decide
        .by_node()
        .map(|f| (f.library.clone(), f.function.clone()))
        .unwrap_or_default()
}

/// `redis://user:secret@host:6379/0` -> `redis://host:6379/0`.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

pub struct RedisStore {
    link: Arc<Link>,
    decide: Arc<Decide>,
    refund: Script,
    prefix: String,
    /// Per limit (zone index): the key suffix, its name when unique.
    suffixes: Arc<[String]>,
    timeout: Duration,
    cluster: bool,
    cache: Option<Arc<RejectCache>>,
    /// Shared by the stores reloads derive from this one: the last dropped
    /// closes the connection.
    _alive: Option<Arc<Alive>>,
    options: RedisOptions,
    /// Script calls sent, for benchmarks and tests.
    calls: Arc<AtomicU64>,
    /// This replica's clock: a calendar quota's period as it sees it.
    clock: Clock,
    /// This replica's slices of hot keys' budgets (`lease:`); a reload
    /// starts a new table (the old one's units are given back).
    leases: Arc<lease::Leases>,
    /// Shared `max_conn` slots held by this process (kept across reloads).
    conns: Arc<conns::Conns>,
    /// Requests queued into shared script calls (on a cluster, one per
    /// slot per batch).
    batcher: Batcher,
}

/// Redis could not be reached or did not answer; `Display` never shows a
/// password.
pub type ConnectError = String;

impl RedisStore {
    /// Builds the store and starts its supervisor. When Redis is not there
    /// yet the store still starts (limits follow `on_error`) and keeps
    /// trying in the background; the error is returned for logging.
    pub async fn connect(
        options: &RedisOptions,
        zones: &[ZoneSpec],
        clock: &Clock,
    ) -> Result<(Self, Option<ConnectError>), ConnectError> {
        let target = target(options)?;
        let link = Arc::new(Link::new(target, options.breaker_failures, clock.clone()));
        let first = link.target.connect(options.connect_timeout).await;
        let warning = match first {
            Ok(c) => {
                link.set(Some(c));
                None
            }
            Err(e) => Some(describe(&e)),
        };
        tokio::spawn(conn::supervise(
            link.clone(),
            options.connect_timeout,
            options.probe_interval,
        ));
        let suffixes = suffixes(zones);
        let cache = options
            .cache_rejections
            .then(|| Arc::new(RejectCache::new(clock.clone())));
        let resets = match (&cache, subscriber(options)) {
            (Some(cache), Some(client)) => Some(
                tokio::spawn(resets::listen(
                    client,
                    resets::channel(&options.prefix),
                    Arc::downgrade(cache),
                    options.probe_interval,
                ))
                .abort_handle(),
            ),
            _ => None,
        };
        let calls = Arc::new(AtomicU64::new(0));
        let (decide, refund) = if options.cluster {
            (
                Decide::for_cluster(DECIDE),
                Script::new(&function::once(REFUND)),
            )
        } else {
            (Decide::new(DECIDE), Script::new(REFUND))
        };
        let decide = Arc::new(decide);
        let store = RedisStore {
            link: link.clone(),
            decide: decide.clone(),
            refund,
            prefix: options.prefix.clone(),
            suffixes,
            timeout: options.timeout,
            cluster: options.cluster,
            cache,
            _alive: Some(Arc::new(Alive {
                link: link.clone(),
                resets,
            })),
            options: options.clone(),
            batcher: Batcher::start(
                link.clone(),
                decide,
                options.timeout,
                calls.clone(),
                overrides_keys(&options.prefix).1.into(),
            ),
            calls,
            clock: clock.clone(),
            leases: Arc::default(),
            conns: Arc::new(conns::Conns::new(link.clone(), options.timeout)),
        };
        store.sweep_leases(SWEEP);
        store.renew_conns();
        Ok((store, warning))
    }

    /// Whether decisions can reach Redis now (connected, breaker closed).
    pub fn is_up(&self) -> bool {
        self.link.is_up()
    }

    /// The same connection, scripts and rejection cache (emptied: cached
    /// retry times follow the old limits) for a reloaded config's limits.
    pub fn reloaded(&self, zones: &[ZoneSpec]) -> RedisStore {
        if let Some(cache) = &self.cache {
            cache.clear();
        }
        let store = RedisStore {
            suffixes: suffixes(zones),
            leases: Arc::default(),
            ..self.reloaded_parts()
        };
        store.sweep_leases(SWEEP);
        store
    }

    /// A copy of every part.
    fn reloaded_parts(&self) -> RedisStore {
        RedisStore {
            link: self.link.clone(),
            decide: self.decide.clone(),
            refund: self.refund.clone(),
            prefix: self.prefix.clone(),
            suffixes: self.suffixes.clone(),
            timeout: self.timeout,
            cluster: self.cluster,
            cache: self.cache.clone(),
            _alive: self._alive.clone(),
            options: self.options.clone(),
            calls: self.calls.clone(),
            batcher: self.batcher.clone(),
            clock: self.clock.clone(),
            leases: self.leases.clone(),
            conns: self.conns.clone(),
        }
    }

    /// The same store for a task of its own that must not keep the
    /// connection open: it holds the returned link to the store's life
    /// (gone when the store and every reload of it are dropped).
    fn handle(&self) -> (RedisStore, std::sync::Weak<Alive>) {
        let alive = self._alive.as_ref().map(Arc::downgrade).unwrap_or_default();
        // (no slices: a long-lived task must not keep a replaced lease
        // table alive, see `sweep_leases`)
        let handle = RedisStore {
            _alive: None,
            cache: None,
            leases: Arc::default(),
            ..self.reloaded_parts()
        };
        (handle, alive)
    }

    /// The options it was connected with (a reload that changes them
    /// connects anew).
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// The clock scripts decide at: 0 for Redis `TIME`; a test's frozen
    /// clock (so tests move periods and bans by the clock, never by
    /// sleeping).
    pub(super) fn pinned(&self) -> u64 {
        if self.clock.is_frozen() {
            self.clock.unix_ms()
        } else {
            0
        }
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// How decisions reach Redis: `"function"` (a function library, Redis
    /// 7 and later), `"script"` (`EVALSHA`), or `None` before the first.
    pub fn sent_as(&self) -> Option<&'static str> {
        self.decide
            .as_function()
            .map(|f| if f { "function" } else { "script" })
    }

    /// Script calls sent to Redis so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// `INFO`, then loads the script and (one node) the function library:
    /// what `tollgate check --connect` runs. The server's version, and what
    /// was loaded.
    pub async fn check_connection(&self) -> Result<(String, String), ConnectError> {
        let mut conn = match self.link.get() {
            Ok((_, c)) => c,
            Err(_) => self
                .link
                .target
                .connect(Duration::from_secs(5))
                .await
                .map_err(|e| describe(&e))?,
        };
        let ping = async {
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut conn)
                .await?;
            self.decide
                .script()
                .prepare_invoke()
                .load_async(&mut conn)
                .await?;
            let loaded = if self.cluster {
                "script loaded (a cluster decides by EVALSHA)".to_owned()
            } else {
                match self.decide.load(&mut conn).await? {
                    None => "script and function loaded".to_owned(),
                    Some(why) => format!(
                        "script loaded; FUNCTION LOAD refused ({why}), so decisions go by EVALSHA"
                    ),
                }
            };
            Ok::<_, redis::RedisError>((info, loaded))
        };
        let (info, loaded) = tokio::time::timeout(Duration::from_secs(5), ping)
            .await
            .map_err(|_| "Redis did not answer within 5s".to_owned())?
            .map_err(|e| describe(&e))?;
        let version = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("unknown")
            .trim()
            .to_owned();
        Ok((version, loaded))
    }

    /// The Redis key of one check.
    pub fn key(&self, check: &Check<'_>) -> String {
        let mut key = String::new();
        self.write_key(check, &mut key);
        key
    }

    /// Appends the Redis key of one check, `<prefix>{<key>}:<suffix>`.
    fn write_key(&self, check: &Check<'_>, out: &mut String) {
        let suffix = &self.suffixes[check.limit.zone];
        out.reserve(self.prefix.len() + check.key.len() + suffix.len() + 3);
        out.push_str(&self.prefix);
        out.push('{');
        out.push_str(check.key);
        out.push_str("}:");
        out.push_str(suffix);
    }

    /// Decides like [`Store::decide`], at `now` ms instead of Redis `TIME`
    /// when `now` is not 0 (tests replay traces with it).
    pub async fn decide_clocked(
        &self,
        checks: &[Check<'_>],
        now: u64,
    ) -> Result<Outcome, LimiterError> {
        if lease::leased(checks) {
            return self.decide_leased(checks, now).await;
        }
        self.decide_direct(checks, now).await
    }

    /// `[taken, returned, spent]`: units taken from Redis in slices, given
    /// back, and decisions made from a slice.
    pub fn lease_units(&self) -> [u64; 3] {
        self.leases.units()
    }

    /// Decides every check in Redis (the rejection cache aside).
    async fn decide_direct(&self, checks: &[Check<'_>], now: u64) -> Result<Outcome, LimiterError> {
        let Some(cache) = &self.cache else {
            return Ok(Outcome::of(self.send(checks, now).await?));
        };
        let local_now = cache.now();
        let outcome = match cached_cut(cache, &self.suffixes, checks, local_now) {
            Some(cut) => self.decide_around(checks, now, cut).await?,
            None => Outcome::of(self.send(checks, now).await?),
        };
        remember(cache, &self.suffixes, checks, &outcome.decisions, local_now);
        Ok(outcome)
    }

    /// Decides with the group at `cut` known to be rejected: the groups
    /// before it go to Redis as usual, its other checks go as peeks (so the
    /// response headers are true), and its cached checks are answered here.
    async fn decide_around(
        &self,
        checks: &[Check<'_>],
        now: u64,
        Cut { start, waits }: Cut,
    ) -> Result<Outcome, LimiterError> {
        let end = start + waits.len();
        let mut sent: Vec<Check<'_>> = checks[..start].to_vec();
        for (c, hit) in checks[start..end].iter().zip(&waits) {
            if hit.is_none() {
                sent.push(Check { peek: true, ..*c });
            }
        }
        let decided = if sent.is_empty() {
            Vec::new()
        } else {
            self.send(&sent, now).await?
        };
        if decided.len() < sent.len() {
            // An earlier group refused: the outcome ends there.
            return Ok(Outcome::of(decided));
        }
        let mut decisions = decided[..start].to_vec();
        let mut peeked = decided[start..].iter();
        for (c, hit) in checks[start..end].iter().zip(&waits) {
            match hit {
                Some(wait) => decisions.push(cached_rejection(&c.limit.algorithm, *wait)),
                None => decisions.extend(peeked.next().copied()),
            }
        }
        Ok(Outcome::of(decisions))
    }

    /// Decides one request's checks: through the batcher, or in a call of
    /// its own (a pinned clock).
    async fn call(
        &self,
        checks: &[Check<'_>],
        now: u64,
    ) -> Result<(u64, Vec<Decision>), LimiterError> {
        let job = self.job(checks, now);
        let answer = match now {
            0 => {
                let reply = self.batcher.submit(job);
                match tokio::time::timeout(self.timeout, reply).await {
                    Ok(Ok(answer)) => answer,
                    Ok(Err(_)) => Err(("the store is shutting down".to_owned(), false)),
                    Err(_) => {
                        self.link.failed(None);
                        return Err(LimiterError::Timeout(self.timeout.as_millis() as u64));
                    }
                }
            }
            _ => batch::call(
                &self.link,
                &self.decide,
                &self.calls,
                (now, &overrides_keys(&self.prefix).1),
                &[job],
                self.timeout,
            )
            .await
            .map(|mut each| each.pop().unwrap_or_default()),
        };
        let (stamp, values) = answer.map_err(|(why, _)| match why.as_str() {
            batch::STALE => LimiterError::Stale,
            _ => LimiterError::Unavailable(why),
        })?;
        Ok((stamp, parse(checks, &values, stamp)))
    }
}

/// What ends with the last store sharing a connection.
struct Alive {
    link: Arc<Link>,
    /// Listens for resets made on other replicas (with the cache).
    resets: Option<tokio::task::AbortHandle>,
}

impl Drop for Alive {
    fn drop(&mut self) {
        if let Some(r) = &self.resets {
            r.abort();
        }
        self.link.shut();
    }
}

impl Store for RedisStore {
    fn decide<'a>(
        &'a self,
        checks: &'a [Check<'a>],
    ) -> impl std::future::Future<Output = Result<Outcome, LimiterError>> + Send + 'a {
        self.decide_clocked(checks, self.pinned())
    }
}

#[cfg(test)]
mod tests;
