//! Requests decided together: each script call carries every request
//! queued when it leaves (up to `MAX_BATCH`), with the requests that the
//! same turn of the event loop woke (`gather`). Two calls may be in flight
//! on the one connection; while both are, new requests queue, and the next
//! call takes them when one answer is back. Under light load every request
//! goes alone, at once; under heavy load Redis runs one script per batch,
//! reads each key once and writes it once, so a hot key costs one GET and
//! one SET per batch instead of per request, and one client's requests in
//! a row go as one run (their keys and checks once). Decisions are exactly
//! those of separate calls, made one after the other in queue order within
//! one atomic script run; Redis runs the calls of one connection in the
//! order they were sent, so two in flight keep that order.
//!
//! Two calls, not one: with one, every request waits for the call in
//! flight before its own leaves, and at 64 connections nearly all of them
//! ride the same call, so the proxy and Redis take turns instead of
//! working together. With two, a request waits for at most one answer
//! before its own call leaves.
//! Fewer, larger calls would cost Redis less per request, and that is what
//! heavy load gets: once both calls are in flight the queue grows until
//! one is back.
//!
//! The batcher drives its calls itself rather than spawning a task per
//! call: a task is one more turn of the run queue before the call leaves.
//!
//! On a Redis Cluster a script call may only touch keys of one slot, so a
//! batch leaves as one call per slot, all at once: the cluster client
//! sends each to its slot's primary, and calls bound for one node share
//! that node's connection (written together, answered in one read). Each
//! call carries a receipt (see `function::once`), so the client's retry
//! after a redirect (MOVED, ASK: a reshard, a failover) or a dropped
//! connection never charges twice.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::Script;
use smallvec::SmallVec;
use tokio::sync::{mpsc, oneshot};

use redis::cluster_routing::Slot;

use super::conn::{Conn, Link};
use super::function::{evalsha_loading, Decide};
use super::nodes::{self, by_node, by_slot, slot_of, SlotMap};

/// Requests in one script call at most (Redis runs nothing else while a
/// script runs).
const MAX_BATCH: usize = 64;
/// Script calls in flight at once, each on the one multiplexed connection.
const IN_FLIGHT: usize = 2;

/// One request's part of a script call: its keys, and its checks as one
/// argument, "alg,p1,p2,p3,cost,peek,group,dry;..." (see decide.lua).
pub struct Job {
    /// Every key, one after the other; each ends where `ends` says.
    pub keys: String,
    pub ends: SmallVec<[usize; 4]>,
    pub spec: String,
    /// The overrides version its numbers were chosen under, checked by the
    /// script against the version key (see `limiter::overrides`).
    pub version: Option<u64>,
}

impl Job {
    /// The same keys and checks: one client's requests on one route.
    fn same(&self, other: &Job) -> bool {
        self.spec == other.spec
            && self.ends == other.ends
            && self.keys == other.keys
            && self.version == other.version
    }

    /// The Redis key of each check, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(a, &b)| &self.keys[a..b])
    }
}

/// A failed call: the message, and whether the connection itself broke.
pub type Failure = (String, bool);

/// The failure of a call the script refused because the overrides changed
/// (see `limiter::overrides`): Redis is fine.
pub const STALE: &str = "stale overrides";

/// The failure of a call whose slot was moving to another node for longer
/// than the cluster client's retries waited (TRYAGAIN): the cluster is
/// fine, so the breaker does not count it.
pub const MOVING: &str = "the key's slot is moving to another Redis node (TRYAGAIN)";

/// The script's clock and the request's decision numbers.
pub type Answer = Result<(u64, Vec<i64>), Failure>;

pub type Queued = (Job, oneshot::Sender<Answer>);

#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::UnboundedSender<Queued>,
}

impl Batcher {
    /// `link` may be a cluster's: each batch then leaves as one call per
    /// slot.
    pub fn start(
        link: Arc<Link>,
        decide: Arc<Decide>,
        timeout: Duration,
        calls: Arc<AtomicU64>,
        version_key: Arc<str>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, link, decide, timeout, calls, version_key));
        Batcher { tx }
    }

    /// Queues `job`; the answer arrives on the returned receiver.
    pub fn submit(&self, job: Job) -> oneshot::Receiver<Answer> {
        let (tx, rx) = oneshot::channel();
        // A closed queue (store shutting down) drops `tx`: the caller sees
        // its receiver fail and treats it as unavailable.
        let _ = self.tx.send((job, tx));
        rx
    }
}

async fn run(
    mut rx: mpsc::UnboundedReceiver<Queued>,
    link: Arc<Link>,
    decide: Arc<Decide>,
    timeout: Duration,
    calls: Arc<AtomicU64>,
    version_key: Arc<str>,
) {
    let slots = SlotMap::default();
    let mut flying = FuturesUnordered::new();
    // Whether requests may still come (false once the store is dropped):
    // the calls in flight still end, then the loop does.
    let mut open = true;
    loop {
        tokio::select! {
            // Answers first: the next call then takes what queued meanwhile.
            biased;
            Some(()) = flying.next(), if !flying.is_empty() => {}
            q = rx.recv(), if open && flying.len() < IN_FLIGHT => {
                let Some(q) = q else {
                    open = false;
                    continue;
                };
                let mut batch = Vec::with_capacity(MAX_BATCH);
                batch.push(q);
                fill(&mut rx, &mut batch);
                gather(&mut rx, &mut batch).await;
                // Callers that gave up (timed out) are not decided for nothing.
                batch.retain(|(_, reply)| !reply.is_closed());
                if !batch.is_empty() {
                    let how = (&*link, &*decide, &*calls, &*version_key, timeout);
                    flying.push(fly(how, &slots, batch));
                }
            }
            else => return,
        }
    }
}

/// One call for `batch`, its answers handed out as it ends, however it
/// ends.
async fn fly(how: How<'_>, slots: &SlotMap, batch: Vec<Queued>) {
    let (link, decide, calls, version_key, timeout) = how;
    if !link.is_cluster() {
        return answer(link, decide, calls, version_key, timeout, batch).await;
    }
    if slots.stale() {
        if let Ok((_, mut conn)) = link.get() {
            slots.refresh(&mut conn, timeout).await;
        }
    }
    let each = by_node(batch, slots)
        .into_iter()
        .map(|group| node_answer(how, slots, group));
    futures_util::future::join_all(each).await;
}

/// What a batch's calls need: the link, the script, the call counter, the
/// overrides' version key and the timeout.
type How<'a> = (&'a Link, &'a Decide, &'a AtomicU64, &'a str, Duration);

/// One node's jobs in one call (see `nodes`), or one call per slot when
/// that call found keys elsewhere or the servers cannot take it.
async fn node_answer(how: How<'_>, slots: &SlotMap, group: Vec<Queued>) {
    let (link, decide, calls, version_key, timeout) = how;
    let first = slot_of(&group[0].0).1;
    if slots.usable() && decide.by_node().is_some() {
        let (jobs, replies): (Vec<Job>, Vec<_>) = group.into_iter().unzip();
        match call_node(how, slots, &jobs, first).await {
            Ok(each) => {
                for (reply, answer) in replies.into_iter().zip(each) {
                    let _ = reply.send(Ok(answer));
                }
                return;
            }
            Err(Some(failure)) => {
                for reply in replies {
                    let _ = reply.send(Err(failure.clone()));
                }
                return;
            }
            // Misrouted: nothing written; one call per slot.
            Err(None) => {
                let group: Vec<Queued> = jobs.into_iter().zip(replies).collect();
                let each = by_slot(group)
                    .into_iter()
                    .map(|part| answer(link, decide, calls, version_key, timeout, part));
                futures_util::future::join_all(each).await;
                return;
            }
        }
    }
    let each = by_slot(group)
        .into_iter()
        .map(|part| answer(link, decide, calls, version_key, timeout, part));
    futures_util::future::join_all(each).await;
}

/// The node call for `jobs` (slots of one primary), sent to the primary of
/// `slot`: per job its numbers, a failure, or `None` when the call found
/// keys that are not on that node (nothing was written).
async fn call_node(
    (link, decide, calls, version_key, timeout): How<'_>,
    slots: &SlotMap,
    jobs: &[Job],
    slot: Slot,
) -> Result<Vec<(u64, Vec<i64>)>, Option<Failure>> {
    let forms = decide.by_node().ok_or(None)?;
    let (generation, mut conn) = link.get().map_err(|why| Some((why.to_owned(), false)))?;
    let first = jobs.first().and_then(|j| j.keys().next()).unwrap_or("");
    let receipt = Some(link.receipt(first, timeout).ok_or(None)?);
    let args = |cmd: &mut redis::Cmd| {
        cmd.arg(0);
        operands(cmd, (0, version_key), jobs, receipt.as_ref());
    };
    calls.fetch_add(1, Ordering::Relaxed);
    let sent = tokio::time::timeout(timeout, nodes::call_at(&mut conn, slot, forms, args)).await;
    let reply = match sent {
        Err(_) => {
            link.failed(None);
            let why = format!("Redis did not answer within {}ms", timeout.as_millis());
            return Err(Some((why, false)));
        }
        Ok(Err(e)) if nodes::misrouted(&e) || nodes::unflagged(&e) => {
            tracing::debug!(error = %super::describe(&e), "rate-limit store: a node's batch found keys elsewhere; one call per slot");
            if nodes::unflagged(&e) {
                slots.refuse();
            }
            slots.fallbacks.fetch_add(1, Ordering::Relaxed);
            slots.expire();
            return Err(None);
        }
        Ok(Err(e)) => {
            let broken = e.is_unrecoverable_error() || e.is_io_error();
            link.failed(broken.then_some(generation));
            return Err(Some((super::describe(&e), broken)));
        }
        Ok(Ok(reply)) => reply,
    };
    link.succeeded();
    numbers(&reply)
        .and_then(|values| split(&values, jobs))
        .ok_or_else(|| Some(("unexpected answer from the script".to_owned(), false)))
}

/// One call for `batch` (on a cluster, all of one slot), its answers
/// handed out.
async fn answer(
    link: &Link,
    decide: &Decide,
    calls: &AtomicU64,
    version_key: &str,
    timeout: Duration,
    batch: Vec<Queued>,
) {
    let (jobs, replies): (Vec<Job>, Vec<_>) = batch.into_iter().unzip();
    match call(link, decide, calls, (0, version_key), &jobs, timeout).await {
        Ok(each) => {
            for (reply, answer) in replies.into_iter().zip(each) {
                let _ = reply.send(Ok(answer));
            }
        }
        Err(failure) => {
            for reply in replies {
                let _ = reply.send(Err(failure.clone()));
            }
        }
    }
}

/// Lets the requests the event loop has already woken (heads read in the
/// same turn, answers just handed out) queue their jobs before the call
/// goes: one pass yields to every task ready now and to the I/O driver
/// (`yield_now` resumes after it is polled), then takes what they queued.
/// A request alone costs one more poll of the driver. One pass, not more:
/// with more, at 64 connections nearly every request waited for the same
/// call, and the proxy and Redis took turns.
async fn gather(rx: &mut mpsc::UnboundedReceiver<Queued>, batch: &mut Vec<Queued>) {
    if batch.len() < MAX_BATCH {
        tokio::task::yield_now().await;
        fill(rx, batch);
    }
}

/// Moves what is queued into `batch`, up to `MAX_BATCH`.
fn fill(rx: &mut mpsc::UnboundedReceiver<Queued>, batch: &mut Vec<Queued>) {
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(q) => batch.push(q),
            Err(_) => break,
        }
    }
}

/// One script call for `jobs` on the link's connection, counted in `calls`
/// and in the breaker: per job, the clock and its decision numbers.
/// `clock`: the time to decide at (0: Redis `TIME`) and the overrides'
/// version key.
pub async fn call(
    link: &Link,
    decide: &Decide,
    calls: &AtomicU64,
    clock: (u64, &str),
    jobs: &[Job],
    timeout: Duration,
) -> Result<Vec<(u64, Vec<i64>)>, Failure> {
    let (generation, mut conn) = link.get().map_err(|why| (why.to_owned(), false))?;
    let receipt = match &conn {
        Conn::Cluster(_) => {
            let first = jobs.first().and_then(|j| j.keys().next()).unwrap_or("");
            let receipt = link
                .receipt(first, timeout)
                .ok_or_else(|| ("a cluster key without a hash tag".to_owned(), false))?;
            Some(receipt)
        }
        Conn::Single(_) => None,
    };
    calls.fetch_add(1, Ordering::Relaxed);
    let result = invoke(&mut conn, decide, clock, (jobs, receipt), timeout).await;
    match &result {
        Ok(_) => link.succeeded(),
        Err((why, _)) if why == STALE || why == MOVING => link.succeeded(),
        Err((_, broken)) => link.failed(broken.then_some(generation)),
    }
    result
}

/// How long a receipt is kept at least: past every retry of its call (all
/// within the call's timeout), with room for Redis's and our clocks to
/// differ. Also the span of a receipts hash's time bucket, which is kept
/// twice as long from its last write.
pub fn keep(timeout: Duration) -> u64 {
    (timeout.as_millis() as u64 * 4).max(1000)
}

/// A call's receipt (a cluster's).
pub type Receipt = Option<super::conn::Receipt>;

/// One script call for `jobs`, bounded by `timeout` (loading the function
/// or script Redis lacks included): per job, the clock and its decision
/// numbers.
async fn invoke(
    conn: &mut Conn,
    decide: &Decide,
    clock: (u64, &str),
    (jobs, receipt): (&[Job], Receipt),
    timeout: Duration,
) -> Result<Vec<(u64, Vec<i64>)>, Failure> {
    let operands = |cmd: &mut redis::Cmd| operands(cmd, clock, jobs, receipt.as_ref());
    let reply = bounded(decide.call(conn, operands), timeout).await?;
    let values = numbers(&reply);
    if values.as_deref() == Some(&[-1]) {
        return Err((STALE.to_owned(), false));
    }
    values
        .and_then(|values| split(&values, jobs))
        .ok_or_else(|| ("unexpected answer from the script".to_owned(), false))
}

/// Appends the number of keys, the keys and the arguments of one call.
/// Jobs alike in a row (one client's burst: a flood, a NAT, a busy API
/// client) go as a run: their keys once, their spec once after "*<n>".
/// The script decides each of them as before; Redis is spared making
/// their arguments, about a quarter of what a request costs it.
/// With an overrides version, the version key comes last and the clock
/// argument is "<now>:<version>" (the oldest version of the jobs: the
/// script refuses the call unless it is Redis's). A receipt's key and
/// its time to keep come after everything.
fn operands(
    cmd: &mut redis::Cmd,
    (now, version_key): (u64, &str),
    jobs: &[Job],
    receipt: Option<&super::conn::Receipt>,
) {
    let runs: SmallVec<[&[Job]; 16]> = jobs.chunk_by(Job::same).collect();
    let keys: usize = runs.iter().map(|run| run[0].ends.len()).sum();
    let version = jobs.iter().filter_map(|j| j.version).min();
    cmd.arg(keys + usize::from(version.is_some()) + usize::from(receipt.is_some()));
    for run in &runs {
        for key in run[0].keys() {
            cmd.arg(key);
        }
    }
    if version.is_some() {
        cmd.arg(version_key);
    }
    if let Some(r) = receipt {
        cmd.arg(&r.key);
    }
    match version {
        Some(v) => {
            cmd.arg(format!("{now}:{v}"));
        }
        None => {
            cmd.arg(now);
        }
    }
    for run in runs {
        if run.len() > 1 {
            cmd.arg(format!("*{}", run.len()));
        }
        cmd.arg(&run[0].spec);
    }
    if let Some(r) = receipt {
        cmd.arg(&r.last);
    }
}

/// The script's answer, 8-byte big-endian integers, as numbers.
fn numbers(reply: &[u8]) -> Option<Vec<i64>> {
    if reply.is_empty() || !reply.len().is_multiple_of(8) {
        return None;
    }
    let word = |w: &[u8]| i64::from_be_bytes(w.try_into().unwrap_or_default());
    Some(reply.chunks_exact(8).map(word).collect())
}

/// Sends `cmd`, an `EVALSHA` of `script`; after `NOSCRIPT` (a restart, a
/// `SCRIPT FLUSH`) loads the script and sends it once more, all within
/// `timeout`.
pub async fn evalsha<T: redis::FromRedisValue>(
    conn: &mut Conn,
    script: &Script,
    cmd: &redis::Cmd,
    timeout: Duration,
) -> Result<T, Failure> {
    bounded(evalsha_loading(conn, script, cmd), timeout).await
}

/// `call` within `timeout`, its error as a [`Failure`].
async fn bounded<T>(
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
    timeout: Duration,
) -> Result<T, Failure> {
    match tokio::time::timeout(timeout, call).await {
        Err(_) => Err((
            format!("Redis did not answer within {}ms", timeout.as_millis()),
            false,
        )),
        Ok(Err(e)) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain) => {
            Err((MOVING.to_owned(), false))
        }
        Ok(Err(e)) => {
            let broken = e.is_unrecoverable_error() || e.is_io_error();
            Err((super::describe(&e), broken))
        }
        Ok(Ok(v)) => Ok(v),
    }
}

/// `now, (count, 3 x count numbers) per job` -> per job (now, numbers).
fn split(values: &[i64], jobs: &[Job]) -> Option<Vec<(u64, Vec<i64>)>> {
    let (&now, mut rest) = values.split_first()?;
    let now = u64::try_from(now).ok()?;
    let mut out = Vec::with_capacity(jobs.len());
    for job in jobs {
        let (&count, tail) = rest.split_first()?;
        let count = usize::try_from(count).ok()?;
        let checks = job.ends.len();
        if count > checks || tail.len() < count * super::STRIDE {
            return None;
        }
        let (mine, tail) = tail.split_at(count * super::STRIDE);
        out.push((now, mine.to_vec()));
        rest = tail;
    }
    rest.is_empty().then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_answer_reads_back_every_integer_or_nothing() {
        let packed = |ns: &[i64]| -> Vec<u8> { ns.iter().flat_map(|n| n.to_be_bytes()).collect() };
        // Lua doubles are exact to 2^53: such a count reads back whole.
        let values = [1764604800123, 2, 0, 0, 9, 1000, 0, 1 << 53, -1];
        assert_eq!(numbers(&packed(&values)), Some(values.to_vec()));
        let whole = packed(&values);
        for bad in [&whole[..0], &whole[..7], &whole[..whole.len() - 1]] {
            assert_eq!(numbers(bad), None, "{} bytes", bad.len());
        }
    }

    #[test]
    fn jobs_alike_in_a_row_go_once_after_their_count() {
        let job = |keys: &[&str], spec: &str| Job {
            keys: keys.concat(),
            ends: keys
                .iter()
                .scan(0, |end, k| {
                    *end += k.len();
                    Some(*end)
                })
                .collect(),
            spec: spec.to_owned(),
            version: None,
        };
        let zone = "6,1000,5,-1,1,0,0,0;";
        let two = "6,1000,5,-1,1,0,0,0;1,10,60000,0,1,0,1,0;";
        let a = || job(&["ip:a"], zone);
        let c = || job(&["ip:a", "u:1"], two);
        // The same keys split elsewhere are other checks: not alike.
        let c_split = job(&["ip:au", ":1"], two);
        let jobs = [a(), a(), a(), job(&["ip:b"], zone), a(), c(), c(), c_split];
        let mut cmd = redis::cmd("FCALL");
        operands(&mut cmd, (0, "v"), &jobs, None);
        let args: Vec<String> = cmd
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "(a cursor)".to_owned(),
            })
            .collect();
        let expect = [
            "FCALL", "7", "ip:a", "ip:b", "ip:a", "ip:a", "u:1", "ip:au", ":1", "0", "*3", zone,
            zone, zone, "*2", two, two,
        ];
        assert_eq!(args, expect);
    }

    #[test]
    fn an_answer_splits_into_each_jobs_decisions() {
        let job = |checks: usize| Job {
            keys: String::new(),
            ends: (0..checks).map(|_| 0).collect(),
            spec: String::new(),
            version: None,
        };
        let jobs = [job(2), job(1)];
        // The first request stopped after its first check; the second
        // decided its only one.
        let values = [7, 1, -61, 0, 60, 1, 0, 4, 1000];
        assert_eq!(
            split(&values, &jobs),
            Some(vec![(7, vec![-61, 0, 60]), (7, vec![0, 4, 1000])])
        );
        assert_eq!(split(&values[..8], &jobs), None, "a number short");
        assert_eq!(
            split(&[7, 3, 0, 0, 0, 0, 0], &jobs[1..]),
            None,
            "more decided than asked"
        );
    }
}
