//! Bodies stream both ways: 100 MB up and down, checksummed at both ends.

use crate::common::*;
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};

const SIZE: u64 = 100 * 1024 * 1024;

fn proxied_1gb(up: &Upstream) -> String {
    forward_all(
        &format!("'{}'", up.addr),
        "",
        "server: { max_body_size: 1GB }",
    )
}

#[tokio::test]
async fn a_100mb_upload_arrives_intact() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&proxied_1gb(&up)).await;
    let mut c = h1(proxy.addr()).await;
    let got = send1(&mut c, request("POST", "/upload", pattern(SIZE))).await;
    assert_eq!(got.status, 200);
    let seen = got.json();
    assert_eq!(seen["body_len"], SIZE);
    assert_eq!(seen["body_sha256"], Pattern::sha256(SIZE));
}

#[tokio::test]
async fn a_100mb_download_arrives_intact_over_http1_and_http2() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&proxied_1gb(&up)).await;
    let expected = Pattern::sha256(SIZE);

    let mut c = h1(proxy.addr()).await;
    c.ready().await.unwrap();
    let resp = c
        .send_request(request("GET", &format!("/download?bytes={SIZE}"), empty()))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(hash_body(resp.into_body()).await, (SIZE, expected.clone()));

    let mut c = h2(proxy.addr()).await;
    let req = http::Request::builder()
        .uri(format!("http://a/download?bytes={SIZE}"))
        .body(empty())
        .unwrap();
    let resp = c.send_request(req).await.unwrap();
    assert_eq!(hash_body(resp.into_body()).await, (SIZE, expected));
}

async fn hash_body(mut body: hyper::body::Incoming) -> (u64, String) {
    let mut h = Sha256::new();
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        if let Some(d) = frame.expect("body frame").data_ref() {
            h.update(d);
            n += d.len() as u64;
        }
    }
    (n, hex(&h.finalize()))
}
