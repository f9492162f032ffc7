//! The trusted-proxy walk over X-Forwarded-For, X-Real-IP, CF-Connecting-IP,
//! True-Client-IP and Forwarded, with arbitrary header values, from a
//! trusted and an untrusted peer; and the Host check.
#![no_main]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use tollgate::pipeline::ClientIp;
use tollgate::Config;

const HEADERS: [&str; 5] = [
    "x-forwarded-for",
    "x-real-ip",
    "cf-connecting-ip",
    "true-client-ip",
    "forwarded",
];

fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        Config::from_yaml(
            "listeners: [{ bind: '127.0.0.1:0' }]\nadmin: { enabled: false }\nclient_ip: { trusted_proxies: ['10.0.0.0/8'], headers: [x-forwarded-for, x-real-ip, cf-connecting-ip, true-client-ip, forwarded] }\nroutes: [{ match: { path: / }, respond: {} }]\n",
            &|_| None,
        )
        .expect("fuzz config")
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = tollgate::pipeline::is_host(data);
    let mut headers = HeaderMap::new();
    for (i, part) in data.split(|&b| b == b'\n').enumerate() {
        if let Ok(v) = HeaderValue::from_bytes(part) {
            headers.append(HeaderName::from_static(HEADERS[i % HEADERS.len()]), v);
        }
    }
    let cfg = &config().client_ip;
    let untrusted = ClientIp::new(IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1)));
    assert_eq!(cfg.resolve(&untrusted, &headers).client.ip, untrusted.ip);
    let trusted = ClientIp::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
    let _ = cfg.resolve(&trusted, &headers);
});
