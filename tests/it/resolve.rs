//! Targets written as names with `resolve`, against a DNS server on
//! loopback started by the test: every A record becomes a target, a
//! changed answer changes the targets within its TTL, a failing server
//! keeps the last good set (logged and counted), and a name that does
//! not resolve at start leaves an empty group answering 502, not a crash.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{rdata::A, RData, Record, RecordType};
use tokio::net::{TcpListener, UdpSocket};

use crate::balancing::{count, sequence, Named};
use crate::common::*;

/// What the responder answers for every A question (`None`: SERVFAIL).
type Answer = Arc<Mutex<Option<Vec<Ipv4Addr>>>>;

/// A DNS server on 127.0.0.1 answering A questions from `answer`, TTL 1 s;
/// other types get an empty answer.
async fn dns(answer: Answer) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            let Ok(query) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut reply = Message::new(query.metadata.id, MessageType::Response, OpCode::Query);
            reply.metadata.recursion_desired = query.metadata.recursion_desired;
            reply.metadata.recursion_available = true;
            reply.queries = query.queries.clone();
            let ips = answer.lock().unwrap().clone();
            match ips {
                None => reply.metadata.response_code = ResponseCode::ServFail,
                Some(ips) => {
                    for q in &query.queries {
                        if q.query_type() == RecordType::A {
                            for ip in &ips {
                                reply.answers.push(Record::from_rdata(
                                    q.name().clone(),
                                    1,
                                    RData::A(A(*ip)),
                                ));
                            }
                        }
                    }
                }
            }
            if let Ok(bytes) = reply.to_vec() {
                let _ = socket.send_to(&bytes, from).await;
            }
        }
    });
    addr
}

/// Two backends on one port, at 127.0.0.1 and 127.0.0.2. The port is
/// picked on 127.0.0.1; where another test's connection from 127.0.0.2
/// already holds it there, another is picked.
async fn one_port_two_addresses() -> (Named, Named) {
    for _ in 0..50 {
        let first = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = first.local_addr().unwrap().port();
        if let Ok(second) = TcpListener::bind(SocketAddr::from(([127, 0, 0, 2], port))).await {
            return (
                Named::on("one", first, 200, Duration::ZERO),
                Named::on("two", second, 200, Duration::ZERO),
            );
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2 in 50 tries");
}

fn config(name: &str, port: u16, dns: SocketAddr, protocol: &str) -> String {
    format!(
        "listeners: [{{ bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0', token: 'tollgate-test-token' }}
log: {{ access_log: false }}
upstreams:
  api:
    targets: [{{ address: '{name}:{port}', resolve: true }}]
    resolver: {{ address: '{dns}', timeout: 1s }}
    protocol: {protocol}
routes: [{{ match: {{ path_prefix: / }}, upstream: api }}]
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_address_of_a_name_is_a_target_and_follows_the_dns() {
    for protocol in ["http1", "h2"] {
        follows_the_dns(protocol).await;
    }
}

async fn follows_the_dns(protocol: &str) {
    let (one, two) = one_port_two_addresses().await;
    let port = one.addr.port();
    let answer: Answer = Arc::new(Mutex::new(Some(vec![Ipv4Addr::new(127, 0, 0, 1)])));
    let server = dns(answer.clone()).await;
    let proxy = TestProxy::spawn(&config("api.test", port, server, protocol)).await;
    // Resolved at start: the first request already has its target.
    assert_eq!(sequence(proxy.addr(), 4).await, ["one"; 4]);

    // A second record: both addresses take requests within the TTL.
    *answer.lock().unwrap() = Some(vec![
        Ipv4Addr::new(127, 0, 0, 1),
        Ipv4Addr::new(127, 0, 0, 2),
    ]);
    until(
        Duration::from_secs(5),
        "both addresses take requests",
        || {
            let addr = proxy.addr();
            async move {
                let seen = sequence(addr, 4).await;
                count(&seen, "one") == 2 && count(&seen, "two") == 2
            }
        },
    )
    .await;

    // The server fails: the last good set stays, and the failure counts.
    *answer.lock().unwrap() = None;
    let failures = |p: &TestProxy| p.pipeline.upstreams_report()[0].resolve_failures.unwrap();
    until(
        Duration::from_secs(5),
        "a failed lookup counted",
        || async { failures(&proxy) > 0 },
    )
    .await;
    let seen = sequence(proxy.addr(), 4).await;
    assert_eq!(
        (count(&seen, "one"), count(&seen, "two")),
        (2, 2),
        "{seen:?}"
    );
    let metrics = admin_with(&proxy, "tollgate-test-token", "GET", "/metrics", None).await;
    let metrics = String::from_utf8_lossy(&metrics.body);
    assert!(
        metrics.contains("tollgate_upstream_resolve_failures_total{upstream=\"api\"}"),
        "{metrics}"
    );
    // The targets carry the addresses; the API names them.
    let api = admin_with(&proxy, "tollgate-test-token", "GET", "/api/upstreams", None).await;
    let api: serde_json::Value = serde_json::from_slice(&api.body).unwrap();
    let targets: Vec<&str> = api["upstreams"][0]["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["target"].as_str().unwrap())
        .collect();
    assert_eq!(
        targets,
        [format!("127.0.0.1:{port}"), format!("127.0.0.2:{port}")]
    );
    drop(two);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_does_not_resolve_at_start_is_an_empty_group_not_a_crash() {
    for protocol in ["http1", "h2"] {
        resolves_late(protocol).await;
    }
}

async fn resolves_late(protocol: &str) {
    let answer: Answer = Arc::new(Mutex::new(Some(Vec::new())));
    let server = dns(answer.clone()).await;
    let live = Named::spawn("late").await;
    let proxy = TestProxy::spawn(&config("missing.test", live.addr.port(), server, protocol)).await;
    let mut c = h1(proxy.addr()).await;
    let got = send1(&mut c, request("GET", "/", empty())).await;
    assert_eq!(got.status, 502);
    assert!(
        String::from_utf8_lossy(&got.body).contains("not resolved"),
        "{:?}",
        got.body
    );
    // Once the name resolves, requests go to it.
    *answer.lock().unwrap() = Some(vec![Ipv4Addr::new(127, 0, 0, 1)]);
    until(Duration::from_secs(10), "the name resolves", || {
        let addr = proxy.addr();
        async move { sequence(addr, 1).await == ["late"] }
    })
    .await;
}
