//! Protecting an overloaded backend, over HTTP/1.1 and HTTP/2 upstreams:
//! a queue where requests wait for a target under `max_conns` (nginx
//! Plus `queue`) instead of a 502; 503s with Retry-After when it is full
//! or a request has waited its time (gRPC: UNAVAILABLE with a RetryInfo,
//! never past the call's deadline); priority classes (the highest first,
//! the lowest shed to make room, never-shed classes past the limit); and
//! an adaptive concurrency limit that learns what a backend of a few
//! workers sustains.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::common::*;
use crate::grpc::{RetryInfo, Status};

const TOKEN: &str = "tollgate-test-token";

/// A backend of `workers` that each serve a request in `service`
/// (requests beyond them wait their turn, as in a thread pool), over
/// HTTP/1.1 or h2c. `order` lists the paths in the order service began.
pub(crate) struct Workers {
    pub addr: SocketAddr,
    pub order: Arc<Mutex<Vec<String>>>,
}

impl Workers {
    pub async fn spawn(workers: usize, service: Duration) -> Workers {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let pool = Arc::new(Semaphore::new(workers));
        let seen = order.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (pool, seen) = (pool.clone(), seen.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (pool, seen) = (pool.clone(), seen.clone());
                        async move {
                            let _worker = pool.acquire().await.unwrap();
                            seen.lock().unwrap().push(req.uri().path().to_owned());
                            tokio::time::sleep(service).await;
                            let mut res = http::Response::new(full("served"));
                            if req.headers().contains_key("content-type") {
                                res.headers_mut()
                                    .insert("content-type", "application/grpc".parse().unwrap());
                                res.headers_mut()
                                    .insert("grpc-status", "0".parse().unwrap());
                            }
                            Ok::<_, std::convert::Infallible>(res)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Workers { addr, order }
    }

    fn order(&self) -> Vec<String> {
        self.order.lock().unwrap().clone()
    }
}

/// A proxy with the admin API, `top` YAML, and upstream `api` (`target`
/// its one target, `extra` its settings) behind `routes`.
async fn proxy(top: &str, target: &str, extra: &str, routes: &str) -> TestProxy {
    TestProxy::spawn(&format!(
        r#"
listeners: [{{ bind: "127.0.0.1:0" }}]
admin: {{ bind: "127.0.0.1:0", token: "{TOKEN}" }}
{top}
upstreams:
  api: {{ targets: [{target}], {extra} }}
routes:
{routes}
  - {{ match: {{ path_prefix: / }}, upstream: api }}
"#
    ))
    .await
}

/// `n` GETs of `path` at once, each on its own connection.
async fn at_once(addr: SocketAddr, paths: &[&str]) -> Vec<Got> {
    let mut all = JoinSet::new();
    for (i, p) in paths.iter().enumerate() {
        let p = p.to_string();
        all.spawn(async move { (i, get(addr, &p).await) });
    }
    let mut got: Vec<(usize, Got)> = all.join_all().await;
    got.sort_by_key(|(i, _)| *i);
    got.into_iter().map(|(_, g)| g).collect()
}

fn statuses(got: &[Got]) -> Vec<u16> {
    got.iter().map(|g| g.status.as_u16()).collect()
}

async fn protect_view(p: &TestProxy) -> serde_json::Value {
    let got = admin_with(p, TOKEN, "GET", "/api/upstreams", None).await;
    assert_eq!(got.status, 200);
    got.json()["upstreams"][0]["protect"].clone()
}

async fn metrics(p: &TestProxy) -> String {
    let got = admin_with(p, TOKEN, "GET", "/metrics", None).await;
    String::from_utf8(got.body.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_holds_what_max_conns_would_refuse() {
    for protocol in ["http1", "h2"] {
        let backend = Workers::spawn(8, Duration::from_millis(300)).await;
        let target = format!("{{ address: '{}', max_conns: 2 }}", backend.addr);
        // nginx open source: 2 served, the rest 502.
        let bare = proxy("", &target, &format!("protocol: {protocol}"), "").await;
        let got = at_once(bare.addr(), &["/a"; 6]).await;
        assert_eq!(
            statuses(&got).iter().filter(|s| **s == 502).count(),
            4,
            "{protocol}: without a queue, max_conns refuses"
        );
        let extra = format!("protocol: {protocol}, queue: {{ size: 10, timeout: 5s }}");
        let queued = proxy("", &target, &extra, "").await;
        let got = at_once(queued.addr(), &["/a"; 6]).await;
        assert_eq!(statuses(&got), vec![200; 6], "{protocol}: every one waited");
        let view = protect_view(&queued).await;
        assert_eq!(view["dequeued"], 4, "{protocol}: {view}");
        assert_eq!(view["queued"], 0);
        assert_eq!(view["limit"], serde_json::Value::Null, "no adaptive limit");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_and_a_long_wait_answer_503_with_retry_after() {
    for protocol in ["http1", "h2"] {
        full_queue_and_long_wait(protocol).await;
    }
}

async fn full_queue_and_long_wait(protocol: &str) {
    let backend = Workers::spawn(8, Duration::from_millis(1500)).await;
    let target = format!("{{ address: '{}', max_conns: 1 }}", backend.addr);
    let extra = format!("protocol: {protocol}, queue: {{ size: 1, timeout: 300ms }}");
    let p = proxy("", &target, &extra, "").await;
    let addr = p.addr();
    let first = tokio::spawn(async move { get(addr, "/hold").await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let waits = tokio::spawn(async move { get(addr, "/wait").await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let full = get(addr, "/full").await;
    assert_eq!(full.status, 503);
    assert_eq!(full.headers["retry-after"], "1");
    assert_eq!(full.headers["content-type"], "application/problem+json");
    let detail = full.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("\"api\" is overloaded") && detail.contains("(queue_full)"),
        "{detail}"
    );
    let waited = waits.await.unwrap();
    assert_eq!(waited.status, 503);
    assert!(
        waited.json()["detail"]
            .as_str()
            .unwrap()
            .contains("(timeout)"),
        "{:?}",
        waited.body
    );
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(backend.order(), vec!["/hold"], "nothing shed reached it");
    let m = metrics(&p).await;
    for (reason, n) in [("queue_full", 1.0), ("timeout", 1.0), ("limit", 0.0)] {
        let series = format!(
            "tollgate_upstream_shed_total{{upstream=\"api\",class=\"default\",reason=\"{reason}\"}}"
        );
        assert_eq!(value(&m, &series), Some(n), "{series}");
    }
}

const CLASSES: &str = "client_ip: { trusted_proxies: ['127.0.0.2/32'] }
priorities:
  classes: [critical, standard, bulk]
  default: standard
  never_shed: [critical]
  header: x-priority";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn higher_classes_go_first_and_the_lowest_makes_room() {
    for protocol in ["http1", "h2"] {
        classes_in_order(protocol).await;
    }
}

async fn classes_in_order(protocol: &str) {
    let backend = Workers::spawn(8, Duration::from_millis(400)).await;
    let target = format!("{{ address: '{}', max_conns: 1 }}", backend.addr);
    let routes = "  - { match: { path_prefix: /bulk }, upstream: api, priority: bulk }";
    let extra = format!("protocol: {protocol}, queue: {{ size: 2, timeout: 5s }}");
    let p = proxy(CLASSES, &target, &extra, routes).await;
    let addr = p.addr();
    let mut running = JoinSet::new();
    let mut send = |path: &'static str| {
        running.spawn(async move { (path, get(addr, path).await.status.as_u16()) });
    };
    send("/hold");
    tokio::time::sleep(Duration::from_millis(100)).await;
    send("/bulk/1");
    tokio::time::sleep(Duration::from_millis(50)).await;
    send("/bulk/2");
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The queue is full: a standard request takes the newest bulk one's
    // place.
    send("/standard");
    let mut got: Vec<(&str, u16)> = running.join_all().await;
    got.sort();
    assert_eq!(
        got,
        vec![
            ("/bulk/1", 200),
            ("/bulk/2", 503),
            ("/hold", 200),
            ("/standard", 200)
        ]
    );
    assert_eq!(
        backend.order(),
        vec!["/hold", "/standard", "/bulk/1"],
        "the higher class went first"
    );
    let view = protect_view(&p).await;
    assert_eq!(view["shed"]["bulk"]["queue_full"], 1, "{view}");
    assert_eq!(view["shed"]["standard"]["queue_full"], 0, "{view}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_limit_the_never_shed_class_still_passes() {
    for protocol in ["http1", "h2"] {
        never_shed_passes(protocol).await;
    }
}

async fn never_shed_passes(protocol: &str) {
    let backend = Workers::spawn(8, Duration::from_millis(1500)).await;
    let target = format!("'{}'", backend.addr);
    let routes = "  - { match: { path: /healthz }, upstream: api, priority: critical }";
    // A limit pinned at one request.
    let extra = format!("protocol: {protocol}, concurrency: {{ min: 1, max: 1 }}");
    let p = proxy(CLASSES, &target, &extra, routes).await;
    let addr = p.addr();
    let first = tokio::spawn(async move { get(addr, "/hold").await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let shed = get(addr, "/other").await;
    assert_eq!(shed.status, 503);
    let detail = shed.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("class \"standard\" was shed (limit)"),
        "{detail}"
    );
    let healthz = tokio::spawn(async move { get(addr, "/healthz").await.status });
    // A class named by a header counts from a trusted proxy only.
    let critical = [("x-priority", "critical")];
    let trusted = tokio::spawn(async move { get_from("127.0.0.2", addr, "/x", &critical).await });
    let untrusted = get_from("127.0.0.1", addr, "/x", &critical).await;
    assert_eq!(untrusted.status, 503);
    assert_eq!(healthz.await.unwrap(), 200, "never shed");
    assert_eq!(trusted.await.unwrap().status, 200);
    assert_eq!(first.await.unwrap().status, 200);
    let view = protect_view(&p).await;
    assert_eq!(view["limit"], 1);
    assert_eq!(view["shed"]["standard"]["limit"], 2, "{view}");
    assert_eq!(view["shed"]["critical"]["limit"], 0, "{view}");
}

/// An HTTP/2 gRPC call to `path` with `grpc-timeout` (if any).
async fn grpc_call(addr: SocketAddr, path: &str, timeout: Option<&str>) -> Got {
    let mut c = h2(addr).await;
    let mut req = http::Request::post(format!("http://api.test{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(t) = timeout {
        req = req.header("grpc-timeout", t);
    }
    let resp = c
        .send_request(req.body(full(vec![0u8, 0, 0, 0, 0])).unwrap())
        .await
        .unwrap();
    collect(resp).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_grpc_call_is_unavailable_with_retry_info_within_its_deadline() {
    let backend = Workers::spawn(8, Duration::from_millis(2000)).await;
    let target = format!("{{ address: '{}', max_conns: 1 }}", backend.addr);
    let p = proxy(
        "",
        &target,
        "protocol: h2, queue: { size: 5, timeout: 10s }",
        "",
    )
    .await;
    let addr = p.addr();
    let first = tokio::spawn(async move { grpc_call(addr, "/shop.Cart/Hold", None).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = tokio::time::Instant::now();
    let shed = grpc_call(addr, "/shop.Cart/Add", Some("300m")).await;
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(5),
        "waited {waited:?}: the call's 300 ms deadline, not the queue's 10 s"
    );
    assert_eq!(shed.status, 200, "gRPC carries its status in grpc-status");
    assert_eq!(shed.headers["grpc-status"], "14", "UNAVAILABLE");
    let bin = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(shed.headers["grpc-status-details-bin"].as_bytes())
        .unwrap();
    let status = Status::decode(&bin[..]).unwrap();
    assert_eq!(status.code, 14);
    assert_eq!(
        status.details[0].type_url,
        "type.googleapis.com/google.rpc.RetryInfo"
    );
    let retry = RetryInfo::decode(&status.details[0].value[..]).unwrap();
    assert_eq!(retry.retry_delay.unwrap().seconds, 1);
    assert_eq!(first.await.unwrap().headers["grpc-status"], "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_limit_learns_what_a_few_workers_sustain() {
    for protocol in ["http1", "h2"] {
        // 4 workers of 40 ms: 100 requests a second.
        let backend = Workers::spawn(4, Duration::from_millis(40)).await;
        let target = format!("'{}'", backend.addr);
        let extra = format!(
            "protocol: {protocol}, concurrency: {{ min: 1, max: 500, interval: 50ms, probe_requests: 10 }}"
        );
        let p = proxy("", &target, &extra, "").await;
        let addr = p.addr();
        // 40 clients, each sending one request after another for 3 s.
        let until = tokio::time::Instant::now() + Duration::from_secs(3);
        let mut clients = JoinSet::new();
        for _ in 0..40 {
            clients.spawn(async move {
                let (mut ok, mut shed) = (0u32, 0u32);
                while tokio::time::Instant::now() < until {
                    match get(addr, "/work").await.status.as_u16() {
                        200 => ok += 1,
                        503 => {
                            shed += 1;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        other => panic!("status {other}"),
                    }
                }
                (ok, shed)
            });
        }
        let view_during = {
            tokio::time::sleep(Duration::from_millis(2500)).await;
            protect_view(&p).await
        };
        let (ok, shed) = clients
            .join_all()
            .await
            .into_iter()
            .fold((0, 0), |(a, b), (o, s)| (a + o, b + s));
        let limit = view_during["limit"].as_u64().unwrap();
        // Unprotected, 40 requests would sit in the backend at once.
        assert!(
            (2..=16).contains(&limit),
            "{protocol}: limit {limit} for 4 workers: {view_during}"
        );
        assert!(shed > 0 && ok > 100, "{protocol}: {ok} served, {shed} shed");
        assert!(view_during["min_rtt_ms"].as_f64().unwrap() >= 40.0);
        assert!(!view_during["history"].as_array().unwrap().is_empty());
    }
}

#[test]
fn the_readme_sample_is_a_valid_config() {
    let config = readme_config("priorities:", "");
    assert_eq!(config.priorities.names.len(), 3);
    assert!(config.priorities.never_shed(0));
    let api = &config.upstreams[0];
    assert_eq!(api.concurrency.as_ref().unwrap().max, 500);
    assert_eq!(api.queue.as_ref().unwrap().size, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paid_plan_can_be_a_class_that_is_never_shed() {
    for protocol in ["http1", "h2"] {
        paid_plan_never_shed(protocol).await;
    }
}

async fn paid_plan_never_shed(protocol: &str) {
    let backend = Workers::spawn(8, Duration::from_millis(1500)).await;
    let target = format!("'{}'", backend.addr);
    let top = "client_ip: { trusted_proxies: ['127.0.0.2/32'] }
identity: { plans: { names: [free, pro], header: x-plan, default: free } }
priorities: { classes: [paid, standard], never_shed: [paid], plans: { pro: paid } }";
    let extra = format!("protocol: {protocol}, concurrency: {{ min: 1, max: 1 }}");
    let p = proxy(top, &target, &extra, "").await;
    let addr = p.addr();
    let first = tokio::spawn(async move { get_from("127.0.0.2", addr, "/hold", &[]).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let pro = [("x-plan", "pro")];
    let paid = tokio::spawn(async move { get_from("127.0.0.2", addr, "/pro", &pro).await });
    let free = get_from("127.0.0.2", addr, "/free", &[("x-plan", "free")]).await;
    assert_eq!(free.status, 503, "the free plan's request is shed");
    assert_eq!(paid.await.unwrap().status, 200, "the paid plan's never is");
    assert_eq!(first.await.unwrap().status, 200);
    let view = protect_view(&p).await;
    assert_eq!(view["shed"]["standard"]["limit"], 1, "{view}");
    assert_eq!(view["shed"]["paid"]["limit"], 0, "{view}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_an_unchanged_gate_and_starts_a_changed_one_anew() {
    let backend = Workers::spawn(8, Duration::from_millis(800)).await;
    let yaml = |max: u32| {
        format!(
            "listeners: [{{ bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0', token: '{TOKEN}' }}
upstreams:
  api: {{ targets: ['{}'], concurrency: {{ min: 1, max: {max} }} }}
routes: [{{ match: {{ path_prefix: / }}, upstream: api }}]
",
            backend.addr
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, yaml(1)).unwrap();
    let p = TestProxy::spawn_file(&path).await;
    let addr = p.addr();
    let held = tokio::spawn(async move { get(addr, "/hold").await.status });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(get(addr, "/x").await.status, 503);
    // The same file: the gate, its place held and its count, stay.
    p.reload.reload().await.unwrap();
    assert_eq!(protect_view(&p).await["in_flight"], 1);
    assert_eq!(
        get(addr, "/x").await.status,
        503,
        "the held place still counts"
    );
    assert_eq!(protect_view(&p).await["shed"]["default"]["limit"], 2);
    // Another limit: a new gate, nothing held or counted yet.
    std::fs::write(&path, yaml(2)).unwrap();
    p.reload.reload().await.unwrap();
    let view = protect_view(&p).await;
    assert_eq!(view["shed"]["default"]["limit"], 0, "{view}");
    assert_eq!(view["in_flight"], 0, "{view}");
    assert_eq!(held.await.unwrap(), 200, "the request in flight finished");
}
