//! Validation of an upstream's `balance` (nginx's balancing methods, in
//! its words) and `next_upstream` (nginx `proxy_next_upstream`, `_tries`,
//! `_timeout`).

use std::time::Duration;

use super::checker::Checker;
use super::compiled::*;
use super::raw::{RawHealthCheck, RawNextUpstream, RawResolver};

/// `balance` at `path`: `round_robin` (default), `least_conn`, `random`,
/// `random two`, `random two least_conn`, `ip_hash`, `hash <key>
/// [consistent]`.
pub(super) fn balance(c: &mut Checker, path: &str, text: Option<&str>) -> Balance {
    let Some(text) = text else {
        return Balance::RoundRobin;
    };
    let words: Vec<&str> = text.split_whitespace().collect();
    let method = match words.as_slice() {
        ["round_robin"] => Ok(Balance::RoundRobin),
        ["least_conn"] => Ok(Balance::LeastConn),
        ["random"] => Ok(Balance::Random { two: false }),
        ["random", "two"] | ["random", "two", "least_conn"] => Ok(Balance::Random { two: true }),
        ["ip_hash"] => Ok(Balance::IpHash),
        ["ewma"] => Ok(Balance::Ewma),
        ["hash", key] => hash_key(key).map(|key| Balance::Hash {
            key,
            consistent: false,
        }),
        ["hash", key, "consistent"] => hash_key(key).map(|key| Balance::Hash {
            key,
            consistent: true,
        }),
        ["hash", ..] => Err("expected \"hash <key>\" or \"hash <key> consistent\"".to_owned()),
        _ => Err(format!(
            "expected round_robin, least_conn, random, \"random two least_conn\", ip_hash, \"hash <key> [consistent]\" or ewma, got \"{text}\""
        )),
    };
    method.unwrap_or_else(|e| {
        c.report(path, e);
        Balance::RoundRobin
    })
}

/// A hash key: one word of the limits' vocabulary (`ip`, `user`, `path`,
/// `request_uri`, `header:<name>`, `arg:<name>`, `cookie:<name>`), or nginx
/// variables and text (`$arg_user`, `$cookie_session`, `$host$request_uri`).
pub(crate) fn hash_key(text: &str) -> Result<HashKey, String> {
    let word = |w: &str| -> Option<KeyPart> {
        Some(match w {
            "ip" => KeyPart::Ip,
            "user" => KeyPart::User,
            "path" => KeyPart::Path,
            "request_uri" => KeyPart::RequestUri,
            _ => {
                let (kind, name) = w.split_once(':')?;
                match kind {
                    "header" => {
                        KeyPart::Header(http::HeaderName::from_bytes(name.as_bytes()).ok()?)
                    }
                    "arg" if !name.is_empty() => KeyPart::Arg(name.to_owned()),
                    "cookie" if !name.is_empty() => KeyPart::Cookie(name.to_owned()),
                    _ => return None,
                }
            }
        })
    };
    if !text.contains('$') {
        return word(text).map(|p| HashKey(vec![p])).ok_or_else(|| {
            format!("unknown hash key \"{text}\": expected ip, user, path, request_uri, header:<name>, arg:<name>, cookie:<name> or nginx variables ($arg_user, $cookie_session, $request_uri, $remote_addr, $uri, $args, $host, $http_<name>)")
        });
    }
    let mut parts = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let Some(after) = rest.strip_prefix('$') else {
            let end = rest.find('$').unwrap_or(rest.len());
            parts.push(KeyPart::Text(rest[..end].to_owned()));
            rest = &rest[end..];
            continue;
        };
        // `${name}` or `$name` (letters, digits, `_`).
        let (name, next) = match after.strip_prefix('{') {
            Some(braced) => {
                let end = braced
                    .find('}')
                    .ok_or_else(|| format!("unclosed \"${{\" in hash key \"{text}\""))?;
                (&braced[..end], &braced[end + 1..])
            }
            None => {
                let end = after
                    .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                    .unwrap_or(after.len());
                (&after[..end], &after[end..])
            }
        };
        parts.push(variable(name).ok_or_else(|| {
            format!("hash key \"{text}\": ${name} is not a variable tollgate knows ($remote_addr, $request_uri, $uri, $args, $arg_<name>, $cookie_<name>, $http_<name>, $host)")
        })?);
        rest = next;
    }
    Ok(HashKey(parts))
}

fn variable(name: &str) -> Option<KeyPart> {
    Some(match name {
        "remote_addr" | "binary_remote_addr" => KeyPart::Ip,
        "request_uri" => KeyPart::RequestUri,
        "uri" | "document_uri" => KeyPart::Path,
        "args" | "query_string" => KeyPart::Args,
        "host" => KeyPart::Host,
        "remote_user" => KeyPart::User,
        _ => {
            if let Some(arg) = name.strip_prefix("arg_").filter(|a| !a.is_empty()) {
                KeyPart::Arg(arg.to_owned())
            } else if let Some(cookie) = name.strip_prefix("cookie_").filter(|a| !a.is_empty()) {
                KeyPart::Cookie(cookie.to_owned())
            } else if let Some(h) = name.strip_prefix("http_").filter(|a| !a.is_empty()) {
                KeyPart::Header(http::HeaderName::from_bytes(h.replace('_', "-").as_bytes()).ok()?)
            } else {
                return None;
            }
        }
    })
}

/// `next_upstream` at `path`.
pub(super) fn next_upstream(
    c: &mut Checker,
    path: &str,
    raw: Option<&RawNextUpstream>,
) -> NextUpstream {
    let mut next = NextUpstream::default();
    let Some(raw) = raw else {
        return next;
    };
    if let Some(on) = &raw.on {
        next.on = 0;
        for (i, word) in on.iter().enumerate() {
            match NextUpstream::bit(word) {
                Some(bit) => next.on |= bit,
                None if word == "off" && on.len() == 1 => {}
                None => c.report(
                    format!("{path}.on[{i}]"),
                    format!(
                        "unknown condition \"{word}\": expected off or any of {}",
                        NextUpstream::CONDITIONS.join(", ")
                    ),
                ),
            }
        }
    }
    next.tries = c.number(&format!("{path}.tries"), &raw.tries, 0u32, 0, 1000);
    if raw.tries.is_some() && next.on & !(1 << 10) == 0 {
        c.report(
            format!("{path}.tries"),
            "tries without a condition in `on` never retries: list one (error, timeout...)",
        );
    }
    if raw.timeout.is_some() {
        next.timeout = Some(c.positive_duration(
            &format!("{path}.timeout"),
            &raw.timeout,
            Duration::from_secs(1),
        ))
        .filter(|t| !t.is_zero());
    }
    next.max_body = c.size(&format!("{path}.max_body"), &raw.max_body, next.max_body);
    next.budget = raw.budget.as_ref().map(|b| {
        let ratio: f64 = c.number(&format!("{path}.budget.ratio"), &b.ratio, 0.2, 0.0, 10.0);
        RetryBudget {
            per_mille: (ratio * 1000.0).round() as u32,
            min_per_second: c.number(
                &format!("{path}.budget.min_per_second"),
                &b.min_per_second,
                10u32,
                0,
                1_000_000,
            ),
            window: c.positive_duration(
                &format!("{path}.budget.window"),
                &b.window,
                Duration::from_secs(10),
            ),
        }
    });
    next
}

/// `resolver` at `path`: the DNS server (`ip[:port]`), `valid`, `timeout`.
pub(super) fn resolver(c: &mut Checker, path: &str, raw: Option<&RawResolver>) -> Resolver {
    let mut r = Resolver::default();
    let Some(raw) = raw else {
        return r;
    };
    if let Some(a) = &raw.address {
        let with_port = if a.parse::<std::net::IpAddr>().is_ok() {
            if a.contains(':') {
                format!("[{a}]:53")
            } else {
                format!("{a}:53")
            }
        } else {
            a.clone()
        };
        match with_port.parse() {
            Ok(addr) => r.address = Some(addr),
            Err(_) => c.report(
                format!("{path}.address"),
                format!("expected an IP address with an optional port (10.0.0.2, 10.0.0.2:5353), got \"{a}\""),
            ),
        }
    }
    if raw.valid.is_some() {
        r.valid = Some(c.positive_duration(
            &format!("{path}.valid"),
            &raw.valid,
            Duration::from_secs(30),
        ));
    }
    r.timeout = c.positive_duration(&format!("{path}.timeout"), &raw.timeout, r.timeout);
    r
}

/// `health_check` at `path`: nginx Plus's defaults (`/`, every 5 s, one
/// failure takes a target out, one pass brings it back, 2xx and 3xx pass),
/// with a 1 s timeout.
pub(super) fn health_check(c: &mut Checker, path: &str, raw: &RawHealthCheck) -> HealthCheck {
    let target = raw.path.clone().unwrap_or_else(|| "/".to_owned());
    if !target.starts_with('/') || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        c.report(
            format!("{path}.path"),
            format!("expected a path starting with /, got \"{target}\""),
        );
    }
    let status = match raw.status.as_ref().map(|t| t.0.as_str()) {
        None => (200, 399),
        Some(s) => {
            let (lo, hi) = s.split_once('-').unwrap_or((s, s));
            match (lo.trim().parse::<u16>(), hi.trim().parse::<u16>()) {
                (Ok(lo), Ok(hi)) if (100..=599).contains(&lo) && lo <= hi && hi <= 599 => (lo, hi),
                _ => {
                    c.report(
                        format!("{path}.status"),
                        format!("expected a status or a range like 200-399, got \"{s}\""),
                    );
                    (200, 399)
                }
            }
        }
    };
    HealthCheck {
        path: target,
        interval: c.positive_duration(
            &format!("{path}.interval"),
            &raw.interval,
            Duration::from_secs(5),
        ),
        timeout: c.positive_duration(
            &format!("{path}.timeout"),
            &raw.timeout,
            Duration::from_secs(1),
        ),
        fails: c.number(&format!("{path}.fails"), &raw.fails, 1u32, 1, 1000),
        passes: c.number(&format!("{path}.passes"), &raw.passes, 1u32, 1, 1000),
        status,
    }
}

/// nginx refuses `backup` with the methods that pick by key or at random.
pub(super) fn allows_backup(balance: &Balance) -> Option<&'static str> {
    match balance {
        Balance::Hash { .. } => Some("hash"),
        Balance::IpHash => Some("ip_hash"),
        Balance::Random { .. } => Some("random"),
        Balance::RoundRobin | Balance::LeastConn | Balance::Ewma => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_in_both_vocabularies() {
        assert_eq!(
            hash_key("$arg_user").unwrap(),
            HashKey(vec![KeyPart::Arg("user".into())])
        );
        assert_eq!(
            hash_key("arg:user").unwrap(),
            hash_key("$arg_user").unwrap()
        );
        assert_eq!(
            hash_key("$host$request_uri").unwrap(),
            HashKey(vec![KeyPart::Host, KeyPart::RequestUri])
        );
        assert_eq!(
            hash_key("u-${cookie_session}!").unwrap(),
            HashKey(vec![
                KeyPart::Text("u-".into()),
                KeyPart::Cookie("session".into()),
                KeyPart::Text("!".into())
            ])
        );
        assert_eq!(
            hash_key("$http_x_tenant").unwrap(),
            HashKey(vec![KeyPart::Header(http::HeaderName::from_static(
                "x-tenant"
            ))])
        );
        assert!(hash_key("$upstream_addr")
            .unwrap_err()
            .contains("$upstream_addr"));
        assert!(hash_key("bogus").is_err());
    }
}
