//! Redis Cluster under faults, with three `tollgate` processes: a retried
//! script call charges once (its receipt), a primary killed and its
//! replica promoted, a slot moved to another node while the key is
//! hammered. Decisions follow `on_error: fail_closed` while the cluster
//! cannot answer, each within the store's timeout, and the count survives.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;

use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::*;

/// A fixed window of `limit` per `window` on the `x-who` header, failing
/// closed, store timeout 1 s.
fn cluster_config(cluster: &RedisCluster, name: &str, limit: u32, window: &str) -> String {
    format!(
        "store: {{ kind: redis_cluster, nodes: {}, timeout: 1s, on_error: fail_closed }}
routes:
  - match: {{ path_prefix: / }}
    respond: {{ body: \"ok\\n\" }}
    limits: [{{ name: {name}, algorithm: fixed_window, key: 'header:x-who', limit: {limit}, window: {window} }}]
",
        cluster.seeds()
    )
}

/// One request as `who`, on a fresh connection: its status and how long
/// it took.
async fn ask(addr: SocketAddr, who: &str) -> (StatusCode, Duration) {
    let start = Instant::now();
    let got = send_with(addr, "GET", "/", &[("x-who", who)], b"").await;
    (got.status, start.elapsed())
}

/// 16 clients, each sending one request after another (as `who(client,
/// n)` for its n-th) through the replicas in turn until `ends`: each
/// gives the statuses it got.
fn hammer(
    addrs: &[SocketAddr],
    ends: Instant,
    who: fn(usize, usize) -> String,
) -> tokio::task::JoinSet<Vec<u16>> {
    let mut drivers = tokio::task::JoinSet::new();
    for d in 0..16 {
        let addr = addrs[d % addrs.len()];
        drivers.spawn(async move {
            let mut seen = Vec::new();
            while Instant::now() < ends {
                seen.push(ask(addr, &who(d, seen.len())).await.0.as_u16());
            }
            seen
        });
    }
    drivers
}

/// The index of the primary holding keys under `pattern`.
fn holder(cluster: &RedisCluster, pattern: &str) -> usize {
    let holders: Vec<usize> = (0..cluster.nodes.len())
        .filter(|&i| {
            let n = &cluster.nodes[i];
            n.cli(&["INFO", "replication"]).contains("role:master") && n.key_count(pattern) > 0
        })
        .collect();
    assert_eq!(holders.len(), 1, "keys {pattern} on primaries {holders:?}");
    holders[0]
}

/// decide.lua's answer (now, then per request: checks decided, and per
/// check code, remaining, reset) -> the first request's checks decided
/// and its first check's code and remaining.
fn first_decision(answer: &[u8]) -> (i64, i64, i64) {
    let word = |i: usize| i64::from_be_bytes(answer[8 * i..8 * i + 8].try_into().unwrap());
    (word(1), word(2), word(3))
}

/// decide.lua as a cluster runs it, called straight twice with one
/// receipt (what the cluster client's retry after a dropped connection
/// does): the second call answers the first's numbers and charges nothing;
/// a call with a new receipt is charged. The receipts (a hash per hash
/// tag and time bucket, a field per call) expire.
#[tokio::test]
async fn a_call_retried_with_its_receipt_is_charged_once() {
    let server = RedisServer::start();
    let client = ::redis::Client::open(server.url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let script = tollgate::limiter::cluster_decide();
    let now = 1_800_000_000_000u64;
    // A fixed window of 3 a minute, cost 1.
    let spec = "1,3,60000,0,1,0,0,0;";
    let state = "tollgate:{ip:203.0.113.7}:api";
    let mut reader = conn.clone();
    let receipts = "tollgate:{ip:203.0.113.7}:once:5";
    let call = |field: &'static str| {
        let mut conn = conn.clone();
        let script = script.clone();
        async move {
            let answer: Vec<u8> = script
                .key(state)
                .key(receipts)
                .arg(now)
                .arg(spec)
                .arg(format!("{field}:5000"))
                .invoke_async(&mut conn)
                .await
                .expect("the script answers");
            first_decision(&answer)
        }
    };
    let first = call("a.1").await;
    assert_eq!(first, (1, 0, 2), "admitted, 2 left");
    let retried = call("a.1").await;
    assert_eq!(retried, first, "the retry answers the first call's numbers");
    let next = call("a.2").await;
    assert_eq!(next, (1, 0, 1), "charged once before this call, not twice");
    let ttl: i64 = ::redis::cmd("PTTL")
        .arg(receipts)
        .query_async(&mut reader)
        .await
        .unwrap();
    assert!((1..=5000).contains(&ttl), "the receipt expires: PTTL {ttl}");

    // The same through the function a node's batch calls (keys as
    // arguments, no key declared).
    let (library, function) = tollgate::limiter::cluster_node_decide();
    let _: String = ::redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&library)
        .query_async(&mut reader)
        .await
        .expect("loads the library");
    let node_call = |field: &'static str| {
        let (mut conn, function) = (conn.clone(), function.clone());
        async move {
            let answer: Vec<u8> = ::redis::cmd("FCALL")
                .arg(&function)
                .arg(0)
                .arg(2)
                .arg("tollgate:{ip:203.0.113.8}:api")
                .arg("tollgate:{ip:203.0.113.8}:once:5")
                .arg(now)
                .arg(spec)
                .arg(format!("{field}:5000"))
                .query_async(&mut conn)
                .await
                .expect("the function answers");
            first_decision(&answer)
        }
    };
    let first = node_call("b.1").await;
    assert_eq!(first, (1, 0, 2));
    assert_eq!(node_call("b.1").await, first);
    assert_eq!(node_call("b.2").await, (1, 0, 1));
    assert!(server.keys_without_ttl("tollgate:*").is_empty());
}

/// A cluster of three primaries with a replica each. 30 of a key's 50 are
/// spent through three replicas of tollgate; its primary is killed. Until
/// its replica is promoted every request is refused by `fail_closed`
/// within the store timeout (never a hang); then the key decides again
/// from the count the replica holds: 20 more admitted, then refused. No
/// key is left without a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_its_replica_promoted_the_count_goes_on() {
    let mut cluster = RedisCluster::start_replicated();
    let yaml = cluster_config(&cluster, "failover", 50, "1h");
    let replicas: Vec<Running> = (0..3).map(|_| Running::start(&yaml)).collect();
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.addr).collect();
    for i in 0..30 {
        let (status, _) = ask(addrs[i % 3], "hot").await;
        assert_eq!(status, StatusCode::OK, "request {i}");
    }
    let owner = holder(&cluster, "tollgate:*:failover");
    let key = cluster.nodes[owner].cli(&["--scan", "--pattern", "tollgate:*:failover"]);
    let slot = cluster.slot(key.trim());
    // Every write acknowledged by the primary is on its replica: what a
    // kill loses (Redis replicates asynchronously) is not what this tests.
    assert_eq!(cluster.nodes[owner].cli(&["WAIT", "1", "2000"]), "1");
    cluster.nodes[owner].kill();

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut refused = 0;
    let mut admitted = 0;
    let mut i = 0;
    while admitted == 0 {
        assert!(
            Instant::now() < deadline,
            "no decision 30 s after the kill ({refused} refused)"
        );
        let (status, took) = ask(addrs[i % 3], "hot").await;
        i += 1;
        // The store's timeout (1 s) bounds the decision; the rest is slack
        // for a loaded machine.
        assert!(took < Duration::from_millis(2500), "request took {took:?}");
        match status {
            StatusCode::SERVICE_UNAVAILABLE => refused += 1,
            StatusCode::OK => admitted += 1,
            other => panic!("during the failover: {other}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused > 0, "the kill was never noticed");
    let promoted = cluster.owner(slot);
    assert!(promoted.is_some_and(|p| p != owner), "{promoted:?}");
    // The count went on from 30 (+1 above): 19 more, then refused.
    let mut statuses = Vec::new();
    for j in 0..30 {
        let (status, took) = ask(addrs[j % 3], "hot").await;
        assert!(took < Duration::from_millis(2500), "request took {took:?}");
        statuses.push(status.as_u16());
    }
    let ok = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(ok, 19, "after the promotion: {statuses:?}");
    assert!(statuses[19..].iter().all(|s| *s == 429), "{statuses:?}");
    for (n, node) in cluster.nodes.iter().enumerate() {
        if n != owner {
            assert!(node.keys_without_ttl("tollgate:*").is_empty());
        }
    }
}

/// The slot of a key hammered at 16 requests at a time through three
/// replicas moves to another primary (IMPORTING/MIGRATING, `MIGRATE`, the
/// new owner announced), as `redis-cli --cluster reshard` does. The
/// redirects are followed inside the calls: the count on the new owner is
/// exactly the requests admitted (nothing charged twice, nothing lost),
/// give or take only requests that failed closed; the key ends on the new
/// owner with a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_under_load_keeps_the_count_exact() {
    let cluster = RedisCluster::start();
    let yaml = cluster_config(&cluster, "reshard", 1_000_000, "1d");
    let replicas: Vec<Running> = (0..3).map(|_| Running::start(&yaml)).collect();
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.addr).collect();
    // One request places the key; its slot is then known.
    assert_eq!(ask(addrs[0], "hot").await.0, StatusCode::OK);
    let from = holder(&cluster, "tollgate:*:reshard");
    let key = cluster.nodes[from].cli(&["--scan", "--pattern", "tollgate:*:reshard"]);
    let slot = cluster.slot(key.trim());
    let to = (from + 1) % 3;

    let load_ends = Instant::now() + Duration::from_secs(4);
    let mut drivers = hammer(&addrs, load_ends, |_, _| "hot".to_owned());
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.move_slot(slot, from, to, 1);
    let mut statuses = Vec::new();
    while let Some(seen) = drivers.join_next().await {
        statuses.extend(seen.unwrap());
    }
    let ok = 1 + statuses.iter().filter(|s| **s == 200).count();
    let failed = statuses.iter().filter(|s| **s == 503).count();
    let others: Vec<&u16> = statuses
        .iter()
        .filter(|s| !matches!(s, 200 | 503))
        .collect();
    assert!(others.is_empty(), "{others:?}");
    assert!(statuses.len() > 100, "only {} requests", statuses.len());
    let count = cluster.nodes[to].window_count(key.trim()) as usize;
    assert!(
        ok <= count && count <= ok + failed,
        "{ok} admitted, {failed} failed closed, {count} counted: a charge lost or made twice"
    );
    assert_eq!(cluster.owner(slot), Some(to));
    assert_eq!(holder(&cluster, "tollgate:*:reshard"), to);
    for n in &cluster.nodes {
        assert!(n.keys_without_ttl("tollgate:*:reshard").is_empty());
    }
    // Every call's receipt expires (4 x the store's timeout).
    let receipts = || -> usize {
        cluster
            .nodes
            .iter()
            .map(|n| n.key_count("tollgate:*:once:*"))
            .sum()
    };
    assert!(receipts() > 0);
    until(Duration::from_secs(10), "the receipts expire", || async {
        receipts() == 0
    })
    .await;
}

/// Routine maintenance no client should notice: the slots of a hot
/// limit's keys moved one after another, one every 150 ms (as
/// `move_slot`: a key per `MIGRATE`), while 16 clients hammer the keys
/// through three replicas with a store timeout of 50 ms. No request fails,
/// and the counts are exactly the requests admitted: nothing charged
/// twice, nothing lost. (With a receipt key per call, the slot held
/// hundreds of keys to move: 144 and 174 of about 18,700 requests failed,
/// TRYAGAIN past their retries.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_moved_one_after_another_under_load_fail_no_request() {
    const KEYS: usize = 4;
    let cluster = RedisCluster::start();
    // Never reached: every request is decided by Redis (a key over its
    // limit is refused from the replica's memory, never meeting a move).
    let yaml =
        cluster_config(&cluster, "moving", 1_000_000, "1d").replace("timeout: 1s", "timeout: 50ms");
    let replicas: Vec<Running> = (0..3).map(|_| Running::start(&yaml)).collect();
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.addr).collect();
    // One request per key places the keys; their slots are then known.
    for k in 0..KEYS {
        assert_eq!(
            ask(addrs[0], &format!("tenant-{k}")).await.0,
            StatusCode::OK
        );
    }
    let keys = || -> Vec<(usize, String)> {
        (0..cluster.nodes.len())
            .flat_map(|n| {
                let found = cluster.nodes[n].cli(&["--scan", "--pattern", "tollgate:*:moving"]);
                found
                    .lines()
                    .map(|k| (n, k.trim().to_owned()))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let mut slots: Vec<u16> = keys().iter().map(|(_, k)| cluster.slot(k)).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(keys().len(), KEYS);

    let load_ends = Instant::now() + Duration::from_secs(4);
    let mut drivers = hammer(&addrs, load_ends, |d, n| {
        format!("tenant-{}", (d + n) % KEYS)
    });
    let mut moved = 0;
    while Instant::now() + Duration::from_millis(500) < load_ends {
        let slot = slots[moved % slots.len()];
        tokio::time::sleep(Duration::from_millis(150)).await;
        let from = cluster.owner(slot).expect("the slot's owner");
        cluster.move_slot(slot, from, (from + 1) % 3, 1);
        moved += 1;
    }
    let mut statuses = Vec::new();
    while let Some(seen) = drivers.join_next().await {
        statuses.extend(seen.unwrap());
    }
    let ok = KEYS + statuses.iter().filter(|s| **s == 200).count();
    let failed = statuses.iter().filter(|s| **s != 200).count();
    assert!(moved >= 8, "{moved} moves");
    assert!(statuses.len() > 500, "only {} requests", statuses.len());
    assert_eq!(
        failed,
        0,
        "{failed} of {} requests failed while {moved} slots moved",
        statuses.len()
    );
    let counted: usize = keys()
        .iter()
        .map(|(n, k)| cluster.nodes[*n].window_count(k) as usize)
        .sum();
    assert_eq!(counted, ok, "a charge lost or made twice");
}

/// Keys spread over the cluster's three primaries: 900 requests at once
/// on 90 keys (10 each, limit 5 each) through three replicas. A node's
/// jobs of several slots go in one call: every key admits exactly 5, in
/// under half a script call a request (0.24-0.29 here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_spread_over_the_nodes_are_batched_per_node_and_exact() {
    let cluster = RedisCluster::start();
    let yaml = cluster_config(&cluster, "spread", 5, "1h");
    let replicas: Vec<Running> = (0..3).map(|_| Running::start(&yaml)).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..900 {
        let addr = replicas[i % 3].addr;
        tasks.spawn(async move {
            let who = format!("tenant-{}", i % 90);
            (i % 90, ask(addr, &who).await.0)
        });
    }
    let mut admitted = [0usize; 90];
    while let Some(r) = tasks.join_next().await {
        let (key, status) = r.unwrap();
        match status {
            StatusCode::OK => admitted[key] += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("{other}"),
        }
    }
    assert!(admitted.iter().all(|n| *n == 5), "{admitted:?}");
    let calls = cluster.script_calls();
    assert!(calls < 450, "{calls} script calls for 900 requests");
    let spread = cluster
        .nodes
        .iter()
        .filter(|n| n.key_count("tollgate:*:spread") > 0)
        .count();
    assert_eq!(spread, 3, "keys on {spread} nodes");
}
