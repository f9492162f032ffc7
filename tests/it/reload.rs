//! Config reload: counters survive (kept, rescaled, or fresh when the
//! algorithm changed) on the memory store and a real `redis-server`; a bad
//! file keeps the running config and answers 400 with every problem;
//! listeners are added and removed (a removed one finishes its in-flight
//! request); a rotated certificate is served to new TLS connections; 20
//! reloads under HTTP/1.1 and HTTP/2 keep-alive load fail no request; and
//! SIGHUP reloads the real binary.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::redis::RedisServer;
use crate::common::*;
use http::StatusCode;

/// A config file in a temp dir, rewritten by the test between reloads.
struct File {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl File {
    fn new(yaml: &str) -> File {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tollgate.yaml");
        std::fs::write(&path, yaml).unwrap();
        File { _dir: dir, path }
    }

    fn write(&self, yaml: &str) {
        std::fs::write(&self.path, yaml).unwrap();
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// One `login` route answering `body`, with a login limit per `x-client`.
fn login_config(store: &str, limit: &str, body: &str) -> String {
    format!(
        "listeners:
  - {{ name: plain, bind: '127.0.0.1:0' }}
admin: {{ bind: '127.0.0.1:0' }}
log: {{ access_log: false }}
{store}
routes:
  - name: login
    match: {{ path: /auth/login }}
    respond: {{ body: \"{body}\\n\" }}
    limits: [{{ name: login, {limit}, key: 'header:x-client' }}]
"
    )
}

async fn login(addr: SocketAddr, client: &str) -> StatusCode {
    send_with(addr, "POST", "/auth/login", &[("x-client", client)], b"")
        .await
        .status
}

/// How many requests `client` still gets before its first 429.
async fn left(addr: SocketAddr, client: &str) -> usize {
    let mut n = 0;
    while login(addr, client).await == StatusCode::OK {
        n += 1;
        assert!(n < 100, "never refused");
    }
    n
}

async fn reload_ok(proxy: &TestProxy) -> tollgate::reload::ReloadReport {
    proxy
        .reload
        .reload()
        .await
        .unwrap_or_else(|e| panic!("reload refused: {e}"))
}

const FIVE_LOG: &str = "algorithm: sliding_log, limit: 5, window: 1m";
const TEN_LOG: &str = "algorithm: sliding_log, limit: 10, window: 1m";
const FIVE_FIXED: &str = "algorithm: fixed_window, limit: 5, window: 1m";

/// A client at 4 of 5 before each reload: unchanged -> 1 more; 5 -> 10 ->
/// the rescaled rest (8 of 10 used: 2 more); another algorithm -> fresh.
async fn counters_survive(store: &str) {
    let file = File::new(&login_config(store, FIVE_LOG, "A"));
    let proxy = TestProxy::spawn_file(file.path()).await;
    let addr = proxy.addr();
    for client in ["kept", "scaled", "fresh"] {
        for _ in 0..4 {
            assert_eq!(login(addr, client).await, StatusCode::OK);
        }
    }
    let report = reload_ok(&proxy).await;
    assert!(
        report.limits_rescaled.is_empty() && report.limits_reset.is_empty(),
        "{report:?}"
    );
    assert_eq!(left(addr, "kept").await, 1, "unchanged reload");

    file.write(&login_config(store, TEN_LOG, "B"));
    let report = reload_ok(&proxy).await;
    assert_eq!(report.limits_rescaled, ["login/login"], "{report:?}");
    assert_eq!(left(addr, "scaled").await, 2, "4 of 5 is 8 of 10");

    file.write(&login_config(store, FIVE_FIXED, "C"));
    let report = reload_ok(&proxy).await;
    assert_eq!(report.limits_reset, ["login/login"], "{report:?}");
    assert_eq!(
        left(addr, "fresh").await,
        5,
        "another algorithm starts fresh"
    );
    let got = send_with(addr, "POST", "/auth/login", &[("x-client", "new")], b"").await;
    assert_eq!(&got.body[..], b"C\n", "the new config answers");
}

#[tokio::test]
async fn counters_survive_a_reload_on_the_memory_store() {
    counters_survive("").await;
}

#[tokio::test]
async fn counters_survive_a_reload_on_redis() {
    let redis = RedisServer::start();
    counters_survive(&redis.store_yaml("")).await;
}

/// Routes `/a` (and, with `with_b`, `/b` before it) each with its own
/// `short` limit: one limit name on several routes.
fn shared_name_config(store: &str, with_b: bool) -> String {
    let b = if with_b {
        "  - { name: b, match: { path: /b }, respond: {}, limits: [{ name: short, algorithm: fixed_window, limit: 9, window: 1h, key: ip }] }\n"
    } else {
        ""
    };
    format!(
        "listeners: [{{ name: plain, bind: '127.0.0.1:0' }}]
admin: {{ enabled: false }}
log: {{ access_log: false }}
{store}
routes:
{b}  - {{ name: a, match: {{ path: /a }}, respond: {{}}, limits: [{{ name: short, algorithm: fixed_window, limit: 3, window: 1h, key: ip }}] }}
  - {{ name: c, match: {{ path: /c }}, respond: {{}}, limits: [{{ name: short, algorithm: fixed_window, limit: 3, window: 1h, key: ip }}] }}
"
    )
}

#[tokio::test]
async fn a_limit_name_on_several_routes_keeps_each_count_on_redis_when_routes_are_added() {
    let redis = RedisServer::start();
    let store = redis.store_yaml("");
    let file = File::new(&shared_name_config(&store, false));
    let proxy = TestProxy::spawn_file(file.path()).await;
    let get_status = |path: &'static str| {
        let addr = proxy.addr();
        async move { get(addr, path).await.status }
    };
    assert_eq!(get_status("/a").await, StatusCode::OK);
    assert_eq!(get_status("/a").await, StatusCode::OK);
    // A route with its own `short` comes first now: /a keeps its count
    // (2 of 3 used), /c its own, /b starts fresh.
    file.write(&shared_name_config(&store, true));
    reload_ok(&proxy).await;
    assert_eq!(get_status("/a").await, StatusCode::OK);
    assert_eq!(
        get_status("/a").await,
        StatusCode::TOO_MANY_REQUESTS,
        "/a kept its count through the reload"
    );
    for _ in 0..3 {
        assert_eq!(get_status("/c").await, StatusCode::OK);
    }
    assert_eq!(get_status("/c").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(get_status("/b").await, StatusCode::OK);
    // Each route's limit has its own Redis key, named after its route.
    let keys = redis.cli(&["--scan", "--pattern", "tollgate:*"]);
    let mut keys: Vec<&str> = keys.lines().collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "tollgate:{ip:127.0.0.1}:short@a",
            "tollgate:{ip:127.0.0.1}:short@b",
            "tollgate:{ip:127.0.0.1}:short@c"
        ]
    );
}

#[tokio::test]
async fn an_invalid_file_keeps_the_running_config_and_lists_every_problem() {
    let file = File::new(&login_config("", FIVE_LOG, "A"));
    let proxy = TestProxy::spawn_file(file.path()).await;
    file.write(&format!(
        "{}\ncolour: red\nupstreams:\n  api: {{ targets: ['127.0.0.1:1'], timeout: 30 }}\n",
        login_config("", FIVE_LOG, "B")
    ));
    let mut c = h1(proxy.admin.unwrap()).await;
    let got = send1(
        &mut c,
        http::Request::post("/api/reload")
            .header("host", "admin")
            .body(empty())
            .unwrap(),
    )
    .await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST, "{:?}", got.body);
    assert_eq!(got.headers["content-type"], "application/problem+json");
    let problems: Vec<String> = got.json()["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems.iter().any(|p| p.starts_with("colour")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("upstreams.api.timeout")),
        "{problems:?}"
    );
    // Still the old config, still serving.
    let got = send_with(
        proxy.addr(),
        "POST",
        "/auth/login",
        &[("x-client", "a")],
        b"",
    )
    .await;
    assert_eq!((got.status, &got.body[..]), (StatusCode::OK, &b"A\n"[..]));
    let metrics = get(proxy.admin.unwrap(), "/metrics").await;
    let text = String::from_utf8(metrics.body.to_vec()).unwrap();
    assert!(
        text.contains("tollgate_config_reloads_total{result=\"error\"} 1"),
        "{text}"
    );
}

/// Listeners by name: `names` on 127.0.0.1:0, or at a fixed address.
fn listeners_config(listeners: &[(&str, String)], upstream: SocketAddr) -> String {
    let mut yaml = String::from("listeners:\n");
    for (name, bind) in listeners {
        yaml.push_str(&format!("  - {{ name: {name}, bind: '{bind}' }}\n"));
    }
    yaml.push_str(&format!(
        // One worker: every request meets the same upstream pool.
        "admin: {{ bind: '127.0.0.1:0' }}\nlog: {{ access_log: false }}\nserver: {{ workers: 1 }}\nupstreams:\n  api: {{ targets: ['{upstream}'] }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, upstream: api }}\n"
    ));
    yaml
}

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

#[tokio::test]
async fn listeners_are_added_and_removed_and_a_removed_one_drains() {
    let up = Upstream::spawn().await;
    let (one, two) = (free_addr(), free_addr());
    let file = File::new(&listeners_config(&[("one", one.clone())], up.addr));
    let proxy = TestProxy::spawn_file(file.path()).await;
    let one_addr: SocketAddr = one.parse().unwrap();
    // A slow request in flight on `one` when it goes away.
    let slow = tokio::spawn(async move { get(one_addr, "/slow?ms=800").await });
    until(
        Duration::from_secs(10),
        "the slow request reaches the upstream",
        || std::future::ready(up.hits() == 1),
    )
    .await;

    file.write(&listeners_config(&[("two", two.clone())], up.addr));
    let report = reload_ok(&proxy).await;
    assert_eq!(
        (report.listeners_added, report.listeners_removed),
        (vec!["two".to_owned()], vec!["one".to_owned()])
    );
    let two_addr: SocketAddr = two.parse().unwrap();
    assert_eq!(
        get(two_addr, "/").await.status,
        StatusCode::OK,
        "the added listener answers"
    );
    // `/readyz` lists the listeners accepting now.
    let ready = get(proxy.admin.unwrap(), "/readyz").await.json();
    assert_eq!(
        ready["listeners"],
        serde_json::json!([{ "name": "two", "addr": two }]),
        "{ready}"
    );
    // `one` refuses new connections...
    until(
        Duration::from_secs(5),
        "the removed listener refuses",
        || async { tokio::net::TcpStream::connect(one_addr).await.is_err() },
    )
    .await;
    // ...and its in-flight request completes.
    let got = slow.await.unwrap();
    assert_eq!(
        (got.status, &got.body[..]),
        (StatusCode::OK, &b"slow done"[..])
    );

    // An unchanged upstream keeps its pooled connection.
    assert_eq!(get(two_addr, "/").await.status, StatusCode::OK);
    let conns = up.conns();
    reload_ok(&proxy).await;
    assert_eq!(get(two_addr, "/").await.status, StatusCode::OK);
    assert_eq!(up.conns(), conns, "the pool was kept");

    // A port in use fails the reload before anything changes.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().to_string();
    file.write(&listeners_config(
        &[("two", two.clone()), ("three", busy)],
        up.addr,
    ));
    let err = proxy.reload.reload().await.unwrap_err();
    assert!(err.to_string().contains("cannot listen"), "{err}");
    assert_eq!(get(two_addr, "/").await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_rotated_certificate_is_served_to_new_connections_and_old_ones_keep_working() {
    let ca = TestCa::new();
    let (cert, key) = ca.leaf("api", &["api.test"]);
    let yaml = format!(
        "listeners:\n  - {{ name: tls, bind: '127.0.0.1:0', tls: {{ certs: [{{ cert: '{cert}', key: '{key}' }}] }} }}\nadmin: {{ enabled: false }}\nlog: {{ access_log: false }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, respond: {{ body: \"ok\\n\" }} }}\n"
    );
    let file = File::new(&yaml);
    let proxy = TestProxy::spawn_file(file.path()).await;
    let addr = proxy.addr();
    let client = ca.client_config(&[b"http/1.1"]);
    let served = |tls: &tokio_rustls::client::TlsStream<tokio::net::TcpStream>| {
        tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
    };
    let old_tls = tls_connect(addr, client.clone(), "api.test").await;
    let before = served(&old_tls);
    let mut old_conn = h1_over(old_tls).await;
    let get_on = |path: &str| {
        http::Request::get(path)
            .header("host", "api.test")
            .body(empty())
            .unwrap()
    };
    assert_eq!(
        send1(&mut old_conn, get_on("/")).await.status,
        StatusCode::OK
    );

    // Rotate: a new certificate and key in the same files, then reload.
    ca.leaf("api", &["api.test"]);
    reload_ok(&proxy).await;
    let new_tls = tls_connect(addr, client, "api.test").await;
    assert_ne!(
        served(&new_tls),
        before,
        "new connections get the new certificate"
    );
    assert_eq!(
        send1(&mut old_conn, get_on("/")).await.status,
        StatusCode::OK,
        "the old connection keeps working"
    );

    // An unreadable pair fails the reload; the running one stays.
    std::fs::write(&key, "not a key").unwrap();
    let err = proxy.reload.reload().await.unwrap_err();
    assert!(
        matches!(err, tollgate::reload::ReloadError::Invalid(_)),
        "{err}"
    );
}

/// `clients` HTTP/1.1 and HTTP/2 keep-alive clients sending requests back
/// to back until `stop`; returns (responses by body, failures).
async fn steady_load(addr: SocketAddr, stop: Arc<AtomicBool>) -> (usize, Vec<String>) {
    let ok = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..6 {
        let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
        tasks.spawn(async move {
            let check = |got: Got| {
                if got.status == StatusCode::OK
                    && (&got.body[..] == b"A\n" || &got.body[..] == b"B\n")
                {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    failures
                        .lock()
                        .unwrap()
                        .push(format!("{} {:?}", got.status, got.body));
                }
            };
            let req = || {
                http::Request::get("/")
                    .header("host", "api.test")
                    .body(empty())
                    .unwrap()
            };
            if i % 2 == 0 {
                let mut c = h1(addr).await;
                while !stop.load(Ordering::Relaxed) {
                    check(send1(&mut c, req()).await);
                }
            } else {
                let mut c = h2(addr).await;
                while !stop.load(Ordering::Relaxed) {
                    match c.send_request(req()).await {
                        Ok(resp) => check(collect(resp).await),
                        Err(e) => failures.lock().unwrap().push(format!("h2: {e}")),
                    }
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let failures = failures.lock().unwrap().clone();
    (ok.load(Ordering::Relaxed), failures)
}

fn alternating(body: &str) -> String {
    format!(
        "listeners:\n  - {{ name: plain, bind: '127.0.0.1:0' }}\nadmin: {{ enabled: false }}\nlog: {{ access_log: false }}\nzones:\n  - {{ name: per_ip, rate: 100000r/s, burst: 1000, nodelay: true }}\nroutes:\n  - name: home\n    match: {{ path_prefix: / }}\n    respond: {{ body: \"{body}\\n\" }}\n    limits: [{{ name: wide, algorithm: token_bucket, rate: 100000/s, burst: 100000, key: ip }}]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_reloads_under_load_fail_no_request() {
    let file = File::new(&alternating("A"));
    let proxy = TestProxy::spawn_file(file.path()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(steady_load(proxy.addr(), stop.clone()));
    // The pauses pace the reloads through the load run; they order
    // nothing (every request of the run is checked).
    for i in 0..20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        file.write(&alternating(if i % 2 == 0 { "B" } else { "A" }));
        reload_ok(&proxy).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.store(true, Ordering::Relaxed);
    let (ok, failures) = load.await.unwrap();
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(ok > 100, "only {ok} requests ran");
}

#[test]
fn sighup_reloads_the_running_binary() {
    let running = Running::start(
        "routes:\n  - { match: { path_prefix: / }, respond: { body: \"before\\n\" } }\n",
    );
    let path = running.config_path();
    let yaml = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, yaml.replace("before", "after")).unwrap();
    running.signal("-HUP");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(until(Duration::from_secs(10), "SIGHUP reloads", || async {
        let got = get(running.addr, "/").await;
        assert!(
            [&b"before\n"[..], b"after\n"].contains(&&got.body[..]),
            "{:?}",
            got.body
        );
        &got.body[..] == b"after\n"
    }));
    // `tollgate reload` asks the same through the admin API.
    let out = std::process::Command::new(BIN)
        .args(["reload", "--admin", &running.admin.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("reloaded"));
}

#[tokio::test]
async fn an_alert_rule_keeps_its_window_and_cooldown_across_reloads() {
    let alerts =
        "alerts:\n  rules:\n    - { name: guessing, limit: login, rejections: 3, per: 1h }";
    let one = "algorithm: fixed_window, limit: 1, window: 1h";
    let file = File::new(&login_config(alerts, one, "A"));
    let proxy = TestProxy::spawn_file(file.path()).await;
    let alerts_fired = || proxy.live.load().latest_alerts().len();
    assert_eq!(login(proxy.addr(), "mallory").await, StatusCode::OK);
    for _ in 0..2 {
        assert_eq!(
            login(proxy.addr(), "mallory").await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(alerts_fired(), 0, "2 of 3 rejections");
    file.write(&login_config(alerts, one, "B"));
    reload_ok(&proxy).await;
    // The third rejection in the window, after the reload, fires it.
    assert_eq!(
        login(proxy.addr(), "mallory").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(alerts_fired(), 1, "the window went on through the reload");
    // Within its cool-down it does not fire again, reload or not.
    reload_ok(&proxy).await;
    assert_eq!(
        login(proxy.addr(), "mallory").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        alerts_fired(),
        1,
        "the cool-down went on through the reload"
    );
}
