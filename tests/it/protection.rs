//! Connection and request limits: slowloris, oversize headers and bodies,
//! idle connections, and the global connection cap.

use std::time::Duration;

use tokio::time::Instant;

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn guarded(up: &Upstream, server: &str) -> String {
    config(&format!(
        "server: {{ {server} }}\nupstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - {{ match: {{ path_prefix: /small }}, upstream: api, max_body_size: 1KB }}\n  - {{ match: {{ path_prefix: / }}, upstream: api }}\n",
        up.addr
    ))
}

/// Waits until the peer closes; returns how long that took.
async fn closed_within(tcp: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(limit, tcp.read(&mut buf)).await {
            Err(_) => panic!("connection still open after {limit:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test]
async fn slowloris_connections_are_closed_at_the_header_read_timeout() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&guarded(&up, "header_read_timeout: 500ms")).await;
    let mut tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n")
        .await
        .unwrap();
    // Dribble a header byte now and then, never finishing the head (the
    // pause paces the attacker; it orders nothing).
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = tcp.write_all(b"x").await;
    }
    let took = closed_within(&mut tcp, Duration::from_secs(10)).await;
    assert!(
        took >= Duration::from_millis(200),
        "closed too early: {took:?}"
    );
    assert_eq!(up.hits(), 0);
}

#[tokio::test]
async fn a_later_request_head_must_complete_in_time_but_an_idle_keep_alive_may_wait() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&guarded(
        &up,
        "header_read_timeout: 400ms, idle_timeout: 30s",
    ))
    .await;
    let first = b"GET / HTTP/1.1\r\nhost: a\r\n\r\n";
    // Served once, then idle past header_read_timeout: still open, and
    // it serves the next request.
    let mut idle = TcpStream::connect(proxy.addr()).await.unwrap();
    idle.write_all(first).await.unwrap();
    let mut buf = vec![0u8; 64 << 10];
    assert!(idle.read(&mut buf).await.unwrap() > 0);
    // Served once, then the next head dribbles in and never completes.
    let mut slow = TcpStream::connect(proxy.addr()).await.unwrap();
    slow.write_all(first).await.unwrap();
    assert!(slow.read(&mut buf).await.unwrap() > 0);
    slow.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n")
        .await
        .unwrap();
    let took = closed_within(&mut slow, Duration::from_secs(10)).await;
    assert!(
        took >= Duration::from_millis(300),
        "closed too early: {took:?}"
    );
    // The idle one outlived the slow one's head timeout.
    idle.write_all(first).await.unwrap();
    let n = idle.read(&mut buf).await.unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
        "the idle keep-alive connection still serves"
    );
    assert_eq!(up.hits(), 3);
}

#[tokio::test]
async fn oversize_headers_get_a_431_problem() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&guarded(&up, "max_header_size: 4KB, max_headers: 20")).await;
    let mut c = h1(proxy.addr()).await;
    let big = "v".repeat(6 * 1024);
    let req = http::Request::builder()
        .uri("/")
        .header("host", "a")
        .header("x-big", big)
        .body(empty())
        .unwrap();
    let got = send1(&mut c, req).await;
    assert_eq!(got.status, 431);
    assert_eq!(got.headers["content-type"], "application/problem+json");
    assert_eq!(got.json()["status"], 431);

    let mut c = h1(proxy.addr()).await;
    let mut req = http::Request::builder().uri("/").header("host", "a");
    for i in 0..30 {
        req = req.header(format!("x-h{i}"), "1");
    }
    let got = send1(&mut c, req.body(empty()).unwrap()).await;
    assert_eq!(got.status, 431);

    // Far past any buffer: still a 431, from the parser itself.
    let huge = format!(
        "GET / HTTP/1.1\r\nhost: a\r\nx-huge: {}\r\n\r\n",
        "h".repeat(512 * 1024)
    );
    let out = raw(proxy.addr(), huge.as_bytes(), Duration::from_secs(5)).await;
    assert!(
        out.starts_with("HTTP/1.1 431"),
        "{}",
        &out[..out.len().min(200)]
    );
    assert_eq!(up.hits(), 0);
}

#[tokio::test]
async fn oversize_bodies_get_a_413_problem() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&guarded(&up, "max_body_size: 64KB")).await;

    // Declared length over the route's limit: refused before the upstream.
    let mut c = h1(proxy.addr()).await;
    let got = send1(&mut c, request("POST", "/small", full(vec![b'a'; 2048]))).await;
    assert_eq!(got.status, 413);
    assert_eq!(got.json()["status"], 413);
    assert_eq!(up.hits(), 0);

    // Within the route's limit: fine.
    let mut c = h1(proxy.addr()).await;
    let got = send1(&mut c, request("POST", "/small", full(vec![b'a'; 1000]))).await;
    assert_eq!(got.status, 200);

    // Chunked, no length: cut off once it passes the server-wide limit.
    let mut c = h1(proxy.addr()).await;
    let got = send1(
        &mut c,
        request("POST", "/big", without_length(pattern(1024 * 1024))),
    )
    .await;
    assert_eq!(got.status, 413, "{:?}", got.body);
}

/// Hides the size hint so hyper sends `Transfer-Encoding: chunked`.
fn without_length(body: ClientBody) -> ClientBody {
    use http_body_util::BodyExt;
    struct NoHint(ClientBody);
    impl hyper::body::Body for NoHint {
        type Data = bytes::Bytes;
        type Error = BoxError;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, BoxError>>> {
            std::pin::Pin::new(&mut self.0).poll_frame(cx)
        }
    }
    NoHint(body).boxed()
}

#[tokio::test]
async fn idle_connections_are_closed() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&guarded(&up, "idle_timeout: 300ms")).await;
    let mut tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let took = closed_within(&mut tcp, Duration::from_secs(10)).await;
    assert!(
        took >= Duration::from_millis(250),
        "closed before the idle timeout: {took:?}"
    );

    // HTTP/2 with no stream open gets a GOAWAY and the connection ends.
    let tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::builder()
        .uri("http://a/")
        .body(empty())
        .unwrap();
    assert_eq!(
        collect(sender.send_request(req).await.unwrap())
            .await
            .status,
        200
    );
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("idle h2 connection closed")
        .unwrap()
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(250));
}

#[tokio::test]
async fn the_connection_cap_queues_new_connections_until_one_closes() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&guarded(&up, "max_connections: 2")).await;
    let mut a = h1(proxy.addr()).await;
    let mut b = h1(proxy.addr()).await;
    assert_eq!(
        send1(&mut a, request("GET", "/a", empty())).await.status,
        200
    );
    assert_eq!(
        send1(&mut b, request("GET", "/b", empty())).await.status,
        200
    );

    let mut third = tokio::spawn(async move { get(proxy.addr(), "/c").await.status });
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut third)
            .await
            .is_err(),
        "a third connection is not served while two are open"
    );
    drop(a);
    let status = tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("served once a slot frees")
        .unwrap();
    assert_eq!(status, 200);
    drop(b);
}

#[tokio::test]
async fn http2_advertises_the_configured_stream_limit() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&guarded(&up, "h2_max_concurrent_streams: 7")).await;
    let mut tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    // Client preface and an empty SETTINGS frame.
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let mut head = [0u8; 9];
    tcp.read_exact(&mut head).await.unwrap();
    assert_eq!(head[3], 0x4, "the server's first frame is SETTINGS");
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    tcp.read_exact(&mut payload).await.unwrap();
    let max_streams = payload
        .chunks(6)
        .find(|s| u16::from_be_bytes([s[0], s[1]]) == 0x3)
        .map(|s| u32::from_be_bytes([s[2], s[3], s[4], s[5]]));
    assert_eq!(max_streams, Some(7));
}

#[tokio::test]
async fn a_client_that_stops_sending_its_body_gets_a_408() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&guarded(&up, "body_read_timeout: 300ms")).await;
    let mut tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    tcp.write_all(b"POST /upload HTTP/1.1\r\nhost: a\r\ncontent-length: 100\r\n\r\n0123456789")
        .await
        .unwrap();
    let started = Instant::now();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    assert!(out.contains("application/problem+json"), "{out}");
    assert!(started.elapsed() >= Duration::from_millis(250));
}
