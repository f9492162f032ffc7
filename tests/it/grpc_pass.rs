//! gRPC through tollgate, with a real gRPC client (tonic's channel) and a
//! real gRPC server (tonic's server codec on hyper's HTTP/2 server), over
//! an HTTP/2 upstream: every call shape with its trailers, a limited call
//! whose RetryInfo the client reads, deadlines (`grpc-timeout`) kept by
//! tollgate, cancellation reaching the upstream, shared upstream
//! connections under concurrency, an upstream dying mid-stream; and plain
//! HTTP clients reaching HTTP/2 upstreams (h2c, and TLS with ALPN).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::uri::PathAndQuery;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message as _;
use tokio::net::TcpListener;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

use crate::common::*;

/// The one message of the test service.
#[derive(Clone, PartialEq, prost::Message)]
struct Msg {
    #[prost(string, tag = "1")]
    text: String,
    #[prost(int64, tag = "2")]
    n: i64,
}

fn msg(text: &str, n: i64) -> Msg {
    Msg {
        text: text.to_owned(),
        n,
    }
}

type Codec = ProstCodec<Msg, Msg>;
type Reply = http::Response<tonic::body::Body>;

/// What the upstream saw, for the tests to check.
#[derive(Default)]
struct Seen {
    /// TCP connections accepted.
    accepted: AtomicUsize,
    /// A call the client (or tollgate) gave up on was cancelled here.
    cancelled: AtomicBool,
    /// The connection tasks, so a test can kill the upstream mid-stream.
    conns: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// Sets `cancelled` if dropped before `done`.
struct CancelWatch(Arc<Seen>, bool);

impl CancelWatch {
    fn done(&mut self) {
        self.1 = true;
    }
}

impl Drop for CancelWatch {
    fn drop(&mut self) {
        if !self.1 {
            self.0.cancelled.store(true, Ordering::SeqCst);
        }
    }
}

struct GrpcUpstream {
    addr: std::net::SocketAddr,
    seen: Arc<Seen>,
}

impl GrpcUpstream {
    /// Waits (up to 5 s) for a call to be cancelled here.
    async fn sees_the_cancel(&self) {
        until(
            Duration::from_secs(5),
            "the upstream to see the cancel",
            || async { self.seen.cancelled.load(Ordering::SeqCst) },
        )
        .await;
    }
}

/// The test service on hyper's HTTP/2 server (h2c), tonic's codec doing
/// the gRPC framing. Methods of `/test.Svc/`:
/// - `Say` (unary): "hello <text>", and what it saw of `te` and
///   `x-forwarded-for`;
/// - `Count` (server streaming): `n` messages, then OK with a custom
///   trailer `x-counted`;
/// - `Sum` (client streaming): the sum of the `n`s;
/// - `Chat` (bidirectional): each message back in upper case;
/// - `Slow` (unary): answers after 10 s unless cancelled;
/// - `Ticks` (server streaming): a message every 20 ms until cancelled;
/// - `Die` (server streaming): two messages, then the upstream drops every
///   connection.
async fn grpc_upstream() -> GrpcUpstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            s.accepted.fetch_add(1, Ordering::SeqCst);
            let state = s.clone();
            let service = hyper::service::service_fn(move |req| serve(req, state.clone()));
            let conn = tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
            s.conns.lock().unwrap().push(conn);
        }
    });
    GrpcUpstream { addr, seen }
}

async fn serve(req: http::Request<Incoming>, seen: Arc<Seen>) -> Result<Reply, Infallible> {
    let mut grpc = tonic::server::Grpc::new(Codec::default());
    let path = req.uri().path().to_owned();
    let header = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let (te, xff) = (header("te"), header("x-forwarded-for"));
    let reply = match path.as_str() {
        "/test.Svc/Say" => {
            let say = tower::service_fn(move |r: tonic::Request<Msg>| {
                let text = format!("hello {} te={te} xff={xff}", r.get_ref().text);
                async move { Ok::<_, Status>(tonic::Response::new(msg(&text, 0))) }
            });
            grpc.unary(say, req).await
        }
        "/test.Svc/Count" => {
            let count = tower::service_fn(|r: tonic::Request<Msg>| async move {
                let (tx, rx) = tokio::sync::mpsc::channel(4);
                tokio::spawn(async move {
                    for i in 0..r.get_ref().n {
                        let _ = tx.send(Ok(msg("item", i))).await;
                    }
                    let mut md = tonic::metadata::MetadataMap::new();
                    md.insert("x-counted", "yes".parse().unwrap());
                    let _ = tx.send(Err(Status::with_metadata(Code::Ok, "", md))).await;
                });
                Ok::<_, Status>(tonic::Response::new(ReceiverStream::new(rx)))
            });
            grpc.server_streaming(count, req).await
        }
        "/test.Svc/Sum" => {
            let sum = tower::service_fn(|r: tonic::Request<tonic::Streaming<Msg>>| async move {
                let mut stream = r.into_inner();
                let mut total = 0;
                while let Some(m) = stream.message().await? {
                    total += m.n;
                }
                Ok::<_, Status>(tonic::Response::new(msg("sum", total)))
            });
            grpc.client_streaming(sum, req).await
        }
        "/test.Svc/Chat" => {
            let chat = tower::service_fn(|r: tonic::Request<tonic::Streaming<Msg>>| async move {
                let mut stream = r.into_inner();
                let (tx, rx) = tokio::sync::mpsc::channel(4);
                tokio::spawn(async move {
                    while let Ok(Some(m)) = stream.message().await {
                        let _ = tx.send(Ok(msg(&m.text.to_uppercase(), m.n))).await;
                    }
                });
                Ok::<_, Status>(tonic::Response::new(ReceiverStream::new(rx)))
            });
            grpc.streaming(chat, req).await
        }
        "/test.Svc/Slow" => {
            let seen = seen.clone();
            let slow = tower::service_fn(move |_: tonic::Request<Msg>| {
                let mut watch = CancelWatch(seen.clone(), false);
                async move {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    watch.done();
                    Ok::<_, Status>(tonic::Response::new(msg("late", 0)))
                }
            });
            grpc.unary(slow, req).await
        }
        "/test.Svc/Ticks" => {
            let seen = seen.clone();
            let ticks = tower::service_fn(move |_: tonic::Request<Msg>| {
                let seen = seen.clone();
                async move {
                    let (tx, rx) = tokio::sync::mpsc::channel(1);
                    tokio::spawn(async move {
                        for i in 0.. {
                            if tx.send(Ok(msg("tick", i))).await.is_err() {
                                seen.cancelled.store(true, Ordering::SeqCst);
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    });
                    Ok::<_, Status>(tonic::Response::new(ReceiverStream::new(rx)))
                }
            });
            grpc.server_streaming(ticks, req).await
        }
        "/test.Svc/Die" => {
            let seen = seen.clone();
            let die = tower::service_fn(move |_: tonic::Request<Msg>| {
                let seen = seen.clone();
                async move {
                    let (tx, rx) = tokio::sync::mpsc::channel(4);
                    tokio::spawn(async move {
                        let _ = tx.send(Ok(msg("one", 1))).await;
                        let _ = tx.send(Ok(msg("two", 2))).await;
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        for conn in seen.conns.lock().unwrap().drain(..) {
                            conn.abort();
                        }
                        // Never ends on its own.
                        std::future::pending::<()>().await;
                        drop(tx);
                    });
                    Ok::<_, Status>(tonic::Response::new(ReceiverStream::new(rx)))
                }
            });
            grpc.server_streaming(die, req).await
        }
        _ => Status::unimplemented(path).into_http(),
    };
    Ok(reply)
}

/// tollgate forwarding `/test.Svc/` over h2c to `up`, with `extra` on the
/// upstream and `limits` on the route; admin on, for the metrics.
async fn proxy_to(up: &GrpcUpstream, extra: &str, limits: &str) -> TestProxy {
    TestProxy::spawn(&format!(
        "listeners:\n  - {{ name: plain, bind: '127.0.0.1:0' }}
admin: {{ bind: '127.0.0.1:0' }}
upstreams:
  grpc: {{ targets: ['{}'], protocol: h2, timeout: 5s {extra} }}
routes:
  - name: svc
    match: {{ grpc: test.Svc }}
    upstream: grpc
    limits: [{limits}]
",
        up.addr
    ))
    .await
}

async fn client(proxy: &TestProxy) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", proxy.addr()))
        .unwrap()
        .connect()
        .await
        .expect("the gRPC client connects to tollgate");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    grpc
}

fn method(name: &'static str) -> PathAndQuery {
    PathAndQuery::from_static(name)
}

async fn say(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
) -> Result<tonic::Response<Msg>, Status> {
    grpc.ready().await.unwrap();
    grpc.unary(
        tonic::Request::new(msg("x", 0)),
        method("/test.Svc/Say"),
        Codec::default(),
    )
    .await
}

/// A server-streaming call of `path` (its messages to read).
async fn listen(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    path: &'static str,
) -> tonic::Streaming<Msg> {
    grpc.ready().await.unwrap();
    grpc.server_streaming(
        tonic::Request::new(msg("", 0)),
        method(path),
        Codec::default(),
    )
    .await
    .expect("the stream starts")
    .into_inner()
}

async fn metrics(proxy: &TestProxy) -> String {
    let got = get(proxy.admin.unwrap(), "/metrics").await;
    String::from_utf8(got.body.to_vec()).unwrap()
}

#[tokio::test]
async fn every_call_shape_passes_through_with_its_trailers() {
    let up = grpc_upstream().await;
    let proxy = proxy_to(&up, "", "").await;
    let mut grpc = client(&proxy).await;

    // Unary, with tollgate's forwarding fields and te: trailers upstream.
    grpc.ready().await.unwrap();
    let said = grpc
        .unary(
            tonic::Request::new(msg("tollgate", 0)),
            method("/test.Svc/Say"),
            Codec::default(),
        )
        .await
        .expect("unary call");
    assert_eq!(
        said.get_ref().text,
        "hello tollgate te=trailers xff=127.0.0.1"
    );

    // Server streaming, ending with a custom trailer.
    grpc.ready().await.unwrap();
    let mut counted = grpc
        .server_streaming(
            tonic::Request::new(msg("", 5)),
            method("/test.Svc/Count"),
            Codec::default(),
        )
        .await
        .expect("server streaming call")
        .into_inner();
    let mut got = Vec::new();
    while let Some(m) = counted.message().await.expect("a clean end") {
        got.push(m.n);
    }
    assert_eq!(got, [0, 1, 2, 3, 4]);
    let trailers = counted.trailers().await.unwrap().expect("trailers");
    assert_eq!(trailers.get("x-counted").unwrap(), "yes");

    // Client streaming.
    let numbers = tokio_stream::iter((1..=10).map(|n| msg("n", n)));
    grpc.ready().await.unwrap();
    let sum = grpc
        .client_streaming(
            tonic::Request::new(numbers),
            method("/test.Svc/Sum"),
            Codec::default(),
        )
        .await
        .expect("client streaming call");
    assert_eq!(sum.get_ref().n, 55);

    // Bidirectional: each answer comes before the next message is sent.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    grpc.ready().await.unwrap();
    let mut chat = grpc
        .streaming(
            tonic::Request::new(ReceiverStream::new(rx)),
            method("/test.Svc/Chat"),
            Codec::default(),
        )
        .await
        .expect("bidirectional call")
        .into_inner();
    for (i, word) in ["ping", "pong", "done"].iter().enumerate() {
        tx.send(msg(word, i as i64)).await.unwrap();
        let back = chat.message().await.unwrap().expect("an answer");
        assert_eq!(
            (back.text.as_str(), back.n),
            (&*word.to_uppercase(), i as i64)
        );
    }
    drop(tx);
    assert!(chat.message().await.unwrap().is_none());

    // An unknown method: the upstream's own status passes through.
    grpc.ready().await.unwrap();
    let missing = grpc
        .unary(
            tonic::Request::new(msg("", 0)),
            method("/test.Svc/Nope"),
            Codec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::Unimplemented);

    // Each call's grpc-status is counted by route.
    let m = until_some(Duration::from_secs(5), "the gRPC calls counted", || async {
        let m = metrics(&proxy).await;
        m.contains(r#"tollgate_grpc_calls_total{route="svc",grpc_status="0"} 4"#)
            .then_some(m)
    })
    .await;
    assert!(
        m.contains(r#"tollgate_grpc_calls_total{route="svc",grpc_status="12"} 1"#),
        "{m}"
    );
    assert!(m.contains(r#"tollgate_upstream_h2_connections{upstream="grpc"}"#));
}

#[tokio::test]
async fn a_limited_call_is_resource_exhausted_with_a_retry_delay_the_client_reads() {
    let up = grpc_upstream().await;
    let proxy = proxy_to(
        &up,
        "",
        "{ name: per_client, algorithm: fixed_window, limit: 1, window: 1m, key: ip }",
    )
    .await;
    let mut grpc = client(&proxy).await;
    say(&mut grpc).await.expect("the first call is allowed");
    let refused = say(&mut grpc).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().contains("per_client"), "{refused:?}");
    assert_eq!(
        refused.metadata().get("x-ratelimit-remaining").unwrap(),
        "0"
    );
    // The details, as a client's retry policy reads them.
    let status = crate::grpc::Status::decode(refused.details()).expect("google.rpc.Status");
    let retry = status
        .details
        .iter()
        .find(|d| d.type_url == "type.googleapis.com/google.rpc.RetryInfo")
        .expect("RetryInfo");
    let delay = crate::grpc::RetryInfo::decode(&retry.value[..])
        .unwrap()
        .retry_delay
        .unwrap();
    assert!((1..=60).contains(&delay.seconds), "{delay:?}");
}

#[tokio::test]
async fn a_call_past_its_deadline_is_deadline_exceeded_and_cancelled_upstream() {
    let up = grpc_upstream().await;
    let proxy = proxy_to(&up, "", "").await;

    // Unary: no answer within grpc-timeout. (A raw HTTP/2 client: tonic's
    // own channel would time out the head itself, first.)
    let mut sender = h2(proxy.addr()).await;
    let req = http::Request::post("http://grpc.test/test.Svc/Slow")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "300m")
        .body(full(&b"\0\0\0\0\0"[..]))
        .unwrap();
    // The upstream would answer after 10 s.
    let resp = tokio::time::timeout(Duration::from_secs(5), sender.send_request(req))
        .await
        .expect("an answer at the deadline, not the upstream's")
        .expect("a response");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["grpc-status"], "4", "{:?}", resp.headers());
    up.sees_the_cancel().await;

    // Streaming: the deadline passes mid-stream, after some messages.
    up.seen.cancelled.store(false, Ordering::SeqCst);
    let mut grpc = client(&proxy).await;
    let mut req = tonic::Request::new(msg("", 0));
    req.set_timeout(Duration::from_millis(400));
    let mut ticks = grpc
        .server_streaming(req, method("/test.Svc/Ticks"), Codec::default())
        .await
        .expect("the stream starts")
        .into_inner();
    let mut n = 0;
    let ended = loop {
        match ticks.message().await {
            Ok(Some(_)) => n += 1,
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), Code::DeadlineExceeded, "{ended:?}");
    assert!(n >= 2, "some ticks came before the deadline: {n}");
    up.sees_the_cancel().await;
}

#[tokio::test]
async fn a_client_cancelling_a_stream_cancels_it_upstream() {
    let up = grpc_upstream().await;
    let proxy = proxy_to(&up, "", "").await;
    let mut grpc = client(&proxy).await;
    let mut ticks = listen(&mut grpc, "/test.Svc/Ticks").await;
    for _ in 0..3 {
        ticks.message().await.unwrap().expect("a tick");
    }
    assert!(!up.seen.cancelled.load(Ordering::SeqCst));
    drop(ticks);
    up.sees_the_cancel().await;
}

#[tokio::test]
async fn concurrent_calls_share_a_few_upstream_connections() {
    let up = grpc_upstream().await;
    let proxy = proxy_to(&up, ", max_streams_per_connection: 8", "").await;
    let grpc = client(&proxy).await;
    let wave = || {
        let calls = (0..64).map(|i| {
            let mut grpc = grpc.clone();
            async move {
                grpc.ready().await.unwrap();
                let r = grpc
                    .unary(
                        tonic::Request::new(msg(&i.to_string(), 0)),
                        method("/test.Svc/Say"),
                        Codec::default(),
                    )
                    .await
                    .expect("a call");
                assert!(r.get_ref().text.starts_with(&format!("hello {i} ")));
            }
        });
        futures_util::future::join_all(calls)
    };
    // At most 64 calls at once, 8 streams a connection: 8 connections
    // cover them (on each of at most two workers), and 192 calls reuse
    // them rather than open one each.
    for _ in 0..3 {
        wave().await;
    }
    let opened = up.seen.accepted.load(Ordering::SeqCst);
    assert!(
        (1..=16).contains(&opened),
        "192 calls, 64 at once, 8 streams a connection: {opened} connections"
    );
}

#[tokio::test]
async fn an_upstream_dying_mid_stream_ends_the_call_unavailable() {
    let up = grpc_upstream().await;
    let proxy = proxy_to(&up, "", "").await;
    let mut grpc = client(&proxy).await;
    let mut stream = listen(&mut grpc, "/test.Svc/Die").await;
    assert_eq!(stream.message().await.unwrap().unwrap().text, "one");
    assert_eq!(stream.message().await.unwrap().unwrap().text, "two");
    let ended = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("the call ends when its upstream dies")
        .unwrap_err();
    assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");
    // The next call gets a fresh connection.
    grpc.ready().await.unwrap();
    let said = grpc
        .unary(
            tonic::Request::new(msg("again", 0)),
            method("/test.Svc/Say"),
            Codec::default(),
        )
        .await
        .expect("a call after the upstream came back");
    assert!(said.get_ref().text.starts_with("hello again"));
}

/// A plain HTTP/2 upstream (h2c, or TLS when `tls` is given) answering
/// with the version, `:authority` and fields it got.
async fn h2_echo(tls: Option<tokio_rustls::TlsAcceptor>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let tls = tls.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(|req: http::Request<Incoming>| async move {
                        let text = format!(
                            "{:?} {} {} xff={:?} connection={:?}",
                            req.version(),
                            req.uri().authority().map_or("-", |a| a.as_str()),
                            req.uri().path(),
                            req.headers().get("x-forwarded-for"),
                            req.headers().get("connection"),
                        );
                        let body = http_body_util::Full::new(bytes::Bytes::from(text));
                        Ok::<_, Infallible>(http::Response::new(body))
                    });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = match tls {
                    None => builder.serve_connection(TokioIo::new(tcp), service).await,
                    Some(acceptor) => {
                        let Ok(stream) = acceptor.accept(tcp).await else {
                            return;
                        };
                        builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                };
            });
        }
    });
    addr
}

#[tokio::test]
async fn http1_clients_reach_an_h2c_upstream_past_a_dead_target() {
    let addr = h2_echo(None).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = TestProxy::spawn(&forward_all(
        &format!("'{dead}', '{addr}'"),
        ", protocol: h2",
        "",
    ))
    .await;
    // Round robin meets the dead target, which cools down; every request
    // is answered by the live one.
    for _ in 0..3 {
        assert_eq!(get(proxy.addr(), "/").await.status, 200);
    }
    let got = send_with(
        proxy.addr(),
        "GET",
        "/some/path?q=1",
        &[("connection", "keep-alive, x-drop"), ("x-drop", "1")],
        b"",
    )
    .await;
    assert_eq!(got.status, 200);
    assert_eq!(
        got.text(),
        "HTTP/2.0 api.test /some/path xff=Some(\"127.0.0.1\") connection=None"
    );
}

#[tokio::test]
async fn auto_speaks_what_a_tls_upstream_chooses() {
    let ca = TestCa::new();
    let both = ca.acceptor(&["localhost"]);
    let mut h1_only = (**both.config()).clone();
    h1_only.alpn_protocols = vec![b"http/1.1".to_vec()];
    let h2_up = h2_echo(Some(both)).await;
    let h1_up = h2_echo(Some(tokio_rustls::TlsAcceptor::from(Arc::new(h1_only)))).await;
    let ca_pem = ca.ca_pem.display();
    let proxy = TestProxy::spawn(&config(&format!(
        "upstreams:
  two: {{ targets: ['localhost:{}'], protocol: auto, tls: {{ ca: '{ca_pem}' }} }}
  one: {{ targets: ['localhost:{}'], protocol: auto, tls: {{ ca: '{ca_pem}' }} }}
routes:
  - {{ match: {{ path_prefix: /two }}, upstream: two }}
  - {{ match: {{ path_prefix: /one }}, upstream: one }}
",
        h2_up.port(),
        h1_up.port()
    )))
    .await;
    for _ in 0..2 {
        let two = get(proxy.addr(), "/two").await;
        assert!(
            two.text().starts_with("HTTP/2.0 test.local /two"),
            "{}",
            two.text()
        );
        let one = get(proxy.addr(), "/one").await;
        assert!(one.text().starts_with("HTTP/1.1 - /one"), "{}", one.text());
    }
}

/// A body the test can read as text.
trait Text {
    fn text(&self) -> String;
}

impl Text for Got {
    fn text(&self) -> String {
        String::from_utf8(self.body.to_vec()).unwrap()
    }
}

#[tokio::test]
async fn a_slow_reader_holds_an_h2_upstream_back() {
    // The upstream offers 64 MiB in 16 KiB frames; `taken` counts what
    // its HTTP/2 server took from it to send.
    const FRAME: usize = 16 << 10;
    const TOTAL: usize = 64 << 20;
    let taken = Arc::new(AtomicUsize::new(0));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counter = taken.clone();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let service = hyper::service::service_fn(move |_: http::Request<Incoming>| {
            let counter = counter.clone();
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tokio::spawn(async move {
                let frame = bytes::Bytes::from(vec![b'x'; FRAME]);
                for _ in 0..TOTAL / FRAME {
                    let data = http_body::Frame::data(frame.clone());
                    if tx.send(Ok::<_, Infallible>(data)).await.is_err() {
                        return;
                    }
                    counter.fetch_add(FRAME, Ordering::SeqCst);
                }
            });
            let body = http_body_util::StreamBody::new(ReceiverStream::new(rx));
            async move { Ok::<_, Infallible>(http::Response::new(body)) }
        });
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(tcp), service)
            .await;
    });
    let proxy = TestProxy::spawn(&forward_all(&format!("'{addr}'"), ", protocol: h2", "")).await;
    let mut sender = h2(proxy.addr()).await;
    let req = http::Request::get(format!("http://{}/big", proxy.addr()))
        .body(empty())
        .unwrap();
    let resp = sender.send_request(req).await.expect("a response head");
    assert_eq!(resp.status(), 200);
    // The client reads nothing for a while: the windows on both legs fill
    // and the upstream is held back, nothing piles up in tollgate.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let held = taken.load(Ordering::SeqCst);
    assert!(
        held < 8 << 20,
        "{held} bytes left the upstream for a client that read nothing"
    );
    // Then it reads: all of it arrives.
    let body = tokio::time::timeout(Duration::from_secs(60), async {
        http_body_util::BodyExt::collect(resp.into_body()).await
    })
    .await
    .expect("the body within a minute")
    .expect("the whole body");
    assert_eq!(body.to_bytes().len(), TOTAL);
}

/// A message past the route's `max_body_size`, sent without a
/// `content-length` (as gRPC clients stream it) to an HTTP/2 upstream,
/// is RESOURCE_EXHAUSTED, as the same call with a length is.
#[tokio::test]
async fn a_message_over_the_body_limit_without_a_length_is_resource_exhausted() {
    let up = grpc_upstream().await;
    let proxy = TestProxy::spawn(&format!(
        "listeners:\n  - {{ name: plain, bind: '127.0.0.1:0' }}
upstreams:
  grpc: {{ targets: ['{}'], protocol: h2, timeout: 5s }}
routes:
  - name: svc
    match: {{ grpc: test.Svc }}
    upstream: grpc
    max_body_size: 1KB
",
        up.addr
    ))
    .await;
    let mut grpc = client(&proxy).await;
    grpc.ready().await.unwrap();
    let big = grpc
        .unary(
            tonic::Request::new(msg(&"x".repeat(64 << 10), 0)),
            method("/test.Svc/Say"),
            Codec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(big.code(), Code::ResourceExhausted, "{big:?}");
    assert!(big.message().contains("body"), "{big:?}");
    // A small one still passes, on the same channel.
    say(&mut grpc).await.expect("a small call passes");
}

/// An h2c server that takes every request and never answers.
async fn h2_silent() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let never = hyper::service::service_fn(|_req: http::Request<Incoming>| async {
                    std::future::pending::<Result<Reply, Infallible>>().await
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), never)
                    .await;
            });
        }
    });
    addr
}

/// gRPC calls follow `next_upstream` as any POST: a target that refuses
/// the connection is passed over (nothing was sent), but a call whose
/// message reached a target that then went silent is never sent to
/// another, even with `non_idempotent` listed (its body is a stream, never
/// kept whole).
#[tokio::test]
async fn a_grpc_call_moves_on_only_while_nothing_was_sent() {
    let up = grpc_upstream().await;
    let refused = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let routes =
        "admin: { enabled: false }\nroutes:\n  - { match: { grpc: test.Svc }, upstream: grpc }\n";
    let proxy = TestProxy::spawn(&format!(
        "listeners: [{{ bind: '127.0.0.1:0' }}]
upstreams:
  grpc: {{ targets: ['{refused}', '{}'], protocol: h2 }}
{routes}",
        up.addr
    ))
    .await;
    let mut grpc = client(&proxy).await;
    for _ in 0..3 {
        let reply = say(&mut grpc)
            .await
            .expect("passed over the refusing target");
        assert!(reply.get_ref().text.starts_with("hello x"));
    }

    let silent = h2_silent().await;
    let proxy = TestProxy::spawn(&format!(
        "listeners: [{{ bind: '127.0.0.1:0' }}]
upstreams:
  grpc:
    targets: ['{silent}', '{}']
    protocol: h2
    timeout: 1s
    next_upstream: {{ on: [error, timeout, non_idempotent] }}
{routes}",
        up.addr
    ))
    .await;
    let accepted = up.seen.accepted.load(Ordering::SeqCst);
    let mut grpc = client(&proxy).await;
    let status = say(&mut grpc)
        .await
        .expect_err("the silent target times out");
    assert!(
        matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded),
        "{status:?}"
    );
    assert_eq!(
        up.seen.accepted.load(Ordering::SeqCst),
        accepted,
        "the call was not sent to the other target"
    );
}
