//! The Redis store against a real `redis-server`: the same decisions as the
//! memory store for the same traces, every key with a TTL, and the script
//! reloaded transparently after `SCRIPT FLUSH`.

use std::time::Duration;

use crate::common::redis::RedisServer;
use crate::common::until_some;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tollgate::clock::Clock;
use tollgate::limiter::{Algorithm, Check, Limit, Store};
use tollgate::limiter::{MemoryStore, ZoneSpec};
use tollgate::limiter::{RedisOptions, RedisStore};

fn options(url: String, cache: bool) -> RedisOptions {
    RedisOptions {
        nodes: vec![url],
        cluster: false,
        prefix: "tollgate:".into(),
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        breaker_failures: 5,
        probe_interval: Duration::from_millis(100),
        cache_rejections: cache,
        tls_ca: None,
    }
}

fn zones(limits: &[Limit]) -> Vec<ZoneSpec> {
    limits
        .iter()
        .map(|l| ZoneSpec {
            name: l.name.clone(),
            route: None,
            size_bytes: 1 << 20,
        })
        .collect()
}

fn fixed_window(name: &str, limit: u64, window_ms: u64) -> Limit {
    Limit::new(name, Algorithm::FixedWindow { limit, window_ms }, 0)
}

/// A Redis store (no rejection cache) for one limit.
async fn connect_one(server: &RedisServer, limit: &Limit) -> RedisStore {
    let (redis, warning) = RedisStore::connect(
        &options(server.url(), false),
        &zones(std::slice::from_ref(limit)),
        &Clock::system(),
    )
    .await
    .unwrap();
    assert!(warning.is_none(), "{warning:?}");
    redis
}

fn every_algorithm() -> Vec<Limit> {
    let algorithms = [
        Algorithm::FixedWindow {
            limit: 7,
            window_ms: 1000,
        },
        Algorithm::SlidingWindow {
            limit: 9,
            window_ms: 1000,
        },
        Algorithm::SlidingLog {
            limit: 6,
            window_ms: 1000,
        },
        Algorithm::TokenBucket {
            amount: 5,
            period_ms: 1000,
            burst: 8,
        },
        Algorithm::Gcra {
            amount: 5,
            period_ms: 1000,
            burst: 8,
        },
        Algorithm::Gcra {
            amount: 3,
            period_ms: 700,
            burst: 2,
        },
        Algorithm::Gcra {
            amount: 1_000_000,
            period_ms: 1,
            burst: 3,
        },
        Algorithm::TokenBucket {
            amount: 1_000_000,
            period_ms: 1,
            burst: 3,
        },
        Algorithm::Leaky {
            rate_milli: 4000,
            burst: 5,
            delay: 2,
        },
        Algorithm::Leaky {
            rate_milli: 16,
            burst: 3,
            delay: u64::MAX,
        },
        Algorithm::Leaky {
            rate_milli: 2500,
            burst: 0,
            delay: 0,
        },
        // A day from midnight in Tokyo: 150 requests of a trace's 300.
        Algorithm::Quota {
            limit: 150,
            calendar: tollgate::limiter::Calendar::new(
                tollgate::limiter::Period::Day,
                tollgate::limiter::Zone::named("Asia/Tokyo").unwrap(),
            ),
        },
    ];
    algorithms
        .into_iter()
        .enumerate()
        .map(|(i, a)| Limit::new(&format!("alg{i}"), a, i))
        .collect()
}

/// Replays one random trace on both stores and compares every decision;
/// returns how many steps were compared.
async fn same_decisions(
    redis: &RedisStore,
    memory: &MemoryStore,
    checks: &[Check<'_>],
    seed: u64,
) -> usize {
    let mut compared = 0;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut now = 1_800_000_000_000u64 + rng.gen_range(0..1000);
    for step in 0..300 {
        now += match rng.gen_range(0..10) {
            0..=5 => rng.gen_range(0..40),
            6..=8 => rng.gen_range(40..400),
            _ => rng.gen_range(400..3000),
        };
        let cost = rng.gen_range(1..=2);
        // Leaky buckets are zones, and a zone always costs 1 (nginx has no
        // cost): with more, a drained entry and an expired one differ, and
        // Redis expires keys on its own clock, not on the pinned `now`.
        let cost_of = |c: &Check<'_>| match c.limit.algorithm {
            Algorithm::Leaky { .. } => 1,
            _ => cost,
        };
        let checks: Vec<Check<'_>> = checks
            .iter()
            .map(|c| Check {
                cost: cost_of(c),
                ..*c
            })
            .collect();
        let expected = memory.decide_at(&checks, now);
        let got = redis
            .decide_clocked(&checks, now)
            .await
            .expect("redis decides");
        assert_eq!(
            got,
            expected,
            "seed {seed}, step {step}, now {now}, cost {cost}, checks {:?}",
            checks
                .iter()
                .map(|c| &c.limit.algorithm)
                .collect::<Vec<_>>()
        );
        compared += 1;
    }
    compared
}

#[tokio::test]
async fn every_algorithm_decides_alike_on_redis_and_in_memory() {
    let server = RedisServer::start();
    let limits = every_algorithm();
    let (redis, warning) = RedisStore::connect(
        &options(server.url(), false),
        &zones(&limits),
        &Clock::system(),
    )
    .await
    .unwrap();
    assert!(warning.is_none(), "{warning:?}");
    let memory = MemoryStore::new(&zones(&limits));
    let mut compared = 0;
    for (i, limit) in limits.iter().enumerate() {
        for seed in 0..4 {
            let key = format!("solo:{seed}");
            compared += same_decisions(
                &redis,
                &memory,
                &[Check::new(limit, &key, 1)],
                100 * i as u64 + seed,
            )
            .await;
        }
    }
    println!("{compared} decisions compared");
    assert_eq!(compared, limits.len() * 4 * 300, "every seed's trace ran");
    assert!(server.keys_without_ttl("tollgate:*").is_empty());
}

#[tokio::test]
async fn groups_are_all_or_nothing_alike_on_both_stores() {
    let server = RedisServer::start();
    let limits = every_algorithm();
    let (redis, _) = RedisStore::connect(
        &options(server.url(), false),
        &zones(&limits),
        &Clock::system(),
    )
    .await
    .unwrap();
    let memory = MemoryStore::new(&zones(&limits));
    let mut compared = 0;
    for seed in 0..12u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // Three groups: two enforced limits, a dry-run one, then two more
        // enforced (one of them a peek, as for `count: {status}`).
        // Five distinct limits (each its own zone), in a random order.
        let mut order: Vec<usize> = (0..limits.len()).collect();
        order.shuffle(&mut rng);
        let pick: Vec<&Limit> = order[..5].iter().map(|&i| &limits[i]).collect();
        let key = format!("group:{seed}");
        let checks = [
            Check {
                group: 0,
                ..Check::new(pick[0], &key, 1)
            },
            Check {
                group: 0,
                ..Check::new(pick[1], &key, 1)
            },
            Check {
                group: 0,
                dry_run: true,
                ..Check::new(pick[2], &key, 1)
            },
            Check {
                group: 1,
                ..Check::new(pick[3], &key, 1)
            },
            Check {
                group: 1,
                peek: true,
                ..Check::new(pick[4], &key, 1)
            },
        ];
        compared += same_decisions(&redis, &memory, &checks, 1000 + seed).await;
    }
    println!("{compared} group decisions compared");
    assert_eq!(compared, 12 * 300, "every seed's trace ran");
    assert!(server.keys_without_ttl("tollgate:*").is_empty());
}

// Multi-thread: the mid-test restart moves the proxy's tasks to the
// other worker while it blocks (see common::redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_and_restart_are_invisible() {
    let mut server = RedisServer::start();
    let limit = fixed_window("flush", 1000, 60_000);
    let redis = connect_one(&server, &limit).await;
    for round in 0..20 {
        if round % 5 == 0 {
            server.cli(&["SCRIPT", "FLUSH"]);
        }
        let checks = [Check::new(&limit, "k", 1)];
        let outcome = redis
            .decide(&checks)
            .await
            .expect("decides after SCRIPT FLUSH");
        assert_eq!(outcome.decisions[0].remaining, 999 - round);
    }
    // A restart loses the state and the script; after reconnecting both
    // come back without an error reaching the caller.
    server.kill();
    server.restart();
    let outcome = until_some(Duration::from_secs(10), "decides again", || async {
        redis.decide(&[Check::new(&limit, "k", 1)]).await.ok()
    })
    .await;
    assert_eq!(outcome.decisions[0].remaining, 999);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_script_calls_and_stay_exact() {
    let server = RedisServer::start();
    let limit = fixed_window("batch", 300, 3_600_000);
    let redis = connect_one(&server, &limit).await;
    let redis = std::sync::Arc::new(redis);
    let limit = std::sync::Arc::new(limit);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..1000 {
        let (redis, limit) = (redis.clone(), limit.clone());
        tasks.spawn(async move {
            let checks = [Check::new(&limit, "hot", 1)];
            redis.decide(&checks).await.expect("decides").decisions[0]
        });
    }
    let mut remaining = Vec::new();
    while let Some(d) = tasks.join_next().await {
        let d = d.unwrap();
        if d.admitted() {
            remaining.push(d.remaining);
        }
    }
    // Exactly 300 admitted, each seeing its own place in the queue.
    remaining.sort_unstable();
    assert_eq!(remaining, (0..300).collect::<Vec<u64>>());
    let calls = redis.calls();
    assert!(
        calls < 1000,
        "{calls} script calls for 1000 requests: no batching"
    );
}

type Shared<T> = std::sync::Arc<T>;

/// A Redis server and a store for a fixed window of `limit` an hour, its
/// function loaded and its connection up (a call made on another key).
async fn warmed(name: &str, limit: u64) -> (RedisServer, Shared<Limit>, Shared<RedisStore>) {
    let server = RedisServer::start();
    let limit = Shared::new(fixed_window(name, limit, 3_600_000));
    let redis = Shared::new(connect_one(&server, &limit).await);
    let warm = [Check::new(&limit, "warm", 1)];
    assert!(redis.decide(&warm).await.unwrap().decisions[0].admitted());
    (server, limit, redis)
}

/// One request on the key "hot", decided (on a task of its own).
async fn decide_hot(
    redis: Shared<RedisStore>,
    limit: Shared<Limit>,
) -> tollgate::limiter::Decision {
    let checks = [Check::new(&limit, "hot", 1)];
    redis.decide(&checks).await.expect("decides").decisions[0]
}

/// Two calls go at once; while both are in flight, requests that arrive
/// wait for an answer and then go together in one call, in the order they
/// came: five requests 50 ms apart while Redis is paused cost three calls
/// (the first two alone, then the other three), where a call each would
/// have made it five and one call in flight two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_arriving_while_two_calls_are_in_flight_wait_and_go_together() {
    let (server, limit, redis) = warmed("together", 3).await;
    let before = redis.calls();
    server.cli(&["CLIENT", "PAUSE", "600", "ALL"]);
    let mut tasks = Vec::new();
    for _ in 0..5 {
        tasks.push(tokio::spawn(decide_hot(redis.clone(), limit.clone())));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut seen = Vec::new();
    for task in tasks {
        let d = task.await.unwrap();
        seen.push((d.admitted(), d.remaining));
    }
    assert_eq!(
        seen,
        [(true, 2), (true, 1), (true, 0), (false, 0), (false, 0)]
    );
    assert_eq!(
        redis.calls() - before,
        3,
        "one call each for the first two requests, one for the rest"
    );
}

/// A request whose bytes came in while another's job was being queued goes
/// in the same call: the batcher lets the event loop poll its sockets once
/// more before the call leaves. Here one request is woken by a read that
/// completes only at the next poll, after the first request's job has
/// woken the batcher (one thread: the order is the runtime's, not the
/// clock's). Without that pass they cost two calls.
#[tokio::test]
async fn a_request_woken_in_the_same_turn_joins_the_call() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_server, limit, redis) = warmed("turn", 10).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (mut accepted, _) = listener.accept().await.unwrap();
    let before = redis.calls();
    // Waits for a byte, then decides.
    let reader = tokio::spawn({
        let (redis, limit) = (redis.clone(), limit.clone());
        async move {
            let mut byte = [0u8; 1];
            accepted.read_exact(&mut byte).await.unwrap();
            decide_hot(redis, limit).await
        }
    });
    tokio::task::yield_now().await;
    // Sends that byte, then decides at once.
    let writer = tokio::spawn({
        let (redis, limit) = (redis.clone(), limit.clone());
        async move {
            client.write_all(b"x").await.unwrap();
            decide_hot(redis, limit).await
        }
    });
    let (w, r) = (writer.await.unwrap(), reader.await.unwrap());
    assert_eq!((w.remaining, r.remaining), (9, 8), "in the order they came");
    assert_eq!(redis.calls() - before, 1, "one call for both requests");
}

/// A reload that changes a limit's numbers: Redis rescales the stored state
/// the first time the new numbers read it (the numbers it was written
/// under are kept with it), as the memory store does at the reload. 4 of 5
/// used is 8 of 10 (two left), or all of 2 (none left), on every algorithm.
#[tokio::test]
async fn a_changed_limit_reads_old_state_rescaled_on_every_algorithm() {
    let server = RedisServer::start();
    let pairs = tollgate::testing::five_then_ten();
    let now = 1_000_000_000;
    let mut ran = 0;
    for (i, (old, new)) in pairs.into_iter().enumerate() {
        for (case, (to, expect)) in [(new.clone(), 2), (old.divided(2), 0), (old.clone(), 1)]
            .into_iter()
            .enumerate()
        {
            let name = format!("rescale{i}x{case}");
            let before = Limit::new(&name, old.clone(), 0);
            let after = Limit::new(&name, to.clone(), 0);
            let redis = connect_one(&server, &before).await;
            for _ in 0..4 {
                let o = redis
                    .decide_clocked(&[Check::new(&before, "k", 1)], now)
                    .await
                    .unwrap();
                assert!(o.decisions[0].admitted(), "{old:?}");
            }
            let mut left = 0;
            while redis
                .decide_clocked(&[Check::new(&after, "k", 1)], now)
                .await
                .unwrap()
                .decisions[0]
                .admitted()
            {
                left += 1;
                assert!(left < 100);
            }
            assert_eq!(left, expect, "{old:?} -> {to:?}");
            ran += 1;
        }
    }
    assert_eq!(ran, 21);
}

/// A Redis user whose ACL allows scripts but not functions (as a managed
/// Redis may): decisions go by `EVALSHA`, exactly as by `FCALL`.
#[tokio::test]
async fn a_user_without_functions_decides_by_script_alike() {
    let server = RedisServer::start();
    server.cli(&[
        "ACL",
        "SETUSER",
        "scripts",
        "on",
        ">only-scripts-pass",
        "~tollgate:*",
        "+evalsha",
        "+script|load",
        "+get",
        "+set",
        "+time",
        "+ping",
    ]);
    let limit = fixed_window("acl", 5, 3_600_000);
    let url = server
        .url()
        .replace("redis://", "redis://scripts:only-scripts-pass@");
    let (scripts, _) = RedisStore::connect(
        &options(url, false),
        &zones(std::slice::from_ref(&limit)),
        &Clock::system(),
    )
    .await
    .unwrap();
    let functions = connect_one(&server, &limit).await;
    assert_eq!(scripts.sent_as(), None, "before the first decision");
    // The two stores share the key: each admits in turn until 5.
    let mut remaining = Vec::new();
    for i in 0..6 {
        let store = if i % 2 == 0 { &scripts } else { &functions };
        let outcome = store.decide(&[Check::new(&limit, "k", 1)]).await.unwrap();
        remaining.push(
            outcome.decisions[0]
                .admitted()
                .then_some(outcome.decisions[0].remaining),
        );
    }
    assert_eq!(
        remaining,
        [Some(4), Some(3), Some(2), Some(1), Some(0), None]
    );
    assert_eq!(scripts.sent_as(), Some("script"));
    assert_eq!(functions.sent_as(), Some("function"));
}

/// decide.lua's answer, per request: its count, then 3 numbers per decided
/// check, the first its code.
fn per_request(answer: &[u8]) -> Vec<Vec<i64>> {
    let numbers: Vec<i64> = answer
        .chunks_exact(8)
        .map(|w| i64::from_be_bytes(w.try_into().unwrap()))
        .collect();
    let mut rest = &numbers[1..];
    let mut out = Vec::new();
    while let Some(&count) = rest.first() {
        let len = 1 + count as usize * 3;
        out.push(rest[..len].to_vec());
        rest = &rest[len..];
    }
    out
}

/// The verdicts (0 allow, 1 delay, 2 reject) of each request's checks.
fn verdicts(answer: &[u8]) -> Vec<Vec<i64>> {
    let verdict = |&code: &i64| match code {
        0 => 0,
        1.. => 1,
        _ => 2,
    };
    per_request(answer)
        .iter()
        .map(|r| r[1..].iter().step_by(3).map(verdict).collect())
        .collect()
}

/// Requests for decide.lua straight, "alg,p1,p2,p3,cost,peek,group,dry;"
/// per check, and the keys each uses: limits of 3 with a minute to refill
/// on every algorithm, nginx's 1r/m burst 2 (nodelay, then delay 1), and a
/// zone with a group of two and a dry-run group.
const SPECS: [(&str, usize); 8] = [
    ("1,3,60000,0,1,0,0,0;", 1),
    ("2,3,60000,0,1,0,0,0;", 1),
    ("3,3,60000,0,1,0,0,0;", 1),
    ("4,1,60000,3,1,0,0,0;", 1),
    ("5,1,60000,3,1,0,0,0;", 1),
    ("6,16,2,-1,1,0,0,0;", 1),
    ("6,16,2,1,1,0,0,0;", 1),
    (
        "6,16,5,-1,1,0,0,0;1,4,60000,0,1,0,1,0;1,2,60000,0,1,0,1,0;1,1,60000,0,1,0,2,1;",
        4,
    ),
];

/// A connection to `server` with decide.lua loaded as the store builds it:
/// the connection, the function's name, and the script form.
async fn decide_loaded(
    server: &RedisServer,
) -> (redis::aio::MultiplexedConnection, String, redis::Script) {
    let (library, function, script) = tollgate::limiter::decide_forms();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&library)
        .query_async(&mut conn)
        .await
        .expect("loads the library");
    (conn, function, script)
}

/// `FCALL function` with `keys` and `args`: decide.lua's answer.
async fn fcall(
    conn: &mut redis::aio::MultiplexedConnection,
    function: &str,
    keys: &[String],
    args: &[String],
) -> redis::RedisResult<Vec<u8>> {
    redis::cmd("FCALL")
        .arg(function)
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .query_async(conn)
        .await
}

/// One client's requests in a row reach the script as a run ("*<n>", then
/// their checks, their keys once). Decided straight by the script, on a
/// pinned clock: a run answers exactly as the same requests listed one by
/// one, on every algorithm, for a zone with an all-or-nothing group and a
/// dry-run group, and between other requests; after a larger call and in
/// an answer longer than one `struct.pack`; as a function (kept from call
/// to call) and as a script.
#[tokio::test]
async fn a_run_of_alike_requests_decides_as_the_requests_one_by_one() {
    let server = RedisServer::start();
    let (mut conn, function, script) = decide_loaded(&server).await;
    let now = 1_800_000_000_000u64;
    let mut seen = [0usize; 3];
    for (form, call) in [("function", "FCALL"), ("script", "EVALSHA")] {
        for (i, &(spec, nkeys)) in SPECS.iter().enumerate() {
            let (other, other_keys) = SPECS[(i + 1) % SPECS.len()];
            // This spec 3 times, the other once, this 4 times; a second
            // later, this twice (a smaller call after a larger one); then
            // 40 and the other 3 times (an answer of more than the 200
            // numbers packed at a time).
            let calls: [(&[(usize, bool)], u64); 3] = [
                (&[(3, true), (1, false), (4, true)], 0),
                (&[(2, true)], 1000),
                (&[(40, true), (3, false)], 2000),
            ];
            for (step, (requests, later)) in calls.into_iter().enumerate() {
                let mut answers = Vec::new();
                for runs in [false, true] {
                    let keys = |who: &str, n: usize| -> Vec<String> {
                        (0..n)
                            .map(|k| format!("runs:{form}:{i}:{runs}:{who}:{k}"))
                            .collect()
                    };
                    let (me, them) = (keys("me", nkeys), keys("other", other_keys));
                    let mut all_keys = Vec::new();
                    let mut args = vec![(now + later).to_string()];
                    for &(n, mine) in requests {
                        let (k, checks) = if mine { (&me, spec) } else { (&them, other) };
                        let mut listed = n;
                        if runs && n > 1 {
                            args.push(format!("*{n}"));
                            listed = 1;
                        }
                        for _ in 0..listed {
                            args.push(checks.to_owned());
                            all_keys.extend(k.iter().cloned());
                        }
                    }
                    let answer = if call == "FCALL" {
                        fcall(&mut conn, &function, &all_keys, &args).await
                    } else {
                        script
                            .key(&all_keys)
                            .arg(&args)
                            .invoke_async(&mut conn)
                            .await
                    };
                    let answer =
                        answer.unwrap_or_else(|e| panic!("{form}, {spec}, runs {runs}: {e}"));
                    answers.push(answer);
                }
                let (one_by_one, runs) = (&answers[0], &answers[1]);
                assert_eq!(
                    verdicts(runs),
                    verdicts(one_by_one),
                    "{form}, {spec}, call {step}: verdicts"
                );
                assert_eq!(
                    runs, one_by_one,
                    "{form}, {spec}, call {step}: every number"
                );
                for v in verdicts(one_by_one).into_iter().flatten() {
                    seen[v as usize] += 1;
                }
            }
        }
    }
    // The requests were admitted, delayed and refused.
    assert!(seen.iter().all(|&n| n > 0), "verdicts seen: {seen:?}");
}

/// A peek (the admin API's look at a key, the checks sent around a cached
/// rejection) decides without charging, even when the same call goes on to
/// charge the same key: the charged requests of a call with peeks between
/// them, alone and as a run, answer exactly as those requests alone, on
/// every algorithm and for a zone with groups. (The script writes a state
/// over in place when nothing can take its charge back; a peek must not.)
#[tokio::test]
async fn peeks_between_requests_of_one_call_charge_nothing() {
    let server = RedisServer::start();
    let (mut conn, function, _) = decide_loaded(&server).await;
    let now = 1_800_000_000_000u64;
    for (i, &(spec, nkeys)) in SPECS.iter().enumerate() {
        // the same checks, each a peek
        let peek: String = spec
            .split_terminator(';')
            .map(|check| {
                let mut fields: Vec<&str> = check.split(',').collect();
                fields[5] = "1";
                fields.join(",") + ";"
            })
            .collect();
        let mut charged = Vec::new();
        for with_peeks in [false, true] {
            let keys: Vec<String> = (0..nkeys)
                .map(|k| format!("peeks:{i}:{with_peeks}:{k}"))
                .collect();
            // (argument, a run's count, charged)
            let mut calls = vec![(spec, 1, true), (spec, 1, true)];
            if with_peeks {
                calls = vec![
                    (spec, 1, true),
                    (&peek, 1, false),
                    (&peek, 3, false),
                    (spec, 1, true),
                    (&peek, 1, false),
                ];
            }
            calls.extend([(spec, 3, true), (spec, 1, true)]);
            let mut args = vec![now.to_string()];
            let mut all_keys = Vec::new();
            let mut charges = Vec::new();
            for &(arg, n, charges_it) in &calls {
                if n > 1 {
                    args.push(format!("*{n}"));
                }
                args.push(arg.to_owned());
                all_keys.extend(keys.iter().cloned());
                charges.extend(std::iter::repeat_n(charges_it, n));
            }
            let answer = fcall(&mut conn, &function, &all_keys, &args)
                .await
                .unwrap_or_else(|e| panic!("{spec}: {e}"));
            let requests = per_request(&answer);
            assert_eq!(
                requests.len(),
                charges.len(),
                "{spec}: one answer a request"
            );
            let mine: Vec<Vec<i64>> = requests
                .into_iter()
                .zip(charges)
                .filter_map(|(r, charges_it)| charges_it.then_some(r))
                .collect();
            charged.push(mine);
        }
        assert_eq!(
            charged[1], charged[0],
            "{spec}: peeks changed what was charged"
        );
        // The limits are of 3 (the zone's burst 2 or 5, a group's limit 2):
        // some check refused.
        assert!(
            charged[0]
                .iter()
                .any(|r| r[1..].iter().step_by(3).any(|&code| code < 0)),
            "{spec}: nothing refused: {:?}",
            charged[0]
        );
    }
}

/// A calendar quota near a period's boundary, on replicas whose clocks
/// disagree with Redis's: each sends the period its own clock is in, and
/// Redis's clock picks the period counted, so they share one count. Here
/// decide.lua runs straight, its clock pinned to stand for Redis `TIME`.
#[tokio::test]
async fn a_quota_counts_the_period_redis_is_in_whatever_the_replicas_clocks() {
    let server = RedisServer::start();
    let (mut conn, function, _) = decide_loaded(&server).await;
    let day = 86_400_000u64;
    let midnight = 1_800_000_000_000u64 - 1_800_000_000_000u64 % day;
    // (Redis's clock, the period the replica sends): code, remaining, reset.
    let mut decide = async |redis_now: u64, start: u64| {
        let args = vec![
            redis_now.to_string(),
            format!("7,3,{start},{},1,0,0,0;", start + day),
        ];
        let key = ["quota:skew".to_owned()];
        let answer = fcall(&mut conn, &function, &key, &args).await.unwrap();
        let r = &per_request(&answer)[0];
        (r[1], r[2], r[3] as u64)
    };
    // Redis: 100 ms before midnight. A replica whose clock is 200 ms
    // ahead already sends tomorrow: it is counted today, reset at midnight.
    assert_eq!(decide(midnight - 100, midnight).await, (0, 2, 100));
    // A replica on time, today: the same count.
    assert_eq!(decide(midnight - 50, midnight - day).await, (0, 1, 50));
    // Redis: past midnight. A replica 300 ms behind still sends today:
    // tomorrow is counted, from 3 again, its end estimated a day on.
    assert_eq!(
        decide(midnight + 10, midnight - day).await,
        (0, 2, day - 10)
    );
    // The replica ahead, on time now: the same period and count.
    assert_eq!(decide(midnight + 20, midnight).await, (0, 1, day - 20));
    assert_eq!(decide(midnight + 30, midnight).await.1, 0);
    let refused = decide(midnight + 40, midnight - day).await;
    assert!(refused.0 < 0 && refused.2 == day - 40, "{refused:?}");
    let ttl: u64 = server.cli(&["PTTL", "quota:skew"]).parse().unwrap();
    assert!(ttl >= day - 60_000, "lives to the period's end: {ttl}");
}
