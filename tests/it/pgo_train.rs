//! The training workload of the profile-guided build (`scripts/pgo-build`
//! runs `examples/pgo_train.rs` on an instrumented tollgate) runs on this
//! build: every step gets the answers it expects. A config field it uses
//! that changed, or a path it trains that stopped answering, fails here
//! rather than in a release build.

#[allow(dead_code)]
#[path = "../../examples/pgo_train.rs"]
mod train;

use std::time::Duration;

use crate::common::process::BIN;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pgo_training_workload_runs_on_this_build() {
    crate::common::redis::need("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let step = Duration::from_millis(200);
    if let Err(e) = train::run(BIN, dir.path(), step).await {
        let log = |name| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
        let tail = |s: String| s.lines().rev().take(20).collect::<Vec<_>>().join("\n");
        panic!(
            "training failed: {e}\nmemory.log (last lines, newest first):\n{}\nredis.log:\n{}",
            tail(log("memory.log")),
            tail(log("redis.log"))
        );
    }
    // The run with the access log on logged the per-user route's answers
    // and the 429s (the Redis run checks Redis kept keys itself).
    let log = std::fs::read_to_string(dir.path().join("memory.log")).unwrap();
    for expect in [
        "\"status\":429",
        "\"route\":\"api\"",
        "\"user\":\"jwt:user-",
    ] {
        assert!(log.contains(expect), "memory.log has no {expect}");
    }
    assert!(
        dir.path().join("redis.yaml").exists(),
        "the Redis run was skipped"
    );
}
