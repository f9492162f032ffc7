//! Validation of a route's webhook settings: `allow_sources`,
//! `only_allowed_sources` and `verify` (signature schemes and secrets).

use std::time::Duration;

use http::HeaderName;

use super::checker::Checker;
use super::client::parse_cidr;
use super::compiled::*;
use super::raw::{RawRoute, RawVerify};

pub fn webhook(path: &str, r: &RawRoute, c: &mut Checker) -> Option<WebhookConfig> {
    if r.allow_sources.is_none() && r.verify.is_none() && r.only_allowed_sources.is_none() {
        return None;
    }
    let allow_sources: Vec<_> = r
        .allow_sources
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, s)| {
            parse_cidr(&s.0)
                .map_err(|e| c.report(format!("{path}.allow_sources[{i}]"), e))
                .ok()
        })
        .collect();
    let only_allowed = r.only_allowed_sources.unwrap_or(false);
    if only_allowed && r.allow_sources.is_none() {
        c.report(
            format!("{path}.only_allowed_sources"),
            "needs allow_sources",
        );
    }
    let verify = r
        .verify
        .as_ref()
        .and_then(|v| verify(&format!("{path}.verify"), v, c));
    Some(WebhookConfig {
        allow_sources,
        only_allowed,
        verify,
    })
}

fn verify(path: &str, v: &RawVerify, c: &mut Checker) -> Option<VerifyConfig> {
    let (scheme, default_header) = match v.scheme.as_str() {
        "github" => (VerifyScheme::Github, "x-hub-signature-256"),
        "stripe" => (VerifyScheme::Stripe, "stripe-signature"),
        "hmac-sha256" => (VerifyScheme::HmacSha256, "x-signature"),
        other => {
            c.report(
                format!("{path}.scheme"),
                format!("expected github, stripe or hmac-sha256, got \"{other}\""),
            );
            return None;
        }
    };
    if v.secret.len() < 16 {
        c.report(
            format!("{path}.secret"),
            format!(
                "a signing secret needs at least 16 characters, this one has {}",
                v.secret.len()
            ),
        );
    }
    let header = HeaderName::from_bytes(v.header.as_deref().unwrap_or(default_header).as_bytes())
        .map_err(|_| c.report(format!("{path}.header"), "not a valid header name"))
        .ok()?;
    let tolerance = c.duration(
        &format!("{path}.tolerance"),
        &v.tolerance,
        Duration::from_secs(300),
    );
    Some(VerifyConfig {
        scheme,
        secret: v.secret.as_bytes().to_vec(),
        header,
        tolerance,
    })
}
