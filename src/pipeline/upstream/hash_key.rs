//! The text a `hash` balancer hashes, rendered from the request as
//! nginx renders its variables: `$arg_<name>` and `$cookie_<name>` the
//! first of that name (names matched without regard to case), raw as
//! sent; `$request_uri` path and query as sent; `$uri` the path;
//! `$args` the query; `$http_<name>` the header's first value; `$host`
//! the host without its port, in lower case; `$remote_addr` the client
//! as resolved from trusted proxies.

use std::net::IpAddr;

use http::header::{COOKIE, HOST};
use http::Request;

use crate::config::KeyPart;

/// Appends `part` of `head`'s key to `out`; `user` is the verified user.
pub fn render(
    part: &KeyPart,
    head: &Request<()>,
    client: IpAddr,
    user: Option<&str>,
    out: &mut Vec<u8>,
) {
    let uri = head.uri();
    match part {
        KeyPart::Text(t) => out.extend_from_slice(t.as_bytes()),
        KeyPart::Ip => out.extend_from_slice(client.to_string().as_bytes()),
        KeyPart::User => out.extend_from_slice(user.unwrap_or("").as_bytes()),
        KeyPart::Path => out.extend_from_slice(uri.path().as_bytes()),
        KeyPart::RequestUri => {
            let pq = uri.path_and_query().map_or("/", |pq| pq.as_str());
            out.extend_from_slice(pq.as_bytes());
        }
        KeyPart::Args => out.extend_from_slice(uri.query().unwrap_or("").as_bytes()),
        KeyPart::Arg(name) => {
            let found = uri.query().unwrap_or("").split('&').find_map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                k.eq_ignore_ascii_case(name).then_some(v)
            });
            out.extend_from_slice(found.unwrap_or("").as_bytes());
        }
        KeyPart::Cookie(name) => {
            let found = head
                .headers()
                .get_all(COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(';'))
                .find_map(|pair| {
                    let (k, v) = pair.trim().split_once('=')?;
                    k.trim().eq_ignore_ascii_case(name).then_some(v.trim())
                });
            out.extend_from_slice(found.unwrap_or("").as_bytes());
        }
        KeyPart::Header(name) => {
            if let Some(v) = head.headers().get(name) {
                out.extend_from_slice(v.as_bytes());
            }
        }
        KeyPart::Host => {
            let host = uri
                .host()
                .map(str::as_bytes)
                .or_else(|| head.headers().get(HOST).map(|h| h.as_bytes()))
                .unwrap_or(b"");
            // Without the port (an IPv6 literal keeps its brackets).
            let end = match host.iter().rposition(|&b| b == b':') {
                Some(i) if !host[i..].contains(&b']') => i,
                _ => host.len(),
            };
            out.extend(host[..end].iter().map(u8::to_ascii_lowercase));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(part: KeyPart, req: Request<()>) -> String {
        let mut out = Vec::new();
        render(
            &part,
            &req,
            "10.0.0.9".parse().unwrap(),
            Some("jwt:alice"),
            &mut out,
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn renders_as_nginx_variables() {
        let req = || {
            Request::builder()
                .uri("/a/b?x=1&User=bob&user=eve")
                .header("host", "API.example.com:8443")
                .header("cookie", "a=1; session=s3cr3t; b=2")
                .header("x-tenant", "acme")
                .body(())
                .unwrap()
        };
        assert_eq!(key(KeyPart::Arg("user".into()), req()), "bob");
        assert_eq!(key(KeyPart::Arg("none".into()), req()), "");
        assert_eq!(key(KeyPart::Cookie("session".into()), req()), "s3cr3t");
        assert_eq!(
            key(KeyPart::RequestUri, req()),
            "/a/b?x=1&User=bob&user=eve"
        );
        assert_eq!(key(KeyPart::Path, req()), "/a/b");
        assert_eq!(key(KeyPart::Args, req()), "x=1&User=bob&user=eve");
        assert_eq!(key(KeyPart::Host, req()), "api.example.com");
        assert_eq!(
            key(
                KeyPart::Header(http::HeaderName::from_static("x-tenant")),
                req()
            ),
            "acme"
        );
        assert_eq!(key(KeyPart::Ip, req()), "10.0.0.9");
        assert_eq!(key(KeyPart::User, req()), "jwt:alice");
    }
}
