//! Path normalisation: any string gives one spelling or a refusal, and
//! normalising twice changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::pipeline::normalize;

fuzz_target!(|path: &str| {
    if let Ok(p) = normalize(path) {
        let again = normalize(&p).map(|q| q.into_owned());
        assert_eq!(again.as_deref(), Ok(&*p));
    }
});
