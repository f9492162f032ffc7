//! `GET /dashboard`: one page, HTML, CSS and JS in the binary (no CDN, works
//! offline), drawn with hand-made SVG from `GET /api/overview` every 2 s.
//! The page holds no data itself; with `admin.token` set it asks for the
//! token once, keeps it in the tab's session storage and sends it as a
//! bearer token. Everything shown is set as text, never as markup: keys and
//! user ids come from clients.

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::Response;
use http_body_util::Full;

const PAGE: &str = include_str!("dashboard.html");

/// Scripts and styles are inline (one self-contained page); nothing else
/// may load, and the page talks only to this listener.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub fn page() -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(PAGE.as_bytes())));
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    resp
}
