//! Requests through tollgate reach a real upstream intact, over HTTP/1.1 and
//! HTTP/2, and the upstream sees tollgate's forwarding headers, never the
//! client's.

use crate::common::*;

fn proxied_with_canned(up: &Upstream) -> String {
    config(&format!(
        "upstreams:
  api: {{ targets: ['{}'] }}
routes:
  - {{ match: {{ path_prefix: / }}, upstream: api }}
  - {{ match: {{ path: /canned }}, respond: {{ status: 202, body: canned, headers: {{ x-canned: yes }} }} }}
",
        up.addr
    ))
}

#[tokio::test]
async fn get_and_post_with_bodies_pass_through_http1() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&proxied_with_canned(&up)).await;
    let mut c = h1(proxy.addr()).await;

    let got = send1(&mut c, request("GET", "/items?page=2", empty())).await;
    assert_eq!(got.status, 200);
    let seen = got.json();
    assert_eq!(seen["method"], "GET");
    assert_eq!(seen["uri"], "/items?page=2");
    assert_eq!(seen["version"], "HTTP/1.1");

    // Content-Length body.
    let got = send1(
        &mut c,
        request("POST", "/items", full(&b"{\"name\":\"widget\"}"[..])),
    )
    .await;
    assert_eq!(got.json()["body"], "{\"name\":\"widget\"}");
    assert_eq!(got.json()["body_len"], 17);

    // Chunked body (no length known up front).
    let got = send1(
        &mut c,
        request(
            "PUT",
            "/items/1",
            chunked(vec![b"hello ", b"chunked ", b"world"]),
        ),
    )
    .await;
    assert_eq!(got.json()["body"], "hello chunked world");
    assert_eq!(got.json()["method"], "PUT");
    assert_eq!(up.hits(), 3);
}

#[tokio::test]
async fn http2_clients_are_served_over_h2c_and_forwarded_as_http1() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&proxied_with_canned(&up)).await;
    let mut c = h2(proxy.addr()).await;
    let req = http::Request::builder()
        .method("POST")
        .uri("http://api.example.com/h2?x=1")
        .body(full(&b"over h2"[..]))
        .unwrap();
    let got = collect(c.send_request(req).await.unwrap()).await;
    assert_eq!(got.status, 200);
    let seen = got.json();
    assert_eq!(seen["body"], "over h2");
    assert_eq!(seen["uri"], "/h2?x=1");
    assert_eq!(seen["version"], "HTTP/1.1");
    // The :authority becomes the Host the upstream sees.
    assert_eq!(seen["headers"]["host"], "api.example.com");
    assert_eq!(seen["headers"]["x-forwarded-host"], "api.example.com");

    // Streams on one connection run concurrently.
    let mut joins = Vec::new();
    for i in 0..20 {
        let mut c = c.clone();
        joins.push(tokio::spawn(async move {
            let req = http::Request::builder()
                .uri(format!("http://a/n{i}"))
                .body(empty())
                .unwrap();
            collect(c.send_request(req).await.unwrap()).await.json()["uri"]
                .as_str()
                .unwrap()
                .to_owned()
        }));
    }
    for (i, j) in joins.into_iter().enumerate() {
        assert_eq!(j.await.unwrap(), format!("/n{i}"));
    }
}

#[tokio::test]
async fn hop_by_hop_headers_and_client_forwarding_headers_are_removed() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&proxied_with_canned(&up)).await;
    let mut c = h1(proxy.addr()).await;
    let req = http::Request::builder()
        .uri("/h")
        .header("host", "shop.example.com:8080")
        .header("connection", "keep-alive, X-Forwarded-For, X-Internal")
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-internal", "secret")
        .header("keep-alive", "timeout=5")
        .header("x-real-ip", "6.6.6.6")
        .header("forwarded", "for=6.6.6.6")
        .header("x-forwarded-proto", "https")
        .header("te", "trailers")
        .header("accept", "application/json")
        .body(empty())
        .unwrap();
    let got = send1(&mut c, req).await;
    let h = &got.json()["headers"];
    assert_eq!(h["x-forwarded-for"], "127.0.0.1", "{h}");
    assert_eq!(h["x-real-ip"], "127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["x-forwarded-host"], "shop.example.com:8080");
    assert_eq!(
        h["host"], "shop.example.com:8080",
        "Host is preserved by default"
    );
    assert_eq!(h["accept"], "application/json");
    for gone in ["x-internal", "keep-alive", "forwarded", "te"] {
        assert!(h.get(gone).is_none(), "{gone} reached the upstream: {h}");
    }
    // The client's Connection header is not passed on (tollgate's HTTP/1.1
    // leg to the upstream needs none).
    assert!(h.get("connection").is_none(), "{h}");

    // `Connection: close, X-Forwarded-For` from the issue.
    let mut c = h1(proxy.addr()).await;
    let req = http::Request::builder()
        .uri("/h")
        .header("host", "a")
        .header("connection", "close, X-Forwarded-For")
        .header("x-forwarded-for", "1.2.3.4")
        .body(empty())
        .unwrap();
    let got = send1(&mut c, req).await;
    assert_eq!(
        got.seen_header("x-forwarded-for").as_deref(),
        Some("127.0.0.1")
    );
}

#[tokio::test]
async fn host_header_can_be_the_target_or_fixed() {
    let up = Upstream::spawn().await;
    let yaml = config(&format!(
        "upstreams:\n  t: {{ targets: ['{a}'], host_header: target }}\n  f: {{ targets: ['{a}'], host_header: internal.api }}\nroutes:\n  - {{ match: {{ path_prefix: /t }}, upstream: t }}\n  - {{ match: {{ path_prefix: /f }}, upstream: f }}\n",
        a = up.addr
    ));
    let proxy = TestProxy::spawn(&yaml).await;
    assert_eq!(
        get(proxy.addr(), "/t").await.seen_header("host"),
        Some(up.addr.to_string())
    );
    assert_eq!(
        get(proxy.addr(), "/f").await.seen_header("host").as_deref(),
        Some("internal.api")
    );
}

#[tokio::test]
async fn respond_routes_answer_without_an_upstream() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&proxied_with_canned(&up)).await;
    let got = get(proxy.addr(), "/canned").await;
    assert_eq!(got.status, 202);
    assert_eq!(got.body, "canned");
    assert_eq!(got.headers["x-canned"], "yes");
    assert_eq!(got.headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(up.hits(), 0);
}

#[tokio::test]
async fn unmatched_requests_get_problem_bodies() {
    let yaml = config(
        "routes:\n  - { match: { path: /login, methods: [POST] }, respond: { body: ok } }\n  - { match: { host: only.example.com, path_prefix: / }, respond: { body: only } }\n",
    );
    let proxy = TestProxy::spawn(&yaml).await;

    let got = get(proxy.addr(), "/missing").await;
    assert_eq!(got.status, 404);
    assert_eq!(got.headers["content-type"], "application/problem+json");
    let p = got.json();
    assert_eq!(p["status"], 404);
    assert_eq!(p["title"], "Not Found");
    assert!(p["detail"].as_str().unwrap().contains("/missing"), "{p}");

    let got = get(proxy.addr(), "/login").await;
    assert_eq!(got.status, 405);
    assert_eq!(got.headers["allow"], "POST");
    assert_eq!(got.json()["status"], 405);

    let mut c = h1(proxy.addr()).await;
    let req = http::Request::builder()
        .uri("/x")
        .header("host", "ONLY.example.com:9")
        .body(empty())
        .unwrap();
    assert_eq!(send1(&mut c, req).await.body, "only");
}

/// The upstream sees a length only where there is a body or the method
/// expects one: a bodiless GET goes without `Content-Length` (as nginx
/// sends it), an empty POST with `Content-Length: 0`.
#[tokio::test]
async fn only_requests_that_may_have_a_body_go_upstream_with_a_length() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&proxied_with_canned(&up)).await;
    let mut c = h1(proxy.addr()).await;
    let got = send1(&mut c, request("GET", "/x", empty())).await;
    assert_eq!(got.seen_header("content-length"), None);
    assert_eq!(got.seen_header("transfer-encoding"), None);
    let got = send1(&mut c, request("POST", "/x", empty())).await;
    assert_eq!(got.seen_header("content-length").as_deref(), Some("0"));
    let got = send1(&mut c, request("POST", "/x", full(&b"12345"[..]))).await;
    assert_eq!(got.seen_header("content-length").as_deref(), Some("5"));
}

#[tokio::test]
async fn head_and_empty_bodies_keep_the_connection_pooled() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&proxied_with_canned(&up)).await;
    let mut c = h1(proxy.addr()).await;
    for _ in 0..5 {
        let got = send1(&mut c, request("HEAD", "/x", empty())).await;
        assert_eq!(got.status, 200);
        assert!(got.body.is_empty());
        let got = send1(&mut c, request("GET", "/status?code=204", empty())).await;
        assert_eq!(got.status, 204);
        let got = send1(&mut c, request("GET", "/y", empty())).await;
        assert_eq!(got.status, 200);
    }
    assert_eq!(up.hits(), 15);
    assert_eq!(
        up.conns(),
        1,
        "sequential requests reuse one pooled upstream connection"
    );
}

#[tokio::test]
async fn http11_without_host_is_a_400_problem() {
    let proxy = TestProxy::spawn(&config(
        "routes:\n  - { match: { path_prefix: / }, respond: { body: ok } }\n",
    ))
    .await;
    let out = raw(
        proxy.addr(),
        b"GET / HTTP/1.1\r\n\r\n",
        std::time::Duration::from_secs(2),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(out.contains("application/problem+json"), "{out}");
    assert!(out.contains("Host header"), "{out}");
    // Garbage is refused by the HTTP parser with a 400 as well.
    let out = raw(
        proxy.addr(),
        b"NOT HTTP AT ALL\r\n\r\n",
        std::time::Duration::from_secs(2),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
}
