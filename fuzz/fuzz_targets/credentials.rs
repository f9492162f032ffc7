//! JWT (header and cookie) and API-key extraction and verification from
//! arbitrary header values.
#![no_main]

use std::sync::OnceLock;

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use tollgate::clock::{Clock, FrozenClock};
use tollgate::Config;

fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        Config::from_yaml(
            "listeners: [{ bind: '127.0.0.1:0' }]\nadmin: { enabled: false }\nidentity: { on_invalid: reject, jwt: { algorithms: [HS256], secret: '0123456789abcdef0123456789abcdef' }, api_key: { header: x-api-key } }\nroutes: [{ match: { path: / }, respond: {} }]\n",
            &|_| None,
        )
        .expect("fuzz config")
    })
}

/// Stands still, so that a token's validity period reads the same on
/// every run of an input.
fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(|| FrozenClock::new().clock())
}

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |&b| b == b'\n');
    let mut headers = HeaderMap::new();
    for name in ["authorization", "x-api-key", "cookie"] {
        if let Some(Ok(v)) = parts.next().map(HeaderValue::from_bytes) {
            headers.insert(name, v);
        }
    }
    if let Some(identity) = &config().identity {
        let _ = identity.identify(&headers, clock());
    }
});
