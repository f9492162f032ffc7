//! JWT and API-key identity: valid tokens give the user, everything else is
//! anonymous (or a 401 with `on_invalid: reject`).

use http::{HeaderMap, HeaderValue};
use jsonwebtoken::{encode, EncodingKey, Header};

use super::*;
use crate::config::Config;

const SECRET: &str = "0123456789abcdef0123456789abcdef-test";

fn now() -> u64 {
    crate::clock::unix_ms() / 1000
}

fn identity(yaml: &str) -> IdentityConfig {
    let full = format!(
        "listeners: [{{ bind: '127.0.0.1:0' }}]\nadmin: {{ enabled: false }}\nroutes: [{{ match: {{ path: / }}, respond: {{}} }}]\nidentity:\n{yaml}"
    );
    Config::from_yaml(&full, &|_| None)
        .unwrap_or_else(|e| panic!("{e}"))
        .identity
        .unwrap()
}

fn hs256(on_invalid: &str) -> IdentityConfig {
    identity(&format!(
        "  jwt: {{ algorithms: [HS256], secret: '{SECRET}' }}\n  on_invalid: {on_invalid}\n"
    ))
}

fn bearer(token: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    h
}

fn sign_hs(claims: serde_json::Value, secret: &str) -> String {
    encode(
        &Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

#[test]
fn a_valid_hs256_token_gives_the_user() {
    let id = hs256("anonymous");
    let token = sign_hs(
        serde_json::json!({ "sub": "alice", "exp": now() + 600 }),
        SECRET,
    );
    assert_eq!(
        id.identify(&bearer(&token), &Clock::system()),
        Ok(Identity::User("jwt:alice".into()))
    );
    assert_eq!(
        id.identify(&HeaderMap::new(), &Clock::system()),
        Ok(Identity::Anonymous),
        "no token: anonymous"
    );
}

#[test]
fn bad_tokens_are_anonymous_or_rejected() {
    let expired = sign_hs(
        serde_json::json!({ "sub": "alice", "exp": now() - 3600 }),
        SECRET,
    );
    let not_yet = sign_hs(
        serde_json::json!({ "sub": "alice", "exp": now() + 7200, "nbf": now() + 3600 }),
        SECRET,
    );
    let wrong_key = sign_hs(
        serde_json::json!({ "sub": "alice", "exp": now() + 600 }),
        "another-secret-of-at-least-32-bytes!!",
    );
    let good = sign_hs(
        serde_json::json!({ "sub": "alice", "exp": now() + 600 }),
        SECRET,
    );
    let tampered = {
        let mut parts: Vec<String> = good.split('.').map(str::to_owned).collect();
        use base64_url::encode as b64;
        parts[1] = b64(&serde_json::json!({ "sub": "mallory", "exp": now() + 600 }).to_string());
        parts.join(".")
    };
    let alg_none = format!(
        "{}.{}.",
        base64_url::encode(r#"{"alg":"none","typ":"JWT"}"#),
        base64_url::encode(
            &serde_json::json!({ "sub": "mallory", "exp": now() + 600 }).to_string()
        )
    );
    let no_exp = sign_hs(serde_json::json!({ "sub": "alice" }), SECRET);
    for (name, token) in [
        ("expired", expired),
        ("not yet valid", not_yet),
        ("wrong key", wrong_key),
        ("tampered", tampered),
        ("alg none", alg_none),
        ("no exp", no_exp),
        ("garbage", "not.a.jwt".to_owned()),
    ] {
        assert_eq!(
            hs256("anonymous").identify(&bearer(&token), &Clock::system()),
            Ok(Identity::Anonymous),
            "{name}"
        );
        assert!(
            hs256("reject")
                .identify(&bearer(&token), &Clock::system())
                .is_err(),
            "{name} must be rejected"
        );
    }
}

#[test]
fn a_token_s_validity_period_is_read_on_tollgate_s_clock() {
    // The default leeway is 30 s either side.
    let frozen = crate::clock::FrozenClock::new();
    let clock = frozen.clock();
    let start = clock.unix_ms() / 1000;
    let expiring = sign_hs(
        serde_json::json!({ "sub": "alice", "exp": start + 60 }),
        SECRET,
    );
    let later = sign_hs(
        serde_json::json!({ "sub": "bob", "exp": start + 3600, "nbf": start + 100 }),
        SECRET,
    );
    let malformed = sign_hs(
        serde_json::json!({ "sub": "carol", "exp": start + 3600, "nbf": "soon" }),
        SECRET,
    );
    let id = hs256("reject");
    let who = |token: &str| id.identify(&bearer(token), &clock);
    assert_eq!(who(&expiring), Ok(Identity::User("jwt:alice".into())));
    assert!(who(&later).is_err(), "nbf 100 s ahead");
    assert!(who(&malformed).is_err(), "nbf that is no time");
    frozen.advance(std::time::Duration::from_secs(75));
    assert_eq!(
        who(&later),
        Ok(Identity::User("jwt:bob".into())),
        "nbf within leeway"
    );
    assert_eq!(
        who(&expiring),
        Ok(Identity::User("jwt:alice".into())),
        "expired 15 s ago, within leeway"
    );
    frozen.advance(std::time::Duration::from_secs(20));
    assert!(who(&expiring).is_err(), "expired 35 s ago");
    assert_eq!(who(&later), Ok(Identity::User("jwt:bob".into())));
}

/// base64url without padding, as JWTs use.
mod base64_url {
    pub fn encode(data: &str) -> String {
        super::raw_b64url(data.as_bytes())
    }
}

#[test]
fn rs256_tokens_verify_against_a_pem_public_key_and_a_jwks() {
    use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
    use rsa::traits::PublicKeyParts;
    let private = rsa::RsaPrivateKey::new(&mut rand::thread_rng(), 2048).unwrap();
    let public = private.to_public_key();
    let dir = tempfile::tempdir().unwrap();
    let pem_path = dir.path().join("jwt.pub.pem");
    std::fs::write(&pem_path, public.to_public_key_pem(LineEnding::LF).unwrap()).unwrap();
    let n = public.n().to_bytes_be();
    let e = public.e().to_bytes_be();
    let jwks = serde_json::json!({ "keys": [{ "kty": "RSA", "kid": "k1", "alg": "RS256", "use": "sig", "n": raw_b64url(&n), "e": raw_b64url(&e) }] });
    let jwks_path = dir.path().join("jwks.json");
    std::fs::write(&jwks_path, jwks.to_string()).unwrap();

    let key = EncodingKey::from_rsa_pem(private.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes())
        .unwrap();
    let claims =
        serde_json::json!({ "sub": "bob", "exp": now() + 600, "iss": "https://idp.example" });
    let mut header = Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some("k1".into());
    let token = encode(&header, &claims, &key).unwrap();

    let by_pem = identity(&format!(
        "  jwt: {{ algorithms: [RS256], public_key: '{}', issuer: 'https://idp.example' }}\n",
        pem_path.display()
    ));
    assert_eq!(
        by_pem.identify(&bearer(&token), &Clock::system()),
        Ok(Identity::User("jwt:bob".into()))
    );
    let by_jwks = identity(&format!(
        "  jwt: {{ algorithms: [RS256], jwks: '{}' }}\n",
        jwks_path.display()
    ));
    assert_eq!(
        by_jwks.identify(&bearer(&token), &Clock::system()),
        Ok(Identity::User("jwt:bob".into()))
    );

    // The wrong issuer is anonymous.
    let wrong_iss = identity(&format!(
        "  jwt: {{ algorithms: [RS256], public_key: '{}', issuer: 'https://other' }}\n",
        pem_path.display()
    ));
    assert_eq!(
        wrong_iss.identify(&bearer(&token), &Clock::system()),
        Ok(Identity::Anonymous)
    );

    // An HS256 token signed with the public key as the secret (the classic
    // algorithm-confusion attack) is not accepted by an RS256 config.
    let pem_text = std::fs::read_to_string(&pem_path).unwrap();
    let confused = sign_hs(
        serde_json::json!({ "sub": "mallory", "exp": now() + 600 }),
        &pem_text,
    );
    assert_eq!(
        by_pem.identify(&bearer(&confused), &Clock::system()),
        Ok(Identity::Anonymous)
    );
}

fn raw_b64url(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = (chunk[0] as u32) << 16
            | (*chunk.get(1).unwrap_or(&0) as u32) << 8
            | *chunk.get(2).unwrap_or(&0) as u32;
        for i in 0..=chunk.len() {
            out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

#[test]
fn api_keys_and_cookies() {
    let id = identity(&format!(
        "  jwt: {{ algorithms: [HS256], secret: '{SECRET}', cookie: session }}\n  api_key: {{ header: x-api-key }}\n"
    ));
    let mut h = HeaderMap::new();
    h.insert("x-api-key", HeaderValue::from_static("sk_live_very_secret"));
    let Ok(Identity::User(user)) = id.identify(&h, &Clock::system()) else {
        panic!("api key gives a user")
    };
    assert!(
        user.starts_with("apikey:") && !user.contains("sk_live"),
        "{user}"
    );
    assert_eq!(
        id.identify(&h, &Clock::system()),
        Ok(Identity::User(user)),
        "stable"
    );

    let token = sign_hs(serde_json::json!({ "sub": 42, "exp": now() + 600 }), SECRET);
    let mut h = HeaderMap::new();
    h.insert(
        "cookie",
        HeaderValue::from_str(&format!("theme=dark; session={token}")).unwrap(),
    );
    assert_eq!(
        id.identify(&h, &Clock::system()),
        Ok(Identity::User("jwt:42".into()))
    );
}

#[test]
fn es256_tokens_verify_against_a_pem_public_key() {
    let key = rcgen::KeyPair::generate().unwrap(); // ECDSA P-256
    let dir = tempfile::tempdir().unwrap();
    let pem_path = dir.path().join("es.pub.pem");
    std::fs::write(&pem_path, key.public_key_pem()).unwrap();
    let signing = EncodingKey::from_ec_pem(key.serialize_pem().as_bytes()).unwrap();
    let token = encode(
        &Header::new(jsonwebtoken::Algorithm::ES256),
        &serde_json::json!({ "uid": "carol", "exp": now() + 600, "aud": "api" }),
        &signing,
    )
    .unwrap();
    let id = identity(&format!(
        "  jwt: {{ algorithms: [ES256], public_key: '{}', claim: uid, audience: api }}\n",
        pem_path.display()
    ));
    assert_eq!(
        id.identify(&bearer(&token), &Clock::system()),
        Ok(Identity::User("jwt:carol".into()))
    );
    let wrong_aud = identity(&format!(
        "  jwt: {{ algorithms: [ES256], public_key: '{}', claim: uid, audience: other }}\n",
        pem_path.display()
    ));
    assert_eq!(
        wrong_aud.identify(&bearer(&token), &Clock::system()),
        Ok(Identity::Anonymous)
    );
}
