//! Access log lines as `replay` reads them, told apart line by line:
//! nginx's `combined` format and tollgate's own JSON access log.
//!
//! - combined: `$remote_addr - $remote_user [$time_local] "$request"
//!   $status $body_bytes_sent "$http_referer" "$http_user_agent"`. Its
//!   time is whole seconds, written when the request ended.
//! - tollgate (`log.format: json`): one JSON object a line; the access
//!   events (`"target":"tollgate::access"`) are requests, every other
//!   event is skipped. Its time is when the response ended: the request
//!   arrived `duration_ms` earlier, which is the time replayed.

use std::net::IpAddr;

use http::Method;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::OffsetDateTime;

/// One request off a log.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// When it arrived, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// When it ended (and was logged): the order of the file. combined:
    /// the same as `at_ms` (it holds no duration).
    pub ended_ms: i64,
    pub client: IpAddr,
    pub method: Method,
    /// The request target as logged (tollgate logs the path only).
    pub target: String,
    pub status: u16,
    /// tollgate's log: whether a limit refused it (`rate_limit` said
    /// `rejected:<limit>`). combined: `None`, the status says.
    pub refused: Option<bool>,
}

/// The longest `duration_ms` on a line of tollgate's JSON log (found
/// without parsing the line whole); `None` on any other line.
pub fn duration_ms(line: &[u8]) -> Option<f64> {
    const KEY: &[u8] = b"\"duration_ms\":";
    if line.first() != Some(&b'{') {
        return None;
    }
    let at = line.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = &line[at..];
    let end = rest
        .iter()
        .position(|b| !(b.is_ascii_digit() || *b == b'.' || *b == b' '))
        .unwrap_or(rest.len());
    std::str::from_utf8(&rest[..end]).ok()?.trim().parse().ok()
}

/// Why a line was not read as a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("neither nginx's combined format nor a JSON object")]
    Format,
    #[error("no client address")]
    Client,
    #[error("no time, or one that does not parse")]
    Time,
    #[error("no request line (\"METHOD /target HTTP/x\")")]
    Request,
    #[error("no status")]
    Status,
    #[error("not JSON: {0}")]
    Json(String),
}

/// The request on `line`; `Ok(None)` for a line that holds none (an empty
/// line, a JSON event other than an access line).
pub fn parse(line: &str) -> Result<Option<Line>, LineError> {
    let line = line.trim_end();
    if line.is_empty() {
        return Ok(None);
    }
    if line.starts_with('{') {
        return json(line);
    }
    combined(line).map(Some)
}

fn combined(line: &str) -> Result<Line, LineError> {
    let (client, rest) = line.split_once(' ').ok_or(LineError::Format)?;
    let client: IpAddr = client.parse().map_err(|_| LineError::Client)?;
    let open = rest.find('[').ok_or(LineError::Time)?;
    let close = rest[open..].find(']').ok_or(LineError::Time)? + open;
    let format = format_description!(
        "[day]/[month repr:short]/[year]:[hour]:[minute]:[second] [offset_hour sign:mandatory][offset_minute]"
    );
    let at = OffsetDateTime::parse(&rest[open + 1..close], format).map_err(|_| LineError::Time)?;
    let rest = rest[close + 1..].trim_start();
    let rest = rest.strip_prefix('"').ok_or(LineError::Request)?;
    let end = rest.find('"').ok_or(LineError::Request)?;
    let mut request = rest[..end].split(' ');
    let (Some(method), Some(target)) = (request.next(), request.next()) else {
        return Err(LineError::Request);
    };
    let method = Method::from_bytes(method.as_bytes()).map_err(|_| LineError::Request)?;
    if !target.starts_with('/') {
        return Err(LineError::Request);
    }
    let status = rest[end + 1..]
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or(LineError::Status)?;
    let at_ms = (at.unix_timestamp_nanos() / 1_000_000) as i64;
    Ok(Line {
        at_ms,
        ended_ms: at_ms,
        client,
        method,
        target: target.to_owned(),
        status,
        refused: None,
    })
}

fn json(line: &str) -> Result<Option<Line>, LineError> {
    let v: serde_json::Value =
        serde_json::from_str(line).map_err(|e| LineError::Json(e.to_string()))?;
    if v["target"] != "tollgate::access" {
        return Ok(None);
    }
    // `log.format: json` writes the fields beside the event's own keys;
    // a subscriber that nests them under `fields` is read too.
    let f = if v["fields"].is_object() {
        &v["fields"]
    } else {
        &v
    };
    let client = f["client"]
        .as_str()
        .and_then(|c| c.parse().ok())
        .ok_or(LineError::Client)?;
    let ended = v["timestamp"]
        .as_str()
        .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
        .ok_or(LineError::Time)?;
    let took = f["duration_ms"].as_f64().unwrap_or(0.0);
    let ended_ms = (ended.unix_timestamp_nanos() / 1_000_000) as i64;
    let method = f["method"]
        .as_str()
        .and_then(|m| Method::from_bytes(m.as_bytes()).ok())
        .ok_or(LineError::Request)?;
    let target = f["path"]
        .as_str()
        .filter(|p| p.starts_with('/'))
        .ok_or(LineError::Request)?;
    let status = f["status"]
        .as_u64()
        .and_then(|s| u16::try_from(s).ok())
        .ok_or(LineError::Status)?;
    let refused = f["rate_limit"].as_str().map(|r| r.starts_with("rejected:"));
    Ok(Some(Line {
        at_ms: ended_ms - took.round() as i64,
        ended_ms,
        client,
        method,
        target: target.to_owned(),
        status,
        refused,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_lines_give_the_client_time_request_and_status() {
        let l = parse(r#"203.0.113.7 - - [04/Dec/2026:10:01:02 +0100] "POST /login?next=%2F HTTP/1.1" 429 169 "-" "curl/8.5""#)
            .unwrap()
            .unwrap();
        assert_eq!(l.client, "203.0.113.7".parse::<IpAddr>().unwrap());
        assert_eq!(l.at_ms, 1_796_374_862_000);
        assert_eq!(
            (l.method, l.target.as_str(), l.status),
            (Method::POST, "/login?next=%2F", 429)
        );
        assert_eq!(l.refused, None);
        let v6 = parse(
            r#"2001:db8::1 - alice [04/Dec/2026:09:01:02 +0000] "GET / HTTP/2.0" 200 5 "-" "-""#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(v6.at_ms, 1_796_374_862_000, "the same instant in UTC");
    }

    #[test]
    fn tollgate_lines_give_the_arrival_and_whether_a_limit_refused() {
        let line = r#"{"timestamp":"2026-12-04T09:01:02.500Z","level":"INFO","fields":{"message":"request","listener":"public","client":"127.0.0.2","method":"GET","path":"/api","status":429,"route":"api","user":"-","rate_limit":"rejected:per_ip","upstream":"-","upstream_target":"-","duration_ms":0.4,"bytes":12,"aborted":false},"target":"tollgate::access"}"#;
        let l = parse(line).unwrap().unwrap();
        assert_eq!(l.at_ms, 1_796_374_862_500);
        assert_eq!(l.refused, Some(true));
        assert_eq!((l.target.as_str(), l.status), ("/api", 429));
        let flat = r#"{"timestamp":"2026-12-04T09:01:02.500Z","level":"INFO","message":"request","listener":"public","client":"127.0.0.2","method":"GET","path":"/","status":200,"rate_limit":"-","duration_ms":500.0,"target":"tollgate::access"}"#;
        let l = parse(flat).unwrap().unwrap();
        assert_eq!((l.at_ms, l.refused), (1_796_374_862_000, Some(false)));
        assert_eq!(l.ended_ms, 1_796_374_862_500);
        assert_eq!(duration_ms(flat.as_bytes()), Some(500.0));
        assert_eq!(duration_ms(line.as_bytes()), Some(0.4));
        let other = r#"{"timestamp":"2026-12-04T09:01:02Z","level":"INFO","fields":{"message":"listening"},"target":"tollgate"}"#;
        assert_eq!(duration_ms(other.as_bytes()), None);
        assert_eq!(parse(other), Ok(None));
        assert_eq!(parse(""), Ok(None));
    }

    #[test]
    fn malformed_lines_say_what_is_missing() {
        for (line, why) in [
            ("hello", LineError::Format),
            ("nope - - [x] \"GET / HTTP/1.1\" 200 0", LineError::Client),
            (
                "1.2.3.4 - - [04/Dec/2026:10:01:02] \"GET / HTTP/1.1\" 200 0",
                LineError::Time,
            ),
            (
                "1.2.3.4 - - [04/Dec/2026:10:01:02 +0000] \"\\x16\\x03\" 400 0",
                LineError::Request,
            ),
            (
                "1.2.3.4 - - [04/Dec/2026:10:01:02 +0000] \"GET / HTTP/1.1\" -",
                LineError::Status,
            ),
        ] {
            assert_eq!(parse(line), Err(why), "{line}");
        }
        assert!(matches!(parse("{\"target\":"), Err(LineError::Json(_))));
    }
}
