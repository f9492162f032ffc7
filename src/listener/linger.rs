//! Lingering close, as nginx does it: when tollgate answers before it has
//! read the request body (a 413 on an upload, a 429 on a large POST) and so
//! must close the connection, closing at once while the client is still
//! writing makes the kernel answer its next segment with a reset, and the
//! client never reads the answer. Instead the write side is shut (FIN, after
//! the answer), and what the client still sends is read and discarded until
//! it closes too, or `lingering_timeout` passes with nothing, or
//! `lingering_time` in all, or [`MAX_BYTES`] were discarded.
//!
//! Only connections marked by the pipeline (`ConnState::linger_on_close`)
//! linger; every other close is immediate.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::pipeline::conn::ConnState;

/// The most a lingering close reads before it gives up.
pub const MAX_BYTES: u64 = 32 << 20;

pub struct Linger<I> {
    io: I,
    state: Arc<ConnState>,
    time: Duration,
    timeout: Duration,
    phase: Phase,
}

enum Phase {
    Open,
    Draining {
        /// `lingering_time` from the shutdown.
        total: Pin<Box<Sleep>>,
        /// `lingering_timeout` from the last bytes read.
        idle: Pin<Box<Sleep>>,
        read: u64,
    },
    Closed,
}

impl<I> Linger<I> {
    pub fn new(io: I, state: Arc<ConnState>, time: Duration, timeout: Duration) -> Self {
        Linger {
            io,
            state,
            time,
            timeout,
            phase: Phase::Open,
        }
    }
}

impl<I> Linger<I> {
    /// The stream, for a server that takes the connection over.
    pub fn into_inner(self) -> I {
        self.io
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Linger<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        super::poll_read_seen(&mut this.io, cx, buf, |read| {
            if !read.is_empty() {
                this.state.bytes_read();
            }
        })
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Linger<I> {
    super::rewind::write_through!();

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match &mut this.phase {
                Phase::Open => {
                    ready!(Pin::new(&mut this.io).poll_shutdown(cx))?;
                    if !this.state.lingers() || this.time.is_zero() {
                        this.phase = Phase::Closed;
                        return Poll::Ready(Ok(()));
                    }
                    this.phase = Phase::Draining {
                        total: Box::pin(tokio::time::sleep(this.time)),
                        idle: Box::pin(tokio::time::sleep(this.timeout)),
                        read: 0,
                    };
                }
                Phase::Draining { total, idle, read } => {
                    let mut scratch = [0u8; 4096];
                    loop {
                        let mut buf = ReadBuf::new(&mut scratch);
                        match Pin::new(&mut this.io).poll_read(cx, &mut buf) {
                            // The client closed (or broke) its side: done.
                            Poll::Ready(Ok(())) if buf.filled().is_empty() => break,
                            Poll::Ready(Err(_)) => break,
                            Poll::Ready(Ok(())) => {
                                *read += buf.filled().len() as u64;
                                if *read > MAX_BYTES {
                                    break;
                                }
                                let next = tokio::time::Instant::now() + this.timeout;
                                idle.as_mut().reset(next);
                            }
                            Poll::Pending => {
                                if total.as_mut().poll(cx).is_ready()
                                    || idle.as_mut().poll(cx).is_ready()
                                {
                                    break;
                                }
                                return Poll::Pending;
                            }
                        }
                    }
                    this.phase = Phase::Closed;
                    return Poll::Ready(Ok(()));
                }
                Phase::Closed => return Poll::Ready(Ok(())),
            }
        }
    }
}
