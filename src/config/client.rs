//! Validation of the `client_ip` and `identity` sections: CIDRs (refusing
//! host bits and IPv4-mapped IPv6 ranges), forwarding header names, key
//! prefixes, and JWT key material (secrets, PEM public keys, JWKS files),
//! loaded here so `tollgate check` catches an unreadable key.

use std::net::IpAddr;
use std::time::Duration;

use http::HeaderName;
use ipnet::IpNet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use super::compiled::{
    ClientIpConfig, ForwardHeader, IdentityConfig, JwtConfig, JwtKeys, OnInvalid, TokenSource,
};
use super::raw::{RawClientIp, RawIdentity, RawJwt};

/// Problems as (path, message).
use super::checker::Checker;

pub fn client_ip(raw: Option<&RawClientIp>, c: &mut Checker) -> ClientIpConfig {
    let mut out = ClientIpConfig::default();
    let Some(raw) = raw else { return out };
    out.trusted_proxies = raw
        .trusted_proxies
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, t)| match parse_cidr(&t.0) {
            Ok(net) => Some(net),
            Err(e) => {
                c.report(format!("client_ip.trusted_proxies[{i}]"), e);
                None
            }
        })
        .collect();
    if let Some(headers) = &raw.headers {
        out.headers = headers
            .iter()
            .enumerate()
            .filter_map(|(i, h)| match h.to_ascii_lowercase().as_str() {
                "x-forwarded-for" => Some(ForwardHeader::XForwardedFor),
                "x-real-ip" => Some(ForwardHeader::XRealIp),
                "cf-connecting-ip" => Some(ForwardHeader::CfConnectingIp),
                "true-client-ip" => Some(ForwardHeader::TrueClientIp),
                "forwarded" => Some(ForwardHeader::Forwarded),
                _ => {
                    c.report(
                        format!("client_ip.headers[{i}]"),
                        format!("expected one of x-forwarded-for, x-real-ip, cf-connecting-ip, true-client-ip, forwarded; got \"{h}\""),
                    );
                    None
                }
            })
            .collect();
    }
    out.ipv4_prefix = prefix(&raw.ipv4_prefix, "client_ip.ipv4_prefix", 32, 32, c);
    out.ipv6_prefix = prefix(&raw.ipv6_prefix, "client_ip.ipv6_prefix", 64, 128, c);
    out
}

fn prefix(v: &Option<super::raw::Text>, path: &str, default: u8, max: u8, c: &mut Checker) -> u8 {
    let Some(t) = v else { return default };
    match t.0.trim().trim_start_matches('/').parse::<u8>() {
        Ok(n) if (1..=max).contains(&n) => n,
        _ => {
            c.report(
                path.to_owned(),
                format!("expected a prefix length from 1 to {max}, got \"{t}\""),
            );
            default
        }
    }
}

/// `10.0.0.0/8`, `2001:db8::/32`, or a bare address (one host). Host bits
/// set and IPv4-mapped IPv6 ranges are refused: both usually mean the range
/// is not what the author thinks.
pub fn parse_cidr(text: &str) -> Result<IpNet, String> {
    let s = text.trim();
    let net: IpNet = match s.parse::<IpNet>() {
        Ok(n) => n,
        Err(_) => match s.parse::<IpAddr>() {
            Ok(ip) => IpNet::from(ip),
            Err(_) => {
                return Err(format!(
                    "expected a CIDR like \"10.0.0.0/8\" or \"2001:db8::/32\", got \"{text}\""
                ))
            }
        },
    };
    if let IpNet::V6(v6) = net {
        if v6.network().to_ipv4_mapped().is_some() && v6.prefix_len() >= 96 {
            let v4 = v6
                .network()
                .to_ipv4_mapped()
                .map(|a| a.to_string())
                .unwrap_or_default();
            return Err(format!(
                "\"{text}\" is an IPv4-mapped IPv6 range; write it as IPv4 ({v4}/{}): clients are matched as IPv4",
                v6.prefix_len() - 96
            ));
        }
    }
    if net.trunc() != net {
        return Err(format!(
            "\"{text}\" has host bits set; did you mean \"{}\"?",
            net.trunc()
        ));
    }
    Ok(net)
}

pub fn identity(raw: Option<&RawIdentity>, c: &mut Checker) -> Option<IdentityConfig> {
    let raw = raw?;
    let on_invalid = match raw.on_invalid.as_deref() {
        None | Some("anonymous") => OnInvalid::Anonymous,
        Some("reject") => OnInvalid::Reject,
        Some(other) => {
            c.report(
                "identity.on_invalid",
                format!("expected \"anonymous\" or \"reject\", got \"{other}\""),
            );
            OnInvalid::Anonymous
        }
    };
    let api_key =
        raw.api_key
            .as_ref()
            .and_then(|k| match HeaderName::from_bytes(k.header.as_bytes()) {
                Ok(h) => Some(h),
                Err(_) => {
                    c.report(
                        "identity.api_key.header",
                        format!("\"{}\" is not a valid header name", k.header),
                    );
                    None
                }
            });
    let jwt = raw.jwt.as_ref().and_then(|j| jwt(j, c));
    if raw.jwt.is_none() && raw.api_key.is_none() && raw.plans.is_none() {
        c.report("identity", "configure jwt, api_key, or both");
    }
    let plans = super::plans::plans(raw.plans.as_ref(), c);
    let names = plans.as_ref().map_or(&[][..], |p| &p.names[..]);
    let meta = match raw.api_key.as_ref().and_then(|k| k.metadata.as_ref()) {
        Some(file) => super::plans::key_metadata(file, names, c),
        None => Default::default(),
    };
    let (key_plans, key_days) = (meta.plans, meta.days);
    let billing_day = raw.billing_day.as_ref().and_then(|b| b.claim.as_deref());
    if billing_day.is_some() && raw.jwt.is_none() {
        c.report(
            "identity.billing_day.claim",
            "needs identity.jwt: a claim is read from a verified token",
        );
    }
    if let Some(r) = &raw.plans {
        if r.claim.is_some() && raw.jwt.is_none() {
            c.report(
                "identity.plans.claim",
                "needs identity.jwt: a claim is read from a verified token",
            );
        }
        let metadata = raw.api_key.as_ref().is_some_and(|k| k.metadata.is_some());
        if r.claim.is_none() && r.header.is_none() && !metadata {
            c.report(
                "identity.plans",
                "say where a plan is read: claim (a verified JWT claim), header (from trusted proxies), or identity.api_key.metadata",
            );
        }
    }
    if !key_plans.is_empty() && plans.is_none() {
        c.report(
            "identity.api_key.metadata",
            "needs identity.plans: list the plan names the file uses",
        );
    }
    Some(IdentityConfig {
        jwt,
        api_key,
        on_invalid,
        plans,
        key_plans,
        key_days,
        billing_day: billing_day.map(std::sync::Arc::from),
        keep_claims: false,
    })
}

fn jwt(raw: &RawJwt, c: &mut Checker) -> Option<JwtConfig> {
    let path = "identity.jwt";
    let mut algorithms = Vec::new();
    for (i, name) in raw.algorithms.iter().enumerate() {
        match name.as_str() {
            "HS256" => algorithms.push(Algorithm::HS256),
            "HS384" => algorithms.push(Algorithm::HS384),
            "HS512" => algorithms.push(Algorithm::HS512),
            "RS256" => algorithms.push(Algorithm::RS256),
            "ES256" => algorithms.push(Algorithm::ES256),
            _ => c.report(
                format!("{path}.algorithms[{i}]"),
                format!("expected HS256, HS384, HS512, RS256 or ES256, got \"{name}\""),
            ),
        }
    }
    if raw.algorithms.is_empty() {
        c.report(
            format!("{path}.algorithms"),
            "list at least one algorithm, e.g. [HS256]",
        );
    }
    let hmac = algorithms
        .iter()
        .any(|a| matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512));
    let public = algorithms
        .iter()
        .any(|a| matches!(a, Algorithm::RS256 | Algorithm::ES256));
    if hmac && public {
        c.report(
            format!("{path}.algorithms"),
            "mixing HMAC (HS*) with public-key algorithms lets a public key be used as an HMAC secret; pick one family"
                ,
        );
        return None;
    }
    let keys = match (&raw.secret, &raw.public_key, &raw.jwks) {
        (Some(secret), None, None) if hmac => {
            if secret.len() < 32 {
                c.report(
                    format!("{path}.secret"),
                    format!(
                        "an HMAC secret needs at least 32 bytes, this one has {}",
                        secret.len()
                    ),
                );
            }
            Some(JwtKeys::Single(DecodingKey::from_secret(secret.as_bytes())))
        }
        (None, Some(file), None) if public => {
            load_pem_key(file, &algorithms, &format!("{path}.public_key"), c)
        }
        (None, None, Some(file)) if public => load_jwks(file, &format!("{path}.jwks"), c),
        _ if hmac => {
            c.report(
                format!("{path}.secret"),
                "HS* algorithms need secret (and no public_key or jwks)",
            );
            None
        }
        _ => {
            c.report(
                path,
                "RS256/ES256 need exactly one of public_key (a PEM file) or jwks (a JWKS file)",
            );
            None
        }
    }?;
    let mut validation = Validation::new(*algorithms.first()?);
    validation.algorithms = algorithms;
    validation.leeway = c
        .duration(
            &format!("{path}.leeway"),
            &raw.leeway,
            Duration::from_secs(30),
        )
        .as_secs();
    // `exp` must be there (the crate checks it is a whole number of
    // seconds); it and `nbf` are checked against tollgate's clock by the
    // identity stage, not against the system clock inside the crate.
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.set_required_spec_claims(&["exp"]);
    if let Some(iss) = &raw.issuer {
        validation.set_issuer(&[iss]);
    }
    match &raw.audience {
        Some(aud) => validation.set_audience(&[aud]),
        None => validation.validate_aud = false,
    }
    let source = match (&raw.header, &raw.cookie) {
        (Some(_), Some(_)) => {
            c.report(path, "read the token from header or cookie, not both");
            return None;
        }
        (None, Some(c)) => TokenSource::Cookie(c.clone()),
        (h, None) => {
            match HeaderName::from_bytes(h.as_deref().unwrap_or("authorization").as_bytes()) {
                Ok(name) => TokenSource::Header(name),
                Err(_) => {
                    c.report(format!("{path}.header"), "not a valid header name");
                    return None;
                }
            }
        }
    };
    Some(JwtConfig {
        keys,
        validation,
        claim: raw.claim.clone().unwrap_or_else(|| "sub".into()),
        source,
    })
}

fn load_pem_key(
    file: &str,
    algorithms: &[Algorithm],
    path: &str,
    c: &mut Checker,
) -> Option<JwtKeys> {
    let pem = match std::fs::read(file) {
        Ok(p) => p,
        Err(e) => {
            c.report(path, format!("cannot read {file}: {e}"));
            return None;
        }
    };
    let key = if algorithms.contains(&Algorithm::RS256) {
        DecodingKey::from_rsa_pem(&pem)
    } else {
        DecodingKey::from_ec_pem(&pem)
    };
    match key {
        Ok(k) => Some(JwtKeys::Single(k)),
        Err(e) => {
            c.report(path, format!("{file} is not a usable PEM public key: {e}"));
            None
        }
    }
}

fn load_jwks(file: &str, path: &str, c: &mut Checker) -> Option<JwtKeys> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            c.report(path, format!("cannot read {file}: {e}"));
            return None;
        }
    };
    let set: jsonwebtoken::jwk::JwkSet = match serde_json::from_str(&text) {
        Ok(s) => s,
        Err(e) => {
            c.report(path, format!("{file} is not a JWKS document: {e}"));
            return None;
        }
    };
    let mut keys = Vec::new();
    for (i, jwk) in set.keys.iter().enumerate() {
        match DecodingKey::from_jwk(jwk) {
            Ok(k) => keys.push((jwk.common.key_id.clone(), k)),
            Err(e) => c.report(
                format!("{path}.keys[{i}]"),
                format!("unusable key in {file}: {e}"),
            ),
        }
    }
    if keys.is_empty() {
        c.report(path, format!("{file} holds no usable key"));
        return None;
    }
    Some(JwtKeys::Set(keys))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_refuse_host_bits_and_mapped_ranges() {
        assert_eq!(parse_cidr("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(parse_cidr("10.1.2.3").unwrap().to_string(), "10.1.2.3/32");
        assert_eq!(
            parse_cidr("2001:db8::/32").unwrap().to_string(),
            "2001:db8::/32"
        );
        let e = parse_cidr("10.0.0.1/8").unwrap_err();
        assert!(
            e.contains("host bits set; did you mean \"10.0.0.0/8\""),
            "{e}"
        );
        let e = parse_cidr("::ffff:10.0.0.0/104").unwrap_err();
        assert!(e.contains("write it as IPv4 (10.0.0.0/8)"), "{e}");
        assert!(parse_cidr("10.0.0.0/33").is_err());
        assert!(parse_cidr("cloudflare").is_err());
    }
}

#[cfg(test)]
mod config_tests {
    fn problems(section: &str) -> Vec<String> {
        let yaml = format!(
            "listeners: [{{ bind: '127.0.0.1:0', proxy_protocol: true }}]\nroutes: [{{ match: {{ path: / }}, respond: {{}} }}]\n{section}"
        );
        crate::config::testing::problems(&yaml)
    }

    #[test]
    fn client_ip_and_identity_problems_name_their_paths() {
        let found = problems(
            "client_ip: { trusted_proxies: ['10.0.0.1/8', 'nope'], headers: [x-client-ip], ipv6_prefix: 200 }
identity:
  on_invalid: maybe
  jwt: { algorithms: [RS256, none], public_key: /nonexistent.pem }
",
        );
        let expect = [
            "client_ip.trusted_proxies[0]: \"10.0.0.1/8\" has host bits set",
            "client_ip.trusted_proxies[1]: expected a CIDR",
            "client_ip.headers[0]: expected one of",
            "client_ip.ipv6_prefix: expected a prefix length from 1 to 128",
            "identity.on_invalid: expected \"anonymous\" or \"reject\"",
            "identity.jwt.algorithms[1]: expected HS256",
            "identity.jwt.public_key: cannot read /nonexistent.pem",
            // Both CIDRs were refused, so nothing is trusted.
            "listeners[0].proxy_protocol: needs client_ip.trusted_proxies",
        ];
        crate::config::testing::assert_exactly(&found, &expect);
    }

    #[test]
    fn proxy_protocol_needs_trusted_proxies_and_hmac_needs_a_long_secret() {
        let found = problems("identity: { jwt: { algorithms: [HS256], secret: short } }\n");
        assert!(
            found
                .iter()
                .any(|f| f
                    .starts_with("listeners[0].proxy_protocol: needs client_ip.trusted_proxies")),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|f| f
                    .starts_with("identity.jwt.secret: an HMAC secret needs at least 32 bytes")),
            "{found:?}"
        );
        let found = problems("client_ip: { trusted_proxies: [127.0.0.1] }\nidentity: { jwt: { algorithms: [HS256, RS256], secret: x } }\n");
        assert!(found.iter().any(|f| f.contains("mixing HMAC")), "{found:?}");
    }
}
