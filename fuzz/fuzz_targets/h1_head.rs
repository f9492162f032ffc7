//! HTTP/1.x request heads (and small bodies) from arbitrary bytes, as the
//! fast path reads them: never a panic, and what it leaves in the buffer
//! is exactly the input's tail.
#![no_main]

use http_body::Body;
use libfuzzer_sys::fuzz_target;
use tollgate::listener::read_request;

fuzz_target!(|data: &[u8]| {
    if let Some((req, body, rest)) = read_request(data) {
        assert!(data.ends_with(&rest));
        let body_len = body.size_hint().exact().unwrap_or(0) as usize;
        assert!(rest.len() + body_len < data.len());
        let _ = (req.uri().path(), req.headers().len());
    }
});
