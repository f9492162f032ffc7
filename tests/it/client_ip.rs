//! Who is the client, end to end: spoofed forwarding headers from untrusted
//! peers are replaced, trusted chains are walked and extended, PROXY
//! protocol sets the client only from trusted peers, and invalid tokens are
//! refused under `on_invalid: reject`.

use std::time::Duration;

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn with_client_ip(up: &Upstream, client_ip: &str, listener_extra: &str) -> String {
    format!(
        "listeners:\n  - {{ name: plain, bind: '127.0.0.1:0' {listener_extra} }}\nadmin: {{ enabled: false }}\nlog: {{ access_log: false }}\nclient_ip: {client_ip}\nupstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, upstream: api }}\n",
        up.addr
    )
}

#[tokio::test]
async fn an_untrusted_peer_rotating_forwarding_headers_is_always_its_socket_address() {
    let up = Upstream::spawn().await;
    // Only 10/8 is trusted; the test client is 127.0.0.1.
    let yaml = with_client_ip(
        &up,
        "{ trusted_proxies: ['10.0.0.0/8'], headers: [x-forwarded-for, x-real-ip, cf-connecting-ip, forwarded] }",
        "",
    );
    let proxy = TestProxy::spawn(&yaml).await;
    for i in 0..20 {
        let spoof = format!("198.51.100.{i}");
        let mut c = h1(proxy.addr()).await;
        let req = http::Request::builder()
            .uri("/who")
            .header("host", "a")
            .header("x-forwarded-for", &spoof)
            .header("x-real-ip", &spoof)
            .header("cf-connecting-ip", &spoof)
            .header("forwarded", format!("for={spoof}"))
            .header("x-forwarded-proto", "gopher")
            .body(empty())
            .unwrap();
        let h = send1(&mut c, req).await.json()["headers"].clone();
        assert_eq!(h["x-forwarded-for"], "127.0.0.1", "{h}");
        assert_eq!(h["x-real-ip"], "127.0.0.1");
        assert_eq!(
            h["x-forwarded-proto"], "http",
            "an untrusted proto is replaced"
        );
        for gone in ["forwarded", "cf-connecting-ip"] {
            assert!(
                h.get(gone).is_none(),
                "{gone} from an untrusted client reached the upstream: {h}"
            );
        }
    }
}

#[tokio::test]
async fn a_trusted_peer_chain_is_walked_and_extended() {
    let up = Upstream::spawn().await;
    let yaml = with_client_ip(&up, "{ trusted_proxies: ['127.0.0.1', '10.0.0.0/8'] }", "");
    let proxy = TestProxy::spawn(&yaml).await;
    let mut c = h1(proxy.addr()).await;
    let req = http::Request::builder()
        .uri("/who")
        .header("host", "a")
        .header("x-forwarded-for", "6.6.6.6, 203.0.113.7")
        .header("x-forwarded-for", "10.0.0.2")
        .header("x-forwarded-proto", "https")
        .body(empty())
        .unwrap();
    let h = send1(&mut c, req).await.json()["headers"].clone();
    assert_eq!(h["x-real-ip"], "203.0.113.7", "{h}");
    assert_eq!(
        h["x-forwarded-for"],
        "6.6.6.6, 203.0.113.7, 10.0.0.2, 127.0.0.1"
    );
    assert_eq!(
        h["x-forwarded-proto"], "https",
        "a trusted proxy's proto is kept"
    );
}

async fn via_proxy_protocol(addr: std::net::SocketAddr, header: &[u8]) -> String {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(header).await.unwrap();
    tcp.write_all(b"GET /who HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// A PROXY-protocol listener trusting `trusted`, in front of an upstream.
async fn proxy_protocol_listener(trusted: &str) -> (Upstream, TestProxy) {
    let up = Upstream::spawn().await;
    let yaml = with_client_ip(
        &up,
        &format!("{{ trusted_proxies: ['{trusted}'] }}"),
        ", proxy_protocol: true",
    );
    let proxy = TestProxy::spawn(&yaml).await;
    (up, proxy)
}

const V1_HEADER: &[u8] = b"PROXY TCP4 203.0.113.50 10.0.0.1 40000 443\r\n";

#[tokio::test]
async fn proxy_protocol_from_a_trusted_peer_sets_the_client() {
    let (up, proxy) = proxy_protocol_listener("127.0.0.0/8").await;
    let out = via_proxy_protocol(proxy.addr(), V1_HEADER).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("\"x-real-ip\":\"203.0.113.50\""), "{out}");

    let v2 = tollgate::listener::encode_v2(
        "[2001:db8::77]:4000".parse().unwrap(),
        "[2001:db8::1]:443".parse().unwrap(),
    );
    let out = via_proxy_protocol(proxy.addr(), &v2).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("\"x-real-ip\":\"2001:db8::77\""), "{out}");

    // No PROXY header on a PROXY listener: closed, nothing forwarded.
    let out = via_proxy_protocol(proxy.addr(), b"").await;
    assert!(out.is_empty(), "{out}");
    assert_eq!(up.hits(), 2);
}

#[tokio::test]
async fn proxy_protocol_from_an_untrusted_peer_is_refused() {
    let (up, proxy) = proxy_protocol_listener("10.0.0.0/8").await;
    let out = via_proxy_protocol(proxy.addr(), V1_HEADER).await;
    assert!(
        out.is_empty(),
        "an untrusted peer's connection is closed: {out}"
    );
    let v2 = tollgate::listener::encode_v2(
        "203.0.113.50:1".parse().unwrap(),
        "10.0.0.1:443".parse().unwrap(),
    );
    assert!(via_proxy_protocol(proxy.addr(), &v2).await.is_empty());
    assert_eq!(up.hits(), 0);
}

#[tokio::test]
async fn invalid_tokens_get_a_401_problem_under_reject() {
    let up = Upstream::spawn().await;
    let secret = "an-hmac-secret-that-is-32-bytes-long";
    let yaml = format!(
        "{}identity: {{ on_invalid: reject, jwt: {{ algorithms: [HS256], secret: '{secret}' }} }}\n",
        proxied(&up)
    );
    let proxy = TestProxy::spawn(&yaml).await;
    let ask = |auth: Option<String>| {
        let addr = proxy.addr();
        async move {
            let mut c = h1(addr).await;
            let mut req = http::Request::builder().uri("/me").header("host", "a");
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            send1(&mut c, req.body(empty()).unwrap()).await
        }
    };
    let got = ask(Some("Bearer not.a.token".into())).await;
    assert_eq!(got.status, 401);
    assert_eq!(got.headers["content-type"], "application/problem+json");
    assert_eq!(
        got.headers["www-authenticate"],
        "Bearer error=\"invalid_token\""
    );
    assert_eq!(got.json()["status"], 401);
    assert_eq!(up.hits(), 0, "a refused request never reaches the upstream");

    let exp = tollgate::clock::unix_ms() / 1000 + 600;
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &serde_json::json!({ "sub": "alice", "exp": exp }),
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap();
    assert_eq!(ask(Some(format!("Bearer {token}"))).await.status, 200);
    assert_eq!(
        ask(None).await.status,
        200,
        "no credential at all is anonymous, not invalid"
    );
}
