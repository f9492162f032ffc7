//! Three `tollgate` processes share one Redis (and then a 3-node Redis
//! Cluster): 1,000 concurrent requests on one key against a limit of 100
//! per minute admit exactly 100, trial after trial.

use std::net::SocketAddr;

use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::*;
use http::StatusCode;

const TRIALS: usize = 20;
const REQUESTS: usize = 1000;
const LIMIT: usize = 100;

/// The shared limit: 100 per minute per `x-trial` value, exact
/// (`sliding_log`), failing closed so that no decision ever escapes Redis.
fn replica_config(store: &str) -> String {
    format!(
        "store: {{ {store}, timeout: 5s, on_error: fail_closed }}
routes:
  - match: {{ path_prefix: / }}
    respond: {{ body: \"ok\\n\" }}
    limits: [{{ name: trial, algorithm: sliding_log, key: 'header:x-trial', limit: {LIMIT}, window: 1m }}]
"
    )
}

/// `n` requests at once, each on its own connection, spread over `addrs`.
async fn burst(addrs: &[SocketAddr], n: usize, trial: &str) -> Vec<StatusCode> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let addr = addrs[i % addrs.len()];
        let trial = trial.to_owned();
        tasks.spawn(async move {
            let mut s = h1(addr).await;
            let mut req = request("GET", "/", empty());
            req.headers_mut()
                .insert("x-trial", trial.parse().expect("header value"));
            send1(&mut s, req).await.status
        });
    }
    let mut statuses = Vec::with_capacity(n);
    while let Some(s) = tasks.join_next().await {
        statuses.push(s.expect("request task"));
    }
    statuses
}

async fn exactly_the_limit_in_every_trial(replicas: &[Running], run: &str) {
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.addr).collect();
    for trial in 0..TRIALS {
        let statuses = burst(&addrs, REQUESTS, &format!("{run}-{trial}")).await;
        let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
        let limited = statuses
            .iter()
            .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
            .count();
        assert_eq!(
            (ok, limited),
            (LIMIT, REQUESTS - LIMIT),
            "trial {trial}: {ok} admitted, {limited} limited, others: {:?}",
            statuses
                .iter()
                .filter(|s| !matches!(s.as_u16(), 200 | 429))
                .collect::<Vec<_>>()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_one_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let yaml = replica_config(&format!("kind: redis, url: '{}'", redis.url()));
    let replicas: Vec<Running> = (0..3).map(|_| Running::start(&yaml)).collect();
    exactly_the_limit_in_every_trial(&replicas, "single").await;
    assert!(redis.keys_without_ttl("tollgate:*").is_empty());
    // One multiplexed connection per replica, however many requests, and
    // one subscription to resets each.
    assert_eq!(
        redis.clients(),
        (3, 3),
        "{}",
        redis.cli(&["CLIENT", "LIST"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_a_redis_cluster_admit_exactly_the_limit() {
    let cluster = RedisCluster::start();
    let yaml = replica_config(&format!("kind: redis_cluster, nodes: {}", cluster.seeds()));
    let replicas: Vec<Running> = (0..3).map(|_| Running::start(&yaml)).collect();
    exactly_the_limit_in_every_trial(&replicas, "cluster").await;
    // Requests on one key share script calls, on a cluster as on one node.
    let calls = cluster.script_calls();
    assert!(
        calls < (TRIALS * REQUESTS / 4) as u64,
        "{calls} script calls for {} requests",
        TRIALS * REQUESTS
    );
    // The trials' keys are spread over the nodes, and all of them expire.
    let spread = cluster
        .nodes
        .iter()
        .filter(|n| n.key_count("tollgate:*") > 0)
        .count();
    assert!(spread >= 2, "keys on {spread} node(s) only");
    for n in &cluster.nodes {
        assert!(n.keys_without_ttl("tollgate:*").is_empty());
    }
}
