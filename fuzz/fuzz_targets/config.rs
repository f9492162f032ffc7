//! The config loader: any text gives a config or a list of problems.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let _ = tollgate::Config::from_yaml(text, &|_| Some("x".to_owned()));
});
