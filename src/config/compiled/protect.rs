//! The runtime configuration of backend protection: priority classes, an
//! upstream's adaptive concurrency limit and its queue.

use std::sync::Arc;
use std::time::Duration;

/// Priority classes, highest first (index 0). Without a `priorities`
/// section every request is of one class, `default`, which may be shed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Priorities {
    pub names: Vec<Arc<str>>,
    /// The class of a request nothing else names.
    pub default: u8,
    /// Bit `i`: class `i` is never shed.
    pub never_shed: u16,
    /// The class of each plan (by index into `identity.plans.names`).
    pub plans: Vec<Option<u8>>,
    /// A header naming the class, read from trusted proxies only.
    pub header: Option<http::HeaderName>,
}

/// At most this many classes: a class is a label value of some metrics.
pub const MAX_CLASSES: usize = 8;

impl Default for Priorities {
    fn default() -> Self {
        Priorities {
            names: vec![Arc::from("default")],
            default: 0,
            never_shed: 0,
            plans: Vec::new(),
            header: None,
        }
    }
}

impl Priorities {
    /// The class named `name`, if any.
    pub fn find(&self, name: &[u8]) -> Option<u8> {
        self.names
            .iter()
            .position(|n| n.as_bytes().eq_ignore_ascii_case(name))
            .map(|i| i as u8)
    }

    pub fn never_shed(&self, class: u8) -> bool {
        self.never_shed & (1 << class) != 0
    }
}

/// An adaptive concurrency limit (a gradient controller): the limit
/// follows the ratio of the backend's measured unloaded latency to its
/// latency now.
#[derive(Debug, Clone, PartialEq)]
pub struct Concurrency {
    pub min: u32,
    pub max: u32,
    /// How far latency may rise over the unloaded one before the limit
    /// falls: 0.5 allows half as much again.
    pub tolerance: f64,
    /// How often the limit is recomputed.
    pub interval: Duration,
    /// How often the unloaded latency is measured again (the limit held
    /// at `min` while it is).
    pub probe_every: Duration,
    /// Answers measured for it.
    pub probe_requests: u32,
}

/// Where requests over the limit (or every target's `max_conns`) wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    pub size: usize,
    pub timeout: Duration,
}
