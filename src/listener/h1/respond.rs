//! Writing a response to an HTTP/1.x client the way hyper did (so clients
//! see what they saw before): the head encoded once, `Content-Length`
//! when known, else chunked (close-delimited for HTTP/1.0), no body for
//! HEAD, 204 and 304, `Connection` as the request and the server need, a
//! `Date` per second; the head and a small body in one write.

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::header;
use http::{Response, StatusCode};
use http_body::{Body, Frame};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::Duplex;
use crate::error::ProxyError;
use crate::http1::{chunk_size_line, poll_write_bufs, put_field};
use crate::pipeline::body::ProxyBody;
use crate::pipeline::response;

/// A response body piece at most this large is copied next to its head
/// (one write); a larger one is written from where it is.
const COPY_BODY: usize = 16 << 10;

/// What the response's framing depends on in its request.
pub(super) struct Facts {
    pub(super) head: bool,
    pub(super) http10: bool,
    pub(super) keep_alive: bool,
}

/// How a response body is delimited on the wire.
#[derive(Clone, Copy, PartialEq)]
enum Framing {
    /// Nothing follows the head.
    None,
    Length(u64),
    Chunked,
    /// HTTP/1.0 with no length: the close ends it.
    Close,
}

/// Writes `resp`: whether the connection may carry another request. The
/// head follows hyper's rules, so clients see what they saw before. The
/// response is borrowed, not moved into this future (a copy of a few
/// hundred bytes per request); its body is dropped once written.
pub(super) async fn respond<I>(
    io: &mut Duplex<'_, I>,
    out: &mut Vec<u8>,
    resp: &mut Response<ProxyBody>,
    facts: &Facts,
    mut keep: bool,
) -> io::Result<bool>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let status = resp.status();
    let body = resp.body();
    let no_length = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let bodiless = facts.head || no_length;
    // `None`: the body has ended already.
    let hint = (!body.is_end_stream()).then(|| body.size_hint().exact());
    out.clear();
    if facts.http10 {
        out.extend_from_slice(b"HTTP/1.0 ");
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
    }
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    out.extend_from_slice(b"\r\n");
    let (mut length, mut wrote_date, mut said_close, mut said_keep_alive) =
        (None, false, false, false);
    for (name, value) in resp.headers() {
        match *name {
            // The length is written below, in canonical digits, never
            // echoed: the body's own when it is known.
            header::CONTENT_LENGTH => {
                if length.is_none() && !no_length {
                    length = match hint {
                        Some(Some(n)) => Some(n),
                        Some(None) => parse_length(value.as_bytes()),
                        None if facts.head => parse_length(value.as_bytes()),
                        None => None,
                    };
                }
                continue;
            }
            // Framing is decided here.
            header::TRANSFER_ENCODING => continue,
            header::CONNECTION => {
                for t in value.as_bytes().split(|&b| b == b',') {
                    said_close |= t.trim_ascii().eq_ignore_ascii_case(b"close");
                    said_keep_alive |= t.trim_ascii().eq_ignore_ascii_case(b"keep-alive");
                }
            }
            header::DATE => wrote_date = true,
            _ => {}
        }
        put_field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    // The upstream's and the rate-limit fields, encoded already.
    let lines = resp.body().lines();
    out.extend_from_slice(&lines.lines);
    wrote_date |= lines.date;
    keep &= !said_close;
    let length_line = |out: &mut Vec<u8>, n: u64| {
        put_field(
            out,
            b"content-length",
            itoa::Buffer::new().format(n).as_bytes(),
        )
    };
    let framing = match (bodiless, hint, length) {
        (true, _, Some(n)) | (true, Some(Some(n)), None) if !no_length => {
            length_line(out, n);
            Framing::None
        }
        (true, ..) => Framing::None,
        (false, None, _) => {
            put_field(out, b"content-length", b"0");
            Framing::None
        }
        (false, Some(_), Some(n)) | (false, Some(Some(n)), None) => {
            length_line(out, n);
            Framing::Length(n)
        }
        (false, Some(None), None) if facts.http10 => {
            keep = false;
            Framing::Close
        }
        (false, Some(None), None) => {
            put_field(out, b"transfer-encoding", b"chunked");
            Framing::Chunked
        }
    };
    if facts.http10 {
        if keep && !said_keep_alive {
            put_field(out, b"connection", b"keep-alive");
        }
    } else if !keep && !said_close {
        put_field(out, b"connection", b"close");
    }
    if !wrote_date {
        put_field(out, b"date", &date());
    }
    out.extend_from_slice(b"\r\n");
    if framing == Framing::None {
        // A body that is not sent is not read either (HEAD, 204, 304).
        // Dropped first: the request ends (access log, in-flight count)
        // before the client has its answer, so a client's next request
        // is never logged before this one.
        end(resp);
        write_all(io, &mut [IoSlice::new(out)]).await?;
        io.flush().await?;
        return Ok(keep);
    }
    let mut left = match framing {
        Framing::Length(n) => n,
        _ => u64::MAX,
    };
    // `out` gathers the head and the body pieces that are ready at once;
    // it is written when the body makes us wait, or ends.
    let mut sent = false;
    loop {
        let frame = match next_frame(resp.body_mut(), io, out.is_empty()).await {
            Next::Frame(frame) => frame,
            Next::Waiting => {
                write_all(io, &mut [IoSlice::new(out)]).await?;
                io.flush().await?;
                out.clear();
                sent = true;
                continue;
            }
        };
        let data = match frame {
            None => break,
            // Failed before any byte of it left: the client gets a 502
            // problem answer in its place, not a connection closed
            // without a status line.
            Some(Err(e)) if !sent => {
                let failed = ProxyError::UpstreamBodyFailed(e.to_string());
                let mut problem = response::problem(&failed);
                if let Some(mut end) = resp.body_mut().take_end() {
                    end.set_status(failed.status());
                    problem.body_mut().set_end(end);
                }
                *resp = problem;
                return Box::pin(respond(io, out, resp, facts, keep)).await;
            }
            // Broken off: the client sees a cut response (no last chunk,
            // a short length), never one that looks whole.
            Some(Err(e)) => return Err(io::Error::other(e)),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if !data.is_empty() => data,
                // Trailers are not sent (as before).
                _ => continue,
            },
        };
        let data = if data.len() as u64 > left {
            data.slice(..left as usize)
        } else {
            data
        };
        left -= data.len() as u64;
        let mut size = [0u8; 20];
        let (prefix, suffix): (&[u8], &[u8]) = match framing {
            Framing::Chunked => (chunk_size_line(data.len(), &mut size), b"\r\n"),
            _ => (b"", b""),
        };
        out.extend_from_slice(prefix);
        if data.len() <= COPY_BODY {
            out.extend_from_slice(&data);
            out.extend_from_slice(suffix);
            if out.len() >= 4 * COPY_BODY {
                write_all(io, &mut [IoSlice::new(out)]).await?;
                io.flush().await?;
                out.clear();
                sent = true;
            }
        } else {
            let mut bufs = [IoSlice::new(out), IoSlice::new(&data), IoSlice::new(suffix)];
            write_all(io, &mut bufs).await?;
            io.flush().await?;
            out.clear();
            sent = true;
        }
        if left == 0 {
            break;
        }
    }
    // The request ends before its last bytes go out (see above).
    end(resp);
    match framing {
        Framing::Chunked => out.extend_from_slice(b"0\r\n\r\n"),
        Framing::Length(_) if left > 0 => keep = false,
        _ => {}
    }
    if !out.is_empty() {
        write_all(io, &mut [IoSlice::new(out)]).await?;
        io.flush().await?;
    }
    out.clear();
    Ok(keep && framing != Framing::Close)
}

/// Drops the response's body: the request ends (see `respond`).
fn end(resp: &mut Response<ProxyBody>) {
    drop(std::mem::replace(resp.body_mut(), ProxyBody::empty()));
}

enum Next {
    Frame(Option<Result<Frame<Bytes>, crate::pipeline::body::ResponseBodyError>>),
    /// Not ready, and bytes wait in `out`: write them first.
    Waiting,
}

/// The body's next frame; if it is not ready and there are bytes not yet
/// written (`may_wait` false), says so at once instead of waiting. The
/// request body is pumped meanwhile (the upstream may wait for it to
/// answer more).
async fn next_frame<I: AsyncRead + Unpin>(
    body: &mut ProxyBody,
    io: &mut Duplex<'_, I>,
    may_wait: bool,
) -> Next {
    poll_fn(|cx| loop {
        let pumped = io.poll_pump(cx);
        match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Ready(frame) => return Poll::Ready(Next::Frame(frame)),
            Poll::Pending if !may_wait => return Poll::Ready(Next::Waiting),
            Poll::Pending if pumped => continue,
            Poll::Pending => return Poll::Pending,
        }
    })
    .await
}

/// A length from the map, by the one rule both legs read lengths by.
fn parse_length(value: &[u8]) -> Option<u64> {
    crate::http1::add_content_length(None, value).ok()
}

/// Writes every byte of `bufs` (see [`poll_write_bufs`]).
async fn write_all<I: AsyncWrite + Unpin>(
    io: &mut I,
    mut bufs: &mut [IoSlice<'_>],
) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        let n = poll_fn(|cx| poll_write_bufs(Pin::new(&mut *io), cx, bufs)).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// The `Date` value, formatted once per second per thread.
fn date() -> [u8; 29] {
    use std::cell::Cell;
    thread_local! {
        static DATE: Cell<(u64, [u8; 29])> = const { Cell::new((0, [0; 29])) };
    }
    let secs = crate::clock::unix_ms() / 1000;
    DATE.with(|d| {
        let (at, value) = d.get();
        if at == secs {
            return value;
        }
        let mut value = [0; 29];
        let text = httpdate::fmt_http_date(std::time::UNIX_EPOCH + Duration::from_secs(secs));
        value.copy_from_slice(&text.as_bytes()[..29]);
        d.set((secs, value));
        value
    })
}
