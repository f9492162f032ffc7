//! The HTTP/1.x framing rules both roles share, with no policy: the one
//! `Content-Length` rule (the fast path's request heads and the upstream
//! client's response heads), the one chunk-size rule, and what a
//! `Transfer-Encoding` value asks for; the server's request-head parser
//! (`head`); the upstream client's response head
//! (`response`) and body decoder (`body`); the body pump of the server's
//! fast path (`pump`) and the write helper both roles use. As strict as hyper's
//! (`src/headers.rs`, `src/proto/h1/decode.rs`): what one leg accepts, the
//! other does too, so a message cannot mean two lengths to tollgate.

pub(crate) mod body;
pub(crate) mod head;
pub(crate) mod pump;
mod request;
pub(crate) mod response;
mod write;

pub use request::encode_head;
pub use write::{chunk_size_line, poll_write_bufs, put_field};

/// The hop-by-hop fields (RFC 9110 section 7.6.1): always removed on the way through, in both directions.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether a field (or a `Connection` token) is hop-by-hop whatever
/// `Connection` says, in any case.
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
}

/// Why a `Content-Length` cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LengthError {
    /// Not digits only: empty, a sign, inner whitespace, anything else.
    Malformed,
    /// More digits than a `u64` holds.
    Overflow,
    /// Two values that disagree (`5, 6`, or two fields).
    Conflict,
}

impl std::fmt::Display for LengthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LengthError::Malformed => "malformed Content-Length",
            LengthError::Overflow => "Content-Length too large",
            LengthError::Conflict => "conflicting Content-Length values",
        })
    }
}

/// A run of ASCII digits as a number: no sign (which `u64::from_str`
/// takes), no whitespace, no overflow.
fn digits(s: &[u8]) -> Result<u64, LengthError> {
    if s.is_empty() {
        return Err(LengthError::Malformed);
    }
    let mut n: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return Err(LengthError::Malformed);
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(b - b'0')))
            .ok_or(LengthError::Overflow)?;
    }
    Ok(n)
}

/// Adds one `Content-Length` field value to the length `known` from the
/// message's earlier ones. A value may be a list (`5, 5`); every member,
/// and every field, must agree (RFC 9110 §8.6: equal duplicates are one
/// length). Leading zeros are digits like any other: the length is the
/// number, and tollgate writes it back canonically.
pub fn add_content_length(known: Option<u64>, value: &[u8]) -> Result<u64, LengthError> {
    let mut length = known;
    for part in value.split(|&b| b == b',') {
        let n = digits(part.trim_ascii())?;
        if length.is_some_and(|l| l != n) {
            return Err(LengthError::Conflict);
        }
        length = Some(n);
    }
    // `split` yields at least one part, and an empty part is an error.
    length.ok_or(LengthError::Malformed)
}

/// Why a chunk-size line cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkError {
    /// No hex digits, or something other than hex digits before the
    /// extensions.
    Malformed,
    /// A size past `u64`.
    Overflow,
    /// A bare CR or LF in the line (extensions included).
    BareCrLf,
}

impl std::fmt::Display for ChunkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ChunkError::Malformed => "bad chunk size",
            ChunkError::Overflow => "chunk size too large",
            ChunkError::BareCrLf => "bare CR or LF in a chunk line",
        })
    }
}

/// The size a chunk-size line announces (the line without its CRLF):
/// `1*HEXDIG [ BWS ";" ext ]` (RFC 9112 §7.1), any number of leading zeros,
/// extensions skipped but never holding a CR or LF.
pub fn chunk_size(line: &[u8]) -> Result<u64, ChunkError> {
    if line.iter().any(|&b| b == b'\r' || b == b'\n') {
        return Err(ChunkError::BareCrLf);
    }
    let end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    if end == 0 {
        return Err(ChunkError::Malformed);
    }
    let mut size: u64 = 0;
    for &b in &line[..end] {
        let d = (b as char).to_digit(16).unwrap_or(0);
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(u64::from(d)))
            .ok_or(ChunkError::Overflow)?;
    }
    // After the size: optional whitespace, then nothing or `;` extensions.
    let rest = line[end..].trim_ascii_start();
    if !rest.is_empty() && rest[0] != b';' {
        return Err(ChunkError::Malformed);
    }
    Ok(size)
}

/// What a message's `Transfer-Encoding` fields ask for, all of them read
/// in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// Exactly `chunked`, once: the one coding tollgate frames.
    Chunked,
    /// Anything else: another coding (`gzip, chunked`, `gzip`), `chunked`
    /// twice, an empty or unreadable value.
    Other,
}

/// Adds one `Transfer-Encoding` field value to what the earlier ones said
/// (`None`: no field yet).
pub fn add_coding(known: Option<Coding>, value: &[u8]) -> Coding {
    let mut seen = known;
    let mut any = false;
    for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
        if token.is_empty() {
            continue;
        }
        any = true;
        seen = Some(match seen {
            None if token.eq_ignore_ascii_case(b"chunked") => Coding::Chunked,
            _ => Coding::Other,
        });
    }
    match seen {
        Some(c) if any => c,
        _ => Coding::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_is_digits_only_and_duplicates_must_agree() {
        assert_eq!(add_content_length(None, b"5"), Ok(5));
        assert_eq!(add_content_length(None, b"000000000000000000005"), Ok(5));
        assert_eq!(add_content_length(None, b"5, 5"), Ok(5));
        assert_eq!(add_content_length(Some(5), b"5"), Ok(5));
        assert_eq!(
            add_content_length(Some(5), b"6"),
            Err(LengthError::Conflict)
        );
        assert_eq!(
            add_content_length(None, b"5, 6"),
            Err(LengthError::Conflict)
        );
        for bad in [
            &b""[..],
            b"+5",
            b"-5",
            b"5 5",
            b"0x5",
            b"5,",
            b",5",
            b"5;",
            b"\xff",
        ] {
            assert_eq!(
                add_content_length(None, bad),
                Err(LengthError::Malformed),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            add_content_length(None, b"18446744073709551615"),
            Ok(u64::MAX)
        );
        assert_eq!(
            add_content_length(None, b"18446744073709551616"),
            Err(LengthError::Overflow)
        );
    }

    #[test]
    fn chunk_sizes_take_leading_zeros_and_clean_extensions_only() {
        assert_eq!(chunk_size(b"a"), Ok(10));
        assert_eq!(chunk_size(b"0000000000000000000000000A"), Ok(10));
        assert_eq!(chunk_size(b"5;name=value"), Ok(5));
        assert_eq!(chunk_size(b"5 ; name"), Ok(5));
        assert_eq!(chunk_size(b"ffffffffffffffff"), Ok(u64::MAX));
        assert_eq!(chunk_size(b"10000000000000000"), Err(ChunkError::Overflow));
        for bad in [&b""[..], b"+5", b"-5", b" 5", b"5x", b"0x5", b"5 5", b";a"] {
            assert_eq!(
                chunk_size(bad),
                Err(ChunkError::Malformed),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(chunk_size(b"5;a\rb"), Err(ChunkError::BareCrLf));
        assert_eq!(chunk_size(b"5;a\nb"), Err(ChunkError::BareCrLf));
    }

    #[test]
    fn only_a_lone_chunked_is_chunked() {
        let of = |values: &[&[u8]]| values.iter().fold(None, |k, v| Some(add_coding(k, v)));
        assert_eq!(of(&[b"chunked"]), Some(Coding::Chunked));
        assert_eq!(of(&[b" Chunked "]), Some(Coding::Chunked));
        for other in [
            &[&b"gzip, chunked"[..]][..],
            &[b"gzip"],
            &[b"chunked, chunked"],
            &[b"chunked", b"chunked"],
            &[b"gzip", b"chunked"],
            &[b""],
            &[b"chunked, gzip"],
        ] {
            assert_eq!(of(other), Some(Coding::Other), "{other:?}");
        }
    }
}
