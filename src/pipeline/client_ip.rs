//! Who is the client: the one function that decides the client address used
//! for limiting, logging and the forwarding headers.
//!
//! For now the client is the TCP peer, canonicalised so that one address has
//! one spelling (an IPv4-mapped IPv6 peer such as `::ffff:203.0.113.5` is
//! `203.0.113.5`). Every forwarding header the client sent is ignored here
//! and replaced when forwarding. Trusted proxies and PROXY protocol refine
//! this function, not its callers.

use std::net::IpAddr;

use http::HeaderMap;
use http::HeaderValue;

/// The resolved client, with its address pre-rendered for headers.
#[derive(Debug, Clone)]
pub struct ClientIp {
    pub ip: IpAddr,
    /// `ip` as a header value; rendered once per connection, cloned per
    /// request without allocating.
    pub header: HeaderValue,
}

impl ClientIp {
    pub fn from_peer(peer: IpAddr) -> Self {
        let ip = canonical(peer);
        let header =
            HeaderValue::from_str(&ip.to_string()).unwrap_or(HeaderValue::from_static("unknown"));
        ClientIp { ip, header }
    }
}

/// IPv4-mapped IPv6 addresses become IPv4, so `::ffff:1.2.3.4` and
/// `1.2.3.4` are the same client.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The client for one request. Headers are deliberately unused until
/// trusted proxies are configured: a client-sent `X-Forwarded-For` must
/// never choose its own key.
pub fn resolve<'a>(peer: &'a ClientIp, _headers: &HeaderMap) -> &'a ClientIp {
    peer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_addresses_are_keyed_as_ipv4() {
        let mapped: IpAddr = "::ffff:203.0.113.5".parse().unwrap();
        assert_eq!(canonical(mapped), "203.0.113.5".parse::<IpAddr>().unwrap());
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(canonical(v6), v6);
        assert_eq!(ClientIp::from_peer(mapped).header, "203.0.113.5");
    }

    #[test]
    fn forwarding_headers_from_the_client_are_ignored() {
        let peer = ClientIp::from_peer("198.51.100.7".parse().unwrap());
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", HeaderValue::from_static("6.6.6.6"));
        headers.insert("x-real-ip", HeaderValue::from_static("6.6.6.6"));
        assert_eq!(resolve(&peer, &headers).ip, peer.ip);
    }
}
