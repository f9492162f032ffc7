//! Writing a request head, as the upstream client sends it: the request
//! line, the fields, then the framing tollgate chose (a length in
//! canonical digits, or chunked), never one a client spelt.

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::{Method, Request};

/// The request head for the upstream: request line, the request's fields
/// then the ones tollgate `added`, and the framing the body needs
/// (`chunked`: its length is unknown).
pub fn encode_head(
    req: &Request<()>,
    added: &[(HeaderName, HeaderValue)],
    length: Option<u64>,
    chunked: bool,
) -> Bytes {
    let method = req.method();
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let fields = || {
        req.headers()
            .iter()
            .chain(added.iter().map(|(n, v)| (n, v)))
    };
    let size: usize = fields().map(|(n, v)| n.as_str().len() + v.len() + 4).sum();
    let mut out = BytesMut::with_capacity(method.as_str().len() + target.len() + size + 64);
    out.extend_from_slice(method.as_str().as_bytes());
    out.extend_from_slice(b" ");
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in fields() {
        super::put_field(&mut out, name.as_str().as_bytes(), value.as_bytes());
    }
    if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    } else if let Some(n) = length.filter(|&n| {
        // No length for a GET, HEAD or CONNECT without a body, whose
        // methods expect none (RFC 9110 §8.6, as nginx and hyper send them).
        // The client's own `Content-Length` is not forwarded: this one is
        // the body's, in canonical digits.
        let expects_body = !matches!(*method, Method::GET | Method::HEAD | Method::CONNECT);
        n > 0 || expects_body
    }) {
        super::put_field(
            &mut out,
            b"content-length",
            itoa::Buffer::new().format(n).as_bytes(),
        );
    }
    out.extend_from_slice(b"\r\n");
    out.freeze()
}
