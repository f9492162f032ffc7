//! Compiled plans and costs: `identity.plans`, a limit's cost read from
//! the request, and a cost settled after the answer.

use std::sync::Arc;

/// `identity.plans`: the plans a limit may give numbers for.
#[derive(Debug, Clone)]
pub struct PlansConfig {
    /// The only plan names anything shows (metrics, logs): from config.
    pub names: Vec<Arc<str>>,
    /// A verified JWT claim naming the plan.
    pub claim: Option<String>,
    /// A header naming the plan, believed from trusted proxies only.
    pub header: Option<http::HeaderName>,
    /// The plan of a caller with none or an unknown one (`None`: the
    /// limits' own numbers).
    pub default: Option<u8>,
}

/// A cost read from the request.
#[derive(Debug, Clone)]
pub struct CostFrom {
    /// A header, from trusted proxies only.
    pub header: Option<http::HeaderName>,
    /// A verified JWT claim.
    pub claim: Option<String>,
    /// Larger values are cut to this.
    pub max: u64,
}

/// A cost settled after the answer.
#[derive(Debug, Clone)]
pub struct Settle {
    pub from: SettleFrom,
    pub on_failure: OnSettleFailure,
    /// Larger reported costs are cut to this.
    pub max: u64,
}

#[derive(Debug, Clone)]
pub enum SettleFrom {
    Header(http::HeaderName),
    Trailer(http::HeaderName),
    /// A server-sent event's JSON field (dotted path); the last one wins.
    Event(Vec<String>),
}

/// What settles a call the upstream failed or reported no cost for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnSettleFailure {
    /// The reservation stands.
    Keep,
    /// All of it is given back.
    Refund,
}

/// `header x-tokens-used`, `trailer x-tokens-used`, `event usage.total_tokens`.
impl std::fmt::Display for SettleFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SettleFrom::Header(h) => write!(f, "header {h}"),
            SettleFrom::Trailer(t) => write!(f, "trailer {t}"),
            SettleFrom::Event(path) => write!(f, "event {}", path.join(".")),
        }
    }
}
