//! Every parser that reads attacker-controlled bytes, fed random input: it
//! answers (a value or an error) and never panics. The same functions are
//! fuzz targets in `fuzz/` (`scripts/fuzz` runs them); these properties keep
//! them honest in every CI run.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;
use tollgate::listener::{encode_v2, parse_v1, parse_v2};
use tollgate::pipeline::is_host;
use tollgate::pipeline::normalize;
use tollgate::pipeline::ClientIp;
use tollgate::Config;

/// Header values as a client may send them: any visible ASCII, spaces,
/// tabs and obs-text bytes (what `HeaderValue` accepts).
fn header_value() -> impl Strategy<Value = HeaderValue> {
    proptest::collection::vec(
        prop_oneof![
            0x20u8..0x7f,
            Just(b'\t'),
            0x80u8..=0xff,
            Just(b','),
            Just(b';')
        ],
        0..80,
    )
    .prop_map(|b| HeaderValue::from_bytes(&b).unwrap_or(HeaderValue::from_static("")))
}

/// A forwarding header's value: arbitrary bytes, or an address a spoofer
/// would send (alone, in a list, or as `Forwarded: for=`).
fn forwarding_value() -> impl Strategy<Value = HeaderValue> {
    let ip = any::<[u8; 4]>().prop_map(|b| IpAddr::from(b).to_string());
    prop_oneof![
        header_value(),
        ip.clone()
            .prop_map(|ip| HeaderValue::from_str(&ip).unwrap()),
        (ip.clone(), ip.clone())
            .prop_map(|(a, b)| HeaderValue::from_str(&format!("{a}, {b}")).unwrap()),
        ip.prop_map(|ip| HeaderValue::from_str(&format!("for={ip}")).unwrap()),
    ]
}

const FORWARDING: [&str; 5] = [
    "x-forwarded-for",
    "x-real-ip",
    "cf-connecting-ip",
    "true-client-ip",
    "forwarded",
];

fn config(rest: &str) -> Config {
    Config::from_yaml(
        &format!("listeners: [{{ bind: '127.0.0.1:0' }}]\nadmin: {{ enabled: false }}\nroutes: [{{ match: {{ path: / }}, respond: {{}} }}]\n{rest}"),
        &|_| None,
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    fn proxy_v1_lines_never_panic_cases(line in proptest::collection::vec(any::<u8>(), 0..120)) {
        let _ = parse_v1(&line);
        let mut with_prefix = b"PROXY ".to_vec();
        with_prefix.extend_from_slice(&line);
        with_prefix.extend_from_slice(b"\r\n");
        let _ = parse_v1(&with_prefix);
        tollgate::testing::case_passed();
    }

    fn proxy_v2_headers_never_panic_cases(
        fixed in proptest::array::uniform16(any::<u8>()),
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        port in any::<u16>(),
    ) {
        let _ = parse_v2(&fixed, &payload);
        // A valid header with a mangled payload.
        let src = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7)), port);
        let good = encode_v2(src, "10.0.0.1:443".parse().unwrap());
        let mut head = [0u8; 16];
        head.copy_from_slice(&good[..16]);
        let _ = parse_v2(&head, &payload);
        prop_assert_eq!(parse_v2(&head, &good[16..]), Ok(Some(src)));
        tollgate::testing::case_passed();
    }

    fn forwarding_headers_never_panic_and_never_trust_an_untrusted_peer_cases(
        values in proptest::collection::vec((0usize..5, forwarding_value()), 0..6),
        peer_last in any::<u8>(),
    ) {
        let trusting = config("client_ip: { trusted_proxies: ['10.0.0.0/8'], headers: [x-forwarded-for, x-real-ip, cf-connecting-ip, true-client-ip, forwarded] }");
        let mut headers = HeaderMap::new();
        for (i, v) in values {
            headers.append(HeaderName::from_static(FORWARDING[i]), v);
        }
        let untrusted = ClientIp::new(IpAddr::V4(Ipv4Addr::new(198, 51, 100, peer_last)));
        let r = trusting.client_ip.resolve(&untrusted, &headers);
        prop_assert_eq!(r.client.ip, untrusted.ip, "an untrusted peer is the client");
        let trusted = ClientIp::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, peer_last)));
        let _ = trusting.client_ip.resolve(&trusted, &headers);
        tollgate::testing::case_passed();
    }

    fn paths_normalise_or_are_refused_cases(path in "/[a-zA-Z0-9%./;_~-]{0,60}") {
        if let Ok(p) = normalize(&path) {
            prop_assert!(p.starts_with('/'), "{}", p);
            prop_assert!(!p.contains("/../") && !p.contains("//"), "{}", p);
            let again = normalize(&p).map(|q| q.into_owned());
            prop_assert_eq!(again.as_deref(), Ok(&*p), "normalising twice changes nothing");
        }
        tollgate::testing::case_passed();
    }

    fn hosts_are_checked_without_panicking_cases(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
        let _ = is_host(&bytes);
        tollgate::testing::case_passed();
    }

    fn config_text_gives_a_config_or_problems_cases(text in "[ -~\n\t]{0,200}") {
        let _ = Config::from_yaml(&text, &|_| None);
        // Inside a valid file's structure, too.
        let _ = Config::from_yaml(&format!("listeners: [{{ bind: '127.0.0.1:0' }}]\nroutes:\n  - {text}\n"), &|_| None);
        tollgate::testing::case_passed();
    }

    fn credentials_never_panic_cases(auth in header_value(), key in header_value(), cookie in header_value()) {
        let cfg = config("identity: { on_invalid: reject, jwt: { algorithms: [HS256], secret: '0123456789abcdef0123456789abcdef' }, api_key: { header: x-api-key } }");
        let identity = cfg.identity.as_ref().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("authorization", auth);
        headers.insert("x-api-key", key);
        headers.insert("cookie", cookie);
        let _ = identity.identify(&headers, &tollgate::clock::Clock::system());
        tollgate::testing::case_passed();
    }
}

#[test]
fn proxy_v1_lines_never_panic() {
    tollgate::testing::count_cases(
        "proxy_v1_lines_never_panic",
        512,
        proxy_v1_lines_never_panic_cases,
    );
}

#[test]
fn proxy_v2_headers_never_panic() {
    tollgate::testing::count_cases(
        "proxy_v2_headers_never_panic",
        512,
        proxy_v2_headers_never_panic_cases,
    );
}

#[test]
fn forwarding_headers_never_panic_and_never_trust_an_untrusted_peer() {
    tollgate::testing::count_cases(
        "forwarding_headers_never_panic_and_never_trust_an_untrusted_peer",
        512,
        forwarding_headers_never_panic_and_never_trust_an_untrusted_peer_cases,
    );
}

#[test]
fn paths_normalise_or_are_refused() {
    tollgate::testing::count_cases(
        "paths_normalise_or_are_refused",
        512,
        paths_normalise_or_are_refused_cases,
    );
}

#[test]
fn hosts_are_checked_without_panicking() {
    tollgate::testing::count_cases(
        "hosts_are_checked_without_panicking",
        512,
        hosts_are_checked_without_panicking_cases,
    );
}

#[test]
fn config_text_gives_a_config_or_problems() {
    tollgate::testing::count_cases(
        "config_text_gives_a_config_or_problems",
        512,
        config_text_gives_a_config_or_problems_cases,
    );
}

#[test]
fn credentials_never_panic() {
    tollgate::testing::count_cases(
        "credentials_never_panic",
        512,
        credentials_never_panic_cases,
    );
}
