//! Strict request framing and connections that cost an attacker more than
//! they cost tollgate: one validated Host used throughout, a first request
//! head within `header_read_timeout` or the connection closes, an early
//! answer the client can read (lingering close), and a refused POST that
//! keeps its keep-alive connection.

use std::time::Duration;

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A forwarding route for host `a.test`, everything else answered by
/// tollgate itself.
async fn hosts_proxy(up: &Upstream) -> TestProxy {
    TestProxy::spawn(&config(&format!(
        "upstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - {{ match: {{ host: a.test, path_prefix: / }}, upstream: api }}\n  - {{ match: {{ path_prefix: / }}, respond: {{ body: other }} }}\n",
        up.addr
    )))
    .await
}

/// The status line and the body of a raw HTTP/1.1 response.
fn split(resp: &str) -> (&str, &str) {
    let status = resp.lines().next().unwrap_or("");
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body)
}

#[tokio::test]
async fn ambiguous_hosts_are_refused_with_a_problem_body() {
    let up = Upstream::spawn().await;
    let proxy = hosts_proxy(&up).await;
    for host_lines in [
        "Host: a.test\r\nHost: b.test\r\n",
        "Host: a b.test\r\n",
        "Host: a.test, b.test\r\n",
        "Host: evil/../x@y\r\n",
        "Host: a.test:99999\r\n",
    ] {
        let req = format!("GET / HTTP/1.1\r\n{host_lines}Connection: close\r\n\r\n");
        let resp = raw(proxy.addr(), req.as_bytes(), Duration::from_secs(5)).await;
        let (status, body) = split(&resp);
        assert!(status.starts_with("HTTP/1.1 400"), "{host_lines:?}: {resp}");
        let problem: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(problem["status"], 400, "{host_lines:?}");
    }
    assert_eq!(up.hits(), 0, "none of them reached the upstream");
}

#[tokio::test]
async fn the_request_targets_authority_is_the_one_host() {
    let up = Upstream::spawn().await;
    let proxy = hosts_proxy(&up).await;
    let resp = raw(
        proxy.addr(),
        b"GET http://a.test/abs HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    let (status, body) = split(&resp);
    assert!(status.starts_with("HTTP/1.1 200"), "{resp}");
    let seen: serde_json::Value = serde_json::from_str(body).expect("routed on a.test, forwarded");
    assert_eq!(seen["headers"]["host"], "a.test");
    assert_eq!(seen["headers"]["x-forwarded-host"], "a.test");
    assert_eq!(seen["uri"], "/abs", "origin-form upstream");

    // HTTP/2: :authority and a different host header are refused.
    let mut c = h2(proxy.addr()).await;
    let req = http::Request::get("http://a.test/x")
        .header("host", "b.test")
        .body(empty())
        .unwrap();
    let got = collect(c.send_request(req).await.unwrap()).await;
    assert_eq!(got.status, 400);
    assert_eq!(got.json()["status"], 400);
    let req = http::Request::get("http://a.test/x").body(empty()).unwrap();
    let got = collect(c.send_request(req).await.unwrap()).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.seen_header("host").as_deref(), Some("a.test"));
    assert_eq!(up.hits(), 2);
}

/// Waits (at most `limit`) for the server to close the connection.
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn a_connection_without_a_request_head_is_closed_after_header_read_timeout() {
    let ca = TestCa::new();
    let (cert, key) = ca.leaf("api", &["api.example.com"]);
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&format!(
        "listeners:\n  - {{ name: plain, bind: '127.0.0.1:0' }}\n  - {{ name: tls, bind: '127.0.0.1:0', tls: {{ certs: [{{ cert: '{cert}', key: '{key}' }}] }} }}\nadmin: {{ enabled: false }}\nlog: {{ access_log: false }}\nserver: {{ header_read_timeout: 1s, idle_timeout: 60s }}\nupstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, upstream: api }}\n",
        up.addr
    ))
    .await;
    // Far below idle_timeout (60 s), well above header_read_timeout (1 s).
    let limit = Duration::from_secs(15);

    let mut silent = TcpStream::connect(proxy.addr_of("plain")).await.unwrap();
    assert!(closed_within(&mut silent, limit).await, "silent TCP");

    let mut h2c = TcpStream::connect(proxy.addr_of("plain")).await.unwrap();
    h2c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    assert!(
        closed_within(&mut h2c, limit).await,
        "h2c preface + SETTINGS"
    );

    let mut tls = tls_connect(
        proxy.addr_of("tls"),
        ca.client_config(&[b"http/1.1"]),
        "api.example.com",
    )
    .await;
    assert!(
        closed_within(&mut tls, limit).await,
        "TLS, silent after the handshake"
    );

    // A connection that sends its request is served as before.
    assert_eq!(get(proxy.addr_of("plain"), "/").await.status, 200);
}

/// Reads one HTTP/1.1 response (head and a `Content-Length` body).
async fn read_response(s: &mut TcpStream) -> String {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if data.len() >= end + 4 + len {
                return String::from_utf8_lossy(&data[..end + 4 + len]).into_owned();
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("a response in time")
            .expect("the connection is still open");
        assert!(
            n > 0,
            "closed before a whole response: {}",
            String::from_utf8_lossy(&data)
        );
        data.extend_from_slice(&buf[..n]);
    }
}

/// Forwards everything to `up`, one request per client an hour; `server`
/// is a `server:` section (or nothing).
/// One request an hour per address, counted from the first (a sliding log:
/// a fixed window would admit a second request when a test runs across
/// the hour, as one did at 08:00:00).
async fn one_request_an_hour(up: &Upstream, server: &str) -> TestProxy {
    TestProxy::spawn(&config(&format!(
        "{server}upstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - match: {{ path_prefix: / }}\n    upstream: api\n    limits: [{{ name: one, algorithm: sliding_log, key: ip, limit: 1, window: 1h }}]\n",
        up.addr
    )))
    .await
}

#[tokio::test]
async fn a_refused_post_keeps_its_keep_alive_connection() {
    let up = Upstream::spawn().await;
    let proxy = one_request_an_hour(&up, "").await;
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut statuses = Vec::new();
    for i in 0..4 {
        s.write_all(b"POST /form HTTP/1.1\r\nHost: a.test\r\nContent-Length: 11\r\n\r\n")
            .await
            .unwrap();
        // A refused request is answered from its head: its body arrives
        // in a second write, after the answer, and is skipped.
        let resp = if i == 0 {
            s.write_all(b"hello world").await.unwrap();
            read_response(&mut s).await
        } else {
            let resp = read_response(&mut s).await;
            s.write_all(b"hello world").await.unwrap();
            resp
        };
        assert!(!resp.to_lowercase().contains("connection: close"), "{resp}");
        statuses.push(resp[9..12].to_owned());
    }
    assert_eq!(statuses, ["200", "429", "429", "429"]);
    assert_eq!(up.hits(), 1);

    // A large refused body: the answer says it closes, and is readable.
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(b"POST /form HTTP/1.1\r\nHost: a.test\r\nContent-Length: 1000000\r\n\r\n")
        .await
        .unwrap();
    let resp = read_response(&mut s).await;
    assert!(resp.starts_with("HTTP/1.1 429"), "{resp}");
    assert!(resp.to_lowercase().contains("connection: close"), "{resp}");
}

#[tokio::test]
async fn a_refused_body_that_trickles_in_past_header_read_timeout_keeps_the_connection() {
    let up = Upstream::spawn().await;
    let proxy = one_request_an_hour(
        &up,
        "server: { header_read_timeout: 300ms, lingering_timeout: 2s, lingering_time: 10s }\n",
    )
    .await;
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .await
        .unwrap();
    assert!(read_response(&mut s).await.starts_with("HTTP/1.1 200"));
    // Refused from its head; its 10-byte body then arrives a byte every
    // 100 ms: a slow client, each piece well within lingering_timeout,
    // the whole well past header_read_timeout. Those bytes are the body
    // being discarded, not a next request head that is late.
    s.write_all(b"POST /form HTTP/1.1\r\nHost: a.test\r\nContent-Length: 10\r\n\r\n")
        .await
        .unwrap();
    let resp = read_response(&mut s).await;
    assert!(resp.starts_with("HTTP/1.1 429"), "{resp}");
    assert!(!resp.to_lowercase().contains("connection: close"), "{resp}");
    for _ in 0..10 {
        // Pacing: a slow client's body, spread over a second.
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.write_all(b"x").await.unwrap();
    }
    s.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .await
        .unwrap();
    let resp = read_response(&mut s).await;
    assert!(
        resp.starts_with("HTTP/1.1 429"),
        "the connection was closed: {resp:?}"
    );
}

#[tokio::test]
async fn an_upload_refused_with_413_is_read_by_the_client() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&config(&format!(
        "server: {{ max_body_size: 1KB }}\nupstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, upstream: api }}\n",
        up.addr
    )))
    .await;
    // Like curl or Python's http.client: the whole body is written before
    // the response is read. 8 MB is more than the socket buffers hold.
    let len = 8 << 20;
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(
        format!("PUT /upload HTTP/1.1\r\nHost: a.test\r\nContent-Length: {len}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let chunk = vec![b'x'; 64 << 10];
    let mut written = 0;
    let write = tokio::time::timeout(Duration::from_secs(20), async {
        while written < len {
            s.write_all(&chunk).await?;
            written += chunk.len();
        }
        Ok::<_, std::io::Error>(())
    })
    .await
    .expect("the upload is read (and discarded), not stalled");
    assert!(write.is_ok(), "the upload was cut off: {write:?}");
    let resp = read_response(&mut s).await;
    assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");
    assert!(resp.contains("application/problem+json"), "{resp}");
    assert_eq!(up.hits(), 0);
}

/// An upstream that records every byte it receives and answers each
/// connection's first request with a 200, then closes it. Each
/// connection's bytes are handed over once it has been quiet for 200 ms.
struct Recorder {
    addr: std::net::SocketAddr,
    seen: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>>,
}

impl Recorder {
    async fn spawn() -> Recorder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (sink, seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let sink = sink.clone();
                tokio::spawn(async move {
                    let mut data = Vec::new();
                    let mut buf = [0u8; 4096];
                    let mut answered = false;
                    // Reads until the peer goes quiet for 200 ms after the
                    // request is complete, so trailing bytes are recorded too.
                    while let Ok(Ok(n)) =
                        tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await
                    {
                        if n == 0 {
                            break;
                        }
                        data.extend_from_slice(&buf[..n]);
                        if !answered && request_complete(&data) {
                            answered = true;
                            let _ = s
                                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                                .await;
                        }
                    }
                    let _ = sink.send(data);
                });
            }
        });
        Recorder {
            addr,
            seen: tokio::sync::Mutex::new(seen),
        }
    }

    /// The bytes of the next connection that reaches it within `within`
    /// (empty when none does).
    async fn next(&self, within: Duration) -> String {
        let mut seen = self.seen.lock().await;
        match tokio::time::timeout(within, seen.recv()).await {
            Ok(Some(data)) => String::from_utf8_lossy(&data).into_owned(),
            _ => String::new(),
        }
    }
}

/// Whether `data` holds a whole request: its head, and a body by
/// `Content-Length` or chunked to its last chunk.
fn request_complete(data: &[u8]) -> bool {
    let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&data[..end]).to_lowercase();
    let body = &data[end + 4..];
    if head.contains("transfer-encoding: chunked") {
        return body.windows(5).any(|w| w == b"0\r\n\r\n");
    }
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    body.len() >= len
}

#[tokio::test]
async fn smuggling_attempts_are_refused_or_reach_the_upstream_as_one_request() {
    let rec = Recorder::spawn().await;
    let proxy = TestProxy::spawn(&forward_all(&format!("'{}'", rec.addr), "", "")).await;
    let h = "Host: a.test\r\nConnection: close\r\n";
    let cases: Vec<(&str, String)> = vec![
        ("TE and CL", format!("POST / HTTP/1.1\r\n{h}Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nX")),
        ("TE chunked, identity", format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n")),
        ("TE with a leading space", format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding:  chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")),
        ("TE xchunked", format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")),
        ("bad chunk size", format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n")),
        ("chunk size overflow", format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\nfffffffffffffffff1\r\nhello\r\n0\r\n\r\n")),
        ("bare LF", "GET / HTTP/1.1\nHost: a.test\nConnection: close\n\n".to_owned()),
        ("NUL in a header", format!("GET / HTTP/1.1\r\n{h}X-A: a\0b\r\n\r\n")),
        ("obs-fold", format!("GET / HTTP/1.1\r\n{h}X-A: a\r\n b\r\n\r\n")),
        ("CL with a sign", format!("POST / HTTP/1.1\r\n{h}Content-Length: +5\r\n\r\nhello")),
        ("CL with a space inside", format!("POST / HTTP/1.1\r\n{h}Content-Length: 1 2\r\n\r\nhello")),
        ("two different CLs", format!("POST / HTTP/1.1\r\n{h}Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!")),
        ("space before the colon", "GET / HTTP/1.1\r\nHost : a.test\r\nConnection: close\r\n\r\n".to_owned()),
        ("a second request after the body", format!("POST / HTTP/1.1\r\n{h}Content-Length: 5\r\n\r\nhelloGET /admin HTTP/1.1\r\nHost: a.test\r\n\r\n")),
    ];
    let mut outcomes = Vec::new();
    for (name, req) in &cases {
        let resp = raw(proxy.addr(), req.as_bytes(), Duration::from_secs(5)).await;
        let status = resp.get(9..12).unwrap_or("---").to_owned();
        // A forwarded request reaches the recorder (it hands its bytes
        // over 200 ms after they stop); a refused one must not, within
        // twice that.
        let within = if status == "200" { 10_000 } else { 400 };
        let seen = rec.next(Duration::from_millis(within)).await;
        let requests = seen.matches(" HTTP/1.1\r\n").count();
        match status.as_str() {
            "400" | "501" => assert_eq!(seen, "", "{name}: refused, yet the upstream saw bytes"),
            "200" => {
                assert_eq!(requests, 1, "{name}: exactly one request upstream:\n{seen}");
                let head = seen.split("\r\n\r\n").next().unwrap().to_lowercase();
                assert!(
                    !(head.contains("content-length") && head.contains("transfer-encoding")),
                    "{name}: ambiguous framing upstream:\n{seen}"
                );
                assert!(!seen.contains("/admin"), "{name}: smuggled:\n{seen}");
            }
            other => panic!("{name}: unexpected answer {other}:\n{resp}"),
        }
        outcomes.push(format!("{name}: {status}"));
    }
    // What each case gets today; a change here must be a decision. A
    // coding other than a lone `chunked` is not implemented (501, as
    // nginx answers), never re-framed without it. The
    // four that pass are unambiguous: with both TE and CL the body is
    // decoded as chunked and the upstream sees chunked only (RFC 9112
    // §6.3); spaces around a value are optional whitespace; a bare LF may
    // end a line (§2.2) and the upstream gets CRLF; bytes after a
    // `Connection: close` request are never read as a request.
    assert_eq!(
        outcomes,
        [
            "TE and CL: 200",
            "TE chunked, identity: 501",
            "TE with a leading space: 200",
            "TE xchunked: 501",
            "bad chunk size: 400",
            "chunk size overflow: 400",
            "bare LF: 200",
            "NUL in a header: 400",
            "obs-fold: 400",
            "CL with a sign: 400",
            "CL with a space inside: 400",
            "two different CLs: 400",
            "space before the colon: 400",
            "a second request after the body: 200",
        ]
    );
}

#[tokio::test]
async fn at_max_connections_new_clients_wait_until_idle_hogs_are_closed() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&forward_all(
        &format!("'{}'", up.addr),
        "",
        "server: { max_connections: 100, idle_timeout: 2s }",
    ))
    .await;
    // One client takes every slot with keep-alive connections that each
    // made a request and then sit idle.
    let mut hogs = Vec::new();
    for _ in 0..100 {
        let mut c = h1(proxy.addr()).await;
        assert_eq!(
            send1(&mut c, request("GET", "/", empty())).await.status,
            200
        );
        hogs.push(c);
    }
    // A newcomer waits in the listen backlog, and is served once the idle
    // connections are closed (idle_timeout, far within this bound).
    let got = tokio::time::timeout(Duration::from_secs(20), get(proxy.addr(), "/"))
        .await
        .expect("served once idle connections free their slots");
    assert_eq!(got.status, 200);
    // Every hog was closed by the idle watchdog, not just the first.
    until(Duration::from_secs(10), "every idle hog closed", || {
        std::future::ready(hogs.iter().all(|h| h.is_closed()))
    })
    .await;
}

#[tokio::test]
async fn request_heads_over_twice_the_limit_get_the_same_431_problem_body() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&forward_all(
        &format!("'{}'", up.addr),
        "",
        "server: { max_header_size: 32KB }",
    ))
    .await;
    let head = |size: usize| {
        format!(
            "GET / HTTP/1.1\r\nHost: a.test\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
            "a".repeat(size)
        )
    };
    // Over the limit: tollgate's 431 problem body.
    let resp = raw(
        proxy.addr(),
        head(40 << 10).as_bytes(),
        Duration::from_secs(5),
    )
    .await;
    let (status, body) = split(&resp);
    assert!(status.starts_with("HTTP/1.1 431"), "{status}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(body).unwrap()["status"],
        431
    );
    // Over twice the limit (at least 64 KiB), the fast path refuses the
    // head itself, with the same problem body (hyper's was bare), and
    // closes the connection.
    let resp = raw(
        proxy.addr(),
        head(80 << 10).as_bytes(),
        Duration::from_secs(5),
    )
    .await;
    let (status, body) = split(&resp);
    assert!(status.starts_with("HTTP/1.1 431"), "{status}");
    assert!(
        resp.contains("content-type: application/problem+json"),
        "{resp}"
    );
    assert!(
        resp.to_ascii_lowercase().contains("connection: close"),
        "{resp}"
    );
    let problem: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(problem["status"], 431);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("the limit is 32768"),
        "{problem}"
    );
    // More than twice max_headers (100 by default) fields: the same.
    let many: String = (0..201).map(|i| format!("X-{i}: v\r\n")).collect();
    let resp = raw(
        proxy.addr(),
        format!("GET / HTTP/1.1\r\nHost: a.test\r\n{many}\r\n").as_bytes(),
        Duration::from_secs(5),
    )
    .await;
    let (status, body) = split(&resp);
    assert!(status.starts_with("HTTP/1.1 431"), "{status}");
    let problem: serde_json::Value = serde_json::from_str(body).unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("202 header fields; the limit is 100"),
        "{problem}"
    );
    assert_eq!(up.hits(), 0);
}

#[tokio::test]
async fn a_client_that_stops_reading_is_closed_after_send_timeout() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&forward_all(
        &format!("'{}'", up.addr),
        "",
        "server: { send_timeout: 2s }",
    ))
    .await;
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(b"GET /download?bytes=200000000 HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .await
        .unwrap();
    // Read nothing: the socket buffers fill, tollgate can send no more,
    // and after send_timeout it closes the connection.
    let stats = proxy.pipeline.metrics().listener_stats(0);
    until(Duration::from_secs(10), "the connection accepted", || {
        std::future::ready(stats.open() == 1)
    })
    .await;
    until(
        Duration::from_secs(20),
        "the stalled connection closed",
        || std::future::ready(stats.open() == 0),
    )
    .await;
    // What was buffered drains, then the connection ends (200 MB would
    // take far longer than this on a connection kept open).
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0usize;
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => total += n,
            }
        }
    })
    .await
    .is_ok();
    assert!(closed, "still open after {total} bytes");
    assert!(total < 200_000_000, "the whole body was sent: {total}");
}
