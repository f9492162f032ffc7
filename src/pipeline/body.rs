//! Body types on both legs. Bodies stream frame by frame and are never
//! buffered whole, so memory stays flat whatever the size.
//!
//! - `RequestBody` (`request`): the client's body on its way upstream, cut
//!   off with an error once it passes the route's size limit (chunked
//!   bodies have no length to check up front).
//! - `ProxyBody`: what the client receives: a small body tollgate wrote, or
//!   the upstream's body with an idle timeout between chunks. When the
//!   upstream body ends cleanly the connection goes back to the pool; when it
//!   fails the error is passed on so the client sees a broken response, never
//!   a truncated one that looks complete. Dropping it ends the request for
//!   the access log and the idle-connection watchdog.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use self::stream::poll_stream;
use super::record::RequestEnd;
use super::response::grpc;
use super::upstream::h1::{BodyError, ResponseBody};
use super::upstream::h2::Stream;
use crate::http1::pump::PumpedBody;

mod request;
mod stream;

pub use self::request::{RequestBody, RequestBodyError};

/// A body's stall timer: how long it may make us wait between frames. It is
/// armed only the first time the body is not ready (most small bodies never
/// are, so they cost no timer), and pushed back on every frame after that.
#[derive(Debug)]
struct Stall {
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Stall {
    fn new(timeout: Duration) -> Self {
        Stall {
            timeout,
            sleep: None,
        }
    }

    /// Call when the body is pending: whether `timeout` has passed since it
    /// last made progress (or since it first made us wait).
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let timeout = self.timeout;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        sleep.as_mut().poll(cx).is_ready()
    }

    /// Call when the body produced something.
    fn progressed(&mut self) {
        if let Some(sleep) = self.sleep.as_mut() {
            sleep.as_mut().reset(Instant::now() + self.timeout);
        }
    }
}

/// The client's request body as the HTTP server stage hands it over. The
/// stages past the server read it through this type alone.
#[derive(Debug)]
pub enum ClientBody {
    /// Streamed by hyper (HTTP/2, and HTTP/1.x off the fast path).
    Hyper(Incoming),
    /// Read whole with its head by the HTTP/1.1 fast path (`listener::h1`):
    /// `None` once taken, or when there was none.
    Read(Option<Bytes>),
    /// Read off the connection by the fast path's loop as it is taken
    /// (`http1::pump`).
    Pumped(PumpedBody),
}

/// Why the client's body could not be read to its end.
pub type ClientBodyError = Box<dyn StdError + Send + Sync>;

impl From<Incoming> for ClientBody {
    fn from(body: Incoming) -> Self {
        ClientBody::Hyper(body)
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            ClientBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            ClientBody::Read(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            ClientBody::Pumped(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper(b) => b.is_end_stream(),
            ClientBody::Read(data) => data.is_none(),
            ClientBody::Pumped(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Hyper(b) => b.size_hint(),
            ClientBody::Read(data) => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            ClientBody::Pumped(b) => b.size_hint(),
        }
    }
}

/// Why the upstream's body stopped on its way to the client.
#[derive(Debug)]
pub enum ResponseBodyError {
    Upstream(BodyError),
    /// An HTTP/2 upstream's stream failed (reset, connection lost).
    Stream(hyper::Error),
    IdleTimeout(Duration),
}

impl fmt::Display for ResponseBodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResponseBodyError::Upstream(e) => write!(f, "upstream body failed: {e}"),
            ResponseBodyError::Stream(e) => write!(f, "upstream stream failed: {e}"),
            ResponseBodyError::IdleTimeout(d) => {
                write!(f, "upstream sent nothing for {}ms mid-body", d.as_millis())
            }
        }
    }
}

impl StdError for ResponseBodyError {}

/// A response on its way from the stage that makes it to the server that
/// writes it, boxed: it is returned through several async frames
/// (`proxy::forward`, `Pipeline::serve`, `Pipeline::handle_parts`, the
/// HTTP/1 server's loop), and each move of the 328 bytes unboxed would
/// copy them into memory the request has not touched yet. Hyper's servers
/// take it unboxed (`Pipeline::handle`).
pub type Reply = Box<http::Response<ProxyBody>>;

/// The body of every response tollgate sends.
pub struct ProxyBody {
    kind: Kind,
    /// Logs the request and releases the connection's in-flight count when
    /// the response is done (or abandoned).
    end: Option<RequestEnd>,
    /// Head fields that travel with the body, see [`HeadLines`].
    lines: HeadLines,
}

/// Head fields that travel with a response's body as encoded
/// `name: value\r\n` lines rather than in its header map: the upstream's
/// fields (hop-by-hop ones gone), then the rate-limit fields. tollgate's
/// HTTP/1 server writes them after the map's fields as they are: no field
/// name is parsed into a `HeaderName`, no map built or hashed for fields
/// only passed on. For hyper's servers (HTTP/2, HTTP/1 connections handed
/// over) they are moved into the map first ([`HeadLines::into_map`]).
#[derive(Default)]
pub struct HeadLines {
    pub lines: BytesMut,
    /// The upstream's fields include a `Date`.
    pub date: bool,
    /// ... a field whose name starts like a rate-limit field's, which
    /// tollgate's own may have to replace.
    pub rate_limit_names: bool,
}

impl HeadLines {
    /// Appends the line `name: value` (a `name` in lower case).
    pub fn push(&mut self, name: &[u8], value: &[u8]) {
        let start = self.lines.len();
        crate::http1::put_field(&mut self.lines, name, value);
        self.lines[start..start + name.len()].make_ascii_lowercase();
    }

    /// Each line as (name, value), names as written (lower case).
    pub fn fields(lines: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
        lines.split(|&b| b == b'\n').filter_map(|line| {
            let line = line.strip_suffix(b"\r")?;
            let colon = line.iter().position(|&b| b == b':')?;
            Some((&line[..colon], line[colon + 1..].trim_ascii_start()))
        })
    }

    /// Appends every line to `headers` (their values slices of one shared
    /// buffer); a line `HeaderName` or `HeaderValue` refuses is left out.
    pub fn into_map(self, headers: &mut http::HeaderMap) {
        let shared = self.lines.freeze();
        for (name, value) in Self::fields(&shared) {
            let start = value.as_ptr() as usize - shared.as_ptr() as usize;
            let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(name),
                http::HeaderValue::from_maybe_shared(shared.slice(start..start + value.len())),
            ) else {
                continue;
            };
            headers.append(name, value);
        }
    }
}

enum Kind {
    Full {
        data: Option<Bytes>,
    },
    Upstream {
        /// Returns its connection to the pool once it has ended cleanly.
        inner: ResponseBody,
        /// nginx `proxy_read_timeout`: the longest gap between frames.
        stall: Stall,
    },
    /// An HTTP/2 upstream's body, trailers included. `None` once it ended
    /// or was cut off (dropping it resets the upstream's stream).
    Stream {
        inner: Option<Incoming>,
        stall: Stall,
        /// Its place in its connection's stream count.
        _stream: Stream,
        /// A gRPC call's deadline (`grpc-timeout`), if it set one.
        deadline: Option<Pin<Box<Sleep>>>,
        /// A gRPC call: one the upstream does not end (its deadline
        /// passes, the upstream goes quiet or fails) ends with trailers
        /// that say why, as gRPC clients read it, rather than a reset.
        grpc: bool,
    },
    /// A `101`'s (empty) body: the request's end goes to the tunnel, which
    /// settles it (access log, metrics) when the tunnel closes.
    Tunnel {
        end_to: Option<tokio::sync::oneshot::Sender<RequestEnd>>,
    },
}

impl ProxyBody {
    pub fn full(data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        ProxyBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            end: None,
            lines: HeadLines::default(),
        }
    }

    pub fn empty() -> Self {
        ProxyBody {
            kind: Kind::Full { data: None },
            end: None,
            lines: HeadLines::default(),
        }
    }

    /// Streams an upstream body (one read whole with its head, the usual
    /// small one, is sent as it is).
    pub fn upstream(inner: ResponseBody, idle_timeout: Duration) -> Self {
        let kind = match inner {
            ResponseBody::Done(data) => Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            inner => Kind::Upstream {
                inner,
                stall: Stall::new(idle_timeout),
            },
        };
        ProxyBody {
            kind,
            end: None,
            lines: HeadLines::default(),
        }
    }

    /// Streams an HTTP/2 upstream's body: `stream` is held until it is
    /// done; a gRPC call (`grpc`) ends at `deadline` if it has one.
    pub fn stream(
        inner: Incoming,
        stream: Stream,
        idle_timeout: Duration,
        grpc: bool,
        deadline: Option<Instant>,
    ) -> Self {
        ProxyBody {
            kind: Kind::Stream {
                inner: Some(inner),
                stall: Stall::new(idle_timeout),
                _stream: stream,
                deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
                grpc,
            },
            end: None,
            lines: HeadLines::default(),
        }
    }

    /// The body of a `101 Switching Protocols`: the request's end is sent
    /// to `end_to`, the tunnel's, rather than settled with the body.
    pub fn tunnel(end_to: tokio::sync::oneshot::Sender<RequestEnd>) -> Self {
        ProxyBody {
            kind: Kind::Tunnel {
                end_to: Some(end_to),
            },
            end: None,
            lines: HeadLines::default(),
        }
    }

    /// The request's end, taken out (its answer is replaced by another).
    pub fn take_end(&mut self) -> Option<RequestEnd> {
        self.end.take()
    }

    pub fn set_end(&mut self, end: RequestEnd) {
        if let Kind::Tunnel { end_to } = &mut self.kind {
            if let Some(to) = end_to.take() {
                // A tunnel that is gone already drops it: settled now.
                let _ = to.send(end);
                return;
            }
        }
        self.end = Some(end);
    }

    /// The head fields that travel with the body ([`HeadLines`]).
    pub fn lines(&self) -> &HeadLines {
        &self.lines
    }

    pub fn lines_mut(&mut self) -> &mut HeadLines {
        &mut self.lines
    }

    pub fn take_lines(&mut self) -> HeadLines {
        std::mem::take(&mut self.lines)
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = ResponseBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = match &mut this.kind {
            Kind::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Kind::Tunnel { .. } => Poll::Ready(None),
            Kind::Upstream { inner, stall } => match Pin::new(&mut *inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    stall.progressed();
                    Poll::Ready(Some(Ok(frame)))
                }
                Poll::Ready(Some(Err(e))) => {
                    *inner = ResponseBody::Over;
                    Poll::Ready(Some(Err(ResponseBodyError::Upstream(e))))
                }
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending if stall.expired(cx) => {
                    // Dropping the body closes its connection.
                    *inner = ResponseBody::Over;
                    Poll::Ready(Some(Err(ResponseBodyError::IdleTimeout(stall.timeout))))
                }
                Poll::Pending => Poll::Pending,
            },
            Kind::Stream {
                inner,
                stall,
                deadline,
                grpc,
                ..
            } => poll_stream(cx, inner, stall, deadline, *grpc),
        };
        if let (Poll::Ready(Some(Ok(frame))), Some(end)) = (&polled, this.end.as_mut()) {
            if let Some(data) = frame.data_ref() {
                end.add_bytes(data.len() as u64);
                end.watch_data(data);
            } else if let Some(trailers) = frame.trailers_ref() {
                end.set_grpc_status(grpc::status_of(trailers));
                end.watch_trailers(trailers);
            }
        }
        if let (Poll::Ready(Some(Err(_))), Some(end)) = (&polled, this.end.as_mut()) {
            end.mark_aborted();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data } => data.is_none(),
            Kind::Tunnel { .. } => true,
            Kind::Upstream { inner, .. } => inner.is_end_stream(),
            Kind::Stream { inner, .. } => inner.as_ref().is_none_or(Body::is_end_stream),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Tunnel { .. } => SizeHint::with_exact(0),
            Kind::Upstream { inner, .. } => inner.size_hint(),
            Kind::Stream { inner, .. } => inner
                .as_ref()
                .map_or(SizeHint::with_exact(0), Body::size_hint),
        }
    }
}
