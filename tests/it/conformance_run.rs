//! Runs one conformance case against a proxy: a raw upstream that records
//! every byte it receives and answers with the case's replies, a raw
//! client that sends the case's bytes and reads what comes back. Shared by
//! the test (`conformance.rs`) and `examples/conformance_nginx.rs`, which
//! records nginx's answers for `docs/conformance.md`; so it depends on
//! nothing of the test suite.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long a connection must stay open after its answers to count as
/// kept.
const KEPT_AFTER: Duration = Duration::from_millis(400);
/// How long the answers may take.
const ANSWER_WITHIN: Duration = Duration::from_secs(8);
/// How long the upstream waits after the last bytes before it hands over
/// what it saw.
const UPSTREAM_QUIET: Duration = Duration::from_millis(300);

/// The fields tollgate adds to every request from 127.0.0.1 for host `a`,
/// written `{fwd}` in the corpus.
pub const FWD: &str = "x-forwarded-for: 127.0.0.1\r\nx-real-ip: 127.0.0.1\r\nx-forwarded-proto: http\r\nx-forwarded-host: a\r\n";

/// The upstream's answer to any request a case names no reply for.
pub const OK: &str = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub id: String,
    /// `client`: the bytes under test are the client's; `upstream`: the
    /// upstream's answer.
    pub leg: String,
    /// What the case is about, for the doc.
    pub about: String,
    /// The client's bytes.
    pub send: String,
    /// The upstream's answers, in order, one per request it receives
    /// (`<close>` at the end: it closes after writing); then `OK`.
    #[serde(default)]
    pub reply: Vec<String>,
    pub expect: Expect,
    /// Why tollgate's answer differs from nginx 1.22's (recorded in
    /// `tests/conformance/nginx.tsv`), where it does.
    #[serde(default)]
    pub why: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Each response's status, in order.
    pub status: Vec<u16>,
    /// `kept` or `closed`.
    pub conn: String,
    /// Exactly the bytes the upstream received, over all its connections
    /// (`{fwd}` stands for [`FWD`]); empty: none.
    pub upstream: String,
    /// How many connections the upstream was opened (default: 1 when it
    /// received bytes, else 0).
    #[serde(default)]
    pub upstream_conns: Option<usize>,
    /// Text each answer's head and body must contain, in order (`""`: no
    /// check for that one).
    #[serde(default)]
    pub contains: Vec<String>,
    /// Text no answer may contain.
    #[serde(default)]
    pub absent: Vec<String>,
}

/// What a case got.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    /// Each answer: the status and its head and body as text.
    pub answers: Vec<(u16, String)>,
    /// The connection closed after the answers (or before all came).
    pub closed: bool,
    /// What could not be read as HTTP (after the answers).
    pub garbage: String,
    pub upstream: String,
    pub upstream_conns: usize,
}

pub fn parse(yaml: &str) -> Vec<Case> {
    serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("tests/conformance/cases.yaml: {e}"))
}

impl Case {
    pub fn replies(&self) -> Vec<String> {
        self.reply.clone()
    }

    fn upstream_expected(&self) -> String {
        self.expect.upstream.replace("{fwd}", FWD)
    }

    /// `Err` with what differs from the expectation.
    pub fn check(&self, got: &Outcome) -> Result<(), String> {
        let statuses: Vec<u16> = got.answers.iter().map(|a| a.0).collect();
        if statuses != self.expect.status {
            return Err(format!(
                "statuses {statuses:?}, expected {:?}",
                self.expect.status
            ));
        }
        let conn = if got.closed { "closed" } else { "kept" };
        if conn != self.expect.conn {
            return Err(format!("connection {conn}, expected {}", self.expect.conn));
        }
        if !got.garbage.is_empty() {
            return Err(format!("bytes after the answers: {:?}", got.garbage));
        }
        let want = self.upstream_expected();
        if got.upstream != want {
            return Err(format!(
                "the upstream received {:?}, expected {want:?}",
                got.upstream
            ));
        }
        let conns = self
            .expect
            .upstream_conns
            .unwrap_or(usize::from(!want.is_empty()));
        if got.upstream_conns != conns {
            return Err(format!(
                "{} upstream connections, expected {conns}",
                got.upstream_conns
            ));
        }
        for (i, text) in self.expect.contains.iter().enumerate() {
            let answer = got.answers.get(i).map_or("", |a| a.1.as_str());
            if !answer.contains(text.as_str()) {
                return Err(format!("answer {i} lacks {text:?}: {answer:?}"));
            }
        }
        for text in &self.expect.absent {
            if got.answers.iter().any(|a| a.1.contains(text.as_str())) {
                return Err(format!("an answer holds {text:?}"));
            }
        }
        Ok(())
    }
}

/// One line per case: what it got, in the corpus's terms.
pub fn show(case: &Case, got: &Outcome) -> String {
    let statuses: Vec<u16> = got.answers.iter().map(|a| a.0).collect();
    format!(
        "{}: status {:?} {} upstream_conns {} upstream {:?}{}",
        case.id,
        statuses,
        if got.closed { "closed" } else { "kept" },
        got.upstream_conns,
        got.upstream.replace(FWD, "{fwd}"),
        if got.garbage.is_empty() {
            String::new()
        } else {
            format!(" garbage {:?}", got.garbage)
        }
    )
}

/// An upstream that records every byte and answers each whole request
/// with the next reply.
pub struct RawUpstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<(Vec<u8>, usize)>>,
}

impl RawUpstream {
    pub async fn spawn(replies: Vec<String>) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new((Vec::new(), 0)));
        let replies = Arc::new(Mutex::new(replies.into_iter()));
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                record.lock().unwrap().1 += 1;
                tokio::spawn(serve(s, record.clone(), replies.clone()));
            }
        });
        RawUpstream { addr, seen }
    }

    /// What it received, once quiet.
    pub async fn received(&self) -> (String, usize) {
        let mut last = usize::MAX;
        loop {
            tokio::time::sleep(UPSTREAM_QUIET).await;
            let (len, conns) = {
                let s = self.seen.lock().unwrap();
                (s.0.len(), s.1)
            };
            if len == last {
                let s = self.seen.lock().unwrap();
                return (String::from_utf8_lossy(&s.0).into_owned(), conns);
            }
            last = len;
            let _ = conns;
        }
    }
}

async fn serve(
    mut s: TcpStream,
    record: Arc<Mutex<(Vec<u8>, usize)>>,
    replies: Arc<Mutex<std::vec::IntoIter<String>>>,
) {
    let mut pending = Vec::new();
    let mut buf = [0u8; 16 << 10];
    let mut tunnel = false;
    loop {
        let n = match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        record.lock().unwrap().0.extend_from_slice(&buf[..n]);
        if tunnel {
            continue;
        }
        pending.extend_from_slice(&buf[..n]);
        while let Some(len) = request_len(&pending) {
            pending.drain(..len);
            let reply = replies
                .lock()
                .unwrap()
                .next()
                .unwrap_or_else(|| OK.to_owned());
            let (bytes, close) = match reply.strip_suffix("<close>") {
                Some(b) => (b.to_owned(), true),
                None => (reply, false),
            };
            if s.write_all(bytes.as_bytes()).await.is_err() {
                return;
            }
            if close {
                let _ = s.shutdown().await;
                // Reads on, to record what else arrives.
                tunnel = true;
                break;
            }
            if bytes.starts_with("HTTP/1.1 101") {
                tunnel = true;
                break;
            }
        }
    }
}

/// The length of the whole request at the front of `data`, if it is all
/// there: its head and a body by `Content-Length` or chunked.
fn request_len(data: &[u8]) -> Option<usize> {
    let end = data.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
    let field = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
    };
    if field("transfer-encoding:").is_some() {
        let mut at = end;
        loop {
            let line_end = data[at..].windows(2).position(|w| w == b"\r\n")? + at;
            let line = String::from_utf8_lossy(&data[at..line_end]);
            let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
            at = line_end + 2;
            if size == 0 {
                // Trailers, then the empty line.
                loop {
                    let e = data[at..].windows(2).position(|w| w == b"\r\n")? + at;
                    let empty = e == at;
                    at = e + 2;
                    if empty {
                        return Some(at);
                    }
                }
            }
            at += size + 2;
            if at > data.len() {
                return None;
            }
        }
    }
    let len: usize = field("content-length:")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (data.len() >= end + len).then_some(end + len)
}

/// Sends the case's bytes on `tcp` (a connection to the proxy), reads the
/// answers and whether the connection stays, then what the upstream saw.
pub async fn exchange(mut tcp: TcpStream, case: &Case, up: &RawUpstream) -> Outcome {
    let mut out = Outcome::default();
    let _ = tcp.write_all(case.send.as_bytes()).await;
    let head_request = case.send.starts_with("HEAD ");
    let mut data = Vec::new();
    let mut buf = [0u8; 16 << 10];
    let mut eof = false;
    let deadline = tokio::time::Instant::now() + ANSWER_WITHIN;
    // The answers, as many as expected (or until the close).
    while out.answers.len() < case.expect.status.len() {
        if let Some((status, len, text)) = response_at(&data, head_request, eof) {
            data.drain(..len);
            let switched = status == 101;
            out.answers.push((status, text));
            if switched {
                break;
            }
            continue;
        }
        if eof {
            break;
        }
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => eof = true,
            Ok(Ok(n)) => data.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    // Then whether it stays open.
    if !eof {
        let until = tokio::time::Instant::now() + KEPT_AFTER;
        loop {
            match tokio::time::timeout_at(until, tcp.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    eof = true;
                    break;
                }
                Ok(Ok(n)) => data.extend_from_slice(&buf[..n]),
                Err(_) => break,
            }
        }
    }
    out.closed = eof;
    if out.answers.last().is_none_or(|a| a.0 != 101) {
        out.garbage = String::from_utf8_lossy(&data).into_owned();
    }
    drop(tcp);
    (out.upstream, out.upstream_conns) = up.received().await;
    out
}

/// A whole response at the front of `data`: status, its length, its text.
fn response_at(data: &[u8], head_request: bool, eof: bool) -> Option<(u16, usize, String)> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let end = match resp.parse(data) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return None,
    };
    let status = resp.code?;
    let field = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
    };
    let bodiless = head_request || status < 200 || status == 204 || status == 304;
    let len = if bodiless {
        end
    } else if field("transfer-encoding").is_some() {
        let mut at = end;
        loop {
            let line_end = data[at..].windows(2).position(|w| w == b"\r\n")? + at;
            let line = String::from_utf8_lossy(&data[at..line_end]).into_owned();
            let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
            at = line_end + 2;
            if size == 0 {
                let e = data[at..].windows(2).position(|w| w == b"\r\n")? + at;
                break e + 2;
            }
            at += size + 2;
            if at > data.len() {
                return None;
            }
        }
    } else if let Some(n) = field("content-length").and_then(|v| v.parse::<usize>().ok()) {
        if data.len() < end + n {
            return None;
        }
        end + n
    } else if eof {
        data.len()
    } else {
        return None;
    };
    Some((
        status,
        len,
        String::from_utf8_lossy(&data[..len]).into_owned(),
    ))
}
