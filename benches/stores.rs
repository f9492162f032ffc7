//! The two stores side by side: requests decided per second (three limits
//! each, as a zone and two route limits would be) and Redis script calls
//! per request, from 1, 16 and 64 concurrent callers, on one hot key and
//! spread over 10,000 keys. Starts its own `redis-server` on a free port.
//!
//! Run: `cargo bench --bench stores` (SECONDS=2 by default per case).

// A benchmark measures real time: the clock ban (`.clippy.toml`) is for
// the proxy.
#![allow(clippy::disallowed_methods)]

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::limiter::{Algorithm, Check, Limit, Store};
use tollgate::limiter::{MemoryStore, ZoneSpec};
use tollgate::limiter::{RedisOptions, RedisStore};

fn limits() -> Vec<Limit> {
    let huge = 1_000_000_000;
    vec![
        Limit::new(
            "per_ip",
            Algorithm::Leaky {
                rate_milli: huge * 1000,
                burst: 10_000_000,
                delay: u64::MAX,
            },
            0,
        ),
        Limit::new(
            "short",
            Algorithm::Gcra {
                amount: 1_000_000,
                period_ms: 1,
                burst: 1_000_000_000,
            },
            1,
        ),
        Limit::new(
            "long",
            Algorithm::SlidingWindow {
                limit: huge,
                window_ms: 3_600_000,
            },
            2,
        ),
    ]
}

async fn run<S: Store + 'static>(
    store: Arc<S>,
    limits: Arc<Vec<Limit>>,
    callers: usize,
    keys: u64,
    length: Duration,
) -> u64 {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + length;
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..callers {
        let (store, limits, done) = (store.clone(), limits.clone(), done.clone());
        tasks.spawn(async move {
            let mut i = c as u64;
            while Instant::now() < deadline {
                let key = format!("ip:10.0.{}.{}", (i % keys) / 256, (i % keys) % 256);
                let checks: Vec<Check<'_>> = limits
                    .iter()
                    .enumerate()
                    .map(|(n, l)| Check {
                        group: u8::from(n > 0),
                        ..Check::new(l, &key, 1)
                    })
                    .collect();
                let outcome = store.decide(&checks).await.expect("decides");
                assert!(
                    outcome.decisions.iter().all(|d| d.admitted()),
                    "{} {:?}",
                    std::any::type_name::<S>(),
                    outcome.decisions
                );
                done.fetch_add(1, Ordering::Relaxed);
                i += callers as u64;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    done.load(Ordering::Relaxed)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let seconds: u64 = std::env::var("SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let length = Duration::from_secs(seconds);
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let mut redis = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server not found: apt-get install -y redis-server");
    #[allow(clippy::disallowed_methods)] // before the runtime exists
    std::thread::sleep(Duration::from_millis(300));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let limits = Arc::new(limits());
        let zones: Vec<ZoneSpec> = limits
            .iter()
            .map(|l| ZoneSpec {
                name: l.name.clone(),
                route: None,
                size_bytes: 64 << 20,
            })
            .collect();
        let memory = Arc::new(MemoryStore::new(&zones));
        let options = RedisOptions {
            nodes: vec![format!("redis://127.0.0.1:{port}")],
            cluster: false,
            prefix: "bench:".into(),
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            breaker_failures: 5,
            probe_interval: Duration::from_millis(250),
            cache_rejections: true,
            tls_ca: None,
        };
        let (redis_store, warning) = RedisStore::connect(&options, &zones, &tollgate::clock::Clock::system()).await.expect("redis store");
        assert!(warning.is_none(), "{warning:?}");
        let redis_store = Arc::new(redis_store);
        println!("requests of 3 limits each, {seconds}s per case, 2 runtime threads, Redis on the same machine");
        println!("{:<10} {:>8} {:>14} {:>14} {:>7} {:>16}", "keys", "callers", "memory req/s", "redis req/s", "ratio", "redis calls/req");
        for keys in [1u64, 10_000] {
            for callers in [1usize, 16, 64] {
                let m = run(memory.clone(), limits.clone(), callers, keys, length).await;
                let before = redis_store.calls();
                let r = run(redis_store.clone(), limits.clone(), callers, keys, length).await;
                let calls = redis_store.calls() - before;
                let (m_rate, r_rate) = (m as f64 / length.as_secs_f64(), r as f64 / length.as_secs_f64());
                println!(
                    "{:<10} {:>8} {:>14.0} {:>14.0} {:>7.3} {:>16.3}",
                    keys,
                    callers,
                    m_rate,
                    r_rate,
                    r_rate / m_rate,
                    calls as f64 / r as f64
                );
            }
        }
    });
    let _ = redis.kill();
    let _ = redis.wait();
}
