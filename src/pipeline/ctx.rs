//! What one request carries from stage to stage (pingora's `CTX` idea):
//! each stage reads what the earlier ones found and adds its own, instead
//! of out-parameters threaded through every call. Also the two ways a stage
//! ends a request early ([`Stop`]): a rate-limit rejection, which is a
//! value the response stage renders, and an error, which goes through the
//! one error -> status table.

use std::sync::Arc;

use http::StatusCode;
use smallvec::SmallVec;

use super::bypass::Bypass;
use super::client_ip::Resolved;
use super::decide::{Batch, Origin};
use super::identity::Identity;
use super::record::RequestEnd;
use crate::config::RouteConfig;
use crate::error::ProxyError;
use crate::limiter::Decision;
use crate::metrics::Outcome;

pub struct Ctx<'p> {
    /// The real client, resolved from trusted proxies only.
    pub client: Resolved,
    /// The matched route; `None` for a 404/405 (which still meets every zone).
    pub route: Option<&'p RouteConfig>,
    /// Why the request skips every limit, if it does.
    pub bypass: Option<Bypass>,
    /// The verified user, once the identity stage has run.
    pub identity: Identity,
    /// The caller's plan (index into `identity.plans.names`), if any.
    pub plan: Option<u8>,
    /// The caller's billing day (1-31), for quotas anchored on it.
    pub billing_day: Option<u8>,
    /// Calendar quotas this request was admitted by: (limit, key, used,
    /// quota), for the alerts.
    pub quotas: Vec<(super::decide::Origin, String, u64, u64)>,
    /// A ban this request's refusal started: (limit, key as shown, ban,
    /// seconds), for the alerts.
    pub banned: Option<(Arc<str>, String, u32, u64)>,
    /// A verified token's claims, kept only when a limit reads a cost
    /// from one.
    pub claims: Option<Box<serde_json::Map<String, serde_json::Value>>>,
    /// Costs reserved now and settled after the answer.
    pub reserved: Vec<super::settle::Reserved>,
    /// Zone checks counted but not yet decided: they go to the store with
    /// the route limits, so most requests cost one store call.
    pub pending: Batch,
    /// Route-limit decisions, for the response's rate-limit headers. Two
    /// inline: a route's usual limits allocate nothing.
    pub applied: SmallVec<[Applied; 2]>,
    /// Route limits (index, key) charged once the response status is known
    /// (`count: { status: [...] }`).
    pub deferred: Vec<(usize, String)>,
    /// Every decision made, counted in metrics when the request ends (the
    /// identity, and so the user type, is known by then). The first eight
    /// inline: the common request allocates nothing for them, and a new
    /// context writes none of their room.
    pub counted: SmallVec<[(Origin, Outcome); 8]>,
    /// How long zone delays held the request.
    pub delayed_ms: u64,
    /// The keys a limit rejected (enforced or dry run), for the top
    /// offenders; empty unless something was rejected. One inline: an
    /// enforced rejection ends the request, and a flood is made of those.
    pub rejected_keys: SmallVec<[(Origin, Outcome, String); 1]>,
    /// The access record and the held `max_conn` slots, settled when the
    /// response body ends.
    pub end: RequestEnd,
    /// Its priority class, and whether it is never shed (`protect`),
    /// where an upstream's gate asked.
    pub class: (u8, bool),
}

impl<'p> Ctx<'p> {
    pub fn new(client: Resolved, end: RequestEnd) -> Self {
        Ctx {
            client,
            route: None,
            bypass: None,
            identity: Identity::Anonymous,
            plan: None,
            billing_day: None,
            banned: None,
            quotas: Vec::new(),
            claims: None,
            reserved: Vec::new(),
            pending: Batch::default(),
            applied: SmallVec::new(),
            deferred: Vec::new(),
            counted: SmallVec::new(),
            delayed_ms: 0,
            rejected_keys: SmallVec::new(),
            end,
            class: (0, false),
        }
    }
}

/// One decided route limit, for the headers.
#[derive(Debug, Clone)]
pub struct Applied {
    pub name: Arc<str>,
    pub decision: Decision,
}

/// A limit refused the request. Rendered by `response::rejected` as a
/// problem body with `Retry-After` (and the route's rate-limit headers
/// when a route limit refused).
#[derive(Debug)]
pub struct Rejection {
    pub limit: Arc<str>,
    /// What was exceeded, for the problem body's `detail`.
    pub cause: Cause,
    /// Whole seconds, at least 1.
    pub retry_after: u64,
    /// 429, or a zone's configured status (503 to mimic nginx).
    pub status: StatusCode,
    /// A route limit refused: the response carries the route's headers.
    pub route_limit: bool,
}

/// What a rejection's limit allows; the `detail` is rendered from it only
/// when the response needs it (`Rejection::detail`).
#[derive(Debug, Clone, PartialEq)]
pub enum Cause {
    /// A rate, as the limit describes itself ("5 requests per 60s").
    Rate(Arc<str>),
    /// `max_conn`: at most this many requests at once.
    Concurrency(u32),
    /// The key serves a ban of its penalty box (its n-th).
    Penalty(u32),
}

impl Rejection {
    /// "rate limit 'login' exceeded: 5 requests per 60s; retry in 42s"
    pub fn detail(&self) -> String {
        let (name, retry) = (&self.limit, self.retry_after);
        match &self.cause {
            Cause::Rate(what) => {
                format!("rate limit '{name}' exceeded: {what}; retry in {retry}s")
            }
            Cause::Concurrency(max) => format!(
                "concurrency limit '{name}' exceeded: at most {max} requests at once; retry in {retry}s"
            ),
            Cause::Penalty(level) => format!(
                "abnormal usage: refused by limit '{name}' too often, this key is banned (ban {level}); retry in {retry}s"
            ),
        }
    }
}

/// Why a request did not go on to the next stage.
#[derive(Debug)]
pub enum Stop {
    Limited(Box<Rejection>),
    Failed(ProxyError),
}

impl From<ProxyError> for Stop {
    fn from(e: ProxyError) -> Self {
        Stop::Failed(e)
    }
}

impl From<Rejection> for Stop {
    fn from(r: Rejection) -> Self {
        Stop::Limited(Box::new(r))
    }
}
