//! What becomes of a request body the pipeline did not forward (a
//! rejection, an error such as a 413, a `respond` route), over HTTP/1.x.
//! hyper drops such a body and closes the connection, often without saying
//! so, and the client's next request on it fails. nginx discards the body
//! instead and keeps the connection; so does tollgate, within bounds:
//!
//! - a body of at most [`DISCARD_BYTES`] (or of unknown length) is read and
//!   thrown away after the answer is sent, each piece within
//!   `server.lingering_timeout` and all of it within `server.lingering_time`;
//!   the connection stays open;
//! - a larger body, a body the client only sends after `100 Continue`, or
//!   one that outgrows the bound or stalls: the answer says
//!   `Connection: close` where it still can, and the connection closes
//!   lingering (see `listener::linger`), so the client reads the answer
//!   instead of a reset.
//!
//! Over HTTP/2 an unread body only resets its own stream.

use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderValue, CONNECTION};
use http::{Response, Version};
use http_body::Body;
use http_body_util::BodyExt;

use super::body::{ClientBody, ProxyBody};
use super::conn::ConnState;

/// The largest unread body discarded to keep a connection open.
pub const DISCARD_BYTES: u64 = 64 << 10;

/// Settles `body`, which nobody read, for the response `resp`.
pub fn settle(
    body: ClientBody,
    resp: &mut Response<ProxyBody>,
    version: Version,
    expects_continue: bool,
    conn: &Arc<ConnState>,
    (each, total): (Duration, Duration),
) {
    // A body read with its head has nothing left on the connection; what
    // is left of a pumped one the fast path's loop settles itself, by the
    // same rules.
    if version >= Version::HTTP_2
        || body.is_end_stream()
        || matches!(body, ClientBody::Read(_) | ClientBody::Pumped(_))
    {
        return;
    }
    if drains(body.size_hint().upper(), expects_continue) {
        let conn = conn.clone();
        // The connection is busy, not awaiting a next head, while this runs.
        let discarding = conn.discarding();
        tokio::spawn(async move {
            let drained = tokio::time::timeout(total, drain(body, each)).await;
            drop(discarding);
            if !matches!(drained, Ok(true)) {
                // Dropping the body makes hyper close the connection.
                conn.linger_on_close();
            }
        });
        return;
    }
    resp.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    conn.linger_on_close();
}

/// Whether an unread body with at most `left` bytes to come (`None`: not
/// known) is read and thrown away after the answer, keeping the
/// connection; if not, the answer says `Connection: close` and the close
/// lingers. The HTTP/1.x fast path (`listener::h1`) settles its own
/// bodies by this rule too.
pub fn drains(left: Option<u64>, expects_continue: bool) -> bool {
    !expects_continue && left.is_none_or(|n| n <= DISCARD_BYTES)
}

/// Reads `body` to its end and throws it away: whether it ended within the
/// bounds (at most [`DISCARD_BYTES`], each piece within `each`).
async fn drain(mut body: ClientBody, each: Duration) -> bool {
    let mut read = 0u64;
    loop {
        match tokio::time::timeout(each, body.frame()).await {
            Ok(None) => return true,
            Ok(Some(Ok(frame))) => {
                read += frame.data_ref().map_or(0, |d| d.len() as u64);
                if read > DISCARD_BYTES {
                    return false;
                }
            }
            // The client broke its body: the connection is done anyway.
            Ok(Some(Err(_))) => return true,
            Err(_) => return false,
        }
    }
}
