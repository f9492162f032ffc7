//! The penalty box (issue 57): a key its limit refused `after` times
//! within `within` is banned, longer at each repeat; a banned key is
//! refused before any limit is consulted, on every replica sharing the
//! store; bans are listed and lifted through the admin API, counted in
//! metrics, posted to the alert webhook, kept across a reload and never
//! lost silently when Redis fails. Time moves by the proxies' frozen
//! clocks (pinned into the Redis scripts), never by sleeping.

use std::time::Duration;

use http::StatusCode;

use crate::common::redis::RedisServer;
use crate::common::*;

const TOKEN: &str = "penalty-admin-token-0123456789";
const BOXED: &str = "https://iana.org/assignments/http-problem-types#abnormal-usage-detected";

fn config(store: &str, hook: Option<std::net::SocketAddr>, status: u16) -> String {
    let alerts = hook
        .map(|h| format!("alerts: {{ webhook: {{ url: 'http://{h}/hooks', timeout: 1s }} }}"))
        .unwrap_or_default();
    format!(
        "listeners: [{{ name: plain, bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0', token: '{TOKEN}' }}
log: {{ access_log: false }}
{store}
{alerts}
zones:
  - {{ name: per_ip, rate: 600r/m, burst: 100, nodelay: true }}
routes:
  - match: {{ path: /auth/login, methods: [POST] }}
    respond: {{ body: welcome }}
    limits:
      - name: login
        algorithm: sliding_log
        key: ip
        limit: 2
        window: 1m
        penalty: {{ after: 2, within: 1m, ban: [1m, 10m], forgive: 1h, status: {status} }}
  - match: {{ path_prefix: / }}
    respond: {{ body: ok }}
"
    )
}

async fn login(addr: std::net::SocketAddr, from: &str) -> Got {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut c = h1_over(socket.connect(addr).await.unwrap()).await;
    let req = http::Request::post("/auth/login")
        .header("host", "api.test")
        .body(full(String::new()))
        .unwrap();
    send1(&mut c, req).await
}

fn problem(got: &Got) -> serde_json::Value {
    serde_json::from_slice(&got.body).unwrap_or_else(|_| panic!("{:?}", got.body))
}

/// Whether the answer is the penalty box's refusal.
fn is_boxed(got: &Got) -> bool {
    serde_json::from_slice::<serde_json::Value>(&got.body).is_ok_and(|p| p["type"] == BOXED)
}

fn boxed(got: &Got, status: StatusCode, retry: &str) {
    assert_eq!(got.status, status, "{:?}", got.body);
    assert_eq!(got.headers["retry-after"], retry);
    let p = problem(got);
    assert_eq!(p["type"], BOXED, "{p}");
    assert_eq!(p["limit"], "login", "{p}");
}

/// Two replicas on a Redis (or one on the memory store), their frozen
/// clocks started at the same instant.
async fn replicas(
    redis: Option<&RedisServer>,
    hook: Option<std::net::SocketAddr>,
) -> Vec<(TestProxy, tollgate::clock::FrozenClock)> {
    let store = redis.map(|r| r.store_yaml("")).unwrap_or_default();
    let start = 1_900_000_000_000;
    let mut out = Vec::new();
    for _ in 0..if redis.is_some() { 2 } else { 1 } {
        out.push(TestProxy::spawn_at(&config(&store, hook, 429), start).await);
    }
    out
}

fn advance(rs: &[(TestProxy, tollgate::clock::FrozenClock)], by: Duration) {
    for (_, c) in rs {
        c.advance(by);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bans_escalate_hold_on_every_replica_and_lift_everywhere() {
    let (hook, mut posts) = receiver(true).await;
    for redis in [None, Some(RedisServer::start())] {
        let rs = replicas(redis.as_ref(), Some(hook)).await;
        let (a, b) = (rs[0].0.addr(), rs[rs.len() - 1].0.addr());
        let who = if redis.is_some() { "redis" } else { "memory" };
        // Two logins admitted, then the limit refuses twice: the second
        // refusal starts the first ban (1m), answered at once.
        assert_eq!(login(a, "127.0.0.3").await.status, StatusCode::OK);
        assert_eq!(login(b, "127.0.0.3").await.status, StatusCode::OK);
        let refused = login(a, "127.0.0.3").await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            problem(&refused)["type"],
            "about:blank",
            "{who}: the limit's own refusal"
        );
        boxed(
            &login(b, "127.0.0.3").await,
            StatusCode::TOO_MANY_REQUESTS,
            "60",
        );
        // Every replica refuses the key before its limits, other paths of
        // the route's limits untouched: another address logs in.
        until(
            Duration::from_secs(5),
            "the other replica to hear of the ban",
            || async { is_boxed(&login(a, "127.0.0.3").await) },
        )
        .await;
        assert_eq!(login(a, "127.0.0.4").await.status, StatusCode::OK, "{who}");
        // The alert webhook hears of the ban once.
        let (_, body) = tokio::time::timeout(Duration::from_secs(5), posts.recv())
            .await
            .expect("an alert for the ban")
            .unwrap();
        let alert: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (alert["alert"].as_str(), alert["limit"].as_str()),
            (Some("penalty_box"), Some("login")),
            "{alert}"
        );
        assert_eq!(alert["key"], "127.0.0.3", "{alert}");
        // Listed on both replicas, counted in metrics.
        for (proxy, _) in &rs {
            let got = admin_with(proxy, TOKEN, "GET", "/api/bans", None).await;
            let list: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
            assert_eq!(list["bans"][0]["key"], "127.0.0.3", "{who}: {list}");
            assert_eq!(list["bans"][0]["ban"], 1, "{list}");
            assert_eq!(list["bans"][0]["ends_in_seconds"], 60, "{list}");
            assert_eq!(list["total"], 1, "{list}");
        }
        // One ban started, by one replica; every replica's gauge shows it.
        let mut started = 0.0;
        for (proxy, _) in &rs {
            let m = admin_with(proxy, TOKEN, "GET", "/metrics", None).await;
            let m = String::from_utf8_lossy(&m.body).into_owned();
            assert_eq!(
                value(&m, r#"tollgate_penalty_boxed{limit="login"}"#),
                Some(1.0),
                "{m}"
            );
            started += value(&m, r#"tollgate_penalty_bans_total{limit="login"}"#).unwrap_or(0.0);
        }
        assert_eq!(started, 1.0, "{who}");
        let m = admin_with(&rs[0].0, TOKEN, "GET", "/metrics", None).await;
        let m = String::from_utf8_lossy(&m.body).into_owned();
        assert!(
            value(&m, r#"tollgate_penalty_refused_total{limit="login"}"#).unwrap_or(0.0) >= 1.0,
            "{m}"
        );

        // The ban served, the log's window passed: two more logins, then
        // the second ban, ten minutes.
        advance(&rs, Duration::from_secs(60));
        assert_eq!(
            login(b, "127.0.0.3").await.status,
            StatusCode::OK,
            "{who}: ban over"
        );
        assert_eq!(login(a, "127.0.0.3").await.status, StatusCode::OK);
        assert_eq!(
            login(b, "127.0.0.3").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
        boxed(
            &login(a, "127.0.0.3").await,
            StatusCode::TOO_MANY_REQUESTS,
            "600",
        );
        let (_, body) = tokio::time::timeout(Duration::from_secs(5), posts.recv())
            .await
            .expect("an alert for the second ban")
            .unwrap();
        assert!(body.contains("\"count\":2"), "{body}");

        // A minute on, the log's window is clear but the ban still holds.
        advance(&rs, Duration::from_secs(60));
        boxed(
            &login(b, "127.0.0.3").await,
            StatusCode::TOO_MANY_REQUESTS,
            "540",
        );
        // Lifted through one replica: both admit at once.
        let lifted = admin_with(
            &rs[rs.len() - 1].0,
            TOKEN,
            "DELETE",
            "/api/bans/login/127.0.0.3",
            None,
        )
        .await;
        assert_eq!(lifted.status, StatusCode::OK, "{:?}", lifted.body);
        until(
            Duration::from_secs(5),
            "every replica to hear of the lift",
            || async { login(a, "127.0.0.3").await.status == StatusCode::OK },
        )
        .await;
        let again = admin_with(&rs[0].0, TOKEN, "DELETE", "/api/bans/login/127.0.0.3", None).await;
        assert_eq!(
            again.status,
            StatusCode::NOT_FOUND,
            "{who}: nothing left to lift"
        );
        let bad = admin_with(&rs[0].0, TOKEN, "DELETE", "/api/bans/nope/127.0.0.3", None).await;
        assert_eq!(bad.status, StatusCode::NOT_FOUND);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_outlives_a_reload_and_answers_with_the_configured_status() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, config("", None, 403)).unwrap();
    let proxy = TestProxy::spawn_file(&path).await;
    let addr = proxy.addr();
    for _ in 0..3 {
        login(addr, "127.0.0.5").await;
    }
    boxed(&login(addr, "127.0.0.5").await, StatusCode::FORBIDDEN, "60");
    proxy.reload.reload().await.expect("reload");
    let got = login(addr, "127.0.0.5").await;
    assert_eq!(
        got.status,
        StatusCode::FORBIDDEN,
        "the ban survives the reload"
    );
    assert_eq!(problem(&got)["type"], BOXED);
    // Only the login route's limit boxed it: other paths are open.
    assert_eq!(
        get_from("127.0.0.5", addr, "/other", &[]).await.status,
        StatusCode::OK
    );
}

/// Redis stopped while a key is boxed: both replicas go on refusing it
/// from their copies (no store call, no wait), and when Redis comes back
/// empty (a restart without persistence) the replicas write the ban back,
/// so a replica started afterwards refuses the key too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_held_while_redis_is_down_is_written_back_when_it_returns() {
    let mut redis = RedisServer::start();
    let rs = replicas(Some(&redis), None).await;
    let (a, b) = (rs[0].0.addr(), rs[1].0.addr());
    for _ in 0..3 {
        login(a, "127.0.0.6").await;
    }
    boxed(
        &login(b, "127.0.0.6").await,
        StatusCode::TOO_MANY_REQUESTS,
        "60",
    );
    until(
        Duration::from_secs(5),
        "replica A to hear of the ban",
        || async { is_boxed(&login(a, "127.0.0.6").await) },
    )
    .await;
    redis.pause(true);
    for addr in [a, b] {
        let got = tokio::time::timeout(Duration::from_secs(3), login(addr, "127.0.0.6"))
            .await
            .expect("answered from the replica's copy, Redis stopped");
        boxed(&got, StatusCode::TOO_MANY_REQUESTS, "60");
    }
    redis.pause(false);
    redis.kill();
    redis.restart();
    until(
        Duration::from_secs(10),
        "the ban written back to Redis",
        || async {
            redis
                .cli(&["HGETALL", "tollgate:{bans}"])
                .contains("127.0.0.6")
        },
    )
    .await;
    let (late, _) =
        TestProxy::spawn_at(&config(&redis.store_yaml(""), None, 429), 1_900_000_000_000).await;
    until(
        Duration::from_secs(5),
        "a replica started afterwards to refuse the key",
        || async { is_boxed(&login(late.addr(), "127.0.0.6").await) },
    )
    .await;
}

#[test]
fn penalty_config_problems_name_their_paths() {
    let bad = |penalty: &str| {
        let yaml = config("", None, 429).replace(
            "penalty: { after: 2, within: 1m, ban: [1m, 10m], forgive: 1h, status: 429 }",
            penalty,
        );
        tollgate::Config::from_yaml(&yaml, &|_| None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_else(|| panic!("accepted: {penalty}"))
    };
    let e = bad("penalty: { after: 0 }");
    assert!(e.contains("routes[0].limits[0].penalty.after"), "{e}");
    let e = bad("penalty: { ban: [] }");
    assert!(e.contains("routes[0].limits[0].penalty.ban"), "{e}");
    let e = bad("penalty: { ban: [1m, soon] }");
    assert!(e.contains("routes[0].limits[0].penalty.ban[1]"), "{e}");
    let e = bad("penalty: { status: 503 }");
    assert!(
        e.contains("penalty.status") && e.contains("429 or 403"),
        "{e}"
    );
    let e = bad("penalty: { afte: 3 }");
    assert!(e.contains("afte"), "{e}");
}

/// A zone's penalty box: an address the zone refused twice is banned on
/// every route the zone covers, before the zone counts it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_boxes_an_address_on_every_route_it_covers() {
    let yaml = format!(
        "listeners: [{{ name: plain, bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0', token: '{TOKEN}' }}
log: {{ access_log: false }}
zones:
  - {{ name: per_ip, rate: 1r/m, burst: 1, nodelay: true, penalty: {{ after: 2, ban: [5m], status: 403 }} }}
routes:
  - match: {{ path_prefix: /a }}
    respond: {{ body: a }}
  - match: {{ path_prefix: / }}
    respond: {{ body: ok }}
"
    );
    let (proxy, clock) = TestProxy::spawn_at(&yaml, 1_900_000_000_000).await;
    let addr = proxy.addr();
    let limits = admin_with(&proxy, TOKEN, "GET", "/api/limits", None).await;
    let limits: serde_json::Value = serde_json::from_slice(&limits.body).unwrap();
    let zone = &limits["limits"][0]["penalty"];
    assert_eq!(
        (
            zone["after"].as_u64(),
            zone["status"].as_u64(),
            zone["ban_seconds"][0].as_f64()
        ),
        (Some(2), Some(403), Some(300.0)),
        "{limits}"
    );
    let get = |path: &'static str| async move { get_from("127.0.0.7", addr, path, &[]).await };
    assert_eq!(get("/a").await.status, StatusCode::OK);
    assert_eq!(get("/a").await.status, StatusCode::OK);
    let refused = get("/a").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(!is_boxed(&refused));
    let banned = get("/b").await;
    assert_eq!(banned.status, StatusCode::FORBIDDEN);
    assert!(is_boxed(&banned));
    assert_eq!(banned.headers["retry-after"], "300");
    // Two minutes on, the zone has room again, but the ban holds.
    clock.advance(Duration::from_secs(120));
    assert_eq!(get("/").await.status, StatusCode::FORBIDDEN);
    assert_eq!(
        get_from("127.0.0.8", addr, "/", &[]).await.status,
        StatusCode::OK
    );
    clock.advance(Duration::from_secs(180));
    assert_eq!(get("/").await.status, StatusCode::OK, "the ban served");
}

/// On a Redis Cluster of three primaries: a quota counts once across two
/// replicas, and a ban started through one replica holds on the other
/// (the announcement reaches every node's subscribers) and is lifted on
/// both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_quotas_count_once_and_bans_reach_every_replica() {
    let cluster = crate::common::redis::RedisCluster::start();
    let store = format!(
        "store: {{ kind: redis_cluster, nodes: {}, timeout: 2s }}",
        cluster.seeds()
    );
    let yaml = config(&store, None, 429).replace(
        "  - match: { path_prefix: / }\n    respond: { body: ok }\n",
        "  - match: { path_prefix: / }\n    respond: { body: ok }\n    limits: [{ name: daily, algorithm: quota, key: ip, limit: 3, period: day, time_zone: Asia/Kolkata }]\n",
    );
    let (a, b) = (TestProxy::spawn(&yaml).await, TestProxy::spawn(&yaml).await);
    let mut admitted = 0;
    for n in 0..6 {
        let addr = if n % 2 == 0 { a.addr() } else { b.addr() };
        if get_from("127.0.0.9", addr, "/q", &[]).await.status == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3, "one day's quota across both replicas");

    for addr in [a.addr(), b.addr(), a.addr()] {
        login(addr, "127.0.0.9").await;
    }
    assert!(
        is_boxed(&login(b.addr(), "127.0.0.9").await),
        "the second refusal bans"
    );
    until(
        Duration::from_secs(5),
        "A to refuse the boxed key",
        || async { is_boxed(&login(a.addr(), "127.0.0.9").await) },
    )
    .await;
    let lifted = admin_with(&a, TOKEN, "DELETE", "/api/bans/login/127.0.0.9", None).await;
    assert_eq!(lifted.status, StatusCode::OK, "{:?}", lifted.body);
    until(Duration::from_secs(5), "B to hear of the lift", || async {
        !is_boxed(&login(b.addr(), "127.0.0.9").await)
    })
    .await;
}

/// A ban started while Redis cannot answer (strikes then count in the
/// replica) reaches Redis, and so the other replica, once Redis answers
/// again: never lost silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_started_while_redis_is_stopped_reaches_the_other_replica_after() {
    let redis = RedisServer::start();
    let store = format!(
        "store: {{ kind: redis, url: '{}', timeout: 100ms, breaker: {{ failures: 1, probe_interval: 100ms }} }}",
        redis.url()
    );
    let start = 1_900_000_000_000;
    let (a, _ca) = TestProxy::spawn_at(&config(&store, None, 429), start).await;
    let (b, _cb) = TestProxy::spawn_at(&config(&store, None, 429), start).await;
    redis.pause(true);
    // A decides alone (on_error: local) and boxes the address itself.
    let mut boxed_on_a = false;
    for _ in 0..6 {
        if is_boxed(&login(a.addr(), "127.0.0.10").await) {
            boxed_on_a = true;
            break;
        }
    }
    assert!(boxed_on_a, "A boxes the key while Redis is stopped");
    redis.pause(false);
    until(
        Duration::from_secs(10),
        "the ban to reach Redis",
        || async {
            redis
                .cli(&["HGETALL", "tollgate:{bans}"])
                .contains("127.0.0.10")
        },
    )
    .await;
    until(
        Duration::from_secs(5),
        "B to refuse the key A boxed",
        || async { is_boxed(&login(b.addr(), "127.0.0.10").await) },
    )
    .await;
}
