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
