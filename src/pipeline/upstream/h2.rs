//! HTTP/2 to the upstream (`protocol: h2`, or `auto` where ALPN picks it),
//! through hyper's client connection and the h2 crate.
//!
//! Each worker keeps its own connections per target (as the HTTP/1.1
//! pool does), each shared by up to `max_streams_per_connection`
//! requests at once: a request takes the first kept connection with room,
//! else opens one, and once the worker keeps `max_idle_per_target` of
//! them, joins the least busy (the h2 crate queues a stream the peer's
//! own limit has no room for). A connection with no stream for longer than
//! `idle_timeout`, or one the upstream closed (GOAWAY, a dead socket), is
//! dropped the next time the worker looks. Each connection's frames are
//! read and written by a task of its own on the worker's event loop: the
//! streams of many requests share it.
//!
//! Hop-by-hop fields are gone before a request gets here (`forward`);
//! HTTP/2 has no `Connection` and frames bodies itself, so the request
//! carries its fields in its header map, `Host` becomes `:authority`, and
//! trailers pass both ways.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use http::header::{HeaderName, HeaderValue, HOST, TE};
use http::uri::{Authority, PathAndQuery, Scheme, Uri};
use http::{Request, Response, Version};
use hyper::body::Incoming;
use hyper::client::conn::http2::{Builder, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use super::io::Io;
use super::pool::{shard, SHARDS};
use crate::pipeline::body::RequestBody;

/// Window sizes: hyper's defaults (5 MiB a connection, 2 MiB a stream)
/// let one slow reader park megabytes in tollgate; these bound what a
/// stream can have in flight to what one client read takes anyway.
const STREAM_WINDOW: u32 = 256 << 10;
const CONNECTION_WINDOW: u32 = 1 << 20;

/// The HTTP/2 connections to one target.
pub struct H2Pool {
    shards: Box<[Mutex<Vec<Shared>>]>,
    /// Held (per worker) while a connection is opened: requests that
    /// found no room wait for it and share it, rather than each opening
    /// one of its own at once.
    opening: Box<[tokio::sync::Mutex<()>]>,
    /// Connections kept per worker.
    max_conns: usize,
    /// Streams one connection carries before another is opened.
    max_streams: usize,
    idle_timeout: Duration,
}

/// One connection as the pool keeps it.
struct Shared {
    send: SendRequest<RequestBody>,
    /// Streams open on it (requests whose answer is not done).
    streams: Arc<AtomicUsize>,
    /// When it last had a stream opened, for the idle timeout.
    used: Instant,
}

/// A stream's place in its connection's count, given back when the
/// response body is dropped.
pub struct Stream(Arc<AtomicUsize>);

impl Drop for Stream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl H2Pool {
    pub fn new(max_conns: usize, max_streams: usize, idle_timeout: Duration) -> Self {
        H2Pool {
            shards: (0..SHARDS).map(|_| Mutex::new(Vec::new())).collect(),
            opening: (0..SHARDS).map(|_| tokio::sync::Mutex::new(())).collect(),
            max_conns: max_conns.max(1),
            max_streams,
            idle_timeout,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Shared>> {
        self.shards[shard()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// A kept connection with room for one more stream, if there is one
    /// (or the least busy, once the worker keeps all it may): its stream
    /// is counted from here.
    pub fn take(&self, now: Instant) -> Option<(SendRequest<RequestBody>, Stream)> {
        let mut conns = self.lock();
        let idle_timeout = self.idle_timeout;
        conns.retain(|c| {
            let idle = c.streams.load(Ordering::Relaxed) == 0
                && now.saturating_duration_since(c.used) > idle_timeout;
            !idle && !c.send.is_closed()
        });
        let load = |c: &Shared| c.streams.load(Ordering::Relaxed);
        let pick = match conns.iter().position(|c| load(c) < self.max_streams) {
            Some(i) => i,
            None if conns.len() < self.max_conns => return None,
            None => (0..conns.len()).min_by_key(|&i| load(&conns[i]))?,
        };
        let c = &mut conns[pick];
        c.used = now;
        Some((c.send.clone(), open(&c.streams)))
    }

    /// Waits for any connection this worker is opening: the caller opens
    /// the next one itself (holding the guard) if `take` still finds none.
    pub async fn opening(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.opening[shard()].lock().await
    }

    /// Keeps a new connection (if the worker has room) with its first
    /// stream counted.
    pub fn put(
        &self,
        send: SendRequest<RequestBody>,
        now: Instant,
    ) -> (SendRequest<RequestBody>, Stream) {
        let streams = Arc::new(AtomicUsize::new(0));
        let stream = open(&streams);
        let mut conns = self.lock();
        if conns.len() < self.max_conns {
            conns.push(Shared {
                send: send.clone(),
                streams,
                used: now,
            });
        }
        (send, stream)
    }

    /// Connections and open streams, for metrics and tests.
    pub fn counts(&self) -> (usize, usize) {
        self.shards.iter().fold((0, 0), |(c, s), shard| {
            let shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            let streams: usize = shard
                .iter()
                .map(|c| c.streams.load(Ordering::Relaxed))
                .sum();
            (c + shard.len(), s + streams)
        })
    }
}

fn open(streams: &Arc<AtomicUsize>) -> Stream {
    streams.fetch_add(1, Ordering::Relaxed);
    Stream(streams.clone())
}

/// Starts HTTP/2 on a connected socket: the handshake, then the
/// connection's own task on this worker's event loop.
pub async fn handshake(io: Io) -> Result<SendRequest<RequestBody>, String> {
    let (send, conn) = Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP/2 handshake failed: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "upstream HTTP/2 connection ended with an error");
        }
    });
    Ok(send)
}

/// Whether `io` agreed on HTTP/2 in its TLS handshake.
pub fn negotiated(io: &Io) -> bool {
    match io {
        Io::Tcp(_) => false,
        Io::Tls(s) => s.get_ref().1.alpn_protocol() == Some(b"h2"),
    }
}

/// The request for an HTTP/2 upstream: `head`'s method, path and fields
/// (a copy: the caller keeps its own, for its answer if this fails), the
/// fields tollgate adds, `:authority` from `Host` (else the target) and
/// `te: trailers` where the client asked for trailers (gRPC does).
pub fn request(
    head: &Request<()>,
    added: &[(HeaderName, HeaderValue)],
    tls: bool,
    target: &str,
    te_trailers: bool,
    body: RequestBody,
) -> Result<Request<RequestBody>, &'static str> {
    let mut req = Request::new(body);
    *req.method_mut() = head.method().clone();
    *req.version_mut() = Version::HTTP_2;
    let mut headers = head.headers().clone();
    for (name, value) in added {
        headers.append(name.clone(), value.clone());
    }
    let authority = match headers.remove(HOST) {
        Some(host) => Authority::try_from(host.as_bytes()),
        None => Authority::try_from(target),
    }
    .map_err(|_| "the request's Host is not a valid HTTP/2 authority")?;
    if te_trailers {
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }
    *req.headers_mut() = headers;
    let mut uri = http::uri::Parts::default();
    uri.scheme = Some(if tls { Scheme::HTTPS } else { Scheme::HTTP });
    uri.authority = Some(authority);
    uri.path_and_query = Some(
        head.uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/")),
    );
    *req.uri_mut() =
        Uri::from_parts(uri).map_err(|_| "the request's target is not valid in HTTP/2")?;
    Ok(req)
}

/// Why a request sent on a shared connection failed.
pub enum SendFailure {
    /// Nothing of it reached the upstream: here it is, to send again.
    Unsent(Box<Request<RequestBody>>, hyper::Error),
    Failed(hyper::Error),
    Timeout,
}

/// Sends `req` on the connection `send` and waits up to `until` for the
/// response head.
pub async fn send(
    mut send: SendRequest<RequestBody>,
    req: Request<RequestBody>,
    until: tokio::time::Instant,
) -> Result<Response<Incoming>, SendFailure> {
    let exchange = async move {
        if let Err(e) = send.ready().await {
            return Err(SendFailure::Unsent(Box::new(req), e));
        }
        send.try_send_request(req)
            .await
            .map_err(|mut e| match e.take_message() {
                Some(req) => SendFailure::Unsent(Box::new(req), e.into_error()),
                None => SendFailure::Failed(e.into_error()),
            })
    };
    tokio::time::timeout_at(until, exchange)
        .await
        .unwrap_or(Err(SendFailure::Timeout))
}
