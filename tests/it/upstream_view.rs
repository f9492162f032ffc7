//! The operator's view of the upstream tier in a real browser: the
//! dashboard's table lists each target with its state (up, down until a
//! time after its failures, drained from the admin API), its requests in
//! flight against `max_conns`, and its last failure with the reason.

use std::time::Duration;

use crate::common::browser::Browser;
use crate::common::*;

const TOKEN: &str = "operator-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_each_target_state_in_a_real_browser() {
    let (live_up, spare_up) = (Upstream::spawn().await, Upstream::spawn().await);
    let (live, spare) = (live_up.addr, spare_up.addr);
    let refused = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let yaml = format!(
        "listeners: [{{ bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0', token: ['{TOKEN}'] }}
log: {{ access_log: false }}
upstreams:
  api:
    targets:
      - {{ address: '{live}', max_conns: 50 }}
      - '{refused}'
      - {{ address: '{spare}', backup: true }}
routes: [{{ match: {{ path_prefix: / }}, upstream: api }}]
"
    );
    let proxy = TestProxy::spawn(&yaml).await;
    // The refusing target fails once and is marked down; every client is
    // answered by the live one.
    let mut c = h1(proxy.addr()).await;
    for _ in 0..4 {
        assert_eq!(
            send1(&mut c, request("GET", "/", empty())).await.status,
            200
        );
    }
    let drain = admin_with(
        &proxy,
        TOKEN,
        "PUT",
        &format!("/api/upstreams/api/{spare}"),
        Some(r#"{"down": true}"#),
    )
    .await;
    assert_eq!(drain.status, 200);

    let admin = proxy.admin.unwrap();
    let mut browser = Browser::launch(1280, 1000).await;
    browser.open_dashboard(admin, TOKEN).await;
    let row = |target: &str| {
        format!(
            "(() => {{ const r = document.querySelector('#upstreams tr[data-target=\"{target}\"]'); \
             return r ? [...r.children].map(c => c.textContent) : null; }})()"
        )
    };
    let cells = |v: serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_owned())
            .collect()
    };
    let live_row = cells(
        browser
            .wait_for(&row(&live.to_string()), Duration::from_secs(20))
            .await,
    );
    assert_eq!(live_row[0], "api");
    assert_eq!(live_row[2], "up");
    assert_eq!(
        live_row[3], "0 / 50",
        "in flight against max_conns: {live_row:?}"
    );
    assert_eq!(live_row[4], "4", "responses: {live_row:?}");
    let refused_row = cells(browser.eval(&row(&refused.to_string())).await);
    assert!(refused_row[2].starts_with("down until "), "{refused_row:?}");
    assert_eq!(refused_row[5], "1", "one failure: {refused_row:?}");
    assert!(refused_row[7].starts_with("error at "), "{refused_row:?}");
    let spare_row = cells(browser.eval(&row(&spare.to_string())).await);
    assert_eq!(spare_row[2], "draining (backup)", "{spare_row:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_limit_its_queue_and_what_was_shed() {
    let backend = crate::shedding::Workers::spawn(4, Duration::from_millis(600)).await;
    let yaml = format!(
        "listeners: [{{ bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0', token: ['{TOKEN}'] }}
log: {{ access_log: false }}
priorities: {{ classes: [critical, standard, bulk], default: bulk }}
upstreams:
  api:
    targets: ['{}']
    concurrency: {{ min: 1, max: 1 }}
    queue: {{ size: 1, timeout: 100ms }}
routes: [{{ match: {{ path_prefix: / }}, upstream: api }}]
",
        backend.addr
    );
    let proxy = TestProxy::spawn(&yaml).await;
    let addr = proxy.addr();
    // One served, one waits its 100 ms and is shed, one finds the queue full.
    let mut all = tokio::task::JoinSet::new();
    for i in 0..3u64 {
        all.spawn(async move {
            tokio::time::sleep(Duration::from_millis(30 * i)).await;
            get(addr, "/").await.status.as_u16()
        });
    }
    let mut got = all.join_all().await;
    got.sort();
    assert_eq!(got, vec![200, 503, 503]);

    let mut browser = Browser::launch(1280, 1200).await;
    browser.open_dashboard(proxy.admin.unwrap(), TOKEN).await;
    let row = browser
        .wait_for(
            "(() => { const r = document.querySelector('#protect tr[data-upstream=\"api\"]'); \
             return r && r.querySelector('polyline') ? [...r.children].map(c => c.textContent) : null; })()",
            Duration::from_secs(20),
        )
        .await;
    let cells: Vec<&str> = row
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(cells[0], "api");
    // Too few answers yet to have measured the backend's latency.
    assert_eq!(cells[1], "1 (measuring)", "the limit: {cells:?}");
    assert_eq!(cells[3], "0 / 1", "queued of its size: {cells:?}");
    assert_eq!(
        cells[5], "critical 0 · standard 0 · bulk 2",
        "shed by class: {cells:?}"
    );
    let visible = browser
        .eval("!document.getElementById('protect-section').hidden")
        .await;
    assert_eq!(visible, true);
}
