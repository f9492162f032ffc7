//! `tollgate replay` tells the truth about tollgate itself: a trace sent
//! through a running tollgate (memory store) and its JSON access log
//! replayed through the same config give the same decision request for
//! request, including ones that depend on the time between requests. And
//! the command reads what operators have: malformed lines reported by
//! number without stopping, a JSON report, a diff against another config.

use std::process::Command;
use std::time::Duration;

use crate::common::process::{Running, BIN};
use crate::common::*;

fn replay(args: &[&str]) -> std::process::Output {
    Command::new(BIN).arg("replay").args(args).output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_tollgates_own_access_log_gives_its_decisions() {
    let up = Upstream::spawn().await;
    let proxy = Running::start_logging(
        &format!(
            "zones:
  - {{ name: per_ip, rate: 1r/m, burst: 20, nodelay: true }}
upstreams:
  api: {{ targets: ['{}'] }}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: api
    limits:
      - {{ name: bucket, algorithm: token_bucket, rate: 10/s, burst: 2, key: ip }}
  - name: login
    match: {{ path: /login }}
    respond: {{ status: 401, body: no }}
    zones: []
    limits:
      - {{ name: failures, algorithm: fixed_window, limit: 3, window: 1h, key: ip, count: {{ status: [401] }} }}
  - name: health
    match: {{ path: /health }}
    respond: {{ body: ok }}
",
            up.addr
        ),
        true,
    );
    // One request at a time: the log's order is the order decided in.
    // A burst of five spends the bucket (two pass); 300 ms later it has
    // refilled to its burst again; the per-IP zone refuses past 21.
    let mut sent = Vec::new();
    let mut steps: Vec<(&str, &str, usize, u64)> = vec![
        ("127.0.0.2", "/api/a", 5, 0),
        ("127.0.0.2", "/api/a", 5, 300),
        ("127.0.0.3", "/api/b", 3, 0),
        ("127.0.0.2", "/login", 5, 0),
        ("127.0.0.2", "/health", 2, 0),
    ];
    for _ in 0..4 {
        steps.push(("127.0.0.4", "/api/c", 1, 150));
    }
    steps.push(("127.0.0.5", "/health", 24, 0));
    for (from, path, n, wait_ms) in steps {
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        for _ in 0..n {
            sent.push(get_from(from, proxy.addr, path, &[]).await.status.as_u16());
        }
    }
    let events = proxy.access_events(sent.len()).await;
    assert_eq!(events.len(), sent.len());
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let lines: Vec<String> = proxy.logs.lock().unwrap().clone();
    std::fs::write(&log, lines.join("\n") + "\n").unwrap();
    let out = dir.path().join("decisions.tsv");
    let config = proxy.config_path();
    let done = replay(&[
        "--config",
        config.to_str().unwrap(),
        "--decisions",
        out.to_str().unwrap(),
        "--format",
        "json",
        log.to_str().unwrap(),
    ]);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&done.stdout).unwrap();
    let got = crate::common::process::replay_decisions(&out);
    assert_eq!(got.len(), sent.len(), "{report}");
    let mut refused = 0;
    for (i, (event, (logged, limit))) in events.iter().zip(&got).enumerate() {
        let live = event["rate_limit"].as_str().unwrap();
        assert_eq!(u64::from(*logged), event["status"], "request {i}");
        let expected = live.strip_prefix("rejected:").unwrap_or("-");
        assert_eq!(
            limit, expected,
            "request {i} ({}): live {live}",
            event["path"]
        );
        refused += usize::from(expected != "-");
    }
    // Every kind of decision was in the trace.
    for limit in ["bucket", "failures", "per_ip"] {
        assert!(
            got.iter().any(|(_, l)| l == limit),
            "nothing refused by {limit}: {got:?}"
        );
    }
    assert!(refused >= 8, "{refused}");
    assert_eq!(report["agreement"]["differ"], 0, "{report}");
}

/// A request held 900 ms is logged after one that arrived later (the log
/// is written as requests end). Replayed in the log's order, the two
/// decisions swap; put back in arrival order within the longest request,
/// none differs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_log_with_slow_requests_replays_in_arrival_order() {
    let up = Upstream::spawn().await;
    let proxy = Running::start_logging(
        &format!(
            "upstreams:
  api: {{ targets: ['{}'] }}
routes:
  - name: api
    match: {{ path_prefix: / }}
    upstream: api
    limits:
      - {{ name: one, algorithm: sliding_log, limit: 1, window: 1h, key: ip }}
",
            up.addr
        ),
        true,
    );
    let addr = proxy.addr;
    // 127.0.0.2: a slow request, then 200 ms later a fast one (refused);
    // the slow one ends last. 127.0.0.3: the same, twice over.
    let mut runs = Vec::new();
    for from in ["127.0.0.2", "127.0.0.3"] {
        runs.push(tokio::spawn(async move {
            let slow = tokio::spawn(get_from(from, addr, "/slow?ms=900", &[]));
            tokio::time::sleep(Duration::from_millis(200)).await;
            let fast = get_from(from, addr, "/fast", &[]).await.status;
            let again = get_from(from, addr, "/fast", &[]).await.status;
            (slow.await.unwrap().status, fast, again)
        }));
    }
    for run in runs {
        let (slow, fast, again) = run.await.unwrap();
        assert_eq!(
            (slow.as_u16(), fast.as_u16(), again.as_u16()),
            (200, 429, 429)
        );
    }
    let events = proxy.access_events(6).await;
    // The log's order is not the arrival order.
    assert_eq!(events[0]["path"], "/fast", "{events:?}");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let lines: Vec<String> = proxy.logs.lock().unwrap().clone();
    std::fs::write(&log, lines.join("\n") + "\n").unwrap();
    let config = proxy.config_path();
    let run = |window: Option<&str>| {
        let mut args = vec!["--config", config.to_str().unwrap(), "--format", "json"];
        if let Some(w) = window {
            args.extend(["--window", w]);
        }
        args.push(log.to_str().unwrap());
        let done = replay(&args);
        assert!(
            done.status.success(),
            "{}",
            String::from_utf8_lossy(&done.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&done.stdout).unwrap()
    };
    let report = run(None);
    assert!(
        report["reorder_window_ms"].as_i64().unwrap() >= 900,
        "{report}"
    );
    assert_eq!(report["out_of_order"], 0, "{report}");
    assert_eq!(report["agreement"]["differ"], 0, "{report}");
    // In the log's own order (no window), the swaps come back, counted
    // (at least each slow request; how the two clients' lines interleave
    // may add one).
    let report = run(Some("0ms"));
    assert!(report["out_of_order"].as_u64().unwrap() >= 2, "{report}");
    assert_eq!(report["agreement"]["differ"], 4, "{report}");
}

#[test]
fn malformed_lines_are_reported_by_number_and_two_configs_compare() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let mut log = String::new();
    for i in 0..40 {
        let second = i / 4;
        log.push_str(&format!(
            "203.0.113.7 - - [04/Dec/2026:10:00:{second:02} +0000] \"GET /api/{i} HTTP/1.1\" 200 2 \"-\" \"curl\"\n"
        ));
        if i == 10 {
            log.push_str("this is not a log line\n");
        }
    }
    log.push_str("198.51.100.1 - - [04/Dec/2026:10:00:20 +0000] \"GET /api/x HTTP/1.1\" 200 2 \"-\" \"curl\"\n");
    let log = write("access.log", &log);
    let base = "listeners: [{ name: plain, bind: '127.0.0.1:0' }]\nroutes:\n  - name: api\n    match: { path_prefix: /api }\n    respond: { body: ok }\n";
    let tight = write(
        "tight.yaml",
        &format!("{base}    limits: [{{ name: per_ip, algorithm: fixed_window, limit: 10, window: 1m, key: ip }}]\n"),
    );
    let loose = write(
        "loose.yaml",
        &format!("{base}    limits: [{{ name: per_ip, algorithm: fixed_window, limit: 30, window: 1m, key: ip }}]\n"),
    );

    let text = replay(&["--config", &tight, &log]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("41 requests"), "{text}");
    assert!(text.contains("access.log:12: no client address"), "{text}");
    assert!(text.contains("route api/per_ip"), "{text}");
    assert!(
        text.contains("30  ip:203.0.113.7"),
        "the key refused most:\n{text}"
    );

    let json = replay(&["--config", &tight, "--format", "json", &log]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["requests"], 41);
    assert_eq!(report["malformed"], 1);
    let limit = &report["limits"][0];
    assert_eq!(limit["refused"], 30, "{report}");
    assert_eq!(limit["first_refusal"], "2026-12-04T10:00:02Z");
    assert_eq!(limit["last_refusal"], "2026-12-04T10:00:09Z");
    assert_eq!(limit["peak_refusals_per_second"], 4);
    assert_eq!(limit["top_keys"][0]["key"], "ip:203.0.113.7");

    let diff = replay(&["--config", &loose, "--against", &tight, &log]);
    let diff = String::from_utf8_lossy(&diff.stdout);
    assert!(
        diff.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["route", "api/per_ip", "10", "30", "-20"]),
        "{diff}"
    );

    let missing = replay(&["--config", &tight, "/nonexistent/access.log"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/access.log"));
}

/// The README's migration walk-through prints what the README shows: its
/// commands run on `contrib/replay-sample/`, and their output is the
/// README's, line for line.
#[test]
fn the_readme_walk_through_prints_what_the_readme_shows() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let block = readme
        .split("<!-- replay-sample")
        .nth(1)
        .and_then(|rest| rest.split("```text\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("the README's replay-sample block");
    let mut lines = block.lines();
    let import = lines.next().unwrap();
    let replay_cmd = lines.next().unwrap();
    let shown: Vec<&str> = lines.collect();
    assert!(
        import.starts_with("$ target/release/tollgate import-nginx"),
        "{import}"
    );
    assert!(
        replay_cmd.starts_with("$ target/release/tollgate replay"),
        "{replay_cmd}"
    );

    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("tollgate.yaml");
    let args = |cmd: &str| -> Vec<String> {
        cmd.split_whitespace()
            .skip(2)
            .map(|a| a.replace("/tmp/tollgate.yaml", yaml.to_str().unwrap()))
            .collect()
    };
    let imported = Command::new(BIN)
        .args(args(import))
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        imported.status.success(),
        "{}",
        String::from_utf8_lossy(&imported.stderr)
    );
    let replayed = Command::new(BIN)
        .args(args(replay_cmd))
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        replayed.status.success(),
        "{}",
        String::from_utf8_lossy(&replayed.stderr)
    );
    let out = String::from_utf8(replayed.stdout)
        .unwrap()
        .replace(yaml.to_str().unwrap(), "/tmp/tollgate.yaml");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        shown,
        "README.md's replay output is stale"
    );
    assert!(out.contains("0 requests decided differently"), "{out}");
}
