//! An upstream exchange that outlives its client. A request from an
//! HTTP/2 connection holds one of the connection's upstream slots
//! (`conn::UpstreamSlot`) from its send until the upstream's answer head
//! arrives or its timeout passes. When the client's stream goes away
//! first (the client reset it, or made tollgate reset it), the exchange is
//! not dropped with it: most backends go on working on a request whose
//! client hung up, so closing the upstream connection would free the slot
//! without ending the work. It finishes in a task of its own, holding the
//! slot; what is left of an HTTP/1.1 answer's body is then read and thrown
//! away within a bound, so its connection can serve again.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt;

use super::h1::SendError;
use super::h2::SendFailure;
use super::Answer;
use crate::pipeline::conn::UpstreamSlot;

/// The most of an orphaned answer's body read to keep its connection.
const DRAIN_BYTES: u64 = 1 << 20;
/// ... and the longest it is waited for.
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Runs `exchange`; with a `slot`, it holds the slot until the exchange is
/// done, and is finished in a task of its own if the caller stops waiting.
pub async fn run<F>(exchange: F, slot: Option<UpstreamSlot>) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Orphan + Send,
{
    match slot {
        None => exchange.await,
        Some(slot) => {
            Held {
                exchange: Some(Box::pin(exchange)),
                slot: Some(slot),
            }
            .await
        }
    }
}

/// What becomes of an exchange's outcome nobody waits for any more.
pub trait Orphan: Sized {
    /// Throws it away, reading what must be read first.
    fn discard(self) -> impl Future<Output = ()> + Send;
}

impl Orphan for Result<Answer, SendError> {
    async fn discard(self) {
        if let Ok(Answer::Response(response, _)) = self {
            let mut body = response.into_body();
            let mut read = 0u64;
            let drained = tokio::time::timeout(DRAIN_TIME, async {
                while read <= DRAIN_BYTES {
                    match body.frame().await {
                        Some(Ok(frame)) => {
                            read += frame.data_ref().map_or(0, |d| d.len() as u64);
                        }
                        _ => return,
                    }
                }
            });
            let _ = drained.await;
        }
    }
}

impl Orphan for Result<http::Response<hyper::body::Incoming>, SendFailure> {
    async fn discard(self) {
        // Dropped: the upstream's stream is reset (CANCEL) once its head
        // is in; the backend has answered.
    }
}

/// The exchange and its slot, until the exchange is done.
struct Held<F>
where
    F: Future + Send + 'static,
    F::Output: Orphan + Send,
{
    exchange: Option<Pin<Box<F>>>,
    slot: Option<UpstreamSlot>,
}

impl<F> Future for Held<F>
where
    F: Future + Send + 'static,
    F::Output: Orphan + Send,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(exchange) = self.exchange.as_mut() else {
            return Poll::Pending;
        };
        let out = std::task::ready!(exchange.as_mut().poll(cx));
        self.exchange = None;
        self.slot = None;
        Poll::Ready(out)
    }
}

impl<F> Drop for Held<F>
where
    F: Future + Send + 'static,
    F::Output: Orphan + Send,
{
    fn drop(&mut self) {
        let (Some(exchange), Some(slot)) = (self.exchange.take(), self.slot.take()) else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // The exchange has its own deadline (the upstream's timeout): the
        // task ends by then at the latest.
        rt.spawn(async move {
            let out = exchange.await;
            // The backend has answered (or timed out): the slot is free
            // before the rest of the answer is read.
            drop(slot);
            out.discard().await;
        });
    }
}
