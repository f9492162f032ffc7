//! How `decide.lua` reaches Redis: as a function library where the server
//! has functions (Redis 7 and later, one node), else as an `EVALSHA`
//! script. Same code, same answers; the library is cheaper. A script runs
//! from the top on every call: it defines its functions and parses each
//! request's spec anew. A library's `make` runs once, at its first call,
//! and keeps both, which saves Redis the setup on every call
//! (docs/benchmarks.md has the instructions per call of each form).
//!
//! - The library is named after the script's hash (`tollgate_<hash>`), so
//!   replicas of different versions never replace each other's during a
//!   rolling upgrade. Libraries of older versions stay in Redis until
//!   `FUNCTION DELETE` removes them (a few KiB each).
//! - The first call tries `FCALL`; `Function not found` (a restart, a
//!   `FUNCTION FLUSH`) loads the library and calls again. A server that
//!   refuses to load it (no functions before Redis 7, a rename, an ACL
//!   without `FUNCTION`) is sent the script from then on, until restart.
//! - A cluster is always sent the script: a library would have to be
//!   loaded on every primary, and found missing on each separately. There
//!   the script runs once per receipt ([`once`]): the cluster client
//!   retries a call after a redirect or a dropped connection, and a call
//!   that had already run answers from its receipt instead of deciding
//!   (charging) again.

use std::sync::atomic::{AtomicU8, Ordering};

use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind};

use super::conn::Conn;

/// Whether the server takes the library: not known yet, yes, no.
const UNKNOWN: u8 = 0;
const YES: u8 = 1;
const NO: u8 = 2;

pub struct Decide {
    script: Script,
    /// A cluster's: what takes a node's jobs of several slots in one call
    /// (see `nodes`).
    node: Option<super::nodes::NodeForms>,
    library: String,
    function: String,
    functions: AtomicU8,
}

impl Decide {
    pub fn new(source: &str) -> Self {
        Self::made(source, false)
    }

    /// For a cluster: the script runs [`once`] per receipt.
    pub fn for_cluster(source: &str) -> Self {
        Self::made(source, true)
    }

    fn made(source: &str, receipts: bool) -> Self {
        let body = format!(
            "{source}\nif redis.replicate_commands then redis.replicate_commands() end\nreturn make()(KEYS, ARGV)\n"
        );
        let node = receipts.then(|| super::nodes::NodeForms::new(source, &once(&body)));
        let script = Script::new(&if receipts { once(&body) } else { body });
        let hash = &script.get_hash()[..16];
        let function = format!("tollgate_decide_{hash}");
        let library = format!(
            "#!lua name=tollgate_{hash}\n{source}\nlocal decide\nredis.register_function('{function}', function(keys, args)\n  decide = decide or make()\n  return decide(keys, args)\nend)\n"
        );
        Decide {
            script,
            node,
            library,
            function,
            functions: AtomicU8::new(UNKNOWN),
        }
    }

    /// The `EVALSHA` form.
    pub fn script(&self) -> &Script {
        &self.script
    }

    /// A cluster's forms for a node's jobs of several slots.
    pub fn by_node(&self) -> Option<&super::nodes::NodeForms> {
        self.node.as_ref()
    }

    /// The library's text, for `FUNCTION LOAD`.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// The name `FCALL` calls.
    pub fn function(&self) -> &str {
        &self.function
    }

    /// Whether calls go to the library (`Some(true)`) or the script
    /// (`Some(false)`); `None` until a call has told.
    pub fn as_function(&self) -> Option<bool> {
        match self.functions.load(Ordering::Relaxed) {
            YES => Some(true),
            NO => Some(false),
            _ => None,
        }
    }

    /// One call: `FCALL` where it can, else `EVALSHA` (loading the library
    /// or the script when Redis lacks it). `operands` appends the number of
    /// keys, the keys and the arguments. The caller bounds it in time.
    pub async fn call(
        &self,
        conn: &mut Conn,
        operands: impl Fn(&mut Cmd),
    ) -> Result<Vec<u8>, RedisError> {
        if matches!(conn, Conn::Single(_)) && self.functions.load(Ordering::Relaxed) != NO {
            let mut fcall = redis::cmd("FCALL");
            fcall.arg(&self.function);
            operands(&mut fcall);
            match fcall.query_async::<Vec<u8>>(conn).await {
                Err(e) if missing(&e) => {}
                Ok(answer) => {
                    self.set(YES);
                    return Ok(answer);
                }
                Err(e) => return Err(e),
            }
            if self.load(conn).await?.is_none() {
                return fcall.query_async(conn).await;
            }
        }
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(self.script.get_hash());
        operands(&mut evalsha);
        evalsha_loading(conn, &self.script, &evalsha).await
    }

    /// `FUNCTION LOAD REPLACE` of the library (the caller bounds it in
    /// time): `None` once loaded; why, when the server refused it (no
    /// functions, a rename, an ACL), and calls go by script from then on.
    /// An error is the connection's.
    pub async fn load(&self, conn: &mut Conn) -> Result<Option<String>, RedisError> {
        let loaded = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&self.library)
            .query_async::<String>(conn)
            .await;
        match loaded {
            Ok(_) => {
                self.set(YES);
                Ok(None)
            }
            Err(e) if matches!(e.kind(), ErrorKind::Server(_)) => {
                let why = super::describe(&e);
                if self.functions.load(Ordering::Relaxed) != NO {
                    tracing::info!(error = %why, "rate-limit store: Redis did not load the decide function; decisions are sent as a script (EVALSHA) instead, which costs Redis more per call");
                }
                self.set(NO);
                Ok(Some(why))
            }
            Err(e) => Err(e),
        }
    }

    fn set(&self, to: u8) {
        if self.functions.load(Ordering::Relaxed) != to {
            self.functions.store(to, Ordering::Relaxed);
            if to == YES {
                tracing::debug!(function = %self.function, "rate-limit store: decisions run as a Redis function");
            }
        }
    }
}

/// Sends `cmd`, an `EVALSHA` of `script`; after `NOSCRIPT` (a restart, a
/// `SCRIPT FLUSH`) loads the script and sends it once more.
pub async fn evalsha_loading<T: redis::FromRedisValue>(
    conn: &mut Conn,
    script: &Script,
    cmd: &Cmd,
) -> Result<T, RedisError> {
    match cmd.query_async::<T>(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(conn).await?;
            cmd.query_async::<T>(conn).await
        }
        other => other,
    }
}

/// `script` made to run once per receipt: its last key names a hash of
/// receipts (in the slot of its other keys), its last argument the call's
/// field in it and how long to keep the hash, `<field>:<ms>`. The first
/// run decides and stores its answer under its field, in the same atomic
/// step as its writes (so a failover keeps both or neither); a run that
/// finds its field answers from it and changes nothing. The script itself
/// sees its keys and arguments without them.
///
/// One hash per hash tag and time bucket (a few seconds), not a key per
/// call: while a slot moves, a call whose keys are partly moved is
/// refused (TRYAGAIN) until they are all on one node, and a key made per
/// call is one that is always missing, and one more to move.
pub fn once(script: &str) -> String {
    format!(
        "local receipt = KEYS[#KEYS]
local id, keep = string.match(ARGV[#ARGV], '^(.*):(%d+)$')
local done = redis.call('HGET', receipt, id)
if done then return done end
local keys, argv = {{}}, {{}}
for i = 1, #KEYS - 1 do keys[i] = KEYS[i] end
for i = 1, #ARGV - 1 do argv[i] = ARGV[i] end
local answer = (function(KEYS, ARGV)
{script}
end)(keys, argv)
redis.call('HSET', receipt, id, answer)
redis.call('PEXPIRE', receipt, keep)
return answer
"
    )
}

/// The receipts key of time bucket `bucket` for a call whose first key is
/// `key`: the same hash tag (so the same slot) and prefix, then
/// `:once:<bucket>`. `None` when the key has no hash tag (then its slot is
/// its whole name's).
pub fn receipt(key: &str, bucket: u64) -> Option<String> {
    let open = key.find('{')?;
    let close = open + 1 + key[open + 1..].find('}')?;
    (close > open + 1).then(|| format!("{}:once:{bucket:x}", &key[..=close]))
}

/// The server does not have the function, or cannot run functions at all.
pub fn missing(e: &RedisError) -> bool {
    match e.kind() {
        ErrorKind::Server(ServerErrorKind::NoPerm) => true,
        ErrorKind::Server(ServerErrorKind::ResponseError) => {
            let said = e.detail().unwrap_or_default().to_ascii_lowercase();
            said.contains("function not found") || said.contains("unknown command")
        }
        _ => false,
    }
}
