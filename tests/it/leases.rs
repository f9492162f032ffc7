//! Leases for hot keys (`lease:`): three tollgate processes share a key's
//! budget through a Redis Cluster of three primaries with a replica each
//! (and through one Redis). A key driven at ten times its limit admits at
//! most the limit, at under 0.05 Redis calls a request; a cold key beside
//! it is decided request by request, exactly.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::*;

const LIMIT: usize = 300;
const SLICE: usize = 50;

/// `/hot` (`hot`: its algorithm and numbers) and `/cold` (a sliding
/// window), each per `x-who` with a lease held 500 ms; failing closed.
fn leased_config(store: &str, hot: &str) -> String {
    format!(
        "store: {{ {store}, timeout: 2s, on_error: fail_closed }}
routes:
  - name: hot
    match: {{ path_prefix: /hot }}
    respond: {{ body: \"ok\\n\" }}
    limits: [{{ name: hot, {hot}, key: 'header:x-who', lease: {{ slice: {SLICE}, hold: 500ms }} }}]
  - name: cold
    match: {{ path_prefix: /cold }}
    respond: {{ body: \"ok\\n\" }}
    limits: [{{ name: cold, algorithm: sliding_window, key: 'header:x-who', limit: 5, window: 1h, lease: {{ slice: 5, hold: 500ms }} }}]
"
    )
}

/// Requests on `path` as `who` from 24 clients spread over `addrs`, until
/// `n` are sent or `within` passes: the statuses.
async fn drive(
    addrs: &[SocketAddr],
    path: &str,
    who: &str,
    n: usize,
    within: Duration,
) -> Vec<u16> {
    let ends = Instant::now() + within;
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut clients = tokio::task::JoinSet::new();
    for k in 0..24 {
        let (addr, path, who, sent) = (
            addrs[k % addrs.len()],
            path.to_owned(),
            who.to_owned(),
            sent.clone(),
        );
        clients.spawn(async move {
            let mut c = h1(addr).await;
            let mut seen = Vec::new();
            while Instant::now() < ends
                && sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n
            {
                let mut req = request("GET", &path, empty());
                req.headers_mut().insert("x-who", who.parse().unwrap());
                seen.push(send1(&mut c, req).await.status.as_u16());
            }
            seen
        });
    }
    let mut statuses = Vec::new();
    while let Some(seen) = clients.join_next().await {
        statuses.extend(seen.unwrap());
    }
    statuses
}

/// The hot key at ten times its limit, then the cold key: see the module
/// docs. `calls` reads the script calls Redis has run.
async fn hot_and_cold(replicas: &[Running], calls: impl Fn() -> u64) {
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.addr).collect();
    let before = calls();
    let statuses = drive(
        &addrs,
        "/hot",
        "tenant-a",
        10 * LIMIT,
        Duration::from_secs(6),
    )
    .await;
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!(ok + refused, statuses.len(), "{statuses:?}");
    assert_eq!(statuses.len(), 10 * LIMIT, "the drive ran out of time");
    // Never past the limit; short of it by at most the slices the
    // replicas held unspent when the drive ended.
    assert!(ok <= LIMIT, "{ok} admitted, limit {LIMIT}");
    assert!(ok >= LIMIT - 3 * SLICE, "{ok} admitted, limit {LIMIT}");
    let per_request = (calls() - before) as f64 / statuses.len() as f64;
    assert!(per_request < 0.05, "{per_request} Redis calls a request");
    let mut spent = 0;
    for r in replicas {
        let m = r.metrics().await;
        spent += metric(&m, "tollgate_store_lease_units_total{kind=\"spent\"}");
    }
    assert!(spent as usize >= LIMIT / 2, "{spent} decided from slices");

    // The cold key: one request every 200 ms, round the replicas, decided
    // in Redis one by one: its remaining count is exact at every step.
    let mut seen = Vec::new();
    for i in 0..7 {
        let got = send_with(addrs[i % 3], "GET", "/cold", &[("x-who", "tenant-b")], b"").await;
        let remaining = got
            .headers
            .get("x-ratelimit-remaining")
            .map(|v| v.to_str().unwrap().to_owned());
        seen.push((got.status.as_u16(), remaining));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let expect: Vec<(u16, Option<String>)> = [
        (200, "4"),
        (200, "3"),
        (200, "2"),
        (200, "1"),
        (200, "0"),
        (429, "0"),
        (429, "0"),
    ]
    .iter()
    .map(|(s, r)| (*s, Some(r.to_string())))
    .collect();
    assert_eq!(seen, expect);
}

/// One route on `redis` answering "ok" under `limits` (YAML flow maps,
/// comma-separated), failing closed.
fn on_redis(redis: &RedisServer, limits: &str) -> String {
    format!(
        "store: {{ kind: redis, url: '{}', timeout: 2s, on_error: fail_closed }}
routes:
  - match: {{ path_prefix: / }}
    respond: {{ body: \"ok\\n\" }}
    limits: [{limits}]
",
        redis.url()
    )
}

/// The value of the metric line starting with `name` (0 when absent).
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_leased_on_a_cluster_never_passes_its_limit() {
    let cluster = RedisCluster::start_replicated();
    let yaml = leased_config(
        &format!("kind: redis_cluster, nodes: {}", cluster.seeds()),
        &format!("algorithm: fixed_window, limit: {LIMIT}, window: 1h"),
    );
    let replicas: Vec<Running> = (0..3).map(|_| Running::start(&yaml)).collect();
    hot_and_cold(&replicas, || cluster.script_calls()).await;
    // Every key and every receipt expires; given-back units included.
    for n in &cluster.nodes {
        assert!(n.keys_without_ttl("tollgate:*").is_empty());
    }
}

/// The same with a daily quota in Berlin on a Redis Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_quota_leased_on_a_cluster_never_passes_its_limit() {
    let cluster = RedisCluster::start();
    let yaml = leased_config(
        &format!("kind: redis_cluster, nodes: {}", cluster.seeds()),
        &format!("algorithm: quota, limit: {LIMIT}, period: day, time_zone: Europe/Berlin"),
    );
    let replicas: Vec<Running> = (0..3).map(|_| Running::start(&yaml)).collect();
    hot_and_cold(&replicas, || cluster.script_calls()).await;
}

/// The same with a sliding window on one Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_leased_on_one_redis_never_passes_its_limit() {
    let redis = RedisServer::start();
    let yaml = leased_config(
        &format!("kind: redis, url: '{}'", redis.url()),
        &format!("algorithm: sliding_window, limit: {LIMIT}, window: 1h"),
    );
    let replicas: Vec<Running> = (0..3).map(|_| Running::start(&yaml)).collect();
    hot_and_cold(&replicas, || redis.script_calls()).await;
    assert!(redis.keys_without_ttl("tollgate:*").is_empty());
}

/// A lease where it could pass the limit (a bucket, a log), without a
/// slice, or with a slice past the limit is refused, naming its path.
#[test]
fn lease_config_problems_name_their_paths() {
    let bad = |limit: &str| {
        let yaml = format!(
            "routes:\n  - match: {{ path_prefix: / }}\n    respond: {{ body: ok }}\n    limits: [{limit}]\n"
        );
        tollgate::Config::from_yaml(&yaml, &|_| None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_else(|| panic!("accepted: {limit}"))
    };
    for alg in [
        "algorithm: token_bucket, rate: 5/s, burst: 10",
        "algorithm: gcra, rate: 5/s, burst: 10",
        "algorithm: sliding_log, limit: 5, window: 1m",
    ] {
        let e = bad(&format!("{{ name: l, {alg}, lease: {{ slice: 2 }} }}"));
        assert!(
            e.contains("routes[0].limits[0].lease")
                && e.contains("fixed_window, sliding_window and quota"),
            "{e}"
        );
    }
    let e = bad("{ name: l, algorithm: fixed_window, limit: 5, window: 1m, lease: { hold: 1s } }");
    assert!(e.contains("routes[0].limits[0].lease.slice"), "{e}");
    let e = bad("{ name: l, algorithm: fixed_window, limit: 5, window: 1m, lease: { slice: 6 } }");
    assert!(
        e.contains("routes[0].limits[0].lease.slice") && e.contains("from 1 to 5"),
        "{e}"
    );
    let e = bad("{ name: l, algorithm: fixed_window, limit: 5, window: 1m, lease: { slice: 2, hold: soon } }");
    assert!(e.contains("routes[0].limits[0].lease.hold"), "{e}");
}

/// A replica takes slices of a key it sees often, spends 30 units, and
/// the key goes quiet: what is left of its slice goes back to Redis
/// within the hold (300 ms) and a sweep, so Redis counts exactly the 30
/// spent and another replica is told the exact remainder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_left_unspent_goes_back_to_redis() {
    let redis = RedisServer::start();
    let yaml = on_redis(
        &redis,
        "{ name: api, algorithm: fixed_window, limit: 100, window: 1h, key: 'header:x-who', lease: { slice: 50, hold: 300ms } }",
    );
    let (a, b) = (Running::start(&yaml), Running::start(&yaml));
    let mut c = h1(a.addr).await;
    for i in 0..30 {
        let mut req = request("GET", "/", empty());
        req.headers_mut()
            .insert("x-who", "tenant-c".parse().unwrap());
        assert_eq!(send1(&mut c, req).await.status.as_u16(), 200, "request {i}");
    }
    let m = a.metrics().await;
    let spent = metric(&m, "tollgate_store_lease_units_total{kind=\"spent\"}");
    assert!(spent >= 20, "{spent} of 30 decided from slices");
    let count = || redis.window_count("tollgate:*:api");
    until(
        Duration::from_secs(5),
        "the unspent units are given back",
        || async { count() == 30 },
    )
    .await;
    let m = a.metrics().await;
    let taken = metric(&m, "tollgate_store_lease_units_total{kind=\"taken\"}");
    let returned = metric(&m, "tollgate_store_lease_units_total{kind=\"returned\"}");
    // Every unit taken was spent or given back.
    assert!(returned > 0, "nothing given back");
    assert_eq!(
        taken - returned,
        spent,
        "taken {taken}, returned {returned}"
    );
    let got = send_with(b.addr, "GET", "/", &[("x-who", "tenant-c")], b"").await;
    assert_eq!(got.headers["x-ratelimit-remaining"], "69");
}

/// A route's limits are all or nothing with a lease among them: a leased
/// limit (100 an hour) beside one of 10 an hour on the same key. Forty
/// requests in a row: ten admitted; the thirty the other limit refused
/// give their leased units back, so Redis ends counting ten on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_limit_stays_all_or_nothing_with_its_route() {
    let redis = RedisServer::start();
    let yaml = on_redis(
        &redis,
        "{ name: wide, algorithm: fixed_window, limit: 100, window: 1h, key: 'header:x-who', lease: { slice: 50, hold: 200ms } },
       { name: narrow, algorithm: fixed_window, limit: 10, window: 1h, key: 'header:x-who' }",
    );
    let a = Running::start(&yaml);
    let mut c = h1(a.addr).await;
    let mut statuses = Vec::new();
    for _ in 0..40 {
        let mut req = request("GET", "/", empty());
        req.headers_mut()
            .insert("x-who", "tenant-d".parse().unwrap());
        statuses.push(send1(&mut c, req).await.status.as_u16());
    }
    assert_eq!(statuses[..10], [200; 10]);
    assert_eq!(statuses[10..], [429; 30]);
    let count = |limit: &str| redis.window_count(&format!("tollgate:*:{limit}"));
    assert_eq!(count("narrow"), 10);
    until(
        Duration::from_secs(5),
        "the wide limit counts ten",
        || async { count("wide") == 10 },
    )
    .await;
}

/// The README's scaling example loads: a lease on a route limit and a
/// shared `max_conn` on a cluster.
#[test]
fn the_readmes_scaling_example_loads() {
    let config = readme_config("store: { kind: redis_cluster", "");
    let summary = format!("{config:?}");
    assert!(
        summary.contains("slice: 50") && summary.contains("hold_ms: 1000"),
        "{summary}"
    );
    assert!(summary.contains("max_conn_lease: Some(10000)"), "{summary}");
}

/// A reload starts a new lease table: the old one's slices go back to
/// Redis as soon as the old config's last request is done, long before
/// their hold (30 s here) would have ended; also with a penalty box,
/// whose ban watcher lives as long as the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_gives_the_slices_back() {
    let redis = RedisServer::start();
    let yaml = on_redis(
        &redis,
        "{ name: api, algorithm: fixed_window, limit: 100, window: 1h, key: 'header:x-who', lease: { slice: 50, hold: 30s }, penalty: { after: 1000 } }",
    );
    let a = Running::start(&yaml);
    for i in 0..30 {
        let got = send_with(a.addr, "GET", "/", &[("x-who", "tenant-e")], b"").await;
        assert_eq!(got.status.as_u16(), 200, "request {i}");
    }
    let count = || redis.window_count("tollgate:*:api");
    assert!(count() > 30, "units held in a slice: {}", count());
    a.signal("-HUP");
    until(
        Duration::from_secs(10),
        "the old table's slices go back",
        || async { count() == 30 },
    )
    .await;
}
