//! One attempt at one target: over HTTP/2 where the target speaks it
//! (`h2_attempt`), else HTTP/1.1 on a pooled keep-alive connection or a
//! new one. A pooled connection the upstream closed under us is the one
//! case sent again to the same target, on a fresh connection: when none
//! of the request reached the upstream, or the request is idempotent and
//! its body can be sent again (the race with an upstream closing an idle
//! connection). What the attempt came to ([`Tried`]) is the send loop's
//! to act on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use http::header::{HeaderName, HeaderValue, HOST};
use http::Request;

use super::h1::{self, SendError};
use super::h2_attempt::H2Sent;
use super::retry::Failure;
use super::target::{TargetState, STALE};
use super::{held, is_idempotent, Answer, Call, Upstream};
use crate::error::ProxyError;
use crate::pipeline::body::RequestBody;
use crate::pipeline::conn::ConnState;
use crate::traces::Attempt;

/// What one attempt came to.
pub(super) enum Tried {
    Answer(Answer),
    /// The target failed: why, whether any of the request may have
    /// reached it, and what to answer if no other target takes it.
    Failed {
        failure: Failure,
        sent: bool,
        error: ProxyError,
    },
    /// The client's own doing (its body too large, cut off, too slow):
    /// answered as it is, never retried.
    Client(ProxyError),
}

/// Where and how one attempt is sent.
pub(super) struct Send<'a> {
    pub target: &'a TargetState,
    pub host_set: bool,
    pub added: &'a [(HeaderName, HeaderValue)],
    pub call: Call,
    pub sending: Instant,
    pub held: Option<&'a Arc<ConnState>>,
    /// The body can be sent again (none, or kept whole).
    pub replayable: bool,
    /// The body kept whole, to send again on a fresh connection.
    pub kept: Option<&'a bytes::Bytes>,
    /// The body's length when known (0 for none), written as
    /// `Content-Length`; unknown: chunked.
    pub length: Option<u64>,
    pub chunked: bool,
}

impl Upstream {
    pub(super) async fn attempt(
        &self,
        to: Send<'_>,
        head: &mut Request<()>,
        body: &mut Option<RequestBody>,
    ) -> Tried {
        let target = to.target;
        if self.speaks_h2(target) {
            let sent = self.send_h2(target, head, body, (to.added, to.call), to.sending, to.held);
            match sent.await {
                H2Sent::Done(Ok(answer)) => return Tried::Answer(answer),
                H2Sent::Done(Err(e @ ProxyError::UpstreamTimeout { .. })) => {
                    return Tried::Failed {
                        failure: Failure::Timeout,
                        sent: true,
                        error: e,
                    }
                }
                H2Sent::Done(Err(e @ ProxyError::UpstreamFailed { .. })) => {
                    return Tried::Failed {
                        failure: Failure::Error,
                        sent: true,
                        error: e,
                    }
                }
                H2Sent::Done(Err(e)) => return Tried::Client(e),
                H2Sent::Down((failure, e)) => return self.unreachable(target, failure, e),
                // `auto`: the target chose HTTP/1.1, and its connection
                // waits in the pool below.
                H2Sent::Http1 => {}
            }
        }
        let length = to.length;
        let chunked = to.chunked;
        let mut pooled_first = true;
        loop {
            let idle = if pooled_first {
                target.pool.take(to.sending)
            } else {
                None
            };
            let reused = idle.is_some();
            let conn = match idle {
                Some(c) => c,
                None => match target
                    .connect(self.connect_timeout, self.tls.as_ref())
                    .await
                {
                    Ok(c) => c,
                    Err((failure, e)) => return self.unreachable(target, failure, e),
                },
            };
            if !to.host_set {
                head.headers_mut().insert(HOST, target.host_value.clone());
            }
            let encoded = if to.call.trailers {
                // (RFC 9110 §10.1.4: `TE` is named in `Connection`)
                let mut asked = to.added.to_vec();
                asked.push((http::header::TE, HeaderValue::from_static("trailers")));
                asked.push((http::header::CONNECTION, HeaderValue::from_static("te")));
                crate::http1::encode_head(head, &asked, length, chunked)
            } else {
                crate::http1::encode_head(head, to.added, length, chunked)
            };
            let exchange = h1::exchange(
                conn,
                encoded,
                body.take(),
                chunked,
                head.method().clone(),
                (target.pool.clone(), to.sending),
                to.call.head_timeout(self.timeout),
            );
            return match held::run(exchange, to.held.map(|c| c.hold_upstream_slot())).await {
                Ok(answer) => Tried::Answer(answer),
                Err(SendError::Timeout) => Tried::Failed {
                    failure: Failure::Timeout,
                    sent: true,
                    error: self.timeout_error(to.call),
                },
                Err(SendError::Body(e)) => Tried::Client(e.as_client_error()),
                // A pooled connection the upstream closed under us: send
                // again on a fresh one if nothing reached the upstream, or
                // if the request is idempotent and its body can be sent
                // again.
                Err(SendError::Io {
                    error,
                    wrote,
                    received,
                    unsent,
                }) if reused
                    && !received
                    && (!wrote || (to.replayable && is_idempotent(head.method()))) =>
                {
                    tracing::debug!(upstream = %self.name, target = %target.authority, error = %error, "pooled connection closed under us; retrying on a fresh one");
                    target.stats.retries[STALE].fetch_add(1, Ordering::Relaxed);
                    *body = unsent.or_else(|| to.kept.map(|k| RequestBody::buffered(k.clone())));
                    pooled_first = false;
                    continue;
                }
                Err(e) => {
                    let error = ProxyError::UpstreamFailed {
                        upstream: self.name.to_string(),
                        reason: e.to_string(),
                    };
                    let (failure, sent) = match e {
                        SendError::Io { wrote, unsent, .. } => {
                            // What was not written can go elsewhere.
                            if unsent.is_some() {
                                *body = unsent;
                            }
                            (Failure::Error, wrote)
                        }
                        // (an answer that is not HTTP is not passed on)
                        _ => (Failure::InvalidHeader, true),
                    };
                    Tried::Failed {
                        failure,
                        sent,
                        error,
                    }
                }
            };
        }
    }

    /// `target` could not be reached (connect or handshake failed):
    /// nothing was sent.
    fn unreachable(&self, target: &TargetState, failure: Failure, e: String) -> Tried {
        Tried::Failed {
            failure,
            sent: false,
            error: ProxyError::UpstreamUnreachable {
                upstream: self.name.to_string(),
                reason: format!("{}: {e}", target.authority),
            },
        }
    }

    pub(super) fn timeout_error(&self, call: Call) -> ProxyError {
        ProxyError::UpstreamTimeout {
            upstream: self.name.to_string(),
            seconds: call.head_timeout(self.timeout).as_secs_f64(),
        }
    }
}

/// The target a request went to, and, when it is traced, every attempt.
#[derive(Default)]
pub struct Chosen {
    pub target: Option<Arc<str>>,
    /// `None`: not traced (nothing is recorded).
    pub attempts: Option<smallvec::SmallVec<[Attempt; 1]>>,
}

impl Chosen {
    pub(super) fn attempted(&mut self, start_ns: Option<u64>, target: &Arc<str>, tried: &Tried) {
        let (Some(attempts), Some(start_ns)) = (self.attempts.as_mut(), start_ns) else {
            return;
        };
        let (status, failure) = match tried {
            Tried::Answer(a) => (Some(a.status()), None),
            Tried::Failed { failure, .. } => (None, Some(failure.name())),
            Tried::Client(_) => (None, Some("client")),
        };
        attempts.push(Attempt {
            target: target.clone(),
            start_ns,
            end_ns: crate::clock::unix_ns(),
            status,
            failure,
            retried: false,
        });
    }

    /// The last attempt failed by `reason` and the request goes on.
    pub(super) fn retried(&mut self, reason: &'static str) {
        if let Some(last) = self.attempts.as_mut().and_then(|a| a.last_mut()) {
            last.retried = true;
            last.failure = Some(reason);
        }
    }
}
