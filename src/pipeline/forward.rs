//! Forwarding hygiene: what crosses tollgate in each direction.
//!
//! Hop-by-hop headers (RFC 9110 §7.6.1) and every header the sender named in
//! `Connection` are removed before tollgate adds its own, so
//! `Connection: close, X-Forwarded-For` cannot smuggle a client-chosen
//! `X-Forwarded-For` past the proxy. The forwarding headers the upstream
//! sees are always tollgate's: written from the resolved client, never
//! passed through.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Always removed on the way through, in both directions.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Client-sent forwarding headers: replaced, never trusted.
const FORWARDING: [HeaderName; 8] = [
    header::FORWARDED,
    HeaderName::from_static("x-forwarded-for"),
    HeaderName::from_static("x-forwarded-proto"),
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-real-ip"),
    HeaderName::from_static("cf-connecting-ip"),
    HeaderName::from_static("true-client-ip"),
];

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

/// Removes every field of `names` the map holds. A request carries a
/// handful of fields: one walk over them is cheaper than a hashed lookup
/// per name, and most of the time finds nothing to remove.
fn remove_all(headers: &mut HeaderMap, names: &[HeaderName]) {
    if !headers.keys().any(|k| names.contains(k)) {
        return;
    }
    for name in names {
        headers.remove(name);
    }
}

/// Removes `Connection` and every header it names, then the fixed
/// hop-by-hop set.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(header::CONNECTION) {
        // `keep-alive`, `close` and `upgrade`, the usual tokens, name
        // nothing beyond the fixed set removed below: no header name is
        // built (and allocated) for them.
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| {
                !t.eq_ignore_ascii_case("close")
                    && !HOP_BY_HOP
                        .iter()
                        .any(|h| t.eq_ignore_ascii_case(h.as_str()))
            })
            .filter_map(|token| HeaderName::from_bytes(token.as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    remove_all(headers, &HOP_BY_HOP);
}

/// Rewrites a request's headers for the upstream. `upgrade` is the
/// protocol to carry through (`websocket`), re-added after stripping.
pub fn request_headers(headers: &mut HeaderMap, upgrade: Option<HeaderValue>, fwd: Forwarded<'_>) {
    strip_hop_by_hop(headers);
    if !fwd.trusted {
        remove_all(headers, &FORWARDING);
    }
    // tollgate answers `Expect: 100-continue` itself when it reads the body.
    headers.remove(header::EXPECT);
    // Room for the fields added below, made once.
    headers.reserve(4);
    headers.insert(X_FORWARDED_FOR, fwd.chain);
    headers.insert(X_REAL_IP, fwd.client.clone());
    if !headers.contains_key(X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(fwd.proto));
    }
    if let Some(host) = fwd.host {
        if !headers.contains_key(X_FORWARDED_HOST) {
            headers.insert(X_FORWARDED_HOST, host);
        }
    }
    if let Some(protocol) = upgrade {
        headers.insert(header::CONNECTION, UPGRADE_TOKEN);
        headers.insert(header::UPGRADE, protocol);
    }
}

/// Rewrites an upstream response's headers for the client. A `101
/// Switching Protocols` keeps its `Upgrade` and `Connection: upgrade`.
pub fn response_headers(headers: &mut HeaderMap, switching: bool) {
    let upgrade = if switching {
        headers.get(header::UPGRADE).cloned()
    } else {
        None
    };
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
    /// for api.example.com.
    fn forward(h: &mut HeaderMap, trusted: bool, proto: &'static str) {
        let client = HeaderValue::from_static("203.0.113.9");
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
        );
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
        response_headers(&mut resp, true);
        assert_eq!(resp["upgrade"], "websocket");
        assert_eq!(resp["connection"], "upgrade");
        assert!(!resp.contains_key("keep-alive"));

        let mut refused = map(&[("connection", "upgrade"), ("upgrade", "websocket")]);
        response_headers(&mut refused, false);
        assert!(refused.is_empty());
    }
}
