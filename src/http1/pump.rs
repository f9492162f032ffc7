//! A request body the HTTP/1.x fast path (`h1`) reads off the connection
//! while the pipeline runs. The connection's loop is the only reader of
//! the socket: it reads when the body has taken what it was given
//! (`Pump::wants`), hands the bytes over (`deliver`), and wakes the body.
//! So at most one read's worth of a body is held, whatever its size, and
//! a body nobody reads is never read off the socket (the loop discards
//! or closes after the response, as nginx does).

use std::error::Error as StdError;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// Shared by the loop (`Pump`) and the pipeline (`PumpedBody`). One task
/// touches it, so the lock is never contended.
#[derive(Default)]
struct Shared {
    /// Read off the socket, not yet taken by the body.
    data: Option<Bytes>,
    /// Body bytes still on the socket (Content-Length minus what was read).
    remaining: u64,
    /// The client closed the connection before the body ended.
    failed: bool,
    /// The body is gone: nothing more is delivered.
    dropped: bool,
    waker: Option<Waker>,
}

/// The loop's side.
#[derive(Clone)]
pub struct Pump(Arc<Mutex<Shared>>);

/// The pipeline's side: `ClientBody::Pumped`.
pub struct PumpedBody(Arc<Mutex<Shared>>);

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Pump {
    /// A body of `len` bytes of which `first` (possibly empty) came with
    /// its head.
    pub fn new(len: u64, first: Bytes) -> (Pump, PumpedBody) {
        let shared = Arc::new(Mutex::new(Shared {
            remaining: len - first.len() as u64,
            data: (!first.is_empty()).then_some(first),
            ..Shared::default()
        }));
        (Pump(shared.clone()), PumpedBody(shared))
    }

    /// Whether the body waits for bytes the loop should read.
    pub fn wants(&self) -> bool {
        let s = lock(&self.0);
        s.data.is_none() && s.remaining > 0 && !s.failed && !s.dropped
    }

    /// Body bytes still on the socket.
    pub fn remaining(&self) -> u64 {
        lock(&self.0).remaining
    }

    /// Hands `data` (at most `remaining` bytes) to the body.
    pub fn deliver(&self, data: Bytes) {
        let mut s = lock(&self.0);
        s.remaining -= data.len() as u64;
        s.data = Some(data);
        if let Some(w) = s.waker.take() {
            w.wake();
        }
    }

    /// The client closed the connection mid-body.
    pub fn fail(&self) {
        let mut s = lock(&self.0);
        s.failed = true;
        if let Some(w) = s.waker.take() {
            w.wake();
        }
    }
}

/// Why a pumped body stopped early.
#[derive(Debug)]
pub struct CutOff;

impl fmt::Display for CutOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the client closed the connection before its body ended")
    }
}

impl StdError for CutOff {}

impl fmt::Debug for PumpedBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PumpedBody")
    }
}

impl Body for PumpedBody {
    type Data = Bytes;
    type Error = CutOff;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, CutOff>>> {
        let mut s = lock(&self.0);
        if let Some(data) = s.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if s.remaining == 0 {
            return Poll::Ready(None);
        }
        if s.failed {
            return Poll::Ready(Some(Err(CutOff)));
        }
        match &s.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => s.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        let s = lock(&self.0);
        s.data.is_none() && s.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        let s = lock(&self.0);
        SizeHint::with_exact(s.remaining + s.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

impl Drop for PumpedBody {
    fn drop(&mut self) {
        let mut s = lock(&self.0);
        s.dropped = true;
        s.data = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn the_body_takes_what_came_with_its_head_then_what_is_pumped() {
        let (pump, mut body) = Pump::new(8, Bytes::from_static(b"abc"));
        assert!(!pump.wants(), "it has bytes to take first");
        assert_eq!(body.size_hint().exact(), Some(8));
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "abc");
        assert!(pump.wants());
        pump.deliver(Bytes::from_static(b"defgh"));
        let rest = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(rest, "defgh");
        assert!(body.frame().await.is_none());
        assert!(!pump.wants());
        assert_eq!(pump.remaining(), 0);
    }

    #[tokio::test]
    async fn a_client_gone_mid_body_is_an_error_and_a_dropped_body_wants_nothing() {
        let (pump, mut body) = Pump::new(4, Bytes::new());
        pump.fail();
        assert!(body.frame().await.unwrap().is_err());
        let (pump, body) = Pump::new(4, Bytes::new());
        drop(body);
        assert!(!pump.wants());
        assert_eq!(
            pump.remaining(),
            4,
            "left on the socket, for the loop to settle"
        );
    }
}
