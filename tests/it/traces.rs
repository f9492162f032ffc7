//! OpenTelemetry traces, against an OTLP/HTTP collector started by the
//! test (a hyper server decoding each `ExportTraceServiceRequest`): a
//! trusted client's `traceparent` is continued and an untrusted or
//! malformed one replaced; the upstream (HTTP/1.1 and HTTP/2) gets
//! tollgate's span as its parent; a refused request is kept whatever the
//! sampling, with the limit that refused it, and its access-log line names
//! the same trace; a retry is two attempt spans; a slow or dead collector
//! holds no request up and loses spans only as counted; a ratio keeps its
//! share. The wire format is read back by OpenTelemetry's own Python
//! bindings (opentelemetry-proto from PyPI).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prost::Message;
use tokio::net::TcpListener;
use tollgate::traces::{ExportTraceServiceRequest, Span, Value};

use crate::common::process::Running;
use crate::common::*;

/// An OTLP/HTTP collector: every request's spans kept, answered 200 after
/// `delay` (a hung one never answers).
struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    posts: Arc<AtomicUsize>,
    _task: tokio::task::JoinHandle<()>,
}

impl Collector {
    async fn spawn(delay: Duration) -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let posts = Arc::new(AtomicUsize::new(0));
        let (s, b, p) = (spans.clone(), bodies.clone(), posts.clone());
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (s, b, p) = (s.clone(), b.clone(), p.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (s, b, p) = (s.clone(), b.clone(), p.clone());
                        async move {
                            assert_eq!(req.uri().path(), "/v1/traces");
                            assert_eq!(req.headers()["content-type"], "application/x-protobuf");
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let decoded = ExportTraceServiceRequest::decode(body.clone()).unwrap();
                            p.fetch_add(1, Ordering::SeqCst);
                            // A slow collector: its answer comes late (the
                            // pause is the collector's behaviour).
                            tokio::time::sleep(delay).await;
                            for rs in decoded.resource_spans {
                                for ss in rs.scope_spans {
                                    s.lock().unwrap().extend(ss.spans);
                                }
                            }
                            b.lock().unwrap().push(body);
                            Ok::<_, std::convert::Infallible>(http::Response::new(full("")))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Collector {
            addr,
            spans,
            bodies,
            posts,
            _task: task,
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// The server spans received, once there are `n`.
    async fn servers(&self, n: usize) -> Vec<Span> {
        until_some(
            Duration::from_secs(10),
            &format!("{n} server spans"),
            || {
                let got: Vec<Span> = self.spans().into_iter().filter(|s| s.kind == 2).collect();
                std::future::ready((got.len() >= n).then_some(got))
            },
        )
        .await
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn text(span: &Span, key: &str) -> Option<String> {
    match attr(span, key)? {
        Value::String(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Array(a) => Some(
            a.values
                .iter()
                .filter_map(|v| match &v.value {
                    Some(Value::String(s)) => Some(s.clone()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join(","),
        ),
    }
}

fn children<'a>(all: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    all.iter()
        .filter(|s| s.parent_span_id == parent.span_id && s.trace_id == parent.trace_id)
        .collect()
}

fn config(
    collector: SocketAddr,
    upstream: &str,
    protocol: &str,
    traces: &str,
    rest: &str,
) -> String {
    format!(
        "listeners: [{{ bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0', token: 'tollgate-test-token' }}
log: {{ access_log: false }}
client_ip: {{ trusted_proxies: ['127.0.0.2/32'] }}
traces: {{ endpoint: 'http://{collector}/v1/traces', interval: 20ms {traces} }}
upstreams:
  api: {{ targets: [{upstream}], protocol: {protocol} }}
routes: [{{ name: api, match: {{ path_prefix: / }}, upstream: api }}]
{rest}"
    )
}

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_parent_is_continued_and_the_upstream_gets_tollgates_span() {
    for protocol in ["http1", "h2"] {
        continued(protocol).await;
    }
}

async fn continued(protocol: &str) {
    let collector = Collector::spawn(Duration::ZERO).await;
    let echo = Upstream::spawn().await;
    let yaml = config(
        collector.addr,
        &format!("'{}'", echo.addr),
        protocol,
        "",
        "",
    );
    let proxy = TestProxy::spawn(&yaml).await;
    let with_parent = [("traceparent", PARENT), ("tracestate", "vendor=opaque")];

    // From a trusted proxy: continued, tracestate passed on.
    let got = get_from("127.0.0.2", proxy.addr(), "/a", &with_parent).await;
    assert_eq!(got.status, 200);
    let sent = got.seen_header("traceparent").unwrap();
    let parts: Vec<&str> = sent.split('-').collect();
    assert_eq!(parts[0], "00");
    assert_eq!(
        parts[1], "4bf92f3577b34da6a3ce929d0e0e4736",
        "{protocol}: the same trace"
    );
    assert_ne!(
        parts[2], "00f067aa0ba902b7",
        "{protocol}: tollgate's span is the parent"
    );
    assert_eq!(parts[3], "01");
    assert_eq!(
        got.seen_header("tracestate").as_deref(),
        Some("vendor=opaque")
    );
    let spans = collector.servers(1).await;
    let server = &spans[0];
    assert_eq!(hex(&server.trace_id), parts[1]);
    assert_eq!(hex(&server.span_id), parts[2]);
    assert_eq!(hex(&server.parent_span_id), "00f067aa0ba902b7");
    assert_eq!(server.trace_state, "vendor=opaque");
    assert_eq!(server.name, "GET api");
    assert_eq!(text(server, "http.request.method").as_deref(), Some("GET"));
    assert_eq!(text(server, "http.route").as_deref(), Some("api"));
    assert_eq!(
        text(server, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(text(server, "client.address").as_deref(), Some("127.0.0.2"));
    assert_eq!(text(server, "url.path").as_deref(), Some("/a"));
    // Its children: the upstream attempt (a client span).
    let all = collector.spans();
    let kids = children(&all, server);
    let attempt = kids.iter().find(|s| s.kind == 3).expect("an attempt span");
    assert_eq!(text(attempt, "server.address"), Some(echo.addr.to_string()));
    assert_eq!(
        text(attempt, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert!(attempt.start_time_unix_nano >= server.start_time_unix_nano);
    assert!(attempt.end_time_unix_nano <= server.end_time_unix_nano);

    // From an untrusted client: a new trace; its tracestate is not passed.
    let got = get_from("127.0.0.1", proxy.addr(), "/b", &with_parent).await;
    let sent = got.seen_header("traceparent").unwrap();
    assert!(!sent.contains("4bf92f3577b34da6a3ce929d0e0e4736"), "{sent}");
    assert_eq!(sent.len(), 55);
    assert_eq!(got.seen_header("tracestate"), None);
    // Malformed, even from a trusted proxy: replaced, never forwarded.
    let bad = [(
        "traceparent",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
    )];
    let got = get_from("127.0.0.2", proxy.addr(), "/c", &bad).await;
    let sent = got.seen_header("traceparent").unwrap();
    assert!(
        !sent
            .to_lowercase()
            .contains("4bf92f3577b34da6a3ce929d0e0e4736"),
        "{sent}"
    );
    // Without one: started here, sampled at ratio 1.
    let got = get_from("127.0.0.1", proxy.addr(), "/d", &[]).await;
    assert!(got.seen_header("traceparent").unwrap().ends_with("-01"));
    let spans = collector.servers(4).await;
    for s in &spans[1..] {
        assert!(s.parent_span_id.is_empty(), "a started trace has no parent");
    }
}

/// `trust_parent: any` continues a trace from every client.
#[tokio::test]
async fn trust_parent_any_continues_every_clients_trace() {
    let collector = Collector::spawn(Duration::ZERO).await;
    let echo = Upstream::spawn().await;
    let yaml = config(
        collector.addr,
        &format!("'{}'", echo.addr),
        "http1",
        ", trust_parent: any",
        "",
    );
    let proxy = TestProxy::spawn(&yaml).await;
    let got = get_from("127.0.0.1", proxy.addr(), "/", &[("traceparent", PARENT)]).await;
    assert!(got
        .seen_header("traceparent")
        .unwrap()
        .contains("4bf92f3577b34da6a3ce929d0e0e4736"));
}

/// At ratio 0 nothing is kept but the refused request, whose span names
/// the limit that refused it; its access-log line carries the same ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_is_kept_with_its_limit_and_its_log_line_joins_it() {
    let collector = Collector::spawn(Duration::ZERO).await;
    let running = Running::start_logging(
        &format!(
            "traces: {{ endpoint: 'http://{}/v1/traces', interval: 20ms, ratio: 0 }}
zones: [{{ name: per_ip, rate: 1r/m, burst: 1, nodelay: true }}]
routes: [{{ name: hello, match: {{ path_prefix: / }}, respond: {{ body: hi }} }}]
",
            collector.addr
        ),
        true,
    );
    for _ in 0..2 {
        assert_eq!(get(running.addr, "/").await.status, 200);
    }
    assert_eq!(get(running.addr, "/").await.status, 429);
    let spans = collector.servers(1).await;
    assert_eq!(
        spans.len(),
        1,
        "only the refused request is kept at ratio 0"
    );
    let refused = &spans[0];
    assert_eq!(
        text(refused, "http.response.status_code").as_deref(),
        Some("429")
    );
    assert_eq!(
        text(refused, "tollgate.limits").as_deref(),
        Some("zone/per_ip=refused")
    );
    assert_eq!(
        text(refused, "tollgate.refused_by").as_deref(),
        Some("per_ip")
    );
    assert_eq!(
        text(refused, "tollgate.rate_limit").as_deref(),
        Some("rejected:per_ip")
    );
    assert_eq!(refused.flags & 1, 0, "kept, though not sampled");
    let store = children(&collector.spans(), refused)
        .into_iter()
        .find(|s| s.name == "tollgate.store")
        .cloned()
        .expect("the store call's span");
    assert_eq!(text(&store, "tollgate.store").as_deref(), Some("memory"));
    assert_eq!(
        text(&store, "tollgate.store.outcome").as_deref(),
        Some("ok")
    );

    let events = running.access_events(3).await;
    let last = &events[2];
    assert_eq!(last["status"], 429, "{last}");
    assert_eq!(last["trace_id"], hex(&refused.trace_id), "{last}");
    assert_eq!(last["span_id"], hex(&refused.span_id), "{last}");
    // Requests not kept are logged with their ids too (an upstream may
    // have recorded them under the same trace).
    assert_eq!(events[0]["trace_id"].as_str().map(str::len), Some(32));
    let metrics = running.metrics().await;
    assert!(
        metrics.contains("tollgate_trace_spans_total{result=\"exported\"} 2"),
        "{metrics}"
    );
    crate::metrics::promtool_check(&metrics);
}

/// A target that refuses connections, then one that answers: two attempt
/// spans, the first saying why the request went on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_two_attempt_spans() {
    for protocol in ["http1", "h2"] {
        let collector = Collector::spawn(Duration::ZERO).await;
        let echo = Upstream::spawn().await;
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let targets = format!("'{dead}', '{}'", echo.addr);
        let yaml = config(collector.addr, &targets, protocol, "", "");
        let proxy = TestProxy::spawn(&yaml).await;
        for _ in 0..2 {
            assert_eq!(get(proxy.addr(), "/").await.status, 200);
        }
        let servers = collector.servers(2).await;
        let all = collector.spans();
        let retried = servers
            .iter()
            .map(|s| {
                children(&all, s)
                    .into_iter()
                    .filter(|c| c.kind == 3)
                    .collect::<Vec<_>>()
            })
            .find(|a| a.len() == 2)
            .unwrap_or_else(|| panic!("{protocol}: no request with two attempts"));
        let (first, second) = (retried[0], retried[1]);
        assert_eq!(text(first, "server.address"), Some(dead.to_string()));
        // nginx's word for a connection that failed: "error".
        assert_eq!(
            text(first, "tollgate.retry_reason").as_deref(),
            Some("error"),
            "{protocol}"
        );
        assert_eq!(first.status.as_ref().map(|s| s.code), Some(2));
        assert_eq!(text(second, "server.address"), Some(echo.addr.to_string()));
        assert_eq!(
            text(second, "http.response.status_code").as_deref(),
            Some("200")
        );
        assert!(first.end_time_unix_nano <= second.start_time_unix_nano);
    }
}

/// The collector answers after 2 s, or has gone: requests are not held
/// up (each answers long before the export would), and every span is
/// exported or counted as dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_dead_collector_holds_no_request_and_loses_spans_only_as_counted() {
    let slow = Collector::spawn(Duration::from_secs(2)).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for (collector, what) in [(slow.addr, "slow"), (dead, "dead")] {
        let yaml = format!(
            "listeners: [{{ bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0', token: 'tollgate-test-token' }}
log: {{ access_log: false }}
traces: {{ endpoint: 'http://{collector}/v1/traces', queue: 16, batch: 8, interval: 10ms, timeout: 10s }}
routes: [{{ name: hello, match: {{ path_prefix: / }}, respond: {{ body: hi }} }}]
"
        );
        let proxy = TestProxy::spawn(&yaml).await;
        let mut sender = h1(proxy.addr()).await;
        for i in 0..100 {
            // A request waiting for the export would take 2 s (slow) or a
            // connect timeout (dead); this bound only catches that.
            let sent = send1(&mut sender, request("GET", "/", empty()));
            let got = tokio::time::timeout(Duration::from_secs(1), sent)
                .await
                .unwrap_or_else(|_| panic!("{what}: request {i} waited for the collector"));
            assert_eq!(got.status, 200);
        }
        let counts = |m: &str| {
            ["exported", "queue_full", "export_failed"].map(|r| {
                let line = format!("tollgate_trace_spans_total{{result=\"{r}\"}} ");
                m.lines()
                    .find_map(|l| l.strip_prefix(line.as_str()))
                    .map_or(0, |n| n.trim().parse::<u64>().unwrap())
            })
        };
        let settled = until_some(Duration::from_secs(15), "every span accounted for", || {
            let proxy = &proxy;
            async move {
                let m = admin_with(proxy, "tollgate-test-token", "GET", "/metrics", None).await;
                let c = counts(&String::from_utf8_lossy(&m.body));
                (c.iter().sum::<u64>() == 100).then_some(c)
            }
        })
        .await;
        match what {
            "slow" => {
                assert!(settled[1] > 0, "a queue of 16 overflowed: {settled:?}");
                assert_eq!(settled[2], 0, "{settled:?}");
                assert_eq!(slow.spans().len() as u64, settled[0], "exported = received");
            }
            // Each export fails at connect: the spans are counted failed.
            _ => assert_eq!(settled[0], 0, "{settled:?}"),
        }
    }
}

/// Ratio 0.1 over 10,000 requests keeps 1,000 ± 100 of them, and every
/// refused one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ratio_keeps_its_share_and_every_refused_request() {
    let collector = Collector::spawn(Duration::ZERO).await;
    let yaml = format!(
        "listeners: [{{ bind: '127.0.0.1:0' }}]
admin: {{ enabled: false }}
log: {{ access_log: false }}
traces: {{ endpoint: 'http://{}/v1/traces', ratio: 0.1, queue: 100000, batch: 2000, interval: 50ms }}
zones: [{{ name: per_user, key: 'header:x-user', rate: 1r/m, burst: 0, nodelay: true }}]
routes: [{{ name: hello, match: {{ path_prefix: / }}, respond: {{ body: hi }} }}]
",
        collector.addr
    );
    let proxy = TestProxy::spawn(&yaml).await;
    let addr = proxy.addr();
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..4 {
        clients.spawn(async move {
            let mut sender = h1(addr).await;
            let mut refused = 0;
            for i in 0..2550 {
                // Each client's last 50 requests come from one user again
                // and again: refused after the first.
                let user = if i < 2500 {
                    format!("u{c}-{i}")
                } else {
                    format!("abuser-{c}")
                };
                let req = http::Request::get("/")
                    .header("host", "api.test")
                    .header("x-user", user)
                    .body(empty())
                    .unwrap();
                if send1(&mut sender, req).await.status == 429 {
                    refused += 1;
                }
            }
            refused
        });
    }
    let refused: usize = clients.join_all().await.into_iter().sum();
    assert_eq!(refused, 4 * 49);
    let spans = until_some(Duration::from_secs(20), "the refused spans", || {
        let got: Vec<Span> = collector
            .spans()
            .into_iter()
            .filter(|s| s.kind == 2)
            .collect();
        let refused_kept = got
            .iter()
            .filter(|s| text(s, "http.response.status_code").as_deref() == Some("429"))
            .count();
        std::future::ready((refused_kept == refused).then_some(got))
    })
    .await;
    // Settle: nothing more is coming once two intervals pass quietly.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let allowed = collector
        .spans()
        .iter()
        .filter(|s| s.kind == 2 && text(s, "http.response.status_code").as_deref() == Some("200"))
        .count();
    assert!(spans.len() >= refused);
    println!("ratio 0.1: {allowed} of 10,004 allowed requests kept, {refused} refused kept");
    assert!(
        (900..=1100).contains(&allowed),
        "{allowed} kept of 10,004 at ratio 0.1"
    );
}

/// What tollgate sends reads back with OpenTelemetry's own protobuf
/// bindings (opentelemetry-proto from PyPI, in scripts/test's tools venv).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_export_reads_back_with_opentelemetrys_own_bindings() {
    let collector = Collector::spawn(Duration::ZERO).await;
    let echo = Upstream::spawn().await;
    let yaml = config(collector.addr, &format!("'{}'", echo.addr), "http1", "", "");
    let proxy = TestProxy::spawn(&yaml).await;
    get_from("127.0.0.2", proxy.addr(), "/x", &[("traceparent", PARENT)]).await;
    collector.servers(1).await;
    let body = collector.bodies.lock().unwrap()[0].clone();
    assert!(collector.posts.load(Ordering::SeqCst) >= 1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("export.bin");
    std::fs::write(&path, &body).unwrap();
    let python =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/chart-venv/bin/python");
    assert!(
        python.exists(),
        "needs target/chart-venv with opentelemetry-proto: run scripts/test, or \
         python3 -m venv target/chart-venv && target/chart-venv/bin/pip install opentelemetry-proto==1.45.2"
    );
    let script = "
import sys, json
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
req = ExportTraceServiceRequest()
req.ParseFromString(open(sys.argv[1], 'rb').read())
print(json.dumps(MessageToDict(req)))
";
    let out = std::process::Command::new(python)
        .args(["-c", script])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rs = &json["resourceSpans"][0];
    let resource = rs["resource"]["attributes"].as_array().unwrap();
    assert!(resource
        .iter()
        .any(|a| a["key"] == "service.name" && a["value"]["stringValue"] == "tollgate"));
    assert_eq!(rs["scopeSpans"][0]["scope"]["name"], "tollgate");
    let spans = rs["scopeSpans"][0]["spans"].as_array().unwrap();
    let server = spans
        .iter()
        .find(|s| s["kind"] == "SPAN_KIND_SERVER")
        .unwrap();
    assert_eq!(server["name"], "GET api");
    // MessageToDict writes bytes as base64.
    use base64::Engine as _;
    let trace = base64::engine::general_purpose::STANDARD
        .decode(server["traceId"].as_str().unwrap())
        .unwrap();
    assert_eq!(hex(&trace), "4bf92f3577b34da6a3ce929d0e0e4736");
    let attrs = server["attributes"].as_array().unwrap();
    let status = attrs
        .iter()
        .find(|a| a["key"] == "http.response.status_code")
        .unwrap();
    assert_eq!(status["value"]["intValue"], "200");
    assert!(
        server["startTimeUnixNano"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 1_600_000_000_000_000_000
    );
    assert!(spans.iter().any(|s| s["kind"] == "SPAN_KIND_CLIENT"));
}

/// Config problems are named by their YAML path; `check` says where spans go.
#[test]
fn bad_traces_settings_are_named_by_path_and_check_prints_the_collector() {
    let base = "listeners: [{ bind: '127.0.0.1:0' }]\nroutes: [{ match: { path_prefix: / }, respond: { body: x } }]\n";
    for (traces, path, says) in [
        (
            "{ endpoint: 'ftp://collector:4318/v1/traces' }",
            "traces.endpoint",
            "http:// or https://",
        ),
        ("{ endpoint: 'not a url' }", "traces.endpoint", "not a URL"),
        (
            "{ endpoint: 'http://c:4318/v1/traces', ratio: 1.5 }",
            "traces.ratio",
            "from 0 to 1",
        ),
        (
            "{ endpoint: 'http://c:4318/v1/traces', ratio: -0.1 }",
            "traces.ratio",
            "from 0 to 1",
        ),
        (
            "{ endpoint: 'http://c:4318/v1/traces', trust_parent: everyone }",
            "traces.trust_parent",
            "trusted or any",
        ),
        (
            "{ endpoint: 'http://c:4318/v1/traces', queue: 0 }",
            "traces.queue",
            "whole number",
        ),
        (
            "{ endpoint: 'http://c:4318/v1/traces', colour: blue }",
            "traces",
            "colour",
        ),
    ] {
        let yaml = format!("{base}traces: {traces}\n");
        let err = tollgate::Config::from_yaml(&yaml, &|_| None)
            .unwrap_err()
            .to_string();
        assert!(err.contains(path) && err.contains(says), "{traces}: {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.yaml");
    let yaml = format!(
        "{base}traces: {{ endpoint: 'http://otel-collector:4318/v1/traces', ratio: 0.25 }}\n"
    );
    std::fs::write(&path, yaml).unwrap();
    let out = std::process::Command::new(crate::common::process::BIN)
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{printed}");
    assert!(
        printed.contains("traces:    OTLP/HTTP to http://otel-collector:4318/v1/traces as \"tollgate\", ratio 0.25 (+ every refused or failed request), parents from trusted proxies"),
        "{printed}"
    );
}

/// The user (an API key's hash here) is on the span unless `user: false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_user_is_on_the_span_unless_left_out() {
    for (user, shown) in [("", true), (", user: false", false)] {
        let collector = Collector::spawn(Duration::ZERO).await;
        let yaml = format!(
            "listeners: [{{ bind: '127.0.0.1:0' }}]
admin: {{ enabled: false }}
log: {{ access_log: false }}
identity: {{ api_key: {{ header: x-api-key }} }}
traces: {{ endpoint: 'http://{}/v1/traces', interval: 20ms {user} }}
routes: [{{ name: hello, match: {{ path_prefix: / }}, respond: {{ body: hi }} }}]
",
            collector.addr
        );
        let proxy = TestProxy::spawn(&yaml).await;
        let got = get_from(
            "127.0.0.1",
            proxy.addr(),
            "/",
            &[("x-api-key", "a-key-of-some-length")],
        )
        .await;
        assert_eq!(got.status, 200);
        let span = &collector.servers(1).await[0];
        let id = text(span, "enduser.id");
        assert_eq!(id.is_some(), shown, "{user}: {id:?}");
        if let Some(id) = id {
            assert!(
                !id.contains("a-key-of-some-length"),
                "the key itself never leaves"
            );
        }
    }
}
