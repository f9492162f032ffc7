//! HTTP/1.x served by tollgate itself, for the requests API traffic is
//! made of: a head with no body or a `Content-Length` one. The head is
//! parsed here (`httparse`, header values kept as slices of the read
//! buffer), the request runs through the pipeline, and the answer goes out
//! with its head and body in one write; the next request is read into a
//! 4 KiB buffer, which a connection waiting for its next request does not
//! hold (nginx frees its header buffer between requests too). It exists
//! because hyper's server cost more CPU per request and kept larger
//! buffers per connection (docs/benchmarks.md, "Why tollgate has its own
//! HTTP/1.x server").
//!
//! A body that came with its head is handed over whole; the rest of it is
//! read off the connection as the pipeline takes it (`pump`), also while
//! the answer streams (an upstream may answer as the body arrives). What
//! nobody reads is discarded after the answer when small, or closes the
//! connection (lingering) when large, by `pipeline::discard`'s rules.
//!
//! Everything else leaves the fast path, with the bytes already read put
//! back in front (`Rewind`), to hyper for the rest of the connection:
//! chunked bodies, `Expect`, upgrades, a head hyper would refuse
//! (malformed, too large, too many headers: hyper answers those as it
//! always has), HTTP/2's prior-knowledge preface. So every framing rule
//! hyper enforces still holds, and this file only has to be right about
//! the cases it keeps.
//!
//! The connection watchdog (`conn::watch`) times it as it does hyper's:
//! idle connections, slow heads, clients that stop reading, and graceful
//! shutdown (the response in flight says `Connection: close`).

mod head;
mod respond;

use std::future::{poll_fn, Future};
use std::io::{self, IoSlice};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;

use bytes::BytesMut;
use http::{Method, Version};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

pub use self::head::read_request;
use self::head::request;
use self::respond::{respond, Facts};
use super::conn;
use super::linger::Linger;
use super::rewind::Rewind;
use super::ListenerCtx;
use crate::error::ProxyError;
pub use crate::http1::head::{framing, HeadLimits};
use crate::http1::head::{parse, Head, Parsed, Refusal};
use crate::http1::pump::Pump;
use crate::metrics::{Handover, ProtocolError};
use crate::pipeline::conn::ConnInfo;
use crate::pipeline::conn::ConnState;
use crate::pipeline::{discard, response};

/// A connection's read buffer: taken for a read, and given back while the
/// connection waits for its next request (nginx's
/// `client_header_buffer_size` is 1 KiB).
const FIRST_READ: usize = 4096;

/// The largest read for a request body (its buffer is handed to the body
/// whole, so it is sized to what is left of the body, up to this).
const BODY_READ: u64 = 64 << 10;

/// Serves HTTP/1.x on `io` until it ends, or hands it to hyper.
pub(super) async fn serve<I>(
    io: I,
    ctx: &ListenerCtx,
    info: Arc<ConnInfo>,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let state = info.state.clone();
    let ended = {
        let served = run(io, ctx, &info);
        let served = pin!(served);
        let close = |_: Pin<&mut _>| state.close_gracefully();
        conn::watch(served, close, ctx, &state, info.peer, &mut shutdown, false).await
    };
    if let Some(Some(rest)) = ended {
        // Boxed: a connection that stays on the fast path carries no room
        // for hyper's.
        Box::pin(conn::serve(rest, ctx, info, shutdown)).await;
    }
}

/// The fast path's loop: `Some` hands the connection to hyper.
async fn run<I>(io: I, ctx: &ListenerCtx, info: &ConnInfo) -> Option<Rewind<I>>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let state = &info.state;
    // Reads through it mark the connection as receiving (the watchdog's
    // slow-head check); a close after an early answer lingers.
    let mut io = Linger::new(io, state.clone(), ctx.lingering_time, ctx.lingering_timeout);
    let mut buf = BytesMut::new();
    // How much a head's read asks for: FIRST_READ, doubled while reads
    // fill it (nginx's large_client_header_buffers, hyper's adaptive read).
    let mut read_size = FIRST_READ;
    let mut out = Vec::new();
    // Each request's head is parsed into this one.
    let mut head = Head::default();
    loop {
        loop {
            if !buf.is_empty() {
                match parse(&buf, ctx.head_limits, &mut head) {
                    Parsed::Head => break,
                    Parsed::Partial => {}
                    Parsed::Hyper(why) => {
                        if why == Handover::Http2 {
                            state.mark_h2();
                        }
                        state.handed_over(why);
                        return Some(Rewind::new(io.into_inner(), buf.freeze()));
                    }
                    Parsed::Refuse(why) => {
                        refuse(&mut io, &mut out, why, ctx, info).await;
                        return None;
                    }
                }
            }
            let mut room = 0;
            let n = poll_fn(|cx| {
                if state.closing() {
                    return Poll::Ready(Ok(0));
                }
                if buf.capacity() - buf.len() < read_size / 2 {
                    buf.reserve(read_size);
                }
                room = buf.capacity() - buf.len();
                let read = pin!(io.read_buf(&mut buf)).poll(cx);
                if read.is_pending() && buf.is_empty() {
                    // Waiting for the next request: a keep-alive
                    // connection holds no buffer meanwhile (nginx frees
                    // its too); the next read takes one again.
                    buf = BytesMut::new();
                }
                read
            })
            .await;
            match n {
                // A read that filled its room: the client sends more at
                // once (bodies with their heads); read more at a time.
                Ok(n) if n == room => read_size = (read_size * 2).min(BODY_READ as usize),
                Ok(1..) => {}
                _ => {
                    let _ = io.shutdown().await;
                    return None;
                }
            }
        }
        let keep_alive = head.keep_alive;
        let Some((mut req, body, pump)) = request(&mut head, &mut buf) else {
            state.handed_over(Handover::Head);
            return Some(Rewind::new(io.into_inner(), buf.freeze()));
        };
        let facts = Facts {
            head: req.method() == Method::HEAD,
            http10: req.version() == Version::HTTP_10,
            keep_alive,
        };
        // Each request runs on the config current when it arrives.
        let pipeline = ctx.live.load_full();
        // The connection while this request is served: writes to it, and
        // reads of the request body as it is taken (both ways at once: an
        // upstream may stream its answer while the body still arrives).
        let mut body = Some(body);
        let mut duplex = Duplex {
            io: &mut io,
            buf: &mut buf,
            pump: pump.as_ref(),
        };
        let mut resp = {
            // Boxed: between requests a connection holds no room for it.
            // Built in its box: `Box::pin(future)` builds the whole future
            // (the size of its largest state, kilobytes) on the stack, then
            // copies it.
            let mut handled = Box::into_pin(Box::write(
                Box::new_uninit(),
                pipeline.handle_parts(&mut req, &mut body, info),
            ));
            poll_fn(|cx| loop {
                if let Poll::Ready(resp) = handled.as_mut().poll(cx) {
                    return Poll::Ready(Some(resp));
                }
                if duplex.pump.is_some_and(|p| p.remaining() > 0) {
                    if duplex.poll_pump(cx) {
                        continue;
                    }
                    return Poll::Pending;
                }
                // A client that hangs up cancels its request, as with
                // hyper (which stops looking once it has the next
                // request's bytes: so does this).
                if duplex.buf.is_empty() {
                    if duplex.buf.capacity() < 512 {
                        duplex.buf.reserve(FIRST_READ);
                    }
                    let read = pin!(duplex.io.read_buf(duplex.buf)).poll(cx);
                    if let Poll::Ready(Ok(0) | Err(_)) = read {
                        return Poll::Ready(None);
                    }
                }
                return Poll::Pending;
            })
            .await
        };
        // Whatever of the request the pipeline left goes before the answer.
        drop((req, body));
        let answer = resp.as_deref_mut()?;
        // What is left of a body nobody read: a little is read and thrown
        // away after the answer, keeping the connection (nginx does too);
        // more closes it, lingering so that the client reads the answer
        // (`pipeline::discard::drains`, the rule for hyper's bodies too).
        let unread = pump.as_ref().map_or(0, Pump::remaining);
        // While the server drains, each answer closes its connection.
        let mut again = facts.keep_alive && !state.closing() && !ctx.drain.draining();
        if unread > 0 && !discard::drains(Some(unread), false) {
            again = false;
            state.linger_on_close();
        }
        let written = respond(&mut duplex, &mut out, answer, &facts, again).await;
        match written {
            Ok(true) if !state.closing() => {}
            _ => {
                // Its body is gone already unless writing failed: the
                // request ends before the connection does.
                drop(resp.take());
                let _ = io.shutdown().await;
                return None;
            }
        }
        if unread > 0 && !discard(&mut io, &mut buf, unread, state, ctx).await {
            state.linger_on_close();
            let _ = io.shutdown().await;
            return None;
        }
        // A buffer grown for a large head or body goes back before the
        // next read (one waiting for a request holds none at all).
        if buf.is_empty() && buf.capacity() > FIRST_READ {
            buf = BytesMut::new();
        }
        if out.capacity() > 2 * FIRST_READ {
            out = Vec::new();
        }
    }
}

/// Answers a head the fast path refuses (see [`Refusal`]) with its
/// problem body, then closes the connection, lingering: whatever the
/// client sent after the head cannot be framed.
async fn refuse<I>(
    io: &mut Linger<I>,
    out: &mut Vec<u8>,
    why: Refusal,
    ctx: &ListenerCtx,
    info: &ConnInfo,
) where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let (max_bytes, max_headers) = ctx.header_limits;
    let (err, kind) = match why {
        Refusal::TooLarge(size) => (
            ProxyError::HeadersTooLarge {
                size,
                limit: max_bytes,
            },
            ProtocolError::HeadTooLarge,
        ),
        Refusal::TooMany(count) => (
            ProxyError::TooManyHeaders {
                count,
                limit: max_headers,
            },
            ProtocolError::TooManyHeaders,
        ),
        Refusal::Coding => (ProxyError::UnsupportedCoding, ProtocolError::TransferCoding),
    };
    tracing::debug!(peer = %info.peer, error = %err, "request head refused");
    info.state.protocol_error(kind);
    info.state.linger_on_close();
    let mut resp = response::problem(&err);
    let mut buf = BytesMut::new();
    let mut duplex = Duplex {
        io,
        buf: &mut buf,
        pump: None,
    };
    let facts = Facts {
        head: false,
        http10: false,
        keep_alive: false,
    };
    let _ = respond(&mut duplex, out, &mut resp, &facts, false).await;
    let _ = io.shutdown().await;
}

/// The connection while a request with a pumped body is served: writing
/// to it (and waiting on the response body) also reads the request body
/// whenever it has taken what it was given.
pub(super) struct Duplex<'a, I> {
    io: &'a mut Linger<I>,
    buf: &'a mut BytesMut,
    pump: Option<&'a Pump>,
}

impl<I: AsyncRead + Unpin> Duplex<'_, I> {
    /// Reads body bytes for the pump while it wants them: whether it
    /// handed the body any (so whoever reads the body may go on).
    pub(super) fn poll_pump(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        let Some(pump) = self.pump else {
            return false;
        };
        if !pump.wants() {
            return false;
        }
        if self.buf.is_empty() {
            self.buf.reserve(pump.remaining().min(BODY_READ) as usize);
            match pin!(self.io.read_buf(self.buf)).poll(cx) {
                Poll::Ready(Ok(0) | Err(_)) => {
                    pump.fail();
                    return true;
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => return false,
            }
        }
        let n = (self.buf.len() as u64).min(pump.remaining()) as usize;
        pump.deliver(self.buf.split_to(n).freeze());
        true
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Duplex<'_, I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_pump(cx);
        Pin::new(&mut *self.io).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_pump(cx);
        Pin::new(&mut *self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<io::Result<()>> {
        self.poll_pump(cx);
        Pin::new(&mut *self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.io).poll_shutdown(cx)
    }
}

/// Reads the `left` bytes of an unread body off the connection and throws
/// them away, each read within `lingering_timeout` and all of them within
/// `lingering_time`: whether they all came. What follows them stays in
/// `buf` (the next request).
async fn discard<I: AsyncRead + Unpin>(
    io: &mut I,
    buf: &mut BytesMut,
    mut left: u64,
    state: &Arc<ConnState>,
    ctx: &ListenerCtx,
) -> bool {
    // Busy, not idle, and no late request head, while this runs.
    let _discarding = state.discarding();
    let each = ctx.lingering_timeout;
    let total = ctx.lingering_time.max(each);
    let drained = tokio::time::timeout(total, async {
        loop {
            let n = (buf.len() as u64).min(left) as usize;
            let _ = buf.split_to(n);
            left -= n as u64;
            if left == 0 {
                return true;
            }
            buf.reserve(FIRST_READ);
            match tokio::time::timeout(each, io.read_buf(buf)).await {
                Ok(Ok(1..)) => {}
                _ => return false,
            }
        }
    })
    .await;
    matches!(drained, Ok(true))
}
