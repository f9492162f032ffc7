//! The imported limits decide as nginx did: for each corpus config that
//! limits, real nginx runs on it (ports and upstreams rewritten to this
//! test's, trusted ranges to loopback addresses) and tollgate on its
//! import, and the same timed trace is replayed into both from the same
//! client addresses: bursts of concurrent requests (slow ones for
//! `limit_conn`), buckets drained part way, steady streams, clients behind
//! a trusted proxy (X-Forwarded-For) and one that spoofs the header, an
//! allow list, HTTPS with SNI. Every step must get the same verdicts: the
//! status, and whether the response was held back.
//!
//! Timing tolerances: a response that takes 100 ms or more counts as
//! delayed (the shortest delay in the traces is 200 ms; an undelayed
//! response takes a few ms). Where a verdict depends on how much a bucket
//! drained, the trace waits for half a request more than a whole number
//! (a second burst 550 ms after a full bucket at 10 r/s finds 5.5 requests
//! drained: 5 pass): a scheduling jitter under 25 ms decides nothing.
//! Steady streams stay under the rate, where every request passes with a
//! whole request to spare.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use crate::common::*;

/// nginx running on a rewritten corpus config, stopped when dropped.
pub(crate) struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.path().join("error.log"));
            eprintln!("nginx logged:\n{}", log.unwrap_or_default());
        }
        // SIGTERM: the master stops its workers too (SIGKILL would orphan them).
        let stopped = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        if !stopped {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = &self.dir;
    }
}

fn nginx_binary() -> &'static str {
    ["/usr/sbin/nginx", "nginx"]
        .into_iter()
        .find(|b| Command::new(b).arg("-v").output().is_ok_and(|o| o.status.success()))
        .expect("nginx is not installed; the differential test needs it: apt-get install -y nginx (scripts/test does this)")
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Rewrites one nginx config file for the test: every `listen` to
/// `127.0.0.1:<port>` (its parameters kept), every upstream address to
/// the echo server, every trusted range to 127.0.0.2.
fn rewrite(text: &str, port: u16, echo: SocketAddr) -> String {
    let mut out = String::new();
    let mut in_upstream = false;
    for line in text.lines() {
        let t = line.trim_start();
        let indent = &line[..line.len() - t.len()];
        if t.starts_with("upstream ") && t.ends_with('{') {
            in_upstream = true;
        } else if in_upstream && t.starts_with('}') {
            in_upstream = false;
        }
        let words: Vec<&str> = t.trim_end_matches(';').split_whitespace().collect();
        let rewritten = match words.first().copied() {
            Some("listen") => {
                let params: Vec<&str> = words[2..].to_vec();
                format!("{indent}listen 127.0.0.1:{port} {};", params.join(" "))
            }
            Some("server") if in_upstream => format!("{indent}server {echo};"),
            Some("proxy_pass") => {
                let url = words.get(1).copied().unwrap_or_default();
                let host = url
                    .trim_start_matches("http://")
                    .split('/')
                    .next()
                    .unwrap_or_default();
                if host.contains(':') || host.contains('.') {
                    format!("{indent}proxy_pass http://{echo};")
                } else {
                    line.to_owned() // an upstream block's name
                }
            }
            Some("set_real_ip_from") => format!("{indent}set_real_ip_from 127.0.0.2;"),
            _ => line.to_owned(),
        };
        out.push_str(&rewritten);
        out.push('\n');
    }
    out
}

/// The case rewritten into a temp dir, nginx started on it, and the
/// imported YAML (its listener moved to `tollgate_port`).
async fn start(case: &str, echo: SocketAddr, ca: Option<&TestCa>) -> (Nginx, SocketAddr, String) {
    let nginx_port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/nginx")
        .join(case);
    copy_rewritten(&src, dir.path(), nginx_port, echo);
    if let Some(ca) = ca {
        std::fs::create_dir_all(dir.path().join("certs")).unwrap();
        for (file, name) in [("api", "api.example.com"), ("www", "www.example.com")] {
            let (cert, key) = ca.leaf(file, &[name]);
            std::fs::copy(cert, dir.path().join(format!("certs/{file}.pem"))).unwrap();
            std::fs::copy(key, dir.path().join(format!("certs/{file}.key"))).unwrap();
        }
    }
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let import = Command::new(BIN)
        .args(["import-nginx", "nginx.conf", "-o", "tollgate.yaml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    // Every upstream server is rewritten to the one echo server, so an
    // upstream rule the import could not keep
    // changes nothing these traces see.
    let stderr = String::from_utf8_lossy(&import.stderr);
    let only_balancing = stderr
        .lines()
        .filter(|l| l.contains(": NOT EQUIVALENT: "))
        .all(|l| l.contains(": upstream "));
    assert!(
        import.status.success() || (import.status.code() == Some(2) && only_balancing),
        "{case}: import failed: {stderr}"
    );
    let tollgate_port = free_port();
    let yaml = std::fs::read_to_string(dir.path().join("tollgate.yaml"))
        .unwrap()
        .replace(
            &format!("127.0.0.1:{nginx_port}"),
            &format!("127.0.0.1:{tollgate_port}"),
        )
        .replace(": certs/", &format!(": {}/certs/", dir.path().display()))
        + "admin: { enabled: false }\nlog: { access_log: false }\n";
    let (nginx, addr) = launch(dir, nginx_port).await;
    (nginx, addr, yaml)
}

/// nginx started on `dir`'s nginx.conf, which listens on `port`, once it
/// answers.
pub(crate) async fn launch(dir: tempfile::TempDir, port: u16) -> (Nginx, SocketAddr) {
    let prefix = format!("{}/", dir.path().display());
    let globals = format!("daemon off; pid {prefix}nginx.pid; error_log {prefix}error.log;");
    let child = Command::new(nginx_binary())
        .args([
            "-p",
            &prefix,
            "-c",
            &format!("{prefix}nginx.conf"),
            "-g",
            &globals,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let nginx = Nginx { child, dir };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // On failure the guard prints nginx's error log.
    until(Duration::from_secs(10), "nginx answers", || async {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await;
    (nginx, addr)
}

fn copy_rewritten(from: &Path, to: &Path, port: u16, echo: SocketAddr) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_rewritten(&entry.path(), &target, port, echo);
        } else if entry.path().extension().is_some_and(|e| e == "conf") {
            let text = std::fs::read_to_string(entry.path()).unwrap();
            std::fs::write(target, rewrite(&text, port, echo)).unwrap();
        }
    }
}

/// One client's request: from which loopback address, with which headers.
#[derive(Clone)]
pub(crate) struct Req {
    pub from: &'static str,
    pub path: &'static str,
    pub host: &'static str,
    pub headers: Vec<(&'static str, String)>,
}

/// What a proxy answered, as the comparison sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Verdict {
    status: u16,
    delayed: bool,
}

/// TLS client settings, for an HTTPS case.
pub(crate) type Tls = Option<std::sync::Arc<rustls::ClientConfig>>;

async fn send(addr: SocketAddr, r: &Req, tls: &Tls) -> Verdict {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(format!("{}:0", r.from).parse().unwrap())
        .unwrap();
    let started = Instant::now();
    let tcp = socket.connect(addr).await.unwrap();
    let mut sender = match tls {
        None => h1_over(tcp).await,
        Some(config) => {
            let name = rustls_pki_types::ServerName::try_from(r.host.to_owned()).unwrap();
            let stream = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name, tcp)
                .await
                .expect("TLS handshake");
            h1_over(stream).await
        }
    };
    let mut req = http::Request::get(r.path).header("host", r.host);
    for (k, v) in &r.headers {
        req = req.header(*k, v.as_str());
    }
    let got = send1(&mut sender, req.body(empty()).unwrap()).await;
    Verdict {
        status: got.status.as_u16(),
        delayed: started.elapsed() >= Duration::from_millis(100),
    }
}

/// A step of a trace, at `at` ms after the start.
pub(crate) enum Step {
    /// `n` copies of a request, all at once (each on its own connection):
    /// compared as a multiset, their order being arbitrary.
    Burst { at: u64, n: usize, req: Req },
    /// `n` requests one after the other, `every` ms apart.
    Steady {
        at: u64,
        every: u64,
        n: usize,
        req: Req,
    },
}

pub(crate) fn req(from: &'static str, path: &'static str, host: &'static str) -> Req {
    Req {
        from,
        path,
        host,
        headers: Vec::new(),
    }
}

/// Replays `trace` into both proxies at once and compares every step.
pub(crate) async fn replay(
    case: &str,
    nginx: SocketAddr,
    tollgate: SocketAddr,
    trace: Vec<Step>,
    tls: &Tls,
) {
    let t0 = Instant::now();
    let mut compared = 0;
    for (i, step) in trace.into_iter().enumerate() {
        let at = match &step {
            Step::Burst { at, .. } | Step::Steady { at, .. } => *at,
        };
        // The trace's schedule: it paces the load, both proxies get each
        // request at once, and the answers are compared, not the times.
        tokio::time::sleep_until(t0 + Duration::from_millis(at)).await;
        match step {
            Step::Burst { n, req, .. } => {
                let fire = |addr: SocketAddr| {
                    let req = req.clone();
                    async move {
                        let all = (0..n).map(|_| {
                            let req = req.clone();
                            async move { send(addr, &req, tls).await }
                        });
                        let mut v = futures_util::future::join_all(all).await;
                        v.sort();
                        v
                    }
                };
                let (a, b) = tokio::join!(fire(nginx), fire(tollgate));
                assert_eq!(
                    a, b,
                    "{case}: step {i} (burst of {n} on {} from {}): nginx | tollgate",
                    req.path, req.from
                );
                compared += n;
            }
            Step::Steady { every, n, req, .. } => {
                let start = Instant::now();
                for k in 0..n {
                    // Paces the steady stream (the trace's schedule).
                    tokio::time::sleep_until(start + Duration::from_millis(every * k as u64)).await;
                    let (a, b) = tokio::join!(send(nginx, &req, tls), send(tollgate, &req, tls));
                    assert_eq!(a, b, "{case}: step {i}, request {k} (every {every} ms on {} from {}): nginx | tollgate", req.path, req.from);
                    compared += 1;
                }
            }
        }
    }
    assert!(compared >= 20, "{case}: only {compared} requests compared");
}

async fn differential(case: &str, trace: Vec<Step>) {
    let echo = Upstream::spawn().await;
    let (_nginx, nginx_addr, yaml) = start(case, echo.addr, None).await;
    let proxy = TestProxy::spawn(&yaml).await;
    replay(case, nginx_addr, proxy.addr(), trace, &None).await;
}

/// The classic API tier: 10 r/s burst 20 nodelay per IP on `/`, 5 r/m
/// burst 3 (delayed) on `= /login`, `= /health` exempt.
#[tokio::test]
async fn api_tier_decides_like_nginx() {
    let host = "api.example.com";
    differential(
        "api-tier",
        vec![
            Step::Burst {
                at: 0,
                n: 26,
                req: req("127.0.0.10", "/", host),
            },
            Step::Burst {
                at: 0,
                n: 10,
                req: req("127.0.0.10", "/health", host),
            },
            // 21 pass; 550 ms later 5.5 have drained: 5 more pass.
            Step::Burst {
                at: 100,
                n: 25,
                req: req("127.0.0.14", "/", host),
            },
            Step::Burst {
                at: 650,
                n: 8,
                req: req("127.0.0.14", "/", host),
            },
            Step::Steady {
                at: 100,
                every: 150,
                n: 8,
                req: req("127.0.0.11", "/", host),
            },
            Step::Burst {
                at: 1400,
                n: 6,
                req: req("127.0.0.12", "/login", host),
            },
            Step::Burst {
                at: 1500,
                n: 6,
                req: req("127.0.0.13", "/login", "other.example.com"),
            },
        ],
    )
    .await;
}

/// Two zones on one location: per IP (20 r/s burst 10) and per API key
/// (100 r/m burst 5); requests without the key meet only the IP zone.
#[tokio::test]
async fn two_zones_on_one_location_decide_like_nginx() {
    let with_key = |from, key: &str| Req {
        headers: vec![("x-api-key", key.to_owned())],
        ..req(from, "/api/items", "api.test")
    };
    differential(
        "multi-zone",
        vec![
            Step::Burst {
                at: 0,
                n: 9,
                req: with_key("127.0.0.20", "k-1"),
            },
            Step::Burst {
                at: 50,
                n: 9,
                req: with_key("127.0.0.21", "k-1"),
            },
            Step::Burst {
                at: 100,
                n: 15,
                req: req("127.0.0.22", "/api/items", "api.test"),
            },
            // 11 pass; 275 ms later 5.5 have drained at 20 r/s: 5 more pass.
            Step::Burst {
                at: 200,
                n: 14,
                req: req("127.0.0.24", "/api/items", "api.test"),
            },
            Step::Burst {
                at: 475,
                n: 8,
                req: req("127.0.0.24", "/api/items", "api.test"),
            },
            Step::Steady {
                at: 200,
                every: 700,
                n: 4,
                req: with_key("127.0.0.23", "k-2"),
            },
        ],
    )
    .await;
}

/// `burst=12 delay=8` at 5 r/s: 9 at once, 4 delayed (200-800 ms), the rest
/// refused with nginx's default 503.
#[tokio::test]
async fn a_two_stage_delay_decides_like_nginx() {
    differential(
        "delay",
        vec![
            Step::Burst {
                at: 0,
                n: 16,
                req: req("127.0.0.30", "/", "any.test"),
            },
            Step::Steady {
                at: 2000,
                every: 400,
                n: 6,
                req: req("127.0.0.31", "/", "any.test"),
            },
        ],
    )
    .await;
}

/// Behind a trusted proxy (127.0.0.2): the client is the X-Forwarded-For
/// address; an untrusted peer's header is ignored.
#[tokio::test]
async fn real_ip_from_a_trusted_proxy_decides_like_nginx() {
    let via = |from, client: &str| Req {
        headers: vec![("x-forwarded-for", client.to_owned())],
        ..req(from, "/", "app.test")
    };
    differential(
        "real-ip",
        vec![
            Step::Burst {
                at: 0,
                n: 25,
                req: via("127.0.0.2", "203.0.113.7"),
            },
            Step::Burst {
                at: 0,
                n: 15,
                req: via("127.0.0.2", "203.0.113.8"),
            },
            // A spoofer claiming 203.0.113.8 is counted as itself.
            Step::Burst {
                at: 100,
                n: 25,
                req: via("127.0.0.40", "203.0.113.8"),
            },
            Step::Burst {
                at: 200,
                n: 25,
                req: via("127.0.0.2", "203.0.113.9"),
            },
            Step::Burst {
                at: 750,
                n: 8,
                req: via("127.0.0.2", "203.0.113.9"),
            },
        ],
    )
    .await;
}

/// Two rules of nginx's own: `$binary_remote_addr` keys each IPv6 address
/// on its own (two addresses of one /64 each get their burst), and a
/// location answered by `return` is never limited, though `limit_req` is
/// inherited from `http` (the rewrite phase answers first).
#[tokio::test]
async fn ipv6_addresses_and_return_locations_decide_like_nginx() {
    let via = |client: &str, path: &'static str| Req {
        headers: vec![("x-forwarded-for", client.to_owned())],
        ..req("127.0.0.2", path, "app.test")
    };
    differential(
        "phases",
        vec![
            Step::Burst {
                at: 0,
                n: 5,
                req: via("2001:db8::1", "/"),
            },
            Step::Burst {
                at: 0,
                n: 5,
                req: via("2001:db8::2", "/"),
            },
            Step::Burst {
                at: 100,
                n: 12,
                req: via("2001:db8::1", "/health"),
            },
        ],
    )
    .await;
}

/// Included files: the default server answers unknown hosts without a
/// limit; the shop (30 r/m burst 10 nodelay) for both its names.
#[tokio::test]
async fn included_sites_decide_like_nginx() {
    differential(
        "includes",
        vec![
            Step::Burst {
                at: 0,
                n: 12,
                req: req("127.0.0.50", "/", "unknown.test"),
            },
            Step::Burst {
                at: 0,
                n: 1,
                req: req("127.0.0.51", "/", "shop.example.com"),
            },
            Step::Burst {
                at: 100,
                n: 14,
                req: req("127.0.0.52", "/cart", "www.shop.example.com"),
            },
            Step::Steady {
                at: 200,
                every: 150,
                n: 8,
                req: req("127.0.0.53", "/", "shop.example.com"),
            },
        ],
    )
    .await;
}

/// Upstream blocks (rewritten to the echo server), a 50 r/s burst 20
/// zone on `/api/`, `/status` open to 127.0.0.1 only (403 for others), and
/// `/version`, whose `return` nginx answers before allow / deny.
#[tokio::test]
async fn upstream_blocks_and_an_allow_list_decide_like_nginx() {
    differential(
        "upstreams",
        vec![
            Step::Burst {
                at: 0,
                n: 26,
                req: req("127.0.0.60", "/api/v1/items", "api.test"),
            },
            Step::Burst {
                at: 0,
                n: 5,
                req: req("127.0.0.61", "/assets/app.js", "api.test"),
            },
            Step::Burst {
                at: 100,
                n: 3,
                req: req("127.0.0.1", "/status", "api.test"),
            },
            Step::Burst {
                at: 100,
                n: 3,
                req: req("127.0.0.62", "/status", "api.test"),
            },
            Step::Burst {
                at: 100,
                n: 3,
                req: req("127.0.0.62", "/version", "api.test"),
            },
        ],
    )
    .await;
}

/// `limit_conn addr 10` (429): twelve slow requests at once from one
/// address, ten are served; another address is not affected; downloads
/// inherit the connection limit.
#[tokio::test]
async fn concurrent_requests_decide_like_nginx() {
    differential(
        "limit-conn",
        vec![
            Step::Burst {
                at: 0,
                n: 12,
                req: req("127.0.0.70", "/slow?ms=600", "files.test"),
            },
            Step::Burst {
                at: 0,
                n: 8,
                req: req("127.0.0.71", "/slow?ms=600", "files.test"),
            },
            Step::Burst {
                at: 1000,
                n: 1,
                req: req("127.0.0.70", "/downloads/a.iso", "files.test"),
            },
        ],
    )
    .await;
}

/// HTTPS with SNI: the default server (api.example.com, 10 r/s burst 20)
/// and www.example.com without a limit, on one address.
#[tokio::test]
async fn https_sites_decide_like_nginx() {
    let ca = TestCa::new();
    let echo = Upstream::spawn().await;
    let (_nginx, nginx_addr, yaml) = start("tls", echo.addr, Some(&ca)).await;
    let proxy = TestProxy::spawn(&yaml).await;
    let tls = Some(ca.client_config(&[b"http/1.1"]));
    replay(
        "tls",
        nginx_addr,
        proxy.addr(),
        vec![
            Step::Burst {
                at: 0,
                n: 25,
                req: req("127.0.0.80", "/", "api.example.com"),
            },
            Step::Burst {
                at: 0,
                n: 25,
                req: req("127.0.0.81", "/", "www.example.com"),
            },
            Step::Burst {
                at: 650,
                n: 8,
                req: req("127.0.0.80", "/", "api.example.com"),
            },
        ],
        &tls,
    )
    .await;
}

/// Replay tells nginx's truth: nginx's own access log (`combined`) of a
/// trace, replayed through the config `import-nginx` made of its config,
/// refuses exactly the requests nginx refused (429 from one zone, 503 from
/// the other), and none to the `return` location.
#[tokio::test]
async fn replaying_nginx_access_log_gives_nginx_decisions() {
    let echo = Upstream::spawn().await;
    let (nginx, addr, _) = start("replay", echo.addr, None).await;
    let trace = [
        ("127.0.0.2", "/", 8),
        ("127.0.0.3", "/api", 3),
        ("127.0.0.2", "/login", 3),
        ("127.0.0.2", "/health", 4),
        ("127.0.0.4", "/login", 2),
        ("127.0.0.3", "/", 4),
        ("127.0.0.2", "/x", 2),
    ];
    let mut sent = Vec::new();
    // One request at a time: the log's order is the order nginx decided in.
    for (from, path, n) in trace {
        for _ in 0..n {
            sent.push(send(addr, &req(from, path, "app.test"), &None).await.status);
        }
    }
    let log = nginx.dir.path().join("logs/access.log");
    until(Duration::from_secs(5), "nginx's access log", || async {
        std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() == sent.len())
    })
    .await;
    let out = nginx.dir.path().join("decisions.tsv");
    let replay = Command::new(BIN)
        .arg("replay")
        .arg("--config")
        .arg(nginx.dir.path().join("tollgate.yaml"))
        .arg("--decisions")
        .arg(&out)
        .args(["--format", "json"])
        .arg(&log)
        .output()
        .unwrap();
    assert!(
        replay.status.success(),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
    let got = crate::common::process::replay_decisions(&out);
    assert_eq!(got.len(), sent.len(), "{report}");
    let mut refused = 0;
    for (i, ((logged, limit), status)) in got.iter().zip(&sent).enumerate() {
        assert_eq!(logged, status, "line {}: the log's status", i + 1);
        let nginx_refused = [429, 503].contains(status);
        assert_eq!(
            limit != "-",
            nginx_refused,
            "line {}: nginx answered {status}, the replay refused by {limit}",
            i + 1
        );
        refused += usize::from(nginx_refused);
    }
    assert!(
        refused >= 8,
        "only {refused} refusals: the trace tests little"
    );
    assert_eq!(report["agreement"]["differ"], 0, "{report}");
    assert_eq!(report["requests"], sent.len());
}
