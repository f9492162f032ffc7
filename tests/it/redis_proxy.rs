//! The proxy on a real Redis when things go wrong: Redis killed, paused or
//! flushed mid-load, never reachable, or flooded by one key; and the
//! all-or-nothing rule across Redis Cluster slots.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::*;
use http::StatusCode;

/// A port nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A `respond` route with `limits`, on the given store.
fn limited(store: &str, limits: &str) -> String {
    config(&format!(
        "store: {{ {store} }}
routes:
  - match: {{ path_prefix: / }}
    respond: {{ body: \"ok\\n\" }}
    limits: [{limits}]
"
    ))
}

async fn get_with(addr: SocketAddr, header: (&'static str, &str)) -> Got {
    let mut s = h1(addr).await;
    let mut req = request("GET", "/", empty());
    req.headers_mut()
        .insert(header.0, header.1.parse().expect("header value"));
    send1(&mut s, req).await
}

/// The tests that time every request run one at a time, so that two load
/// runs never share the two cores and blur each other's latencies.
static TIMED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One request's fate during a load run.
#[derive(Debug, Clone)]
struct Sample {
    started: Duration,
    took: Duration,
    status: u16,
    /// The problem detail of a 503: what the store failed with.
    detail: String,
}

/// `loops` clients on keep-alive connections, each sending requests back
/// to back for `length`; `during` runs alongside (it breaks Redis).
async fn load<F: std::future::Future<Output = ()>>(
    addr: SocketAddr,
    loops: usize,
    length: Duration,
    during: F,
) -> Vec<Sample> {
    let _one_at_a_time = TIMED.lock().await;
    let samples = Arc::new(Mutex::new(Vec::new()));
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..loops {
        let samples = samples.clone();
        tasks.spawn(async move {
            let mut s = h1(addr).await;
            while t0.elapsed() < length {
                let started = t0.elapsed();
                let got = send1(&mut s, request("GET", "/", empty())).await;
                let mut detail = String::new();
                if got.status == StatusCode::SERVICE_UNAVAILABLE {
                    assert_eq!(got.headers["retry-after"], "1");
                    assert_eq!(got.headers["content-type"], "application/problem+json");
                    detail = got.json()["detail"].as_str().unwrap_or_default().to_owned();
                    assert!(detail.contains("cannot be checked"), "{detail}");
                }
                samples.lock().unwrap().push(Sample {
                    started,
                    took: t0.elapsed() - started,
                    status: got.status.as_u16(),
                    detail,
                });
            }
        });
    }
    during.await;
    while tasks.join_next().await.is_some() {}
    let samples = samples.lock().unwrap().clone();
    samples
}

const TIMEOUT_MS: u64 = 100;

fn failing_closed(redis: &RedisServer) -> String {
    on_redis(
        redis,
        "on_error: fail_closed",
        "{ name: all, algorithm: fixed_window, key: global, limit: 100000000, window: 1h }",
    )
}

/// A 100 ms timeout, the breaker after 3 failures, probes every 100 ms,
/// and `more` store settings.
fn on_redis(redis: &RedisServer, more: &str, limits: &str) -> String {
    limited(
        &format!(
            "kind: redis, url: '{}', timeout: {TIMEOUT_MS}ms, {more}, breaker: {{ failures: 3, probe_interval: 100ms }}",
            redis.url()
        ),
        limits,
    )
}

/// No request waits out the outage: a deadline that only catches a hang
/// (a request held until Redis is back takes up to the whole second of
/// the outage), not a latency figure, which a noisy machine would make
/// flaky; the store's latencies are measured in `benches/`.
const HANG_BOUND: Duration = Duration::from_millis(500);

/// Every request answered without waiting out the outage; 200 before the
/// trouble; 200 again within 2 s of Redis being back, and from then on
/// but for a call that missed its own deadline (below).
fn assert_recovers(samples: &[Sample], trouble: Duration, back: Duration) {
    let bound = HANG_BOUND;
    let slowest = samples.iter().map(|s| s.took).max().unwrap_or_default();
    assert!(slowest <= bound, "a request took {slowest:?}");
    let before: Vec<_> = samples
        .iter()
        .filter(|s| s.started + s.took < trouble)
        .collect();
    assert!(!before.is_empty() && before.iter().all(|s| s.status == 200));
    assert!(
        samples.iter().any(|s| s.status == 503),
        "no request met the outage"
    );
    let resumed = samples
        .iter()
        .filter(|s| s.started > back && s.status == 200)
        .map(|s| s.started)
        .min()
        .expect("shared counting never resumed");
    assert!(
        resumed - back <= Duration::from_secs(2),
        "resumed {:?} after Redis came back",
        resumed - back
    );
    // Requests already in flight when it came back may still have been
    // refused; everything sent a moment later is decided by Redis again.
    // The one refusal left is the configured one for a call Redis, back,
    // still answers after its 100 ms: a stall of this 2-core machine
    // while other tests run (the proxy's own timer then fires late too).
    // Such a refusal names the deadline and took at least it, and one
    // stall refuses at most the call in flight, a request per client; two
    // stalls are allowed in the thousands of requests after. A breaker
    // that opened again, or a connection never re-established, would
    // refuse with another cause, or many more requests.
    let settled = resumed + Duration::from_millis(50);
    let late: Vec<_> = samples.iter().filter(|s| s.started > settled).collect();
    let refused: Vec<_> = late.iter().filter(|s| s.status != 200).collect();
    let missed_deadline = |s: &&&Sample| {
        s.status == 503
            && s.took >= Duration::from_millis(TIMEOUT_MS)
            && s.detail
                .contains(&format!("Redis did not answer within {TIMEOUT_MS}ms"))
    };
    assert!(
        refused.iter().all(missed_deadline) && refused.len() <= 2 * LOOPS,
        "failures after recovery ({} of {} requests): {refused:?}",
        refused.len(),
        late.len()
    );
}

/// Load on a fail-closed proxy while `trouble` hits Redis 600 ms in and
/// `mend` undoes it 1 s later; returns the samples, the server and the
/// proxy (still running).
async fn outage_mid_load(
    config: fn(&RedisServer) -> String,
    trouble: fn(&mut RedisServer),
    mend: fn(&mut RedisServer),
) -> (Vec<Sample>, Arc<Mutex<RedisServer>>, TestProxy) {
    let redis = Arc::new(Mutex::new(RedisServer::start()));
    let yaml = config(&redis.lock().unwrap());
    let proxy = TestProxy::spawn(&yaml).await;
    let chaos = {
        let redis = redis.clone();
        // The outage's schedule within the load run: the samples carry
        // their times and the checks read them, so nothing waits on it.
        async move {
            tokio::time::sleep(TROUBLE_AT).await;
            trouble(&mut redis.lock().unwrap());
            tokio::time::sleep(BACK_AT - TROUBLE_AT).await;
            mend(&mut redis.lock().unwrap());
        }
    };
    let samples = load(proxy.addr(), LOOPS, Duration::from_millis(4500), chaos).await;
    (samples, redis, proxy)
}

/// Clients sending requests back to back through an outage.
const LOOPS: usize = 6;
const TROUBLE_AT: Duration = Duration::from_millis(600);
const BACK_AT: Duration = Duration::from_millis(1600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_load_fails_closed_within_the_timeout_then_recovers() {
    let (samples, redis, _proxy) =
        outage_mid_load(failing_closed, RedisServer::kill, RedisServer::restart).await;
    // `restart` returns once the new server answers, up to ~100 ms later.
    assert_recovers(&samples, TROUBLE_AT, BACK_AT + Duration::from_millis(100));
    let redis = redis.lock().unwrap();
    // No reconnect storm: one connection from the proxy, and its one
    // subscription to resets.
    assert_eq!(
        redis.clients(),
        (1, 1),
        "{}",
        redis.cli(&["CLIENT", "LIST"])
    );
    assert!(redis.keys_without_ttl("*").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_mid_load_fails_closed_within_the_timeout_then_recovers() {
    let (samples, redis, _proxy) =
        outage_mid_load(failing_closed, |r| r.pause(true), |r| r.pause(false)).await;
    assert_recovers(&samples, TROUBLE_AT, BACK_AT);
    assert!(redis.lock().unwrap().keys_without_ttl("*").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_load_with_local_fallback_keeps_limiting() {
    // 300 per hour for everyone. Redis counts 300, dies; this process
    // counts 300 on its own; Redis comes back empty and counts 300 more.
    // Each request is decided by exactly one of them. (With the rejection
    // cache on, the key would stay refused for the hour instead.)
    let (samples, _redis, _proxy) = outage_mid_load(
        |r| {
            on_redis(
                r,
                "on_error: local, cache_rejections: false",
                "{ name: all, algorithm: sliding_log, key: global, limit: 300, window: 1h }",
            )
        },
        RedisServer::kill,
        RedisServer::restart,
    )
    .await;
    let bound = HANG_BOUND;
    let slowest = samples.iter().map(|s| s.took).max().unwrap_or_default();
    assert!(slowest <= bound, "a request took {slowest:?}");
    let others: Vec<_> = samples
        .iter()
        .filter(|s| !matches!(s.status, 200 | 429))
        .collect();
    assert!(others.is_empty(), "{others:?}");
    let admitted = samples.iter().filter(|s| s.status == 200).count();
    assert_eq!(admitted, 900, "of {} requests", samples.len());
}

/// Loads the proxy while `flush` empties Redis's functions or scripts 15
/// times: no request fails, tollgate loads `loaded` again each time, and
/// `/readyz` says how decisions were sent.
async fn flushes_mid_load_cost_no_request(
    redis: RedisServer,
    flush: &'static str,
    loaded: &str,
    sent_as: &str,
) -> Arc<Mutex<RedisServer>> {
    let yaml = failing_closed(&redis).replace(
        "admin: { enabled: false }",
        "admin: { bind: '127.0.0.1:0' }",
    );
    let redis = Arc::new(Mutex::new(redis));
    let proxy = TestProxy::spawn(&yaml).await;
    let flushes = {
        let redis = redis.clone();
        async move {
            for _ in 0..15 {
                // Paces the flushes through the load run.
                tokio::time::sleep(Duration::from_millis(100)).await;
                redis.lock().unwrap().cli(&[flush, "FLUSH"]);
            }
        }
    };
    let samples = load(proxy.addr(), 4, Duration::from_millis(2000), flushes).await;
    let failed: Vec<_> = samples.iter().filter(|s| s.status != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed",
        failed.len(),
        samples.len()
    );
    let ready = get(proxy.admin.expect("admin"), "/readyz").await;
    assert_eq!(ready.json()["store"]["sent_as"], sent_as);
    {
        let redis = redis.lock().unwrap();
        let loads = redis.calls(loaded);
        assert!(loads >= 10, "{loaded} ran {loads} times for 15 flushes");
        assert!(redis.keys_without_ttl("*").is_empty());
    }
    redis
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_flush_mid_load_costs_no_request() {
    let redis = flushes_mid_load_cost_no_request(
        RedisServer::start(),
        "FUNCTION",
        "function|load",
        "function",
    )
    .await;
    let redis = redis.lock().unwrap();
    assert_eq!(redis.calls("evalsha"), 0, "every decision went by FCALL");
    assert!(redis.calls("fcall") > 100);
}

/// A server without `FUNCTION` (as before Redis 7, or with the command
/// renamed away) is sent the script; `SCRIPT FLUSH` costs no request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_functions_decisions_go_by_evalsha() {
    let no_functions = RedisServer::start_with(|_| {
        let args = ["--rename-command", "FUNCTION", ""];
        (args.map(String::from).to_vec(), Vec::new())
    });
    let redis =
        flushes_mid_load_cost_no_request(no_functions, "SCRIPT", "script|load", "script").await;
    let redis = redis.lock().unwrap();
    assert!(redis.calls("evalsha") > 100);
    // One FCALL found out; every decision after went by EVALSHA.
    assert!(redis.calls("fcall") <= 2, "{} FCALLs", redis.calls("fcall"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_key_is_refused_from_the_cache() {
    let redis = RedisServer::start();
    let flood = |cache: bool| {
        limited(
            &format!("kind: redis, url: '{}', timeout: 2s, cache_rejections: {cache}", redis.url()),
            "{ name: flood, algorithm: sliding_window, key: 'header:x-flood', limit: 10, window: 1m }",
        )
    };
    let mut counts = Vec::new();
    for cache in [true, false] {
        let proxy = TestProxy::spawn(&flood(cache)).await;
        redis.cli(&["CONFIG", "RESETSTAT"]);
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..10 {
            let addr = proxy.addr();
            tasks.spawn(async move {
                let mut s = h1(addr).await;
                let mut ok = 0;
                for _ in 0..50 {
                    let mut req = request("GET", "/", empty());
                    req.headers_mut()
                        .insert("x-flood", format!("{cache}").parse().unwrap());
                    ok += usize::from(send1(&mut s, req).await.status == StatusCode::OK);
                }
                ok
            });
        }
        let mut admitted = 0;
        while let Some(ok) = tasks.join_next().await {
            admitted += ok.unwrap();
        }
        assert_eq!(admitted, 10);
        counts.push(redis.calls("fcall") + redis.calls("evalsha") + redis.calls("eval"));
    }
    let (cached, uncached) = (counts[0], counts[1]);
    // Without the cache, batching alone already merges some requests.
    assert!(
        cached <= 50,
        "with the cache Redis saw {cached} calls for 500 requests"
    );
    assert!(
        uncached > 3 * cached,
        "without the cache {uncached} calls, with it {cached}"
    );
}

#[tokio::test]
async fn failure_modes_decide_when_redis_never_answers() {
    let url = format!("redis://:hunter2@127.0.0.1:{}", closed_port());
    let store = |mode: &str| {
        format!("kind: redis, url: '{url}', timeout: 50ms, on_error: {mode}, replicas: 2")
    };
    let limit = "{ name: api, algorithm: fixed_window, key: 'header:x-k', limit: 10, window: 1m }";

    let open = TestProxy::spawn(&limited(&store("fail_open"), limit)).await;
    for _ in 0..15 {
        assert_eq!(get_with(open.addr(), ("x-k", "a")).await.status, 200);
    }

    let closed = TestProxy::spawn(&limited(&store("fail_closed"), limit)).await;
    let got = get_with(closed.addr(), ("x-k", "a")).await;
    assert_eq!(got.status, 503);
    assert_eq!(got.headers["retry-after"], "1");
    let body = got.json();
    assert_eq!(body["limit"], "api");
    assert!(!String::from_utf8_lossy(&got.body).contains("hunter2"));

    // local: this replica takes limit / replicas = 5.
    let local = TestProxy::spawn(&limited(&store("local"), limit)).await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(get_with(local.addr(), ("x-k", "a")).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);

    // A limit's own on_error wins over the store's.
    let own = "{ name: api, algorithm: fixed_window, key: 'header:x-k', limit: 10, window: 1m, on_error: fail_open }";
    let overridden = TestProxy::spawn(&limited(&store("fail_closed"), own)).await;
    assert_eq!(get_with(overridden.addr(), ("x-k", "a")).await.status, 200);
}

#[tokio::test]
async fn readyz_reports_the_store() {
    let mut redis = RedisServer::start();
    let yaml = limited(
        &format!("kind: redis, url: '{}', timeout: 50ms", redis.url()),
        "{ name: api, algorithm: gcra, key: ip, rate: 10/s, burst: 5 }",
    )
    .replace(
        "admin: { enabled: false }",
        "admin: { bind: '127.0.0.1:0' }",
    );
    let proxy = TestProxy::spawn(&yaml).await;
    let admin = proxy.admin.expect("admin");
    let ready = get(admin, "/readyz").await;
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["store"]["kind"], "redis");
    assert_eq!(ready.json()["store"]["up"], true);
    redis.kill();
    // The next decision finds the connection gone.
    assert_eq!(get(proxy.addr(), "/").await.status, 200);
    let ready = get(admin, "/readyz").await;
    assert_eq!(
        ready.status, 200,
        "a Redis outage does not make the replica unready"
    );
    assert_eq!(ready.json()["store"]["up"], false);
}

#[tokio::test]
async fn across_cluster_slots_a_refused_request_burns_no_quota() {
    let cluster = RedisCluster::start();
    // Two limits in one group on different client keys: different slots.
    let yaml = limited(
        &format!(
            "kind: redis_cluster, nodes: {}, timeout: 2s, cache_rejections: false",
            cluster.seeds()
        ),
        "{ name: per_ip, algorithm: fixed_window, key: ip, limit: 100, window: 1h },
                    { name: per_user, algorithm: fixed_window, key: 'header:x-user', limit: 3, window: 1h }",
    );
    let proxy = TestProxy::spawn(&yaml).await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(
            get_with(proxy.addr(), ("x-user", "alice"))
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429, 429]);
    // The five refused requests were given back to per_ip: the next user
    // sees 100 - 3 - 1 left, not 100 - 8 - 1. The refunds land a moment
    // later; each look is a request, so the k-th look expects k fewer.
    let (addr, mut look) = (proxy.addr(), 0);
    until(Duration::from_secs(10), "the refunds applied", || {
        look += 1;
        let expected = format!("\"per_ip\";r={};", 97 - look);
        async move {
            let got = get_with(addr, ("x-user", "bob")).await;
            let state = got.headers["ratelimit"].to_str().unwrap().to_owned();
            state.contains(&expected)
        }
    })
    .await;
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn acl_users_and_passwords_come_from_the_url() {
    let redis = RedisServer::start_with(|_| {
        (
            strings(&[
                "--user",
                "default",
                "off",
                "--user",
                "app",
                "on",
                ">s3cret-pass",
                "~tollgate:*",
                "+@all",
            ]),
            strings(&[
                "--user",
                "app",
                "--pass",
                "s3cret-pass",
                "--no-auth-warning",
            ]),
        )
    });
    let limit = "{ name: api, algorithm: fixed_window, key: ip, limit: 2, window: 1m }";
    let with = |creds: &str| {
        limited(
            &format!("kind: redis, url: 'redis://{creds}@127.0.0.1:{}', timeout: 1s, on_error: fail_closed", redis.port),
            limit,
        )
    };
    let good = TestProxy::spawn(&with("app:s3cret-pass")).await;
    let statuses = [
        get(good.addr(), "/").await.status.as_u16(),
        get(good.addr(), "/").await.status.as_u16(),
        get(good.addr(), "/").await.status.as_u16(),
    ];
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(redis.key_count("tollgate:*"), 1);

    let bad = TestProxy::spawn(&with("app:wrong")).await;
    let got = get(bad.addr(), "/").await;
    assert_eq!(got.status, 503);
    assert!(!String::from_utf8_lossy(&got.body).contains("wrong"));
}

#[tokio::test]
async fn rediss_verifies_the_server_with_the_configured_ca() {
    let ca = TestCa::new();
    let (cert, key) = ca.leaf("redis", &["localhost"]);
    let ca_pem = ca.ca_pem.display().to_string();
    let redis = RedisServer::start_with(|port| {
        (
            strings(&[
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &ca_pem,
                "--tls-auth-clients",
                "no",
            ]),
            strings(&["--tls", "--cacert", &ca_pem]),
        )
    });
    let yaml = |ca: &str| {
        limited(
            &format!(
                "kind: redis, url: 'rediss://localhost:{}', timeout: 1s, on_error: fail_closed, tls: {{ ca: '{ca}' }}",
                redis.port
            ),
            "{ name: api, algorithm: gcra, key: ip, rate: 2/m, burst: 2 }",
        )
    };
    let proxy = TestProxy::spawn(&yaml(&ca_pem)).await;
    let statuses = [
        get(proxy.addr(), "/").await.status.as_u16(),
        get(proxy.addr(), "/").await.status.as_u16(),
        get(proxy.addr(), "/").await.status.as_u16(),
    ];
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(redis.key_count("tollgate:*"), 1);

    // Another CA's certificate is refused: no decision over that link.
    let other = TestCa::new();
    let other_pem = other.ca_pem.display().to_string();
    let proxy = TestProxy::spawn(&yaml(&other_pem)).await;
    assert_eq!(get(proxy.addr(), "/").await.status, 503);
}
