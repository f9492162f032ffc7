//! Writing to a connection, the way both HTTP/1 roles do.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;

/// Writes what `io` takes of `bufs`: one slice by a plain write, which a
/// TCP stream sends with `send` (a shorter path in the kernel than
/// `writev`'s), more than one vectored. Both HTTP/1 writers use it: the
/// server's responses and the upstream client's requests.
pub fn poll_write_bufs<I: AsyncWrite + ?Sized>(
    io: Pin<&mut I>,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    match bufs {
        [one] => io.poll_write(cx, one),
        _ => io.poll_write_vectored(cx, bufs),
    }
}
