//! The body of an HTTP/1.x response as the upstream client reads it: what
//! its head says of its framing (`Fields`, `framing`: RFC 9112 section 6)
//! and the decoder that takes it off the read buffer (`Framing::decode`:
//! a length, chunked, or until the close). Bytes in, bytes out; the
//! errors are this module's own.

use bytes::{Buf, Bytes, BytesMut};
use http::{Method, StatusCode, Version};
use smallvec::SmallVec;

use super::{
    add_coding, add_content_length, chunk_size, is_hop_by_hop, ChunkError, Coding, LengthError,
};

/// The longest chunk-size line (size, extensions) or trailer line.
const MAX_LINE: usize = 4096;
/// The most trailer bytes kept for the client and settlement; lines past
/// it are read and dropped.
pub const MAX_TRAILERS: usize = 8 << 10;

/// Why a response's framing cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramingError {
    /// A transfer coding other than a lone `chunked`.
    Coding,
    /// A `Content-Length` the one rule refuses.
    Length(LengthError),
}

impl std::fmt::Display for FramingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FramingError::Coding => f.write_str("a transfer coding other than chunked"),
            FramingError::Length(e) => e.fmt(f),
        }
    }
}

/// Why a body could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// A chunk-size line the one rule refuses.
    Chunk(ChunkError),
    /// Chunk data not followed by CRLF.
    NoCrlf,
    /// A chunk-size or trailer line past 4 KiB.
    LineTooLong,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Chunk(e) => e.fmt(f),
            DecodeError::NoCrlf => f.write_str("no CRLF after a chunk"),
            DecodeError::LineTooLong => f.write_str("chunk line too long"),
        }
    }
}

/// How the response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Framing {
    Length(u64),
    Chunked(Chunk),
    /// Read until the upstream closes.
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    Data(u64),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one.
    Trailers,
}

impl Framing {
    /// Takes what it can from the bytes read: `Some(Some(data))`, the end
    /// (`Some(None)`), or `None` when more must be read. A chunked body's
    /// trailer lines are appended to `trailers` as they arrive (CRLF after
    /// each, at most `MAX_TRAILERS` bytes of them).
    pub fn decode(
        &mut self,
        read: &mut BytesMut,
        trailers: &mut BytesMut,
    ) -> Result<Option<Option<Bytes>>, DecodeError> {
        loop {
            match self {
                Framing::Length(0) => return Ok(Some(None)),
                Framing::Length(n) | Framing::Chunked(Chunk::Data(n)) => {
                    if read.is_empty() {
                        return Ok(None);
                    }
                    let take = (*n).min(read.len() as u64);
                    *n -= take;
                    let data = read.split_to(take as usize).freeze();
                    if let Framing::Chunked(c @ Chunk::Data(0)) = self {
                        *c = Chunk::DataEnd;
                    }
                    return Ok(Some(Some(data)));
                }
                Framing::Close => {
                    if read.is_empty() {
                        return Ok(None);
                    }
                    return Ok(Some(Some(read.split().freeze())));
                }
                Framing::Chunked(Chunk::Size) => {
                    let Some(line) = take_line(read)? else {
                        return Ok(None);
                    };
                    let size = chunk_size(&line).map_err(DecodeError::Chunk)?;
                    *self = Framing::Chunked(match size {
                        0 => Chunk::Trailers,
                        n => Chunk::Data(n),
                    });
                }
                Framing::Chunked(Chunk::DataEnd) => {
                    if read.len() < 2 {
                        return Ok(None);
                    }
                    if &read[..2] != b"\r\n" {
                        return Err(DecodeError::NoCrlf);
                    }
                    read.advance(2);
                    *self = Framing::Chunked(Chunk::Size);
                }
                Framing::Chunked(Chunk::Trailers) => {
                    let Some(line) = take_line(read)? else {
                        return Ok(None);
                    };
                    if line.is_empty() {
                        *self = Framing::Length(0);
                    } else if trailers.len() + line.len() + 2 <= MAX_TRAILERS {
                        trailers.extend_from_slice(&line);
                        trailers.extend_from_slice(b"\r\n");
                    }
                }
            }
        }
    }
}

/// What a response head's fields say about its framing and reuse.
#[derive(Default)]
pub struct Fields<'a> {
    /// With a `Transfer-Encoding`: whether it is exactly `chunked`.
    pub coding: Option<Coding>,
    /// With a `Content-Length`: the length all its values agree on, or
    /// what is wrong with them.
    pub length: Option<Result<u64, LengthError>>,
    /// `Connection` tokens.
    pub close: bool,
    pub keep_alive: bool,
    /// The other fields `Connection` names: hop-by-hop, not passed on.
    pub named: SmallVec<[&'a [u8]; 2]>,
}

impl<'a> Fields<'a> {
    pub fn note(&mut self, name: &[u8], value: &'a [u8]) {
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            self.coding = Some(add_coding(self.coding, value));
        } else if name.eq_ignore_ascii_case(b"content-length") {
            self.length = Some(match self.length.take() {
                Some(Err(e)) => Err(e),
                Some(Ok(n)) => add_content_length(Some(n), value),
                None => add_content_length(None, value),
            });
        } else if name.eq_ignore_ascii_case(b"connection") {
            for t in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if t.eq_ignore_ascii_case(b"close") {
                    self.close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") {
                    self.keep_alive = true;
                } else if !t.is_empty() && !is_hop_by_hop(t) {
                    self.named.push(t);
                }
            }
        }
    }
}

/// The response body's framing, and whether the framing allows reuse.
pub fn framing(
    fields: &Fields,
    status: StatusCode,
    method: &Method,
    version: Version,
) -> Result<(Framing, bool), FramingError> {
    if method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || status.is_informational()
    {
        return Ok((Framing::Length(0), true));
    }
    match fields.coding {
        // RFC 9112 §6.1: HTTP/1.0 has no transfer codings; its framing is
        // faulty, so it is read to the close and the connection not reused.
        Some(_) if version == Version::HTTP_10 => return Ok((Framing::Close, false)),
        // Passing it on decoded but without its coding would hand the
        // client bytes it cannot read; tollgate decodes none but chunked.
        Some(Coding::Other) => {
            return Err(FramingError::Coding);
        }
        // With a Content-Length beside it, the message may be smuggling:
        // read it chunked, but never reuse the connection.
        Some(Coding::Chunked) => {
            let reuse = fields.length.is_none();
            return Ok((Framing::Chunked(Chunk::Size), reuse));
        }
        None => {}
    }
    match &fields.length {
        Some(Ok(n)) => Ok((Framing::Length(*n), true)),
        Some(Err(e)) => Err(FramingError::Length(*e)),
        None => Ok((Framing::Close, false)),
    }
}

/// The trailer lines `decode` kept, as the fields a client may be sent:
/// hop-by-hop fields and those that frame or route a message (RFC 9110
/// §6.5.1) left out, and so is a line that is not a valid field.
pub fn trailer_fields(lines: &[u8]) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    for line in lines.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if is_hop_by_hop(name) || NOT_TRAILERS.iter().any(|n| name.eq_ignore_ascii_case(n)) {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name),
            http::HeaderValue::from_bytes(value),
        ) {
            map.append(name, value);
        }
    }
    map
}

/// Fields a trailer may not carry (besides the hop-by-hop ones).
const NOT_TRAILERS: [&[u8]; 7] = [
    b"content-length",
    b"content-type",
    b"content-encoding",
    b"content-range",
    b"host",
    b"authorization",
    b"set-cookie",
];

/// One CRLF-terminated line off the front of `read` (without the CRLF);
/// a line ended by a bare LF is refused (what is left in it is checked by
/// `chunk_size`, or is a trailer line, dropped).
fn take_line(read: &mut BytesMut) -> Result<Option<Bytes>, DecodeError> {
    match read.iter().position(|&b| b == b'\n') {
        Some(i) => {
            if i == 0 || read[i - 1] != b'\r' {
                return Err(DecodeError::Chunk(ChunkError::BareCrLf));
            }
            let mut line = read.split_to(i + 1).freeze();
            line.truncate(i - 1);
            Ok(Some(line))
        }
        None if read.len() > MAX_LINE => Err(DecodeError::LineTooLong),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_trailers_are_kept_within_their_bound_and_filtered() {
        let mut framing = Framing::Chunked(Chunk::Size);
        let mut read = BytesMut::from(
            &b"2\r\nok\r\n0\r\nx-usage: 12\r\nTransfer-Encoding: chunked\r\nHost: evil\r\n\r\n"[..],
        );
        let mut trailers = BytesMut::new();
        assert_eq!(
            framing.decode(&mut read, &mut trailers),
            Ok(Some(Some(Bytes::from("ok"))))
        );
        assert_eq!(framing.decode(&mut read, &mut trailers), Ok(Some(None)));
        let fields = trailer_fields(&trailers);
        assert_eq!(fields.len(), 1, "{fields:?}");
        assert_eq!(fields["x-usage"], "12");

        // Past MAX_TRAILERS, further lines are read and dropped.
        let mut framing = Framing::Chunked(Chunk::Size);
        let mut wire = b"0\r\n".to_vec();
        for i in 0..400 {
            wire.extend_from_slice(format!("x-field-{i}: {}\r\n", "v".repeat(20)).as_bytes());
        }
        wire.extend_from_slice(b"\r\n");
        let mut read = BytesMut::from(&wire[..]);
        let mut trailers = BytesMut::new();
        assert_eq!(framing.decode(&mut read, &mut trailers), Ok(Some(None)));
        assert!(read.is_empty());
        assert!(trailers.len() <= MAX_TRAILERS);
        assert!(trailer_fields(&trailers).len() > 100);
    }
}
