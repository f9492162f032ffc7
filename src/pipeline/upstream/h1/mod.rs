//! HTTP/1.1 to the upstream, driven by the request's own task.
//!
//! A pooled connection is a socket plus the bytes read from it and not yet
//! used. The request task writes the request and reads the response itself:
//! there is no connection task, no channel between the two and no waker
//! handed across, which is what a proxy pays for per request with a
//! general-purpose client. The exchange is full duplex: the request body
//! goes on being written while the response is read, so an upstream that
//! answers early (or streams its answer while it reads) is relayed as it
//! speaks.
//!
//! Framing follows RFC 9112 §6: no body for HEAD, 1xx, 204 and 304; a
//! chunked `Transfer-Encoding` wins over `Content-Length` (and the
//! connection is then not reused); conflicting lengths are an error; a body
//! with neither is read to the close. A connection goes back to the pool
//! only when its response was read exactly to its end, the request was
//! written whole, nothing extra arrived and neither side said `close`.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderValue, CONTENT_LENGTH};
use http::{Method, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::Sleep;

mod writer;

pub use super::io::Io;
use super::pool::Pool;
use super::Answer;
use crate::http1::body::{DecodeError, Framing};
use crate::http1::response::{self, Field, HeadError, Parsed};
use crate::pipeline::body::{HeadLines, RequestBody, RequestBodyError};
use writer::Writer;

/// First read size; doubled while reads fill it, up to `MAX_READ`.
const FIRST_READ: usize = 8 << 10;
const MAX_READ: usize = 256 << 10;
/// A body read whole with its head up to this size is copied out, so the
/// read buffer stays the connection's own and is reused.
const COPY_BODY: usize = 16 << 10;

/// A connection to an upstream target: the socket and what was read from
/// it but not used yet.
pub struct Conn {
    pub io: Io,
    pub read: BytesMut,
    /// The size of the next read (grows with large bodies).
    read_size: usize,
    /// The timer of its exchanges' deadline (`exchange`), made at its
    /// first one and kept: moving a registered timer's deadline later is
    /// one atomic write, where a timer per request is registered with the
    /// runtime and taken out again.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl Conn {
    pub fn new(io: Io) -> Conn {
        Conn {
            io,
            read: BytesMut::new(),
            read_size: FIRST_READ,
            deadline: None,
        }
    }

    /// Whether the upstream closed this idle connection (or sent
    /// something nobody asked for) while it sat in the pool. Costs no
    /// system call unless the socket became readable since its last read.
    pub fn is_stale(&mut self) -> bool {
        if !self.read.is_empty() {
            return true;
        }
        let mut cx = Context::from_waker(Waker::noop());
        match self.io.tcp().poll_read_ready(&mut cx) {
            Poll::Pending => false,
            Poll::Ready(Err(_)) => true,
            Poll::Ready(Ok(())) => {
                // Readable: a close, stray bytes, or (TLS) a session ticket
                // the TLS layer takes in and that leaves nothing to read.
                let mut byte = [0u8; 1];
                let mut buf = ReadBuf::new(&mut byte);
                !matches!(
                    Pin::new(&mut self.io).poll_read(&mut cx, &mut buf),
                    Poll::Pending
                )
            }
        }
    }

    /// Readies the connection to wait in the pool: a read buffer grown for
    /// a large body is let go, so an idle connection holds at most one
    /// first read's worth (nginx keeps none; dropping this one too would
    /// cost an allocation per request).
    pub fn park(&mut self) {
        self.read_size = FIRST_READ;
        if self.read.is_empty() && self.read.capacity() > FIRST_READ {
            self.read = BytesMut::new();
        }
    }

    /// Reads more into `self.read`: the number of bytes read (0: closed).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.read.reserve(self.read_size);
        let n = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.read
        ))?;
        if n >= self.read_size && self.read_size < MAX_READ {
            self.read_size *= 2;
        }
        Poll::Ready(Ok(n))
    }
}

/// Why an exchange failed.
#[derive(Debug)]
pub enum SendError {
    /// The client's request body failed (too large, too slow, cut off).
    Body(RequestBodyError),
    /// The connection failed or closed. `wrote`: some of the request was
    /// written; `received`: some of a response arrived.
    Io {
        error: io::Error,
        wrote: bool,
        received: bool,
        /// The request body, when none of the request was written (it can
        /// be sent again).
        unsent: Option<RequestBody>,
    },
    /// The upstream's answer is not valid HTTP/1.1.
    Protocol(HeadError),
    /// No response head within the upstream's timeout.
    Timeout,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Body(e) => e.fmt(f),
            SendError::Io {
                error,
                received: false,
                ..
            } if error.kind() == io::ErrorKind::UnexpectedEof => {
                f.write_str("connection closed before a response")
            }
            SendError::Io { error, .. } => write!(f, "connection error: {error}"),
            SendError::Protocol(why) => write!(f, "invalid response: {why}"),
            SendError::Timeout => f.write_str("no response head in time"),
        }
    }
}

/// Sends the request (`head` already encoded, then `body`) on `conn` and
/// reads the response head. The connection is returned to `pool` once the
/// response body ends cleanly.
pub async fn exchange(
    mut conn: Conn,
    head: Bytes,
    body: Option<RequestBody>,
    chunked: bool,
    method: Method,
    (pool, sent_at): (Arc<Pool>, Instant),
    timeout: Duration,
) -> Result<Answer, SendError> {
    // The whole exchange, up to the response head, has `timeout`.
    let until = tokio::time::Instant::now() + timeout;
    let mut deadline = match conn.deadline.take() {
        Some(mut timer) => {
            timer.as_mut().reset(until);
            timer
        }
        None => Box::pin(tokio::time::sleep_until(until)),
    };
    let mut writer = Some(Writer {
        head,
        out: VecDeque::new(),
        body,
        chunked,
        wrote: false,
    });
    // Set when writing failed after the upstream may have answered (an
    // early 413 and a close): the answer, if any, is still read.
    let mut write_failed: Option<SendError> = None;
    let mut step = |cx: &mut Context<'_>| loop {
        if let Some(w) = writer.as_mut() {
            match w.poll(&mut conn.io, cx) {
                Poll::Ready(Ok(())) => writer = None,
                Poll::Ready(Err(SendError::Body(e))) => {
                    return Poll::Ready(Err(SendError::Body(e)));
                }
                Poll::Ready(Err(e)) => {
                    writer = None;
                    write_failed = Some(e);
                }
                Poll::Pending => {}
            }
        }
        match parse_head(&mut conn.read, &method) {
            Err(why) => return Poll::Ready(Err(SendError::Protocol(why))),
            Ok(Some(head)) => return Poll::Ready(Ok(head)),
            Ok(None) => {}
        }
        let received = !conn.read.is_empty();
        let error = match ready!(conn.poll_fill(cx)) {
            Ok(0) => io::ErrorKind::UnexpectedEof.into(),
            Ok(_) => continue,
            Err(error) => error,
        };
        if let Some(failed) = write_failed.take() {
            return Poll::Ready(Err(failed));
        }
        let (wrote, unsent) = match writer.as_mut() {
            Some(w) if !w.wrote => (false, w.body.take()),
            _ => (true, None),
        };
        return Poll::Ready(Err(SendError::Io {
            error,
            wrote,
            received,
            unsent,
        }));
    };
    let head = poll_fn(|cx| match step(cx) {
        Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
            Poll::Ready(Err(SendError::Timeout))
        }
        polled => polled,
    })
    .await?;
    conn.deadline = Some(deadline);
    let Head {
        response,
        lines,
        framing,
        mut keep_alive,
    } = head;
    keep_alive &= write_failed.is_none();
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        return Ok(Answer::Upgrade(response, conn));
    }
    // The common case: a small body already here whole; the connection
    // goes back before the client is even answered.
    if let (Framing::Length(n), None) = (framing, &writer) {
        if n <= conn.read.len() as u64 {
            // Copied for the same reason as the head, when small.
            let data = match n as usize {
                n if n <= COPY_BODY => {
                    let data = Bytes::copy_from_slice(&conn.read[..n]);
                    conn.read.advance(n);
                    data
                }
                n => conn.read.split_to(n).freeze(),
            };
            if keep_alive && conn.read.is_empty() {
                pool.put(conn, sent_at);
            }
            let (parts, ()) = response.into_parts();
            return Ok(Answer::Response(
                Response::from_parts(parts, ResponseBody::Done(data)),
                lines,
            ));
        }
    }
    let (parts, ()) = response.into_parts();
    Ok(Answer::Response(
        Response::from_parts(
            parts,
            ResponseBody::Reading(Box::new(Reading {
                conn,
                writer,
                framing,
                keep_alive,
                pool,
                sent_at,
                trailers: BytesMut::new(),
            })),
        ),
        lines,
    ))
}

struct Head {
    response: Response<()>,
    /// The fields passed on, see [`HeadLines`].
    lines: HeadLines,
    framing: Framing,
    keep_alive: bool,
}

/// Parses a response head off the front of `read`, skipping interim
/// (1xx) responses other than 101. `None`: more bytes are needed.
///
/// The fields to pass on (`http1::response` says which) are copied as
/// lines (names in lower case) into the response's [`HeadLines`], not
/// parsed into a header map; the `Content-Length` of a HEAD's answer goes
/// in the map. A `101`'s fields all go in the map, for the tunnel to pick
/// from.
fn parse_head(read: &mut BytesMut, method: &Method) -> Result<Option<Head>, HeadError> {
    loop {
        let mut slots = response::slots();
        let taken = match response::parse_head(read, method, &mut slots)? {
            None => return Ok(None),
            Some(Parsed::Interim(len)) => Err(len),
            Some(Parsed::Final(head)) => Ok((head.len, copied(head))),
        };
        match taken {
            Err(len) => read.advance(len),
            Ok((len, head)) => {
                read.advance(len);
                return Ok(Some(head));
            }
        }
    }
}

/// A parsed head as the response and [`HeadLines`] it becomes.
fn copied(head: response::Head<'_, '_>) -> Head {
    let mut response = Response::new(());
    *response.status_mut() = head.status;
    // Room for the rate-limit fields the response stage adds.
    let mut lines = HeadLines {
        lines: BytesMut::with_capacity(head.len + 256),
        ..HeadLines::default()
    };
    for (name, value, field) in head.fields() {
        if field == Field::HeadLength {
            if let Ok(v) = HeaderValue::from_bytes(value) {
                response.headers_mut().append(CONTENT_LENGTH, v);
            }
            continue;
        }
        lines.date |= name.eq_ignore_ascii_case(b"date");
        lines.rate_limit_names |= starts_with_ignore_case(name, b"x-ratelimit-")
            || starts_with_ignore_case(name, b"ratelimit");
        lines.push(name, value);
    }
    if head.status == StatusCode::SWITCHING_PROTOCOLS {
        std::mem::take(&mut lines).into_map(response.headers_mut());
    }
    Head {
        response,
        lines,
        framing: head.framing,
        keep_alive: head.keep_alive,
    }
}

fn starts_with_ignore_case(name: &[u8], prefix: &[u8]) -> bool {
    name.len() >= prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix)
}

/// An upstream response body.
pub enum ResponseBody {
    /// All of it (possibly nothing), read with the head.
    Done(Bytes),
    /// Still arriving on its connection.
    Reading(Box<Reading>),
    /// Finished, or failed.
    Over,
}

pub struct Reading {
    conn: Conn,
    /// The request body, still being written.
    writer: Option<Writer>,
    framing: Framing,
    keep_alive: bool,
    pool: Arc<Pool>,
    /// When the request went out: the pool's idle clock for the
    /// connection (a little early, so on the safe side).
    sent_at: Instant,
    /// A chunked body's trailer lines, sent on as a trailers frame (to
    /// HTTP/2 and gRPC clients, and to settlement) at its end.
    trailers: BytesMut,
}

/// Why an upstream body stopped early.
#[derive(Debug)]
pub enum BodyError {
    Io(io::Error),
    Closed,
    /// A body `http1::body` cannot decode.
    Decode(DecodeError),
    /// The client's request body failed while the response was streaming.
    Request(RequestBodyError),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Io(e) => write!(f, "connection error: {e}"),
            BodyError::Closed => f.write_str("connection closed before the end of the body"),
            BodyError::Decode(why) => write!(f, "invalid body: {why}"),
            BodyError::Request(e) => write!(f, "request body: {e}"),
        }
    }
}

impl std::error::Error for BodyError {}

impl Reading {
    /// The next piece of the body: `Ok(None)` at its clean end.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, BodyError>> {
        loop {
            if let Some(w) = self.writer.as_mut() {
                match w.poll(&mut self.conn.io, cx) {
                    Poll::Ready(Ok(())) => self.writer = None,
                    Poll::Ready(Err(SendError::Body(e))) => {
                        return Poll::Ready(Err(BodyError::Request(e)))
                    }
                    Poll::Ready(Err(_)) => {
                        // The upstream stopped reading; its answer may
                        // still be whole.
                        self.writer = None;
                        self.keep_alive = false;
                    }
                    Poll::Pending => {}
                }
            }
            match self.decode()? {
                Some(Some(data)) => return Poll::Ready(Ok(Some(data))),
                Some(None) => return Poll::Ready(Ok(None)),
                None => {}
            }
            match ready!(self.conn.poll_fill(cx)) {
                Ok(0) if self.framing == Framing::Close => {
                    self.keep_alive = false;
                    return Poll::Ready(Ok(None));
                }
                Ok(0) => return Poll::Ready(Err(BodyError::Closed)),
                Ok(_) => {}
                Err(e) if self.framing == Framing::Close => {
                    // Some servers reset instead of closing: the end all
                    // the same for a body delimited by the close.
                    tracing::debug!(error = %e, "upstream reset after a close-delimited body");
                    self.keep_alive = false;
                    return Poll::Ready(Ok(None));
                }
                Err(e) => return Poll::Ready(Err(BodyError::Io(e))),
            }
        }
    }

    /// Takes what it can from the bytes read (`http1::body`).
    fn decode(&mut self) -> Result<Option<Option<Bytes>>, BodyError> {
        self.framing
            .decode(&mut self.conn.read, &mut self.trailers)
            .map_err(BodyError::Decode)
    }

    /// After the clean end: the connection goes back to the pool if it
    /// can be used again; the body's trailers, if it had any, are returned.
    fn finish(self) -> Option<http::HeaderMap> {
        let Reading {
            conn,
            writer,
            keep_alive,
            pool,
            sent_at,
            trailers,
            ..
        } = self;
        if keep_alive && writer.is_none() && conn.read.is_empty() {
            pool.put(conn, sent_at);
        }
        (!trailers.is_empty())
            .then(|| crate::http1::body::trailer_fields(&trailers))
            .filter(|t| !t.is_empty())
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        match this {
            ResponseBody::Done(data) => {
                let data = std::mem::take(data);
                *this = ResponseBody::Over;
                Poll::Ready((!data.is_empty()).then(|| Ok(Frame::data(data))))
            }
            ResponseBody::Reading(r) => match ready!(r.poll_next(cx)) {
                Ok(Some(data)) => {
                    if r.framing == Framing::Length(0) {
                        // The length is reached: hyper may not poll again.
                        if let ResponseBody::Reading(r) =
                            std::mem::replace(this, ResponseBody::Over)
                        {
                            r.finish();
                        }
                    }
                    Poll::Ready(Some(Ok(Frame::data(data))))
                }
                Ok(None) => {
                    let ResponseBody::Reading(r) = std::mem::replace(this, ResponseBody::Over)
                    else {
                        unreachable!("matched above")
                    };
                    Poll::Ready(r.finish().map(|t| Ok(Frame::trailers(t))))
                }
                Err(e) => {
                    *this = ResponseBody::Over;
                    Poll::Ready(Some(Err(e)))
                }
            },
            ResponseBody::Over => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Done(data) => data.is_empty(),
            ResponseBody::Reading(r) => r.framing == Framing::Length(0) && r.writer.is_none(),
            ResponseBody::Over => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Done(data) => SizeHint::with_exact(data.len() as u64),
            ResponseBody::Reading(r) => match r.framing {
                Framing::Length(n) => SizeHint::with_exact(n),
                _ => SizeHint::default(),
            },
            ResponseBody::Over => SizeHint::with_exact(0),
        }
    }
}

#[cfg(test)]
mod tests;
