//! When the upstream misbehaves, tollgate answers within its timeouts with a
//! problem body, never a hang and never a truncated response that looks
//! complete; retries never replay a request that may have been processed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::common::*;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// A port with nothing listening on it.
async fn dead_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr
}

/// One worker: every request, whatever its client connection, meets the
/// same pool of upstream connections.
fn route_to(targets: &str, upstream_extra: &str) -> String {
    forward_all(targets, upstream_extra, "server: { workers: 1 }")
}

#[tokio::test]
async fn unreachable_upstream_is_a_fast_502_problem() {
    let dead = dead_port().await;
    let proxy = TestProxy::spawn(&route_to(&format!("'{dead}'"), ", connect_timeout: 5s")).await;
    let started = Instant::now();
    let got = get(proxy.addr(), "/x").await;
    assert_eq!(got.status, 502);
    assert_eq!(got.headers["content-type"], "application/problem+json");
    let p = got.json();
    assert_eq!(p["status"], 502);
    assert!(
        p["detail"].as_str().unwrap().contains(&dead.to_string()),
        "{p}"
    );
    // A refused connect does not wait for the 5 s connect timeout.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn hanging_upstream_is_a_504_at_the_configured_timeout() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&route_to(&format!("'{}'", up.addr), ", timeout: 700ms")).await;
    let started = Instant::now();
    let got = get(proxy.addr(), "/hang").await;
    let took = started.elapsed();
    assert_eq!(got.status, 504);
    assert_eq!(got.json()["status"], 504);
    assert!(
        took >= Duration::from_millis(700),
        "answered before the timeout: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

/// Each request on a kept upstream connection gets the whole timeout from
/// when it is sent (the connection's timer is moved, not left at its first
/// request's deadline), also after the timer went off while the connection
/// sat idle in the pool; and a request that hangs is still cut at it. The
/// margins (400 ms each way) leave room for a slow machine.
#[tokio::test]
async fn every_request_on_a_kept_connection_gets_the_whole_timeout() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&route_to(&format!("'{}'", up.addr), ", timeout: 1s")).await;
    assert_eq!(get(proxy.addr(), "/").await.status, 200);
    // Paces the next request past half the timeout: a deadline left at
    // the first request's would cut it.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(get(proxy.addr(), "/slow?ms=600").await.status, 200);
    // Idle in the pool past the timeout: its timer goes off unused.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(get(proxy.addr(), "/slow?ms=300").await.status, 200);
    assert_eq!(up.conns(), 1, "one upstream connection, kept");
    let started = Instant::now();
    let got = get(proxy.addr(), "/hang").await;
    let took = started.elapsed();
    assert_eq!(got.status, 504);
    assert!(
        took >= Duration::from_secs(1),
        "answered before the timeout: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_eq!(get(proxy.addr(), "/").await.status, 200);
}

#[tokio::test]
async fn upstream_dying_mid_body_is_an_error_not_a_complete_response() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&route_to(&format!("'{}'", up.addr), "")).await;

    // HTTP/1.1: the declared length is never reached; the body read fails.
    let mut c = h1(proxy.addr()).await;
    c.ready().await.unwrap();
    let resp = c
        .send_request(request("GET", "/die-mid-body", empty()))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "the head was already sent");
    assert!(
        resp.into_body().collect().await.is_err(),
        "a cut body must surface as an error"
    );

    // HTTP/2: the stream is reset.
    let mut c = h2(proxy.addr()).await;
    let req = http::Request::builder()
        .uri("http://a/die-mid-body")
        .body(empty())
        .unwrap();
    let resp = c.send_request(req).await.unwrap();
    assert!(resp.into_body().collect().await.is_err());
}

#[tokio::test]
async fn round_robin_skips_a_dead_target_during_its_cooldown() {
    let a = Upstream::spawn().await;
    let b = Upstream::spawn().await;
    let dead = dead_port().await;
    let proxy = TestProxy::spawn(&route_to(
        &format!("'{}', '{}', '{dead}'", a.addr, b.addr),
        ", cooldown: 1m",
    ))
    .await;
    for _ in 0..30 {
        let got = get(proxy.addr(), "/rr").await;
        assert_eq!(
            got.status, 200,
            "a dead target never fails a request that another target can take"
        );
    }
    assert_eq!(a.hits() + b.hits(), 30);
    assert!(
        a.hits() >= 10 && b.hits() >= 10,
        "spread: a={} b={}",
        a.hits(),
        b.hits()
    );
}

/// An upstream that answers the first request on each connection with
/// keep-alive, then silently closes the connection when a second request
/// arrives on it: the race of an upstream idle timeout expiring just as
/// tollgate reuses the connection.
async fn closes_reused_connections() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = l.accept().await else {
                return;
            };
            let count = count.clone();
            tokio::spawn(async move {
                let mut r = BufReader::new(tcp);
                let Some((_, content_length)) = read_head(&mut r).await else {
                    return;
                };
                let mut body = vec![0; content_length];
                r.read_exact(&mut body).await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                let mut tcp = r.into_inner();
                tcp.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst")
                    .await
                    .unwrap();
                // Wait for the next request head, then hang up without answering.
                let mut buf = [0u8; 1];
                let _ = tcp.read(&mut buf).await;
            });
        }
    });
    (addr, answered)
}

#[tokio::test]
async fn idempotent_requests_retry_once_on_a_fresh_connection() {
    let (addr, answered) = closes_reused_connections().await;
    let proxy = TestProxy::spawn(&route_to(&format!("'{addr}'"), ", idle_timeout: 30s")).await;
    assert_eq!(get(proxy.addr(), "/one").await.status, 200);
    let got = get(proxy.addr(), "/two").await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    assert_eq!(got.body, "first");
    assert_eq!(answered.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn requests_with_bodies_are_never_replayed() {
    let (addr, answered) = closes_reused_connections().await;
    let proxy = TestProxy::spawn(&route_to(&format!("'{addr}'"), ", idle_timeout: 30s")).await;
    assert_eq!(get(proxy.addr(), "/one").await.status, 200);
    let mut c = h1(proxy.addr()).await;
    let got = send1(&mut c, request("POST", "/pay", full(&b"amount=5"[..]))).await;
    assert_eq!(
        got.status, 502,
        "a POST that may have been processed is not sent twice"
    );
    assert_eq!(got.json()["status"], 502);
    assert_eq!(answered.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn stale_pooled_connections_are_not_reused() {
    let up = Upstream::spawn().await;
    let (proxy, clock) = TestProxy::spawn_frozen(&route_to(
        &format!("'{}'", up.addr),
        ", idle_timeout: 200ms",
    ))
    .await;
    assert_eq!(get(proxy.addr(), "/a").await.status, 200);
    assert_eq!(get(proxy.addr(), "/b").await.status, 200);
    assert_eq!(up.conns(), 1, "a fresh idle connection is reused");
    clock.advance(Duration::from_millis(400));
    assert_eq!(get(proxy.addr(), "/c").await.status, 200);
    assert_eq!(up.conns(), 2, "one idle past idle_timeout is replaced");
}

#[tokio::test]
async fn https_upstreams_are_verified_against_the_configured_ca() {
    let ca = TestCa::new();
    let up = Upstream::spawn_tls(ca.acceptor(&["api.internal"])).await;
    let yaml = route_to(
        &format!("'{}'", up.addr),
        &format!(
            ", tls: {{ ca: '{}', server_name: api.internal }}",
            ca.ca_pem.display()
        ),
    );
    let proxy = TestProxy::spawn(&yaml).await;
    let got = get(proxy.addr(), "/secure").await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["uri"], "/secure");

    // A name the certificate does not carry fails verification: 502.
    let other = TestCa::new();
    let yaml = route_to(
        &format!("'{}'", up.addr),
        &format!(
            ", tls: {{ ca: '{}', server_name: api.internal }}",
            other.ca_pem.display()
        ),
    );
    let proxy = TestProxy::spawn(&yaml).await;
    let got = get(proxy.addr(), "/secure").await;
    assert_eq!(got.status, 502);
    assert!(
        got.json()["detail"].as_str().unwrap().contains("TLS"),
        "{}",
        got.json()
    );
}

#[tokio::test]
async fn an_upstream_stalling_mid_body_is_cut_at_the_timeout() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&route_to(&format!("'{}'", up.addr), ", timeout: 500ms")).await;
    let mut c = h1(proxy.addr()).await;
    c.ready().await.unwrap();
    let resp = c
        .send_request(request("GET", "/die-mid-body?pause_ms=60000", empty()))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let started = Instant::now();
    let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
        .await
        .expect("a stalled body must not hang the client");
    assert!(
        body.is_err(),
        "a stalled body ends in an error, not a short complete response"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
}
