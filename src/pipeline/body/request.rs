//! The client's body on its way upstream (`RequestBody`): cut off with an
//! error once it passes the route's size limit or goes quiet past its read
//! timeout, and why it stopped, as the client's error (`RequestBodyError`),
//! noted for a sender that loses it (`FailureNote`).

use std::error::Error as StdError;
use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::{ClientBody, ClientBodyError, Stall};
use crate::error::ProxyError;

/// Why the client's body stopped on its way upstream.
#[derive(Debug)]
pub enum RequestBodyError {
    TooLarge {
        limit: u64,
    },
    /// No bytes for this long.
    Timeout(Duration),
    Client(ClientBodyError),
}

impl fmt::Display for RequestBodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestBodyError::TooLarge { limit } => write!(f, "request body exceeds {limit} bytes"),
            RequestBodyError::Timeout(d) => {
                write!(f, "no request body bytes for {}ms", d.as_millis())
            }
            RequestBodyError::Client(e) => write!(f, "reading the client body failed: {e}"),
        }
    }
}

impl RequestBodyError {
    /// The failure as the client's error (what its answer says).
    pub fn as_client_error(&self) -> ProxyError {
        match self {
            RequestBodyError::TooLarge { limit } => ProxyError::BodyTooLarge { limit: *limit },
            RequestBodyError::Timeout(d) => ProxyError::BodyTimeout(d.as_secs().max(1)),
            // A body hyper could not parse is the client's fault (400); any
            // other failure is the client going away: it closed the
            // connection or reset its HTTP/2 stream (nginx's 499).
            RequestBodyError::Client(e) if malformed(&**e) => {
                ProxyError::BadRequest("the client's request body is malformed")
            }
            RequestBodyError::Client(_) => ProxyError::ClientClosed,
        }
    }
}

/// Whether a client body failed on its framing (hyper's decoder reports a
/// bad chunk as invalid data or input), not on the client going away.
fn malformed(e: &(dyn StdError + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput
            );
        }
        cause = e.source();
    }
    false
}

/// Why a body failed, kept for a sender that reports only its own
/// failure (hyper's HTTP/2 client resets the stream and says that).
#[derive(Debug, Default)]
pub struct FailureNote(std::sync::Mutex<Option<ProxyError>>);

impl FailureNote {
    /// The failure, if the body failed (taken).
    pub fn take(&self) -> Option<ProxyError> {
        self.0.lock().ok()?.take()
    }

    fn set(&self, e: &RequestBodyError) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(e.as_client_error());
        }
    }
}

impl StdError for RequestBodyError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            RequestBodyError::TooLarge { .. } | RequestBodyError::Timeout(_) => None,
            RequestBodyError::Client(e) => Some(&**e),
        }
    }
}

/// The client's body, streamed upstream with a byte cap and a read timeout.
#[derive(Debug)]
pub struct RequestBody {
    /// `None` for a request rebuilt for a retry (only bodiless ones are).
    inner: Option<ClientBody>,
    /// A body already read whole (a webhook whose signature was checked).
    buffered: Option<Bytes>,
    /// Bytes still allowed before the body is cut with `TooLarge`.
    remaining: u64,
    limit: u64,
    /// Longest silence between body bytes (nginx `client_body_timeout`).
    stall: Stall,
    /// Where its failure is noted, when the sender asked (`note_failure`).
    note: Option<std::sync::Arc<FailureNote>>,
}

impl RequestBody {
    /// From now on a failure of this body is also noted where the
    /// returned note can read it.
    pub fn note_failure(&mut self) -> std::sync::Arc<FailureNote> {
        self.note.get_or_insert_with(Default::default).clone()
    }

    pub fn new(inner: ClientBody, limit: u64, read_timeout: Duration) -> Self {
        RequestBody {
            inner: Some(inner),
            buffered: None,
            remaining: limit,
            limit,
            stall: Stall::new(read_timeout),
            note: None,
        }
    }

    pub fn empty() -> Self {
        RequestBody {
            inner: None,
            buffered: None,
            remaining: 0,
            limit: 0,
            stall: Stall::new(Duration::ZERO),
            note: None,
        }
    }

    pub fn buffered(data: Bytes) -> Self {
        let buffered = (!data.is_empty()).then_some(data);
        RequestBody {
            inner: None,
            buffered,
            remaining: 0,
            limit: 0,
            stall: Stall::new(Duration::ZERO),
            note: None,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = RequestBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = self.as_mut().poll_body(cx);
        if let (Poll::Ready(Some(Err(e))), Some(note)) = (&polled, &self.note) {
            note.set(e);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.buffered.is_none() && self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.buffered, &self.inner) {
            (Some(data), _) => SizeHint::with_exact(data.len() as u64),
            (None, Some(inner)) => inner.size_hint(),
            (None, None) => SizeHint::with_exact(0),
        }
    }
}

impl RequestBody {
    fn poll_body(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        let this = &mut *self;
        if let Some(data) = this.buffered.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        if polled.is_pending() {
            if this.stall.expired(cx) {
                this.inner = None;
                return Poll::Ready(Some(Err(RequestBodyError::Timeout(this.stall.timeout))));
            }
            return Poll::Pending;
        }
        this.stall.progressed();
        match ready!(polled) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let len = data.len() as u64;
                    if len > this.remaining {
                        this.inner = None;
                        return Poll::Ready(Some(Err(RequestBodyError::TooLarge {
                            limit: this.limit,
                        })));
                    }
                    this.remaining -= len;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => Poll::Ready(Some(Err(RequestBodyError::Client(e)))),
            None => Poll::Ready(None),
        }
    }
}
