//! The admin API an operator answers tickets with, and the dashboard:
//!
//! - a client over its limit is shown with the right remaining and retry
//!   time, reading does not charge it, and `DELETE` lets its next request
//!   through at once: on the memory store, a real `redis-server` and a real
//!   3-node cluster; with two replicas on one Redis, a reset on one is
//!   honoured by the other's rejection cache;
//! - unknown limit or key: 404 problem; no token or a wrong one: 401 and
//!   nothing changes; a secret in clear is refused;
//! - the dashboard in headless Chromium, under a bounded load with one
//!   planted offender: the offender is in its top-offenders table, the
//!   rejected count is above zero, the page throws nothing.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use crate::common::browser::Browser;
use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::*;
use http::StatusCode;
use serde_json::Value;

const TOKEN: &str = "operator-token-0123456789";

/// Admin with a token; a login limit of 3 a minute per IP (no zone, so a
/// refusal from a rejection cache costs Redis nothing); a loose zone and
/// an API limit of 2 a minute per API key.
fn admin_config(store: &str) -> String {
    format!(
        "listeners:
  - {{ name: plain, bind: '127.0.0.1:0' }}
admin: {{ bind: '127.0.0.1:0', token: ['{TOKEN}'] }}
log: {{ access_log: false }}
{store}
zones:
  - {{ name: per_ip, rate: 20r/s, burst: 10, nodelay: true, key: ip }}
routes:
  - name: login
    match: {{ path: /auth/login }}
    respond: {{ body: \"ok\\n\" }}
    zones: []
    limits: [{{ name: login, algorithm: sliding_log, key: ip, limit: 3, window: 1m }}]
  - name: api
    match: {{ path_prefix: /api/ }}
    respond: {{ body: \"ok\\n\" }}
    limits: [{{ name: keyed, algorithm: fixed_window, key: 'header:x-api-key', limit: 2, window: 1m }}]
"
    )
}

async fn admin(proxy: &TestProxy, method: &str, path: &str, token: Option<&str>) -> Got {
    let mut c = h1(proxy.admin.expect("admin listener")).await;
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "admin");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    send1(&mut c, req.body(empty()).unwrap()).await
}

async fn login(addr: SocketAddr) -> Got {
    send_with(addr, "POST", "/auth/login", &[], b"").await
}

/// The one state a key read returns (one limit by that name).
fn state(got: &Got) -> Value {
    assert_eq!(got.status, StatusCode::OK, "{:?}", got.body);
    let states = got.json()["states"].as_array().cloned().unwrap_or_default();
    assert_eq!(states.len(), 1, "{states:?}");
    states[0].clone()
}

fn assert_problem(got: &Got, status: StatusCode) {
    assert_eq!(got.status, status, "{:?}", got.body);
    assert_eq!(
        got.headers["content-type"], "application/problem+json",
        "{status}"
    );
    let body = got.json();
    assert_eq!(body["status"], status.as_u16());
    assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()));
}

/// The whole support-ticket story on one proxy, whatever its store.
async fn read_and_reset(proxy: &TestProxy) {
    let addr = proxy.addr();
    let key = "/api/keys/login/127.0.0.1";

    // Two of three used: the read shows it, twice, and charges nothing.
    for _ in 0..2 {
        assert_eq!(login(addr).await.status, StatusCode::OK);
    }
    for _ in 0..3 {
        let s = state(&admin(proxy, "GET", key, Some(TOKEN)).await);
        assert_eq!(
            (s["used"].as_u64(), s["remaining"].as_u64()),
            (Some(2), Some(1)),
            "{s}"
        );
        assert_eq!(s["next_request"], "allow");
        assert_eq!(s["blocked"], false);
        assert_eq!(
            (s["route"].as_str(), s["key"].as_str()),
            (Some("login"), Some("127.0.0.1"))
        );
    }
    assert_eq!(
        login(addr).await.status,
        StatusCode::OK,
        "reads charged nothing"
    );
    let refused = login(addr).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();

    // Over the limit: blocked, nothing remaining, the 429's retry time.
    let s = state(&admin(proxy, "GET", key, Some(TOKEN)).await);
    assert_eq!(
        (s["used"].as_u64(), s["remaining"].as_u64()),
        (Some(3), Some(0)),
        "{s}"
    );
    assert_eq!(s["blocked"], true);
    assert_eq!(s["next_request"], "reject");
    let retry_ms = s["retry_after_ms"].as_u64().unwrap();
    assert!(retry_ms > 0 && retry_ms <= 60_000, "{s}");
    assert!(
        retry_ms.div_ceil(1000).abs_diff(retry_after) <= 1,
        "API says {retry_ms} ms, the 429 said Retry-After: {retry_after}"
    );
    let reset_ms = s["reset_ms"].as_u64().unwrap();
    assert!(reset_ms >= retry_ms && reset_ms <= 60_000, "{s}");

    // No token, a wrong one: 401, and the client stays blocked.
    for token in [None, Some("wrong-token-0123456789")] {
        assert_problem(
            &admin(proxy, "GET", key, token).await,
            StatusCode::UNAUTHORIZED,
        );
        let denied = admin(proxy, "DELETE", key, token).await;
        assert_problem(&denied, StatusCode::UNAUTHORIZED);
        assert!(denied.headers.contains_key("www-authenticate"));
    }
    assert_eq!(login(addr).await.status, StatusCode::TOO_MANY_REQUESTS);

    // Unknown limit, unknown key, a key of the wrong kind.
    assert_problem(
        &admin(proxy, "GET", "/api/keys/nope/127.0.0.1", Some(TOKEN)).await,
        StatusCode::NOT_FOUND,
    );
    assert_problem(
        &admin(proxy, "GET", "/api/keys/login/192.0.2.9", Some(TOKEN)).await,
        StatusCode::NOT_FOUND,
    );
    assert_problem(
        &admin(proxy, "DELETE", "/api/keys/login/192.0.2.9", Some(TOKEN)).await,
        StatusCode::NOT_FOUND,
    );
    assert_problem(
        &admin(proxy, "GET", "/api/keys/login/user:42", Some(TOKEN)).await,
        StatusCode::BAD_REQUEST,
    );

    // The reset: the next request goes through at once.
    let reset = admin(proxy, "DELETE", key, Some(TOKEN)).await;
    assert_eq!(reset.status, StatusCode::OK, "{:?}", reset.body);
    assert_eq!(reset.json()["reset"][0]["limit"], "login");
    assert_eq!(login(addr).await.status, StatusCode::OK);
    let s = state(&admin(proxy, "GET", key, Some(TOKEN)).await);
    assert_eq!(s["used"], 1, "{s}");

    // API keys: found through /api/top as a hash, never in clear.
    let secret = "sk_live_do_not_log_me";
    let with_key = |addr| async move {
        send_with(addr, "GET", "/api/items", &[("x-api-key", secret)], b"")
            .await
            .status
    };
    assert_eq!(with_key(addr).await, StatusCode::OK);
    assert_eq!(with_key(addr).await, StatusCode::OK);
    assert_eq!(with_key(addr).await, StatusCode::TOO_MANY_REQUESTS);
    let top = admin(proxy, "GET", "/api/top?limit=keyed", Some(TOKEN)).await;
    assert_eq!(top.status, StatusCode::OK);
    let hashed = top.json()["limits"][0]["top"][0]["key"]
        .as_str()
        .expect("the API key is a top offender")
        .to_owned();
    assert!(
        hashed.starts_with("header:x-api-key:") && !hashed.contains(secret),
        "{hashed}"
    );
    let path = format!("/api/keys/keyed/{hashed}");
    assert_eq!(
        state(&admin(proxy, "GET", &path, Some(TOKEN)).await)["blocked"],
        true
    );
    assert_problem(
        &admin(
            proxy,
            "GET",
            &format!("/api/keys/keyed/header:x-api-key:{secret}"),
            Some(TOKEN),
        )
        .await,
        StatusCode::BAD_REQUEST,
    );
    assert_eq!(
        admin(proxy, "DELETE", &path, Some(TOKEN)).await.status,
        StatusCode::OK
    );
    assert_eq!(with_key(addr).await, StatusCode::OK);

    // Every limit, its policy, keys and last minute.
    let limits = admin(proxy, "GET", "/api/limits", Some(TOKEN)).await;
    assert_eq!(limits.status, StatusCode::OK);
    let body = limits.json();
    let login_limit = body["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limit"] == "login")
        .cloned()
        .expect("login listed");
    assert_eq!(login_limit["algorithm"], "sliding_log");
    assert_eq!(login_limit["quota"], 3);
    assert_eq!(login_limit["key"], "ip");
    assert_eq!(login_limit["last_minute"]["rejected"], 2, "{login_limit}");
    assert_eq!(login_limit["last_minute"]["allowed"], 4, "{login_limit}");
}

#[tokio::test]
async fn keys_are_read_and_reset_on_the_memory_store() {
    let proxy = TestProxy::spawn(&admin_config("")).await;
    read_and_reset(&proxy).await;
    let limits = admin(&proxy, "GET", "/api/limits", Some(TOKEN))
        .await
        .json();
    assert_eq!(limits["store"], "memory");
    let login = &limits["limits"][1];
    assert_eq!(login["keys_tracked"], 1, "{login}");
}

#[tokio::test]
async fn keys_are_read_and_reset_on_redis() {
    let redis = RedisServer::start();
    let store = redis.store_yaml("");
    let proxy = TestProxy::spawn(&admin_config(&store)).await;
    read_and_reset(&proxy).await;
    assert_eq!(
        admin(&proxy, "GET", "/api/limits", Some(TOKEN))
            .await
            .json()["store"],
        "redis"
    );
    // The reset is a real DEL: Redis holds no login key after one.
    assert_eq!(
        admin(&proxy, "DELETE", "/api/keys/login/127.0.0.1", Some(TOKEN))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(redis.key_count("tollgate:{ip:127.0.0.1}:login"), 0);
}

#[tokio::test]
async fn keys_are_read_and_reset_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let store = format!(
        "store: {{ kind: redis_cluster, nodes: {}, timeout: 2s }}",
        cluster.seeds()
    );
    let proxy = TestProxy::spawn(&admin_config(&store)).await;
    read_and_reset(&proxy).await;
}

/// Two replicas with rejection caches on one Redis: both refuse the client
/// from their caches; a reset on one reaches the other's cache too.
#[tokio::test]
async fn a_reset_on_one_replica_unblocks_the_client_on_every_replica() {
    let redis = RedisServer::start();
    let store = redis.store_yaml(", cache_rejections: true");
    let a = TestProxy::spawn(&admin_config(&store)).await;
    let b = TestProxy::spawn(&admin_config(&store)).await;
    // Both replicas listen for resets before anything is cached.
    until(
        Duration::from_secs(10),
        "the replicas subscribe to resets",
        || {
            let n = redis.cli(&["PUBSUB", "NUMSUB", "tollgate:resets"]);
            std::future::ready(n.lines().nth(1) == Some("2"))
        },
    )
    .await;
    for _ in 0..3 {
        assert_eq!(login(a.addr()).await.status, StatusCode::OK);
    }
    // Each replica learns the rejection, then answers it from its cache.
    for proxy in [&a, &b] {
        assert_eq!(
            login(proxy.addr()).await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    let evals = redis.script_calls();
    assert_eq!(login(b.addr()).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(redis.script_calls(), evals, "b refused from its cache");

    let reset = admin(&a, "DELETE", "/api/keys/login/127.0.0.1", Some(TOKEN)).await;
    assert_eq!(reset.status, StatusCode::OK, "{:?}", reset.body);
    assert_eq!(login(a.addr()).await.status, StatusCode::OK, "at once on a");
    // b hears of it through Redis pub/sub a moment later: poll, bounded.
    until(
        Duration::from_secs(5),
        "b admits after the reset",
        || async {
            let status = login(b.addr()).await.status;
            assert!(
                status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
                "{status}"
            );
            status == StatusCode::OK
        },
    )
    .await;
}

const OFFENDER: &str = "127.0.0.66";

/// Five well-behaved clients at 4 requests a second and one offender as
/// fast as it can, until `stop`; every loop ends by then.
fn bounded_load(addr: SocketAddr, stop: Instant) -> tokio::task::JoinSet<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 10..15 {
        tasks.spawn(async move {
            let from = format!("127.0.0.{i}");
            while Instant::now() < stop {
                let status = get_from(&from, addr, "/api/items", &[]).await.status;
                assert_eq!(status, StatusCode::OK, "a well-behaved client was refused");
                // Paces a load generator (4 requests a second).
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }
    tasks.spawn(async move {
        while Instant::now() < stop {
            get_from(OFFENDER, addr, "/auth/login", &[]).await;
            // Paces a load generator (the offender, ~200 requests a second).
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    tasks
}

#[tokio::test]
async fn the_dashboard_shows_the_offender_in_a_real_browser() {
    let yaml = format!(
        "listeners:
  - {{ name: plain, bind: '127.0.0.1:0' }}
admin: {{ bind: '127.0.0.1:0', token: ['{TOKEN}'] }}
log: {{ access_log: false }}
zones:
  - {{ name: per_ip, rate: 20r/s, burst: 10, nodelay: true, key: ip }}
identity:
  plans: {{ names: [free, pro], header: x-plan, default: free }}
alerts:
  rules: [{{ name: login-flood, limit: login, rejections: 20, per: 1m }}]
routes:
  - name: login
    match: {{ path: /auth/login }}
    respond: {{ body: \"ok\\n\" }}
    limits: [{{ name: login, algorithm: sliding_log, key: ip, limit: 5, window: 1m, penalty: {{ after: 25, ban: [10m] }} }}]
  - name: api
    match: {{ path_prefix: /api/ }}
    respond: {{ body: \"ok\\n\" }}
    limits: [{{ name: items, algorithm: fixed_window, key: ip, limit: 1000, window: 1m, plans: {{ pro: {{ limit: 5000 }} }}, lease: {{ slice: 40, hold: 2s }} }}]
"
    );
    let proxy = TestProxy::spawn(&yaml).await;
    let admin_addr = proxy.admin.unwrap();
    let mut c = h1(admin_addr).await;
    let put = http::Request::put("/api/overrides/items/203.0.113.9")
        .header("host", "admin")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(full(r#"{"limit": 7, "ttl": "1h"}"#))
        .unwrap();
    assert_eq!(send1(&mut c, put).await.status, StatusCode::OK);
    let mut load = bounded_load(proxy.addr(), Instant::now() + Duration::from_secs(30));

    let mut browser = Browser::launch(1280, 1400).await;
    browser.open_dashboard(admin_addr, TOKEN).await;
    // The offender in the login limit's top offenders, rejections counted.
    let offenders = "[...document.querySelectorAll('section.limit[data-limit=\"login\"] table.offenders tr[data-key]')].map(r => r.dataset.key)";
    let found = browser
        .wait_for(
            &format!("(() => {{ const k = {offenders}; return k.includes('{OFFENDER}') ? k : null; }})()"),
            Duration::from_secs(20),
        )
        .await;
    assert_eq!(found, serde_json::json!([OFFENDER]), "only the offender");
    let rejected = browser
        .wait_for(
            "Number(document.getElementById('limited-minute').textContent)",
            Duration::from_secs(10),
        )
        .await;
    assert!(rejected.as_u64().unwrap_or(0) > 0, "{rejected}");
    // The alert rule fired and is listed.
    browser
        .wait_for(
            "document.getElementById('alerts').textContent.includes('login-flood')",
            Duration::from_secs(10),
        )
        .await;
    // The listeners table: the one plain listener, its connections counted.
    let tls = browser
        .wait_for(
            "(() => { const r = document.querySelector('#listeners tr[data-listener=\"plain\"]'); \
             return r ? r.querySelector('td.tls').textContent : null; })()",
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(tls, "plain", "a listener without TLS");
    // The plans: the default one counting the clients' requests, pro's
    // own numbers, and the override set above.
    browser
        .wait_for(
            "(() => { const r = document.querySelector('#plans tr[data-plan=\"free\"]'); \
             return r && Number(r.children[1].textContent) > 0; })()",
            Duration::from_secs(10),
        )
        .await;
    let pro = browser
        .eval("document.querySelector('#plans tr[data-plan=\"pro\"]').textContent")
        .await;
    assert!(
        pro.as_str().unwrap().contains("items 5000 per 60s"),
        "{pro}"
    );
    let ov = browser
        .eval("document.querySelector('#overrides tr[data-key=\"203.0.113.9\"]').textContent")
        .await;
    assert!(ov.as_str().unwrap().contains('7'), "{ov}");
    let card = browser
        .eval("document.querySelector('section.limit[data-limit=\"login\"] .penalty').textContent")
        .await;
    assert!(
        card.as_str().unwrap().contains("penalty box: 25 refusals"),
        "{card}"
    );
    let lease = browser
        .eval("document.querySelector('section.limit[data-limit=\"items\"] .lease').textContent")
        .await;
    assert_eq!(lease, "leased: slices of up to 40 held 2s", "{lease}");
    // The offender kept hitting the login limit: the penalty box holds it,
    // and the Lift button (two clicks) ends the ban.
    let lift = format!("document.querySelector('#bans tr[data-key=\"{OFFENDER}\"] button')");
    browser
        .wait_for(&format!("{lift} !== null"), Duration::from_secs(20))
        .await;
    browser.eval(&format!("{lift}.click(); true")).await;
    browser.eval(&format!("{lift}.click(); true")).await;
    browser
        .wait_for(
            &format!("document.getElementById('notice').textContent.includes('lifted the ban of {OFFENDER}')"),
            Duration::from_secs(10),
        )
        .await;
    // Refreshes keep coming (every 2 s).
    let first = browser
        .eval("document.getElementById('updated').textContent")
        .await;
    browser
        .wait_for(
            &format!("document.getElementById('updated').textContent !== {first}"),
            Duration::from_secs(10),
        )
        .await;

    let png = browser.screenshot().await;
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("dashboard.png"), &png).unwrap();
    eprintln!(
        "dashboard screenshot: {}",
        dir.join("dashboard.png").display()
    );

    // The token stays in the tab: a reload asks nothing.
    browser
        .goto(&format!("http://{admin_addr}/dashboard"))
        .await;
    browser
        .wait_for(
            "document.body.dataset.loaded === 'true'",
            Duration::from_secs(20),
        )
        .await;
    assert_eq!(
        browser
            .eval("document.getElementById('login').hidden")
            .await,
        true,
        "the token was asked again"
    );
    // The page on a phone-sized screen has no horizontal overflow.
    browser
        .call(
            "Emulation.setDeviceMetricsOverride",
            serde_json::json!({ "width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": true }),
        )
        .await;
    let overflow = browser
        .eval("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        .await;
    assert_eq!(overflow, 0, "the page is wider than a phone");

    browser.eval("true").await;
    assert!(
        browser.exceptions.is_empty(),
        "the page threw: {:?}",
        browser.exceptions
    );
    load.abort_all();
    while let Some(r) = load.join_next().await {
        if let Err(e) = r {
            assert!(e.is_cancelled(), "load task failed: {e}");
        }
    }
}
