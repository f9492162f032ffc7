//! Forwarding hygiene: what crosses tollgate in each direction.
//!
//! Hop-by-hop headers (RFC 9110 §7.6.1) and every header the sender named in
//! `Connection` are removed before tollgate adds its own, so
//! `Connection: close, X-Forwarded-For` cannot smuggle a client-chosen
//! `X-Forwarded-For` past the proxy. The forwarding headers the upstream
//! sees are always tollgate's: written from the resolved client, never
//! passed through.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;

pub use crate::http1::is_hop_by_hop;

/// Client-sent forwarding headers: replaced, never trusted.
fn forwarding(name: &str) -> bool {
    matches!(
        name,
        "forwarded"
            | "x-forwarded-for"
            | "x-forwarded-proto"
            | "x-forwarded-host"
            | "x-forwarded-port"
            | "x-real-ip"
            | "cf-connecting-ip"
            | "true-client-ip"
    )
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
const UPGRADE_TOKEN: HeaderValue = HeaderValue::from_static("upgrade");

/// What tollgate tells the upstream about the original request.
pub struct Forwarded<'a> {
    /// The resolved client, for `X-Real-IP`.
    pub client: &'a HeaderValue,
    /// The full `X-Forwarded-For` to send (see `client_ip::forwarded_for`).
    pub chain: HeaderValue,
    /// The peer is a trusted proxy: its `X-Forwarded-Proto`, `-Host`,
    /// `-Port` and `Forwarded` describe the original request and are kept.
    pub trusted: bool,
    pub proto: &'static str,
    /// The host the client asked for, if it said.
    pub host: Option<HeaderValue>,
}

/// Removes `Connection`, every header it names, the fixed hop-by-hop set
/// and the fields `also` picks. A message carries a handful of fields: one
/// walk over them finds what to remove (most of the time little or
/// nothing), instead of a hashed lookup per name.
fn strip(headers: &mut HeaderMap, also: impl Fn(&str) -> bool) {
    let mut gone: SmallVec<[HeaderName; 4]> = SmallVec::new();
    let mut previous: Option<&HeaderName> = None;
    for (name, value) in headers.iter() {
        if name == header::CONNECTION {
            // `keep-alive`, `close` and `upgrade`, the usual tokens, name
            // nothing beyond the fixed set: no header name is built (and
            // allocated) for them.
            let tokens = value.to_str().unwrap_or("").split(',').map(str::trim);
            for token in tokens {
                // `Host` is end to end whatever a token says: the request
                // was routed and limited by it, and HTTP/1.1 needs it.
                if token.is_empty()
                    || token.eq_ignore_ascii_case("close")
                    || token.eq_ignore_ascii_case("host")
                    || is_hop_by_hop(token.as_bytes())
                {
                    continue;
                }
                if let Ok(named) = HeaderName::from_bytes(token.as_bytes()) {
                    gone.push(named);
                }
            }
        }
        // A name with several values comes up once per value, in a row.
        if previous == Some(name) {
            continue;
        }
        previous = Some(name);
        if is_hop_by_hop(name.as_str().as_bytes()) || also(name.as_str()) {
            gone.push(name.clone());
        }
    }
    for name in gone {
        headers.remove(name);
    }
}

/// Removes `Connection` and every header it names, then the fixed
/// hop-by-hop set.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip(headers, |_| false);
}

/// The fields tollgate adds to an upstream request, written into its head
/// after the client's fields (which no longer hold these names): no map
/// insert, no hashing, for fields only the upstream reads.
pub type Added = SmallVec<[(HeaderName, HeaderValue); 6]>;

/// Rewrites a request's headers for the upstream and puts the fields
/// tollgate adds in `added` (the caller's, in its async frame: returned,
/// the list would be copied there whole, its unused room too).
/// `upgrade` is the protocol to carry through (`websocket`), re-added
/// after stripping.
pub fn request_headers(
    headers: &mut HeaderMap,
    upgrade: Option<HeaderValue>,
    fwd: Forwarded<'_>,
    added: &mut Added,
) {
    // tollgate answers `Expect: 100-continue` itself when it reads the
    // body; an untrusted peer's forwarding fields go, and so does any
    // `X-Forwarded-For` / `X-Real-IP`, which tollgate writes itself.
    let trusted = fwd.trusted;
    strip(headers, |name| {
        name == "expect"
            // Only ever meaningful with an h2c upgrade, never forwarded.
            || name == "http2-settings"
            || name == "x-forwarded-for"
            || name == "x-real-ip"
            || (!trusted && forwarding(name))
    });
    added.push((X_FORWARDED_FOR, fwd.chain));
    added.push((X_REAL_IP, fwd.client.clone()));
    // From an untrusted peer they are gone already.
    if !trusted || !headers.contains_key(X_FORWARDED_PROTO) {
        added.push((X_FORWARDED_PROTO, HeaderValue::from_static(fwd.proto)));
    }
    if let Some(host) = fwd.host {
        if !trusted || !headers.contains_key(X_FORWARDED_HOST) {
            added.push((X_FORWARDED_HOST, host));
        }
    }
    if let Some(protocol) = upgrade {
        added.push((header::CONNECTION, UPGRADE_TOKEN));
        added.push((header::UPGRADE, protocol));
    }
}

/// Rewrites a `101 Switching Protocols`'s headers for the client: its
/// hop-by-hop fields go, but it keeps its `Upgrade` and `Connection:
/// upgrade`. (Other answers pass on as lines, stripped as they are read:
/// `upstream::h1`.)
pub fn switching_headers(headers: &mut HeaderMap) {
    let upgrade = headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(headers);
    if let Some(protocol) = upgrade {
        headers.insert(header::CONNECTION, UPGRADE_TOKEN);
        headers.insert(header::UPGRADE, protocol);
    }
}

/// The protocol a client asks to switch to, if it asks properly
/// (`Connection: upgrade` plus `Upgrade: x`).
pub fn requested_upgrade(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if asks {
        headers.get(header::UPGRADE).cloned()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        h
    }

    /// The request fields for the upstream, from client 203.0.113.9 asking
    /// for api.example.com: the client's that are kept, then tollgate's,
    /// none of whose names the client's still hold.
    fn forward(h: &mut HeaderMap, trusted: bool, proto: &'static str) {
        let client = HeaderValue::from_static("203.0.113.9");
        let mut added = Added::new();
        request_headers(
            h,
            None,
            Forwarded {
                client: &client,
                chain: client.clone(),
                trusted,
                proto,
                host: Some(HeaderValue::from_static("api.example.com")),
            },
            &mut added,
        );
        for (name, value) in added {
            assert!(!h.contains_key(&name), "{name} would go upstream twice");
            h.append(name, value);
        }
    }

    #[test]
    fn connection_named_headers_go_before_ours_are_added() {
        let mut h = map(&[
            ("connection", "close, X-Forwarded-For, x-secret"),
            ("x-forwarded-for", "6.6.6.6"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("forwarded", "for=6.6.6.6"),
            ("x-real-ip", "6.6.6.6"),
            ("expect", "100-continue"),
            ("accept", "*/*"),
        ]);
        forward(&mut h, false, "https");
        assert_eq!(h["x-forwarded-for"], "203.0.113.9");
        assert_eq!(h["x-real-ip"], "203.0.113.9");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-forwarded-host"], "api.example.com");
        assert_eq!(h["accept"], "*/*");
        for gone in [
            "connection",
            "x-secret",
            "keep-alive",
            "te",
            "forwarded",
            "expect",
        ] {
            assert!(!h.contains_key(gone), "{gone} should be removed");
        }
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
    }

    #[test]
    fn every_connection_line_names_fields_to_remove() {
        let mut h = map(&[
            ("connection", "x-one"),
            ("connection", "X-Two, close"),
            ("x-one", "1"),
            ("x-two", "2"),
            ("x-three", "3"),
        ]);
        strip_hop_by_hop(&mut h);
        for gone in ["connection", "x-one", "x-two"] {
            assert!(!h.contains_key(gone), "{gone} should be removed");
        }
        assert_eq!(h["x-three"], "3");
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn a_trusted_peer_keeps_its_proto_and_host_unless_it_names_them_hop_by_hop() {
        let forwarded = |pairs: &[(&'static str, &'static str)]| {
            let mut h = map(pairs);
            forward(&mut h, true, "http");
            h
        };
        let kept = forwarded(&[
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "edge.example.com"),
        ]);
        assert_eq!(kept["x-forwarded-proto"], "https");
        assert_eq!(kept["x-forwarded-host"], "edge.example.com");
        // Named in Connection, they are hop-by-hop: gone, and ours instead.
        let named = forwarded(&[
            ("connection", "x-forwarded-proto, X-Forwarded-Host"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "edge.example.com"),
            ("expect", "100-continue"),
        ]);
        assert_eq!(named["x-forwarded-proto"], "http");
        assert_eq!(named["x-forwarded-host"], "api.example.com");
        assert!(!named.contains_key("connection") && !named.contains_key("expect"));
    }

    #[test]
    fn upgrades_survive_only_when_asked_for() {
        let h = map(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
        ]);
        assert_eq!(requested_upgrade(&h).unwrap(), "websocket");
        assert!(requested_upgrade(&map(&[("upgrade", "websocket")])).is_none());

        let mut resp = map(&[
            ("connection", "upgrade"),
            ("upgrade", "websocket"),
            ("keep-alive", "x"),
        ]);
        switching_headers(&mut resp);
        assert_eq!(resp["upgrade"], "websocket");
        assert_eq!(resp["connection"], "upgrade");
        assert!(!resp.contains_key("keep-alive"));
        // A refused upgrade's answer: `upstream::h1`'s
        // `an_upstream_head_passes_on_as_lines_without_its_hop_by_hop_fields`.
    }
}
