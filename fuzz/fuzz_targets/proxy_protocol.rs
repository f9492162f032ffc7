//! PROXY protocol v1 lines and v2 headers from arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::listener::{parse_v1, parse_v2};

fuzz_target!(|data: &[u8]| {
    let _ = parse_v1(data);
    if data.len() >= 16 {
        let mut fixed = [0u8; 16];
        fixed.copy_from_slice(&data[..16]);
        let _ = parse_v2(&fixed, &data[16..]);
    }
});
