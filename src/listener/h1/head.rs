//! Reading a request head off the buffer (`httparse`), and deciding
//! whether the fast path serves it or hyper must (`Parsed::Hyper`, with
//! why: the hand-over metric's reason).

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Uri, Version};
use smallvec::SmallVec;

use crate::http1;
use crate::http1::pump::Pump;
use crate::metrics::Handover;
use crate::pipeline::body::ClientBody;

/// Header slots parsed on the fast path; a head with more goes to hyper.
const PARSE_HEADERS: usize = 128;

/// What a parse of the buffer found.
pub(super) enum Parsed {
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
pub(super) enum Refusal {
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
pub(super) struct Head {
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
    body: u64,
    pub(super) keep_alive: bool,
}

/// `(largest head, most headers)` hyper would take: past them, hyper
/// answers (431), not the fast path.
pub type HeadLimits = (usize, usize);

pub(super) fn parse(buf: &[u8], (max_bytes, max_headers): HeadLimits, head: &mut Head) -> Parsed {
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
    /// its body, and the pump for the rest of it; or `None` (and `buf` as it
    /// was) if hyper must answer it.
    pub(super) fn request(
        &mut self,
        buf: &mut BytesMut,
    ) -> Option<(Request<()>, ClientBody, Option<Pump>)> {
        let head = buf.split_to(self.len).freeze();
        let body_len = self.body;
        let built = self.build(&head);
        if built.is_none() {
            // Put the head back for hyper, which will answer it.
            let mut whole = BytesMut::with_capacity(head.len() + buf.len());
            whole.extend_from_slice(&head);
            whole.extend_from_slice(buf);
            *buf = whole;
            return None;
        }
        let here = (buf.len() as u64).min(body_len) as usize;
        let first = buf.split_to(here).freeze();
        let (body, pump) = match body_len {
            0 => (ClientBody::Read(None), None),
            n if n == here as u64 => (ClientBody::Read(Some(first)), None),
            n => {
                let (pump, body) = Pump::new(n, first);
                (ClientBody::Pumped(body), Some(pump))
            }
        };
        built.map(|req| (req, body, pump))
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

/// The fast path's reading of `buf`, for the fuzz target: the request and
/// body it would serve and what stays buffered for the next; `None` when
/// the head is not whole yet or hyper would be given it.
pub fn read_request(buf: &[u8]) -> Option<(Request<()>, ClientBody, Bytes)> {
    let mut head = Head::default();
    let Parsed::Head = parse(buf, (64 << 10, 100), &mut head) else {
        return None;
    };
    let mut buf = BytesMut::from(buf);
    let (req, body, _) = head.request(&mut buf)?;
    Some((req, body, buf.freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body;

    const LIMITS: HeadLimits = (64 << 10, 100);

    fn parsed(raw: &str) -> Parsed {
        parse(raw.as_bytes(), LIMITS, &mut Head::default())
    }

    fn head(raw: &str) -> Head {
        let mut h = Head::default();
        match parse(raw.as_bytes(), LIMITS, &mut h) {
            Parsed::Head => h,
            Parsed::Partial => panic!("partial: {raw:?}"),
            Parsed::Hyper(why) => panic!("handed to hyper ({why:?}): {raw:?}"),
            Parsed::Refuse(why) => panic!("refused ({why:?}): {raw:?}"),
        }
    }

    #[test]
    fn simple_requests_stay_on_the_fast_path_with_their_keep_alive() {
        assert!(head("GET / HTTP/1.1\r\nHost: a\r\n\r\n").keep_alive);
        assert!(!head("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").keep_alive);
        assert!(!head("GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
        assert!(
            !head("GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n")
                .keep_alive,
            "close wins"
        );
        let post = head("POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
        assert_eq!(post.body, 5);
        assert_eq!(post.headers.len(), 1);
    }

    #[test]
    fn anything_but_the_simple_case_goes_to_hyper() {
        use Handover::*;
        for (raw, why) in [
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                Chunked,
            ),
            (
                "POST / HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
                Expect,
            ),
            (
                "GET / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
                Upgrade,
            ),
            ("GET / HTTP/1.1\r\nUpgrade: h2c\r\n\r\n", Upgrade),
            (
                "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
                Head,
            ),
            ("POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello", Head),
            ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", Http2),
            ("GET / HTTP/1.1\r\nX-A: a\0b\r\n\r\n", Head),
            ("GET / HTTP/1.1\r\nHost : a\r\n\r\n", Head),
        ] {
            match parsed(raw) {
                Parsed::Hyper(got) => assert_eq!(got, why, "{raw:?}"),
                _ => panic!("kept on the fast path: {raw:?}"),
            }
        }
    }

    #[test]
    fn heads_past_the_largest_taken_are_refused_here_not_by_hyper() {
        let many: String = (0..101).map(|i| format!("X-{i}: v\r\n")).collect();
        let raw = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert!(matches!(
            parse(raw.as_bytes(), LIMITS, &mut Head::default()),
            Parsed::Refuse(Refusal::TooMany(101))
        ));
        // Still arriving, and past the most already.
        assert!(matches!(
            parse(
                &raw.as_bytes()[..raw.len() - 2],
                LIMITS,
                &mut Head::default()
            ),
            Parsed::Refuse(Refusal::TooMany(101))
        ));
        // Past the fast path's 128 slots but within the limit: hyper's.
        let many: String = (0..150).map(|i| format!("X-{i}: v\n")).collect();
        let raw = format!("GET / HTTP/1.1\n{many}\n");
        assert!(matches!(
            parse(raw.as_bytes(), (64 << 10, 200), &mut Head::default()),
            Parsed::Hyper(Handover::Head)
        ));
        let raw = format!("GET / HTTP/1.1\r\nX-A: {}\r\n\r\n", "a".repeat(1000));
        assert!(matches!(
            parse(raw.as_bytes(), (512, 100), &mut Head::default()),
            Parsed::Refuse(Refusal::TooLarge(_))
        ));
        // Not complete and not yet too long: wait for more.
        assert!(matches!(
            parsed("GET / HTTP/1.1\r\nHost: a\r\n"),
            Parsed::Partial
        ));
        let partial = format!("GET / HTTP/1.1\r\nX-A: {}", "a".repeat(1000));
        assert!(matches!(
            parse(partial.as_bytes(), (512, 100), &mut Head::default()),
            Parsed::Refuse(Refusal::TooLarge(_))
        ));
    }

    #[test]
    fn codings_other_than_a_lone_chunked_are_refused_and_lengths_read_by_the_one_rule() {
        for raw in [
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
        ] {
            assert!(
                matches!(parsed(raw), Parsed::Refuse(Refusal::Coding)),
                "{raw:?}"
            );
        }
        // Equal duplicates are one length; leading zeros are digits.
        let h = head("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello");
        assert_eq!(h.body, 5);
        let h = head("POST / HTTP/1.1\r\nContent-Length: 000000000000000000005\r\n\r\nhello");
        assert_eq!(h.body, 5);
    }

    #[test]
    fn a_head_hyper_must_answer_is_put_back_whole() {
        // httparse takes this target; `Uri` refuses it, so hyper answers.
        let bad = "GET /<q> HTTP/1.1\r\nHost: a\r\n\r\nNEXT";
        let mut h = head(bad);
        let mut buf = BytesMut::from(bad.as_bytes());
        assert!(h.request(&mut buf).is_none());
        assert_eq!(&buf[..], bad.as_bytes(), "every byte back, in order");
        let mut buf = BytesMut::from("GET /x?y=1 HTTP/1.1\r\nHost: a\r\n\r\nGET /next".as_bytes());
        // The same `Head` parses the next request: nothing of the last stays.
        assert!(matches!(parse(&buf, LIMITS, &mut h), Parsed::Head));
        let (req, body, pump) = h.request(&mut buf).unwrap();
        assert!(pump.is_none(), "no body, nothing to pump");
        assert_eq!(req.uri(), "/x?y=1");
        assert_eq!(req.headers()["host"], "a");
        assert!(body.is_end_stream());
        assert_eq!(
            &buf[..],
            b"GET /next",
            "the next request stays in the buffer"
        );
    }
}
