//! HTTP/2 abuse, spoken frame by frame on a raw socket: rapid reset
//! (CVE-2023-44487), a CONTINUATION flood, SETTINGS and PING floods from a
//! peer that never reads, and more streams than allowed. Each is cut off
//! (GOAWAY, a refused stream, or the connection closed) within its stated
//! bound, and other clients are served all along.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const REFUSED_STREAM: u32 = 0x7;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK block for `GET <path>` to host a.test (static-table names, no
/// Huffman).
fn get_block(path: &str) -> Vec<u8> {
    let mut b = vec![0x82, 0x86]; // :method GET, :scheme http
    b.push(0x04); // :path, literal without indexing, name index 4
    b.push(path.len() as u8);
    b.extend_from_slice(path.as_bytes());
    b.push(0x01); // :authority, name index 1
    b.push(6);
    b.extend_from_slice(b"a.test");
    b
}

/// A raw HTTP/2 connection past its preface and SETTINGS.
async fn h2_raw(addr: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(PREFACE).await.unwrap();
    s.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    s
}

/// What the server sent, frame by frame, until it closes or `limit` passes.
#[derive(Debug, Default)]
struct Seen {
    goaway: bool,
    refused: usize,
    closed: bool,
    frames: usize,
}

async fn read_frames(mut r: tokio::net::tcp::OwnedReadHalf, limit: Duration) -> Seen {
    let mut seen = Seen::default();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        while buf.len() >= 9 {
            let len = (buf[0] as usize) << 16 | (buf[1] as usize) << 8 | buf[2] as usize;
            if buf.len() < 9 + len {
                break;
            }
            seen.frames += 1;
            match buf[3] {
                GOAWAY => seen.goaway = true,
                RST_STREAM if len == 4 => {
                    let code = u32::from_be_bytes([buf[9], buf[10], buf[11], buf[12]]);
                    if code == REFUSED_STREAM {
                        seen.refused += 1;
                    }
                }
                _ => {}
            }
            buf.drain(..9 + len);
        }
        match tokio::time::timeout_at(deadline, r.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                seen.closed = true;
                return seen;
            }
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => return seen,
        }
    }
}

async fn proxy_with(up: &Upstream, server: &str) -> TestProxy {
    TestProxy::spawn(&config(&format!(
        "server: {{ {server} }}\nupstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, upstream: api }}\n",
        up.addr
    )))
    .await
}

/// Another client, on its own connection, is answered.
async fn others_are_served(proxy: &TestProxy) {
    let got = tokio::time::timeout(Duration::from_secs(10), get(proxy.addr(), "/ok"))
        .await
        .expect("another client is answered in time");
    assert_eq!(got.status, 200);
}

#[tokio::test]
async fn rapid_reset_is_cut_off_with_goaway() {
    let up = Upstream::spawn().await;
    let proxy = proxy_with(&up, "").await;
    let (r, mut w) = h2_raw(proxy.addr()).await.into_split();
    let reader = tokio::spawn(read_frames(r, Duration::from_secs(20)));
    // Open and cancel streams in a loop: at most 10,000 pairs, or until
    // the server stops taking them.
    let mut sent = 0u32;
    for i in 0..10_000u32 {
        let id = 2 * i + 1;
        let mut pair = frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            id,
            &get_block("/slow?ms=100"),
        );
        pair.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes())); // CANCEL
        if w.write_all(&pair).await.is_err() {
            break;
        }
        sent += 1;
    }
    let seen = reader.await.unwrap();
    assert!(seen.goaway || seen.closed, "sent {sent} pairs; {seen:?}");
    assert!(
        up.hits() < sent as usize,
        "not every cancelled stream reached the upstream ({} of {sent})",
        up.hits()
    );
    others_are_served(&proxy).await;
}

#[tokio::test]
async fn a_continuation_flood_is_cut_off() {
    let up = Upstream::spawn().await;
    let proxy = proxy_with(&up, "max_header_size: 8KB").await;
    let (r, mut w) = h2_raw(proxy.addr()).await.into_split();
    let reader = tokio::spawn(read_frames(r, Duration::from_secs(20)));
    w.write_all(&frame(HEADERS, END_STREAM, 1, &get_block("/")))
        .await
        .unwrap();
    // Headers that never end: up to 4,096 CONTINUATION frames of 16 KB of
    // literal header fields (64 MB), far over the 16 KB header limit.
    // A literal with a new name: length 254 is the 7-bit prefix (127)
    // plus 127 in one more byte.
    let mut field = vec![0x00, 0x7f, 0x7f];
    field.extend(std::iter::repeat_n(b'x', 254));
    field.extend([0x7f, 0x7f]);
    field.extend(std::iter::repeat_n(b'y', 254));
    let mut block = Vec::new();
    while block.len() + field.len() <= 16384 {
        block.extend_from_slice(&field);
    }
    let cont = frame(CONTINUATION, 0, 1, &block);
    let mut sent = 0;
    for _ in 0..4096 {
        match tokio::time::timeout(Duration::from_secs(5), w.write_all(&cont)).await {
            Ok(Ok(())) => sent += 1,
            _ => break,
        }
    }
    let seen = reader.await.unwrap();
    assert!(
        seen.goaway || seen.closed,
        "sent {sent} CONTINUATION frames; {seen:?}"
    );
    assert!(sent < 4096, "the server stopped reading the flood");
    assert_eq!(up.hits(), 0, "no request came of it");
    others_are_served(&proxy).await;
}

#[tokio::test]
async fn settings_and_ping_floods_from_a_peer_that_never_reads_are_bounded() {
    let up = Upstream::spawn().await;
    // An idle connection (nothing in flight) closes after idle_timeout.
    let proxy = proxy_with(&up, "idle_timeout: 2s").await;
    for (name, f) in [
        ("SETTINGS", frame(SETTINGS, 0, 0, &[])),
        ("PING", frame(PING, 0, 0, &[7; 8])),
    ] {
        let s = h2_raw(proxy.addr()).await;
        let (r, mut w) = s.into_split();
        // Never read: the server's acknowledgements pile up on its side.
        let mut batch = Vec::new();
        for _ in 0..1000 {
            batch.extend_from_slice(&f);
        }
        let mut sent = 0;
        for _ in 0..1000 {
            match tokio::time::timeout(Duration::from_secs(2), w.write_all(&batch)).await {
                Ok(Ok(())) => sent += 1000,
                _ => break,
            }
        }
        others_are_served(&proxy).await;
        // Now read: the server ended the connection (a GOAWAY for the
        // flood, or the idle close) instead of keeping it forever.
        let seen = read_frames(r, Duration::from_secs(30)).await;
        assert!(seen.closed, "{name}: sent {sent} frames; {seen:?}");
    }
}

#[tokio::test]
async fn streams_beyond_the_limit_are_refused() {
    let up = Upstream::spawn().await;
    let proxy = proxy_with(&up, "h2_max_concurrent_streams: 16").await;
    let (r, mut w) = h2_raw(proxy.addr()).await.into_split();
    let reader = tokio::spawn(read_frames(r, Duration::from_secs(8)));
    // Acknowledge the server's SETTINGS (so its limit applies), then open
    // 40 streams at once, each waiting 2 s on the upstream.
    let mut all = frame(SETTINGS, 0x1, 0, &[]);
    for i in 0..40u32 {
        let block = get_block("/slow?ms=2000");
        all.extend(frame(HEADERS, END_STREAM | END_HEADERS, 2 * i + 1, &block));
    }
    w.write_all(&all).await.unwrap();
    let seen = reader.await.unwrap();
    assert!(seen.refused >= 24 || seen.goaway, "{seen:?}");
    assert!(
        up.hits() <= 16,
        "at most 16 at once reached the upstream: {}",
        up.hits()
    );
    others_are_served(&proxy).await;
}

#[tokio::test]
async fn header_blocks_over_twice_the_limit_are_refused_by_the_h2_layer() {
    let up = Upstream::spawn().await;
    let proxy = proxy_with(&up, "max_header_size: 8KB").await;
    let mut c = h2(proxy.addr()).await;
    // Between the limit and twice it: tollgate's own 431 problem body.
    let req = http::Request::get("http://a.test/")
        .header("x-big", "a".repeat(10 << 10))
        .body(empty())
        .unwrap();
    let got = collect(c.send_request(req).await.unwrap()).await;
    assert_eq!(got.status, 431);
    assert_eq!(got.json()["status"], 431);
    // Over twice it (the h2 layer's max_header_list_size): refused by the
    // h2 layer before tollgate sees the request, as docs/request-path.md states.
    let req = http::Request::get("http://a.test/")
        .header("x-big", "a".repeat(20 << 10))
        .body(empty())
        .unwrap();
    let got = collect(c.send_request(req).await.unwrap()).await;
    assert_eq!(got.status, 431);
    assert!(got.body.is_empty(), "the h2 layer's answer has no body");
    assert_eq!(up.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_leave_the_process_memory_flat() {
    let up = Upstream::spawn().await;
    let run = crate::common::process::Running::start(&format!(
        "server: {{ max_header_size: 8KB, idle_timeout: 2s }}\nupstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, upstream: api }}\n",
        up.addr
    ));
    let before = run.peak_rss_kib();
    // A 64 MB CONTINUATION flood on each of 4 connections at once.
    let floods: Vec<_> = (0..4)
        .map(|_| {
            let addr = run.addr;
            tokio::spawn(async move {
                let (_r, mut w) = h2_raw(addr).await.into_split();
                let _ = w
                    .write_all(&frame(HEADERS, END_STREAM, 1, &get_block("/")))
                    .await;
                let cont = frame(CONTINUATION, 0, 1, &vec![0x40; 16384]);
                for _ in 0..4096 {
                    match tokio::time::timeout(Duration::from_secs(5), w.write_all(&cont)).await {
                        Ok(Ok(())) => {}
                        _ => break,
                    }
                }
            })
        })
        .collect();
    for f in floods {
        f.await.unwrap();
    }
    let got = get(run.addr, "/ok").await;
    assert_eq!(got.status, 200, "still serving");
    let after = run.peak_rss_kib();
    assert!(
        after < before + 32 * 1024,
        "peak RSS grew from {before} KiB to {after} KiB under 256 MB of headers that never end"
    );
}

#[tokio::test]
async fn a_peer_that_never_opens_its_window_is_closed_after_send_timeout() {
    let up = Upstream::spawn().await;
    let proxy = proxy_with(&up, "send_timeout: 2s").await;
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(PREFACE).await.unwrap();
    // SETTINGS_INITIAL_WINDOW_SIZE = 0: no stream may receive a byte of
    // DATA until the peer says so, which it never will.
    s.write_all(&frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 0]))
        .await
        .unwrap();
    s.write_all(&frame(SETTINGS, 0x1, 0, &[])).await.unwrap();
    let block = get_block("/download?bytes=1000000");
    s.write_all(&frame(HEADERS, END_STREAM | END_HEADERS, 1, &block))
        .await
        .unwrap();
    let (r, _w) = s.into_split();
    // Well past send_timeout (2 s, seen within 1.5x), far below idle_timeout.
    let seen = read_frames(r, Duration::from_secs(15)).await;
    assert!(seen.closed, "{seen:?}");
    others_are_served(&proxy).await;
}

/// After ALPN chose h2 the connection is HTTP/2 only: a client that then
/// speaks HTTP/1.1 gets GOAWAY(PROTOCOL_ERROR) and the close (RFC 9113
/// section 3.4; h2spec http2/3.5/2), never an HTTP/1.1 answer.
#[tokio::test]
async fn an_invalid_preface_after_alpn_h2_gets_goaway_protocol_error() {
    let ca = TestCa::new();
    let up = Upstream::spawn().await;
    let (cert, key) = ca.leaf("api", &["api.example.com"]);
    let proxy = TestProxy::spawn(&format!(
        "listeners:\n  - name: public\n    bind: '127.0.0.1:0'\n    tls: {{ certs: [{{ cert: '{cert}', key: '{key}' }}] }}\nadmin: {{ enabled: false }}\nlog: {{ access_log: false }}\nupstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, upstream: api }}\n",
        up.addr
    ))
    .await;
    let mut s = tls_connect(proxy.addr(), ca.client_config(&[b"h2"]), "api.example.com").await;
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    s.write_all(b"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
    assert!(
        !got.starts_with(b"HTTP/1.1"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(got.len() >= 17, "{got:?}");
    assert_eq!(got[3], GOAWAY, "{got:?}");
    assert_eq!(&got[13..17], &1u32.to_be_bytes(), "PROTOCOL_ERROR: {got:?}");
    let errors = proxy.pipeline.metrics().listeners_report()[0].protocol_errors;
    assert_eq!(errors[tollgate::ProtocolError::Http2 as usize], 1);
    assert_eq!(up.hits(), 0);
}

/// A peer's protocol noise (PING ACKs nobody asked for) is counted, not
/// written to the log once per frame: the peer cannot flood the log.
#[tokio::test]
async fn unsolicited_ping_acks_are_counted_not_logged_per_frame() {
    let up = Upstream::spawn().await;
    let tg = crate::common::process::Running::forwarding_to(up.addr, false);
    let mut s = h2_raw(tg.addr).await;
    let mut flood = Vec::new();
    for i in 0..500u64 {
        flood.extend(frame(PING, 0x1, 0, &i.to_be_bytes()));
    }
    flood.extend(frame(
        HEADERS,
        END_STREAM | END_HEADERS,
        1,
        &get_block("/after"),
    ));
    s.write_all(&flood).await.unwrap();
    let (r, _w) = s.into_split();
    let _ = read_frames(r, Duration::from_millis(500)).await;
    until(
        Duration::from_secs(5),
        "the request after the noise",
        || std::future::ready(up.hits() == 1),
    )
    .await;
    let metrics = tg.metrics().await;
    let noise: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_http2_peer_noise_total "))
        .expect("the noise counter")
        .parse()
        .unwrap();
    assert!(noise >= 500.0, "{noise}");
    let logs = tg.logs.lock().unwrap();
    let noisy = logs.iter().filter(|l| l.contains("PING")).count();
    assert!(
        noisy <= 1,
        "{noisy} log lines about PINGs:\n{}",
        logs.join("\n")
    );
}

/// A stream the client resets while its body is on the way is logged as
/// 499 (nginx's "client closed request"), not as the client's 400.
#[tokio::test]
async fn a_stream_reset_mid_body_is_logged_as_499() {
    let up = Upstream::spawn().await;
    let tg = crate::common::process::Running::forwarding_to(up.addr, true);
    let mut s = h2_raw(tg.addr).await;
    // POST /upload, END_HEADERS only: a body follows.
    let mut block = vec![0x83, 0x86, 0x04, 7];
    block.extend_from_slice(b"/upload");
    block.extend_from_slice(&[0x01, 6]);
    block.extend_from_slice(b"a.test");
    let mut out = frame(HEADERS, END_HEADERS, 1, &block);
    out.extend(frame(0, 0, 1, b"part of a body"));
    s.write_all(&out).await.unwrap();
    // The request reaches the upstream, its body streaming.
    until(Duration::from_secs(5), "the request upstream", || {
        std::future::ready(up.hits() == 1)
    })
    .await;
    s.write_all(&frame(RST_STREAM, 0, 1, &8u32.to_be_bytes()))
        .await
        .unwrap();
    let events = tg.access_events(1).await;
    assert_eq!(events[0]["status"], 499, "{}", events[0]);
}

/// A backend that finishes every request it started, whatever its client
/// does (the work runs in a task of its own, as most backends' does), each
/// taking `work`; it counts what it started and the most it ever worked on
/// at once.
struct Working {
    addr: std::net::SocketAddr,
    started: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Working {
    async fn spawn(work: Duration) -> Working {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let started = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let active = Arc::new(AtomicUsize::new(0));
        let (s, m) = (started.clone(), most.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (s, m, a) = (s.clone(), m.clone(), active.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |_req| {
                        let (s, m, a) = (s.clone(), m.clone(), a.clone());
                        async move {
                            s.fetch_add(1, Ordering::SeqCst);
                            let now = a.fetch_add(1, Ordering::SeqCst) + 1;
                            m.fetch_max(now, Ordering::SeqCst);
                            let job = tokio::spawn(async move {
                                tokio::time::sleep(work).await;
                                a.fetch_sub(1, Ordering::SeqCst);
                            });
                            let _ = job.await;
                            Ok::<_, std::convert::Infallible>(http::Response::new(full("done")))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
                });
            }
        });
        Working {
            addr,
            started,
            most,
        }
    }
}

/// What one MadeYouReset connection did to the backend.
struct Attack {
    seen: Seen,
    opened: usize,
    /// Requests the polite client had answered meanwhile.
    served: usize,
    metrics: String,
}

/// MadeYouReset (CVE-2025-8671) on one h2c connection to tollgate
/// (`server` its settings) in front of `backend`: rounds of `per_round`
/// complete GETs, then on each stream a second HEADERS block, which
/// tollgate must answer with RST_STREAM, for at most 6 s or until the
/// connection is gone; a polite client on another connection all along.
async fn made_you_reset(backend: &Working, server: &str, per_round: u32, protocol: &str) -> Attack {
    let tg = crate::common::process::Running::start(&format!(
        "server: {{ {server} }}
upstreams:\n  api: {{ targets: ['{}'], timeout: 5s, protocol: {protocol} }}
routes:\n  - {{ match: {{ path_prefix: / }}, upstream: api }}\n",
        backend.addr
    ));
    let addr = tg.addr;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let polite = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut c = h2(addr).await;
            let mut served = 0;
            while !stop.load(Ordering::SeqCst) {
                let req = http::Request::get("http://a.test/polite")
                    .body(empty())
                    .unwrap();
                let resp = tokio::time::timeout(Duration::from_secs(5), c.send_request(req))
                    .await
                    .expect("the polite client is answered in time")
                    .unwrap();
                assert_eq!(resp.status(), 200);
                served += 1;
            }
            served
        })
    };
    let (r, mut w) = h2_raw(tg.addr).await.into_split();
    let reader = tokio::spawn(read_frames(r, Duration::from_secs(8)));
    w.write_all(&frame(SETTINGS, 0x1, 0, &[])).await.unwrap();
    let mut id = 1u32;
    let mut opened = 0;
    let until_at = tokio::time::Instant::now() + Duration::from_secs(6);
    while tokio::time::Instant::now() < until_at {
        let first = id;
        let mut round = Vec::new();
        for _ in 0..per_round {
            let block = get_block("/work");
            round.extend(frame(HEADERS, END_STREAM | END_HEADERS, id, &block));
            id += 2;
        }
        let mut again = Vec::new();
        for s in (first..id).step_by(2) {
            again.extend(frame(HEADERS, END_HEADERS, s, &get_block("/again")));
        }
        if w.write_all(&round).await.is_err() {
            break;
        }
        opened += per_round as usize;
        tokio::time::sleep(Duration::from_millis(20)).await;
        if w.write_all(&again).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = reader.await.unwrap();
    stop.store(true, Ordering::SeqCst);
    let served = polite.await.unwrap();
    Attack {
        seen,
        opened,
        served,
        metrics: tg.metrics().await,
    }
}

fn series(metrics: &str, side: &str, code: &str, what: &str) -> f64 {
    let name =
        format!(r#"tollgate_http2_{what}_total{{listener="plain",side="{side}",code="{code}"}}"#);
    value(metrics, &name).unwrap_or(0.0)
}

/// MadeYouReset: each reset frees the client's stream slot but not the
/// backend, which goes on working; the connection's upstream slots stay
/// held until the backend answers, so new streams are refused meanwhile
/// and the backend never works on more of the connection's requests than
/// its stream limit. (Before: 1,100 requests in 2.3 s from one connection
/// whose limit was 128.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_you_reset_never_puts_more_work_on_the_backend_than_the_stream_limit() {
    // The backend over HTTP/1.1 (a connection per request in flight) and
    // over HTTP/2 (streams on shared connections).
    for protocol in ["http1", "h2"] {
        let backend = Working::spawn(Duration::from_millis(400)).await;
        let got = made_you_reset(&backend, "h2_max_concurrent_streams: 16", 16, protocol).await;
        let most = backend.most.load(Ordering::SeqCst);
        let started = backend.started.load(Ordering::SeqCst);
        // (the polite client's one request at a time may add one)
        assert!(
            most <= 16 + 1,
            "over {protocol}: the backend worked on {most} at once ({started} started of {} streams)",
            got.opened
        );
        assert!(
            got.seen.refused > 0,
            "over {protocol}: new streams were refused: {:?}",
            got.seen
        );
        assert!(
            got.seen.goaway && got.seen.closed,
            "over {protocol}: {:?}",
            got.seen
        );
        assert!(
            got.served > 0,
            "over {protocol}: the polite client was served"
        );
        // Counted by side and code.
        let m = &got.metrics;
        assert!(
            series(m, "tollgate", "refused_stream", "resets") > 0.0,
            "{m}"
        );
        let broke = series(m, "tollgate", "protocol_error", "resets")
            + series(m, "tollgate", "stream_closed", "resets");
        assert!(broke >= 16.0, "{m}");
    }
}

/// Streams tollgate resets for a client's errors end the connection at
/// `h2_max_reset_streams` (GOAWAY ENHANCE_YOUR_CALM), well before hyper's
/// default of 1,024; the backend's work stays within the stream limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reset_cap_ends_the_connection_with_enhance_your_calm() {
    let backend = Working::spawn(Duration::from_millis(400)).await;
    let server = "h2_max_concurrent_streams: 100, h2_max_reset_streams: 40";
    let got = made_you_reset(&backend, server, 10, "http1").await;
    let most = backend.most.load(Ordering::SeqCst);
    assert!(most <= 100 + 1, "{most}");
    assert!(got.seen.goaway && got.seen.closed, "{:?}", got.seen);
    assert!(got.opened <= 200, "ended after {} streams", got.opened);
    let m = &got.metrics;
    assert_eq!(
        series(m, "tollgate", "enhance_your_calm", "goaways"),
        1.0,
        "{m}"
    );
    let broke = series(m, "tollgate", "protocol_error", "resets")
        + series(m, "tollgate", "stream_closed", "resets");
    assert_eq!(broke, 40.0, "{m}");
}
