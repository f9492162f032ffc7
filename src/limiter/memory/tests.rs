//! The memory store: all-or-nothing across limits, bounded size with LRU
//! eviction, incremental expiry, and no over-admission under two threads.

use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::limiter::algorithm::properties::increasing_times;
use crate::limiter::{Limit, Verdict};

fn limit(name: &str, algorithm: Algorithm, zone: usize) -> Limit {
    Limit::new(name, algorithm, zone)
}

fn store(limits: &[&Limit], size_bytes: u64) -> MemoryStore {
    let zones: Vec<ZoneSpec> = limits
        .iter()
        .map(|l| ZoneSpec {
            name: l.name.clone(),
            route: None,
            size_bytes,
        })
        .collect();
    MemoryStore::new(&zones)
}

fn check<'a>(limit: &'a Limit, key: &'a str) -> Check<'a> {
    Check::new(limit, key, 1)
}

#[test]
fn a_rejection_by_one_limit_charges_no_other() {
    let short = limit(
        "short",
        Algorithm::FixedWindow {
            limit: 2,
            window_ms: 1000,
        },
        0,
    );
    let long = limit(
        "long",
        Algorithm::FixedWindow {
            limit: 5,
            window_ms: 60_000,
        },
        1,
    );
    let s = store(&[&short, &long], 1 << 20);
    let both = [check(&short, "u"), check(&long, "u")];
    assert_eq!(s.decide_at(&both, 0).verdict(), Verdict::Allow);
    assert_eq!(s.decide_at(&both, 0).verdict(), Verdict::Allow);
    // Ten more in the same second: `short` rejects each, `long` must not pay.
    for _ in 0..10 {
        let o = s.decide_at(&both, 10);
        assert_eq!(o.verdict(), Verdict::Reject);
        assert_eq!(
            o.decisions[1].remaining, 2,
            "long still has 3 left; this one would take it to 2"
        );
    }
    // Next second: `long` still has its 3.
    for left in [2, 1] {
        let o = s.decide_at(&both, 1000);
        assert_eq!(o.verdict(), Verdict::Allow);
        assert_eq!(o.decisions[1].remaining, left);
    }
    // One left in `long`; this last check takes it.
    assert_eq!(o_remaining(&s, &long, 1000), 0);
}

fn o_remaining(s: &MemoryStore, l: &Limit, now: u64) -> u64 {
    s.decide_at(&[check(l, "u")], now).decisions[0].remaining
}

#[test]
fn most_restrictive_is_reported() {
    let a = limit(
        "a",
        Algorithm::FixedWindow {
            limit: 10,
            window_ms: 1000,
        },
        0,
    );
    let b = limit(
        "b",
        Algorithm::FixedWindow {
            limit: 3,
            window_ms: 60_000,
        },
        1,
    );
    let s = store(&[&a, &b], 1 << 20);
    let o = s.decide_at(&[check(&a, "k"), check(&b, "k")], 0);
    assert_eq!(o.most_restrictive(), Some(1));
    for _ in 0..2 {
        let _ = s.decide_at(&[check(&a, "k"), check(&b, "k")], 0);
    }
    let o = s.decide_at(&[check(&a, "k"), check(&b, "k")], 0);
    assert_eq!(o.verdict(), Verdict::Reject);
    assert_eq!(o.most_restrictive(), Some(1));
    assert_eq!(o.decisions[1].retry_after_ms, 60_000);
}

#[test]
fn far_more_keys_than_fit_stay_within_the_zone() {
    let l = limit(
        "z",
        Algorithm::TokenBucket {
            amount: 1,
            period_ms: 1000,
            burst: 5,
        },
        0,
    );
    let size = 64 * 1024;
    let s = store(&[&l], size);
    let cap = s.stats(0).capacity;
    assert!(
        cap >= 500 && cap * ENTRY_BYTES <= size as usize,
        "capacity {cap}"
    );
    for i in 0..100_000 {
        let key = format!("ip:10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
        let _ = s.decide_at(&[check(&l, &key)], 1);
    }
    let st = s.stats(0);
    assert!(st.keys <= cap, "{st:?}");
    assert!(st.evictions >= 100_000 - cap as u64, "{st:?}");
}

#[test]
fn the_least_recently_used_key_is_evicted_first() {
    let l = limit(
        "z",
        Algorithm::FixedWindow {
            limit: 1,
            window_ms: 3_600_000,
        },
        0,
    );
    let s = store(&[&l], (16 * ENTRY_BYTES) as u64); // one shard, 16 slots
    assert_eq!(s.stats(0).capacity, 16);
    assert_eq!(
        s.decide_at(&[check(&l, "hot")], 0).verdict(),
        Verdict::Allow
    );
    for i in 0..100 {
        // `hot` stays recently used (and over its limit) while others churn.
        assert_eq!(
            s.decide_at(&[check(&l, "hot")], 1).verdict(),
            Verdict::Reject,
            "round {i}"
        );
        let key = format!("cold{i}");
        let _ = s.decide_at(&[check(&l, &key)], 1);
    }
    assert_eq!(
        s.decide_at(&[check(&l, "hot")], 2).verdict(),
        Verdict::Reject,
        "hot was never evicted"
    );
    assert_eq!(
        s.decide_at(&[check(&l, "cold0")], 2).verdict(),
        Verdict::Allow,
        "cold0 was"
    );
}

#[test]
fn idle_keys_expire_as_requests_arrive() {
    let l = limit(
        "z",
        Algorithm::FixedWindow {
            limit: 5,
            window_ms: 1000,
        },
        0,
    );
    // 400 slots: one shard, so one key's traffic sweeps all of it.
    let s = store(&[&l], (400 * ENTRY_BYTES) as u64);
    for i in 0..50 {
        let key = format!("k{i}");
        let _ = s.decide_at(&[check(&l, &key)], 0);
    }
    assert_eq!(s.stats(0).keys, 50);
    // After the window each decision looks at two more slots under the hand.
    for _ in 0..30 {
        let _ = s.decide_at(&[check(&l, "active")], 5000);
    }
    let st = s.stats(0);
    assert_eq!(st.expirations, 50, "{st:?}");
    assert_eq!(st.keys, 1, "only the active key is left: {st:?}");
}

#[test]
fn sliding_logs_count_against_the_zone() {
    let l = limit(
        "log",
        Algorithm::SlidingLog {
            limit: 1000,
            window_ms: 60_000,
        },
        0,
    );
    let s = store(&[&l], 64 * 1024);
    for i in 0..200 {
        let key = format!("k{}", i % 50);
        for t in 0..20 {
            let _ = s.decide_at(&[check(&l, &key)], i * 20 + t);
        }
    }
    let st = s.stats(0);
    assert!(
        st.evictions > 0,
        "the logs outgrew the zone, so keys were evicted: {st:?}"
    );
    assert!(st.log_bytes <= 64 * 1024 + 64 * 1024 / 16, "{st:?}");
}

#[test]
fn two_threads_on_one_key_never_over_admit() {
    let l = Arc::new(limit(
        "c",
        Algorithm::FixedWindow {
            limit: 1000,
            window_ms: 3_600_000,
        },
        0,
    ));
    let s = Arc::new(store(&[&l], 1 << 20));
    let admitted: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (s, l) = (s.clone(), l.clone());
                scope.spawn(move || {
                    (0..5000)
                        .filter(|_| {
                            s.decide_at(&[check(&l, "one")], 10).verdict() == Verdict::Allow
                        })
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(admitted, 1000);

    // The same with two limits at once, all-or-nothing under contention.
    let a = Arc::new(limit(
        "a",
        Algorithm::Gcra {
            amount: 1,
            period_ms: 3_600_000,
            burst: 300,
        },
        0,
    ));
    let b = Arc::new(limit(
        "b",
        Algorithm::SlidingLog {
            limit: 500,
            window_ms: 3_600_000,
        },
        1,
    ));
    let s = Arc::new(store(&[&a, &b], 1 << 20));
    let admitted: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (s, a, b) = (s.clone(), a.clone(), b.clone());
                scope.spawn(move || {
                    (0..2000)
                        .filter(|_| {
                            s.decide_at(&[check(&a, "one"), check(&b, "one")], 10)
                                .verdict()
                                == Verdict::Allow
                        })
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(admitted, 300);
    assert_eq!(
        s.decide_at(&[check(&b, "one")], 10).decisions[0].remaining,
        199,
        "b was charged only 300 times"
    );
}

proptest! {
    /// The store's all-or-nothing decisions equal a reference that keeps
    /// each limit's state apart and charges only when both allow.
    fn all_or_nothing_never_charges_a_rejected_request_cases(
        l1 in 1u64..10, w1 in 1u64..300, amount in 1u64..5, burst in 1u64..10, trace in increasing_times(60)
    ) {
        let a = limit("a", Algorithm::SlidingWindow { limit: l1, window_ms: w1 }, 0);
        let b = limit("b", Algorithm::TokenBucket { amount, period_ms: 200, burst }, 1);
        let s = store(&[&a, &b], 1 << 16);
        let (mut ra, mut rb) = (State::Empty, State::Empty);
        for &(t, c) in &trace {
            let o = s.decide_at(&[Check::new(&a, "k", c), Check::new(&b, "k", c)], t);
            let da = a.algorithm.check(&mut ra, t, c);
            let db = b.algorithm.check(&mut rb, t, c);
            prop_assert_eq!(o.decisions[0], da);
            prop_assert_eq!(o.decisions[1], db);
            if da.admitted() && db.admitted() {
                a.algorithm.charge(&mut ra, t, c);
                b.algorithm.charge(&mut rb, t, c);
            }
        }
        crate::testing::case_passed();
    }
}

#[test]
fn all_or_nothing_never_charges_a_rejected_request() {
    crate::testing::count_cases(
        "all_or_nothing_never_charges_a_rejected_request",
        256,
        all_or_nothing_never_charges_a_rejected_request_cases,
    );
}

#[test]
fn groups_stop_at_an_enforced_rejection_and_never_at_a_dry_run() {
    let fixed = |n| Algorithm::FixedWindow {
        limit: n,
        window_ms: 60_000,
    };
    let (zone, dry, route) = (
        limit("zone", fixed(1), 0),
        limit("dry", fixed(1), 1),
        limit("route", fixed(5), 2),
    );
    let s = store(&[&zone, &dry, &route], 1 << 20);
    let checks = [
        Check::new(&zone, "k", 1),
        Check {
            dry_run: true,
            ..Check::new(&dry, "k", 1)
        },
        Check {
            group: 1,
            ..Check::new(&route, "k", 1)
        },
    ];
    // First request: everything admitted and charged.
    let o = s.decide_at(&checks, 1000);
    assert_eq!(o.decisions.len(), 3);
    assert!(o.decisions.iter().all(Decision::admitted));
    // Second: the zone rejects, so the dry run and route groups are not
    // decided (and not charged).
    let o = s.decide_at(&checks, 1001);
    assert_eq!(o.decisions.len(), 1);
    assert!(!o.decisions[0].admitted());
    let route_only = [Check::new(&route, "k", 1)];
    assert_eq!(s.decide_at(&route_only, 1002).decisions[0].remaining, 3);
    // A dry-run group that rejects does not stop the groups after it.
    let later = [
        Check {
            dry_run: true,
            ..Check::new(&dry, "k", 1)
        },
        Check {
            group: 1,
            ..Check::new(&route, "k", 1)
        },
    ];
    let o = s.decide_at(&later, 1003);
    assert_eq!(o.decisions.len(), 2);
    assert!(!o.decisions[0].admitted());
    assert_eq!(o.decisions[1].remaining, 2);
}

fn spec(name: &str, size_bytes: u64) -> ZoneSpec {
    ZoneSpec {
        name: Arc::from(name),
        route: None,
        size_bytes,
    }
}

fn left(s: &MemoryStore, l: &Limit, key: &str, now: u64) -> u64 {
    let mut n = 0;
    while s.decide_at(&[check(l, key)], now).verdict() != Verdict::Reject {
        n += 1;
        assert!(n < 1000);
    }
    n
}

#[test]
fn a_reload_keeps_shares_and_rescales_state_by_limit() {
    let five = Algorithm::SlidingLog {
        limit: 5,
        window_ms: 60_000,
    };
    let old_login = limit("login", five.clone(), 0);
    let old = MemoryStore::new(&[spec("login", 1 << 20)]);
    let now = old.now_ms();
    for _ in 0..4 {
        assert!(old.decide_at(&[check(&old_login, "ip:1")], now).decisions[0].admitted());
    }
    // Unchanged (and moved from partition 0 to 1): one left, and the zone
    // is shared with the old store while its requests finish.
    let kept = old.reloaded(
        &[spec("other", 1 << 20), spec("login", 1 << 20)],
        &[
            None,
            Some(Carry {
                from: 0,
                old: five.clone(),
                new: five.clone(),
            }),
        ],
    );
    let new_login = limit("login", five.clone(), 1);
    assert!(kept.decide_at(&[check(&new_login, "ip:1")], now).decisions[0].admitted());
    assert_eq!(
        old.decide_at(&[check(&old_login, "ip:1")], now).verdict(),
        Verdict::Reject,
        "the old store sees the new store's charge: one zone"
    );
    // 5 -> 10 with 5 used: 10 of 10.
    let ten = Algorithm::SlidingLog {
        limit: 10,
        window_ms: 60_000,
    };
    let old2 = MemoryStore::new(&[spec("login", 1 << 20)]);
    for _ in 0..4 {
        let _ = old2.decide_at(&[check(&old_login, "ip:2")], now);
    }
    let scaled = old2.reloaded(
        &[spec("login", 1 << 20)],
        &[Some(Carry {
            from: 0,
            old: five.clone(),
            new: ten.clone(),
        })],
    );
    assert_eq!(left(&scaled, &limit("login", ten, 0), "ip:2", now), 2);
    // Not carried: fresh.
    let fresh = old2.reloaded(&[spec("login", 1 << 20)], &[None]);
    assert_eq!(left(&fresh, &old_login, "ip:2", now), 5);
}

#[test]
fn a_smaller_zone_on_reload_keeps_the_most_recently_used_keys() {
    let alg = Algorithm::FixedWindow {
        limit: 3,
        window_ms: 60_000,
    };
    let l = limit("z", alg.clone(), 0);
    let old = MemoryStore::new(&[spec("z", 1 << 20)]);
    let now = old.now_ms();
    for i in 0..2000 {
        let _ = old.decide_at(&[check(&l, &format!("ip:{i}"))], now);
    }
    // Ten keys used again: marked recently used.
    let recent: Vec<String> = (0..10).map(|i| format!("ip:{}", i * 97)).collect();
    for k in &recent {
        let _ = old.decide_at(&[check(&l, k)], now);
    }
    let small = 64 * ENTRY_BYTES as u64;
    let new = old.reloaded(
        &[spec("z", small)],
        &[Some(Carry {
            from: 0,
            old: alg.clone(),
            new: alg.clone(),
        })],
    );
    let stats = new.stats(0);
    assert!(stats.keys <= stats.capacity && stats.keys > 0, "{stats:?}");
    for k in &recent {
        // Two used of three: one left, so the state came across.
        assert_eq!(left(&new, &l, k, now), 1, "{k} lost in the resize");
    }
}

#[test]
fn checks_sharing_a_key_count_each_in_their_own_limit_and_other_keys_apart() {
    let fixed = |name: &str, n: u64, zone: usize| {
        let alg = Algorithm::FixedWindow {
            limit: n,
            window_ms: 60_000,
        };
        limit(name, alg, zone)
    };
    let (zone, user, route) = (
        fixed("zone", 10, 0),
        fixed("user", 3, 1),
        fixed("route", 4, 2),
    );
    let s = store(&[&zone, &user, &route], 1 << 20);
    // A zone and a route limit on one key, a user limit on another, each
    // in a group of its own and then all in one group.
    let mut apart = [
        check(&zone, "ip:a"),
        check(&user, "user:b"),
        check(&route, "ip:a"),
    ];
    for (g, c) in apart.iter_mut().enumerate() {
        c.group = g as u8;
    }
    let together = [
        check(&zone, "ip:a"),
        check(&user, "user:b"),
        check(&route, "ip:a"),
    ];
    assert_eq!(s.decide_at(&apart, 0).verdict(), Verdict::Allow);
    assert_eq!(s.decide_at(&together, 0).verdict(), Verdict::Allow);
    assert_eq!(left(&s, &zone, "ip:a", 0), 8);
    assert_eq!(left(&s, &user, "user:b", 0), 1);
    assert_eq!(left(&s, &route, "ip:a", 0), 2);
    // Nothing was charged to the keys under the limits that did not see them.
    assert_eq!(left(&s, &user, "ip:a", 0), 3);
    assert_eq!(left(&s, &route, "user:b", 0), 4);
}

#[test]
fn a_key_that_changes_plan_keeps_the_share_it_used() {
    let window = |limit| Algorithm::FixedWindow {
        limit,
        window_ms: 3_600_000,
    };
    let free = limit("api", window(10), 0);
    let pro = free.with_numbers(window(100));
    let s = store(&[&free], 1 << 20);
    let now = 7_200_000;
    let left = |l: &Limit| s.decide_at(&[Check::new(l, "k", 1)], now).decisions[0];
    for _ in 0..49 {
        assert!(left(&pro).admitted());
    }
    // 50 of 100 used on pro is 5 of 10 on free: 5 left, not 10 (no free
    // burst from a downgrade) ...
    assert_eq!(left(&free).remaining, 4);
    // ... and back on pro, 6 of 10 is 60 of 100: no debt lost either.
    assert_eq!(left(&pro).remaining, 100 - 61);
    // Another key on the default numbers is not touched by any of it.
    assert_eq!(
        s.decide_at(&[Check::new(&free, "other", 1)], now).decisions[0].remaining,
        9
    );
    // A settled extra on the pro key is charged in pro's numbers.
    s.settle_at(&pro, "k", now, 0, 30);
    assert_eq!(left(&pro).remaining, 100 - 61 - 30 - 1);
}
