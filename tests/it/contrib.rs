//! `contrib/`: the Grafana dashboard and the Prometheus alert rules name
//! only metrics a running tollgate exports (read off a live scrape, on the
//! Redis store so its families are there too), and the rules pass
//! `promtool check rules` and their unit tests (`promtool test rules`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::redis::RedisServer;
use crate::common::*;

fn contrib(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("contrib")
        .join(path)
}

/// The names PromQL can select in an exposition: from each `# TYPE` line,
/// a counter's `_total`, a histogram's `_bucket`, `_sum` and `_count`, a
/// gauge's own name.
fn exported(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "counter" => {
                names.insert(format!("{}_total", name.trim_end_matches("_total")));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// Every `tollgate_...` metric name in a PromQL expression.
fn named_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("tollgate_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        out.push(name);
    }
    out
}

/// The exposition of a tollgate on Redis that has served a request.
async fn live_exposition() -> String {
    let redis = RedisServer::start();
    let proxy = TestProxy::spawn(&format!(
        "listeners: [{{ name: plain, bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0' }}
log: {{ access_log: false }}
store: {{ kind: redis, url: '{}', timeout: 500ms }}
alerts:
  rules: [{{ name: flood, limit: all, rejections: 100, per: 1m }}]
routes:
  - match: {{ path_prefix: / }}
    respond: {{ body: ok }}
    limits: [{{ name: all, algorithm: fixed_window, key: global, limit: 100000, window: 1h }}]
",
        redis.url()
    ))
    .await;
    assert_eq!(get(proxy.addr(), "/").await.status, 200);
    let got = get(proxy.admin.unwrap(), "/metrics").await;
    assert_eq!(got.status, 200);
    String::from_utf8(got.body.to_vec()).unwrap()
}

/// Every `"expr"` string anywhere in the dashboard's JSON.
fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_the_rules_name_only_metrics_tollgate_exports() {
    let exported = exported(&live_exposition().await);
    assert!(
        exported.contains("tollgate_requests_total")
            && exported.contains("tollgate_store_breaker_open"),
        "{exported:?}"
    );

    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(contrib("grafana/tollgate.json")).unwrap())
            .expect("contrib/grafana/tollgate.json is not JSON");
    let mut queries = Vec::new();
    exprs(&dashboard, &mut queries);
    assert!(queries.len() >= 15, "{} queries", queries.len());
    let rules: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(contrib("prometheus/tollgate.rules.yml")).unwrap(),
    )
    .unwrap();
    let rule_exprs: Vec<String> = rules["groups"][0]["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r["expr"].as_str().unwrap().to_owned())
        .collect();
    assert!(rule_exprs.len() >= 8, "{rule_exprs:?}");

    let mut unknown = Vec::new();
    let mut used = BTreeSet::new();
    for expr in queries.iter().chain(&rule_exprs) {
        for name in named_in(expr) {
            if !exported.contains(&name) {
                unknown.push(format!("{name} in {expr}"));
            }
            used.insert(name);
        }
    }
    assert!(
        unknown.is_empty(),
        "not exported by tollgate:\n{}",
        unknown.join("\n")
    );
    // What the issue asks the dashboard to show, by the metric behind it.
    for needed in [
        "tollgate_requests_total",
        "tollgate_limit_decisions_total",
        "tollgate_store_calls_total",
        "tollgate_store_fallback_total",
        "tollgate_alerts_total",
        "tollgate_upstream_requests_total",
        "tollgate_upstream_duration_seconds_bucket",
    ] {
        assert!(used.contains(needed), "nothing uses {needed}");
    }
    // The check itself sees a name tollgate does not export.
    assert_eq!(
        named_in("rate(tollgate_nope_total[5m])"),
        ["tollgate_nope_total"]
    );
    assert!(!exported.contains("tollgate_nope_total"));
}

fn promtool(args: &[&str]) -> std::process::Output {
    Command::new("promtool")
        .args(args)
        .current_dir(contrib("prometheus"))
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "promtool not found ({e}): install it with `apt-get install prometheus` (scripts/test does)"
            )
        })
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let check = promtool(&["check", "rules", "tollgate.rules.yml"]);
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "promtool check rules: {out}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(out.contains("11 rules found"), "{out}");
    let test = promtool(&["test", "rules", "tollgate.rules.test.yml"]);
    let out = String::from_utf8_lossy(&test.stdout);
    assert!(
        test.status.success(),
        "promtool test rules: {out}{}",
        String::from_utf8_lossy(&test.stderr)
    );
    assert!(out.contains("SUCCESS"), "{out}");
}
