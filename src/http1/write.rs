//! Writing to a connection, the way both HTTP/1 roles do.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BufMut;
use tokio::io::AsyncWrite;

/// Appends the field line `name: value` and its CRLF.
pub fn put_field(out: &mut impl BufMut, name: &[u8], value: &[u8]) {
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

/// A chunk's size line (`1a2f\r\n`, lower-case hex, no extensions),
/// written into `buf`: both roles send chunked bodies with it.
pub fn chunk_size_line(n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let digits = (usize::BITS - n.leading_zeros()).div_ceil(4).max(1) as usize;
    for (i, slot) in buf[..digits].iter_mut().enumerate() {
        let nibble = (n >> (4 * (digits - 1 - i))) & 0xf;
        *slot = b"0123456789abcdef"[nibble];
    }
    buf[digits..digits + 2].copy_from_slice(b"\r\n");
    &buf[..digits + 2]
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes_are_lower_case_hex() {
        let mut b = [0; 20];
        assert_eq!(chunk_size_line(0, &mut b), b"0\r\n");
        assert_eq!(chunk_size_line(5, &mut b), b"5\r\n");
        assert_eq!(chunk_size_line(255, &mut b), b"ff\r\n");
        assert_eq!(chunk_size_line(4096, &mut b), b"1000\r\n");
        assert_eq!(chunk_size_line(usize::MAX, &mut b), b"ffffffffffffffff\r\n");
    }

    #[test]
    fn a_field_is_one_line() {
        let mut out = Vec::new();
        put_field(&mut out, b"content-length", b"12");
        assert_eq!(out, b"content-length: 12\r\n");
    }
}
