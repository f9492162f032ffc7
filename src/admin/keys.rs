//! Keys as operators write them in the admin API, turned into the bucket a
//! limit counts in (the inverse of `metrics::top::display`):
//!
//! | written | bucket | for limits keyed by |
//! |---|---|---|
//! | `203.0.113.7`, `ip:203.0.113.7` | the address truncated to `ipv4_prefix` | `ip`, `user_or_ip` |
//! | `2001:db8:1:2::/64`, or any address in it | the `/ipv6_prefix` network | `ip`, `user_or_ip` |
//! | `user:42`, `user:jwt:alice` | as written | `user`, `user_or_ip` |
//! | `user:apikey:<32 hex>` | as written | `user`, `user_or_ip` |
//! | `header:<name>:<32 hex>` | as written | `header:<name>` |
//! | `global` | the one bucket | `global` |
//!
//! A secret is never accepted in clear: an API key or a header value must be
//! given as the hash tollgate shows for it (`/api/top`, the dashboard), so
//! pasting a raw API key is refused instead of being hashed on the
//! operator's behalf and logged.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::config::{ClientIpConfig, KeyKind};
use crate::pipeline::key::Key;

/// Hex digits in a hashed key (`identity::short_hash`).
const HASH_HEX: usize = 32;

/// The bucket `written` names for a limit keyed by `kind`, or why it names
/// none (the message is shown to the operator as is).
pub fn parse(written: &str, kind: &KeyKind, cfg: &ClientIpConfig) -> Result<String, String> {
    let written = written.trim();
    let key = if written == "global" {
        Key::Global
    } else if let Some(user) = written.strip_prefix("user:") {
        if user.is_empty() {
            return Err("`user:` needs the user id, e.g. user:42".into());
        }
        if let Some(hash) = user.strip_prefix("apikey:") {
            hashed(hash, "user:apikey:")?;
        }
        Key::User(user.to_owned())
    } else if let Some(rest) = written.strip_prefix("header:") {
        let (name, hash) = rest
            .rsplit_once(':')
            .ok_or("write a header key as header:<name>:<hash>, as /api/top shows it")?;
        let name = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("\"{name}\" is not a header name"))?;
        hashed(hash, "header:<name>:")?;
        Key::Header(name, hash.to_owned())
    } else {
        let ip = written.strip_prefix("ip:").unwrap_or(written);
        Key::Ip(network(ip, cfg)?)
    };
    let fits = match (kind, &key) {
        (KeyKind::Ip, Key::Ip(_)) | (KeyKind::Global, Key::Global) => true,
        (KeyKind::User, Key::User(_)) => true,
        (KeyKind::UserOrIp, Key::User(_) | Key::Ip(_)) => true,
        (KeyKind::Header(want), Key::Header(got, _)) => want == got,
        _ => false,
    };
    if !fits {
        return Err(format!(
            "this limit is keyed by {}; \"{written}\" is not such a key",
            kind_name(kind)
        ));
    }
    Ok(key.to_string())
}

fn kind_name(kind: &KeyKind) -> String {
    match kind {
        KeyKind::Ip => "ip (e.g. 203.0.113.7 or 2001:db8:1:2::/64)".into(),
        KeyKind::User => "user (e.g. user:42)".into(),
        KeyKind::UserOrIp => "user_or_ip (e.g. user:42 or 203.0.113.7)".into(),
        KeyKind::Header(name) => format!("header:{name} (e.g. header:{name}:<hash from /api/top>)"),
        KeyKind::Global => "global (the key is `global`)".into(),
    }
}

/// A hashed value as tollgate shows it: 32 lowercase hex digits.
fn hashed(hash: &str, what: &str) -> Result<(), String> {
    if hash.len() == HASH_HEX && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(format!(
            "{what} takes the 32-digit hash tollgate shows (in /api/top or the dashboard), never the secret itself"
        ))
    }
}

/// The bucket an address or a network falls in: an address is truncated to
/// the configured prefix (so a client's full IPv6 address finds its /64); a
/// network must be exactly such a bucket.
fn network(written: &str, cfg: &ClientIpConfig) -> Result<IpNet, String> {
    if let Ok(ip) = written.parse::<IpAddr>() {
        return Ok(cfg.key_net(ip));
    }
    let net: IpNet = written.parse().map_err(|_| {
        format!(
            "\"{written}\" is not an address, a network, user:<id>, header:<name>:<hash> or global"
        )
    })?;
    let bucket = cfg.key_net(net.addr());
    if bucket.prefix_len() != net.prefix_len() {
        return Err(format!(
            "clients are counted per /{} here; write {bucket} or an address in it",
            bucket.prefix_len()
        ));
    }
    Ok(bucket)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(written: &str, kind: &str) -> Result<String, String> {
        parse(written, &kind.parse().unwrap(), &ClientIpConfig::default())
    }

    #[test]
    fn keys_are_written_as_operators_see_them() {
        assert_eq!(p("203.0.113.7", "ip").unwrap(), "ip:203.0.113.7");
        assert_eq!(p("ip:203.0.113.7", "user_or_ip").unwrap(), "ip:203.0.113.7");
        assert_eq!(
            p("2001:db8:1:2::/64", "ip").unwrap(),
            "ip:2001:db8:1:2::/64"
        );
        assert_eq!(
            p("2001:db8:1:2:aaaa::1", "ip").unwrap(),
            "ip:2001:db8:1:2::/64",
            "an address finds its /64"
        );
        assert_eq!(p("user:42", "user").unwrap(), "user:42");
        assert_eq!(p("user:jwt:alice", "user_or_ip").unwrap(), "user:jwt:alice");
        let hash = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            p(&format!("header:x-api-key:{hash}"), "header:x-api-key").unwrap(),
            format!("header:x-api-key:{hash}")
        );
        assert_eq!(p("global", "global").unwrap(), "global");
    }

    #[test]
    fn secrets_in_clear_and_wrong_kinds_are_refused() {
        let clear = p("header:x-api-key:sk_live_123", "header:x-api-key").unwrap_err();
        assert!(clear.contains("never the secret"), "{clear}");
        assert!(p("user:apikey:sk_live_123", "user").is_err());
        let kind = p("user:42", "ip").unwrap_err();
        assert!(kind.contains("keyed by ip"), "{kind}");
        assert!(p("203.0.113.7", "user").is_err());
        let other = "header:x-other:0123456789abcdef0123456789abcdef";
        assert!(p(other, "header:x-api-key").is_err());
        let prefix = p("2001:db8::/48", "ip").unwrap_err();
        assert!(prefix.contains("per /64"), "{prefix}");
        assert!(p("not a key", "ip").is_err());
        assert!(p("user:", "user").is_err());
    }
}
