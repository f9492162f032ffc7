//! `tollgate replay`: what a config would have done to the traffic of
//! access logs, decided by the running code itself.
//!
//! The logs' requests run in arrival order (a log is written as requests
//! end: see `Merged`) through a [`Pipeline`] built from
//! the config on the memory store and a [`FrozenClock`] moved to each
//! request's time: the same stages, the same limits, the same keys as in
//! production, with nothing sent anywhere (a request that would have been
//! forwarded is answered with the status the log holds, so a limit that
//! counts by status charges by it) and no wait for a zone's delay.
//!
//! - `log`: nginx's `combined` format and tollgate's JSON access log.
//! - `report`: per route and per limit, and how the replay's refusals
//!   compare with the log's.
//!
//! Memory stays bounded whatever the logs' length: the lines within the
//! reorder window per log (at most `MAX_HELD`), the memory store's zones
//! at their configured sizes, a fixed number of keys per limit for the
//! most refused.

mod log;
mod report;

use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, StatusCode};

pub use report::{diff, Report};

use crate::clock::FrozenClock;
use crate::config::{Config, KeyKind};
use crate::limiter::Engine;
use crate::pipeline::client_ip::ClientIp;
use crate::pipeline::conn::{ConnInfo, ConnState};
use crate::pipeline::Pipeline;

/// What to replay and how.
#[derive(Debug, Default, Clone)]
pub struct Options {
    pub logs: Vec<PathBuf>,
    /// The `Host` every request is given (no access log format here holds
    /// one): routes that match a host match only with it.
    pub host: Option<String>,
    /// Where to write one line per request replayed: its place in the
    /// log, the logged status, the replayed one, the limit that refused.
    pub decisions: Option<PathBuf>,
    /// How far apart a log's order and the requests' arrival may be: a
    /// request is replayed once no line after it in its log can have
    /// arrived earlier. `None`: the longest request in the logs
    /// (`duration_ms`; nginx's `combined` holds none, so 0).
    pub window: Option<Duration>,
}

/// `--window`: a duration as the config writes them ("900ms", "2s").
pub fn parse_window(text: &str) -> Result<Duration, String> {
    crate::config::units::parse_duration(text)
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{0}: {1}")]
    Read(String, io::Error),
    #[error("cannot write {0}: {1}")]
    Write(String, io::Error),
    #[error("cannot start: {0}")]
    Start(String),
}

/// Replays `options.logs` through `config`; `config_name` names it in the
/// report.
pub fn replay(
    mut config: Config,
    config_name: &str,
    options: &Options,
) -> Result<Report, ReplayError> {
    // Nothing leaves the replay: no alert webhook, no access log.
    config.alerts.webhook = None;
    config.log.access_log = false;
    let unknown = unknown(&config, options);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| ReplayError::Start(e.to_string()))?;
    runtime.block_on(async {
        let mut logs = Merged::open(&options.logs, options.window)?;
        let clock = match logs.first_ms() {
            Some(ms) => FrozenClock::at_unix_ms(u64::try_from(ms).unwrap_or(0)),
            None => FrozenClock::new(),
        };
        let engine = Engine::open(None, &config.store_zones, clock.clock())
            .await
            .map_err(ReplayError::Start)?;
        let refusals = refusal_statuses(&config);
        let listener: Arc<str> = config
            .listeners
            .first()
            .map(|l| Arc::from(l.name.as_str()))
            .unwrap_or_else(|| Arc::from("replay"));
        // A replay sends nothing anywhere: no spans either.
        config.traces = None;
        let pipeline = Pipeline::new(&mut config, engine);
        let state = Arc::new(ConnState::new(pipeline.metrics().listener_stats(0)));
        let mut report = Report::new(config_name, options, &pipeline, unknown, refusals);
        report.set_window(logs.window_ms());
        let mut decisions = match &options.decisions {
            Some(path) => {
                Some(BufWriter::new(File::create(path).map_err(|e| {
                    ReplayError::Write(path.display().to_string(), e)
                })?))
            }
            None => None,
        };
        let mut time = Virtual {
            clock: &clock,
            start: None,
            now: 0,
        };
        let host = options.host.as_deref().unwrap_or("replay.invalid");
        while let Some(item) = logs.next() {
            let (source, number, line) = match item? {
                Item::Line(source, number, line) => (source, number, line),
                Item::Malformed(source, number, why) => {
                    report.malformed(&options.logs[source], number, why.to_string());
                    continue;
                }
            };
            let (at, in_order) = time.move_to(line.at_ms);
            if !in_order {
                report.out_of_order();
            }
            let Some((mut req, logged)) = request(&line, host) else {
                report.malformed(
                    &options.logs[source],
                    number,
                    "a target or status http refuses".into(),
                );
                continue;
            };
            let conn = ConnInfo {
                listener: listener.clone(),
                peer: SocketAddr::new(line.client, 0),
                client: ClientIp::new(line.client),
                tls: false,
                state: state.clone(),
            };
            let replayed = pipeline.replay(&mut req, &conn, logged).await;
            let refused_by = report.add(&line, at, &replayed);
            if let Some(out) = decisions.as_mut() {
                let path = options.logs[source].display();
                writeln!(
                    out,
                    "{path}:{number}\t{}\t{}\t{}",
                    line.status,
                    replayed.status.as_u16(),
                    refused_by.unwrap_or("-")
                )
                .map_err(|e| ReplayError::Write("the decisions file".into(), e))?;
            }
        }
        if let Some(mut out) = decisions {
            out.flush()
                .map_err(|e| ReplayError::Write("the decisions file".into(), e))?;
        }
        Ok(report.finish())
    })
}

/// The replay's clock, moved to each request's time; it never goes back.
struct Virtual<'c> {
    clock: &'c FrozenClock,
    /// The first request's time (ms since the epoch), where it started.
    start: Option<i64>,
    /// Milliseconds it has been moved since.
    now: i64,
}

impl Virtual<'_> {
    /// Moves to `at_ms` (or stays, for a request logged before the one
    /// before it); the time the request is replayed at, and whether it
    /// came in order.
    fn move_to(&mut self, at_ms: i64) -> (i64, bool) {
        let start = *self.start.get_or_insert(at_ms);
        let offset = at_ms - start;
        if offset > self.now {
            self.clock
                .advance(Duration::from_millis((offset - self.now) as u64));
            self.now = offset;
        }
        (start + self.now, offset >= self.now)
    }
}

/// A logged request as the pipeline takes it, with the status the log
/// holds; `None` for a target or status `http` refuses. A request needs a
/// host: routes that match one match only what `--host` gives.
fn request(line: &log::Line, host: &str) -> Option<(Request<()>, StatusCode)> {
    let req = Request::builder()
        .method(line.method.clone())
        .uri(line.target.as_str())
        .header(http::header::HOST, host)
        .body(())
        .ok()?;
    Some((req, StatusCode::from_u16(line.status).ok()?))
}

/// The statuses a limit of `config` refuses with: 429, and the zones'.
fn refusal_statuses(config: &Config) -> Vec<u16> {
    let mut statuses: Vec<u16> = config.zones.iter().map(|z| z.status.as_u16()).collect();
    statuses.push(429);
    statuses.sort_unstable();
    statuses.dedup();
    statuses
}

/// What the config decides by that no access log holds, said once.
fn unknown(config: &Config, options: &Options) -> Vec<String> {
    let mut out = Vec::new();
    let zone_keys = config.zones.iter().map(|z| (z.limit.name.clone(), &z.key));
    let route_keys = config
        .routes
        .iter()
        .flat_map(|r| r.limits.iter().map(|l| (l.limit.name.clone(), &l.key)));
    let keys: Vec<_> = zone_keys.chain(route_keys).collect();
    let named = |pick: &dyn Fn(&KeyKind) -> bool| -> Vec<String> {
        keys.iter()
            .filter(|(_, k)| pick(k))
            .map(|(n, _)| n.to_string())
            .collect()
    };
    let headers = named(&|k| matches!(k, KeyKind::Header(_)));
    if !headers.is_empty() {
        out.push(format!("request headers: no access log holds them, so limits keyed on a header ({}) count no request", headers.join(", ")));
    }
    let users = named(&|k| matches!(k, KeyKind::User));
    let either = named(&|k| matches!(k, KeyKind::UserOrIp));
    if !users.is_empty() || !either.is_empty() || config.identity.is_some() {
        out.push(format!(
            "identity: no access log holds the JWT or API key, so every request is replayed anonymous: user limits ({}) count none, user_or_ip limits ({}) count by IP",
            or_none(&users),
            or_none(&either)
        ));
    }
    let hosts: Vec<String> = config
        .routes
        .iter()
        .filter(|r| r.host.is_some())
        .map(|r| r.name.to_string())
        .collect();
    if !hosts.is_empty() && options.host.is_none() {
        out.push(format!("host: no access log format here holds it, so routes that match a host ({}) match nothing; --host gives every request one", hosts.join(", ")));
    }
    if config.zones.iter().any(|z| z.max_conn.is_some()) {
        out.push("concurrency: a log does not say which requests overlapped, so max_conn never refuses in a replay".into());
    }
    if !config.bypass.token_hashes.is_empty() || config.bypass.header.is_some() {
        out.push(
            "bypass tokens: no access log holds them, so no request bypasses the limits by token"
                .into(),
        );
    }
    if config
        .routes
        .iter()
        .any(|r| r.webhook.as_ref().is_some_and(|w| w.verify.is_some()))
    {
        out.push("webhook signatures: no access log holds the body or its signature, so requests to routes that verify them are refused as unsigned".into());
    }
    out
}

fn or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// What the merged logs give next.
enum Item {
    /// (log index, line number, the request).
    Line(usize, u64, log::Line),
    Malformed(usize, u64, log::LineError),
}

/// The most requests of one log held back to be put in arrival order;
/// past it the earliest goes (and is counted out of order if it was).
const MAX_HELD: usize = 200_000;

/// One log being read: lines come in the order requests ended, and are
/// held until no later line can have arrived before them.
struct Reader {
    file: BufReader<File>,
    /// Lines read so far.
    number: u64,
    name: String,
    /// Requests read and not yet replayed, earliest arrival on top (ties
    /// in the log's order).
    held: BinaryHeap<std::cmp::Reverse<Held>>,
    /// The latest end of a request read so far: a later line ended no
    /// earlier, so it arrived no earlier than this less the window.
    last_end: i64,
    eof: bool,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Held {
    at_ms: i64,
    number: u64,
    line: HeldLine,
}

/// A line, ordered by nothing of its own (its place is `Held`'s).
struct HeldLine(log::Line);

impl PartialEq for HeldLine {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for HeldLine {}
impl PartialOrd for HeldLine {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for HeldLine {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

/// The logs read together in arrival order. A log is written as requests
/// end, so a request held long is logged after ones that arrived later:
/// each log's lines are held back until nothing later in it can have
/// arrived before them (within `window`, the longest a request took),
/// and the logs' earliest held requests are merged.
struct Merged {
    readers: Vec<Reader>,
    /// How far before the latest end a later line may have arrived.
    window: i64,
    /// (arrival, log, line number) of each log's next request, earliest
    /// on top.
    heap: BinaryHeap<std::cmp::Reverse<(i64, usize, u64)>>,
    problems: std::collections::VecDeque<Item>,
    buf: Vec<u8>,
}

impl Merged {
    /// `window`: given, or else the longest `duration_ms` in the logs
    /// (read once through first; combined logs hold none: 0).
    fn open(paths: &[PathBuf], window: Option<Duration>) -> Result<Merged, ReplayError> {
        let window = match window {
            Some(w) => w.as_millis() as i64,
            None => longest_duration(paths)?,
        };
        let mut readers = Vec::new();
        for path in paths {
            let file = File::open(path).map_err(|e| read_error(path, e))?;
            readers.push(Reader {
                file: BufReader::with_capacity(256 << 10, file),
                number: 0,
                name: path.display().to_string(),
                held: BinaryHeap::new(),
                last_end: i64::MIN,
                eof: false,
            });
        }
        let mut merged = Merged {
            readers,
            window,
            heap: BinaryHeap::new(),
            problems: Default::default(),
            buf: Vec::new(),
        };
        for i in 0..merged.readers.len() {
            merged.fill(i)?;
        }
        Ok(merged)
    }

    /// The window lines are put in order within (ms).
    fn window_ms(&self) -> i64 {
        self.window
    }

    /// Reads log `i` until its earliest held request can go (nothing
    /// later in the log can have arrived before it), noting malformed
    /// lines; then offers it to the merge.
    fn fill(&mut self, i: usize) -> Result<(), ReplayError> {
        let r = &mut self.readers[i];
        loop {
            if let Some(std::cmp::Reverse(top)) = r.held.peek() {
                let safe = r.last_end.saturating_sub(self.window);
                if r.eof || top.at_ms <= safe || r.held.len() >= MAX_HELD {
                    self.heap
                        .push(std::cmp::Reverse((top.at_ms, i, top.number)));
                    return Ok(());
                }
            } else if r.eof {
                return Ok(());
            }
            self.buf.clear();
            let n = r
                .file
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| ReplayError::Read(r.name.clone(), e))?;
            if n == 0 {
                r.eof = true;
                continue;
            }
            r.number += 1;
            let parsed = match std::str::from_utf8(&self.buf) {
                Ok(text) => log::parse(text),
                Err(_) => Err(log::LineError::Format),
            };
            match parsed {
                Ok(None) => {}
                Ok(Some(line)) => {
                    r.last_end = r.last_end.max(line.ended_ms);
                    r.held.push(std::cmp::Reverse(Held {
                        at_ms: line.at_ms,
                        number: r.number,
                        line: HeldLine(line),
                    }));
                }
                Err(why) => self.problems.push_back(Item::Malformed(i, r.number, why)),
            }
        }
    }

    /// The time of the earliest request of all.
    fn first_ms(&self) -> Option<i64> {
        self.heap.peek().map(|std::cmp::Reverse((ms, _, _))| *ms)
    }

    fn next(&mut self) -> Option<Result<Item, ReplayError>> {
        if let Some(problem) = self.problems.pop_front() {
            return Some(Ok(problem));
        }
        let std::cmp::Reverse((_, i, number)) = self.heap.pop()?;
        let std::cmp::Reverse(held) = self.readers[i].held.pop()?;
        debug_assert_eq!(held.number, number);
        if let Err(e) = self.fill(i) {
            return Some(Err(e));
        }
        Some(Ok(Item::Line(i, number, held.line.0)))
    }
}

/// The longest request in `paths` (ms), read off tollgate's JSON lines.
fn longest_duration(paths: &[PathBuf]) -> Result<i64, ReplayError> {
    let mut longest = 0f64;
    let mut buf = Vec::new();
    for path in paths {
        let file = File::open(path).map_err(|e| read_error(path, e))?;
        let mut file = BufReader::with_capacity(256 << 10, file);
        loop {
            buf.clear();
            let n = file
                .read_until(b'\n', &mut buf)
                .map_err(|e| read_error(path, e))?;
            if n == 0 {
                break;
            }
            if let Some(d) = log::duration_ms(&buf) {
                longest = longest.max(d);
            }
        }
    }
    Ok(longest.ceil() as i64)
}

fn read_error(path: &Path, e: io::Error) -> ReplayError {
    ReplayError::Read(path.display().to_string(), e)
}
