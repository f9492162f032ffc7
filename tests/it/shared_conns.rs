//! `max_conn` shared by three tollgate processes through a Redis Cluster
//! of three primaries with a replica each (`max_conn_lease`): slots are
//! counted across replicas, renewed while a long request runs, freed at
//! once when it ends, and within the lease when its replica dies.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use crate::common::redis::RedisCluster;
use crate::common::*;

/// The status of one GET of `path`, and the detail of a refusal.
async fn status(addr: SocketAddr, path: &str) -> (u16, String) {
    let got = get(addr, path).await;
    let detail = if got.status.as_u16() == 200 {
        String::new()
    } else {
        got.json()["detail"].as_str().unwrap_or_default().to_owned()
    };
    (got.status.as_u16(), detail)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_conn_is_shared_by_the_replicas_and_freed_when_one_dies() {
    let cluster = RedisCluster::start_replicated();
    let up = Upstream::spawn().await;
    let yaml = format!(
        "store: {{ kind: redis_cluster, nodes: {}, timeout: 2s, on_error: fail_closed }}
zones:
  - {{ name: conns, rate: 1000r/s, burst: 1000, nodelay: true, max_conn: 2, max_conn_lease: 1500ms }}
upstreams:
  api: {{ targets: ['{}'], timeout: 30s }}
routes:
  - {{ match: {{ path_prefix: / }}, upstream: api, zones: [conns] }}
",
        cluster.seeds(),
        up.addr
    );
    let mut replicas: Vec<Running> = (0..3).map(|_| Running::start(&yaml)).collect();
    let (a, b, c) = (replicas[0].addr, replicas[1].addr, replicas[2].addr);
    // Two requests of 6 s, on A and B: longer than the lease (1.5 s).
    // (A's client sees its connection cut when A dies: not a panic.)
    let on_a = tokio::spawn(async move {
        let mut s = h1(a).await;
        s.send_request(request("GET", "/slow?ms=6000", empty()))
            .await
            .is_ok()
    });
    let on_b = tokio::spawn(async move { status(b, "/slow?ms=6000").await });
    until(Duration::from_secs(10), "both reach the upstream", || {
        std::future::ready(up.hits() == 2)
    })
    .await;
    let (code, detail) = status(c, "/slow?ms=1").await;
    assert_eq!(code, 429, "the third request at once, on another replica");
    assert!(detail.contains("concurrency limit 'conns'"), "{detail}");
    // Past the lease: the slots were renewed and still count.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        status(c, "/slow?ms=1").await.0,
        429,
        "renewed while running"
    );

    // A dies with its request in flight: its slot ends with its lease.
    replicas[0].signal("-KILL");
    let killed = Instant::now();
    until(Duration::from_secs(10), "A's slot ends", || async move {
        status(c, "/slow?ms=1").await.0 == 200
    })
    .await;
    let freed = killed.elapsed();
    assert!(
        freed < Duration::from_millis(1500 + 1000),
        "freed {freed:?} after the kill"
    );
    // B's request ends: its slot is free at once.
    assert_eq!(on_b.await.unwrap().0, 200);
    assert!(!on_a.await.unwrap(), "A's request died with A");
    let both = tokio::join!(status(c, "/slow?ms=300"), status(b, "/slow?ms=300"));
    assert_eq!((both.0 .0, both.1 .0), (200, 200), "two slots free again");
    // Nothing is left behind: the sets empty out, every key has a TTL.
    until(Duration::from_secs(5), "the slot sets are gone", || async {
        cluster
            .nodes
            .iter()
            .filter(|n| n.cli(&["PING"]) == "PONG")
            .map(|n| n.key_count("tollgate:*:conn"))
            .sum::<usize>()
            == 0
    })
    .await;
    for n in &cluster.nodes {
        assert!(n.keys_without_ttl("tollgate:*").is_empty());
    }
    replicas.clear();
}

/// `max_conn_lease` needs `max_conn` and a Redis store; a lease under 1 s
/// is refused; each problem names its path.
#[test]
fn max_conn_lease_problems_name_their_paths() {
    let bad = |store: &str, zone: &str| {
        let yaml = format!(
            "{store}\nzones:\n  - {{ name: z, rate: 10r/s, {zone} }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, respond: {{ body: ok }} }}\n"
        );
        tollgate::Config::from_yaml(&yaml, &|_| None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_else(|| panic!("accepted: {zone}"))
    };
    let redis = "store: { kind: redis, url: 'redis://127.0.0.1:1' }";
    let e = bad("", "max_conn: 2, max_conn_lease: 10s");
    assert!(
        e.contains("zones[0].max_conn_lease") && e.contains("store.kind"),
        "{e}"
    );
    let e = bad(redis, "max_conn_lease: 10s");
    assert!(
        e.contains("zones[0].max_conn_lease") && e.contains("set max_conn"),
        "{e}"
    );
    let e = bad(redis, "max_conn: 2, max_conn_lease: 200ms");
    assert!(
        e.contains("zones[0].max_conn_lease") && e.contains("at least 1s"),
        "{e}"
    );
}

/// Redis gone: a shared `max_conn` follows the zone's `on_error` within
/// the store timeout: `local` counts in this process (one slot here),
/// `fail_closed` answers 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_a_shared_max_conn_follows_on_error() {
    let mut redis = crate::common::redis::RedisServer::start();
    let up = Upstream::spawn().await;
    let yaml = format!(
        "store: {{ kind: redis, url: '{}', timeout: 500ms }}
zones:
  - {{ name: local, rate: 1000r/s, burst: 1000, nodelay: true, max_conn: 1, max_conn_lease: 2s, on_error: local }}
  - {{ name: closed, rate: 1000r/s, burst: 1000, nodelay: true, max_conn: 1, max_conn_lease: 2s, on_error: fail_closed }}
upstreams:
  api: {{ targets: ['{}'] }}
routes:
  - {{ match: {{ path_prefix: /, methods: [POST] }}, upstream: api, zones: [closed] }}
  - {{ match: {{ path_prefix: / }}, upstream: api, zones: [local] }}
",
        redis.url(),
        up.addr
    );
    let r = Running::start(&yaml);
    let post = |addr| async move {
        send_with(addr, "POST", "/slow?ms=1", &[], b"")
            .await
            .status
            .as_u16()
    };
    assert_eq!(post(r.addr).await, 200);
    redis.kill();
    let addr = r.addr;
    let start = Instant::now();
    assert_eq!(post(addr).await, 503, "fail_closed");
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    let slow = tokio::spawn(async move { status(addr, "/slow?ms=1500").await.0 });
    until(Duration::from_secs(5), "the slow request runs", || {
        std::future::ready(up.hits() == 2)
    })
    .await;
    assert_eq!(
        status(addr, "/slow?ms=1").await.0,
        429,
        "this process's one slot"
    );
    assert_eq!(slow.await.unwrap(), 200);
    assert_eq!(status(addr, "/slow?ms=1").await.0, 200, "freed");
}
