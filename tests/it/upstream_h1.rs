//! How tollgate reads what the upstream says: every HTTP/1 framing an
//! upstream may use reaches the client whole, a framing that cannot be
//! trusted is refused or never reused, a response that streams while the
//! request is still being sent is relayed both ways at once, and an idle
//! connection the upstream closed is not written into.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// An upstream written byte by byte: for each request it reads the head
/// (and a `Content-Length` body), then writes `answer(path)`; it hangs up
/// after an answer when `answer` says so. Counts its connections.
struct Scripted {
    addr: SocketAddr,
    conns: Arc<AtomicUsize>,
    /// Signalled when it hangs up on a connection.
    hung_up: Arc<Notify>,
    /// Tells an `AfterIdle` connection that the proxy has pooled it.
    pooled: Arc<Notify>,
}

/// What to send for a path, and whether to hang up after it (at once, or
/// after a pause with the connection idle).
type Script = fn(&str) -> (Vec<u8>, Hangup);

#[derive(Clone, Copy, PartialEq)]
enum Hangup {
    No,
    Now,
    AfterIdle,
}

impl Scripted {
    async fn spawn(script: Script) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = Arc::new(AtomicUsize::new(0));
        let (hung_up, pooled) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let (count, notify, idle) = (conns.clone(), hung_up.clone(), pooled.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let (notify, idle) = (notify.clone(), idle.clone());
                tokio::spawn(async move {
                    let mut r = BufReader::new(tcp);
                    while let Some(path) = read_request(&mut r).await {
                        let (answer, hangup) = script(&path);
                        if r.get_mut().write_all(&answer).await.is_err() {
                            return;
                        }
                        match hangup {
                            Hangup::No => continue,
                            Hangup::Now => {}
                            Hangup::AfterIdle => idle.notified().await,
                        }
                        let _ = r.get_mut().shutdown().await;
                        drop(r);
                        notify.notify_one();
                        return;
                    }
                });
            }
        });
        Scripted {
            addr,
            conns,
            hung_up,
            pooled,
        }
    }

    fn conns(&self) -> usize {
        self.conns.load(Ordering::SeqCst)
    }
}

/// Reads one request (head and `Content-Length` body): its path.
async fn read_request(r: &mut BufReader<TcpStream>) -> Option<String> {
    let (path, length) = read_head(r).await?;
    let mut body = vec![0; length];
    r.read_exact(&mut body).await.ok()?;
    Some(path)
}

fn proxy_to(up: SocketAddr) -> String {
    // One worker: the requests of a test meet one pool.
    forward_all(&format!("'{up}'"), "", "server: { workers: 1 }")
}

fn framings(path: &str) -> (Vec<u8>, Hangup) {
    let (bytes, hangup): (&[u8], Hangup) = match path {
        "/chunked" => (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
            Hangup::No,
        ),
        "/trailers" => (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/grpc\r\nTrailer: grpc-status\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\ngrpc-status: 0\r\nContent-Length: 99\r\nConnection: x-hop\r\nx-checksum: abc\r\n\r\n",
            Hangup::No,
        ),
        "/length" => (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", Hangup::No),
        "/until-close" => (
            b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end",
            Hangup::Now,
        ),
        "/http10" => (b"HTTP/1.0 200 OK\r\n\r\nold style", Hangup::Now),
        "/early-hints" => (
            b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal",
            Hangup::No,
        ),
        "/te-and-cl" => (
            b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            Hangup::No,
        ),
        "/two-lengths" => (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
            Hangup::Now,
        ),
        "/bad-chunk" => (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
            Hangup::No,
        ),
        "/not-http" => (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", Hangup::Now),
        "/huge-head" => {
            let mut head = b"HTTP/1.1 200 OK\r\nX-Big: ".to_vec();
            head.extend(std::iter::repeat_n(b'a', 70 << 10));
            head.extend_from_slice(b"\r\nContent-Length: 0\r\n\r\n");
            return (head, Hangup::Now);
        }
        "/idle-close" => (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", Hangup::AfterIdle),
        _ => (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", Hangup::No),
    };
    (bytes.to_vec(), hangup)
}

#[tokio::test]
async fn every_response_framing_reaches_the_client_whole() {
    let up = Scripted::spawn(framings).await;
    let proxy = TestProxy::spawn(&proxy_to(up.addr)).await;
    let mut c = h1(proxy.addr()).await;
    let cases = [
        ("/chunked", "hello world"),
        ("/length", "hello"),
        ("/until-close", "until the end"),
        ("/http10", "old style"),
        ("/early-hints", "final"),
        ("/te-and-cl", "ok"),
    ];
    for (path, body) in cases {
        let got = send1(&mut c, request("GET", path, empty())).await;
        assert_eq!(got.status, 200, "{path}");
        assert_eq!(got.body, body, "{path}");
        assert!(!got.headers.contains_key("transfer-encoding") || path != "/length");
    }
    // The chunked body's trailer is dropped, as nginx does: it reaches
    // the client neither as a field of the head nor after the body.
    let wire = raw(
        proxy.addr(),
        b"GET /chunked HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
        Duration::from_secs(10),
    )
    .await;
    assert!(wire.starts_with("HTTP/1.1 200"), "{wire}");
    assert!(wire.contains("hello"), "{wire}");
    assert!(!wire.to_ascii_lowercase().contains("x-trailer"), "{wire}");
}

#[tokio::test]
async fn chunked_trailers_reach_http2_clients_and_the_connection_is_reused() {
    let up = Scripted::spawn(framings).await;
    let proxy = TestProxy::spawn(&proxy_to(up.addr)).await;
    let mut c = h2(proxy.addr()).await;
    for _ in 0..3 {
        let req = http::Request::get("http://a.test/trailers")
            .header("te", "trailers")
            .body(empty())
            .unwrap();
        let resp = c.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap();
        let trailers = body.trailers().cloned().expect("trailers relayed");
        assert_eq!(body.to_bytes(), "hello");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers["x-checksum"], "abc");
        // Fields that frame or route a message never travel as trailers.
        assert!(!trailers.contains_key("content-length"), "{trailers:?}");
        assert!(!trailers.contains_key("connection"), "{trailers:?}");
    }
    // Read to its end, trailers and all: one connection served all three.
    assert_eq!(up.conns(), 1);
    // An HTTP/1.1 client gets the body whole and no trailer (as nginx).
    let wire = raw(
        proxy.addr(),
        b"GET /trailers HTTP/1.1\r\nHost: a.test\r\nTE: trailers\r\nConnection: close, TE\r\n\r\n",
        Duration::from_secs(10),
    )
    .await;
    assert!(wire.starts_with("HTTP/1.1 200"), "{wire}");
    assert!(wire.ends_with("5\r\nhello\r\n0\r\n\r\n"), "{wire}");
}

#[tokio::test]
async fn connections_are_reused_only_after_a_clean_end() {
    let up = Scripted::spawn(framings).await;
    let proxy = TestProxy::spawn(&proxy_to(up.addr)).await;
    let mut c = h1(proxy.addr()).await;
    // (path, whether the connection may serve the next request)
    let cases = [
        ("/length", true),
        ("/chunked", true),
        ("/early-hints", true),
        ("/until-close", false),
        ("/http10", false),
        ("/te-and-cl", false),
    ];
    for (path, reusable) in cases {
        // A fresh connection for the case, then the case, then a probe.
        let _ = send1(&mut c, request("GET", "/until-close", empty())).await;
        let before = up.conns();
        assert_eq!(
            send1(&mut c, request("GET", path, empty())).await.status,
            200
        );
        assert_eq!(up.conns(), before + 1, "{path} opened one connection");
        assert_eq!(
            send1(&mut c, request("GET", "/length", empty()))
                .await
                .status,
            200
        );
        let reused = up.conns() == before + 1;
        assert_eq!(reused, reusable, "{path}: connection reused?");
    }
}

#[tokio::test]
async fn framings_that_cannot_be_trusted_are_a_502_or_a_broken_body() {
    let up = Scripted::spawn(framings).await;
    let proxy = TestProxy::spawn(&proxy_to(up.addr)).await;
    for path in ["/two-lengths", "/not-http", "/huge-head"] {
        let got = get(proxy.addr(), path).await;
        assert_eq!(got.status, 502, "{path}");
        assert_eq!(got.json()["status"], 502, "{path}");
    }
    // A chunk size that is not hex, in the same write as the head: the
    // answer failed before any byte of it reached the client, which gets
    // a 502 problem answer (not a connection closed without a status
    // line, nor a response that ends as if it were complete).
    let got = get(proxy.addr(), "/bad-chunk").await;
    assert_eq!(got.status, 502);
    assert!(
        got.json()["detail"]
            .as_str()
            .unwrap()
            .contains("bad chunk size"),
        "{:?}",
        got.body
    );
}

#[tokio::test]
async fn an_idle_connection_the_upstream_closed_is_not_written_into() {
    let up = Scripted::spawn(framings).await;
    let proxy = TestProxy::spawn(&proxy_to(up.addr)).await;
    assert_eq!(get(proxy.addr(), "/idle-close").await.status, 200);
    // The upstream hangs up on the now idle pooled connection.
    up.pooled.notify_one();
    tokio::time::timeout(Duration::from_secs(10), up.hung_up.notified())
        .await
        .expect("the upstream hung up");
    // The proxy has not read from it since; it still must not send on it:
    // a second request takes a fresh connection, with no failed attempt.
    let retries = |p: &TestProxy| p.pipeline.upstreams_report()[0].targets[0].retries[10];
    let got = get(proxy.addr(), "/length").await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body, "hello");
    assert_eq!(
        retries(&proxy),
        0,
        "no request went into the closed connection"
    );
    assert_eq!(up.conns(), 2);
}

/// An upstream that answers at once and echoes the request body back
/// chunk by chunk as it reads it, the way a streaming transcoder does.
async fn echoing_while_reading() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut r = BufReader::new(tcp);
                let Some((_, mut length)) = read_head(&mut r).await else {
                    return;
                };
                let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
                if r.get_mut().write_all(head).await.is_err() {
                    return;
                }
                let mut buf = vec![0u8; 64 << 10];
                while length > 0 {
                    let want = buf.len().min(length);
                    let Ok(n) = r.read(&mut buf[..want]).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    length -= n;
                    let mut chunk = format!("{n:x}\r\n").into_bytes();
                    chunk.extend_from_slice(&buf[..n]);
                    chunk.extend_from_slice(b"\r\n");
                    if r.get_mut().write_all(&chunk).await.is_err() {
                        return;
                    }
                }
                let _ = r.get_mut().write_all(b"0\r\n\r\n").await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_response_that_streams_while_the_request_is_sent_flows_both_ways() {
    let up = echoing_while_reading().await;
    let proxy = TestProxy::spawn(&forward_all(
        &format!("'{up}'"),
        "",
        "server: { max_body_size: 64MB }",
    ))
    .await;
    // Far more than the socket buffers hold in both directions: sending it
    // all before reading anything would deadlock.
    let size: u64 = 48 << 20;
    let mut c = h1(proxy.addr()).await;
    c.ready().await.unwrap();
    let sent = async {
        let resp = c
            .send_request(request("POST", "/echo", pattern(size)))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.unwrap().to_bytes()
    };
    let body = tokio::time::timeout(Duration::from_secs(60), sent)
        .await
        .expect("the exchange finished (no deadlock)");
    assert_eq!(body.len() as u64, size);
    let differs = body
        .iter()
        .enumerate()
        .position(|(i, b)| *b != pattern_byte(i as u64));
    assert_eq!(differs, None, "the echoed body differs from this offset");
}
