use super::*;
use crate::config::HashKey;

fn targets(spec: &[(u32, bool, bool)]) -> Vec<Target> {
    spec.iter()
        .enumerate()
        .map(|(i, &(weight, backup, down))| Target {
            weight,
            backup,
            down,
            ..crate::config::upstreams::parse_target(&format!("127.0.0.1:{}", 9000 + i)).unwrap()
        })
        .collect()
}

fn sequence(b: &Balancer, n: usize, usable: impl Fn(usize) -> bool) -> String {
    (0..n)
        .map(|_| {
            b.pick(&mut Pick::default(), &usable, |_| 0)
                .map_or('-', |i| (b'a' + i as u8) as char)
        })
        .collect()
}

#[test]
fn weights_are_spread_smoothly_in_nginx_order() {
    let b = Balancer::new(
        &targets(&[(5, false, false), (1, false, false), (1, false, false)]),
        &Balance::RoundRobin,
    );
    assert_eq!(sequence(&b, 14, |_| true), "aabacaaaabacaa");
    let even = Balancer::new(&targets(&[(1, false, false); 3]), &Balance::RoundRobin);
    assert_eq!(sequence(&even, 6, |_| true), "abcabc");
}

#[test]
fn backups_only_when_no_primary_is_usable_and_down_never() {
    let b = Balancer::new(
        &targets(&[(1, false, false), (1, false, true), (1, true, false)]),
        &Balance::RoundRobin,
    );
    assert_eq!(sequence(&b, 3, |_| true), "aaa");
    assert_eq!(sequence(&b, 2, |i| i != 0), "cc");
    assert_eq!(sequence(&b, 1, |i| i == 1), "-");
    let one = Balancer::new(&targets(&[(3, false, true)]), &Balance::RoundRobin);
    assert_eq!(sequence(&one, 1, |_| true), "-");
}

#[test]
fn least_conn_takes_the_least_loaded_per_weight_and_ties_by_round_robin() {
    let b = Balancer::new(
        &targets(&[(1, false, false), (2, false, false), (1, false, false)]),
        &Balance::LeastConn,
    );
    let load = [3u32, 4, 1];
    let pick = |b: &Balancer, load: &[u32]| b.pick(&mut Pick::default(), |_| true, |i| load[i]);
    assert_eq!(pick(&b, &load), Some(2));
    // 2/2 == 1/1: the tie goes round robin among b and c (b's weight 2).
    let tied = [3u32, 2, 1];
    let picks: String = (0..6)
        .map(|_| (b'a' + pick(&b, &tied).unwrap() as u8) as char)
        .collect();
    assert_eq!(picks.matches('b').count(), 4, "{picks}");
    assert_eq!(picks.matches('c').count(), 2, "{picks}");
}

#[test]
fn random_two_takes_the_less_loaded_of_two() {
    let b = Balancer::new(
        &targets(&[(1, false, false); 2]),
        &Balance::Random { two: true },
    );
    for _ in 0..50 {
        assert_eq!(
            b.pick(&mut Pick::default(), |_| true, |i| [5, 1][i]),
            Some(1)
        );
    }
    // Only one usable: that one, never a hang.
    assert_eq!(b.pick(&mut Pick::default(), |i| i == 0, |_| 0), Some(0));
}

fn keyed(b: &Balancer, key: &str) -> usize {
    let mut p = Pick::new(BalanceKey::Bytes(key.as_bytes().to_vec()));
    b.pick(&mut p, |_| true, |_| 0).unwrap()
}

#[test]
fn a_key_always_lands_on_the_same_target_and_moves_on_when_it_is_down() {
    let key = HashKey(vec![crate::config::KeyPart::Path]);
    for consistent in [false, true] {
        let b = Balancer::new(
            &targets(&[(1, false, false); 3]),
            &Balance::Hash {
                key: key.clone(),
                consistent,
            },
        );
        let first = keyed(&b, "user-42");
        assert!((0..20).all(|_| keyed(&b, "user-42") == first));
        let mut p = Pick::new(BalanceKey::Bytes(b"user-42".to_vec()));
        let other = b.pick(&mut p, |i| i != first, |_| 0).unwrap();
        assert_ne!(other, first);
    }
}

#[test]
fn consistent_hash_moves_about_one_key_in_n_plus_one_when_a_target_is_added() {
    let key = HashKey(vec![crate::config::KeyPart::Path]);
    let balance = Balance::Hash {
        key,
        consistent: true,
    };
    let four = Balancer::new(&targets(&[(1, false, false); 4]), &balance);
    let five = Balancer::new(&targets(&[(1, false, false); 5]), &balance);
    let keys: Vec<String> = (0..10_000).map(|i| format!("k{i}")).collect();
    let moved = keys
        .iter()
        .filter(|k| keyed(&four, k) != keyed(&five, k))
        .count();
    // 1/5 of the keys, give or take the ring's unevenness.
    assert!((1_400..2_600).contains(&moved), "{moved} of 10000 moved");
    // The plain hash moves most of them.
    let plain = |n| {
        Balancer::new(
            &targets(&vec![(1, false, false); n]),
            &Balance::Hash {
                key: HashKey(vec![]),
                consistent: false,
            },
        )
    };
    let (p4, p5) = (plain(4), plain(5));
    let moved = keys
        .iter()
        .filter(|k| keyed(&p4, k) != keyed(&p5, k))
        .count();
    assert!(moved > 6_000, "{moved}");
}

#[test]
fn ip_hash_keys_ipv4_by_its_first_three_octets() {
    let b = Balancer::new(&targets(&[(1, false, false); 5]), &Balance::IpHash);
    let at = |ip: &str| {
        let mut p = Pick::new(BalanceKey::Ip(ip.parse().unwrap()));
        b.pick(&mut p, |_| true, |_| 0).unwrap()
    };
    for last in 0..=255 {
        assert_eq!(at(&format!("10.1.2.{last}")), at("10.1.2.0"));
    }
    let spread: std::collections::HashSet<usize> = (0..64)
        .map(|third| at(&format!("10.1.{third}.9")))
        .collect();
    assert!(spread.len() >= 4, "{spread:?}");
    let v6: std::collections::HashSet<usize> = (0..64)
        .map(|last| at(&format!("2001:db8::{last:x}")))
        .collect();
    assert!(v6.len() >= 4, "IPv6 is hashed whole: {v6:?}");
}
