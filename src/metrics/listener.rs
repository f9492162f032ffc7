//! Per listener: its connection counters (open, TLS handshakes, waits at
//! the cap, hand-overs to hyper, protocol errors), kept across reloads,
//! and the process-wide count of HTTP/2 peer noise.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

/// One listener's connection figures, read for the dashboard.
#[derive(Debug)]
pub struct ListenerReport {
    pub name: Arc<str>,
    /// Connections open now.
    pub open: i64,
    /// Connections accepted only after waiting for a slot.
    pub waited_at_cap: u64,
    /// TLS handshakes: full, resumed, failed or timed out.
    pub tls: [u64; 3],
    /// HTTP/1.x connections handed to hyper, by [`Handover::ALL`].
    pub handovers: [u64; Handover::ALL.len()],
    /// Protocol errors, by [`ProtocolError::ALL`].
    pub protocol_errors: [u64; ProtocolError::ALL.len()],
}

/// Per listener: connection counters, kept across reloads (the
/// connections outlive a config).
#[derive(Debug, Default)]
pub struct ListenerStats {
    pub(super) open: AtomicI64,
    /// TLS handshakes failed or timed out.
    pub(super) tls_failures: AtomicU64,
    /// TLS handshakes done: [full, resumed] (whether session resumption
    /// works for the clients).
    pub(super) tls_done: [AtomicU64; 2],
    /// Connections accepted only after waiting for a slot.
    pub(super) at_cap: AtomicU64,
    /// HTTP/1.x connections the fast path handed to hyper, by why
    /// (`Handover`): how much traffic takes the slower path.
    pub(super) handovers: [AtomicU64; Handover::ALL.len()],
    /// Requests refused and connections ended for breaking the protocol,
    /// by kind (`ProtocolError`): counted, logged at most once each.
    pub(super) protocol_errors: [AtomicU64; ProtocolError::ALL.len()],
    /// HTTP/2 `RST_STREAM` and `GOAWAY` frames, by side ([`H2Side`]) and
    /// error code ([`H2_CODES`], the last slot for any other).
    pub(super) h2_resets: [[AtomicU64; H2_CODES.len() + 1]; 2],
    pub(super) h2_goaways: [[AtomicU64; H2_CODES.len() + 1]; 2],
}

/// Who sent an HTTP/2 reset or GOAWAY.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum H2Side {
    Client,
    Tollgate,
}

impl H2Side {
    pub const ALL: [H2Side; 2] = [H2Side::Client, H2Side::Tollgate];

    pub fn label(self) -> &'static str {
        match self {
            H2Side::Client => "client",
            H2Side::Tollgate => "tollgate",
        }
    }
}

/// HTTP/2 error codes (RFC 9113 §7) as metric labels, by code.
pub const H2_CODES: [&str; 14] = [
    "no_error",
    "protocol_error",
    "internal_error",
    "flow_control_error",
    "settings_timeout",
    "stream_closed",
    "frame_size_error",
    "refused_stream",
    "cancel",
    "compression_error",
    "connect_error",
    "enhance_your_calm",
    "inadequate_security",
    "http_1_1_required",
];

/// The label of an error code's slot (`other` past the known ones).
pub fn h2_code_label(slot: usize) -> &'static str {
    H2_CODES.get(slot).copied().unwrap_or("other")
}

fn code_slot(code: u32) -> usize {
    (code as usize).min(H2_CODES.len())
}

/// Warnings the `h2` crate raised about a peer, ever: process-wide, since
/// the crate's log line names no connection (`logging` counts them).
pub(super) static H2_NOISE: AtomicU64 = AtomicU64::new(0);

/// An HTTP/2 peer made the `h2` crate warn (see `logging`).
pub fn h2_noise_seen() {
    H2_NOISE.fetch_add(1, Ordering::Relaxed);
}

/// A client's breach of the HTTP rules that tollgate answered or ended
/// the connection for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// An HTTP/1.x head past twice `max_header_size` (431).
    HeadTooLarge,
    /// An HTTP/1.x head with more than twice `max_headers` fields (431).
    TooManyHeaders,
    /// A `Transfer-Encoding` other than exactly `chunked` (501).
    TransferCoding,
    /// An HTTP/2 connection the peer broke (a bad preface, a frame out of
    /// place, a flood): ended with GOAWAY.
    Http2,
}

impl ProtocolError {
    pub const ALL: [ProtocolError; 4] = [
        ProtocolError::HeadTooLarge,
        ProtocolError::TooManyHeaders,
        ProtocolError::TransferCoding,
        ProtocolError::Http2,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ProtocolError::HeadTooLarge => "head_too_large",
            ProtocolError::TooManyHeaders => "too_many_headers",
            ProtocolError::TransferCoding => "transfer_coding",
            ProtocolError::Http2 => "http2",
        }
    }
}

/// Why an HTTP/1.x connection left tollgate's fast path for hyper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handover {
    /// `Transfer-Encoding` (chunked) framing.
    Chunked,
    /// `Expect: 100-continue`.
    Expect,
    /// `Upgrade` (WebSocket, h2c).
    Upgrade,
    /// A head hyper answers itself: malformed, or past the size or count
    /// limits (its 400 or 431).
    Head,
    /// HTTP/2 with prior knowledge (the preface).
    Http2,
}

impl Handover {
    pub const ALL: [Handover; 5] = [
        Handover::Chunked,
        Handover::Expect,
        Handover::Upgrade,
        Handover::Head,
        Handover::Http2,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Handover::Chunked => "chunked",
            Handover::Expect => "expect",
            Handover::Upgrade => "upgrade",
            Handover::Head => "head",
            Handover::Http2 => "http2",
        }
    }
}

impl ListenerStats {
    pub fn opened(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
    }

    pub fn closed(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Connections open now.
    pub fn open(&self) -> i64 {
        self.open.load(Ordering::Relaxed)
    }

    pub fn tls_failed(&self) {
        self.tls_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A TLS handshake done, full or resumed.
    pub fn tls_handshaked(&self, resumed: bool) {
        self.tls_done[resumed as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A connection that waited because `max_connections` were open.
    pub fn waited_at_cap(&self) {
        self.at_cap.fetch_add(1, Ordering::Relaxed);
    }

    /// The HTTP/1.x fast path handed a connection to hyper.
    pub fn handed_over(&self, why: Handover) {
        self.handovers[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A client broke the protocol (see [`ProtocolError`]).
    pub fn protocol_error(&self, kind: ProtocolError) {
        self.protocol_errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// An HTTP/2 stream reset went by, sent by `side` with `code`.
    pub fn h2_reset(&self, side: H2Side, code: u32) {
        self.h2_resets[side as usize][code_slot(code)].fetch_add(1, Ordering::Relaxed);
    }

    /// An HTTP/2 GOAWAY went by.
    pub fn h2_goaway(&self, side: H2Side, code: u32) {
        self.h2_goaways[side as usize][code_slot(code)].fetch_add(1, Ordering::Relaxed);
    }

    /// Resets sent by `side` with `code`, ever.
    pub fn h2_resets(&self, side: H2Side, code: u32) -> u64 {
        self.h2_resets[side as usize][code_slot(code)].load(Ordering::Relaxed)
    }

    /// GOAWAYs sent by `side` with `code`, ever.
    pub fn h2_goaways(&self, side: H2Side, code: u32) -> u64 {
        self.h2_goaways[side as usize][code_slot(code)].load(Ordering::Relaxed)
    }
}
