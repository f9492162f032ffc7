//! Rate-limit keys: which bucket a request is counted in, built from the
//! resolved client and its verified identity. Limits name a key kind:
//!
//! | kind | bucket | when it does not apply |
//! |---|---|---|
//! | `ip` | the client address truncated to `ipv4_prefix` / `ipv6_prefix` | never |
//! | `user` | the verified user id | anonymous requests are not counted |
//! | `user_or_ip` (default) | the user when verified, else the IP prefix | never |
//! | `header:<name>` | a hash of the header's value | requests without the header are not counted |
//! | `global` | one bucket for everyone | never |
//!
//! Keys never hold a secret in clear: header values are hashed, API keys
//! arrive already hashed from `identity`.

use std::fmt;
use std::net::IpAddr;

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;

use super::identity::{short_hash, Identity};
use crate::config::ClientIpConfig;

pub use crate::config::KeyKind;

/// The bucket a request falls in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    Ip(IpNet),
    User(String),
    /// Header name and the hash of its value.
    Header(HeaderName, String),
    Global,
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Ip(net) if net.prefix_len() == net.max_prefix_len() => {
                write!(f, "ip:{}", net.addr())
            }
            Key::Ip(net) => write!(f, "ip:{net}"),
            Key::User(u) => write!(f, "user:{u}"),
            Key::Header(name, hash) => write!(f, "header:{name}:{hash}"),
            Key::Global => f.write_str("global"),
        }
    }
}

impl Key {
    /// Appends the key as the store sees it (the same text as `Display`),
    /// written without the formatting machinery for the common case, a
    /// whole IPv4 address: this runs for every limit of every request.
    pub fn render_into(&self, out: &mut String) {
        match self {
            Key::Ip(IpNet::V4(net)) if net.prefix_len() == 32 => {
                out.reserve("ip:255.255.255.255".len());
                out.push_str("ip:");
                for (i, octet) in net.addr().octets().into_iter().enumerate() {
                    if i > 0 {
                        out.push('.');
                    }
                    push_decimal(out, octet);
                }
            }
            _ => {
                use std::fmt::Write;
                // Writing into a String cannot fail.
                let _ = write!(out, "{self}");
            }
        }
    }
}

fn push_decimal(out: &mut String, n: u8) {
    if n >= 100 {
        out.push(char::from(b'0' + n / 100));
    }
    if n >= 10 {
        out.push(char::from(b'0' + n / 10 % 10));
    }
    out.push(char::from(b'0' + n % 10));
}

/// What a request offers to key on.
pub struct KeySource<'a> {
    pub client: IpAddr,
    pub identity: &'a Identity,
    pub headers: &'a HeaderMap,
}

/// The request's key for a limit of this kind; `None` when the limit does
/// not apply to it (see the table above).
pub fn build(kind: &KeyKind, src: &KeySource<'_>, cfg: &ClientIpConfig) -> Option<Key> {
    match kind {
        KeyKind::Ip => Some(Key::Ip(cfg.key_net(src.client))),
        KeyKind::User => match src.identity {
            Identity::User(u) => Some(Key::User(u.clone())),
            Identity::Anonymous => None,
        },
        KeyKind::UserOrIp => match src.identity {
            Identity::User(u) => Some(Key::User(u.clone())),
            Identity::Anonymous => Some(Key::Ip(cfg.key_net(src.client))),
        },
        KeyKind::Header(name) => {
            let v = src.headers.get(name)?;
            Some(Key::Header(name.clone(), short_hash(v.as_bytes())))
        }
        KeyKind::Global => Some(Key::Global),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ClientIpConfig {
        ClientIpConfig::default()
    }

    fn key(kind: &str, ip: &str, identity: &Identity, headers: &HeaderMap) -> Option<String> {
        let src = KeySource {
            client: ip.parse().unwrap(),
            identity,
            headers,
        };
        build(&kind.parse().unwrap(), &src, &cfg()).map(|k| k.to_string())
    }

    #[test]
    fn every_kind_builds_its_key() {
        let anon = Identity::Anonymous;
        let user = Identity::User("jwt:alice".into());
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "k-123".parse().unwrap());
        assert_eq!(
            key("ip", "203.0.113.7", &user, &h).as_deref(),
            Some("ip:203.0.113.7")
        );
        assert_eq!(
            key("ip", "2001:db8:1:2:aaaa::1", &anon, &h).as_deref(),
            Some("ip:2001:db8:1:2::/64")
        );
        assert_eq!(
            key("user", "203.0.113.7", &user, &h).as_deref(),
            Some("user:jwt:alice")
        );
        assert_eq!(key("user", "203.0.113.7", &anon, &h), None);
        assert_eq!(
            key("user_or_ip", "203.0.113.7", &user, &h).as_deref(),
            Some("user:jwt:alice")
        );
        assert_eq!(
            key("user_or_ip", "203.0.113.7", &anon, &h).as_deref(),
            Some("ip:203.0.113.7")
        );
        assert_eq!(
            key("global", "203.0.113.7", &anon, &h).as_deref(),
            Some("global")
        );
        let hk = key("header:x-api-key", "203.0.113.7", &anon, &h).unwrap();
        assert!(
            hk.starts_with("header:x-api-key:") && !hk.contains("k-123"),
            "{hk}"
        );
        assert_eq!(key("header:x-missing", "203.0.113.7", &anon, &h), None);
    }

    fn render(k: &Key) -> String {
        let mut out = "before|".to_owned();
        k.render_into(&mut out);
        out.strip_prefix("before|").unwrap().to_owned()
    }

    #[test]
    fn rendered_keys_are_their_display() {
        let keys = [
            "0.0.0.0",
            "9.10.99.100",
            "203.0.113.7",
            "255.255.255.255",
            "10.0.0.1",
        ]
        .map(|ip| Key::Ip(IpNet::from(ip.parse::<IpAddr>().unwrap())));
        let others = [
            Key::Ip("10.1.0.0/16".parse().unwrap()),
            Key::Ip(IpNet::from("2001:db8::1".parse::<IpAddr>().unwrap())),
            Key::User("jwt:alice".into()),
            Key::Global,
        ];
        for k in keys.iter().chain(&others) {
            assert_eq!(render(k), k.to_string());
        }
        assert_eq!(render(&keys[1]), "ip:9.10.99.100");
        for n in 0..=255u8 {
            let k = Key::Ip(IpNet::from(IpAddr::from([n, n, 0, 255])));
            assert_eq!(render(&k), format!("ip:{n}.{n}.0.255"));
        }
    }

    #[test]
    fn bad_kinds_are_named() {
        assert!("ipv4"
            .parse::<KeyKind>()
            .unwrap_err()
            .contains("got \"ipv4\""));
        assert!("header:bad name".parse::<KeyKind>().is_err());
    }

    #[test]
    fn ipv6_clients_in_one_slash_64_share_a_key() {
        let anon = Identity::Anonymous;
        let h = HeaderMap::new();
        let first = key("ip", "2001:db8:abcd:12::1", &anon, &h);
        for i in 0..1000u32 {
            let ip = format!(
                "2001:db8:abcd:12:{:x}:{:x}:{:x}:{:x}",
                i,
                i * 7,
                i * 13 + 1,
                0xffff - i
            );
            assert_eq!(key("ip", &ip, &anon, &h), first, "{ip}");
        }
        assert_ne!(
            key("ip", "2001:db8:abcd:13::1", &anon, &h),
            first,
            "another /64 is another client"
        );
        // IPv4-mapped addresses are keyed as IPv4.
        assert_eq!(
            key("ip", "::ffff:203.0.113.5", &anon, &h).as_deref(),
            Some("ip:203.0.113.5")
        );
    }
}
