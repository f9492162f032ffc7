//! A request head as tollgate's HTTP/1.x server reads it off the buffer
//! (`httparse`): where its parts are, its body's length by the one rule,
//! and whether the server's fast path can take it or hyper must
//! (`Parsed::Hyper`, with why: the hand-over metric's reason).

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Uri, Version};
use smallvec::SmallVec;

use crate::http1;
use crate::metrics::Handover;

/// Header slots parsed on the fast path; a head with more goes to hyper.
const PARSE_HEADERS: usize = 128;

/// What a parse of the buffer found.
pub enum Parsed {
    /// A request head the fast path serves, written into the `Head` given.
    Head,
    /// Not a whole head yet.
    Partial,
    /// Anything else: hyper's.
    Hyper(Handover),
    /// A head tollgate refuses itself, with a problem body, and closes
    /// the connection after (see [`Refusal`]).
    Refuse(Refusal),
}

/// A head the fast path answers itself rather than hand to hyper, whose
/// answers to these are bare (no problem body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A head (or what came of it so far) past the largest taken.
    TooLarge(usize),
    /// More fields than the most taken.
    TooMany(usize),
    /// A `Transfer-Encoding` other than exactly `chunked` (501, as nginx).
    Coding,
}

/// A parsed request head: where its parts are in the buffer. A
/// connection keeps one and parses each head into it: the head (a few
/// hundred bytes) is never moved.
#[derive(Default)]
pub struct Head {
    len: usize,
    method: Method,
    version: Version,
    path: (usize, usize),
    /// Each field's name and value, as `start..end` in the buffer: names
    /// are parsed into `HeaderName`s by [`Head::request`], so the head
    /// moves as a few hundred bytes, not a kilobyte.
    headers: SmallVec<[[u32; 4]; 20]>,
    /// Its body's length (`Content-Length`), read with the head as far as
    /// it came, the rest pumped (`pump`).
    pub body: u64,
    pub keep_alive: bool,
}

/// `(largest head, most headers)` hyper would take: past them, hyper
/// answers (431), not the fast path.
pub type HeadLimits = (usize, usize);

pub fn parse(buf: &[u8], (max_bytes, max_headers): HeadLimits, head: &mut Head) -> Parsed {
    // Not initialised: writing 128 empty slots per request costs more
    // than parsing a usual head.
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; PARSE_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let slots = &mut slots[..max_headers.min(PARSE_HEADERS)];
    let len = match req.parse_with_uninit_headers(buf, slots) {
        Ok(httparse::Status::Complete(len)) if len <= max_bytes => len,
        Ok(httparse::Status::Complete(len)) => return Parsed::Refuse(Refusal::TooLarge(len)),
        Ok(httparse::Status::Partial) if buf.len() < max_bytes => return Parsed::Partial,
        Ok(httparse::Status::Partial) => return Parsed::Refuse(Refusal::TooLarge(buf.len())),
        Err(httparse::Error::Version) if buf.starts_with(b"PRI * HTTP/2.0") => {
            return Parsed::Hyper(Handover::Http2)
        }
        Err(httparse::Error::TooManyHeaders) => return too_many(buf, max_bytes, max_headers),
        _ => return Parsed::Hyper(Handover::Head),
    };
    let (Some(method), Some(path), Some(minor)) = (req.method, req.path, req.version) else {
        return Parsed::Hyper(Handover::Head);
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::Hyper(Handover::Head);
    };
    let base = buf.as_ptr() as usize;
    let at = |s: &[u8]| s.as_ptr() as usize - base;
    let version = if minor == 0 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    head.len = len;
    head.method = method;
    head.version = version;
    head.path = (at(path.as_bytes()), at(path.as_bytes()) + path.len());
    head.headers.clear();
    let mut length = None;
    let mut coding = None;
    // A `close` wins over a `keep-alive`, in any order.
    let (mut close, mut keep_alive) = (false, false);
    for h in req.headers.iter() {
        // httparse took only token characters for the name: the ones
        // `HeaderName` takes. Only these few are looked at here.
        let name = h.name.as_bytes();
        let is = |n: &[u8]| name.len() == n.len() && name.eq_ignore_ascii_case(n);
        if is(b"content-length") {
            // The one rule both legs read lengths by (`http1`); hyper
            // answers a length it refuses (400).
            match http1::add_content_length(length, h.value) {
                Ok(n) => length = Some(n),
                Err(_) => return Parsed::Hyper(Handover::Head),
            }
        } else if is(b"transfer-encoding") {
            coding = Some(http1::add_coding(coding, h.value));
        } else if is(b"expect") {
            return Parsed::Hyper(Handover::Expect);
        } else if is(b"upgrade") {
            return Parsed::Hyper(Handover::Upgrade);
        } else if is(b"connection") {
            for token in h.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"upgrade") {
                    return Parsed::Hyper(Handover::Upgrade);
                }
                close |= token.eq_ignore_ascii_case(b"close");
                keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        }
        let (n, v) = (at(name), at(h.value));
        head.headers.push([
            n as u32,
            (n + name.len()) as u32,
            v as u32,
            (v + h.value.len()) as u32,
        ]);
    }
    match coding {
        // Its body is framed in a coding tollgate does not decode: never
        // re-framed without it (nginx answers 501 too).
        Some(http1::Coding::Other) => return Parsed::Refuse(Refusal::Coding),
        Some(http1::Coding::Chunked) => return Parsed::Hyper(Handover::Chunked),
        None => {}
    }
    // HTTP/1.1 keeps the connection unless told not to; HTTP/1.0 only
    // when asked.
    head.keep_alive = !close && (version == Version::HTTP_11 || keep_alive);
    head.body = length.unwrap_or(0);
    Parsed::Head
}

/// httparse ran out of header slots: a head past the most fields taken is
/// refused here; one within it but past the fast path's slots is hyper's,
/// and one still arriving is waited for.
fn too_many(buf: &[u8], max_bytes: usize, max_headers: usize) -> Parsed {
    // The empty line that ends the head (a bare LF ends a line too, as
    // httparse takes it).
    let end = (0..buf.len()).find_map(|i| match &buf[i..] {
        [b'\n', b'\n', ..] => Some(i + 2),
        [b'\n', b'\r', b'\n', ..] => Some(i + 3),
        _ => None,
    });
    let head = &buf[..end.unwrap_or(buf.len())];
    // Lines after the request line, the empty last one not counted.
    let lines = head.iter().filter(|&&b| b == b'\n').count();
    let fields = lines.saturating_sub(1 + usize::from(end.is_some()));
    match end {
        _ if fields > max_headers => Parsed::Refuse(Refusal::TooMany(fields)),
        Some(len) if len > max_bytes => Parsed::Refuse(Refusal::TooLarge(len)),
        Some(_) => Parsed::Hyper(Handover::Head),
        None if buf.len() >= max_bytes => Parsed::Refuse(Refusal::TooLarge(buf.len())),
        None => Parsed::Partial,
    }
}

impl Head {
    /// Takes the head and what came of its body out of `buf`: the request,
    /// those body bytes, and the body's whole length; or `None` (and `buf`
    /// as it was) if the `http` types refuse a part of it (hyper answers).
    pub fn take(&mut self, buf: &mut BytesMut) -> Option<(Request<()>, Bytes, u64)> {
        let head = buf.split_to(self.len).freeze();
        let body_len = self.body;
        let Some(req) = self.build(&head) else {
            // Put the head back for hyper, which will answer it.
            let mut whole = BytesMut::with_capacity(head.len() + buf.len());
            whole.extend_from_slice(&head);
            whole.extend_from_slice(buf);
            *buf = whole;
            return None;
        };
        let here = (buf.len() as u64).min(body_len) as usize;
        Some((req, buf.split_to(here).freeze(), body_len))
    }
    /// The request, its names moved in and its values sliced from `head`.
    fn build(&mut self, head: &Bytes) -> Option<Request<()>> {
        let uri = Uri::from_maybe_shared(head.slice(self.path.0..self.path.1)).ok()?;
        // Room for a `Host` made from the target (`host::resolve`).
        let mut headers = HeaderMap::with_capacity(self.headers.len() + 1);
        for &[n, m, a, b] in &self.headers {
            let name = HeaderName::from_bytes(&head[n as usize..m as usize]).ok()?;
            let value = HeaderValue::from_maybe_shared(head.slice(a as usize..b as usize)).ok()?;
            headers.append(name, value);
        }
        let mut req = Request::new(());
        *req.method_mut() = std::mem::take(&mut self.method);
        *req.uri_mut() = uri;
        *req.version_mut() = self.version;
        // The empty map `Request::new` made holds no memory: forgotten,
        // not dropped (dropping it walks its empty parts, every request).
        std::mem::forget(std::mem::replace(req.headers_mut(), headers));
        Some(req)
    }
}

/// How the fast path frames the request at the front of `buf`, for the
/// differential fuzz target: `(head length, body length, keep-alive)`;
/// `None` when it would not serve it itself (not whole yet, hyper's, or
/// refused).
pub fn framing(buf: &[u8], limits: HeadLimits) -> Option<(usize, u64, bool)> {
    let mut head = Head::default();
    match parse(buf, limits, &mut head) {
        Parsed::Head => {
            // The hand-over `Head::request` makes for what `http` refuses.
            head.build(&Bytes::copy_from_slice(&buf[..head.len]))?;
            Some((head.len, head.body, head.keep_alive))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
