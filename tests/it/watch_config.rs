//! `tollgate run --watch` reloads the config when its file changes, as a
//! Kubernetes ConfigMap changes it: the kubelet writes the new files into
//! a fresh directory, points a temporary `..data` symlink at it and renames
//! that over `..data` (the config file itself a symlink through `..data`),
//! then removes the old directory. One reload per swap, counters kept; a
//! bad file keeps the running config and is not tried again until it
//! changes.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use crate::common::process::Running;
use crate::common::*;

fn config(body: &str) -> String {
    format!(
        "listeners: [{{ name: plain, bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0' }}
log: {{ format: json, access_log: false }}
routes:
  - match: {{ path: /x }}
    respond: {{ body: \"{body}\" }}
    limits: [{{ name: per_ip, algorithm: fixed_window, key: ip, limit: 10, window: 1h }}]
"
    )
}

/// The kubelet's swap: `text` into `..<stamp>/tollgate.yaml`, `..data`
/// pointed at it by a rename, the old directory removed.
fn swap(dir: &Path, stamp: u32, text: &str) {
    let fresh = dir.join(format!("..2026_12_05_12_00_0{stamp}.{stamp}"));
    std::fs::create_dir(&fresh).unwrap();
    std::fs::write(fresh.join("tollgate.yaml"), text).unwrap();
    let old = std::fs::read_link(dir.join("..data")).ok();
    symlink(fresh.file_name().unwrap(), dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).unwrap();
    }
}

async fn reloads(p: &Running, result: &str) -> f64 {
    let series = format!("tollgate_config_reloads_total{{result=\"{result}\"}}");
    value(&p.metrics().await, &series).unwrap_or(0.0)
}

async fn hit(p: &Running) -> (String, String) {
    let got = get(p.addr, "/x").await;
    let left = got.headers["x-ratelimit-remaining"]
        .to_str()
        .unwrap()
        .to_owned();
    (String::from_utf8_lossy(&got.body).into_owned(), left)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_swap_is_one_reload_within_two_seconds_counters_kept() {
    let dir = tempfile::tempdir().unwrap();
    swap(dir.path(), 1, &config("A"));
    symlink("..data/tollgate.yaml", dir.path().join("tollgate.yaml")).unwrap();
    let path = dir.path().join("tollgate.yaml").display().to_string();
    let root = dir.path().to_owned();
    let p = Running::run_in(dir, &path, &["--watch"]);
    for _ in 0..3 {
        assert_eq!(hit(&p).await.0, "A");
    }

    swap(&root, 2, &config("B"));
    let started = tokio::time::Instant::now();
    until(
        Duration::from_secs(2),
        "one reload after the swap",
        || async { reloads(&p, "ok").await == 1.0 },
    )
    .await;
    let took = started.elapsed();
    // The rest of the burst makes no second reload.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(reloads(&p, "ok").await, 1.0, "one reload for one swap");
    assert_eq!(
        hit(&p).await,
        ("B".into(), "6".into()),
        "the new config answers; the count of 3 kept (reloaded in {took:?})"
    );

    // A bad file: the running config stays, one error, not retried.
    swap(&root, 3, "listeners: []\n");
    until(Duration::from_secs(2), "the bad file refused", || async {
        reloads(&p, "error").await == 1.0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        reloads(&p, "error").await,
        1.0,
        "the same bad file is not tried again"
    );
    assert_eq!(hit(&p).await.0, "B");

    // Mended: reloaded again.
    swap(&root, 4, &config("C"));
    until(Duration::from_secs(2), "the mended file loaded", || async {
        reloads(&p, "ok").await == 2.0
    })
    .await;
    assert_eq!(hit(&p).await, ("C".into(), "4".into()), "still counting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_editors_write_and_rename_is_reloaded_and_without_watch_nothing_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, config("A")).unwrap();
    let (root, shown) = (dir.path().to_owned(), path.display().to_string());
    let p = Running::run_in(dir, &shown, &["--watch"]);
    assert_eq!(hit(&p).await.0, "A");
    let tmp = root.join(".tollgate.yaml.swp");
    std::fs::write(&tmp, config("B")).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    until(
        Duration::from_secs(2),
        "the renamed file loaded",
        || async { reloads(&p, "ok").await == 1.0 },
    )
    .await;
    assert_eq!(hit(&p).await.0, "B");

    let still = tempfile::tempdir().unwrap();
    let path = still.path().join("tollgate.yaml");
    std::fs::write(&path, config("A")).unwrap();
    let shown = path.display().to_string();
    let q = Running::run_in(still, &shown, &[]);
    std::fs::write(&path, config("B")).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        hit(&q).await.0,
        "A",
        "no --watch: the file is read on SIGHUP only"
    );
    assert_eq!(reloads(&q, "ok").await, 0.0);
}
