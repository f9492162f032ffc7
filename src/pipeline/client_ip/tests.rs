//! Client resolution: every spelling of an address gives one key, trusted
//! chains are walked like nginx `real_ip_recursive on`, and an untrusted
//! peer can never choose its own address.

use std::net::IpAddr;

use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;

use super::*;
use crate::config::client::parse_cidr;

fn config(trusted: &[&str], headers: &[ForwardHeader]) -> ClientIpConfig {
    ClientIpConfig {
        trusted_proxies: trusted.iter().map(|c| parse_cidr(c).unwrap()).collect(),
        headers: headers.to_vec(),
        ..ClientIpConfig::default()
    }
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_str(v).unwrap());
    }
    h
}

fn peer(ip: &str) -> ClientIp {
    ClientIp::new(ip.parse().unwrap())
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn spellings_of_one_address_give_one_key() {
    let cfg = ClientIpConfig::default();
    let groups: &[&[&str]] = &[
        &[
            "203.0.113.5",
            "::ffff:203.0.113.5",
            "[::ffff:203.0.113.5]",
            "203.0.113.5:8080",
            "[::ffff:203.0.113.5]:443",
            " 203.0.113.5 ",
        ],
        &[
            "2001:db8::1",
            "2001:DB8::1",
            "2001:db8:0:0::1",
            "2001:0db8:0000:0000:0000:0000:0000:0001",
            "[2001:db8::1]:80",
            "[2001:db8::1]",
        ],
    ];
    for group in groups {
        let keys: Vec<String> = group
            .iter()
            .map(|s| {
                cfg.key_net(parse_hop(s).unwrap_or_else(|| panic!("{s} should parse")))
                    .to_string()
            })
            .collect();
        assert!(
            keys.windows(2).all(|w| w[0] == w[1]),
            "{group:?} -> {keys:?}"
        );
    }
}

#[test]
fn garbage_never_parses_as_an_address() {
    for g in [
        "",
        "unknown",
        "_hidden",
        "evil.example.com",
        "203.0.113.5:99999",
        "203.0.113.5:",
        "[2001:db8::1",
        "2001:db8::1]:80",
        "[203.0.113.5]:80",
        "fe80::1%eth0",
        "1.2.3",
        "256.1.1.1",
        "1.2.3.4.5",
        "0x7f.1",
        "203.0.113.5:80:80",
        "[2001:db8::1]:http",
        "\u{0}",
    ] {
        assert_eq!(parse_hop(g), None, "{g:?} must not parse");
    }
}

#[test]
fn untrusted_peers_are_keyed_by_their_socket_address_whatever_they_send() {
    let cfg = config(
        &["10.0.0.0/8"],
        &[
            ForwardHeader::XForwardedFor,
            ForwardHeader::XRealIp,
            ForwardHeader::CfConnectingIp,
            ForwardHeader::Forwarded,
        ],
    );
    for i in 0..50 {
        let spoof = format!("198.51.100.{i}");
        let h = headers(&[
            ("x-forwarded-for", &spoof),
            ("x-real-ip", &spoof),
            ("cf-connecting-ip", &spoof),
            ("forwarded", &format!("for={spoof}")),
        ]);
        let r = cfg.resolve(&peer("203.0.113.77"), &h);
        assert_eq!(r.client.ip, ip("203.0.113.77"));
        assert!(!r.peer_trusted);
        assert_eq!(
            forwarded_for(&h, &peer("203.0.113.77"), r.peer_trusted),
            "203.0.113.77"
        );
    }
}

#[test]
fn a_trusted_chain_is_walked_right_to_left() {
    let cfg = config(&["10.0.0.0/8"], &[ForwardHeader::XForwardedFor]);
    let h = headers(&[("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.0.0.2")]);
    assert_eq!(
        cfg.resolve(&peer("10.0.0.1"), &h).client.ip,
        ip("203.0.113.7")
    );

    // The same chain split over two header lines.
    let h = headers(&[
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-for", "203.0.113.7, 10.0.0.2"),
    ]);
    assert_eq!(
        cfg.resolve(&peer("10.0.0.1"), &h).client.ip,
        ip("203.0.113.7")
    );

    // Every hop trusted: the leftmost.
    let h = headers(&[("x-forwarded-for", "10.1.1.1, 10.0.0.2")]);
    assert_eq!(cfg.resolve(&peer("10.0.0.1"), &h).client.ip, ip("10.1.1.1"));

    // No header: the peer.
    assert_eq!(
        cfg.resolve(&peer("10.0.0.1"), &HeaderMap::new()).client.ip,
        ip("10.0.0.1")
    );

    // A trusted IPv4-mapped peer is trusted as IPv4.
    let h = headers(&[("x-forwarded-for", "[2001:db8::5]:1234")]);
    assert_eq!(
        cfg.resolve(&peer("::ffff:10.0.0.1"), &h).client.ip,
        ip("2001:db8::5")
    );
}

#[test]
fn garbage_in_a_chain_stops_at_an_address_a_trusted_hop_vouched_for() {
    let cfg = config(&["10.0.0.0/8"], &[ForwardHeader::XForwardedFor]);
    // Right of the garbage are only trusted hops: the answer is the nearest
    // of them, never an address left of the garbage.
    let h = headers(&[("x-forwarded-for", "6.6.6.6, not-an-ip, 10.0.0.9")]);
    assert_eq!(cfg.resolve(&peer("10.0.0.1"), &h).client.ip, ip("10.0.0.9"));
    let h = headers(&[("x-forwarded-for", "6.6.6.6, unknown")]);
    assert_eq!(cfg.resolve(&peer("10.0.0.1"), &h).client.ip, ip("10.0.0.1"));
}

#[test]
fn single_address_headers_and_forwarded() {
    let cfg = config(
        &["10.0.0.0/8", "2001:db8:ffff::/48"],
        &[
            ForwardHeader::CfConnectingIp,
            ForwardHeader::Forwarded,
            ForwardHeader::XRealIp,
        ],
    );
    let h = headers(&[
        ("cf-connecting-ip", "203.0.113.8"),
        ("x-real-ip", "203.0.113.9"),
    ]);
    assert_eq!(
        cfg.resolve(&peer("10.0.0.1"), &h).client.ip,
        ip("203.0.113.8"),
        "first configured header wins"
    );

    let h = headers(&[
        ("cf-connecting-ip", "garbage"),
        ("x-real-ip", "203.0.113.9"),
    ]);
    assert_eq!(
        cfg.resolve(&peer("10.0.0.1"), &h).client.ip,
        ip("203.0.113.9"),
        "an unparsable one is skipped"
    );

    let h = headers(&[(
        "forwarded",
        "for=192.0.2.60;proto=http;by=203.0.113.43, for=\"[2001:db8:ffff::1]:4711\"",
    )]);
    assert_eq!(
        cfg.resolve(&peer("10.0.0.1"), &h).client.ip,
        ip("192.0.2.60")
    );

    let h = headers(&[("forwarded", "for=_hidden, for=10.0.0.3")]);
    assert_eq!(cfg.resolve(&peer("10.0.0.1"), &h).client.ip, ip("10.0.0.3"));
}

#[test]
fn trusted_chains_are_extended_and_untrusted_ones_replaced() {
    let h = headers(&[("x-forwarded-for", "203.0.113.7, 10.0.0.2")]);
    assert_eq!(
        forwarded_for(&h, &peer("10.0.0.1"), true),
        "203.0.113.7, 10.0.0.2, 10.0.0.1"
    );
    assert_eq!(
        forwarded_for(&h, &peer("198.51.100.1"), false),
        "198.51.100.1"
    );
    assert_eq!(
        forwarded_for(&HeaderMap::new(), &peer("10.0.0.1"), true),
        "10.0.0.1"
    );
}

fn any_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(IpAddr::from),
        any::<[u8; 16]>().prop_map(IpAddr::from),
    ]
}

fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any_ip().prop_map(|ip| ip.to_string()),
        prop::collection::vec(any_ip(), 1..6).prop_map(|ips| ips
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")),
        "[ -~]{0,60}",
        any_ip().prop_map(|ip| format!("for=\"{ip}\"")),
    ]
}

proptest! {
    /// No request from an untrusted peer can choose its own key.
    fn untrusted_peers_cannot_choose_their_key_cases(
        peer_ip in any_ip(),
        xff in header_value(),
        real in header_value(),
        cf in header_value(),
        fwd in header_value(),
    ) {
        let cfg = config(&["10.0.0.0/8", "fd00::/8"], &[
            ForwardHeader::XForwardedFor,
            ForwardHeader::XRealIp,
            ForwardHeader::CfConnectingIp,
            ForwardHeader::TrueClientIp,
            ForwardHeader::Forwarded,
        ]);
        prop_assume!(!cfg.is_trusted(peer_ip));
        let mut h = HeaderMap::new();
        for (name, v) in [("x-forwarded-for", &xff), ("x-real-ip", &real), ("cf-connecting-ip", &cf), ("true-client-ip", &real), ("forwarded", &fwd)] {
            if let Ok(v) = HeaderValue::from_str(v) {
                h.append(name, v);
            }
        }
        let p = ClientIp::new(peer_ip);
        let r = cfg.resolve(&p, &h);
        prop_assert_eq!(r.client.ip, canonical(peer_ip));
        prop_assert_eq!(cfg.key_net(r.client.ip), cfg.key_net(peer_ip));
        crate::testing::case_passed();
    }

    /// A trusted peer's chain resolves to an address in the chain or the
    /// peer itself: nothing is invented.
    fn trusted_resolution_only_picks_addresses_present_cases(chain in prop::collection::vec(any_ip(), 0..6)) {
        let cfg = config(&["10.0.0.0/8"], &[ForwardHeader::XForwardedFor]);
        let text = chain.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
        let mut h = HeaderMap::new();
        if !text.is_empty() {
            h.insert("x-forwarded-for", HeaderValue::from_str(&text).unwrap());
        }
        let r = cfg.resolve(&peer("10.9.9.9"), &h);
        let allowed: Vec<IpAddr> = chain.iter().map(|ip| canonical(*ip)).chain([ip("10.9.9.9")]).collect();
        prop_assert!(allowed.contains(&r.client.ip));
        crate::testing::case_passed();
    }
}

#[test]
fn untrusted_peers_cannot_choose_their_key() {
    crate::testing::count_cases(
        "untrusted_peers_cannot_choose_their_key",
        256,
        untrusted_peers_cannot_choose_their_key_cases,
    );
}

#[test]
fn trusted_resolution_only_picks_addresses_present() {
    crate::testing::count_cases(
        "trusted_resolution_only_picks_addresses_present",
        256,
        trusted_resolution_only_picks_addresses_present_cases,
    );
}
