//! Webhook routes: source allowlists and signature checks.
//!
//! The stage runs after the zones and the identity: `only_allowed_sources`
//! refuses everyone else with 403 (counted by the zones like any request).
//! Signatures are checked as the body is read, on the way upstream, after
//! the route limits (so a forged signature is counted by those too).
//!
//! `allow_sources` is decided on the resolved client, which is the socket
//! peer unless the peer is a trusted proxy: a spoofed `X-Forwarded-For`
//! naming GitHub's range gets nothing. Signatures are the real security
//! layer: the body is read (up to the route's size limit), its HMAC-SHA256
//! compared in constant time, and only then forwarded.

use http::HeaderMap;

use crate::config::{RouteConfig, VerifyConfig, VerifyScheme, WebhookConfig};
use crate::error::ProxyError;

impl WebhookConfig {
    pub fn allows(&self, client: std::net::IpAddr) -> bool {
        self.allow_sources.iter().any(|net| net.contains(&client))
    }
}

/// Whether `route` refuses `client` (`only_allowed_sources`, not one of them).
pub fn refuses(route: Option<&RouteConfig>, client: std::net::IpAddr) -> bool {
    route
        .and_then(|r| r.webhook.as_ref())
        .is_some_and(|w| w.only_allowed && !w.allows(client))
}

/// The stage: 403 for a source a webhook route does not accept.
pub fn check_source(
    route: Option<&RouteConfig>,
    client: std::net::IpAddr,
) -> Result<(), ProxyError> {
    if refuses(route, client) {
        return Err(ProxyError::Forbidden(
            "this route only accepts requests from its allowed sources",
        ));
    }
    Ok(())
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Checks a webhook body's signature; `now` is Unix seconds (Stripe).
pub fn verify(
    cfg: &VerifyConfig,
    headers: &HeaderMap,
    body: &[u8],
    now: u64,
) -> Result<(), ProxyError> {
    let value = headers
        .get(&cfg.header)
        .and_then(|v| v.to_str().ok())
        .ok_or(ProxyError::BadSignature("no signature header"))?;
    match cfg.scheme {
        VerifyScheme::Github | VerifyScheme::HmacSha256 => {
            let hex = value.trim().strip_prefix("sha256=").unwrap_or(value.trim());
            let sig = unhex(hex).ok_or(ProxyError::BadSignature("the signature is not hex"))?;
            if mac_ok(&cfg.secret, &[body], &sig) {
                Ok(())
            } else {
                Err(ProxyError::BadSignature(
                    "the signature does not match the body",
                ))
            }
        }
        VerifyScheme::Stripe => {
            let mut t = None;
            let mut sigs = Vec::new();
            for part in value.split(',') {
                match part.trim().split_once('=') {
                    Some(("t", v)) => t = v.parse::<u64>().ok(),
                    Some(("v1", v)) => sigs.extend(unhex(v)),
                    _ => {}
                }
            }
            let t = t.ok_or(ProxyError::BadSignature("no timestamp"))?;
            if now.abs_diff(t) > cfg.tolerance.as_secs() {
                return Err(ProxyError::BadSignature(
                    "the signed timestamp is outside the tolerance",
                ));
            }
            let stamp = t.to_string();
            if sigs
                .iter()
                .any(|sig| mac_ok(&cfg.secret, &[stamp.as_bytes(), b".", body], sig))
            {
                Ok(())
            } else {
                Err(ProxyError::BadSignature("no v1 signature matches the body"))
            }
        }
    }
}

use crate::secret::mac_ok;
pub use crate::secret::sign;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn cfg(scheme: VerifyScheme, header: &'static str) -> VerifyConfig {
        VerifyConfig {
            scheme,
            secret: b"whsec_0123456789abcdef".to_vec(),
            header: http::HeaderName::from_static(header),
            tolerance: Duration::from_secs(300),
        }
    }

    fn headers(name: &'static str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, value.parse().unwrap());
        h
    }

    #[test]
    fn github_signatures() {
        let c = cfg(VerifyScheme::Github, "x-hub-signature-256");
        let body = br#"{"action":"opened"}"#;
        let good = format!("sha256={}", sign(&c.secret, &[body]));
        assert!(verify(&c, &headers("x-hub-signature-256", &good), body, 0).is_ok());
        assert!(verify(
            &c,
            &headers("x-hub-signature-256", &good),
            br#"{"action":"closed"}"#,
            0
        )
        .is_err());
        assert!(verify(&c, &HeaderMap::new(), body, 0).is_err());
        assert!(verify(&c, &headers("x-hub-signature-256", "sha256=zz"), body, 0).is_err());
    }

    #[test]
    fn stripe_signatures_with_tolerance() {
        let c = cfg(VerifyScheme::Stripe, "stripe-signature");
        let body = br#"{"type":"charge.succeeded"}"#;
        let t = 1_700_000_000u64;
        let sig = sign(&c.secret, &[t.to_string().as_bytes(), b".", body]);
        let h = headers("stripe-signature", &format!("t={t},v1=deadbeef,v1={sig}"));
        assert!(verify(&c, &h, body, t + 10).is_ok());
        assert!(verify(&c, &h, body, t + 301).is_err(), "too old");
        assert!(verify(&c, &h, b"{}", t).is_err(), "tampered");
    }
}
