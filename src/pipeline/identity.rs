//! Identity: a verified user id for per-user limits, from a JWT or an API key.
//!
//! A JWT is verified (signature with the configured algorithms only, so
//! `alg: none` and algorithm swaps fail; `exp` required; `nbf`, issuer and
//! audience checked) before its claim is believed. An API key is never kept:
//! the user is a hash of it. A request with no credential is anonymous; one
//! whose credential does not verify is anonymous too, or refused with 401
//! under `on_invalid: reject`.
//!
//! This stage runs after the zones: a client over its zone is refused
//! before any signature is checked.

use std::sync::atomic::{AtomicU64, Ordering};

use http::header::{HeaderMap, COOKIE};
use jsonwebtoken::{decode, decode_header, DecodingKey};
use sha2::{Digest, Sha256};

use crate::clock::Clock;
use crate::config::{IdentityConfig, JwtConfig, JwtKeys, OnInvalid, TokenSource};
use crate::error::ProxyError;

/// The identity stage: the configured credentials, if any.
pub struct Identify {
    config: Option<IdentityConfig>,
    /// What a token's `exp` and `nbf` are checked against.
    clock: Clock,
    /// Tokens whose signature was checked, for tests and operators: a
    /// flood refused by the zones must not move it.
    verified: AtomicU64,
}

impl Identify {
    pub fn new(config: Option<IdentityConfig>, clock: Clock) -> Self {
        Identify {
            config,
            clock,
            verified: AtomicU64::new(0),
        }
    }

    /// Whether the request carries a token to verify: a signature check
    /// that costs real work and, under `on_invalid: reject`, may refuse it.
    pub fn has_token(&self, headers: &HeaderMap) -> bool {
        self.config
            .as_ref()
            .and_then(|c| c.jwt.as_ref())
            .is_some_and(|jwt| token(&jwt.source, headers).is_some())
    }

    /// The request's identity and plan; a 401 for an unverifiable
    /// credential under `on_invalid: reject`. `peer_trusted`: the peer is a
    /// trusted proxy, whose plan header is believed.
    pub fn identify(
        &self,
        headers: &HeaderMap,
        peer_trusted: bool,
    ) -> Result<Verified, ProxyError> {
        let Some(config) = &self.config else {
            return Ok(Verified::default());
        };
        if self.has_token(headers) {
            self.verified.fetch_add(1, Ordering::Relaxed);
        }
        config
            .verify_request(headers, &self.clock, peer_trusted)
            .map_err(|e| ProxyError::Unauthorized(e.0))
    }

    /// How many tokens this stage has verified (or tried to).
    pub fn verifications(&self) -> u64 {
        self.verified.load(Ordering::Relaxed)
    }
}

/// What the identity stage found: who, on which plan, and (when a limit
/// reads a cost from one) the token's claims.
#[derive(Debug, Default)]
pub struct Verified {
    pub identity: Identity,
    pub plan: Option<u8>,
    /// The key's billing day (1-31), for quotas anchored on it.
    pub billing_day: Option<u8>,
    pub claims: Option<Claims>,
}

pub type Claims = serde_json::Map<String, serde_json::Value>;

/// Who the request is, as far as it could be verified.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Identity {
    #[default]
    Anonymous,
    /// A user id: `jwt:<claim value>` or `apikey:<hash>`.
    User(String),
}

/// Why a presented credential was not accepted (never includes the secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidCredential(pub String);

impl IdentityConfig {
    /// Verifies the request's credential (a token's validity period on
    /// `clock`). `Err` only with `on_invalid: reject`.
    pub fn identify(
        &self,
        headers: &HeaderMap,
        clock: &Clock,
    ) -> Result<Identity, InvalidCredential> {
        Ok(self.verify_request(headers, clock, false)?.identity)
    }

    /// [`IdentityConfig::identify`], with the plan: from the token's plan
    /// claim, the API key's metadata, or (from a trusted peer) the plan
    /// header, in that order; an unknown or missing one is the default.
    pub fn verify_request(
        &self,
        headers: &HeaderMap,
        clock: &Clock,
        peer_trusted: bool,
    ) -> Result<Verified, InvalidCredential> {
        let mut found = self.credential(headers, clock)?;
        if let Some(plans) = &self.plans {
            let from_claim = || {
                let claim = plans.claim.as_ref()?;
                let name = found.claims.as_ref()?.get(claim)?.as_str()?;
                crate::config::plans::index(&plans.names, name)
            };
            let from_key = || match &found.identity {
                Identity::User(u) => self.key_plans.get(u.strip_prefix("apikey:")?).copied(),
                Identity::Anonymous => None,
            };
            let from_header = || {
                let name = headers.get(plans.header.as_ref()?)?.to_str().ok()?;
                crate::config::plans::index(&plans.names, name.trim())
            };
            found.plan = from_claim()
                .or_else(from_key)
                .or_else(|| peer_trusted.then(from_header).flatten())
                .or(plans.default);
        }
        let day_of_key = || match &found.identity {
            Identity::User(u) => self.key_days.get(u.strip_prefix("apikey:")?).copied(),
            Identity::Anonymous => None,
        };
        let day_of_claim = || {
            let claim = self.billing_day.as_ref()?;
            crate::config::quota::billing_day(found.claims.as_ref()?.get(&**claim)?)
        };
        found.billing_day = day_of_claim().or_else(day_of_key);
        if !self.keep_claims {
            found.claims = None;
        }
        Ok(found)
    }

    /// The verified user (and a token's claims).
    fn credential(
        &self,
        headers: &HeaderMap,
        clock: &Clock,
    ) -> Result<Verified, InvalidCredential> {
        if let Some(jwt) = &self.jwt {
            if let Some(token) = token(&jwt.source, headers) {
                match verify(jwt, token, clock) {
                    Ok((user, claims)) => {
                        return Ok(Verified {
                            identity: Identity::User(format!("jwt:{user}")),
                            plan: None,
                            billing_day: None,
                            claims: Some(claims),
                        })
                    }
                    Err(reason) => {
                        tracing::debug!(%reason, "unverifiable token; treating the request as anonymous");
                        if self.on_invalid == OnInvalid::Reject {
                            return Err(InvalidCredential(reason));
                        }
                    }
                }
            }
        }
        if let Some(name) = &self.api_key {
            if let Some(key) = headers
                .get(name)
                .map(|v| v.as_bytes())
                .filter(|k| !k.is_empty())
            {
                return Ok(Verified {
                    identity: Identity::User(format!("apikey:{}", short_hash(key))),
                    ..Verified::default()
                });
            }
        }
        Ok(Verified::default())
    }
}

/// A short, stable, one-way name for a secret (first 16 bytes of SHA-256,
/// hex): fine as a bucket key, useless for recovering the secret.
pub fn short_hash(secret: &[u8]) -> String {
    let digest = Sha256::digest(secret);
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn token<'a>(source: &TokenSource, headers: &'a HeaderMap) -> Option<&'a str> {
    match source {
        TokenSource::Header(name) => {
            let v = headers.get(name)?.to_str().ok()?.trim();
            let t = match v.get(..7) {
                Some(p) if p.eq_ignore_ascii_case("bearer ") => v[7..].trim(),
                _ => v,
            };
            (!t.is_empty()).then_some(t)
        }
        TokenSource::Cookie(cookie) => headers
            .get_all(COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(k, _)| k == cookie)
            .map(|(_, v)| v.trim()),
    }
}

fn verify(jwt: &JwtConfig, token: &str, clock: &Clock) -> Result<(String, Claims), String> {
    let key: &DecodingKey = match &jwt.keys {
        JwtKeys::Single(k) => k,
        JwtKeys::Set(keys) => {
            let header = decode_header(token).map_err(|e| format!("malformed token: {e}"))?;
            match (&header.kid, keys.as_slice()) {
                (Some(kid), _) => keys
                    .iter()
                    .find(|(id, _)| id.as_deref() == Some(kid.as_str()))
                    .map(|(_, k)| k)
                    .ok_or_else(|| format!("no key with kid \"{kid}\""))?,
                (None, [(_, only)]) => only,
                (None, _) => return Err("token has no kid and the JWKS holds several keys".into()),
            }
        }
    };
    let data = decode::<serde_json::Map<String, serde_json::Value>>(token, key, &jwt.validation)
        .map_err(|e| format!("token rejected: {e}"))?;
    check_period(&data.claims, clock.unix_ms() / 1000, jwt.validation.leeway)?;
    let user = match data.claims.get(&jwt.claim) {
        Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        _ => return Err(format!("token has no usable \"{}\" claim", jwt.claim)),
    };
    Ok((user, data.claims))
}

/// A verified token's validity period at `now` (seconds), with `leeway`
/// either side: `exp` (required, a whole number of seconds, which the
/// crate has checked) not passed, `nbf` (when present) reached. These are
/// the crate's own rules, on tollgate's clock.
fn check_period(
    claims: &serde_json::Map<String, serde_json::Value>,
    now: u64,
    leeway: u64,
) -> Result<(), String> {
    let seconds = |name: &str| match claims.get(name) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("token rejected: \"{name}\" is not a time")),
    };
    match seconds("exp")? {
        None => return Err("token rejected: it has no \"exp\"".into()),
        Some(exp) if exp < now.saturating_sub(leeway) => {
            return Err("token rejected: it has expired".into())
        }
        Some(_) => {}
    }
    match seconds("nbf")? {
        Some(nbf) if nbf > now.saturating_add(leeway) => {
            Err("token rejected: it is not valid yet".into())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
