//! The two tiers through real sockets: per-IP zones with nginx semantics,
//! named route limits with standard headers, outcome-counting limits, path
//! aliases, bypass tokens, webhook sources and signatures, dry run.

use std::time::Duration;

use hyper::Request;
use tokio::time::Instant;

use crate::common::*;

fn with(up: &Upstream, rest: &str) -> String {
    config(&format!(
        "upstreams:\n  api: {{ targets: ['{}'] }}\n{rest}",
        up.addr
    ))
}

/// A spawned upstream and tollgate in front of it with `rest` as config.
async fn start(rest: &str) -> (Upstream, TestProxy) {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&with(&up, rest)).await;
    (up, proxy)
}

/// [`start`] on a frozen clock the test advances.
async fn start_frozen(rest: &str) -> (Upstream, TestProxy, tollgate::clock::FrozenClock) {
    let up = Upstream::spawn().await;
    let (proxy, clock) = TestProxy::spawn_frozen(&with(&up, rest)).await;
    (up, proxy, clock)
}

async fn get_path(addr: std::net::SocketAddr, path: &str) -> Got {
    send_with(addr, "GET", path, &[], b"").await
}

#[tokio::test]
async fn the_nestjs_login_scenario() {
    let (up, proxy) = start(
        "routes:
  - match: { path: /auth/login, methods: [POST] }
    upstream: api
    limits: [{ name: login, algorithm: sliding_log, key: ip, limit: 5, window: 1m }]
",
    )
    .await;
    for i in 0..5 {
        let got = send_with(proxy.addr(), "POST", "/auth/login", &[], b"user=a&pass=b").await;
        assert_eq!(got.status, 200, "attempt {i}");
        assert_eq!(got.headers["x-ratelimit-limit"], "5");
        assert_eq!(
            got.headers["x-ratelimit-remaining"],
            (4 - i).to_string().as_str()
        );
    }
    let got = send_with(proxy.addr(), "POST", "/auth/login", &[], b"user=a&pass=b").await;
    assert_eq!(got.status, 429);
    assert_eq!(got.headers["content-type"], "application/problem+json");
    let retry: u64 = got.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    let p = got.json();
    assert_eq!(p["status"], 429);
    assert_eq!(p["limit"], "login");
    assert_eq!(p["retry_after"], retry);
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("rate limit 'login' exceeded: 5 requests per 1m; retry in"),
        "{detail}"
    );
    assert!(got.headers["ratelimit"]
        .to_str()
        .unwrap()
        .contains(&format!("\"login\";r=0;t={retry}")));
    assert_eq!(up.hits(), 5, "the upstream saw exactly five");
}

#[tokio::test]
async fn a_zone_admits_part_of_a_burst_at_once_delays_part_and_rejects_the_rest() {
    let (up, proxy) = start(
        "zones: [{ name: per_ip, rate: 10r/s, burst: 5, delay: 2 }]
routes: [{ match: { path_prefix: / }, upstream: api }]
",
    )
    .await;
    let addr = proxy.addr();
    let started = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(async move { (get_path(addr, "/burst").await.status, Instant::now()) })
        })
        .collect();
    let mut admitted = Vec::new();
    let mut rejected = 0;
    for t in tasks {
        let (status, at) = t.await.unwrap();
        match status.as_u16() {
            200 => admitted.push((at - started).as_millis() as u64),
            429 => rejected += 1,
            other => panic!("unexpected {other}"),
        }
    }
    admitted.sort_unstable();
    assert_eq!(
        (admitted.len(), rejected),
        (6, 2),
        "admitted at {admitted:?} ms"
    );
    // nginx: delay=2 lets 3 through at once; the excess beyond that waits
    // (excess - 2) / rate: 100, 200 and 300 ms. Waits are never shorter.
    for (i, ms) in admitted[3..].iter().enumerate() {
        let expected = 100 * (i as u64 + 1);
        assert!(
            *ms + 10 >= expected,
            "delayed request {i} came after {ms} ms, before ~{expected}: {admitted:?}"
        );
        assert!(
            *ms < expected + 2000,
            "delayed request {i} took {ms} ms: {admitted:?}"
        );
    }
    assert!(admitted[2] < admitted[5], "{admitted:?}");
    assert_eq!(up.hits(), 6);
}

#[tokio::test]
async fn zones_count_the_requests_of_unmatched_routes_and_max_conn_caps_concurrency() {
    // Frozen: the zone cannot refill between the requests.
    let (up, proxy, _clock) = start_frozen(
        "zones:
  - { name: per_ip, rate: 1r/s, burst: 1, nodelay: true, status: 503 }
  - { name: conns, rate: 1000r/s, burst: 1000, nodelay: true, max_conn: 1 }
routes:
  - { match: { path_prefix: /slow }, upstream: api, zones: [conns] }
  - { match: { path: /only-per-ip }, upstream: api, zones: [per_ip] }
",
    )
    .await;
    // Unmatched paths meet every zone: the 3rd 404 in a second is the zone's 503.
    assert_eq!(get_path(proxy.addr(), "/nope").await.status, 404);
    assert_eq!(get_path(proxy.addr(), "/nope").await.status, 404);
    let got = get_path(proxy.addr(), "/nope").await;
    assert_eq!(got.status, 503, "nginx-parity status");
    assert_eq!(got.json()["limit"], "per_ip");
    // A route that lists only `conns` is not subject to per_ip.
    let addr = proxy.addr();
    let slow = tokio::spawn(async move { get_path(addr, "/slow?ms=800").await.status });
    until(
        Duration::from_secs(10),
        "the slow request reaches the upstream",
        || std::future::ready(up.hits() == 1),
    )
    .await;
    let got = get_path(proxy.addr(), "/slow?ms=1").await;
    assert_eq!(got.status, 429, "one concurrent request per IP");
    assert!(got.json()["detail"]
        .as_str()
        .unwrap()
        .contains("concurrency limit 'conns'"));
    assert_eq!(slow.await.unwrap(), 200);
    assert_eq!(
        get_path(proxy.addr(), "/slow?ms=1").await.status,
        200,
        "the slot was released"
    );
}

#[tokio::test]
async fn named_limits_short_rejects_a_burst_medium_a_sustained_rate() {
    let (up, proxy, clock) = start_frozen(
        "routes:
  - match: { path_prefix: / }
    upstream: api
    limits:
      - { name: short, algorithm: token_bucket, rate: 3/s, burst: 3 }
      - { name: medium, algorithm: fixed_window, limit: 5, window: 1h }
",
    )
    .await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(get_path(proxy.addr(), "/x").await);
    }
    assert_eq!(
        statuses
            .iter()
            .map(|g| g.status.as_u16())
            .collect::<Vec<_>>(),
        vec![200, 200, 200, 429]
    );
    assert_eq!(statuses[3].json()["limit"], "short");
    let policy = statuses[0].headers["ratelimit-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(policy, "\"short\";q=3;w=1, \"medium\";q=5;w=3600");
    let state = statuses[0].headers["ratelimit"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        state.starts_with("\"short\";r=2;t=1, \"medium\";r=4;t="),
        "{state}"
    );
    // The rejected 4th request cost `medium` nothing: 2 more pass after a refill.
    clock.advance(Duration::from_millis(1100));
    assert_eq!(get_path(proxy.addr(), "/x").await.status, 200);
    let got = get_path(proxy.addr(), "/x").await;
    assert_eq!(got.status, 200);
    assert_eq!(
        got.headers["x-ratelimit-remaining"], "0",
        "medium is the most restrictive now"
    );
    assert!(
        got.headers.get("x-ratelimit-warning").is_some(),
        "past 90% of medium"
    );
    clock.advance(Duration::from_millis(1100));
    let got = get_path(proxy.addr(), "/x").await;
    assert_eq!(got.status, 429);
    assert_eq!(
        got.json()["limit"],
        "medium",
        "a sustained rate hits the medium limit"
    );
    assert_eq!(up.hits(), 5);
}

/// `GET path` once over HTTP/1.1 (tollgate's server) and once over
/// HTTP/2 (hyper's, on `c2`), each answer with its protocol's name.
async fn on_both_protocols(
    addr: std::net::SocketAddr,
    c2: &mut hyper::client::conn::http2::SendRequest<ClientBody>,
    path: &str,
) -> [(&'static str, Got); 2] {
    let h1 = send_with(addr, "GET", path, &[], b"").await;
    c2.ready().await.unwrap();
    let req = Request::get(format!("http://{addr}{path}"))
        .body(empty())
        .unwrap();
    let h2 = collect(c2.send_request(req).await.unwrap()).await;
    [("HTTP/1.1", h1), ("HTTP/2", h2)]
}

/// Every value of the field `name` in `got`'s head, in order.
fn all_values(got: &Got, name: &str) -> Vec<String> {
    got.headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

/// tollgate's rate-limit fields replace the upstream's own fields of the
/// same names (one value each, tollgate's), on HTTP/1.1 (written by
/// tollgate's server) and HTTP/2 (by hyper's); the upstream's warning
/// stays beside tollgate's.
#[tokio::test]
async fn the_route_limits_fields_replace_the_upstreams_own_on_both_protocols() {
    let (_up, proxy) = start(
        "routes:
  - match: { path_prefix: / }
    upstream: api
    warn_at: 0.0
    limits: [{ name: short, algorithm: token_bucket, rate: 100/s, burst: 100, key: ip }]
",
    )
    .await;
    let mut c2 = h2(proxy.addr()).await;
    for (protocol, got) in on_both_protocols(proxy.addr(), &mut c2, "/own-rate-limit-fields").await
    {
        assert_eq!(got.status, 200, "{protocol}");
        assert_eq!(got.body, "limited upstream", "{protocol}");
        let all = |name: &str| all_values(&got, name);
        assert_eq!(all("x-ratelimit-limit"), ["100"], "{protocol}");
        assert_eq!(all("x-ratelimit-remaining").len(), 1, "{protocol}");
        let ietf = all("ratelimit");
        assert_eq!(ietf.len(), 1, "{protocol}: {ietf:?}");
        assert!(ietf[0].starts_with("\"short\";r="), "{protocol}: {ietf:?}");
        let warnings = all("x-ratelimit-warning");
        assert_eq!(warnings.len(), 2, "{protocol}: {warnings:?}");
        assert!(
            warnings.contains(&"upstream: 6 of 7 used".to_owned()),
            "{protocol}"
        );
        assert!(
            warnings.iter().any(|w| w.starts_with("\"short\": ")),
            "{protocol}"
        );
    }
}

/// A rejection's fields (written by tollgate as encoded lines, not a
/// header map) arrive once each on HTTP/1.1 (tollgate's server) and
/// HTTP/2 (hyper's), beside the route's rate-limit fields; so do an
/// error's (a 404 for a path no route matches).
#[tokio::test]
async fn a_rejection_carries_each_of_its_fields_once_on_both_protocols() {
    let (up, proxy) = start(
        "routes:
  - match: { path_prefix: /api }
    upstream: api
    limits: [{ name: once, algorithm: fixed_window, limit: 1, window: 1h, key: ip }]
",
    )
    .await;
    assert_eq!(get_path(proxy.addr(), "/api/a").await.status, 200);
    let mut c2 = h2(proxy.addr()).await;
    for path in ["/api/a", "/nowhere"] {
        for (protocol, got) in on_both_protocols(proxy.addr(), &mut c2, path).await {
            let all = |name: &str| all_values(&got, name);
            assert_eq!(
                all("content-type"),
                ["application/problem+json"],
                "{protocol} {path}"
            );
            if path == "/nowhere" {
                assert_eq!(got.status, 404, "{protocol}");
                assert!(all("retry-after").is_empty(), "{protocol}");
                continue;
            }
            assert_eq!(got.status, 429, "{protocol}");
            let retry = all("retry-after");
            assert_eq!(retry.len(), 1, "{protocol}: {retry:?}");
            let secs: u64 = retry[0].parse().unwrap();
            assert!((1..=3600).contains(&secs), "{protocol}: {secs}");
            assert_eq!(all("x-ratelimit-limit"), ["1"], "{protocol}");
            assert_eq!(all("x-ratelimit-remaining"), ["0"], "{protocol}");
            assert_eq!(all("ratelimit").len(), 1, "{protocol}");
            assert_eq!(got.json()["limit"], "once", "{protocol}");
            assert_eq!(got.json()["retry_after"], secs, "{protocol}");
        }
    }
    assert_eq!(up.hits(), 1, "no rejected request went upstream");
}

#[tokio::test]
async fn counting_only_failures_never_limits_successful_logins() {
    let (up, proxy) = start(
        "routes:
  - match: { path: /status }
    upstream: api
    limits: [{ name: failed_logins, algorithm: sliding_log, key: ip, limit: 2, window: 1m, count: { status: [401] } }]
",
    )
    .await;
    for _ in 0..10 {
        assert_eq!(
            get_path(proxy.addr(), "/status?code=200").await.status,
            200,
            "successes are never counted"
        );
    }
    assert_eq!(get_path(proxy.addr(), "/status?code=401").await.status, 401);
    assert_eq!(get_path(proxy.addr(), "/status?code=401").await.status, 401);
    let got = get_path(proxy.addr(), "/status?code=401").await;
    assert_eq!(
        got.status, 429,
        "the guesser is stopped before the upstream"
    );
    assert_eq!(
        get_path(proxy.addr(), "/status?code=200").await.status,
        429,
        "a key over its limit is rejected first"
    );
    assert_eq!(up.hits(), 12);
}

#[tokio::test]
async fn path_aliases_count_against_one_bucket() {
    let (_up, proxy) = start(
        "routes:
  - { match: { path: /auth/login }, upstream: api, limits: [{ name: login, algorithm: fixed_window, key: ip, limit: 3, window: 1h }] }
  - { match: { path_prefix: / }, upstream: api }
",
    )
    .await;
    let mut got = Vec::new();
    for alias in [
        "/auth//login",
        "/auth/./login",
        "/auth/x/../login",
        "/auth/%6Cogin",
        "/auth/login/",
        "/auth/login;x=1",
    ] {
        let g = get_path(proxy.addr(), alias).await;
        if g.status == 200 {
            assert_eq!(
                g.json()["uri"].as_str().unwrap().trim_end_matches('/'),
                "/auth/login",
                "{alias}: forwarded as normalised"
            );
        }
        got.push((alias, g.status.as_u16()));
    }
    assert_eq!(got.iter().filter(|(_, s)| *s == 200).count(), 3, "{got:?}");
    assert_eq!(got.iter().filter(|(_, s)| *s == 429).count(), 3, "{got:?}");
    assert_eq!(
        get_path(proxy.addr(), "/auth/../../etc/passwd")
            .await
            .status,
        400
    );
}

#[tokio::test]
async fn only_the_exact_bypass_token_bypasses() {
    let token = "monitoring-token-0123456789";
    let (up, proxy) = start(
        &format!(
            "bypass: {{ paths: [/health], tokens: ['{token}'] }}
routes:
  - {{ match: {{ path_prefix: / }}, upstream: api, limits: [{{ name: one, algorithm: fixed_window, key: ip, limit: 1, window: 1h }}] }}
"
        ),
    )
    .await;
    for _ in 0..5 {
        assert_eq!(
            send_with(proxy.addr(), "GET", "/x", &[("x-bypass-token", token)], b"")
                .await
                .status,
            200
        );
        assert_eq!(
            get_path(proxy.addr(), "/health").await.status,
            200,
            "bypass paths are never limited"
        );
    }
    let same_length = "monitoring-token-0123456780";
    let prefix = &token[..token.len() - 1];
    let suffix = &token[1..];
    let mut statuses = Vec::new();
    for wrong in [same_length, prefix, suffix, ""] {
        statuses.push(
            send_with(proxy.addr(), "GET", "/x", &[("x-bypass-token", wrong)], b"")
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(
        statuses,
        vec![200, 429, 429, 429],
        "wrong tokens are limited normally"
    );
    assert_eq!(up.hits(), 11);
}

#[tokio::test]
async fn webhook_sources_and_signatures() {
    let secret = "github-webhook-secret-123";
    let (_up, proxy) = start(&format!(
        "routes:
  - match: {{ path: /hooks/local }}
    upstream: api
    allow_sources: ['127.0.0.0/8']
    limits: [{{ name: hook, algorithm: fixed_window, key: ip, limit: 1, window: 1h }}]
  - match: {{ path: /hooks/github }}
    upstream: api
    allow_sources: ['192.30.252.0/22']
    limits: [{{ name: hook, algorithm: fixed_window, key: ip, limit: 1, window: 1h }}]
  - match: {{ path: /hooks/strict }}
    upstream: api
    allow_sources: ['192.30.252.0/22']
    only_allowed_sources: true
  - match: {{ path: /hooks/signed }}
    upstream: api
    verify: {{ scheme: github, secret: '{secret}' }}
"
    ))
    .await;
    for _ in 0..5 {
        assert_eq!(
            send_with(proxy.addr(), "POST", "/hooks/local", &[], b"{}")
                .await
                .status,
            200,
            "allowed sources are unlimited"
        );
    }
    // A spoofed X-Forwarded-For naming GitHub from an untrusted peer gets nothing.
    let spoof = [("x-forwarded-for", "192.30.252.1")];
    assert_eq!(
        send_with(proxy.addr(), "POST", "/hooks/github", &spoof, b"{}")
            .await
            .status,
        200
    );
    assert_eq!(
        send_with(proxy.addr(), "POST", "/hooks/github", &spoof, b"{}")
            .await
            .status,
        429
    );
    let got = send_with(proxy.addr(), "POST", "/hooks/strict", &spoof, b"{}").await;
    assert_eq!(got.status, 403);
    assert_eq!(got.json()["status"], 403);

    let body: &'static [u8] = br#"{"action":"opened","number":1}"#;
    let sig = format!(
        "sha256={}",
        tollgate::pipeline::sign(secret.as_bytes(), &[body])
    );
    let got = send_with(
        proxy.addr(),
        "POST",
        "/hooks/signed",
        &[("x-hub-signature-256", &sig)],
        body,
    )
    .await;
    assert_eq!(got.status, 200);
    assert_eq!(
        got.json()["body"],
        std::str::from_utf8(body).unwrap(),
        "the verified body reaches the upstream intact"
    );
    let tampered: &'static [u8] = br#"{"action":"opened","number":2}"#;
    let got = send_with(
        proxy.addr(),
        "POST",
        "/hooks/signed",
        &[("x-hub-signature-256", &sig)],
        tampered,
    )
    .await;
    assert_eq!(got.status, 401);
    assert_eq!(got.json()["status"], 401);
    assert_eq!(
        send_with(proxy.addr(), "POST", "/hooks/signed", &[], body)
            .await
            .status,
        401,
        "unsigned"
    );
}

#[tokio::test]
async fn dry_run_never_rejects_but_reports() {
    let (up, proxy) = start(
        "routes:
  - match: { path_prefix: / }
    upstream: api
    headers: legacy
    limits: [{ name: trial, algorithm: fixed_window, key: ip, limit: 1, window: 1h, dry_run: true }]
",
    )
    .await;
    for _ in 0..3 {
        let got = get_path(proxy.addr(), "/x").await;
        assert_eq!(got.status, 200);
        assert_eq!(got.headers["x-ratelimit-remaining"], "0");
        assert!(
            got.headers.get("ratelimit").is_none(),
            "headers: legacy only"
        );
    }
    assert_eq!(up.hits(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limits_stay_exact_across_worker_threads() {
    // Four event loops serve the connections; the zone and the route limit
    // are one count however the connections are dealt out.
    let (up, proxy) = start(
        "server: { workers: 4 }
zones:
  - { name: per_ip, rate: 1r/m, burst: 59, nodelay: true }
routes:
  - match: { path_prefix: / }
    upstream: api
    limits: [{ name: hourly, algorithm: fixed_window, limit: 40, window: 1h, key: ip }]
",
    )
    .await;
    let addr = proxy.addr();
    let clients: Vec<_> = (0..16)
        .map(|_| {
            tokio::spawn(async move {
                let mut c = h1(addr).await;
                let mut statuses = Vec::new();
                for _ in 0..8 {
                    statuses.push(send1(&mut c, request("GET", "/", empty())).await.status);
                }
                statuses
            })
        })
        .collect();
    let mut ok = 0;
    let mut limited = 0;
    for c in clients {
        for status in c.await.unwrap() {
            match status.as_u16() {
                200 => ok += 1,
                429 | 503 => limited += 1,
                other => panic!("unexpected status {other}"),
            }
        }
    }
    // 128 requests: the route limit admits 40 of the zone's 60.
    assert_eq!((ok, limited), (40, 88));
    assert_eq!(up.hits(), 40);
}
