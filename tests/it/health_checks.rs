//! Active health checks: a target failing its checks takes no requests
//! and comes back once it passes; when every target fails, requests still
//! go to all of them, logged and counted; one checker per target per
//! process.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use crate::balancing::{count, sequence};
use crate::common::*;

/// A backend answering its name, whose `/health` answers 200 while
/// `healthy`, else 503; `checks` counts the `/health` requests.
struct Checked {
    addr: SocketAddr,
    healthy: Arc<AtomicBool>,
    checks: Arc<AtomicUsize>,
}

async fn checked(name: &'static str) -> Checked {
    checked_on(name, false).await
}

/// `checked`, over HTTP/2 only (h2c with prior knowledge) with `h2_only`.
async fn checked_on(name: &'static str, h2_only: bool) -> Checked {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let healthy = Arc::new(AtomicBool::new(true));
    let checks = Arc::new(AtomicUsize::new(0));
    let (h, n) = (healthy.clone(), checks.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (h, n) = (h.clone(), n.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (h, n) = (h.clone(), n.clone());
                    async move {
                        let mut res = http::Response::new(full(name));
                        if req.uri().path() == "/health" {
                            n.fetch_add(1, Ordering::SeqCst);
                            if !h.load(Ordering::SeqCst) {
                                *res.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                            }
                        }
                        Ok::<_, std::convert::Infallible>(res)
                    }
                });
                if h2_only {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                } else {
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                }
            });
        }
    });
    Checked {
        addr,
        healthy,
        checks,
    }
}

/// A proxy forwarding every path to upstream `api`, whose settings are
/// `api` (YAML lines under it), over `protocol`.
async fn checking(api: &str, protocol: &str) -> TestProxy {
    TestProxy::spawn(&format!(
        "listeners: [{{ bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0', token: 'tollgate-test-token' }}
log: {{ access_log: false }}
upstreams:
  api:
    protocol: {protocol}
{api}routes: [{{ match: {{ path_prefix: / }}, upstream: api }}]
"
    ))
    .await
}

async fn both_serve(addr: SocketAddr) -> bool {
    let seen = sequence(addr, 4).await;
    count(&seen, "a") == 2 && count(&seen, "b") == 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_target_failing_its_checks_takes_no_requests_unless_all_do() {
    for protocol in ["http1", "h2"] {
        failing_targets_take_no_requests_unless_all_do(protocol).await;
    }
}

async fn failing_targets_take_no_requests_unless_all_do(protocol: &str) {
    let (a, b) = (checked("a").await, checked("b").await);
    let api = format!(
        "    targets: ['{}', '{}']
    health_check: {{ path: /health, interval: 100ms, timeout: 500ms, fails: 2, passes: 2 }}
",
        a.addr, b.addr
    );
    let proxy = checking(&api, protocol).await;
    let addr = proxy.addr();
    assert!(both_serve(addr).await);
    // One checker per target per process, whatever the workers: about
    // ten checks a second each.
    let before = a.checks.load(Ordering::SeqCst);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let per_second =
        (a.checks.load(Ordering::SeqCst) - before) as f64 / started.elapsed().as_secs_f64();
    assert!(
        (5.0..=13.0).contains(&per_second),
        "{per_second} checks a second"
    );

    a.healthy.store(false, Ordering::SeqCst);
    until(Duration::from_secs(5), "a taken out", || async move {
        sequence(addr, 4).await == ["b"; 4]
    })
    .await;
    let api = admin_with(&proxy, "tollgate-test-token", "GET", "/api/upstreams", None).await;
    let api: serde_json::Value = serde_json::from_slice(&api.body).unwrap();
    assert_eq!(
        api["upstreams"][0]["targets"][0]["state"], "unhealthy",
        "{api}"
    );

    // Both failing: both take requests, logged and counted.
    b.healthy.store(false, Ordering::SeqCst);
    until(
        Duration::from_secs(5),
        "every target failing, all serve",
        || async move { both_serve(addr).await },
    )
    .await;
    let sent = proxy.pipeline.upstreams_report()[0]
        .all_failing_checks
        .unwrap();
    assert!(sent > 0, "{sent}");
    let metrics = admin_with(&proxy, "tollgate-test-token", "GET", "/metrics", None).await;
    let metrics = String::from_utf8_lossy(&metrics.body);
    assert!(
        metrics.contains("tollgate_upstream_checks_all_failing_total{upstream=\"api\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "tollgate_upstream_health_checks_total{{upstream=\"api\",target=\"{}\",result=\"fail\"}}",
            b.addr
        )),
        "{metrics}"
    );

    // b passes again: it alone serves; then a too.
    b.healthy.store(true, Ordering::SeqCst);
    until(Duration::from_secs(5), "b alone", || async move {
        sequence(addr, 4).await == ["b"; 4]
    })
    .await;
    a.healthy.store(true, Ordering::SeqCst);
    until(Duration::from_secs(5), "both back", || async move {
        both_serve(addr).await
    })
    .await;
}

/// `slow_start`: a target that passes its checks again ramps from a
/// tenth of its weight to the whole over the slow start, rather than
/// taking its full share of the traffic at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_target_coming_back_ramps_up_over_its_slow_start() {
    for protocol in ["http1", "h2"] {
        ramps_up_over_its_slow_start(protocol).await;
    }
}

async fn ramps_up_over_its_slow_start(protocol: &str) {
    let (a, b) = (checked("a").await, checked("b").await);
    let api = format!(
        "    targets: [{{ address: '{}', slow_start: 2s }}, '{}']
    health_check: {{ path: /health, interval: 50ms, timeout: 500ms }}
",
        a.addr, b.addr
    );
    let proxy = checking(&api, protocol).await;
    let addr = proxy.addr();
    let failing = |p: &TestProxy| p.pipeline.upstreams_report()[0].targets[0].check_failed;
    a.healthy.store(false, Ordering::SeqCst);
    until(Duration::from_secs(5), "a fails its checks", || async {
        failing(&proxy)
    })
    .await;
    a.healthy.store(true, Ordering::SeqCst);
    until(Duration::from_secs(5), "a passes again", || async {
        !failing(&proxy)
    })
    .await;
    let share = |seen: &[String]| count(seen, "a") as f64 / seen.len() as f64;
    let early = sequence(addr, 100).await;
    assert!(
        share(&early) < 0.35,
        "a took {} of the first 100",
        share(&early)
    );
    let ramping = proxy.pipeline.upstreams_report()[0].targets[0].ramping;
    assert!(ramping.is_some_and(|r| r < 1000), "{ramping:?}");
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let later = sequence(addr, 100).await;
    assert!(
        (0.45..=0.55).contains(&share(&later)),
        "a took {} once ramped",
        share(&later)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_http2_only_upstream_is_checked_over_http2() {
    let (a, b) = (checked_on("a", true).await, checked_on("b", true).await);
    let api = format!(
        "    targets: ['{}', '{}']
    health_check: {{ path: /health, interval: 100ms, timeout: 500ms, fails: 1, passes: 1 }}
",
        a.addr, b.addr
    );
    let proxy = checking(&api, "h2").await;
    // Checks that speak HTTP/1.1 to these targets fail on every one of
    // them, and then both take requests anyway: both serve here only if
    // the checks pass.
    until(
        Duration::from_secs(3),
        "both checked and serving",
        || async { a.checks.load(Ordering::SeqCst) > 0 && b.checks.load(Ordering::SeqCst) > 0 },
    )
    .await;
    assert!(
        both_serve(proxy.addr()).await,
        "both targets pass their checks"
    );
    b.healthy.store(false, Ordering::SeqCst);
    until(
        Duration::from_secs(3),
        "b out after a failed check",
        || async {
            let seen = sequence(proxy.addr(), 4).await;
            count(&seen, "a") == 4
        },
    )
    .await;
    b.healthy.store(true, Ordering::SeqCst);
    until(
        Duration::from_secs(3),
        "b back after a passed check",
        || async { both_serve(proxy.addr()).await },
    )
    .await;
}
