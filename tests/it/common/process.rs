//! The `tollgate` binary run as an operator runs it: a config file in a
//! temporary directory, JSON logs on stdout, killed when dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

pub fn write_config(dir: &tempfile::TempDir, yaml: &str) -> String {
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, yaml).unwrap();
    path.display().to_string()
}

/// A running `tollgate run`, killed on drop.
pub struct Running {
    pub child: Child,
    /// Every stdout line (JSON log events) printed after start-up.
    pub logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Running {
    pub fn start(rest: &str) -> Running {
        Self::start_logging(rest, false)
    }

    pub fn start_logging(rest: &str, access_log: bool) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let yaml = format!(
            "listeners: [{{ name: plain, bind: '127.0.0.1:0' }}]\nadmin: {{ bind: '127.0.0.1:0' }}\nlog: {{ format: json, access_log: {access_log} }}\n{rest}"
        );
        let path = write_config(&dir, &yaml);
        Self::run_in(dir, &path, &[])
    }

    /// `tollgate run --config <path> <more>`, `path` inside `dir`.
    pub fn run_in(dir: tempfile::TempDir, path: &str, more: &[&str]) -> Running {
        let mut command = Command::new(BIN);
        command.args(["run", "--config", path]).args(more);
        Self::spawn(command, dir)
    }

    /// `command`, which runs tollgate with JSON logs (in a sandbox, say),
    /// the process tollgate itself once it has exec'd.
    pub fn spawn(mut command: Command, dir: tempfile::TempDir) -> Running {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut addr, mut admin) = (None, None);
        while addr.is_none() || admin.is_none() {
            let line = lines
                .next()
                .expect("tollgate exited before listening")
                .unwrap();
            let event: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            let parsed = event["addr"]
                .as_str()
                .and_then(|a| a.parse::<SocketAddr>().ok());
            match event["message"].as_str() {
                Some("listening") => addr = parsed,
                Some("admin listening") => admin = parsed,
                _ => {}
            }
        }
        // Keep draining stdout so logging never blocks the process.
        let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Running {
            child,
            logs,
            addr: addr.unwrap(),
            admin: admin.unwrap(),
            _dir: dir,
        }
    }

    /// tollgate forwarding every path to `up`.
    pub fn forwarding_to(up: SocketAddr, access_log: bool) -> Running {
        Self::start_logging(
            &format!(
                "upstreams:\n  api: {{ targets: ['{up}'] }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, upstream: api }}\n"
            ),
            access_log,
        )
    }

    /// Its `/metrics` exposition.
    pub async fn metrics(&self) -> String {
        let mut c = super::h1(self.admin).await;
        let req = http::Request::get("/metrics")
            .header("host", "admin")
            .body(super::empty())
            .unwrap();
        String::from_utf8(super::send1(&mut c, req).await.body.to_vec()).unwrap()
    }

    /// The access-log events logged so far, waiting (up to 5 s) until
    /// there are at least `n`.
    pub async fn access_events(&self, n: usize) -> Vec<serde_json::Value> {
        let what = format!("{n} access-log events");
        super::until_some(std::time::Duration::from_secs(5), &what, || {
            let events: Vec<serde_json::Value> = self
                .logs
                .lock()
                .unwrap()
                .iter()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|e| e["target"] == "tollgate::access")
                .collect();
            std::future::ready((events.len() >= n).then_some(events))
        })
        .await
    }

    /// The config file it runs on (a test may rewrite it and reload).
    pub fn config_path(&self) -> std::path::PathBuf {
        self._dir.path().join("tollgate.yaml")
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} failed");
    }

    /// Peak resident memory (VmHWM) in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/<pid>/status")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines of a `tollgate replay --decisions` file: (logged status, the
/// limit the replay refused the request by, or `-`).
pub fn replay_decisions(path: &std::path::Path) -> Vec<(u16, String)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            (cols[1].parse().unwrap(), cols[3].to_owned())
        })
        .collect()
}
