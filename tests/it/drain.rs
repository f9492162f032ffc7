//! A rollout's drain drops nothing: on SIGTERM `/readyz` turns 503 at
//! once, while for `server.drain_delay` the listeners keep accepting and
//! serving (each HTTP/1.1 answer with `Connection: close`, HTTP/2
//! connections told GOAWAY) so clients move to other replicas; then
//! accepting stops and an idle process exits at once.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use crate::common::process::Running;
use crate::common::*;

/// One GET on a new connection: its status and `Connection` field, or
/// why it failed (refused, reset).
async fn fresh_get(addr: SocketAddr) -> Result<(u16, String), String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    let req = http::Request::get("/")
        .header("host", "api.test")
        .body(empty())
        .unwrap();
    let resp = s
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let close = resp
        .headers()
        .get("connection")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let status = resp.status().as_u16();
    resp.into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?;
    Ok((status, close))
}

async fn ready(admin: SocketAddr) -> u16 {
    get(admin, "/readyz").await.status.as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_drain_no_connection_is_refused_and_every_client_moves_on() {
    let mut p = Running::start(
        "server: { drain_delay: 2s }\nroutes: [{ match: { path_prefix: / }, respond: { body: ok } }]\n",
    );
    let addr = p.addr;
    // Connections opened before: an HTTP/1.1 keep-alive one and an
    // HTTP/2 one, each with a request answered.
    let mut kept = h1(addr).await;
    assert_eq!(
        send1(&mut kept, request("GET", "/", empty())).await.status,
        200
    );
    let mut multiplexed = h2(addr).await;
    let req = http::Request::get(format!("http://{addr}/"))
        .body(empty())
        .unwrap();
    assert_eq!(multiplexed.send_request(req).await.unwrap().status(), 200);
    assert_eq!(ready(p.admin).await, 200);

    // A client opening a new connection every 20 ms, through SIGTERM.
    let term = Instant::now() + Duration::from_millis(300);
    let client = tokio::spawn(async move {
        let mut seen = Vec::new();
        let mut at = Instant::now();
        while at < term + Duration::from_millis(1900) {
            tokio::time::sleep_until(at).await;
            let since = at.checked_duration_since(term);
            seen.push((since, fresh_get(addr).await));
            at += Duration::from_millis(20);
        }
        seen
    });
    tokio::time::sleep_until(term).await;
    p.signal("-TERM");
    let signalled = Instant::now();
    // Not ready at once.
    until(
        Duration::from_millis(500),
        "/readyz 503 after SIGTERM",
        || async { ready(p.admin).await == 503 },
    )
    .await;
    // The kept connection's next answer closes it.
    let got = send1(&mut kept, request("GET", "/", empty())).await;
    assert_eq!(
        (
            got.status.as_u16(),
            got.headers["connection"].to_str().unwrap()
        ),
        (200, "close")
    );
    // The HTTP/2 connection was told GOAWAY: its client moves on.
    until(
        Duration::from_millis(1500),
        "GOAWAY on the HTTP/2 connection",
        || std::future::ready(multiplexed.is_closed()),
    )
    .await;

    let seen = client.await.unwrap();
    let during: Vec<_> = seen.iter().filter(|(since, _)| since.is_some()).collect();
    assert!(
        during.len() > 50,
        "{} requests during the drain",
        during.len()
    );
    for (since, got) in &seen {
        match (since, got) {
            (_, Ok((200, close))) => {
                if since.is_some_and(|s| s > Duration::from_millis(50)) {
                    assert_eq!(close, "close", "an answer {since:?} into the drain");
                }
            }
            other => panic!("a request failed during the drain: {other:?}"),
        }
    }
    // Idle now: the process exits once the drain is over, not after the
    // 30 s shutdown_grace.
    let exited = loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            break Some((status, signalled.elapsed()));
        }
        if signalled.elapsed() > Duration::from_secs(10) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (status, took) = exited.expect("still running 10 s after SIGTERM");
    assert!(status.success(), "{status:?}");
    assert!(
        took < Duration::from_secs(3),
        "exited {took:?} after SIGTERM: drain_delay 2 s plus a second at most"
    );
    assert!(
        took >= Duration::from_secs(2),
        "exited before the drain ended: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_drain_delay_sigterm_stops_accepting_at_once_and_exits() {
    let mut p = Running::start("routes: [{ match: { path_prefix: / }, respond: { body: ok } }]\n");
    // A keep-alive connection that stays open and idle.
    let mut idle = h1(p.addr).await;
    assert_eq!(
        send1(&mut idle, request("GET", "/", empty())).await.status,
        200
    );
    let signalled = Instant::now();
    p.signal("-TERM");
    let exited = loop {
        if p.child.try_wait().unwrap().is_some() {
            break signalled.elapsed();
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(10),
            "still running"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        exited < Duration::from_secs(1),
        "an idle connection held the exit for {exited:?}"
    );
}
