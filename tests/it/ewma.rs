//! `balance: ewma`: two targets drawn, the one with the lower peak-EWMA
//! latency times requests in flight taken. A slow target gets little of
//! the traffic; a target that refuses in a millisecond (503) does not
//! attract more of it for being fast, as it would under a pure latency
//! or least-connections rule.

use std::net::SocketAddr;
use std::time::Duration;

use crate::balancing::{count, sequence, Named};
use crate::common::*;

async fn proxy(a: SocketAddr, b: SocketAddr, balance: &str, protocol: &str) -> TestProxy {
    TestProxy::spawn(&format!(
        "listeners: [{{ bind: '127.0.0.1:0' }}]
admin: {{ enabled: false }}
log: {{ access_log: false }}
upstreams:
  api: {{ targets: ['{a}', '{b}'], balance: {balance}, protocol: {protocol} }}
routes: [{{ match: {{ path_prefix: / }}, upstream: api }}]
"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_faster_target_takes_most_and_a_fast_refusal_attracts_nothing() {
    for protocol in ["http1", "h2"] {
        fast_refusals_attract_nothing(protocol).await;
    }
}

async fn fast_refusals_attract_nothing(protocol: &str) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let fast = Named::serve("fast", any, 200, Duration::from_millis(1)).await;
    let slow = Named::serve("slow", any, 200, Duration::from_millis(40)).await;
    let p = proxy(fast.addr, slow.addr, "ewma", protocol).await;
    let seen = sequence(p.addr(), 60).await;
    assert!(count(&seen, "fast") >= 48, "{seen:?}");

    let refuser = Named::serve("refuser", any, 503, Duration::ZERO).await;
    let worker = Named::serve("worker", any, 200, Duration::from_millis(10)).await;
    let p = proxy(refuser.addr, worker.addr, "ewma", protocol).await;
    let seen = sequence(p.addr(), 60).await;
    assert!(count(&seen, "!503") <= 15, "ewma: {seen:?}");
    // least_conn, one request at a time, shares them evenly.
    let p = proxy(refuser.addr, worker.addr, "least_conn", protocol).await;
    let seen = sequence(p.addr(), 60).await;
    assert_eq!(count(&seen, "!503"), 30, "least_conn: {seen:?}");
}
