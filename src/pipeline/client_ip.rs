//! Who is the client: the one place that decides the client address used for
//! limiting, logging and the forwarding headers.
//!
//! - The peer (the TCP peer, or the source a trusted PROXY protocol header
//!   gave) is canonicalised first: `::ffff:203.0.113.5` is `203.0.113.5`.
//! - When the peer is not in `client_ip.trusted_proxies`, the client is the
//!   peer. Every forwarding header it sent is ignored here and replaced when
//!   forwarding: an untrusted client can never choose its own address.
//! - When the peer is trusted, the configured headers are read in order.
//!   `X-Forwarded-For` (all its lines, joined in order) and `Forwarded`
//!   (RFC 7239 `for=`) are walked right to left, skipping trusted hops, like
//!   nginx `real_ip_recursive on`: the first untrusted address is the client.
//!   If every hop is trusted, the leftmost is. A hop that does not parse ends
//!   the walk at the last address already accepted: an address a trusted
//!   proxy wrote, never one the client chose.
//! - Single-address headers (`X-Real-IP`, `CF-Connecting-IP`,
//!   `True-Client-IP`) are taken as they are when they parse; otherwise the
//!   next configured header is tried, and finally the peer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::header::{HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;

use crate::config::{ClientIpConfig, ForwardHeader};

/// A resolved client address, with its address pre-rendered for headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIp {
    pub ip: IpAddr,
    /// `ip` as a header value; rendered once, cloned without allocating.
    pub header: HeaderValue,
}

impl ClientIp {
    pub fn new(ip: IpAddr) -> Self {
        let ip = canonical(ip);
        let header =
            HeaderValue::from_str(&ip.to_string()).unwrap_or(HeaderValue::from_static("unknown"));
        ClientIp { ip, header }
    }
}

/// The outcome for one request.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub client: ClientIp,
    /// Whether the peer is a trusted proxy, whose forwarding headers are
    /// extended rather than replaced.
    pub peer_trusted: bool,
}

/// IPv4-mapped IPv6 addresses become IPv4, so `::ffff:1.2.3.4` and
/// `1.2.3.4` are one client.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl ClientIpConfig {
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.trusted_proxies.iter().any(|net| net.contains(&ip))
    }

    /// The client for one request from `peer`.
    pub fn resolve(&self, peer: &ClientIp, headers: &HeaderMap) -> Resolved {
        if !self.is_trusted(peer.ip) {
            return Resolved {
                client: peer.clone(),
                peer_trusted: false,
            };
        }
        for source in &self.headers {
            let found = match source {
                ForwardHeader::XForwardedFor => {
                    self.walk(list_values(headers, &X_FORWARDED_FOR), peer.ip)
                }
                ForwardHeader::Forwarded => self.walk(forwarded_for_values(headers), peer.ip),
                single => headers
                    .get(single.name())
                    .and_then(|v| v.to_str().ok())
                    .and_then(parse_hop),
            };
            if let Some(ip) = found {
                return Resolved {
                    client: ClientIp::new(ip),
                    peer_trusted: true,
                };
            }
        }
        Resolved {
            client: peer.clone(),
            peer_trusted: true,
        }
    }

    /// Walks hops right to left; `None` if the header is absent or empty.
    fn walk<'a>(
        &self,
        hops: impl DoubleEndedIterator<Item = &'a str>,
        peer: IpAddr,
    ) -> Option<IpAddr> {
        let mut accepted: Option<IpAddr> = None;
        for hop in hops.rev() {
            let Some(ip) = parse_hop(hop) else {
                // A trusted proxy would not write garbage: stop at the last
                // address a trusted hop vouched for (or the peer).
                return Some(accepted.unwrap_or(peer));
            };
            accepted = Some(ip);
            if !self.is_trusted(ip) {
                return Some(ip);
            }
        }
        accepted
    }

    /// The rate-limit key network for a client: its address truncated to
    /// the configured prefix, so one IPv6 /64 is one client.
    pub fn key_net(&self, ip: IpAddr) -> IpNet {
        let prefix = match canonical(ip) {
            IpAddr::V4(_) => self.ipv4_prefix,
            IpAddr::V6(_) => self.ipv6_prefix,
        };
        IpNet::new(canonical(ip), prefix).map_or_else(|_| IpNet::from(canonical(ip)), |n| n.trunc())
    }
}

pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

impl ForwardHeader {
    pub fn name(&self) -> HeaderName {
        match self {
            ForwardHeader::XForwardedFor => X_FORWARDED_FOR,
            ForwardHeader::XRealIp => HeaderName::from_static("x-real-ip"),
            ForwardHeader::CfConnectingIp => HeaderName::from_static("cf-connecting-ip"),
            ForwardHeader::TrueClientIp => HeaderName::from_static("true-client-ip"),
            ForwardHeader::Forwarded => http::header::FORWARDED,
        }
    }
}

/// Every comma-separated item of every line of a header, in order.
fn list_values<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> impl DoubleEndedIterator<Item = &'a str> {
    let lines: Vec<&'a str> = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap_or("\u{0}"))
        .collect();
    lines
        .into_iter()
        .flat_map(|l| l.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The `for=` value of each `Forwarded` element, in order. An element
/// without `for=` yields an unparsable hop, which stops the walk.
fn forwarded_for_values(headers: &HeaderMap) -> impl DoubleEndedIterator<Item = &str> {
    list_values(headers, &http::header::FORWARDED).map(|element| {
        element
            .split(';')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("for"))
            .map_or("", |(_, v)| v.trim().trim_matches('"'))
    })
}

/// One hop as written by a proxy: `203.0.113.7`, `203.0.113.7:1234`,
/// `[2001:db8::1]`, `[2001:db8::1]:80`, `2001:db8::1`, any case, IPv4-mapped
/// or not. Anything else (`unknown`, `_hidden`, names, zone ids) is `None`.
pub fn parse_hop(text: &str) -> Option<IpAddr> {
    let s = text.trim();
    if let Some(rest) = s.strip_prefix('[') {
        let end = rest.find(']')?;
        let after = &rest[end + 1..];
        if !(after.is_empty() || valid_port(after.strip_prefix(':')?)) {
            return None;
        }
        return rest[..end]
            .parse::<Ipv6Addr>()
            .ok()
            .map(|v6| canonical(IpAddr::V6(v6)));
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    // IPv4 with a port (a bare IPv6 address has several colons and parsed above).
    let (host, port) = s.rsplit_once(':')?;
    if !valid_port(port) {
        return None;
    }
    host.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

fn valid_port(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 5
        && p.bytes().all(|b| b.is_ascii_digit())
        && p.parse::<u16>().is_ok()
}

/// The `X-Forwarded-For` tollgate sends upstream: a trusted proxy's chain
/// extended with the peer, or just the peer for everyone else.
pub fn forwarded_for(headers: &HeaderMap, peer: &ClientIp, peer_trusted: bool) -> HeaderValue {
    if !peer_trusted || !headers.contains_key(X_FORWARDED_FOR) {
        return peer.header.clone();
    }
    let mut chain = String::new();
    for line in headers.get_all(X_FORWARDED_FOR) {
        if let Ok(s) = line.to_str() {
            for hop in s.split(',').map(str::trim).filter(|h| !h.is_empty()) {
                chain.push_str(hop);
                chain.push_str(", ");
            }
        }
    }
    chain.push_str(&peer.ip.to_string());
    HeaderValue::from_str(&chain).unwrap_or_else(|_| peer.header.clone())
}

#[cfg(test)]
mod tests;
