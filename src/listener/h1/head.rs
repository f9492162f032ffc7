//! A parsed request head (`http1::head`) as the pipeline's request: its
//! body what came with the head, and a pump for the rest.

use bytes::{Bytes, BytesMut};
use http::Request;

use crate::http1::head::{parse, Head, Parsed};
use crate::http1::pump::Pump;
use crate::pipeline::body::ClientBody;

/// Takes the head and what came of its body out of `buf`: the request,
/// its body, and the pump for the rest of it; or `None` (and `buf` as it
/// was) if hyper must answer it.
pub(super) fn request(
    head: &mut Head,
    buf: &mut BytesMut,
) -> Option<(Request<()>, ClientBody, Option<Pump>)> {
    let (req, first, body_len) = head.take(buf)?;
    let (body, pump) = match body_len {
        0 => (ClientBody::Read(None), None),
        n if n == first.len() as u64 => (ClientBody::Read(Some(first)), None),
        n => {
            let (pump, body) = Pump::new(n, first);
            (ClientBody::Pumped(body), Some(pump))
        }
    };
    Some((req, body, pump))
}

/// The fast path's reading of `buf`, for the fuzz target: the request and
/// body it would serve and what stays buffered for the next; `None` when
/// the head is not whole yet or hyper would be given it.
pub fn read_request(buf: &[u8]) -> Option<(Request<()>, ClientBody, Bytes)> {
    let mut head = Head::default();
    let Parsed::Head = parse(buf, (64 << 10, 100), &mut head) else {
        return None;
    };
    let mut buf = BytesMut::from(buf);
    let (req, body, _) = request(&mut head, &mut buf)?;
    Some((req, body, buf.freeze()))
}
