//! gRPC clients get gRPC answers: a limit's refusal of an HTTP/2 gRPC
//! call is a trailers-only response (HTTP 200, `grpc-status: 8`
//! RESOURCE_EXHAUSTED, a `google.rpc.Status` with `RetryInfo` and
//! `QuotaFailure` in `grpc-status-details-bin`, the rate-limit fields as
//! metadata), tollgate's own errors map the way gRPC clients expect, a gRPC
//! call over HTTP/1.1 is refused plainly, and other clients are untouched.

use base64::Engine as _;
use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt;
use prost::Message;

use crate::common::*;

// The wire types, written here from the protobuf definitions, so the test
// decodes what tollgate encoded without sharing its code.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Status {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<Any>,
}
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    pub retry_delay: Option<Duration>,
}
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Duration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}
#[derive(Clone, PartialEq, prost::Message)]
struct QuotaFailure {
    #[prost(message, repeated, tag = "1")]
    violations: Vec<Violation>,
}
#[derive(Clone, PartialEq, prost::Message)]
struct Violation {
    #[prost(string, tag = "1")]
    subject: String,
    #[prost(string, tag = "2")]
    description: String,
}

/// What an HTTP/2 gRPC call got: status, headers, body, trailers.
struct Call {
    status: u16,
    headers: http::HeaderMap,
    body: Bytes,
    trailers: Option<http::HeaderMap>,
}

async fn call(addr: std::net::SocketAddr, path: &str, content_type: &str) -> Call {
    let mut sender = h2(addr).await;
    sender.ready().await.unwrap();
    let req = Request::post(path)
        .uri(format!("http://grpc.test{path}"))
        .header("content-type", content_type)
        .header("te", "trailers")
        .body(full(&b"\0\0\0\0\0"[..]))
        .unwrap();
    let resp = sender.send_request(req).await.expect("response");
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await.expect("body");
    let trailers = collected.trailers().cloned();
    Call {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
    }
}

fn header<'a>(c: &'a Call, name: &str) -> &'a str {
    c.headers
        .get(name)
        .map(|v| v.to_str().unwrap())
        .unwrap_or_else(|| panic!("no {name} in {:?}", c.headers))
}

#[tokio::test]
async fn a_limit_refuses_a_grpc_call_with_resource_exhausted_and_retry_info() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = TestProxy::spawn(&config(&format!(
        "upstreams:
  gone: {{ targets: ['{dead}'], connect_timeout: 1s }}
routes:
  - match: {{ grpc: shop.Cart }}
    respond: {{ body: '' }}
    limits: [{{ name: per_client, algorithm: fixed_window, limit: 1, window: 1m, key: ip }}]
  - match: {{ grpc: shop.Gone/Get }}
    upstream: gone
"
    )))
    .await;
    let first = call(proxy.addr(), "/shop.Cart/Add", "application/grpc").await;
    assert_eq!(first.status, 200);
    assert!(
        first.headers.get("grpc-status").is_none(),
        "the route's own answer passes as it is"
    );

    let refused = call(proxy.addr(), "/shop.Cart/Add", "application/grpc+proto").await;
    assert_eq!(
        refused.status, 200,
        "gRPC carries its status in grpc-status"
    );
    assert_eq!(header(&refused, "content-type"), "application/grpc");
    assert_eq!(header(&refused, "grpc-status"), "8");
    assert!(header(&refused, "grpc-message").contains("per_client"));
    assert!(refused.body.is_empty(), "trailers-only: no message");
    assert!(
        refused.trailers.is_none(),
        "trailers-only: the status is in the head"
    );
    // The rate-limit fields go out as metadata.
    assert_eq!(header(&refused, "x-ratelimit-remaining"), "0");
    let retry_after: i64 = header(&refused, "retry-after").parse().unwrap();
    let bin = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(header(&refused, "grpc-status-details-bin"))
        .unwrap();
    let status = Status::decode(&bin[..]).unwrap();
    assert_eq!(status.code, 8);
    assert_eq!(status.details.len(), 2);
    assert_eq!(
        status.details[0].type_url,
        "type.googleapis.com/google.rpc.RetryInfo"
    );
    let retry = RetryInfo::decode(&status.details[0].value[..]).unwrap();
    assert_eq!(retry.retry_delay.unwrap().seconds, retry_after);
    assert_eq!(
        status.details[1].type_url,
        "type.googleapis.com/google.rpc.QuotaFailure"
    );
    let quota = QuotaFailure::decode(&status.details[1].value[..]).unwrap();
    assert_eq!(quota.violations[0].subject, "limit:per_client");
    assert!(
        quota.violations[0]
            .description
            .contains("1 requests per 1m"),
        "{quota:?}"
    );

    // tollgate's own errors, by the table.
    let missing = call(proxy.addr(), "/shop.Nope/Get", "application/grpc").await;
    assert_eq!(
        (missing.status, header(&missing, "grpc-status")),
        (200, "12")
    );
    let down = call(proxy.addr(), "/shop.Gone/Get", "application/grpc").await;
    assert_eq!((down.status, header(&down, "grpc-status")), (200, "14"));

    // Anyone else still gets HTTP's answers.
    let plain = call(proxy.addr(), "/shop.Cart/Add", "application/json").await;
    assert_eq!(plain.status, 429);
    assert!(plain.headers.get("grpc-status").is_none());
    let web = call(proxy.addr(), "/shop.Nope/Get", "application/grpc-web").await;
    assert_eq!(web.status, 404);
}

#[tokio::test]
async fn a_grpc_call_over_http1_is_refused_before_any_limit() {
    let proxy = TestProxy::spawn(&config(
        "routes:
  - match: { path_prefix: / }
    respond: { body: ok }
    limits: [{ name: once, algorithm: fixed_window, limit: 1, window: 1m, key: ip }]
",
    ))
    .await;
    for _ in 0..3 {
        let got = send_with(
            proxy.addr(),
            "POST",
            "/shop.Cart/Add",
            &[("content-type", "application/grpc")],
            b"\0\0\0\0\0",
        )
        .await;
        assert_eq!(got.status, 505);
        let problem = got.json();
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("gRPC needs HTTP/2"),
            "{problem}"
        );
    }
    // Refused before the limit: it was never charged.
    assert_eq!(get(proxy.addr(), "/").await.status, 200);
}
