//! What the upstreams report at scrape time, for metrics and the admin
//! API.

use std::sync::Arc;

use super::HistogramSnapshot;

/// One upstream's figures, read at scrape time.
#[derive(Debug)]
pub struct UpstreamReport {
    pub name: Arc<str>,
    pub targets: Vec<TargetReport>,
    /// DNS lookups of its `resolve` targets that failed or came back
    /// empty (`None`: it resolves no name).
    pub resolve_failures: Option<u64>,
    /// Retries the retry budget refused (`None`: no budget).
    pub budget_refused: Option<u64>,
    /// Requests sent while every target failed its health checks
    /// (`None`: no checks).
    pub all_failing_checks: Option<u64>,
    /// Time to the response head.
    pub duration: HistogramSnapshot,
    /// HTTP/2 connections open and streams running on them (`None`: the
    /// upstream speaks HTTP/1.1 only).
    pub h2: Option<(usize, usize)>,
    /// Its concurrency limit and queue (`None`: neither is configured).
    pub protect: Option<ProtectReport>,
}

/// Why a request was shed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedReason {
    /// Over the concurrency limit, with no queue to wait in.
    Limit,
    /// The queue was full (or a higher class took its place).
    QueueFull,
    /// It waited its queue's timeout (or its gRPC deadline).
    Timeout,
}

impl std::fmt::Display for ShedReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl ShedReason {
    pub const ALL: [ShedReason; 3] = [
        ShedReason::Limit,
        ShedReason::QueueFull,
        ShedReason::Timeout,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ShedReason::Limit => "limit",
            ShedReason::QueueFull => "queue_full",
            ShedReason::Timeout => "timeout",
        }
    }
}

/// An upstream's concurrency limit and queue, read at scrape time.
#[derive(Debug, Clone, Default)]
pub struct ProtectReport {
    /// The limit now (`None`: no adaptive limit, the queue serves
    /// `max_conns` alone).
    pub limit: Option<u32>,
    /// Requests admitted whose answers have not ended.
    pub in_flight: u32,
    /// Requests waiting in the queue, and its size.
    pub queued: u32,
    pub queue_size: Option<u32>,
    /// The controller's measured unloaded latency (µs), and whether it is
    /// measuring it again now (the limit held at its minimum).
    pub min_rtt_us: Option<u64>,
    pub probing: bool,
    /// Requests that waited in the queue and were then admitted.
    pub dequeued: u64,
    /// Shed requests by class index and [`ShedReason`], and the classes'
    /// names (`priorities.classes`).
    pub shed: Vec<[u64; 3]>,
    pub classes: Vec<Arc<str>>,
    /// The limit once a second lately: (unix s, limit), oldest first.
    pub history: Vec<(u64, u32)>,
}

/// One target's state and figures.
#[derive(Debug, Clone)]
pub struct TargetReport {
    pub authority: Arc<str>,
    pub backup: bool,
    /// `down` in the config.
    pub down: bool,
    /// Drained by the admin API.
    pub draining: bool,
    /// Marked down by its failures until then (unix ms).
    pub down_until_unix_ms: Option<u64>,
    pub in_flight: u32,
    pub max_conns: u32,
    /// Answer heads received.
    pub ok: u64,
    /// By [`Failure`](Failure).
    pub failures: [u64; 10],
    /// Requests passed on to another target, by the same reasons; the
    /// last: sent again on a fresh connection.
    pub retries: [u64; 11],
    /// Times its failures marked it down.
    pub marked_down: u64,
    /// Failing its active health checks.
    pub check_failed: bool,
    /// Active health checks passed, failed.
    pub checks: [u64; 2],
    /// In its slow start: the share of its weight it has now, per mille.
    pub ramping: Option<u16>,
    /// When (unix ms) and why it last failed.
    pub last_failure: Option<(u64, Failure)>,
}

impl TargetReport {
    /// Whether it takes requests now.
    pub fn up(&self) -> bool {
        !self.down && !self.draining && !self.check_failed && self.down_until_unix_ms.is_none()
    }
}

/// Why an attempt failed, as nginx names its conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Error,
    Timeout,
    InvalidHeader,
    Http500,
    Http502,
    Http503,
    Http504,
    Http403,
    Http404,
    Http429,
}

impl Failure {
    pub const COUNT: usize = 10;
    pub const ALL: [Failure; Failure::COUNT] = [
        Failure::Error,
        Failure::Timeout,
        Failure::InvalidHeader,
        Failure::Http500,
        Failure::Http502,
        Failure::Http503,
        Failure::Http504,
        Failure::Http403,
        Failure::Http404,
        Failure::Http429,
    ];

    /// Its condition's name (nginx's, in `next_upstream.on`).
    pub fn name(self) -> &'static str {
        match self {
            Failure::Error => "error",
            Failure::Timeout => "timeout",
            Failure::InvalidHeader => "invalid_header",
            Failure::Http500 => "http_500",
            Failure::Http502 => "http_502",
            Failure::Http503 => "http_503",
            Failure::Http504 => "http_504",
            Failure::Http403 => "http_403",
            Failure::Http404 => "http_404",
            Failure::Http429 => "http_429",
        }
    }

    pub fn bit(self) -> u16 {
        1 << self as u16
    }

    /// The condition an answer's status meets, if any.
    pub fn of_status(status: u16) -> Option<Failure> {
        Some(match status {
            500 => Failure::Http500,
            502 => Failure::Http502,
            503 => Failure::Http503,
            504 => Failure::Http504,
            403 => Failure::Http403,
            404 => Failure::Http404,
            429 => Failure::Http429,
            _ => return None,
        })
    }

    /// Whether it counts towards the target's `max_fails` (nginx: every
    /// one but 403 and 404).
    pub fn marks(self) -> bool {
        !matches!(self, Failure::Http403 | Failure::Http404)
    }
}
