//! One attempt at a target over HTTP/2 (`protocol: h2`, or `auto` where
//! the target chose it): on a kept connection with room, else a new one;
//! what it comes to ([`H2Sent`]) is the send loop's to act on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use http::header::{HeaderName, HeaderValue};
use http::Request;

use super::h2::{self, SendFailure};
use super::retry::Failure;
use super::target::{TargetState, ALPN_H1, ALPN_H2, STALE};
use super::{held, Answer, Call, Upstream};
use crate::config::UpstreamProtocol;
use crate::error::ProxyError;
use crate::pipeline::body::{RequestBody, RequestBodyError};
use crate::pipeline::conn::ConnState;

/// How an HTTP/2 attempt at one target ended.
pub(super) enum H2Sent {
    Done(Result<Answer, ProxyError>),
    /// It could not be reached: why.
    Down((Failure, String)),
    /// `auto`: it speaks HTTP/1.1.
    Http1,
}

impl Upstream {
    /// Sends the request over HTTP/2: on a kept connection with room, else
    /// on a new one. A request the kept connection never sent (it was
    /// closing) goes once more on a new connection; nothing that may have
    /// reached the upstream is sent twice.
    pub(super) async fn send_h2(
        &self,
        target: &TargetState,
        head: &Request<()>,
        body: &mut Option<RequestBody>,
        (added, call): (&[(HeaderName, HeaderValue)], Call),
        sending: Instant,
        held: Option<&Arc<ConnState>>,
    ) -> H2Sent {
        let Some(pool) = target.h2.as_ref() else {
            return H2Sent::Http1;
        };
        let until = tokio::time::Instant::now() + call.head_timeout(self.timeout);
        let mut taken = pool.take(sending);
        let mut retried = false;
        let mut unsent = None;
        let mut body_failed = None;
        loop {
            let mut opening = None;
            if taken.is_none() {
                // One connection opened at a time per worker: the requests
                // that queued behind it share it.
                let guard = pool.opening().await;
                if !retried {
                    taken = pool.take(sending);
                }
                if taken.is_none() {
                    opening = Some(guard);
                }
            }
            let new = taken.is_none();
            let (conn, stream) = match taken.take() {
                Some(kept) => kept,
                None => match target
                    .connect(self.connect_timeout, self.tls.as_ref())
                    .await
                {
                    Err(e) => return H2Sent::Down(e),
                    Ok(c) if self.protocol == UpstreamProtocol::Auto && !h2::negotiated(&c.io) => {
                        target.alpn.store(ALPN_H1, Ordering::Relaxed);
                        target.pool.put(c, sending);
                        return H2Sent::Http1;
                    }
                    Ok(c) => {
                        target.alpn.store(ALPN_H2, Ordering::Relaxed);
                        let handshake =
                            tokio::time::timeout(self.connect_timeout, h2::handshake(c.io));
                        match handshake.await {
                            Ok(Ok(send)) => {
                                let kept = pool.put(send, sending);
                                drop(opening);
                                kept
                            }
                            Ok(Err(e)) => return H2Sent::Down((Failure::Error, e)),
                            Err(_) => {
                                return H2Sent::Down((
                                    Failure::Timeout,
                                    "HTTP/2 handshake timed out".into(),
                                ))
                            }
                        }
                    }
                },
            };
            let req = match unsent.take() {
                Some(req) => req,
                None => {
                    let mut body = body.take().unwrap_or_else(RequestBody::empty);
                    // hyper's HTTP/2 client answers a body that failed
                    // with the stream's reset only: the note keeps why.
                    if !http_body::Body::is_end_stream(&body) {
                        body_failed = Some(body.note_failure());
                    }
                    let built = h2::request(
                        head,
                        added,
                        self.tls.is_some(),
                        &target.authority,
                        call.trailers,
                        body,
                    );
                    match built {
                        Ok(req) => req,
                        Err(e) => return H2Sent::Done(Err(ProxyError::BadRequest(e))),
                    }
                }
            };
            let sent = h2::send(conn, req, until);
            let failure = match held::run(sent, held.map(|c| c.hold_upstream_slot())).await {
                Ok(response) => {
                    return H2Sent::Done(Ok(Answer::H2(response, stream)));
                }
                Err(SendFailure::Unsent(req, e)) if !new && !retried => {
                    tracing::debug!(upstream = %self.name, target = %target.authority, error = %e, "HTTP/2 connection closing; sending on a fresh one");
                    target.stats.retries[STALE].fetch_add(1, Ordering::Relaxed);
                    unsent = Some(*req);
                    retried = true;
                    continue;
                }
                Err(SendFailure::Timeout) => return H2Sent::Done(Err(self.timeout_error(call))),
                Err(SendFailure::Unsent(_, e) | SendFailure::Failed(e)) => e,
            };
            let cause = std::error::Error::source(&failure);
            if let Some(e) = cause.and_then(|c| c.downcast_ref::<RequestBodyError>()) {
                return H2Sent::Done(Err(e.as_client_error()));
            }
            if let Some(e) = body_failed.as_ref().and_then(|n| n.take()) {
                return H2Sent::Done(Err(e));
            }
            return H2Sent::Done(Err(ProxyError::UpstreamFailed {
                upstream: self.name.to_string(),
                reason: format!("HTTP/2: {failure}"),
            }));
        }
    }
}
