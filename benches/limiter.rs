//! The rate-limit engine on its own: nanoseconds per decision for every
//! algorithm, on one hot key and across a million keys, from one thread and
//! from two; and the bytes each tracked key costs in the memory store,
//! measured with a counting allocator.
//!
//! Run: `cargo bench --bench limiter`. The bytes-per-key table is printed
//! first.

// A benchmark measures real time: the clock ban (`.clippy.toml`) is for
// the proxy.
#![allow(clippy::disallowed_methods)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use tollgate::limiter::{Algorithm, Check, Limit};
use tollgate::limiter::{MemoryStore, ZoneSpec, ENTRY_BYTES};

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const MANY: usize = 1_000_000;

fn algorithms() -> Vec<(&'static str, Algorithm)> {
    vec![
        (
            "fixed_window",
            Algorithm::FixedWindow {
                limit: u32::MAX as u64,
                window_ms: 60_000,
            },
        ),
        (
            "sliding_window",
            Algorithm::SlidingWindow {
                limit: u32::MAX as u64,
                window_ms: 60_000,
            },
        ),
        (
            "sliding_log",
            Algorithm::SlidingLog {
                limit: 100,
                window_ms: 1_000,
            },
        ),
        (
            "token_bucket",
            Algorithm::TokenBucket {
                amount: 1_000_000,
                period_ms: 1,
                burst: 1_000_000,
            },
        ),
        (
            "gcra",
            Algorithm::Gcra {
                amount: 1_000_000,
                period_ms: 1,
                burst: 1_000_000,
            },
        ),
        (
            "leaky",
            Algorithm::Leaky {
                rate_milli: 1_000_000_000,
                burst: 1_000_000,
                delay: u64::MAX,
            },
        ),
        (
            "quota",
            Algorithm::Quota {
                limit: 1 << 50,
                calendar: tollgate::limiter::Calendar::new(
                    tollgate::limiter::Period::Month,
                    tollgate::limiter::Zone::named("Europe/Berlin").unwrap(),
                ),
            },
        ),
    ]
}

/// Writes key number `i` the way the proxy builds one per request (into a
/// reused buffer), so the bench measures the store, not a million scattered
/// strings.
fn key_into(buf: &mut String, i: usize) -> &str {
    use std::fmt::Write;
    buf.clear();
    let _ = write!(buf, "ip:10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
    buf.as_str()
}

fn setup(alg: &Algorithm, size: u64) -> (Arc<MemoryStore>, Arc<Limit>) {
    let store = MemoryStore::new(&[ZoneSpec {
        name: "bench".into(),
        route: None,
        size_bytes: size,
    }]);
    (
        Arc::new(store),
        Arc::new(Limit::new("bench", alg.clone(), 0)),
    )
}

/// One request of cost 1 on `key`.
fn one<'a>(limit: &'a Limit, key: &'a str) -> [Check<'a>; 1] {
    [Check::new(limit, key, 1)]
}

/// Tracks keys 0..MANY in the store.
fn fill(store: &MemoryStore, limit: &Limit, buf: &mut String, now: u64) {
    for i in 0..MANY {
        let _ = store.decide_at(&one(limit, key_into(buf, i)), now);
    }
}

/// Live heap bytes per tracked key once a zone sized for `MANY` keys is full.
fn bytes_per_key() {
    println!("\nbytes per tracked key ({MANY} keys; ENTRY_BYTES budget = {ENTRY_BYTES}):");
    let mut buf = String::new();
    for (name, alg) in algorithms() {
        let before = LIVE.load(Ordering::Relaxed);
        let (store, limit) = setup(&alg, (MANY * ENTRY_BYTES) as u64);
        let empty = LIVE.load(Ordering::Relaxed) - before;
        let now = store.now_ms();
        fill(&store, &limit, &mut buf, now);
        let stats = store.stats(0);
        let used = LIVE.load(Ordering::Relaxed) - before;
        println!(
            "  {name:<15} {:>6.1} bytes/key  (empty zone {:.1} MB; {} keys kept, {} evicted, log heap {} bytes)",
            used as f64 / stats.keys as f64,
            empty as f64 / 1e6,
            stats.keys,
            stats.evictions,
            stats.log_bytes
        );
        drop(store);
    }
    println!();
}

fn bench(c: &mut Criterion) {
    bytes_per_key();
    let mut buf = String::new();
    for (name, alg) in algorithms() {
        let mut group = c.benchmark_group(format!("decide/{name}"));
        group
            .measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_secs(1));

        let (store, limit) = setup(&alg, 256 << 20);
        group.bench_function("1 key, 1 thread", |b| {
            let now = store.now_ms();
            b.iter(|| store.decide_at(black_box(&one(&limit, "ip:10.0.0.1")), now))
        });

        let (store, limit) = setup(&alg, 256 << 20);
        let now = store.now_ms();
        fill(&store, &limit, &mut buf, now);
        group.bench_function("1M keys, 1 thread", |b| {
            let mut i = 0usize;
            b.iter(|| {
                i = (i + 7919) % MANY;
                let key = key_into(&mut buf, i);
                store.decide_at(black_box(&one(&limit, key)), now)
            })
        });

        for (label, spread) in [("1 key, 2 threads", false), ("1M keys, 2 threads", true)] {
            group.bench_function(label, |b| {
                b.iter_custom(|iters| {
                    let started = Instant::now();
                    std::thread::scope(|s| {
                        for t in 0..2usize {
                            let (store, limit) = (&store, &limit);
                            s.spawn(move || {
                                let mut buf = String::new();
                                let mut i = t * 500_000;
                                for _ in 0..iters / 2 {
                                    i = (i + 7919) % MANY;
                                    let key = if spread {
                                        key_into(&mut buf, i)
                                    } else {
                                        "ip:10.0.0.1"
                                    };
                                    let _ = store.decide_at(&one(limit, key), now);
                                }
                            });
                        }
                    });
                    // Wall time for the pair: per-decision throughput of two cores.
                    started.elapsed()
                })
            });
        }
        group.finish();
    }
    plans(c);
}

/// What plans and settled costs add to a decision: a token bucket over a
/// million keys decided under a plan's numbers (the store keeps which
/// numbers each key was written under), and a settlement of one unit.
fn plans(c: &mut Criterion) {
    let mut buf = String::new();
    let alg = Algorithm::TokenBucket {
        amount: 1_000_000,
        period_ms: 1000,
        burst: 1_000_000,
    };
    let mut group = c.benchmark_group("plans/token_bucket");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let (store, own) = setup(&alg, 256 << 20);
    let plan = own.with_numbers(Algorithm::TokenBucket {
        amount: 2_000_000,
        period_ms: 1000,
        burst: 2_000_000,
    });
    let now = store.now_ms();
    fill(&store, &plan, &mut buf, now);
    group.bench_function("1M keys, a plan's numbers", |b| {
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 7919) % MANY;
            let key = key_into(&mut buf, i);
            store.decide_at(black_box(&one(&plan, key)), now)
        })
    });
    group.bench_function("1M keys, settle one unit back", |b| {
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 7919) % MANY;
            let key = key_into(&mut buf, i);
            store.settle_at(black_box(&plan), key, now, 0, -1)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
