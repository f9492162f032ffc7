//! W3C Trace Context: `traceparent` read and written, ids made.
//!
//! `traceparent: 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`,
//! lowercase, neither id all zeros, version `ff` invalid; a later version
//! may add fields after a `-` (its first four are read as version 00's).

use http::HeaderValue;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceId(pub [u8; 16]);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanId(pub [u8; 8]);

impl TraceId {
    pub fn random() -> TraceId {
        loop {
            let id = fastrand::u128(..).to_be_bytes();
            if id != [0; 16] {
                return TraceId(id);
            }
        }
    }

    pub fn hex(&self) -> String {
        hex(&self.0)
    }

    /// Its last 8 bytes as a number, for ratio sampling (as OpenTelemetry's
    /// TraceIdRatioBased reads them): the same trace id, the same choice.
    pub fn sample_value(&self) -> u64 {
        let mut low = [0; 8];
        low.copy_from_slice(&self.0[8..]);
        u64::from_be_bytes(low)
    }
}

impl SpanId {
    pub fn random() -> SpanId {
        loop {
            let id = fastrand::u64(..).to_be_bytes();
            if id != [0; 8] {
                return SpanId(id);
            }
        }
    }

    pub fn hex(&self) -> String {
        hex(&self.0)
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// A parent read from a `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub sampled: bool,
}

/// Lowercase hex only (the spec refuses uppercase).
fn unhex<const N: usize>(s: &[u8]) -> Option<[u8; N]> {
    if s.len() != N * 2 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (i, pair) in s.chunks(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// A valid `traceparent`, or `None` (which the caller replaces).
pub fn parse(value: &[u8]) -> Option<Parent> {
    let mut parts = value.split(|&b| b == b'-');
    let version = unhex::<1>(parts.next()?)?[0];
    let trace = unhex::<16>(parts.next()?)?;
    let span = unhex::<8>(parts.next()?)?;
    let flags = unhex::<1>(parts.next()?)?[0];
    let rest = parts.next();
    let ok = match version {
        0xff => false,
        // Version 00 has exactly four fields.
        0 => rest.is_none(),
        // A later version may append fields.
        _ => true,
    };
    if !ok || trace == [0; 16] || span == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id: TraceId(trace),
        span_id: SpanId(span),
        sampled: flags & 1 == 1,
    })
}

/// The `traceparent` naming `span` of `trace` as the parent (written into
/// one buffer: it goes with every forwarded request).
pub fn header(trace: TraceId, span: SpanId, sampled: bool) -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [b'-'; 55];
    out[..2].copy_from_slice(b"00");
    for (i, b) in trace.0.iter().chain(&span.0).enumerate() {
        // The trace id at 3, the span id after its dash at 36.
        let at = if i < 16 { 3 + 2 * i } else { 36 + 2 * (i - 16) };
        out[at] = HEX[usize::from(b >> 4)];
        out[at + 1] = HEX[usize::from(b & 15)];
    }
    out[53] = b'0';
    out[54] = if sampled { b'1' } else { b'0' };
    HeaderValue::from_bytes(&out).unwrap_or(HeaderValue::from_static(
        "00-00000000000000000000000000000001-0000000000000001-00",
    ))
}

/// A `tracestate` worth passing on: at most 512 bytes of visible ASCII
/// (its list members are not checked one by one).
pub fn state_ok(value: &HeaderValue) -> bool {
    let b = value.as_bytes();
    b.len() <= 512 && b.iter().all(|&c| (0x20..0x7f).contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_is_read_and_written_back() {
        let v = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let p = parse(v).unwrap();
        assert_eq!(p.trace_id.hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.span_id.hex(), "00f067aa0ba902b7");
        assert!(p.sampled);
        assert_eq!(header(p.trace_id, p.span_id, true).as_bytes(), &v[..]);
        let later = b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-next";
        assert!(!parse(later).unwrap().sampled);
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            &b""[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            b"0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",
        ] {
            assert_eq!(parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn made_ids_are_never_zero_and_differ() {
        let (a, b) = (TraceId::random(), TraceId::random());
        assert_ne!(a, b);
        assert_ne!(a.0, [0; 16]);
        assert_ne!(SpanId::random().0, [0; 8]);
    }
}
