//! The script's parameters and answers, per algorithm.

use super::*;

fn spec(name: &str, route: Option<&str>) -> ZoneSpec {
    ZoneSpec {
        name: name.into(),
        route: route.map(Into::into),
        size_bytes: 1 << 20,
    }
}

#[test]
fn key_suffixes_stay_apart_and_do_not_follow_positions() {
    let zones = [
        spec("per_ip", None),
        spec("login", Some("auth")),
        spec("short", Some("a")),
        spec("short", Some("b")),
        spec("per_ip", Some("c")),
        // Two routes named alike: only then does a position count.
        spec("burst", Some("d")),
        spec("burst", Some("d")),
    ];
    assert_eq!(
        &*suffixes(&zones),
        [
            "per_ip",
            "login",
            "short@a",
            "short@b",
            "per_ip@c",
            "burst@d#5",
            "burst@d#6"
        ]
    );
}
