//! HTTP/1.x served by tollgate itself, for the requests API traffic is
//! made of: a head with no body or a `Content-Length` one. The head is
//! parsed here (`httparse`, header values kept as slices of the read
//! buffer), the request runs through the pipeline, and the answer goes out
//! with its head and body in one write; the next request is read from the
//! same 4 KiB buffer. hyper's server costs about 15% more CPU per request
//! and 16 KiB of buffers per connection, which is why this exists.
//!
//! A body that came with its head is handed over whole; the rest of it is
//! read off the connection as the pipeline takes it (`pump`), also while
//! the answer streams (an upstream may answer as the body arrives). What
//! nobody reads is discarded after the answer when small, or closes the
//! connection (lingering) when large, by `pipeline::discard`'s rules.
//!
//! Everything else leaves the fast path, with the bytes already read put
//! back in front (`Rewind`), to hyper for the rest of the connection:
//! chunked bodies, `Expect`, upgrades, a head hyper would refuse
//! (malformed, too large, too many headers: hyper answers those as it
//! always has), HTTP/2's prior-knowledge preface. So every framing rule
//! hyper enforces still holds, and this file only has to be right about
//! the cases it keeps.
//!
//! The connection watchdog (`conn::watch`) times it as it does hyper's:
//! idle connections, slow heads, clients that stop reading, and graceful
//! shutdown (the response in flight says `Connection: close`).

use std::future::{poll_fn, Future};
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame};
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::conn::{self, ConnState};
use super::linger::Linger;
use super::pump::Pump;
use super::rewind::Rewind;
use super::ListenerCtx;
use crate::metrics::Handover;
use crate::pipeline::body::{ClientBody, ProxyBody};
use crate::pipeline::discard::DISCARD_BYTES;
use crate::pipeline::ConnInfo;

/// A connection's read buffer, allocated at its first read and kept while
/// it stays this size (nginx's `client_header_buffer_size` is 1 KiB).
const FIRST_READ: usize = 4096;

/// The largest read for a request body (its buffer is handed to the body
/// whole, so it is sized to what is left of the body, up to this).
const BODY_READ: u64 = 64 << 10;

/// Header slots parsed on the fast path; a head with more goes to hyper.
const PARSE_HEADERS: usize = 128;

/// A response body piece at most this large is copied next to its head
/// (one write); a larger one is written from where it is.
const COPY_BODY: usize = 16 << 10;

/// Serves HTTP/1.x on `io` until it ends, or hands it to hyper.
pub(super) async fn serve<I>(
    io: I,
    ctx: &ListenerCtx,
    info: Arc<ConnInfo>,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let state = info.state.clone();
    let ended = {
        let served = run(io, ctx, &info);
        let served = pin!(served);
        let close = |_: Pin<&mut _>| state.close_gracefully();
        conn::watch(served, close, ctx, &state, info.peer, &mut shutdown).await
    };
    if let Some(Some(rest)) = ended {
        // Boxed: a connection that stays on the fast path carries no room
        // for hyper's.
        Box::pin(conn::serve(rest, ctx, info, shutdown)).await;
    }
}

/// The fast path's loop: `Some` hands the connection to hyper.
async fn run<I>(io: I, ctx: &ListenerCtx, info: &ConnInfo) -> Option<Rewind<I>>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let state = &info.state;
    // Reads through it mark the connection as receiving (the watchdog's
    // slow-head check); a close after an early answer lingers.
    let mut io = Linger::new(io, state.clone(), ctx.lingering_time, ctx.lingering_timeout);
    let mut buf = BytesMut::new();
    // How much a head's read asks for: FIRST_READ, doubled while reads
    // fill it (nginx's large_client_header_buffers, hyper's adaptive read).
    let mut read_size = FIRST_READ;
    let mut out = Vec::new();
    loop {
        let head = loop {
            if !buf.is_empty() {
                match parse(&buf, ctx.head_limits) {
                    Parsed::Head(head) => break head,
                    Parsed::Partial => {}
                    Parsed::Hyper(why) => {
                        state.handed_over(why);
                        return Some(Rewind::new(io.into_inner(), buf.freeze()));
                    }
                }
            }
            if buf.capacity() - buf.len() < read_size / 2 {
                buf.reserve(read_size);
            }
            let room = buf.capacity() - buf.len();
            let mut read = pin!(io.read_buf(&mut buf));
            let n = poll_fn(|cx| {
                if state.closing() {
                    return Poll::Ready(Ok(0));
                }
                read.as_mut().poll(cx)
            })
            .await;
            match n {
                // A read that filled its room: the client sends more at
                // once (bodies with their heads); read more at a time.
                Ok(n) if n == room => read_size = (read_size * 2).min(BODY_READ as usize),
                Ok(1..) => {}
                _ => {
                    let _ = io.shutdown().await;
                    return None;
                }
            }
        };
        let Some((req, body, pump)) = head.request(&mut buf) else {
            state.handed_over(Handover::Head);
            return Some(Rewind::new(io.into_inner(), buf.freeze()));
        };
        let facts = Facts {
            head: req.method() == Method::HEAD,
            http10: req.version() == Version::HTTP_10,
            keep_alive: head.keep_alive,
        };
        // Each request runs on the config current when it arrives.
        let pipeline = ctx.live.load_full();
        // The connection while this request is served: writes to it, and
        // reads of the request body as it is taken (both ways at once: an
        // upstream may stream its answer while the body still arrives).
        let mut duplex = Duplex {
            io: &mut io,
            buf: &mut buf,
            pump: pump.as_ref(),
        };
        let resp = {
            // Boxed: between requests a connection holds no room for it.
            let mut handled = Box::pin(pipeline.handle_parts(req, Some(body), info));
            poll_fn(|cx| loop {
                if let Poll::Ready(resp) = handled.as_mut().poll(cx) {
                    return Poll::Ready(Some(resp));
                }
                if duplex.pump.is_some_and(|p| p.remaining() > 0) {
                    if duplex.poll_pump(cx) {
                        continue;
                    }
                    return Poll::Pending;
                }
                // A client that hangs up cancels its request, as with
                // hyper (which stops looking once it has the next
                // request's bytes: so does this).
                if duplex.buf.is_empty() {
                    if duplex.buf.capacity() < 512 {
                        duplex.buf.reserve(FIRST_READ);
                    }
                    let read = pin!(duplex.io.read_buf(duplex.buf)).poll(cx);
                    if let Poll::Ready(Ok(0) | Err(_)) = read {
                        return Poll::Ready(None);
                    }
                }
                return Poll::Pending;
            })
            .await
        };
        let resp = resp?;
        // What is left of a body nobody read: a little is read and thrown
        // away after the answer, keeping the connection (nginx does too);
        // more closes it, lingering so that the client reads the answer
        // (`pipeline::discard` has the same rules for hyper's bodies).
        let unread = pump.as_ref().map_or(0, Pump::remaining);
        let mut again = facts.keep_alive && !state.closing();
        if unread > DISCARD_BYTES {
            again = false;
            state.linger_on_close();
        }
        let written = respond(&mut duplex, &mut out, resp, &facts, again).await;
        match written {
            Ok(true) if !state.closing() => {}
            _ => {
                let _ = io.shutdown().await;
                return None;
            }
        }
        if unread > 0 && !discard(&mut io, &mut buf, unread, state, ctx).await {
            state.linger_on_close();
            let _ = io.shutdown().await;
            return None;
        }
        // An idle connection keeps a first-size buffer at most.
        if buf.is_empty() && buf.capacity() > FIRST_READ {
            buf = BytesMut::new();
        }
        if out.capacity() > 2 * FIRST_READ {
            out = Vec::new();
        }
    }
}

/// The connection while a request with a pumped body is served: writing
/// to it (and waiting on the response body) also reads the request body
/// whenever it has taken what it was given.
struct Duplex<'a, I> {
    io: &'a mut Linger<I>,
    buf: &'a mut BytesMut,
    pump: Option<&'a Pump>,
}

impl<I: AsyncRead + Unpin> Duplex<'_, I> {
    /// Reads body bytes for the pump while it wants them: whether it
    /// handed the body any (so whoever reads the body may go on).
    fn poll_pump(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        let Some(pump) = self.pump else {
            return false;
        };
        if !pump.wants() {
            return false;
        }
        if self.buf.is_empty() {
            self.buf.reserve(pump.remaining().min(BODY_READ) as usize);
            match pin!(self.io.read_buf(self.buf)).poll(cx) {
                Poll::Ready(Ok(0) | Err(_)) => {
                    pump.fail();
                    return true;
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => return false,
            }
        }
        let n = (self.buf.len() as u64).min(pump.remaining()) as usize;
        pump.deliver(self.buf.split_to(n).freeze());
        true
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Duplex<'_, I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_pump(cx);
        Pin::new(&mut *self.io).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_pump(cx);
        Pin::new(&mut *self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<io::Result<()>> {
        self.poll_pump(cx);
        Pin::new(&mut *self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.io).poll_shutdown(cx)
    }
}

/// Reads the `left` bytes of an unread body off the connection and throws
/// them away, each read within `lingering_timeout` and all of them within
/// `lingering_time`: whether they all came. What follows them stays in
/// `buf` (the next request).
async fn discard<I: AsyncRead + Unpin>(
    io: &mut I,
    buf: &mut BytesMut,
    mut left: u64,
    state: &Arc<ConnState>,
    ctx: &ListenerCtx,
) -> bool {
    // Busy, not idle, and no late request head, while this runs.
    let _discarding = state.discarding();
    let each = ctx.lingering_timeout;
    let total = ctx.lingering_time.max(each);
    let drained = tokio::time::timeout(total, async {
        loop {
            let n = (buf.len() as u64).min(left) as usize;
            let _ = buf.split_to(n);
            left -= n as u64;
            if left == 0 {
                return true;
            }
            buf.reserve(FIRST_READ);
            match tokio::time::timeout(each, io.read_buf(buf)).await {
                Ok(Ok(1..)) => {}
                _ => return false,
            }
        }
    })
    .await;
    matches!(drained, Ok(true))
}

/// What a parse of the buffer found.
// Not boxed: it is built once per request and moved once, where a box
// would be an allocation per request.
#[allow(clippy::large_enum_variant)]
enum Parsed {
    /// A request head the fast path serves.
    Head(Head),
    /// Not a whole head yet.
    Partial,
    /// Anything else: hyper's.
    Hyper(Handover),
}

/// A parsed request head: where its parts are in the buffer.
struct Head {
    len: usize,
    method: Method,
    version: Version,
    path: (usize, usize),
    headers: SmallVec<[(HeaderName, u32, u32); 20]>,
    /// Its body's length (`Content-Length`), read with the head as far as
    /// it came, the rest pumped (`pump`).
    body: u64,
    keep_alive: bool,
}

/// `(largest head, most headers)` hyper would take: past them, hyper
/// answers (431), not the fast path.
pub type HeadLimits = (usize, usize);

fn parse(buf: &[u8], (max_bytes, max_headers): HeadLimits) -> Parsed {
    // Not initialised: writing 128 empty slots per request costs more
    // than parsing a usual head.
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; PARSE_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let slots = &mut slots[..max_headers.min(PARSE_HEADERS)];
    let len = match req.parse_with_uninit_headers(buf, slots) {
        Ok(httparse::Status::Complete(len)) if len <= max_bytes => len,
        Ok(httparse::Status::Partial) if buf.len() < max_bytes => return Parsed::Partial,
        Err(httparse::Error::Version) if buf.starts_with(b"PRI * HTTP/2.0") => {
            return Parsed::Hyper(Handover::Http2)
        }
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
    let mut head = Head {
        len,
        method,
        version,
        path: (at(path.as_bytes()), at(path.as_bytes()) + path.len()),
        headers: SmallVec::new(),
        body: 0,
        keep_alive: version == Version::HTTP_11,
    };
    let mut length = None;
    for h in req.headers.iter() {
        let Ok(name) = HeaderName::from_bytes(h.name.as_bytes()) else {
            return Parsed::Hyper(Handover::Head);
        };
        match name {
            header::CONTENT_LENGTH => {
                let digits = h.value.trim_ascii();
                if length.is_some() || digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                    return Parsed::Hyper(Handover::Head);
                }
                match std::str::from_utf8(digits)
                    .ok()
                    .and_then(|d| d.parse().ok())
                {
                    Some(n) => length = Some(n),
                    None => return Parsed::Hyper(Handover::Head),
                }
            }
            header::TRANSFER_ENCODING => return Parsed::Hyper(Handover::Chunked),
            header::EXPECT => return Parsed::Hyper(Handover::Expect),
            header::UPGRADE => return Parsed::Hyper(Handover::Upgrade),
            header::CONNECTION => {
                for token in h.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    if token.eq_ignore_ascii_case(b"close") {
                        head.keep_alive = false;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        head.keep_alive |= version == Version::HTTP_10;
                    } else if token.eq_ignore_ascii_case(b"upgrade") {
                        return Parsed::Hyper(Handover::Upgrade);
                    }
                }
            }
            _ => {}
        }
        let v = at(h.value);
        head.headers
            .push((name, v as u32, (v + h.value.len()) as u32));
    }
    // A `close` wins over a `keep-alive` in any order.
    if head.keep_alive && has_close(&req) {
        head.keep_alive = false;
    }
    head.body = length.unwrap_or(0);
    Parsed::Head(head)
}

fn has_close(req: &httparse::Request<'_, '_>) -> bool {
    req.headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| h.value.split(|&b| b == b','))
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
}

impl Head {
    /// Takes the head and what came of its body out of `buf`: the request,
    /// its body, and the pump for the rest of it; or `None` (and `buf` as it
    /// was) if hyper must answer it.
    fn request(&self, buf: &mut BytesMut) -> Option<(Request<()>, ClientBody, Option<Pump>)> {
        let head = buf.split_to(self.len).freeze();
        let built = self.build(&head);
        if built.is_none() {
            // Put the head back for hyper, which will answer it.
            let mut whole = BytesMut::with_capacity(head.len() + buf.len());
            whole.extend_from_slice(&head);
            whole.extend_from_slice(buf);
            *buf = whole;
            return None;
        }
        let here = (buf.len() as u64).min(self.body) as usize;
        let first = buf.split_to(here).freeze();
        let (body, pump) = match self.body {
            0 => (ClientBody::Read(None), None),
            n if n == here as u64 => (ClientBody::Read(Some(first)), None),
            n => {
                let (pump, body) = Pump::new(n, first);
                (ClientBody::Pumped(body), Some(pump))
            }
        };
        built.map(|req| (req, body, pump))
    }

    fn build(&self, head: &Bytes) -> Option<Request<()>> {
        let uri = Uri::from_maybe_shared(head.slice(self.path.0..self.path.1)).ok()?;
        let mut headers = HeaderMap::with_capacity(self.headers.len());
        for (name, a, b) in &self.headers {
            let value =
                HeaderValue::from_maybe_shared(head.slice(*a as usize..*b as usize)).ok()?;
            headers.append(name.clone(), value);
        }
        let mut req = Request::new(());
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = uri;
        *req.version_mut() = self.version;
        *req.headers_mut() = headers;
        Some(req)
    }
}

/// The fast path's reading of `buf`, for the fuzz target: the request and
/// body it would serve and what stays buffered for the next; `None` when
/// the head is not whole yet or hyper would be given it.
pub fn read_request(buf: &[u8]) -> Option<(Request<()>, ClientBody, Bytes)> {
    let Parsed::Head(head) = parse(buf, (64 << 10, 100)) else {
        return None;
    };
    let mut buf = BytesMut::from(buf);
    let (req, body, _) = head.request(&mut buf)?;
    Some((req, body, buf.freeze()))
}

/// What the response's framing depends on in its request.
struct Facts {
    head: bool,
    http10: bool,
    keep_alive: bool,
}

/// How a response body is delimited on the wire.
#[derive(Clone, Copy, PartialEq)]
enum Framing {
    /// Nothing follows the head.
    None,
    Length(u64),
    Chunked,
    /// HTTP/1.0 with no length: the close ends it.
    Close,
}

/// Writes `resp`: whether the connection may carry another request. The
/// head follows hyper's rules, so clients see what they saw before.
async fn respond<I>(
    io: &mut Duplex<'_, I>,
    out: &mut Vec<u8>,
    resp: Response<ProxyBody>,
    facts: &Facts,
    mut keep: bool,
) -> io::Result<bool>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let (parts, mut body) = resp.into_parts();
    let status = parts.status;
    let no_length = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let bodiless = facts.head || no_length;
    // `None`: the body has ended already.
    let hint = (!body.is_end_stream()).then(|| body.size_hint().exact());
    out.clear();
    if facts.http10 {
        out.extend_from_slice(b"HTTP/1.0 ");
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
    }
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    out.extend_from_slice(b"\r\n");
    let (mut length, mut wrote_date, mut said_close, mut said_keep_alive) =
        (None, false, false, false);
    for (name, value) in &parts.headers {
        match *name {
            header::CONTENT_LENGTH => {
                if length.is_some() || no_length {
                    continue;
                }
                length = match hint {
                    Some(Some(n)) => Some(n),
                    Some(None) => parse_length(value.as_bytes()),
                    None if facts.head => parse_length(value.as_bytes()),
                    None => None,
                };
                if length.is_none() {
                    continue;
                }
            }
            // Framing is decided here.
            header::TRANSFER_ENCODING => continue,
            header::CONNECTION => {
                for t in value.as_bytes().split(|&b| b == b',') {
                    said_close |= t.trim_ascii().eq_ignore_ascii_case(b"close");
                    said_keep_alive |= t.trim_ascii().eq_ignore_ascii_case(b"keep-alive");
                }
            }
            header::DATE => wrote_date = true,
            _ => {}
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    keep &= !said_close;
    let framing = match (bodiless, hint, length) {
        (true, Some(Some(n)), None) if !no_length => {
            header_line(
                out,
                b"content-length: ",
                itoa::Buffer::new().format(n).as_bytes(),
            );
            Framing::None
        }
        (true, ..) => Framing::None,
        (false, None, _) => {
            header_line(out, b"content-length: ", b"0");
            Framing::None
        }
        (false, Some(_), Some(n)) => Framing::Length(n),
        (false, Some(Some(n)), None) => {
            header_line(
                out,
                b"content-length: ",
                itoa::Buffer::new().format(n).as_bytes(),
            );
            Framing::Length(n)
        }
        (false, Some(None), None) if facts.http10 => {
            keep = false;
            Framing::Close
        }
        (false, Some(None), None) => {
            header_line(out, b"transfer-encoding: ", b"chunked");
            Framing::Chunked
        }
    };
    if facts.http10 {
        if keep && !said_keep_alive {
            header_line(out, b"connection: ", b"keep-alive");
        }
    } else if !keep && !said_close {
        header_line(out, b"connection: ", b"close");
    }
    if !wrote_date {
        header_line(out, b"date: ", &date());
    }
    out.extend_from_slice(b"\r\n");
    if framing == Framing::None {
        // A body that is not sent is not read either (HEAD, 204, 304).
        write_all(io, &mut [IoSlice::new(out)]).await?;
        io.flush().await?;
        return Ok(keep);
    }
    let mut left = match framing {
        Framing::Length(n) => n,
        _ => u64::MAX,
    };
    // `out` holds the head until it is written, with the first piece of
    // the body when that is ready at once.
    let mut head_sent = false;
    loop {
        let frame = match next_frame(&mut body, io, head_sent).await {
            Next::Frame(frame) => frame,
            Next::Waiting => {
                write_all(io, &mut [IoSlice::new(out)]).await?;
                io.flush().await?;
                out.clear();
                head_sent = true;
                continue;
            }
        };
        let data = match frame {
            None => break,
            // Broken off: the client sees a cut response (no last chunk,
            // a short length), never one that looks whole.
            Some(Err(e)) => return Err(io::Error::other(e)),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if !data.is_empty() => data,
                // Trailers are not sent (as before).
                _ => continue,
            },
        };
        let data = if data.len() as u64 > left {
            data.slice(..left as usize)
        } else {
            data
        };
        left -= data.len() as u64;
        let mut size = [0u8; 20];
        let (prefix, suffix): (&[u8], &[u8]) = match framing {
            Framing::Chunked => (chunk_size(data.len(), &mut size), b"\r\n"),
            _ => (b"", b""),
        };
        out.extend_from_slice(prefix);
        if data.len() <= COPY_BODY {
            out.extend_from_slice(&data);
            out.extend_from_slice(suffix);
            write_all(io, &mut [IoSlice::new(out)]).await?;
        } else {
            let mut bufs = [IoSlice::new(out), IoSlice::new(&data), IoSlice::new(suffix)];
            write_all(io, &mut bufs).await?;
        }
        io.flush().await?;
        out.clear();
        head_sent = true;
        if left == 0 {
            break;
        }
    }
    match framing {
        Framing::Chunked => out.extend_from_slice(b"0\r\n\r\n"),
        Framing::Length(_) if left > 0 => keep = false,
        _ => {}
    }
    if !out.is_empty() {
        write_all(io, &mut [IoSlice::new(out)]).await?;
        io.flush().await?;
    }
    out.clear();
    Ok(keep && framing != Framing::Close)
}

enum Next {
    Frame(Option<Result<Frame<Bytes>, crate::pipeline::body::ResponseBodyError>>),
    /// Not ready, and the head is not out yet: write it first.
    Waiting,
}

/// The body's next frame; if it is not ready and the head is still
/// unwritten, says so at once instead of waiting. The request body is
/// pumped meanwhile (the upstream may wait for it to answer more).
async fn next_frame<I: AsyncRead + Unpin>(
    body: &mut ProxyBody,
    io: &mut Duplex<'_, I>,
    head_sent: bool,
) -> Next {
    poll_fn(|cx| loop {
        let pumped = io.poll_pump(cx);
        match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Ready(frame) => return Poll::Ready(Next::Frame(frame)),
            Poll::Pending if !head_sent => return Poll::Ready(Next::Waiting),
            Poll::Pending if pumped => continue,
            Poll::Pending => return Poll::Pending,
        }
    })
    .await
}

fn header_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

fn parse_length(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// A chunk's size line (`1a2f\r\n`), written into `buf`.
fn chunk_size(n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let digits = (usize::BITS - n.leading_zeros()).div_ceil(4).max(1) as usize;
    for (i, slot) in buf[..digits].iter_mut().enumerate() {
        let nibble = (n >> (4 * (digits - 1 - i))) & 0xf;
        *slot = b"0123456789abcdef"[nibble];
    }
    buf[digits..digits + 2].copy_from_slice(b"\r\n");
    &buf[..digits + 2]
}

/// Writes every byte of `bufs`, vectored where the stream can.
async fn write_all<I: AsyncWrite + Unpin>(
    io: &mut I,
    mut bufs: &mut [IoSlice<'_>],
) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        let n = io.write_vectored(bufs).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// The `Date` value, formatted once per second per thread.
fn date() -> [u8; 29] {
    use std::cell::Cell;
    thread_local! {
        static DATE: Cell<(u64, [u8; 29])> = const { Cell::new((0, [0; 29])) };
    }
    let secs = crate::clock::unix_ms() / 1000;
    DATE.with(|d| {
        let (at, value) = d.get();
        if at == secs {
            return value;
        }
        let mut value = [0; 29];
        let text = httpdate::fmt_http_date(std::time::UNIX_EPOCH + Duration::from_secs(secs));
        value.copy_from_slice(&text.as_bytes()[..29]);
        d.set((secs, value));
        value
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: HeadLimits = (64 << 10, 100);

    fn parsed(raw: &str) -> Parsed {
        parse(raw.as_bytes(), LIMITS)
    }

    fn head(raw: &str) -> Head {
        match parsed(raw) {
            Parsed::Head(h) => h,
            Parsed::Partial => panic!("partial: {raw:?}"),
            Parsed::Hyper(why) => panic!("handed to hyper ({why:?}): {raw:?}"),
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
                "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
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
    fn heads_past_what_hyper_takes_are_left_to_hyper_to_refuse() {
        let many: String = (0..101).map(|i| format!("X-{i}: v\r\n")).collect();
        let raw = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert!(matches!(
            parse(raw.as_bytes(), LIMITS),
            Parsed::Hyper(Handover::Head)
        ));
        let raw = format!("GET / HTTP/1.1\r\nX-A: {}\r\n\r\n", "a".repeat(1000));
        assert!(matches!(
            parse(raw.as_bytes(), (512, 100)),
            Parsed::Hyper(Handover::Head)
        ));
        // Not complete and not yet too long: wait for more.
        assert!(matches!(
            parsed("GET / HTTP/1.1\r\nHost: a\r\n"),
            Parsed::Partial
        ));
        let partial = format!("GET / HTTP/1.1\r\nX-A: {}", "a".repeat(1000));
        assert!(matches!(
            parse(partial.as_bytes(), (512, 100)),
            Parsed::Hyper(Handover::Head)
        ));
    }

    #[test]
    fn a_head_hyper_must_answer_is_put_back_whole() {
        // httparse takes this target; `Uri` refuses it, so hyper answers.
        let bad = "GET /<q> HTTP/1.1\r\nHost: a\r\n\r\nNEXT";
        let Parsed::Head(h) = parsed(bad) else {
            panic!("httparse takes {bad:?}")
        };
        let mut buf = BytesMut::from(bad.as_bytes());
        assert!(h.request(&mut buf).is_none());
        assert_eq!(&buf[..], bad.as_bytes(), "every byte back, in order");
        let mut buf = BytesMut::from("GET /x?y=1 HTTP/1.1\r\nHost: a\r\n\r\nGET /next".as_bytes());
        let h = match parse(&buf, LIMITS) {
            Parsed::Head(h) => h,
            _ => panic!("a simple head"),
        };
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

    #[test]
    fn chunk_sizes_are_lower_case_hex() {
        let mut b = [0; 20];
        assert_eq!(chunk_size(5, &mut b), b"5\r\n");
        assert_eq!(chunk_size(255, &mut b), b"ff\r\n");
        assert_eq!(chunk_size(4096, &mut b), b"1000\r\n");
        assert_eq!(chunk_size(usize::MAX, &mut b), b"ffffffffffffffff\r\n");
    }
}
