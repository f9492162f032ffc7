//! Path normalisation, before any route is matched, so that one resource has
//! one spelling and no alias dodges a limit:
//!
//! - percent-encoded unreserved characters (`%6C` -> `l`) and `%2F` are
//!   decoded; other escapes keep their encoding with upper-case hex;
//! - `//` collapses to `/`; `.` segments are dropped and `..` segments
//!   resolved (climbing above the root is a 400);
//! - `;params` on a segment (`/login;jsessionid=x`) are dropped;
//! - an invalid escape, an encoded NUL, or a control character is a 400.
//!
//! The normalised path is what is matched, limited, and forwarded upstream.

use std::borrow::Cow;

use http::uri::{PathAndQuery, Uri};
use http::Request;

use crate::error::ProxyError;

/// Why a path cannot be normalised safely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadPath(pub &'static str);

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Whether `path` is already normal: it starts with `/`, has no escape,
/// `;`, `#` or control byte, no empty segment but the last (`//`) and no
/// `.` or `..` segment. One pass over the bytes: every request asks.
fn is_normal(path: &[u8]) -> bool {
    if path.first() != Some(&b'/') {
        return false;
    }
    let mut start = 1; // of the segment being read
    for i in 1..=path.len() {
        match path.get(i).copied() {
            Some(b'/') | None => {
                match &path[start..i] {
                    b"." | b".." => return false,
                    b"" if i < path.len() => return false,
                    _ => {}
                }
                start = i + 1;
            }
            Some(b) if matches!(b, b'%' | b';' | b'#') || b < 0x20 || b == 0x7f => return false,
            Some(_) => {}
        }
    }
    true
}

/// The normalised form of `path`; borrowed when it is already normal.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, BadPath> {
    let bytes = path.as_bytes();
    if is_normal(bytes) {
        return Ok(Cow::Borrowed(path));
    }
    if !path.starts_with('/') {
        return Err(BadPath("the path must start with /"));
    }
    // 1. Decode what must be decoded, keep other escapes canonical.
    let mut decoded = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'#' => break, // a fragment is never part of the path
            b'%' => {
                let (Some(h), Some(l)) = (
                    bytes.get(i + 1).and_then(|&x| hex(x)),
                    bytes.get(i + 2).and_then(|&x| hex(x)),
                ) else {
                    return Err(BadPath("the path has an invalid percent escape"));
                };
                let v = h << 4 | l;
                if v == 0 || v < 0x20 || v == 0x7f {
                    return Err(BadPath("the path encodes a control character"));
                }
                if is_unreserved(v) || v == b'/' {
                    decoded.push(v as char);
                } else {
                    decoded.push('%');
                    decoded.push(char::from(b"0123456789ABCDEF"[(v >> 4) as usize]));
                    decoded.push(char::from(b"0123456789ABCDEF"[(v & 15) as usize]));
                }
                i += 3;
                continue;
            }
            _ if b < 0x20 || b == 0x7f => return Err(BadPath("the path has a control character")),
            _ => {}
        }
        // Multi-byte UTF-8 is copied whole.
        let len = utf8_len(b);
        decoded.push_str(&path[i..i + len]);
        i += len;
    }
    // 2. Resolve segments.
    let trailing = decoded.ends_with('/') || decoded.ends_with("/.") || decoded.ends_with("/..");
    let mut out: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        let seg = seg.split(';').next().unwrap_or("");
        match seg {
            "" | "." => {}
            ".." => {
                if out.pop().is_none() {
                    return Err(BadPath("the path climbs above the root"));
                }
            }
            s => out.push(s),
        }
    }
    let mut result = String::with_capacity(decoded.len());
    for seg in &out {
        result.push('/');
        result.push_str(seg);
    }
    if result.is_empty() || (trailing && !out.is_empty()) {
        result.push('/');
    }
    Ok(Cow::Owned(result))
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xF0..=0xFF => 4,
        0xE0..=0xEF => 3,
        0xC0..=0xDF => 2,
        _ => 1,
    }
}

/// One spelling per path before anything matches or counts on it; the
/// normalised path is also what the upstream receives.
pub(super) fn normalize_path<B>(req: &mut Request<B>) -> Result<(), ProxyError> {
    if let Cow::Owned(path) =
        normalize(req.uri().path()).map_err(|e| ProxyError::BadRequest(e.0))?
    {
        *req.uri_mut() = with_path(req.uri(), &path)?;
    }
    Ok(())
}

/// `uri` with its path replaced by `path` (the query is kept).
fn with_path(uri: &Uri, path: &str) -> Result<Uri, ProxyError> {
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(
        PathAndQuery::try_from(pq)
            .map_err(|_| ProxyError::BadRequest("the path cannot be normalised"))?,
    );
    Uri::from_parts(parts).map_err(|_| ProxyError::BadRequest("the path cannot be normalised"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_of_one_path_normalise_alike() {
        for alias in [
            "/auth/login",
            "/auth//login",
            "/auth/./login",
            "/auth/x/../login",
            "/auth/%6Cogin",
            "/auth/%6cogin",
            "/auth%2Flogin",
            "/auth/login;jsessionid=abc",
            "//auth///login",
            "/auth/x/y/../../login",
        ] {
            assert_eq!(normalize(alias).unwrap(), "/auth/login", "{alias}");
        }
        assert_eq!(
            normalize("/auth/login/").unwrap(),
            "/auth/login/",
            "a trailing slash is kept"
        );
        assert_eq!(normalize("/a/b/..").unwrap(), "/a/");
        assert_eq!(normalize("/").unwrap(), "/");
        assert_eq!(
            normalize("/..%2F").unwrap_err(),
            BadPath("the path climbs above the root")
        );
    }

    #[test]
    fn other_escapes_stay_encoded_and_canonical() {
        assert_eq!(normalize("/files/a%20b").unwrap(), "/files/a%20b");
        assert_eq!(normalize("/files/a%3fb").unwrap(), "/files/a%3Fb");
        assert_eq!(normalize("/caf%C3%A9").unwrap(), "/caf%C3%A9");
        assert!(matches!(normalize("/already/normal"), Ok(Cow::Borrowed(_))));
    }

    proptest::proptest! {
        /// The one-pass check says "normal" exactly when the rules read
        /// one by one do, on paths made of segments that matter (empty,
        /// dots, names with dots, escapes, `;`, `#`, control bytes).
        fn the_one_pass_check_agrees_with_the_rules_cases(
            path in "a?(/(\\.|\\.\\.|a|\\.a|a\\.\\.|%|;|#|\\x01)?){0,5}"
        ) {
            let b = path.as_bytes();
            let rules = !path.is_empty()
                && b[0] == b'/'
                && !b.iter().any(|&c| matches!(c, b'%' | b';' | b'#') || c < 0x20 || c == 0x7f)
                && !path.contains("//")
                && !path.split('/').any(|s| s == "." || s == "..");
            proptest::prop_assert_eq!(is_normal(b), rules, "{:?}", path);
            crate::testing::case_passed();
        }
    }

    #[test]
    fn the_one_pass_check_agrees_with_the_rules() {
        crate::testing::count_cases(
            "the_one_pass_check_agrees_with_the_rules",
            256,
            the_one_pass_check_agrees_with_the_rules_cases,
        );
    }

    #[test]
    fn unsafe_paths_are_refused() {
        for bad in [
            "/a%zz",
            "/a%2",
            "/a%00b",
            "/a%0Ab",
            "/../etc/passwd",
            "/a/../../b",
            "relative",
        ] {
            assert!(normalize(bad).is_err(), "{bad}");
        }
    }
}
