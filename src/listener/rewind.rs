//! A stream with bytes already read from it put back in front: what the
//! HTTP/1.1 server hands to hyper when a connection leaves its fast path
//! (see `h1`), so hyper reads the request from its first byte.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub struct Rewind<I> {
    /// What was read and not yet consumed: returned before `io` is read.
    pre: Bytes,
    io: I,
}

impl<I> Rewind<I> {
    pub fn new(io: I, pre: Bytes) -> Self {
        Rewind { pre, io }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Rewind<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pre.is_empty() {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let n = this.pre.len().min(buf.remaining());
        buf.put_slice(&this.pre[..n]);
        this.pre.advance(n);
        Poll::Ready(Ok(()))
    }
}

/// The `AsyncWrite` methods of a wrapper that writes straight through to
/// its field `io` (all but `poll_shutdown`, which a wrapper may change).
macro_rules! write_through {
    () => {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
        }

        fn poll_write_vectored(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
        }

        fn is_write_vectored(&self) -> bool {
            self.io.is_write_vectored()
        }

        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
        }
    };
}
pub(crate) use write_through;

impl<I: AsyncWrite + Unpin> AsyncWrite for Rewind<I> {
    write_through!();

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
