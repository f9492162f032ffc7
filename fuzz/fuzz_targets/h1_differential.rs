//! The fast path's HTTP/1.x head parser against hyper's rules, on the same
//! bytes: wherever the fast path serves a request itself, hyper's server
//! (modelled here on httparse plus the checks `hyper::proto::h1::role`
//! applies, and RFC 9110 section 8.6 for a list of equal lengths, as
//! hyper's client reads them) must agree on where the head ends, the
//! body's length, that it is not chunked, and whether the connection is
//! kept. Any disagreement is a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::listener::framing;

const LIMITS: (usize, usize) = (64 << 10, 100);

/// hyper's reading: `Some((head length, body length, keep-alive))`, or
/// `None` when hyper would refuse the head, or frame the body otherwise
/// than by a length (chunked).
fn hyper_reads(buf: &[u8]) -> Option<(usize, u64, bool)> {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len <= LIMITS.0 => len,
        _ => return None,
    };
    if req.headers.len() > LIMITS.1 {
        return None;
    }
    let http10 = req.version? == 0;
    let (mut length, mut close, mut keep_alive) = (None::<u64>, false, false);
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        match name.as_str() {
            // Chunked (or refused): not framed by a length.
            "transfer-encoding" => return None,
            "content-length" => {
                let value = std::str::from_utf8(h.value).ok()?;
                for part in value.split(',') {
                    let part = part.trim().as_bytes();
                    if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
                        return None;
                    }
                    let mut n: u64 = 0;
                    for &b in part {
                        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
                    }
                    if length.is_some_and(|l| l != n) {
                        return None;
                    }
                    length = Some(n);
                }
            }
            "connection" => {
                for t in h.value.split(|&b| b == b',') {
                    let t = t.trim_ascii();
                    close |= t.eq_ignore_ascii_case(b"close");
                    keep_alive |= t.eq_ignore_ascii_case(b"keep-alive");
                }
            }
            _ => {}
        }
    }
    let kept = !close && (!http10 || keep_alive);
    Some((len, length.unwrap_or(0), kept))
}

fuzz_target!(|data: &[u8]| {
    if let Some(fast) = framing(data, LIMITS) {
        let hyper = hyper_reads(data);
        assert_eq!(
            Some(fast),
            hyper,
            "the fast path frames {:?} otherwise than hyper",
            String::from_utf8_lossy(data)
        );
    }
});
