//! Real `redis-server` processes for the tests: one node, or a 3-node
//! cluster built with `redis-cli --cluster create`, each on free loopback
//! ports, with no persistence, killed when dropped. A port taken between
//! picking it and the server binding it is picked again; each server logs
//! to its temp dir, and the log is printed when it fails to start or when
//! the test using it fails. Starting blocks while the server comes up;
//! on a multi-thread runtime the worker's other tasks move to another
//! worker meanwhile (`block_in_place`), so a restart mid-load stalls none
//! of them.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

pub fn need(tool: &str) {
    let found = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        found,
        "{tool} is not installed; the Redis tests need it: apt-get install -y redis-server (scripts/test does this)"
    );
}

/// Runs `f`, which blocks, without holding up the runtime's other tasks
/// where the runtime can hand them to another worker.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// A port free now whose cluster bus port (+10000) is free too.
fn free_port() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    cluster: bool,
    /// More `redis-server` arguments (TLS, ACL users), after the defaults.
    extra: Vec<String>,
    /// `redis-cli` arguments to reach it (TLS, credentials).
    cli_extra: Vec<String>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        Self::launch(false, |_| (vec![], vec![]))
    }

    /// With more server arguments and the `redis-cli` arguments that reach
    /// it, both made from the port.
    pub fn start_with(args: impl Fn(u16) -> (Vec<String>, Vec<String>)) -> RedisServer {
        Self::launch(false, args)
    }

    fn launch(cluster: bool, args: impl Fn(u16) -> (Vec<String>, Vec<String>)) -> RedisServer {
        need("redis-server");
        need("redis-cli");
        let mut tries = 0;
        loop {
            let port = free_port();
            let (extra, cli_extra) = args(port);
            let mut server = RedisServer {
                port,
                child: None,
                dir: tempfile::tempdir().unwrap(),
                cluster,
                extra,
                cli_extra,
            };
            match server.try_start() {
                Ok(()) => return server,
                // Someone took the port meanwhile: another one.
                Err(log) if log.contains("Address already in use") && tries < 5 => tries += 1,
                Err(log) => panic!("redis-server did not start on {port}; its log:\n{log}"),
            }
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// Starts (again) on the same port, empty.
    pub fn restart(&mut self) {
        if let Err(log) = self.try_start() {
            panic!(
                "redis-server did not start again on {}; its log:\n{log}",
                self.port
            );
        }
    }

    /// Starts the server and waits until it answers, or it exits (its log
    /// is the error); up to 10 s.
    fn try_start(&mut self) -> Result<(), String> {
        blocking(|| self.start_and_wait())
    }

    #[allow(clippy::disallowed_methods)]
    fn start_and_wait(&mut self) -> Result<(), String> {
        let port = self.port.to_string();
        let mut args = vec![
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--logfile",
            "redis.log",
        ];
        if self.cluster {
            args.extend(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]);
        }
        let child = Command::new("redis-server")
            .args(&args)
            .args(&self.extra)
            .current_dir(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.try_cli(&["PING"]).as_deref() != Some("PONG") {
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if exited || Instant::now() >= deadline {
                self.kill();
                return Err(self.log());
            }
            // Polls the server until it is up, not ordering test events.
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A config's `store:` line for this server (2 s timeout), with
    /// `extra` settings appended (`, cache_rejections: true`).
    pub fn store_yaml(&self, extra: &str) -> String {
        format!(
            "store: {{ kind: redis, url: '{}', timeout: 2s{extra} }}",
            self.url()
        )
    }

    fn try_cli(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.cli_extra)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Runs a `redis-cli` command on this node and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|| panic!("redis-cli {args:?} failed"))
    }

    /// `calls` of one command in `INFO commandstats` (0 if never run).
    pub fn calls(&self, command: &str) -> u64 {
        let stats = self.cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// The count of the fixed window held by the one key under `pattern`
    /// (its state "F:<window start>:<count>|<numbers>"); 0 without one.
    pub fn window_count(&self, pattern: &str) -> u64 {
        let key = self.cli(&["--scan", "--pattern", pattern]);
        let state = self.cli(&["GET", key.trim()]);
        state
            .split(['|', ':'])
            .nth(2)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Decision calls so far: `FCALL` (a function library) and `EVALSHA`
    /// (a script) together.
    pub fn script_calls(&self) -> u64 {
        self.calls("fcall") + self.calls("evalsha")
    }

    /// Keys (from `SCAN`) under `pattern` that have no TTL.
    pub fn keys_without_ttl(&self, pattern: &str) -> Vec<String> {
        let keys = self.cli(&["--scan", "--pattern", pattern]);
        keys.lines()
            .filter(|k| !k.is_empty())
            .filter(|k| self.cli(&["PTTL", k]) == "-1")
            .map(str::to_owned)
            .collect()
    }

    pub fn key_count(&self, pattern: &str) -> usize {
        self.cli(&["--scan", "--pattern", pattern])
            .lines()
            .filter(|k| !k.is_empty())
            .count()
    }

    /// Connected clients as `(deciding, subscribed)`: connections that send
    /// commands, and pub/sub subscriptions (resets); `redis-cli` asking is
    /// not counted.
    pub fn clients(&self) -> (usize, usize) {
        let list = self.cli(&["CLIENT", "LIST"]);
        let others = list.lines().filter(|l| !l.contains("cmd=client|list"));
        let (subscribed, deciding): (Vec<&str>, Vec<&str>) =
            others.partition(|l| l.contains(" flags=P "));
        (deciding.len(), subscribed.len())
    }

    /// SIGKILL: the server is gone at once, connections reset.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP / SIGCONT: connections stay open but nothing answers.
    pub fn pause(&self, paused: bool) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let sig = if paused { "-STOP" } else { "-CONT" };
        assert!(Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success());
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("redis-server on {} logged:\n{}", self.port, self.log());
        }
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
        }
        self.kill();
    }
}

/// Three masters, slots split by `redis-cli --cluster create`; with
/// [`RedisCluster::start_replicated`], a replica of each too.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        blocking(|| Self::start_blocking(0))
    }

    /// Three primaries and a replica of each (six nodes).
    pub fn start_replicated() -> RedisCluster {
        blocking(|| Self::start_blocking(1))
    }

    #[allow(clippy::disallowed_methods)]
    fn start_blocking(replicas: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| RedisServer::launch(true, |_| (vec![], vec![])))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in &nodes {
            while !n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
                || n.cli(&["INFO", "replication"])
                    .contains("master_link_status:down")
            {
                assert!(Instant::now() < deadline, "cluster did not become ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        RedisCluster { nodes }
    }

    /// The slot of `key`.
    pub fn slot(&self, key: &str) -> u16 {
        self.live()
            .cli(&["CLUSTER", "KEYSLOT", key])
            .parse()
            .unwrap()
    }

    fn live(&self) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.try_cli(&["PING"]).as_deref() == Some("PONG"))
            .expect("a live node")
    }

    /// The index of the node serving `slot` as a primary, as the live
    /// nodes see it.
    pub fn owner(&self, slot: u16) -> Option<usize> {
        let nodes = self.live().cli(&["CLUSTER", "NODES"]);
        let line = nodes.lines().find(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            f.len() > 8
                && f[2].contains("master")
                && !f[2].contains("fail")
                && f[8..].iter().any(|r| {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if a <= slot && slot <= b)
                })
        })?;
        let port: u16 = line
            .split(' ')
            .nth(1)?
            .split([':', '@'])
            .nth(1)?
            .parse()
            .ok()?;
        self.nodes.iter().position(|n| n.port == port)
    }

    /// Moves `slot` and its keys from node `from` to node `to` (both
    /// primaries), as `redis-cli --cluster reshard` does, slot by slot:
    /// IMPORTING/MIGRATING, `MIGRATE` in steps of `step` keys, then the
    /// new owner announced to every node.
    /// Over connections opened beforehand, so the move takes what Redis
    /// takes, not what starting `redis-cli` does.
    pub fn move_slot(&self, slot: u16, from: usize, to: usize, step: usize) {
        let (src, dst) = (&self.nodes[from], &self.nodes[to]);
        let (src_id, dst_id) = (src.cli(&["CLUSTER", "MYID"]), dst.cli(&["CLUSTER", "MYID"]));
        let primaries: Vec<&RedisServer> = self
            .nodes
            .iter()
            .filter(|n| {
                n.try_cli(&["INFO", "replication"])
                    .is_some_and(|r| r.contains("role:master"))
            })
            .collect();
        let open = |n: &RedisServer| {
            ::redis::Client::open(n.url())
                .and_then(|c| c.get_connection())
                .expect("a connection to a node")
        };
        let (mut s, mut d) = (open(src), open(dst));
        let mut all: Vec<::redis::Connection> = primaries.iter().map(|n| open(n)).collect();
        blocking(|| {
            let setslot = |c: &mut ::redis::Connection, how: &str, id: &str| {
                ::redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg(how)
                    .arg(id)
                    .query::<()>(c)
                    .expect("CLUSTER SETSLOT");
            };
            setslot(&mut d, "IMPORTING", &src_id);
            setslot(&mut s, "MIGRATING", &dst_id);
            loop {
                let keys: Vec<String> = ::redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(step)
                    .query(&mut s)
                    .expect("GETKEYSINSLOT");
                if keys.is_empty() {
                    break;
                }
                ::redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(dst.port)
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("KEYS")
                    .arg(keys)
                    .query::<()>(&mut s)
                    .expect("MIGRATE");
            }
            for c in &mut all {
                setslot(c, "NODE", &dst_id);
            }
        });
    }

    /// YAML list of seed nodes.
    pub fn seeds(&self) -> String {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("'{}'", n.url()))
            .collect();
        format!("[{}]", urls.join(", "))
    }

    /// Sum of a command's calls over all nodes.
    pub fn calls(&self, command: &str) -> u64 {
        self.nodes.iter().map(|n| n.calls(command)).sum()
    }

    /// Decision calls (`FCALL` and `EVALSHA`) over all nodes.
    pub fn script_calls(&self) -> u64 {
        self.calls("fcall") + self.calls("evalsha")
    }
}
