//! The request on its way to the upstream: the head, then the body as the
//! client sends it (chunked when its length is unknown), written while the
//! answer is read.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http_body::Body;
use tokio::io::AsyncWrite;

use super::{Io, SendError};
use crate::http1::{chunk_size_line, poll_write_bufs};
use crate::pipeline::body::RequestBody;

/// The request on its way out: the head, then the body (chunked when its
/// length is unknown).
pub(super) struct Writer {
    /// The head, until it is written (apart from `out`: a bodiless
    /// request then allocates no queue).
    pub(super) head: Bytes,
    /// Body pieces (with their chunk framing) waiting to be written.
    pub(super) out: VecDeque<Bytes>,
    pub(super) body: Option<RequestBody>,
    pub(super) chunked: bool,
    pub(super) wrote: bool,
}

impl Writer {
    /// The write failed: the body goes back if none of it was sent.
    pub(super) fn failed(&mut self, error: io::Error) -> SendError {
        SendError::Io {
            error,
            wrote: self.wrote,
            received: false,
            unsent: if self.wrote { None } else { self.body.take() },
        }
    }

    /// Writes what it can: `Ready(Ok)` once the whole request is out.
    pub(super) fn poll(
        &mut self,
        io: &mut Io,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), SendError>> {
        if !self.wrote && self.body.is_some() && self.out.is_empty() {
            // The head waits for the body's first piece: they go out in
            // one write, and a body that fails at once (a malformed chunk)
            // sends the upstream nothing at all.
            ready!(self.pull(cx))?;
        }
        loop {
            while !self.head.is_empty() || !self.out.is_empty() {
                let mut slices = [IoSlice::new(&[]); 4];
                let n = std::iter::once(&self.head)
                    .filter(|h| !h.is_empty())
                    .chain(self.out.iter())
                    .zip(slices.iter_mut())
                    .map(|(b, s)| *s = IoSlice::new(b))
                    .count();
                let written = match ready!(poll_write_bufs(Pin::new(&mut *io), cx, &slices[..n])) {
                    Ok(0) => Err(io::ErrorKind::WriteZero.into()),
                    other => other,
                };
                let mut written = match written {
                    Ok(n) => n,
                    Err(error) => return Poll::Ready(Err(self.failed(error))),
                };
                self.wrote = true;
                let take = written.min(self.head.len());
                self.head.advance(take);
                written -= take;
                while written > 0 {
                    let Some(front) = self.out.front_mut() else {
                        break;
                    };
                    let take = written.min(front.len());
                    front.advance(take);
                    written -= take;
                    if front.is_empty() {
                        self.out.pop_front();
                    }
                }
            }
            if self.body.is_none() {
                return Pin::new(&mut *io)
                    .poll_flush(cx)
                    .map_err(|error| self.failed(error));
            }
            ready!(self.pull(cx))?;
        }
    }

    /// Moves the next piece of the body (framed) to `out`.
    fn pull(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        match ready!(Pin::new(body).poll_frame(cx)) {
            Some(Ok(frame)) => {
                // Trailers are not forwarded.
                if let Ok(data) = frame.into_data() {
                    if data.is_empty() {
                        return Poll::Ready(Ok(()));
                    }
                    if self.chunked {
                        let mut size = [0; 20];
                        let line = chunk_size_line(data.len(), &mut size);
                        self.out.push_back(Bytes::copy_from_slice(line));
                        self.out.push_back(data);
                        self.out.push_back(Bytes::from_static(b"\r\n"));
                    } else {
                        self.out.push_back(data);
                    }
                }
            }
            Some(Err(e)) => {
                self.body = None;
                return Poll::Ready(Err(SendError::Body(e)));
            }
            None => {
                self.body = None;
                if self.chunked {
                    self.out.push_back(Bytes::from_static(b"0\r\n\r\n"));
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}
