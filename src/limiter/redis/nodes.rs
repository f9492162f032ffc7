//! A cluster batch by node: the jobs of one batch whose slots one primary
//! serves go to it in one script call, as on a single Redis, instead of
//! one call per slot. The call declares no keys (a declared key pins a
//! call to one slot): the keys travel as arguments, the script is flagged
//! `allow-cross-slot-keys` (Redis 7), and it is sent to the primary of
//! its first job's slot.
//!
//! - Which slots share a primary comes from `CLUSTER SLOTS`, read at the
//!   first batch and every [`REFRESH`]. The map only groups: a group whose
//!   keys are not all on the node the call reaches (a reshard, a failover
//!   the map has not seen) fails in the script before it writes anything
//!   ("non local key"), and its jobs go again one call per slot, with the
//!   cluster client's redirects; the map is read again at once.
//! - A server that refuses the flag (before Redis 7) is sent one call per
//!   slot from then on.
//! - The receipt (see `function::once`) is a key of the first job's slot,
//!   on the node the call runs on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind, Value};

use super::batch::{Job, Queued};
use super::conn::Conn;

/// How often the slot map is read again.
const REFRESH: Duration = Duration::from_secs(5);

/// (first, last, primary) per range, and when they were read.
type Ranges = (Vec<(u16, u16, u32)>, Option<Instant>);

/// The primaries' slot ranges, as last read.
#[derive(Default)]
pub struct SlotMap {
    ranges: Mutex<Ranges>,
    /// A refresh is under way.
    reading: AtomicBool,
    /// The server refused the flagged script: per slot from now on.
    refused: AtomicBool,
    /// Node calls that fell back to one call per slot.
    pub fallbacks: AtomicU64,
}

impl SlotMap {
    /// The node serving `slot` (an index into the map's primaries), if
    /// known and the map is usable.
    pub fn node(&self, slot: u16) -> Option<u32> {
        if self.refused.load(Ordering::Relaxed) {
            return None;
        }
        let map = self.ranges.lock().unwrap_or_else(|e| e.into_inner());
        map.0
            .iter()
            .find(|(a, b, _)| *a <= slot && slot <= *b)
            .map(|(_, _, n)| *n)
    }

    /// Whether node calls may be made (the servers took the flag).
    pub fn usable(&self) -> bool {
        !self.refused.load(Ordering::Relaxed)
    }

    /// Whether the map should be read again now.
    pub fn stale(&self) -> bool {
        let map = self.ranges.lock().unwrap_or_else(|e| e.into_inner());
        map.1.is_none_or(|at| at.elapsed() >= REFRESH) && !self.refused.load(Ordering::Relaxed)
    }

    /// Reads `CLUSTER SLOTS` (one reader at a time; failures leave the
    /// old map).
    pub async fn refresh(&self, conn: &mut Conn, timeout: Duration) {
        if self.reading.swap(true, Ordering::Relaxed) {
            return;
        }
        let read = tokio::time::timeout(
            timeout.max(Duration::from_millis(200)),
            redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async::<Value>(conn),
        )
        .await;
        if let Ok(Ok(v)) = read {
            let ranges = parse_slots(&v);
            if !ranges.is_empty() {
                *self.ranges.lock().unwrap_or_else(|e| e.into_inner()) =
                    (ranges, Some(Instant::now()));
            }
        } else {
            // Try again at the next batch, not at once.
            self.ranges.lock().unwrap_or_else(|e| e.into_inner()).1 = Some(Instant::now());
        }
        self.reading.store(false, Ordering::Relaxed);
    }

    /// Forgets when the map was read: the next batch reads it again.
    pub fn expire(&self) {
        self.ranges.lock().unwrap_or_else(|e| e.into_inner()).1 = None;
    }

    pub fn refuse(&self) {
        if !self.refused.swap(true, Ordering::Relaxed) {
            tracing::info!("rate-limit store: the cluster refused a script flagged allow-cross-slot-keys (Redis before 7?); a batch goes as one call per slot");
        }
    }
}

/// `CLUSTER SLOTS` -> (first, last, primary) per range, primaries
/// numbered by their address.
fn parse_slots(v: &Value) -> Vec<(u16, u16, u32)> {
    let Value::Array(ranges) = v else {
        return Vec::new();
    };
    let mut nodes: Vec<Vec<u8>> = Vec::new();
    let mut out = Vec::new();
    for r in ranges {
        let Value::Array(f) = r else { continue };
        let (Some(Value::Int(a)), Some(Value::Int(b)), Some(Value::Array(primary))) =
            (f.first(), f.get(1), f.get(2))
        else {
            continue;
        };
        let addr: Vec<u8> = primary
            .iter()
            .take(2)
            .flat_map(|p| match p {
                Value::BulkString(s) => s.clone(),
                Value::Int(n) => n.to_string().into_bytes(),
                _ => Vec::new(),
            })
            .collect();
        let n = match nodes.iter().position(|x| *x == addr) {
            Some(n) => n,
            None => {
                nodes.push(addr);
                nodes.len() - 1
            }
        };
        out.push((*a as u16, *b as u16, n as u32));
    }
    out
}

/// The Redis Cluster slot of `key`: CRC16/XMODEM of its hash tag (the
/// part between the first `{` and the next `}`, when not empty), else of
/// the whole key, modulo 16384.
pub fn slot(key: &str) -> u16 {
    let b = key.as_bytes();
    let tag = b.iter().position(|c| *c == b'{').and_then(|open| {
        let close = b[open + 1..].iter().position(|c| *c == b'}')?;
        (close > 0).then(|| &b[open + 1..open + 1 + close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(b)) % 16384
}

/// Whether `e` says the call's keys were not all on the node it reached
/// (or the server cannot run the flagged script): nothing was written.
pub fn misrouted(e: &RedisError) -> bool {
    let said = e.detail().unwrap_or_default().to_ascii_lowercase();
    said.contains("non local key")
        || said.contains("do not hash to the same slot")
        || said.contains("not served")
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
        )
}

/// Whether `e` says the server does not know the script's flags.
pub fn unflagged(e: &RedisError) -> bool {
    let said = e.detail().unwrap_or_default().to_ascii_lowercase();
    said.contains("unexpected flag") || said.contains("shebang") || said.contains("unknown lua")
}

/// A node call, `operands` (the number of keys 0, then the arguments)
/// sent to the primary of `slot`: `FCALL` of the library, loaded there
/// when missing, or `EVALSHA` of the script (loaded when missing) where
/// the servers refuse the library.
pub async fn call_at(
    conn: &mut Conn,
    slot: Slot,
    forms: &NodeForms,
    operands: impl Fn(&mut Cmd),
) -> Result<Vec<u8>, RedisError> {
    let Conn::Cluster(c) = conn else {
        return Err(RedisError::from((ErrorKind::Client, "not a cluster")));
    };
    let route = || {
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_slot(
            slot,
            SlotAddr::Master,
        )))
    };
    // (a routed command's server error comes back as a value)
    let mut send = async |cmd: &Cmd| c.route_command(cmd.clone(), route()).await?.extract_error();
    if !forms.no_library.load(Ordering::Relaxed) {
        let mut fcall = redis::cmd("FCALL");
        fcall.arg(&forms.function);
        operands(&mut fcall);
        match send(&fcall).await {
            Err(e) if super::function::missing(&e) => {
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg("REPLACE").arg(&forms.library);
                match send(&load).await {
                    Ok(_) => return Ok(redis::from_redis_value(send(&fcall).await?)?),
                    Err(e) if matches!(e.kind(), ErrorKind::Server(_)) => {
                        tracing::info!(error = %super::describe(&e), "rate-limit store: a cluster node did not load the decide function; node calls go as a script (EVALSHA) instead");
                        forms.no_library.store(true, Ordering::Relaxed);
                    }
                    Err(e) => return Err(e),
                }
            }
            other => return Ok(redis::from_redis_value(other?)?),
        }
    }
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha.arg(forms.script.get_hash());
    operands(&mut evalsha);
    let answer = match send(&evalsha).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(&forms.script_text);
            send(&load).await?;
            send(&evalsha).await?
        }
        other => other?,
    };
    Ok(redis::from_redis_value(answer)?)
}

/// decide.lua for a node's jobs: its keys taken from its arguments
/// (ARGV[1] the number of keys n, the receipt's last; ARGV[2 .. n + 1] the
/// keys; the rest its arguments, how long to keep the receipt last), run
/// once per receipt, flagged so it may touch keys of several slots of its
/// node. As a function library, loaded on each primary the first time a
/// call finds it missing there (its `make` runs once per node, as on a
/// single Redis); as a script where a server refuses the library.
pub struct NodeForms {
    pub library: String,
    pub function: String,
    pub script: Script,
    pub script_text: String,
    /// The servers refused the library: the script from now on.
    pub no_library: AtomicBool,
}

impl NodeForms {
    /// From decide.lua's `source` and its once-wrapped script form.
    pub fn new(source: &str, once_script: &str) -> Self {
        let script_text = format!(
            "#!lua flags=allow-cross-slot-keys
local n = tonumber(ARGV[1])
local keys, argv = {{}}, {{}}
for i = 1, n do keys[i] = ARGV[i + 1] end
for i = n + 2, #ARGV do argv[#argv + 1] = ARGV[i] end
return (function(KEYS, ARGV)
{once_script}
end)(keys, argv)
"
        );
        let script = Script::new(&script_text);
        let hash = &script.get_hash()[..16];
        let function = format!("tollgate_node_{hash}");
        let library = format!(
            "#!lua name=tollgate_node_{hash}
{source}
local decide
redis.register_function{{function_name = '{function}', flags = {{ 'allow-cross-slot-keys' }}, callback = function(_, args)
  local n = tonumber(args[1])
  local keys, argv = {{}}, {{}}
  for i = 1, n - 1 do keys[i] = args[i + 1] end
  for i = n + 2, #args - 1 do argv[#argv + 1] = args[i] end
  local receipt = args[n + 1]
  local id, keep = string.match(args[#args], '^(.*):(%d+)$')
  local done = redis.call('HGET', receipt, id)
  if done then return done end
  decide = decide or make()
  local answer = decide(keys, argv)
  redis.call('HSET', receipt, id, answer)
  redis.call('PEXPIRE', receipt, keep)
  return answer
end}}
"
        );
        NodeForms {
            library,
            function,
            script,
            script_text,
            no_library: AtomicBool::new(false),
        }
    }
}

/// A cluster batch split by the primary the slot map says serves each
/// job's slot (by slot where it does not know).
pub fn by_node(batch: Vec<Queued>, slots: &SlotMap) -> Vec<Vec<Queued>> {
    let mut nodes: Vec<(u32, Vec<Queued>)> = Vec::new();
    for q in batch {
        let slot = slot_of(&q.0).0;
        let node = slots.node(slot).unwrap_or(1 << 16 | u32::from(slot));
        match nodes.iter_mut().find(|(n, _)| *n == node) {
            Some((_, group)) => group.push(q),
            None => nodes.push((node, vec![q])),
        }
    }
    nodes.into_iter().map(|(_, group)| group).collect()
}

/// A job's slot (a job's keys share one) and its number.
pub fn slot_of(job: &Job) -> (u16, Slot) {
    let n = slot(job.keys().next().unwrap_or_default());
    (n, Slot::new(n).unwrap_or_else(|| Slot::for_key("")))
}

/// `batch` split by the slot of each job's keys (a job's keys share one:
/// the store splits a request by client key on a cluster), in queue order
/// within each slot.
pub fn by_slot(batch: Vec<Queued>) -> Vec<Vec<Queued>> {
    let mut slots: Vec<(Slot, Vec<Queued>)> = Vec::new();
    for q in batch {
        let slot = slot_of(&q.0).1;
        match slots.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, part)) => part.push(q),
            None => slots.push((slot, vec![q])),
        }
    }
    slots.into_iter().map(|(_, part)| part).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_slot_is_the_clusters() {
        // `CLUSTER KEYSLOT` of each.
        assert_eq!(slot("user:1"), 10778);
        assert_eq!(slot("user:2"), 6777);
        assert_eq!(slot("user:{42}:profile"), 8000);
        assert_eq!(slot("user:{42}:cart"), 8000);
        // An empty tag is no tag: the whole key (as the client's).
        for key in ["tollgate:{ip:203.0.113.7}:api", "a{}b", "{", "}{x}", ""] {
            assert_eq!(Slot::new(slot(key)), Some(Slot::for_key(key)), "{key}");
        }
    }

    #[test]
    fn cluster_slots_read_as_ranges_per_primary() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |a: i64, b: i64, port: i64| {
            Value::Array(vec![
                Value::Int(a),
                Value::Int(b),
                node(port),
                node(port + 3),
            ])
        };
        let v = Value::Array(vec![
            range(0, 5460, 7000),
            range(5461, 10922, 7001),
            range(10923, 16383, 7002),
            range(100, 100, 7000),
        ]);
        assert_eq!(
            parse_slots(&v),
            vec![
                (0, 5460, 0),
                (5461, 10922, 1),
                (10923, 16383, 2),
                (100, 100, 0)
            ]
        );
    }
}
