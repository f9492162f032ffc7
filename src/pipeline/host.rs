//! Which host a request is for: one validated value, written back as the
//! request's only `Host` header, so route matching, `X-Forwarded-Host` and
//! the upstream's `Host` can never disagree with each other, or with a load
//! balancer in front that reads the same request.
//!
//! - More than one `Host` header is a 400 (RFC 9112 §3.2).
//! - The value must be `uri-host [ ":" port ]` (RFC 9110 §7.2): a name of
//!   letters, digits, `-`, `.`, `_`, `~`, an IPv4 address or a bracketed IPv6
//!   literal, and a port of 1 to 5 digits. No spaces, commas, slashes,
//!   userinfo (`@`) or percent-escapes.
//! - An absolute-form request target (`GET http://a.test/ HTTP/1.1`) names
//!   the host; a `Host` header beside it is replaced (RFC 9112 §3.2.2).
//! - Over HTTP/2, `:authority` and a `host` header that differ are a 400.

use http::header::{HeaderValue, HOST};
use http::{HeaderMap, Request, Version};

use crate::error::ProxyError;

/// Validates the request's host and leaves it as the only `Host` header
/// (none for an HTTP/1.0 request without one).
pub fn resolve<B>(req: &mut Request<B>) -> Result<(), ProxyError> {
    let mut headers = req.headers().get_all(HOST).iter();
    let header = headers.next();
    if headers.next().is_some() {
        return Err(ProxyError::BadRequest(
            "the request has more than one Host header",
        ));
    }
    let Some(authority) = req.uri().authority() else {
        // The common case: one Host header, kept as it is once checked.
        return match header {
            Some(h) if is_host(h.as_bytes()) => Ok(()),
            Some(_) => Err(ProxyError::BadRequest(
                "the Host header is not a valid host",
            )),
            None if req.version() == Version::HTTP_11 => Err(ProxyError::BadRequest(
                "HTTP/1.1 requests need a Host header",
            )),
            None => Ok(()),
        };
    };
    let a = authority.as_str();
    if req.version() == Version::HTTP_2
        && header.is_some_and(|h| !h.as_bytes().eq_ignore_ascii_case(a.as_bytes()))
    {
        return Err(ProxyError::BadRequest(
            "the :authority and Host of the request disagree",
        ));
    }
    if !is_host(a.as_bytes()) {
        return Err(ProxyError::BadRequest(
            "the request target's host is not a valid host",
        ));
    }
    let chosen = HeaderValue::from_str(a)
        .map_err(|_| ProxyError::BadRequest("the request target's host is not a valid host"))?;
    req.headers_mut().insert(HOST, chosen);
    Ok(())
}

/// The resolved host without its port, for route matching.
pub fn for_routing(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .map(strip_port)
}

/// `uri-host [ ":" port ]`, strictly (see the module docs).
pub fn is_host(v: &[u8]) -> bool {
    let (host, port) = match v.first() {
        Some(b'[') => match v.iter().position(|&b| b == b']') {
            Some(end) => {
                let inside = std::str::from_utf8(&v[1..end]).ok();
                if inside.is_none_or(|s| s.parse::<std::net::Ipv6Addr>().is_err()) {
                    return false;
                }
                (&v[..=end], &v[end + 1..])
            }
            None => return false,
        },
        _ => match v.iter().rposition(|&b| b == b':') {
            Some(colon) => (&v[..colon], &v[colon..]),
            None => (v, &v[v.len()..]),
        },
    };
    let name_ok =
        host.first() == Some(&b'[') || (!host.is_empty() && host.iter().all(|&b| NAME[b as usize]));
    let port_ok = match port {
        [] => true,
        [b':', digits @ ..] => {
            (1..=5).contains(&digits.len())
                && digits.iter().all(u8::is_ascii_digit)
                && digits
                    .iter()
                    .fold(0u32, |n, &d| n * 10 + u32::from(d - b'0'))
                    <= u32::from(u16::MAX)
        }
        _ => false,
    };
    name_ok && port_ok
}

/// The bytes a host name may hold: letters, digits, `-`, `.`, `_`, `~`.
static NAME: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~');
        b += 1;
    }
    table
};

/// The host without its port (or a trailing dot), for route matching:
/// `api.example.com:8443` -> `api.example.com`; `[::1]:8080` -> `[::1]`.
pub fn strip_port(host: &str) -> &str {
    let b = host.as_bytes();
    if b.first() == Some(&b'[') {
        return b
            .iter()
            .position(|&c| c == b']')
            .map_or(host, |i| &host[..=i]);
    }
    // Only ASCII bytes are looked for: every cut is a char boundary.
    let mut end = b.iter().rposition(|&c| c == b':').unwrap_or(b.len());
    while end > 0 && b[end - 1] == b'.' {
        end -= 1;
    }
    &host[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_strict() {
        for ok in [
            "api.test",
            "API.test:8080",
            "127.0.0.1",
            "127.0.0.1:1",
            "[::1]",
            "[2001:db8::1]:443",
            "a_b~c-d.test",
            "a.test:65535",
            "a.test:0",
            "a.test:00080",
        ] {
            assert!(is_host(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "",
            "a b.test",
            "a.test, b.test",
            "a.test,b.test",
            "evil/../x@y",
            "user@a.test",
            "a.test:",
            "a.test:99999",
            "a.test:65536",
            "a.test:+80",
            "a.test:8\u{e9}",
            "a\u{e9}.test",
            "a.test:80:80",
            "[::1",
            "[nope]:80",
            "a%2e.test",
            ":80",
        ] {
            assert!(!is_host(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn one_host_header_is_left() {
        let mut req = Request::get("http://a.test/x")
            .header("host", "b.test")
            .body(())
            .unwrap();
        resolve(&mut req).unwrap();
        assert_eq!(for_routing(req.headers()), Some("a.test"));
        assert_eq!(req.headers().get_all(HOST).iter().count(), 1);
        assert_eq!(req.headers()[HOST], "a.test", "the target's authority wins");

        let mut req = Request::get("/x")
            .header("host", "a.test")
            .header("host", "b.test")
            .body(())
            .unwrap();
        assert!(resolve(&mut req).is_err());

        let mut req = Request::get("http://a.test/x")
            .version(Version::HTTP_2)
            .header("host", "b.test")
            .body(())
            .unwrap();
        assert!(resolve(&mut req).is_err(), "h2 :authority vs host");

        let mut req = Request::get("/x")
            .version(Version::HTTP_10)
            .body(())
            .unwrap();
        resolve(&mut req).unwrap();
        assert_eq!(for_routing(req.headers()), None);
    }

    #[test]
    fn ports_are_stripped_from_hosts() {
        assert_eq!(strip_port("api.example.com:8443"), "api.example.com");
        assert_eq!(strip_port("api.example.com."), "api.example.com");
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        assert_eq!(strip_port("localhost"), "localhost");
        assert_eq!(strip_port("api.example.com.:8443"), "api.example.com");
        assert_eq!(strip_port("[::1]."), "[::1]");
    }
}
