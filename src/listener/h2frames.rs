//! Counts an HTTP/2 connection's stream resets and GOAWAYs, each way, by
//! error code: hyper reports neither, and they are how an operator tells a
//! client that cancels (`CANCEL` from the client) from one that makes
//! tollgate reset its streams (`PROTOCOL_ERROR`, `STREAM_CLOSED` from
//! tollgate: the "MadeYouReset" pattern) or streams tollgate refused
//! (`REFUSED_STREAM`).
//!
//! The counter sits between the connection and hyper, on the bytes as
//! they pass (decrypted, for TLS), and walks the frame headers only: nine
//! bytes a frame, four or eight more of a `RST_STREAM` or `GOAWAY`; the
//! rest of every frame is skipped unread. A connection that does not open
//! with the HTTP/2 preface (HTTP/1.x handed to hyper) is not walked.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::metrics::{H2Side, ListenerStats};

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const RST_STREAM: u8 = 0x3;
const GOAWAY: u8 = 0x7;

/// A stream whose frames are counted (see the module).
pub struct Counted<I> {
    io: I,
    stats: Arc<ListenerStats>,
    /// The client's frames (after its preface) and tollgate's.
    from_client: Walker,
    to_client: Walker,
}

impl<I> Counted<I> {
    pub fn new(io: I, stats: Arc<ListenerStats>) -> Self {
        Counted {
            io,
            stats,
            from_client: Walker::new(H2Side::Client, true),
            to_client: Walker::new(H2Side::Tollgate, false),
        }
    }
}

/// One direction's frame walk.
struct Walker {
    side: H2Side,
    /// Bytes of the preface still to match (the client's side only).
    preface: usize,
    /// Not HTTP/2, or lost track: nothing more is walked.
    off: bool,
    /// Bytes of the current frame's payload still to skip.
    skip: usize,
    /// The frame header (and error-code bytes) gathered so far.
    head: [u8; 17],
    have: usize,
}

impl Walker {
    fn new(side: H2Side, preface: bool) -> Self {
        Walker {
            side,
            preface: if preface { PREFACE.len() } else { 0 },
            off: false,
            skip: 0,
            head: [0; 17],
            have: 0,
        }
    }

    /// Bytes of the frame header and payload needed before a frame of
    /// this kind is counted.
    fn wanted(kind: u8) -> usize {
        match kind {
            RST_STREAM => 9 + 4,
            GOAWAY => 9 + 8,
            _ => 9,
        }
    }

    fn walk(&mut self, mut bytes: &[u8], stats: &ListenerStats) {
        while !bytes.is_empty() && !self.off {
            if self.preface > 0 {
                let at = PREFACE.len() - self.preface;
                let n = self.preface.min(bytes.len());
                if bytes[..n] != PREFACE[at..at + n] {
                    self.off = true;
                    return;
                }
                self.preface -= n;
                bytes = &bytes[n..];
                continue;
            }
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let want = if self.have < 9 {
                9
            } else {
                Self::wanted(self.head[3])
            };
            let n = (want - self.have).min(bytes.len());
            self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < want {
                continue;
            }
            let len = usize::from(self.head[0]) << 16
                | usize::from(self.head[1]) << 8
                | usize::from(self.head[2]);
            let kind = self.head[3];
            let extra = Self::wanted(kind) - 9;
            if self.have == 9 && extra > 0 {
                if len < extra {
                    // A malformed frame: the peer ends the connection
                    // over it; skip what it says it holds.
                    self.skip = len;
                    self.have = 0;
                }
                // else: read its error code first.
                continue;
            }
            let at = self.have - 4;
            let code = u32::from_be_bytes([
                self.head[at],
                self.head[at + 1],
                self.head[at + 2],
                self.head[at + 3],
            ]);
            match kind {
                RST_STREAM => stats.h2_reset(self.side, code),
                GOAWAY => stats.h2_goaway(self.side, code),
                _ => {}
            }
            self.skip = len - extra;
            self.have = 0;
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Counted<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let Counted {
            io,
            stats,
            from_client,
            ..
        } = self.get_mut();
        super::poll_read_seen(io, cx, buf, |read| {
            if !from_client.off {
                from_client.walk(read, stats);
            }
        })
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Counted<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            this.wrote(&[IoSlice::new(buf)], n);
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            this.wrote(bufs, n);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<I> Counted<I> {
    /// `n` bytes of `bufs` went to the client.
    fn wrote(&mut self, bufs: &[IoSlice<'_>], mut n: usize) {
        // Only once the client's side proved this is HTTP/2.
        if self.from_client.off || self.from_client.preface > 0 {
            self.to_client.off |= self.from_client.off;
            return;
        }
        for b in bufs {
            if n == 0 || self.to_client.off {
                return;
            }
            let take = n.min(b.len());
            self.to_client.walk(&b[..take], &self.stats);
            n -= take;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, 0];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn resets_and_goaways_are_counted_by_side_and_code_across_any_split() {
        let mut wire = PREFACE.to_vec();
        wire.extend(frame(0x4, 0, &[0; 6])); // SETTINGS
        wire.extend(frame(0x1, 1, &[0x82; 40])); // HEADERS
        wire.extend(frame(RST_STREAM, 1, &8u32.to_be_bytes())); // CANCEL
        wire.extend(frame(0x0, 3, &[7; 300])); // DATA
        wire.extend(frame(RST_STREAM, 3, &8u32.to_be_bytes()));
        wire.extend(frame(GOAWAY, 0, &[0, 0, 0, 3, 0, 0, 0, 0xb])); // ENHANCE_YOUR_CALM
        for step in [1, 2, 5, 9, 13, wire.len()] {
            let stats = ListenerStats::default();
            let mut w = Walker::new(H2Side::Client, true);
            for piece in wire.chunks(step) {
                w.walk(piece, &stats);
            }
            assert!(!w.off, "step {step}");
            assert_eq!(stats.h2_resets(H2Side::Client, 8), 2, "step {step}");
            assert_eq!(stats.h2_goaways(H2Side::Client, 0xb), 1, "step {step}");
            assert_eq!(stats.h2_resets(H2Side::Tollgate, 8), 0);
        }
    }

    #[test]
    fn a_connection_without_the_preface_is_not_walked() {
        let stats = ListenerStats::default();
        let mut w = Walker::new(H2Side::Client, true);
        w.walk(b"GET / HTTP/1.1\r\n\r\n", &stats);
        assert!(w.off);
    }
}
