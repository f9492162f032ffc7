//! The seam between the listener and the pipeline: what the listener
//! knows about a connection (`ConnInfo`) and the state a connection's
//! requests share with its watchdog (`ConnState`: in-flight requests,
//! activity, responses being sent, a graceful close asked for). The
//! listener makes them; the pipeline reads and updates them; neither names
//! the other's internals.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use super::client_ip::ClientIp;
use crate::metrics::ListenerStats;

/// What the listener knows about a connection.
pub struct ConnInfo {
    pub listener: Arc<str>,
    pub peer: SocketAddr,
    /// The peer (the TCP peer, or a trusted PROXY header's source), as a
    /// client address rendered once per connection.
    pub client: ClientIp,
    /// Whether tollgate terminated TLS on this connection (`X-Forwarded-Proto`).
    pub tls: bool,
    pub state: Arc<ConnState>,
}

/// Shared between a connection's requests and its idle watchdog.
pub struct ConnState {
    /// Requests whose response body has not finished yet.
    in_flight: AtomicUsize,
    /// Request starts and finishes, ever: the watchdog sees idleness as
    /// this not moving (no clock read per request).
    pub(crate) activity: AtomicU64,
    /// HTTP/2: no request-head timer between requests.
    h2: AtomicBool,
    /// Bytes arrived since the last request started: with nothing in
    /// flight on HTTP/1.1, the next request head is on its way.
    reading: AtomicBool,
    /// Close it lingering (see `linger`): an answer went out before the
    /// request body was read.
    linger: AtomicBool,
    /// Responses handed to the client whose body has not ended.
    pub(crate) responding: AtomicUsize,
    /// Response frames the client has taken, ever: the send watchdog sees
    /// a stall as this not moving (no clock read per frame).
    pub(crate) frames_sent: AtomicU64,
    /// Asked to close once what is in flight is done (shutdown, idle):
    /// how tollgate's own HTTP/1.1 server hears it (`h1`).
    closing: AtomicBool,
    /// Requests of this connection sent upstream whose answer head has
    /// not arrived, counted until it does (or the upstream's timeout
    /// passes) even when the client reset the stream: the work the
    /// connection has put on backends (see [`UpstreamSlot`]).
    upstream_held: AtomicUsize,
    /// Its listener's connection counters.
    stats: Arc<ListenerStats>,
}

impl ConnState {
    /// A new connection on listener `listener` (counted open until the
    /// last reference to it is dropped).
    pub fn new(stats: Arc<ListenerStats>) -> Self {
        stats.opened();
        ConnState {
            in_flight: AtomicUsize::new(0),
            activity: AtomicU64::new(0),
            h2: AtomicBool::new(false),
            reading: AtomicBool::new(false),
            linger: AtomicBool::new(false),
            responding: AtomicUsize::new(0),
            frames_sent: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            upstream_held: AtomicUsize::new(0),
            stats,
        }
    }

    /// Counts one request going upstream until the slot is dropped.
    pub fn hold_upstream_slot(self: &Arc<Self>) -> UpstreamSlot {
        self.upstream_held.fetch_add(1, Ordering::Relaxed);
        UpstreamSlot(self.clone())
    }

    /// Requests of this connection the upstream is still working on
    /// (see `upstream_held`).
    pub fn upstream_held(&self) -> usize {
        self.upstream_held.load(Ordering::Relaxed)
    }

    /// Its listener's connection counters.
    pub fn stats(&self) -> &ListenerStats {
        &self.stats
    }

    pub fn request_started(&self, h2: bool) {
        if h2 {
            self.h2.store(true, Ordering::Relaxed);
        }
        self.reading.store(false, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.activity.fetch_add(1, Ordering::Relaxed);
    }

    pub fn request_finished(&self) {
        // Its body's bytes are no next request head.
        self.reading.store(false, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.activity.fetch_add(1, Ordering::Relaxed);
    }

    /// A request body is being read and thrown away after its response
    /// (`pipeline::discard`): until the guard drops, the watchdog counts
    /// the connection busy, so the body's bytes are not taken for a late
    /// next request head, nor the wait for them for idleness. The discard
    /// has bounds of its own (`lingering_timeout`, `lingering_time`).
    pub fn discarding(self: &Arc<Self>) -> Discarding {
        // Counted like a request of its own: started now, finished when
        // the guard drops.
        self.request_started(false);
        Discarding(self.clone())
    }

    /// Bytes came in from the client.
    pub fn bytes_read(&self) {
        self.reading.store(true, Ordering::Relaxed);
    }

    /// Asks for a lingering close: the client may still be sending a body
    /// nobody will read.
    pub fn linger_on_close(&self) {
        self.linger.store(true, Ordering::Relaxed);
    }

    pub fn lingers(&self) -> bool {
        self.linger.load(Ordering::Relaxed)
    }

    pub fn response_started(&self) {
        self.responding.fetch_add(1, Ordering::Relaxed);
    }

    pub fn response_finished(&self) {
        self.responding.fetch_sub(1, Ordering::Relaxed);
    }

    /// Asks the connection to close after the response in flight (at
    /// once if there is none).
    pub fn close_gracefully(&self) {
        self.closing.store(true, Ordering::Relaxed);
    }

    pub fn closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }

    /// The HTTP/1.x fast path handed this connection to hyper.
    pub fn handed_over(&self, why: crate::metrics::Handover) {
        self.stats.handed_over(why);
    }

    /// The client broke the protocol: counted on its listener.
    pub fn protocol_error(&self, kind: crate::metrics::ProtocolError) {
        self.stats.protocol_error(kind);
    }

    /// A response frame went to the client.
    pub fn frame_sent(&self) {
        self.frames_sent.fetch_add(1, Ordering::Relaxed);
    }

    /// The connection speaks HTTP/2 (ALPN `h2`, or the prior-knowledge
    /// preface): no request-head timer, and errors are HTTP/2's.
    pub fn mark_h2(&self) {
        self.h2.store(true, Ordering::Relaxed);
    }

    /// Whether the connection speaks HTTP/2.
    pub(crate) fn is_h2(&self) -> bool {
        self.h2.load(Ordering::Relaxed)
    }

    /// Whether a request head has arrived on this connection yet.
    pub(crate) fn started(&self) -> bool {
        self.activity.load(Ordering::Relaxed) > 0
    }

    /// Whether a request is in flight.
    pub(crate) fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) > 0
    }

    /// HTTP/1.1 with nothing in flight and bytes in: a request head that
    /// has not completed yet.
    pub(crate) fn head_pending(&self) -> bool {
        self.started()
            && !self.h2.load(Ordering::Relaxed)
            && self.reading.load(Ordering::Relaxed)
            && !self.busy()
    }
}

/// One request of an HTTP/2 connection on its way to the upstream, from
/// its send until the upstream's answer head (or its timeout): a client
/// that resets its streams (or makes tollgate reset them, the
/// "MadeYouReset" pattern) frees its stream slots at once, while the
/// backend goes on working on what it was sent; these slots are what
/// bounds that work to the connection's stream limit.
pub struct UpstreamSlot(Arc<ConnState>);

impl Drop for UpstreamSlot {
    fn drop(&mut self) {
        self.0.upstream_held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// See [`ConnState::discarding`].
pub struct Discarding(Arc<ConnState>);

impl Drop for Discarding {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

impl Drop for ConnState {
    fn drop(&mut self) {
        self.stats.closed();
    }
}
