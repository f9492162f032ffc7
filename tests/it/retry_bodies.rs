//! What a retry may send again, over HTTP/1.1 and HTTP/2 upstreams: a
//! body kept whole (up to `next_upstream.max_body`) reaches the next
//! target intact; POST goes on only with `non_idempotent` listed; a body
//! too large to keep is never sent twice; a listed 429 is retried and an
//! unlisted one passed on; a drained target takes nothing.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use http::Request;
use http_body_util::BodyExt;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use crate::common::*;

/// A backend answering `status` with `<name> <bytes of body received>`,
/// over HTTP/1.1 or h2c.
async fn counting(name: &'static str, status: u16) -> SocketAddr {
    backend(name, status, true).await.0
}

/// A backend answering `status` with its name (and, with `lengths`, the
/// bytes of body it received), over HTTP/1.1 or h2c; the requests it
/// received are counted.
async fn backend(name: &'static str, status: u16, lengths: bool) -> (SocketAddr, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = hits.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    seen.fetch_add(1, Ordering::SeqCst);
                    async move {
                        let body = req.into_body().collect().await.map(|b| b.to_bytes().len());
                        let text = match lengths {
                            true => format!("{name} {}", body.unwrap_or(0)),
                            false => name.to_owned(),
                        };
                        let mut res = http::Response::new(full(text));
                        *res.status_mut() = http::StatusCode::from_u16(status).unwrap();
                        Ok::<_, std::convert::Infallible>(res)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (addr, hits)
}

async fn proxy(bad: SocketAddr, good: SocketAddr, protocol: &str, on: &str) -> TestProxy {
    TestProxy::spawn(&format!(
        r#"
listeners: [{{ bind: "127.0.0.1:0" }}]
admin: {{ bind: "127.0.0.1:0", token: "tollgate-test-token" }}
upstreams:
  app:
    targets: [{{ address: "{bad}", max_fails: 0 }}, "{good}"]
    protocol: {protocol}
    next_upstream: {{ on: [{on}], max_body: 64KiB }}
routes: [{{ match: {{ path_prefix: / }}, upstream: app }}]
"#
    ))
    .await
}

async fn call(proxy: &TestProxy, method: &str, bytes: usize) -> (u16, String) {
    let mut c = h1(proxy.addr()).await;
    let got = send1(&mut c, request(method, "/", full(vec![b'x'; bytes]))).await;
    (
        got.status.as_u16(),
        String::from_utf8_lossy(&got.body).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_bodies_are_sent_again_whole_and_writes_only_when_allowed() {
    let default = "error, timeout, http_502";
    let writes = "error, timeout, http_502, non_idempotent";
    for protocol in ["http1", "h2"] {
        let (bad, good) = (counting("bad", 502).await, counting("good", 200).await);
        // A new proxy per request: its first attempt goes to `bad`.
        let first = |on: &'static str, method: &'static str, bytes: usize| async move {
            call(&proxy(bad, good, protocol, on).await, method, bytes).await
        };
        // PUT is kept whole and sent again.
        assert_eq!(
            first(default, "PUT", 10_000).await,
            (200, "good 10000".into()),
            "{protocol}"
        );
        // POST was sent: not passed on; bad's 502 comes back as it is.
        assert_eq!(
            first(default, "POST", 100).await,
            (502, "bad 100".into()),
            "{protocol}"
        );
        // Too large to keep: never sent twice.
        assert_eq!(
            first(default, "PUT", 100_000).await,
            (502, "bad 100000".into()),
            "{protocol}"
        );
        assert_eq!(
            first(writes, "POST", 100).await,
            (200, "good 100".into()),
            "{protocol}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_an_answer_unless_listed() {
    for protocol in ["http1", "h2"] {
        let (busy, good) = (counting("busy", 429).await, counting("good", 200).await);
        let p = proxy(busy, good, protocol, "error, timeout").await;
        assert_eq!(
            call(&p, "GET", 0).await,
            (429, "busy 0".into()),
            "{protocol}"
        );
        let p = proxy(busy, good, protocol, "error, timeout, http_429").await;
        assert_eq!(
            call(&p, "GET", 0).await,
            (200, "good 0".into()),
            "{protocol}"
        );
    }
}

/// `PUT /api/upstreams/app/<target> {"down": true}` drains a target: no
/// new requests until it is set back; the API and the metrics show it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_target_takes_no_requests_until_set_back() {
    let (a, b) = (counting("a", 200).await, counting("b", 200).await);
    let p = proxy(a, b, "http1", "error, timeout").await;
    let token = "tollgate-test-token";
    let put = |down: bool| {
        let path = format!("/api/upstreams/app/{a}");
        let body = format!("{{\"down\": {down}}}");
        let p = &p;
        async move { admin_with(p, token, "PUT", &path, Some(&body)).await }
    };
    let got = put(true).await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    let api: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(api["target"]["state"], "draining", "{api}");
    for _ in 0..6 {
        assert_eq!(call(&p, "GET", 0).await, (200, "b 0".into()));
    }
    let metrics = admin_with(&p, token, "GET", "/metrics", None).await;
    let metrics = String::from_utf8_lossy(&metrics.body);
    assert!(
        metrics.contains(&format!(
            "tollgate_upstream_target_up{{upstream=\"app\",target=\"{a}\"}} 0"
        )),
        "{metrics}"
    );
    assert_eq!(put(false).await.status, 200);
    let seen: Vec<String> = futures_util::future::join_all((0..4).map(|_| call(&p, "GET", 0)))
        .await
        .into_iter()
        .map(|(_, body)| body)
        .collect();
    assert!(
        seen.iter().any(|s| s == "a 0"),
        "back in the rotation: {seen:?}"
    );
    // Unknown names are 404 problems; a body without `down` a 400.
    assert_eq!(
        admin_with(
            &p,
            token,
            "PUT",
            "/api/upstreams/nope/x:1",
            Some("{\"down\":true}")
        )
        .await
        .status,
        404
    );
    let path = format!("/api/upstreams/app/{a}");
    assert_eq!(
        admin_with(&p, token, "PUT", &path, Some("{}")).await.status,
        400
    );
}

/// An upstream that answers each connection's first request with
/// `got <bytes of body>` and reads the second in full, then hangs up
/// without a word (the keep-alive race: it closed as the request came).
async fn hangs_up_on_the_second() -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut r = BufReader::new(tcp);
                for nth in 0.. {
                    let Some((_, length)) = read_head(&mut r).await else {
                        return;
                    };
                    let mut body = vec![0; length];
                    if r.read_exact(&mut body).await.is_err() || nth == 1 {
                        return;
                    }
                    let text = format!("got {length}");
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{text}",
                        text.len()
                    );
                    let _ = r.get_mut().write_all(head.as_bytes()).await;
                }
            });
        }
    });
    addr
}

/// A kept body goes whole on the fresh connection too, when the pooled
/// one it was written into turns out closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_body_is_sent_whole_again_after_the_keep_alive_race() {
    let (a, b) = (
        hangs_up_on_the_second().await,
        hangs_up_on_the_second().await,
    );
    let p = proxy(a, b, "http1", "error, timeout").await;
    let mut c = h1(p.addr()).await;
    for _ in 0..3 {
        let got = send1(&mut c, request("PUT", "/", full(vec![b'x'; 5000]))).await;
        assert_eq!(
            (
                got.status.as_u16(),
                String::from_utf8_lossy(&got.body).into_owned()
            ),
            (200, "got 5000".to_owned())
        );
    }
    let report = p.pipeline.upstreams_report();
    let stale: u64 = report[0].targets.iter().map(|t| t.retries[10]).sum();
    assert_eq!(
        stale, 1,
        "the third went into a closed connection, then a fresh one"
    );
}

/// Half the requests meet a target answering 502 (`http_502` listed, never
/// marked down). Without a budget each is retried: the upstream sees 1.5x
/// the client's requests. With linkerd's budget (ratio 0.2, here one a
/// second in reserve over 10 s) it sees at most 1.2x plus the reserve; the
/// retries refused pass the 502 on as it came, and are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_budget_caps_what_the_upstream_sees_under_failures() {
    const N: usize = 200;
    for protocol in ["http1", "h2"] {
        for budget in [
            "",
            ", budget: { ratio: 0.2, min_per_second: 1, window: 10s }",
        ] {
            let (bad, bad_hits) = backend("bad", 502, false).await;
            let (good, good_hits) = backend("good", 200, false).await;
            let p = TestProxy::spawn(&format!(
                "listeners: [{{ bind: '127.0.0.1:0' }}]
admin: {{ enabled: false }}
upstreams:
  app:
    targets: [{{ address: '{bad}', max_fails: 0 }}, '{good}']
    protocol: {protocol}
    next_upstream: {{ on: [error, timeout, http_502]{budget} }}
routes: [{{ match: {{ path_prefix: / }}, upstream: app }}]
"
            ))
            .await;
            let mut c = h1(p.addr()).await;
            let mut passed_on = 0;
            for _ in 0..N {
                let got = send1(&mut c, request("GET", "/", empty())).await;
                if got.status == 502 {
                    assert_eq!(got.body, "bad", "the upstream's own 502");
                    passed_on += 1;
                }
            }
            let bad = bad_hits.load(Ordering::SeqCst);
            let upstream = bad + good_hits.load(Ordering::SeqCst);
            let refused = p.pipeline.upstreams_report()[0].budget_refused;
            if budget.is_empty() {
                // Every 502 retried: about half the requests twice.
                assert!(bad >= N / 3, "{protocol}: {bad}");
                assert_eq!(
                    (upstream, passed_on, refused),
                    (N + bad, 0, None),
                    "{protocol}"
                );
            } else {
                assert!(
                    upstream <= N * 6 / 5 + 10,
                    "{protocol}: {upstream} upstream requests"
                );
                assert!(passed_on >= 40, "{protocol}: {passed_on}");
                assert_eq!(refused, Some(passed_on as u64), "{protocol}");
            }
        }
    }
}
