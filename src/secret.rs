//! Secrets, handled in one place: HMAC-SHA256 signing and verification
//! (webhook signatures checked, alert deliveries signed) and token digests
//! matched in constant time (bypass tokens, the admin token). A secret is
//! never compared as it is, nor logged: only its digest or MAC is.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The hex HMAC-SHA256 of `parts`, concatenated.
pub fn sign(secret: &[u8], parts: &[&[u8]]) -> String {
    let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(secret) else {
        return String::new();
    };
    for p in parts {
        mac.update(p);
    }
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `signature` is the HMAC-SHA256 of `parts` under `secret`,
/// compared in constant time.
pub fn mac_ok(secret: &[u8], parts: &[&[u8]], signature: &[u8]) -> bool {
    let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(secret) else {
        return false;
    };
    for p in parts {
        mac.update(p);
    }
    mac.verify_slice(signature).is_ok()
}

/// A token's SHA-256 digest: what the config keeps of it.
pub fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// Whether `token`'s SHA-256 digest is one of `hashes`. Every hash is
/// compared, in constant time: the time taken says neither which one nor
/// whether one matched.
pub fn token_matches(hashes: &[[u8; 32]], token: &[u8]) -> bool {
    matching_token(hashes, token).is_some()
}

/// Which of `hashes` is `token`'s SHA-256 digest, compared like
/// [`token_matches`]: every hash, in constant time.
pub fn matching_token(hashes: &[[u8; 32]], token: &[u8]) -> Option<usize> {
    let digest = digest(token);
    hashes.iter().enumerate().fold(None, |hit, (i, h)| {
        if bool::from(h.ct_eq(&digest)) {
            Some(i)
        } else {
            hit
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_under_its_secret() {
        let sig = sign(b"key", &[b"a", b"b"]);
        assert_eq!(sig.len(), 64);
        let raw: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&sig[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        assert!(mac_ok(b"key", &[b"ab"], &raw));
        assert!(!mac_ok(b"other", &[b"ab"], &raw));
    }

    #[test]
    fn tokens_match_by_digest() {
        let hashes = [digest(b"one"), digest(b"two")];
        assert_eq!(matching_token(&hashes, b"two"), Some(1));
        assert!(!token_matches(&hashes, b"three"));
    }
}
