//! tollgate's own answers to gRPC requests: a gRPC client reads a plain
//! 429 as UNAVAILABLE and retries at once, the opposite of what a limit
//! wants. A request is gRPC when its `content-type` is `application/grpc`
//! or `application/grpc+<codec>`; every answer tollgate makes to one
//! itself (a refusal, an error) goes out as a trailers-only gRPC response:
//! HTTP 200, `content-type: application/grpc`, `grpc-status`,
//! `grpc-message`, and for a limit's refusal `grpc-status-details-bin`
//! (a `google.rpc.Status` holding a `RetryInfo` and a `QuotaFailure`). The
//! rate-limit fields stay, as metadata.

use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Response, StatusCode};
use prost::Message;

use crate::pipeline::body::{HeadLines, ProxyBody};

/// gRPC status codes tollgate answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Code {
    Cancelled = 1,
    Unknown = 2,
    DeadlineExceeded = 4,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

/// The one HTTP -> gRPC table for tollgate's own answers, as gRPC clients
/// read HTTP statuses (gRPC's `http-grpc-status-mapping.md`), but a limit
/// (429, 413, 431) is RESOURCE_EXHAUSTED, not UNAVAILABLE (which clients
/// retry at once), and a timeout (408, 504) is DEADLINE_EXCEEDED.
pub const TABLE: [(u16, Code); 16] = [
    (400, Code::Internal),
    (401, Code::Unauthenticated),
    (403, Code::PermissionDenied),
    (404, Code::Unimplemented),
    (405, Code::Unimplemented),
    (408, Code::DeadlineExceeded),
    (413, Code::ResourceExhausted),
    (429, Code::ResourceExhausted),
    (431, Code::ResourceExhausted),
    (499, Code::Cancelled),
    (500, Code::Internal),
    (501, Code::Unimplemented),
    (502, Code::Unavailable),
    (503, Code::Unavailable),
    (504, Code::DeadlineExceeded),
    (505, Code::Unimplemented),
];

/// The code for an HTTP status tollgate answers with: [`TABLE`], else
/// UNKNOWN.
pub fn code(status: StatusCode) -> Code {
    TABLE
        .iter()
        .find(|(s, _)| *s == status.as_u16())
        .map_or(Code::Unknown, |(_, c)| *c)
}

/// Whether a request is gRPC: `application/grpc`, or `application/grpc+`
/// or `;` after it (not `application/grpc-web`, which browsers speak over
/// HTTP/1.1 and which takes ordinary answers).
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        v.len() >= 16
            && v[..16].eq_ignore_ascii_case(b"application/grpc")
            && matches!(v.get(16), None | Some(b'+') | Some(b';'))
    })
}

/// The call's deadline from `grpc-timeout` (1 to 8 digits and a unit:
/// `H`ours, `M`inutes, `S`econds, `m`illi-, `u` micro-, `n` nanoseconds);
/// `None` when absent or malformed (the call then has the upstream's
/// timeout alone).
pub fn timeout(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get("grpc-timeout")?.as_bytes();
    let (&unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The `grpc-status` in a response's fields or trailers, if any.
pub fn status_of(headers: &HeaderMap) -> Option<u16> {
    let v = headers.get("grpc-status")?;
    std::str::from_utf8(v.as_bytes()).ok()?.parse().ok()
}

/// Why a limit refused, for the status details.
pub struct Refusal<'a> {
    pub limit: &'a str,
    pub detail: &'a str,
    pub retry_after: u64,
}

/// `resp` (an answer tollgate made itself) as a trailers-only gRPC
/// response: its rate-limit and other fields kept as metadata, its body
/// (a problem document) dropped, `code` and `message` added, and for a
/// limit's refusal the details a gRPC client's retry policy reads.
pub fn answer(
    mut resp: Response<ProxyBody>,
    code: Code,
    message: &str,
    refusal: Option<Refusal<'_>>,
) -> Response<ProxyBody> {
    let old = resp.body_mut().take_lines();
    let mut lines = HeadLines::default();
    lines.push(b"content-type", b"application/grpc");
    lines.push(
        b"grpc-status",
        itoa::Buffer::new().format(code as i32).as_bytes(),
    );
    let encoded = percent_encoding::utf8_percent_encode(message, MESSAGE).to_string();
    lines.push(b"grpc-message", encoded.as_bytes());
    if let Some(r) = refusal {
        let details = status_details(code, message, &r);
        let text = base64::engine::general_purpose::STANDARD_NO_PAD.encode(details);
        lines.push(b"grpc-status-details-bin", text.as_bytes());
    }
    for (name, value) in HeadLines::fields(&old.lines) {
        // The problem document's type and length go with its body.
        if !name.eq_ignore_ascii_case(b"content-type")
            && !name.eq_ignore_ascii_case(b"content-length")
        {
            lines.push(name, value);
        }
    }
    lines.date = old.date;
    lines.rate_limit_names = old.rate_limit_names;
    let headers = std::mem::take(resp.headers_mut());
    let mut body = ProxyBody::empty();
    *body.lines_mut() = lines;
    let mut out = Response::new(body);
    *out.headers_mut() = headers;
    out.headers_mut().remove(CONTENT_TYPE);
    *out.status_mut() = StatusCode::OK;
    out
}

/// Trailers that end a call with `code` and `message`.
pub fn trailers(code: Code, message: &str) -> HeaderMap {
    let mut t = HeaderMap::with_capacity(2);
    t.insert("grpc-status", HeaderValue::from(code as i32));
    let encoded = percent_encoding::utf8_percent_encode(message, MESSAGE).to_string();
    if let Ok(v) = HeaderValue::from_str(&encoded) {
        t.insert("grpc-message", v);
    }
    t
}

/// What `grpc-message` percent-encodes: gRPC's rule, everything but
/// printable ASCII other than `%`.
const MESSAGE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');

/// `google.rpc.Status` with a `google.rpc.RetryInfo` and a
/// `google.rpc.QuotaFailure`, encoded.
fn status_details(code: Code, message: &str, r: &Refusal<'_>) -> Bytes {
    let retry = RetryInfo {
        retry_delay: Some(ProtoDuration {
            seconds: r.retry_after as i64,
            nanos: 0,
        }),
    };
    let quota = QuotaFailure {
        violations: vec![Violation {
            subject: format!("limit:{}", r.limit),
            description: r.detail.to_owned(),
        }],
    };
    let status = Status {
        code: code as i32,
        message: message.to_owned(),
        details: vec![Any {
            type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
            value: retry.encode_to_vec(),
        }],
    };
    let mut status = status;
    // A shed call names no limit: the retry delay alone.
    if !r.limit.is_empty() {
        status.details.push(Any {
            type_url: "type.googleapis.com/google.rpc.QuotaFailure".into(),
            value: quota.encode_to_vec(),
        });
    }
    Bytes::from(status.encode_to_vec())
}

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<Any>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `google.rpc.RetryInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    pub retry_delay: Option<ProtoDuration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProtoDuration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `google.rpc.QuotaFailure`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct QuotaFailure {
    #[prost(message, repeated, tag = "1")]
    pub violations: Vec<Violation>,
}

/// `google.rpc.QuotaFailure.Violation`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Violation {
    #[prost(string, tag = "1")]
    pub subject: String,
    #[prost(string, tag = "2")]
    pub description: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One assertion per row of the table, written out, so a changed row
    /// fails by name.
    #[test]
    fn each_http_status_maps_to_the_code_grpc_clients_expect() {
        let rows = [
            (400, Code::Internal, 13),
            (401, Code::Unauthenticated, 16),
            (403, Code::PermissionDenied, 7),
            (404, Code::Unimplemented, 12),
            (405, Code::Unimplemented, 12),
            (408, Code::DeadlineExceeded, 4),
            (413, Code::ResourceExhausted, 8),
            (429, Code::ResourceExhausted, 8),
            (431, Code::ResourceExhausted, 8),
            (499, Code::Cancelled, 1),
            (500, Code::Internal, 13),
            (501, Code::Unimplemented, 12),
            (502, Code::Unavailable, 14),
            (503, Code::Unavailable, 14),
            (504, Code::DeadlineExceeded, 4),
            (505, Code::Unimplemented, 12),
        ];
        assert_eq!(rows.len(), TABLE.len(), "a row without its test");
        for (status, want, number) in rows {
            let got = code(StatusCode::from_u16(status).unwrap());
            assert_eq!((got, got as i32), (want, number), "HTTP {status}");
        }
        assert_eq!(code(StatusCode::IM_A_TEAPOT), Code::Unknown);
    }

    #[test]
    fn grpc_timeout_reads_every_unit_and_ignores_what_is_malformed() {
        let at = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("grpc-timeout", http::HeaderValue::from_static(v));
            timeout(&h)
        };
        assert_eq!(at("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(at("3M"), Some(Duration::from_secs(180)));
        assert_eq!(at("5S"), Some(Duration::from_secs(5)));
        assert_eq!(at("300m"), Some(Duration::from_millis(300)));
        assert_eq!(at("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(at("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "S", "100", "123456789S", "1.5S", "-1S", "10s", "10x"] {
            assert_eq!(at(bad), None, "{bad}");
        }
        assert_eq!(timeout(&HeaderMap::new()), None);
        let t = trailers(Code::DeadlineExceeded, "100% gone");
        assert_eq!(status_of(&t), Some(4));
        assert_eq!(t["grpc-message"], "100%25 gone");
    }

    #[test]
    fn grpc_is_told_by_its_content_type() {
        let with = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, ct.parse().unwrap());
            is_grpc(&h)
        };
        assert!(with("application/grpc"));
        assert!(with("application/grpc+proto"));
        assert!(with("Application/GRPC;charset=utf-8"));
        assert!(!with("application/grpc-web"));
        assert!(!with("application/json"));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn a_refusal_carries_retry_info_and_the_quota_that_failed() {
        let refusal = Refusal {
            limit: "per_user",
            detail: "10 requests per 60s",
            retry_after: 7,
        };
        let resp = answer(
            Response::new(ProxyBody::empty()),
            Code::ResourceExhausted,
            "rate limited: 100% of per_user",
            Some(refusal),
        );
        assert_eq!(resp.status(), StatusCode::OK);
        let lines = &resp.body().lines().lines;
        let fields: Vec<(String, String)> = HeadLines::fields(lines)
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(n).into(),
                    String::from_utf8_lossy(v).into(),
                )
            })
            .collect();
        let get = |n: &str| fields.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        assert_eq!(get("grpc-status").as_deref(), Some("8"));
        assert_eq!(
            get("grpc-message").as_deref(),
            Some("rate limited: 100%25 of per_user")
        );
        let bin = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(get("grpc-status-details-bin").unwrap())
            .unwrap();
        let status = Status::decode(&bin[..]).unwrap();
        assert_eq!(status.code, 8);
        let retry = RetryInfo::decode(&status.details[0].value[..]).unwrap();
        assert_eq!(retry.retry_delay.unwrap().seconds, 7);
        let quota = QuotaFailure::decode(&status.details[1].value[..]).unwrap();
        assert_eq!(quota.violations[0].subject, "limit:per_user");
        assert_eq!(
            status.details[1].type_url,
            "type.googleapis.com/google.rpc.QuotaFailure"
        );
    }
}
