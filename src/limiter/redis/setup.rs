//! Setting the store up and reading its answers: the connection target,
//! the key suffixes per limit, the clients, the script's parameters per
//! algorithm and the decisions it returns.

use std::sync::Arc;

use super::super::memory::ZoneSpec;
use super::super::{Algorithm, Check, Decision, Verdict};
use super::conn::Target;
use super::{ConnectError, RedisOptions, STRIDE};

pub(super) fn target(options: &RedisOptions) -> Result<Target, ConnectError> {
    let certs = || redis::TlsCertificates {
        client_tls: None,
        root_cert: options.tls_ca.clone(),
    };
    if options.cluster {
        let mut builder = redis::cluster::ClusterClient::builder(options.nodes.clone())
            .connection_timeout(options.connect_timeout)
            // A redirect (a reshard, a failover) or a dropped connection
            // is retried, within the call's timeout; every script call
            // carries a receipt, so a retry never charges twice. Waits
            // before a retry (TRYAGAIN while a slot moves, CLUSTERDOWN in
            // a failover) from a few ms, doubling, never past a quarter of
            // the timeout (the client's default starts at 1.28 s).
            .retries(6)
            .min_retry_wait(1)
            .max_retry_wait((options.timeout.as_millis() as u64 / 4).max(2))
            .retry_wait_formula(5, 2);
        if options.tls_ca.is_some() {
            builder = builder.certs(certs());
        }
        return builder
            .build()
            .map(Target::Cluster)
            .map_err(|e| describe(&e));
    }
    let url = options.nodes.first().ok_or("no Redis URL")?;
    single_client(url, options)
        .map(Target::Single)
        .map_err(|e| describe(&e))
}

/// Per limit: its Redis key suffix. Its name when unique; for a name used
/// on several routes, `name@route` (stable when routes are added or
/// removed around it); `#index` is added only where route names repeat.
pub(super) fn suffixes(zones: &[ZoneSpec]) -> Arc<[String]> {
    let mut suffixes: Vec<String> = Vec::with_capacity(zones.len());
    for (i, z) in zones.iter().enumerate() {
        let named = |o: &&ZoneSpec| o.name == z.name;
        let suffix = if zones.iter().filter(named).count() == 1 {
            z.name.to_string()
        } else {
            let route = z.route.as_deref().unwrap_or("");
            let same_route = zones
                .iter()
                .filter(named)
                .filter(|o| o.route.as_deref().unwrap_or("") == route)
                .count();
            match (&z.route, same_route) {
                (Some(r), 1) => format!("{}@{r}", z.name),
                (None, 1) => z.name.to_string(),
                _ => format!("{}@{route}#{i}", z.name),
            }
        };
        suffixes.push(suffix);
    }
    suffixes.into()
}

/// A plain connection for the reset subscription: the URL, or on a
/// cluster its first seed (Redis Cluster carries publications to every
/// node).
pub(super) fn subscriber(options: &RedisOptions) -> Option<redis::Client> {
    single_client(options.nodes.first()?, options).ok()
}

/// A client for one node, over TLS with the configured CA when given.
pub(super) fn single_client(
    url: &str,
    options: &RedisOptions,
) -> redis::RedisResult<redis::Client> {
    match &options.tls_ca {
        Some(ca) => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.clone()),
            },
        ),
        None => redis::Client::open(url),
    }
}

/// A Redis error in words, without anything from the URL.
/// (Server errors redis-rs has no category for, such as NOPERM, are named
/// by their code.)
pub(super) fn describe(e: &redis::RedisError) -> String {
    let name = match e.category() {
        "" => e.code().unwrap_or("error"),
        category => category,
    };
    match e.detail() {
        Some(d) => format!("{name}: {d}"),
        None => e.to_string(),
    }
}

/// The script's arguments for an algorithm: tag and three numbers. A
/// calendar quota sends its period by this replica's clock, `now()`.
pub(super) fn params(a: &Algorithm, now: impl FnOnce() -> u64) -> (i64, i64, i64, i64) {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    match *a {
        Algorithm::Quota {
            limit,
            ref calendar,
        } => {
            let (start, end) = calendar.bounds(now());
            (7, n(limit), n(start), n(end))
        }
        Algorithm::FixedWindow { limit, window_ms } => (1, n(limit), n(window_ms), 0),
        Algorithm::SlidingWindow { limit, window_ms } => (2, n(limit), n(window_ms), 0),
        Algorithm::SlidingLog { limit, window_ms } => (3, n(limit), n(window_ms), 0),
        Algorithm::TokenBucket {
            amount,
            period_ms,
            burst,
        } => (4, n(amount), n(period_ms), n(burst)),
        Algorithm::Gcra {
            amount,
            period_ms,
            burst,
        } => (5, n(amount), n(period_ms), n(burst)),
        Algorithm::Leaky {
            rate_milli,
            burst,
            delay,
        } => (
            6,
            n(rate_milli),
            n(burst),
            if delay == u64::MAX { -1 } else { n(delay) },
        ),
    }
}

/// Decision numbers (three per decided check: code, remaining, reset ms)
/// -> decisions. The code is 0 when allowed, the delay in ms when allowed
/// after one, and -1 - the retry-after in ms when rejected.
pub(super) fn parse(checks: &[Check<'_>], values: &[i64], now: u64) -> Vec<Decision> {
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    values
        .chunks_exact(STRIDE)
        .zip(checks)
        .map(|(v, c)| {
            let (limit, window_ms) = c.limit.algorithm.policy_at(now);
            let (verdict, retry_after_ms) = match v[0] {
                0 => (Verdict::Allow, 0),
                code if code > 0 => (Verdict::Delay(n(code)), 0),
                code => (Verdict::Reject, n(-1 - code)),
            };
            Decision {
                verdict,
                limit,
                remaining: n(v[1]),
                reset_ms: n(v[2]),
                retry_after_ms,
                window_ms,
            }
        })
        .collect()
}
