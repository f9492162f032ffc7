//! tollgate's own HTTP/1.x server (`listener::h1`) as a client meets it,
//! byte for byte: pipelining, HTTP/1.0, HEAD, heads that come in pieces
//! after the connection waited, bodies that came with their head,
//! connections that move to hyper half-way (a chunked body) and keep
//! working, response framing when the upstream gives no length, and a
//! client hanging up on a request in flight.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// One response read off a raw connection: status line, lower-cased
/// header lines, body (by its `Content-Length`; none for HEAD).
struct Raw {
    status: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn echoed(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

async fn read_response(r: &mut BufReader<TcpStream>, head_request: bool) -> Raw {
    let within = Duration::from_secs(10);
    tokio::time::timeout(within, async {
        let mut status = String::new();
        r.read_line(&mut status).await.unwrap();
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            r.read_line(&mut line).await.unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            let (n, v) = line.trim_end().split_once(':').expect("a header line");
            headers.push((n.to_ascii_lowercase(), v.trim().to_owned()));
        }
        let len: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map_or(0, |(_, v)| v.parse().unwrap());
        let mut body = vec![0; if head_request { 0 } else { len }];
        r.read_exact(&mut body).await.unwrap();
        Raw {
            status: status.trim_end().to_owned(),
            headers,
            body: String::from_utf8(body).unwrap(),
        }
    })
    .await
    .expect("a whole response in time")
}

async fn connect(addr: SocketAddr) -> BufReader<TcpStream> {
    BufReader::new(TcpStream::connect(addr).await.unwrap())
}

/// Writes `bytes` to the proxy.
async fn send(c: &mut BufReader<TcpStream>, bytes: &[u8]) {
    c.get_mut().write_all(bytes).await.unwrap();
}

/// Whether the server closed the connection (reads EOF within a while).
async fn closed(r: &mut BufReader<TcpStream>) -> bool {
    let mut rest = Vec::new();
    matches!(
        tokio::time::timeout(Duration::from_secs(5), r.read_to_end(&mut rest)).await,
        Ok(Ok(0))
    )
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&proxied(&up)).await;
    let mut c = connect(proxy.addr()).await;
    // Three requests in one write; the last asks to close.
    send(
        &mut c,
        b"GET /one HTTP/1.1\r\nHost: a\r\n\r\n\
              HEAD /two HTTP/1.1\r\nHost: a\r\n\r\n\
              GET /three?x=1 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    let one = read_response(&mut c, false).await;
    assert_eq!(one.status, "HTTP/1.1 200 OK");
    assert_eq!(one.echoed()["uri"], "/one");
    assert!(one.header("date").is_some(), "a Date on every response");
    assert_eq!(one.header("connection"), None);
    let two = read_response(&mut c, true).await;
    assert_eq!(two.status, "HTTP/1.1 200 OK");
    assert!(
        two.header("content-length").is_some_and(|n| n != "0"),
        "HEAD keeps the length it would have had: {:?}",
        two.headers
    );
    let three = read_response(&mut c, false).await;
    assert_eq!(three.echoed()["uri"], "/three?x=1");
    assert_eq!(three.header("connection"), Some("close"));
    assert!(closed(&mut c).await, "closed after the request that asked");
    assert_eq!(up.hits(), 3);
}

#[tokio::test]
async fn a_head_that_comes_in_pieces_after_the_connection_waited_is_read_whole() {
    // Between requests the connection holds no read buffer; a head that
    // then arrives a piece at a time must keep what came so far.
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&proxied(&up)).await;
    let mut c = connect(proxy.addr()).await;
    send(&mut c, b"GET /one HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(read_response(&mut c, false).await.echoed()["uri"], "/one");
    // These sleeps pace the client: the server waits with nothing
    // buffered, then between the pieces with part of a head.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for piece in [
            &b"GET /two HT"[..],
            b"TP/1.1\r\nHost: a\r\nX-Pie",
            b"ce: yes\r\n\r\n",
        ] {
            send(&mut c, piece).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let two = read_response(&mut c, false).await;
        assert_eq!(two.status, "HTTP/1.1 200 OK");
        assert_eq!(two.echoed()["uri"], "/two");
        assert_eq!(two.echoed()["headers"]["x-piece"], "yes");
    }
    assert_eq!(up.hits(), 3);
}

#[tokio::test]
async fn http10_connections_stay_open_only_when_the_client_asks() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&proxied(&up)).await;
    let mut c = connect(proxy.addr()).await;
    send(
        &mut c,
        b"GET /a HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n",
    )
    .await;
    let a = read_response(&mut c, false).await;
    assert_eq!(a.status, "HTTP/1.0 200 OK");
    assert_eq!(a.header("connection"), Some("keep-alive"));
    // The same connection takes a second request, without keep-alive.
    send(&mut c, b"GET /b HTTP/1.0\r\nHost: a\r\n\r\n").await;
    let b = read_response(&mut c, false).await;
    assert_eq!(b.status, "HTTP/1.0 200 OK");
    assert_eq!(b.echoed()["uri"], "/b");
    assert!(closed(&mut c).await, "HTTP/1.0 without keep-alive closes");
}

#[tokio::test]
async fn a_small_body_reaches_the_upstream_whether_it_came_with_its_head_or_later() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&proxied(&up)).await;
    let mut c = connect(proxy.addr()).await;
    // Head and body in one write: read with the head.
    send(
        &mut c,
        b"POST /with HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await;
    let with = read_response(&mut c, false).await;
    assert_eq!(with.echoed()["body"], "hello");
    assert_eq!(with.echoed()["method"], "POST");
    // Head first, body a moment later: read off the connection as the
    // upstream takes it, and the connection goes on serving.
    send(
        &mut c,
        b"POST /later HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    send(&mut c, b"world").await;
    let later = read_response(&mut c, false).await;
    assert_eq!(later.echoed()["body"], "world");
    // A body far larger than any buffer, in pieces.
    let size = 1 << 20;
    let head = format!("PUT /big HTTP/1.1\r\nHost: a\r\nContent-Length: {size}\r\n\r\n");
    send(&mut c, head.as_bytes()).await;
    let mut piece = vec![0u8; 100_000];
    let mut sent = 0;
    while sent < size {
        let n = piece.len().min((size - sent) as usize);
        for b in &mut piece[..n] {
            *b = pattern_byte(sent);
            sent += 1;
        }
        send(&mut c, &piece[..n]).await;
    }
    let big = read_response(&mut c, false).await;
    assert_eq!(big.echoed()["body_len"], size);
    assert_eq!(big.echoed()["body_sha256"], Pattern::sha256(size));
    send(&mut c, b"GET /after HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(read_response(&mut c, false).await.echoed()["uri"], "/after");
    // All of it on tollgate's own server: nothing was handed to hyper.
    let metrics = proxy
        .pipeline
        .metrics()
        .encode(proxy.pipeline.clone(), false);
    let handed: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("tollgate_http1_handovers_total") && !l.ends_with(" 0"))
        .collect();
    assert!(handed.is_empty(), "{handed:?}");
}

#[tokio::test]
async fn an_unread_body_is_discarded_when_small_and_closes_the_connection_when_large() {
    let up = Upstream::spawn().await;
    // Every request is refused before its body is read.
    let proxy = TestProxy::spawn(&forward_all(
        &format!("'{}'", up.addr),
        "",
        "zones: [{ name: none, rate: 1r/m, burst: 0, status: 429, key: global }]",
    ))
    .await;
    let mut c = connect(proxy.addr()).await;
    send(&mut c, b"GET /spend HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let _ = read_response(&mut c, false).await;
    // A small body that comes after its answer: read and thrown away, and
    // the connection serves the next request.
    send(
        &mut c,
        b"POST /small HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n",
    )
    .await;
    let refused = read_response(&mut c, false).await;
    assert!(
        refused.status.starts_with("HTTP/1.1 429"),
        "{}",
        refused.status
    );
    assert_eq!(refused.header("connection"), None, "kept open");
    send(&mut c, b"0123456789").await;
    send(&mut c, b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let next = read_response(&mut c, false).await;
    assert!(
        next.status.starts_with("HTTP/1.1 429"),
        "the next request was read: {}",
        next.status
    );
    // A large one: the answer says close, and the connection closes.
    send(
        &mut c,
        b"POST /large HTTP/1.1\r\nHost: a\r\nContent-Length: 10000000\r\n\r\n",
    )
    .await;
    let refused = read_response(&mut c, false).await;
    assert!(
        refused.status.starts_with("HTTP/1.1 429"),
        "{}",
        refused.status
    );
    assert_eq!(refused.header("connection"), Some("close"));
    assert!(closed(&mut c).await);
    assert_eq!(up.hits(), 1, "only the first request was let through");
}

#[tokio::test]
async fn a_connection_handed_to_hyper_half_way_keeps_every_request() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&proxied(&up)).await;
    let mut c = connect(proxy.addr()).await;
    // A fast-path GET, a chunked POST (hyper's from here on) pipelined
    // behind it, then more requests.
    send(
        &mut c,
        b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\n\
              POST /2 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
              3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n\
              GET /3 HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .await;
    assert_eq!(read_response(&mut c, false).await.echoed()["uri"], "/1");
    let two = read_response(&mut c, false).await;
    assert_eq!(two.echoed()["uri"], "/2");
    assert_eq!(two.echoed()["body"], "abcde");
    assert_eq!(read_response(&mut c, false).await.echoed()["uri"], "/3");
    // Framing hyper refuses stays refused after the hand-over.
    send(&mut c, b"POST /4 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n").await;
    let four = read_response(&mut c, false).await;
    assert!(four.status.starts_with("HTTP/1.1 400"), "{}", four.status);
    assert_eq!(up.hits(), 3);

    // HTTP/2 with prior knowledge is hyper's from its preface on.
    let mut h2c = h2(proxy.addr()).await;
    let req = http::Request::get("http://test.local/h2")
        .body(empty())
        .unwrap();
    let got = collect(h2c.send_request(req).await.unwrap()).await;
    assert_eq!(got.status, 200);
    // The operator sees each hand-over and why.
    let metrics = proxy
        .pipeline
        .metrics()
        .encode(proxy.pipeline.clone(), false);
    let handovers = |reason: &str| {
        let series =
            format!(r#"tollgate_http1_handovers_total{{listener="plain",reason="{reason}"}} "#);
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
            .to_owned()
    };
    assert_eq!(handovers("chunked"), "1");
    assert_eq!(handovers("http2"), "1");
    assert_eq!(handovers("expect"), "0");
}

/// An upstream that answers every request with `answer` (raw bytes) and
/// reports, on `hung_up`, each connection the proxy closed on it.
async fn raw_upstream(
    answer: &'static [u8],
) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut r = BufReader::new(tcp);
                while read_head(&mut r).await.is_some() {
                    if !answer.is_empty() && r.get_mut().write_all(answer).await.is_err() {
                        break;
                    }
                }
                let _ = tx.send(());
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn a_body_of_unknown_length_is_chunked_for_http11_and_ends_with_the_close_for_http10() {
    let (addr, _) = raw_upstream(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    .await;
    let proxy = TestProxy::spawn(&forward_all(&format!("'{addr}'"), "", "")).await;
    let resp = raw(
        proxy.addr(),
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    assert!(head.contains("transfer-encoding: chunked"), "{resp}");
    assert!(!head.contains("content-length"), "{resp}");
    let mut chunks = body.split("\r\n");
    let mut text = String::new();
    while let Some(size) = chunks.next() {
        let size = usize::from_str_radix(size, 16).unwrap_or_else(|_| panic!("{resp:?}"));
        if size == 0 {
            break;
        }
        let chunk = chunks.next().unwrap();
        assert_eq!(chunk.len(), size);
        text.push_str(chunk);
    }
    assert_eq!(text, "hello world");

    let resp = raw(
        proxy.addr(),
        b"GET / HTTP/1.0\r\nHost: a\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.0 200"), "{resp}");
    assert!(!head.contains("transfer-encoding"), "{resp}");
    assert_eq!(body, "hello world", "the close ends the body");
}

#[tokio::test]
async fn a_client_that_hangs_up_abandons_its_request_upstream() {
    // The upstream reads requests and never answers.
    let (addr, mut hung_up) = raw_upstream(b"").await;
    let proxy = TestProxy::spawn(&forward_all(&format!("'{addr}'"), "", "")).await;
    let mut c = connect(proxy.addr()).await;
    send(&mut c, b"GET /wait HTTP/1.1\r\nHost: a\r\n\r\n").await;
    // Let the request reach the upstream, then go away.
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(c);
    tokio::time::timeout(Duration::from_secs(5), hung_up.recv())
        .await
        .expect("the proxy closes the upstream connection of an abandoned request")
        .unwrap();
}
