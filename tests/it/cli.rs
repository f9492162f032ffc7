//! The `tollgate` binary as an operator uses it: `check`, `--version`, `run`
//! with SIGTERM, and flat memory while large bodies stream through.

use std::process::Command;
use std::time::Duration;

use crate::common::*;

#[test]
fn check_reports_every_mistake_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        &dir,
        "listeners:
  - { name: plain, bind: '127.0.0.1:8080', colour: blue }
upstreams:
  api: { targets: ['127.0.0.1:3000'], timeout: 30 }
routes:
  - { match: { path_prefix: / }, upstream: apj }
",
    );
    let out = Command::new(BIN)
        .args(["check", "--config", &path])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("3 problem(s)"), "{stderr}");
    assert!(
        stderr.contains("listeners[0].colour: unknown field `colour`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("upstreams.api.timeout: expected a duration like \"250ms\", \"30s\" or \"1m\", got \"30\""),
        "{stderr}"
    );
    assert!(
        stderr.contains("routes[0].upstream: no upstream named \"apj\" (defined: api)"),
        "{stderr}"
    );
}

#[test]
fn check_piped_into_a_reader_that_left_exits_quietly() {
    // `tollgate check | head -1`: the reader is gone before the summary
    // is written.
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        &dir,
        "listeners: [{ bind: '127.0.0.1:8080' }]\nroutes:\n  - { match: { path_prefix: / }, respond: {} }\n",
    );
    let mut child = Command::new(BIN)
        .args(["check", "--config", &path])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

#[test]
fn check_names_a_missing_environment_variable() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        &dir,
        "listeners: [{ bind: '${TOLLGATE_TEST_UNSET_BIND}' }]\nroutes: [{ match: { path: / }, respond: {} }]\n",
    );
    let out = Command::new(BIN)
        .args(["check", "--config", &path])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains(
            "listeners[0].bind: environment variable TOLLGATE_TEST_UNSET_BIND is not set"
        ),
        "{stderr}"
    );

    let out = Command::new(BIN)
        .args(["check", "--config", &path])
        .env("TOLLGATE_TEST_UNSET_BIND", "127.0.0.1:0")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_example_config_passes_check_with_a_summary() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config.example.yaml");
    let out = Command::new(BIN)
        .args(["check", "--config", example])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("is valid"), "{stdout}");
    for section in [
        "listeners:",
        "upstreams:",
        "routes (in match order):",
        "127.0.0.1:8080",
    ] {
        assert!(stdout.contains(section), "missing {section}: {stdout}");
    }
}

#[test]
fn a_missing_file_and_a_bad_file_refuse_to_run() {
    let out = Command::new(BIN)
        .args(["run", "--config", "/nonexistent/tollgate.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/tollgate.yaml"));

    let dir = tempfile::tempdir().unwrap();
    let path = write_config(&dir, "listeners: []\n");
    let out = Command::new(BIN)
        .args(["run", "--config", &path])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("listeners: at least one listener is required"));
}

#[test]
fn version_is_printed() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("tollgate {}", env!("CARGO_PKG_VERSION"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_requests_finish_then_exits_zero() {
    let up = Upstream::spawn().await;
    let mut run = Running::start(&format!(
        "server: {{ shutdown_grace: 10s }}\nupstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, upstream: api }}\n",
        up.addr
    ));
    assert_eq!(get(run.admin, "/readyz").await.status, 200);
    let addr = run.addr;
    let slow = tokio::spawn(async move { get(addr, "/slow?ms=1500").await });
    until(
        Duration::from_secs(10),
        "the slow request reaches the upstream",
        || std::future::ready(up.hits() == 1),
    )
    .await;
    run.signal("-TERM");
    until(
        Duration::from_secs(5),
        "no new connections are accepted while draining",
        || async { tokio::net::TcpStream::connect(addr).await.is_err() },
    )
    .await;
    assert!(
        !slow.is_finished(),
        "the signal came while it was in flight"
    );
    let got = tokio::time::timeout(Duration::from_secs(10), slow)
        .await
        .expect("in-flight request finished")
        .unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.body, "slow done");
    let status = tokio::task::spawn_blocking(move || {
        let s = run.child.wait().unwrap();
        drop(run);
        s
    })
    .await
    .unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_flat_while_large_bodies_stream() {
    const SIZE: u64 = 100 * 1024 * 1024;
    let up = Upstream::spawn().await;
    let run = Running::start(&format!(
        "server: {{ max_body_size: 1GB }}\nupstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, upstream: api }}\n",
        up.addr
    ));
    let before = run.peak_rss_kib();
    let mut c = h1(run.addr).await;
    let got = send1(&mut c, request("POST", "/upload", pattern(SIZE))).await;
    assert_eq!(got.json()["body_sha256"], Pattern::sha256(SIZE));
    let got = send1(
        &mut c,
        request("GET", &format!("/download?bytes={SIZE}"), empty()),
    )
    .await;
    assert_eq!(got.body.len() as u64, SIZE);
    let grew_mib = (run.peak_rss_kib().saturating_sub(before)) / 1024;
    eprintln!("peak RSS grew by {grew_mib} MiB while 200 MiB streamed through");
    assert!(
        grew_mib < 32,
        "tollgate buffered the body: peak RSS grew by {grew_mib} MiB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_reports_health_and_readiness() {
    let run = Running::start("routes: [{ match: { path: / }, respond: { body: hi } }]\n");
    let got = get(run.admin, "/healthz").await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["status"], "ok");
    let got = get(run.admin, "/readyz").await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["listeners"][0]["addr"], run.addr.to_string());
    assert_eq!(get(run.admin, "/nope").await.status, 404);
    assert_eq!(get(run.addr, "/").await.body, "hi");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_has_one_json_event_per_request() {
    let up = Upstream::spawn().await;
    let run = Running::start_logging(
        &format!(
            "upstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - {{ name: api, match: {{ path_prefix: /api/ }}, upstream: api }}\n",
            up.addr
        ),
        true,
    );
    assert_eq!(get(run.addr, "/api/items?secret=1").await.status, 200);
    assert_eq!(get(run.addr, "/missing").await.status, 404);
    let events = run.access_events(2).await;
    assert_eq!(events.len(), 2, "{events:?}");
    let ok = &events[0];
    assert_eq!(ok["method"], "GET");
    assert_eq!(
        ok["path"], "/api/items",
        "the query string stays out of the log"
    );
    assert_eq!(ok["status"], 200);
    assert_eq!(ok["client"], "127.0.0.1");
    assert_eq!(ok["route"], "api");
    assert_eq!(ok["upstream"], "api");
    assert_eq!(ok["upstream_target"], up.addr.to_string());
    assert!(ok["bytes"].as_u64().unwrap() > 0);
    assert!(ok["duration_ms"].as_f64().is_some());
    assert_eq!(ok["rate_limit"], "-");
    assert_eq!(events[1]["status"], 404);
    assert_eq!(events[1]["upstream"], "-");
}

#[test]
fn check_connect_reaches_redis_or_says_why_not() {
    let redis = crate::common::redis::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let yaml = |url: &str| {
        format!(
            "listeners: [{{ bind: '127.0.0.1:0' }}]\nstore: {{ kind: redis, url: '{url}' }}\nroutes: [{{ match: {{ path: / }}, respond: {{}} }}]\n"
        )
    };
    let path = write_config(&dir, &yaml(&redis.url()));
    let out = Command::new(BIN)
        .args(["check", "--connect", "--config", &path])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("store: Redis "), "{stdout}");
    assert!(
        stdout.contains("connected, script and function loaded"),
        "{stdout}"
    );
    let memory = redis.cli(&["INFO", "memory"]);
    assert!(memory.contains("number_of_cached_scripts:1"), "{memory}");
    let libraries = redis.cli(&["FUNCTION", "LIST"]);
    assert!(libraries.contains("tollgate_decide_"), "{libraries}");

    // A dead port: exit 1 with the reason, and never the password.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let path = write_config(
        &dir,
        &yaml(&format!("redis://app:hunter2@127.0.0.1:{port}")),
    );
    let out = Command::new(BIN)
        .args(["check", "--connect", "--config", &path])
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("rate-limit store is not reachable"), "{all}");
    assert!(all.contains("refused"), "{all}");
    assert!(!all.contains("hunter2"), "{all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_admits_and_says_so_in_the_log_without_the_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let run = Running::start(&format!(
        "store: {{ kind: redis, url: 'redis://app:hunter2@127.0.0.1:{port}', timeout: 50ms, on_error: fail_open }}
routes:
  - match: {{ path_prefix: / }}
    respond: {{}}
    limits: [{{ name: api, algorithm: fixed_window, key: ip, limit: 1, window: 1m }}]
"
    ));
    for _ in 0..3 {
        assert_eq!(get(run.addr, "/").await.status, 200);
    }
    let warned = until_some(Duration::from_secs(5), "a warning about the store", || {
        let found = run
            .logs
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|e| {
                e["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("rate-limit store failed"))
            });
        std::future::ready(found)
    })
    .await;
    assert_eq!(warned["level"], "WARN");
    let all = run.logs.lock().unwrap().join("\n");
    assert!(!all.contains("hunter2"), "{all}");
}
