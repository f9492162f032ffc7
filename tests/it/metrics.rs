//! `GET /metrics` on the admin listener: a known mix of requests (allowed,
//! delayed, rejected, dry-run, bypassed, a 502) is counted exactly, the
//! exposition passes `promtool check metrics`, and no client IP or token
//! appears in it.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;

const TOKEN: &str = "monitoring-token-0123456789";

async fn scrape(proxy: &TestProxy, accept: Option<&str>) -> Got {
    let mut c = h1(proxy.admin.expect("admin listener")).await;
    let mut req = http::Request::get("/metrics").header("host", "admin");
    if let Some(a) = accept {
        req = req.header("accept", a);
    }
    send1(&mut c, req.body(empty()).unwrap()).await
}

/// A GET from 127.0.0.2, so the client's address differs from every
/// address in the config (all 127.0.0.1).
async fn from2(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]) -> Got {
    get_from("127.0.0.2", addr, path, headers).await
}

/// Scrapes until `done` holds (counters move when responses end, a moment
/// after the client has read them), and returns that scrape.
async fn scrape_until(proxy: &TestProxy, done: impl Fn(&str) -> bool) -> String {
    until_some(Duration::from_secs(5), "the metrics to show it", || async {
        let m = text(&scrape(proxy, None).await);
        done(&m).then_some(m)
    })
    .await
}

fn text(got: &Got) -> String {
    String::from_utf8(got.body.to_vec()).unwrap()
}

pub(crate) fn promtool_check(exposition: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect(
            "promtool not found: install it with `apt-get install prometheus` (scripts/test does)",
        );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}\n{exposition}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_known_mix_is_counted_exactly() {
    let up = Upstream::spawn().await;
    let closed = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    // Two targets refusing: each failure marks its target down (an
    // upstream of one target is never marked down, as in nginx).
    let (dead, dead2) = (closed(), closed());
    let proxy = TestProxy::spawn(&format!(
        "listeners: [{{ name: plain, bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0' }}
log: {{ access_log: false }}
bypass: {{ tokens: ['{TOKEN}'] }}
zones: [{{ name: slow, rate: 2r/s, burst: 3, delay: 1 }}]
upstreams:
  api: {{ targets: ['{}'], concurrency: {{ min: 2, max: 50 }}, queue: {{ size: 5, timeout: 1s }} }}
  gone: {{ targets: ['{dead}', '{dead2}'], connect_timeout: 1s }}
routes:
  - name: limited
    match: {{ path: /limited }}
    upstream: api
    zones: []
    limits:
      - {{ name: tight, algorithm: fixed_window, key: ip, limit: 2, window: 1h }}
      - {{ name: trial, algorithm: fixed_window, key: ip, limit: 1, window: 1h, dry_run: true }}
  - {{ name: slow, match: {{ path: /slow }}, upstream: api, zones: [slow] }}
  - {{ name: bad, match: {{ path: /bad }}, upstream: gone, zones: [] }}
",
        up.addr
    ))
    .await;
    let addr = proxy.addr();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(from2(addr, "/limited", &[]).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
    let bypassed = from2(addr, "/limited", &[("x-bypass-token", TOKEN)]).await;
    assert_eq!(bypassed.status, 200);
    // Five at once against burst 3, delay 1: two pass, two wait (0.5 and
    // 1 s), one is refused. At 2r/s the five may arrive up to 0.5 s apart.
    let slow: Vec<_> = (0..5)
        .map(|_| tokio::spawn(async move { from2(addr, "/slow", &[]).await.status.as_u16() }))
        .collect();
    let mut slow_statuses = Vec::new();
    for s in slow {
        slow_statuses.push(s.await.unwrap());
    }
    slow_statuses.sort_unstable();
    assert_eq!(slow_statuses, [200, 200, 200, 200, 429]);
    assert_eq!(from2(addr, "/bad", &[]).await.status, 502);

    // A request is counted when its response ends: wait for the last one.
    let m = scrape_until(&proxy, |m| {
        value(
            m,
            r#"tollgate_requests_total{listener="plain",route="bad",code="502"}"#,
        ) == Some(1.0)
    })
    .await;
    let expect = [
        (
            r#"tollgate_requests_total{listener="plain",route="limited",code="200"}"#,
            3.0,
        ),
        (
            r#"tollgate_requests_total{listener="plain",route="limited",code="429"}"#,
            2.0,
        ),
        (
            r#"tollgate_requests_total{listener="plain",route="slow",code="200"}"#,
            4.0,
        ),
        (
            r#"tollgate_requests_total{listener="plain",route="slow",code="429"}"#,
            1.0,
        ),
        (
            r#"tollgate_requests_total{listener="plain",route="bad",code="502"}"#,
            1.0,
        ),
        (
            r#"tollgate_request_duration_seconds_count{route="limited"}"#,
            5.0,
        ),
        (
            r#"tollgate_limit_decisions_total{tier="route",route="limited",limit="tight",outcome="allowed",user_type="anonymous"}"#,
            2.0,
        ),
        (
            r#"tollgate_limit_decisions_total{tier="route",route="limited",limit="tight",outcome="rejected",user_type="anonymous"}"#,
            2.0,
        ),
        (
            r#"tollgate_limit_decisions_total{tier="route",route="limited",limit="trial",outcome="allowed",user_type="anonymous"}"#,
            1.0,
        ),
        (
            r#"tollgate_limit_decisions_total{tier="route",route="limited",limit="trial",outcome="dry_run_rejected",user_type="anonymous"}"#,
            1.0,
        ),
        (
            r#"tollgate_limit_decisions_total{tier="zone",route="-",limit="slow",outcome="allowed",user_type="anonymous"}"#,
            2.0,
        ),
        (
            r#"tollgate_limit_decisions_total{tier="zone",route="-",limit="slow",outcome="delayed",user_type="anonymous"}"#,
            2.0,
        ),
        (
            r#"tollgate_limit_decisions_total{tier="zone",route="-",limit="slow",outcome="rejected",user_type="anonymous"}"#,
            1.0,
        ),
        (r#"tollgate_limit_delay_seconds_count"#, 2.0),
        (r#"tollgate_bypass_total{reason="token"}"#, 1.0),
        (r#"tollgate_bypass_total{reason="path"}"#, 0.0),
        // One store call per request with limits: 4 + 5 (the bypassed one
        // and the 502 have none).
        (
            r#"tollgate_store_calls_total{store="memory",result="ok"}"#,
            9.0,
        ),
        (
            r#"tollgate_zone_keys{tier="route",route="limited",limit="tight"}"#,
            1.0,
        ),
        (r#"tollgate_build_info{version="0.1.0"}"#, 1.0),
        (
            &format!(
                r#"tollgate_upstream_requests_total{{upstream="api",target="{}",result="ok"}}"#,
                up.addr
            ),
            7.0,
        ),
        (
            &format!(r#"tollgate_upstream_cooldowns_total{{upstream="gone",target="{dead}"}}"#),
            1.0,
        ),
        (
            r#"tollgate_upstream_duration_seconds_count{upstream="api"}"#,
            7.0,
        ),
        // Its gate: seven admitted, none waiting or shed.
        (
            r#"tollgate_upstream_admitted_in_flight{upstream="api"}"#,
            0.0,
        ),
        (r#"tollgate_upstream_queue_length{upstream="api"}"#, 0.0),
        (
            r#"tollgate_upstream_shed_total{upstream="api",class="default",reason="queue_full"}"#,
            0.0,
        ),
    ];
    assert!(
        value(&m, r#"tollgate_upstream_concurrency_limit{upstream="api"}"#)
            .is_some_and(|l| l >= 2.0),
        "{m}"
    );
    for (series, want) in expect {
        assert_eq!(value(&m, series), Some(want), "{series}\n{m}");
    }
    assert!(
        value(&m, r#"tollgate_connections_open{listener="plain"}"#).is_some(),
        "{m}"
    );
    assert!(
        !m.contains("127.0.0.2"),
        "the client's IP in the metrics:\n{m}"
    );
    assert!(!m.contains(TOKEN), "a token in the metrics");
    promtool_check(&m);

    // The top offenders: the client as an operator writes it, with its
    // rejections (the dry-run one counts too: who would be refused).
    let admin = proxy.admin.unwrap();
    let top = get(admin, "/api/top?limit=tight&n=5").await;
    assert_eq!(top.status, 200);
    let t = &top.json()["limits"][0];
    assert_eq!(t["route"], "limited");
    assert_eq!(t["top"][0]["key"], "127.0.0.2");
    assert_eq!(t["top"][0]["rejections"], 2);
    let trial = get(admin, "/api/top?limit=trial").await.json();
    assert_eq!(trial["limits"][0]["top"][0]["rejections"], 1);
    let nope = get(admin, "/api/top?limit=nope").await;
    assert_eq!(nope.status, 404);
    assert_eq!(nope.json()["status"], 404);

    // OpenMetrics when the scraper asks for it.
    let om = scrape(&proxy, Some("application/openmetrics-text; version=1.0.0")).await;
    assert!(om.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    assert!(text(&om).ends_with("# EOF\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_and_breaker_metrics_follow_a_redis_outage() {
    let mut redis = crate::common::redis::RedisServer::start();
    let proxy = TestProxy::spawn(&format!(
        "listeners: [{{ name: plain, bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0' }}
log: {{ access_log: false }}
store: {{ kind: redis, url: '{}', timeout: 100ms, on_error: local, cache_rejections: false, breaker: {{ failures: 3, probe_interval: 100ms }} }}
routes:
  - match: {{ path_prefix: / }}
    respond: {{ body: ok }}
    limits: [{{ name: all, algorithm: fixed_window, key: global, limit: 100000, window: 1h }}]
",
        redis.url()
    ))
    .await;
    let calls = |m: &str, result: &str| {
        value(
            m,
            &format!(r#"tollgate_store_calls_total{{store="redis",result="{result}"}}"#),
        )
        .unwrap_or(0.0)
    };
    for _ in 0..5 {
        assert_eq!(get(proxy.addr(), "/").await.status, 200);
    }
    let m = text(&scrape(&proxy, None).await);
    assert_eq!(calls(&m, "ok"), 5.0, "{m}");
    assert_eq!(value(&m, "tollgate_store_breaker_open"), Some(0.0));
    assert_eq!(
        value(&m, r#"tollgate_store_fallback_total{mode="local"}"#),
        Some(0.0)
    );

    redis.kill();
    for _ in 0..10 {
        assert_eq!(get(proxy.addr(), "/").await.status, 200, "decided locally");
    }
    let m = text(&scrape(&proxy, None).await);
    assert_eq!(
        value(&m, r#"tollgate_store_fallback_total{mode="local"}"#),
        Some(10.0),
        "{m}"
    );
    assert_eq!(calls(&m, "error") + calls(&m, "timeout"), 10.0, "{m}");
    assert_eq!(value(&m, "tollgate_store_breaker_open"), Some(1.0), "{m}");
    promtool_check(&m);

    redis.restart();
    // Requests keep coming; the breaker's probe finds Redis back.
    let m = until_some(Duration::from_secs(10), "the breaker closes", || async {
        assert_eq!(get(proxy.addr(), "/").await.status, 200);
        let m = text(&scrape(&proxy, None).await);
        (value(&m, "tollgate_store_breaker_open") == Some(0.0) && calls(&m, "ok") > 5.0)
            .then_some(m)
    })
    .await;
    assert_eq!(value(&m, "tollgate_store_breaker_open"), Some(0.0), "{m}");
    assert!(calls(&m, "ok") > 5.0, "{m}");
}

fn alerting(hook: std::net::SocketAddr) -> String {
    format!(
        "listeners: [{{ name: plain, bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0' }}
log: {{ access_log: false }}
alerts:
  cooldown: 1h
  webhook: {{ url: 'http://{hook}/hooks/tollgate', timeout: 1s, secret: 'alert-secret-0123456789' }}
  rules:
    - {{ name: login_bruteforce, limit: login, rejections: 5, per: 1m }}
    - {{ name: login_pressure, limit: login, reject_ratio: 0.5, min_requests: 10, per: 1m }}
routes:
  - match: {{ path: /login }}
    respond: {{ body: ok }}
    limits: [{{ name: login, algorithm: fixed_window, key: ip, limit: 2, window: 1h }}]
"
    )
}

#[tokio::test]
async fn a_login_flood_fires_each_rule_once_with_a_signed_post() {
    let (hook, mut posts) = receiver(true).await;
    let proxy = TestProxy::spawn(&alerting(hook)).await;
    for _ in 0..30 {
        get(proxy.addr(), "/login").await;
    }
    let mut got = Vec::new();
    while got.len() < 2 {
        let post = tokio::time::timeout(Duration::from_secs(10), posts.recv())
            .await
            .expect("both alerts posted")
            .unwrap();
        got.push(post);
    }
    // The flood went on for 23 more rejections: still one alert per rule,
    // fired and posted.
    assert_eq!(
        proxy.pipeline.latest_alerts().len(),
        2,
        "an alert fired twice"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), posts.recv())
            .await
            .is_err(),
        "an alert was posted twice"
    );
    let mut alerts = Vec::new();
    for (sig, body) in &got {
        let expected = tollgate::pipeline::sign(b"alert-secret-0123456789", &[body.as_bytes()]);
        assert_eq!(sig, &format!("sha256={expected}"), "signed with the secret");
        alerts.push(serde_json::from_str::<serde_json::Value>(body).unwrap());
    }
    alerts.sort_by_key(|a| a["alert"].as_str().unwrap().to_owned());
    assert_eq!(alerts[0]["alert"], "login_bruteforce");
    assert_eq!(alerts[0]["limit"], "login");
    assert_eq!(alerts[0]["key"], "127.0.0.1");
    assert_eq!(alerts[0]["count"], 5);
    assert_eq!(alerts[0]["window_seconds"], 60);
    assert_eq!(alerts[1]["alert"], "login_pressure");
    assert_eq!(alerts[1]["key"], "-");
    let m = text(&scrape(&proxy, None).await);
    assert_eq!(
        value(&m, r#"tollgate_alerts_total{rule="login_bruteforce"}"#),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        value(&m, r#"tollgate_alerts_total{rule="login_pressure"}"#),
        Some(1.0)
    );
    assert_eq!(
        value(&m, r#"tollgate_alert_deliveries_total{result="ok"}"#),
        Some(2.0)
    );
    promtool_check(&m);
}

#[tokio::test]
async fn a_dead_alert_receiver_holds_up_no_request() {
    let (hook, _posts) = receiver(false).await;
    let proxy = TestProxy::spawn(&alerting(hook)).await;
    let mut statuses = Vec::new();
    for _ in 0..30 {
        statuses.push(get(proxy.addr(), "/login").await.status.as_u16());
    }
    assert_eq!(
        statuses.iter().filter(|&&s| s == 429).count(),
        28,
        "every request answered"
    );
    // Each delivery gives up after the webhook timeout (1 s), counted.
    let m = scrape_until(&proxy, |m| {
        value(m, r#"tollgate_alert_deliveries_total{result="failed"}"#) == Some(2.0)
    })
    .await;
    assert_eq!(
        value(&m, r#"tollgate_alert_deliveries_total{result="failed"}"#),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        value(&m, r#"tollgate_alerts_total{rule="login_bruteforce"}"#),
        Some(1.0)
    );
}

#[tokio::test]
async fn failed_tls_handshakes_and_waits_at_the_connection_cap_are_counted() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ca = TestCa::new();
    let (cert, key) = ca.leaf("api", &["api.example.com"]);
    let proxy = TestProxy::spawn(&format!(
        "listeners: [{{ name: public, bind: '127.0.0.1:0', tls: {{ handshake_timeout: 1s, certs: [{{ cert: '{cert}', key: '{key}' }}] }} }}]
admin: {{ bind: '127.0.0.1:0' }}
log: {{ access_log: false }}
server: {{ max_connections: 1, header_read_timeout: 1s }}
routes: [{{ match: {{ path_prefix: / }}, respond: {{ body: ok }} }}]
"
    ))
    .await;
    // Not TLS at all: the handshake fails.
    let mut s = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read(&mut [0u8; 64])).await;
    drop(s);
    // One slot: a second connection waits for the first to be closed (its
    // TLS handshake never comes, so it is dropped after 1 s).
    let stats = proxy.pipeline.metrics().listener_stats(0);
    until(
        Duration::from_secs(10),
        "the refused connection closed",
        || std::future::ready(stats.open() == 0),
    )
    .await;
    let hog = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    until(
        Duration::from_secs(10),
        "the hog holds the one slot",
        || std::future::ready(stats.open() == 1),
    )
    .await;
    let mut waiter = tls_connect(
        proxy.addr(),
        ca.client_config(&[b"http/1.1"]),
        "api.example.com",
    )
    .await;
    waiter
        .write_all(b"GET / HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), waiter.read_to_string(&mut answer)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(hog);
    let m = text(&scrape(&proxy, None).await);
    assert!(
        value(
            &m,
            r#"tollgate_tls_handshake_failures_total{listener="public"}"#
        )
        .unwrap()
            >= 1.0,
        "{m}"
    );
    assert!(
        value(
            &m,
            r#"tollgate_connections_at_cap_total{listener="public"}"#
        )
        .unwrap()
            >= 1.0,
        "{m}"
    );
}

#[tokio::test]
async fn tls_handshakes_are_counted_full_or_resumed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ca = TestCa::new();
    let (cert, key) = ca.leaf("api", &["api.example.com"]);
    let proxy = TestProxy::spawn(&format!(
        "listeners:
  - {{ name: public, bind: '127.0.0.1:0', tls: {{ certs: [{{ cert: '{cert}', key: '{key}' }}] }} }}
  - {{ name: inner, bind: '127.0.0.1:0' }}
admin: {{ bind: '127.0.0.1:0' }}
log: {{ access_log: false }}
routes: [{{ match: {{ path_prefix: / }}, respond: {{ body: ok }} }}]
"
    ))
    .await;
    // One client twice: the second handshake resumes from the ticket the
    // first answer brought.
    let client = ca.client_config(&[b"http/1.1"]);
    for _ in 0..2 {
        let mut s = tls_connect(proxy.addr(), client.clone(), "api.example.com").await;
        s.write_all(b"GET / HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut answer)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let m = text(&scrape(&proxy, None).await);
    for kind in ["full", "resumed"] {
        assert_eq!(
            value(
                &m,
                &format!(r#"tollgate_tls_handshakes_total{{listener="public",kind="{kind}"}}"#)
            ),
            Some(1.0),
            "{m}"
        );
    }

    // The dashboard's listeners table reads the same counters, and the
    // connections open now: one kept-alive client on the plain listener.
    let mut kept = h1(proxy.addr_of("inner")).await;
    let got = send1(&mut kept, request("GET", "/", empty())).await;
    assert_eq!(got.status, http::StatusCode::OK);
    let overview = get(proxy.admin.unwrap(), "/api/overview").await.json();
    let listeners = overview["listeners"].as_array().expect("listeners");
    let names: Vec<&str> = listeners
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["public", "inner"], "{overview}");
    let (public, inner) = (&listeners[0], &listeners[1]);
    assert_eq!(public["tls"], true);
    assert_eq!(
        public["tls_handshakes"],
        serde_json::json!({ "full": 1, "resumed": 1, "failed": 0 })
    );
    // (as configured)
    assert_eq!(public["bind"], "127.0.0.1:0");
    assert_eq!(inner["tls"], false);
    assert_eq!(inner["tls_handshakes"], serde_json::Value::Null);
    assert_eq!(inner["open"], 1, "{inner}");
    assert_eq!(inner["handovers"]["chunked"], 0, "{inner}");
    drop(kept);
}

#[tokio::test]
async fn the_admin_api_needs_a_token_when_one_is_set() {
    let t1 = "admin-token-one-0123456789";
    let t2 = "admin-token-two-0123456789";
    let yaml = |protect: bool| {
        format!(
            "listeners: [{{ name: plain, bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0', token: ['{t1}', '{t2}'], protect_metrics: {protect} }}
log: {{ access_log: false }}
routes:
  - match: {{ path_prefix: / }}
    respond: {{ body: ok }}
    limits: [{{ name: login, algorithm: fixed_window, key: ip, limit: 1, window: 1h }}]
"
        )
    };
    let proxy = TestProxy::spawn(&yaml(false)).await;
    let admin = proxy.admin.unwrap();
    let ask = |token: Option<&'static str>| async move {
        let mut c = h1(admin).await;
        let mut req = http::Request::get("/api/top?limit=login").header("host", "admin");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        send1(&mut c, req.body(empty()).unwrap()).await
    };
    let none = ask(None).await;
    assert_eq!(none.status, 401);
    assert_eq!(none.json()["status"], 401);
    assert!(none.headers["www-authenticate"]
        .to_str()
        .unwrap()
        .starts_with("Bearer"));
    assert_eq!(
        ask(Some("admin-token-one-012345678X")).await.status,
        401,
        "a near miss"
    );
    assert_eq!(
        ask(Some("admin-token-two-0123456789")).await.status,
        200,
        "either token"
    );
    assert_eq!(
        get(admin, "/healthz").await.status,
        200,
        "health stays open"
    );
    let m = scrape(&proxy, None).await;
    assert_eq!(m.status, 200, "metrics stay open unless protect_metrics");
    assert_eq!(
        value(&text(&m), "tollgate_admin_unauthorized_total"),
        Some(2.0)
    );
    assert!(!text(&m).contains(t1) && !text(&m).contains(t2));

    let proxy = TestProxy::spawn(&yaml(true)).await;
    assert_eq!(scrape(&proxy, None).await.status, 401);
    let mut c = h1(proxy.admin.unwrap()).await;
    let req = http::Request::get("/metrics")
        .header("host", "admin")
        .header("authorization", format!("Bearer {t1}"))
        .body(empty())
        .unwrap();
    assert_eq!(send1(&mut c, req).await.status, 200);
}

/// A client that breaks the HTTP rules is counted per listener and kind,
/// in the exposition, the admin API and the dashboard's listeners table.
#[tokio::test]
async fn protocol_errors_are_counted_by_listener_and_kind() {
    let proxy = TestProxy::spawn(
        "listeners: [{ name: plain, bind: '127.0.0.1:0' }]
admin: { bind: '127.0.0.1:0' }
log: { access_log: false }
routes: [{ match: { path_prefix: / }, respond: { body: ok } }]
",
    )
    .await;
    for ask in [
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"
            .to_owned(),
        format!(
            "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
            "a".repeat(70 << 10)
        ),
    ] {
        let answer = raw(proxy.addr(), ask.as_bytes(), Duration::from_secs(5)).await;
        assert!(answer.contains("application/problem+json"), "{answer}");
    }
    let m = scrape_until(&proxy, |m| {
        m.contains(
            r#"tollgate_http_protocol_errors_total{listener="plain",kind="transfer_coding"} 1"#,
        )
    })
    .await;
    assert_eq!(
        value(
            &m,
            r#"tollgate_http_protocol_errors_total{listener="plain",kind="head_too_large"}"#
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        value(
            &m,
            r#"tollgate_http_protocol_errors_total{listener="plain",kind="http2"}"#
        ),
        Some(0.0),
        "{m}"
    );
    let overview = get(proxy.admin.unwrap(), "/api/overview").await.json();
    let errors = &overview["listeners"][0]["protocol_errors"];
    assert_eq!(errors["transfer_coding"], 1, "{overview}");
    assert_eq!(errors["head_too_large"], 1, "{overview}");
}
