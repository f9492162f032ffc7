//! Records nginx's answers to the conformance corpus and writes
//! `docs/conformance.md`. The tests never need nginx: this is run by hand
//! (`scripts/conformance-nginx`) where nginx is installed.
//!
//! `record`: runs every case of `tests/conformance/cases.yaml` against a
//! fresh nginx (proxying to a raw upstream as tollgate does in the test,
//! configured as its WebSocket guide says) and writes
//! `tests/conformance/nginx.tsv`. `doc`: writes `docs/conformance.md` from
//! the corpus (tollgate's answers are its expectations, which the suite
//! checks) and that file.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[path = "../tests/it/conformance_run.rs"]
mod run;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn main() {
    let what = std::env::args().nth(1).unwrap_or_default();
    let cases = run::parse(
        &std::fs::read_to_string(format!("{ROOT}/tests/conformance/cases.yaml")).unwrap(),
    );
    match what.as_str() {
        "record" => record(&cases),
        "doc" => doc(&cases),
        _ => {
            eprintln!("usage: conformance_nginx record | doc");
            std::process::exit(2);
        }
    }
}

fn nginx_binary() -> PathBuf {
    for p in ["/usr/sbin/nginx", "/usr/bin/nginx"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    eprintln!("nginx not found: apt-get install -y nginx");
    std::process::exit(1);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// nginx on `port` proxying to `up`, the way its docs set up a proxy
/// with WebSocket support and upstream keep-alive.
fn start_nginx(dir: &Path, port: u16, up: std::net::SocketAddr) -> Child {
    let d = dir.display();
    let conf = format!(
        "worker_processes 1; daemon off; master_process off;
error_log {d}/error.log; pid {d}/nginx.pid;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  map $http_upgrade $connection_upgrade {{ default upgrade; '' ''; }}
  upstream api {{ server {up}; keepalive 8; }}
  server {{
    listen 127.0.0.1:{port};
    location /canned {{ return 200 \"canned\\n\"; }}
    location / {{
      proxy_pass http://api;
      proxy_http_version 1.1;
      proxy_set_header Host $host;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $connection_upgrade;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Real-IP $remote_addr;
      proxy_set_header X-Forwarded-Proto $scheme;
    }}
  }}
}}
"
    );
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    Command::new(nginx_binary())
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nginx starts")
}

/// One line: statuses, the connection, how many requests reached the
/// upstream.
fn summary(got: &run::Outcome) -> String {
    let statuses: Vec<String> = got.answers.iter().map(|a| a.0.to_string()).collect();
    let requests = got.upstream.matches(" HTTP/1.1\r\n").count()
        + got.upstream.matches(" HTTP/1.0\r\n").count();
    let answered = match (statuses.is_empty(), got.garbage.get(..12)) {
        (false, _) => statuses.join(", "),
        // A head whose body never ended: a cut response.
        (true, Some(head)) if head.starts_with("HTTP/") => format!("{} cut", &head[9..12]),
        (true, _) if got.closed => "no answer".to_owned(),
        (true, _) => "no answer in 8 s".to_owned(),
    };
    format!(
        "{answered} {}, {requests} request(s) upstream",
        if got.closed { "closed" } else { "kept" },
    )
}

fn record(cases: &[run::Case]) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempdir();
    let mut lines = String::new();
    for case in cases {
        let here = dir.join(&case.id);
        for sub in ["", "body", "proxy", "fcgi", "uwsgi", "scgi"] {
            std::fs::create_dir_all(here.join(sub)).unwrap();
        }
        let got = rt.block_on(async {
            let up = run::RawUpstream::spawn(case.replies()).await;
            let port = free_port();
            let mut nginx = start_nginx(&here, port, up.addr);
            let mut tcp = None;
            for _ in 0..100 {
                if let Ok(t) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                    tcp = Some(t);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let got = run::exchange(tcp.expect("nginx listens"), case, &up).await;
            let _ = nginx.kill();
            let _ = nginx.wait();
            got
        });
        let line = summary(&got);
        println!("{}: {line}", case.id);
        let _ = writeln!(lines, "{}\t{line}", case.id);
    }
    std::fs::write(format!("{ROOT}/tests/conformance/nginx.tsv"), lines).unwrap();
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-conformance-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A case's bytes as a Markdown code span (escapes shown, long runs cut).
fn bytes(s: &str) -> String {
    let mut out = String::new();
    for ch in s.chars() {
        match ch {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '|' => out.push_str("\\|"),
            '`' => out.push('\''),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    if out.chars().count() > 160 {
        let head: String = out.chars().take(150).collect();
        let _ = write!(out, "");
        return format!("{head}… ({} bytes)", s.len());
    }
    out
}

fn doc(cases: &[run::Case]) {
    let nginx: HashMap<String, String> =
        std::fs::read_to_string(format!("{ROOT}/tests/conformance/nginx.tsv"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .collect();
    let mut out = String::new();
    out.push_str(include_str!("../tests/conformance/intro.md"));
    for (leg, title) in [
        ("client", "Client to tollgate"),
        ("upstream", "Upstream to tollgate"),
    ] {
        let _ = writeln!(out, "\n## {title}\n");
        out.push_str("| case | what it checks | sent | tollgate | nginx 1.22 | why they differ |\n|---|---|---|---|---|---|\n");
        for c in cases.iter().filter(|c| c.leg == leg) {
            let sent = if leg == "client" {
                &c.send
            } else {
                c.reply.first().unwrap_or(&c.send)
            };
            let upstream = c.expect.upstream.replace("{fwd}", "");
            let requests = upstream.matches(" HTTP/1.1\r\n").count();
            let tollgate = format!(
                "{} {}, {} request(s) upstream",
                c.expect
                    .status
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                c.expect.conn,
                requests
            );
            let ng = nginx.get(&c.id).map_or("not recorded", String::as_str);
            let why = match &c.why {
                Some(w) => w.as_str(),
                None if ng == tollgate => "",
                None if ng == "not recorded" => "",
                None => "not explained yet",
            };
            let _ = writeln!(
                out,
                "| `{}` | {} | `{}` | {} | {} | {} |",
                c.id,
                c.about.replace('|', "\\|"),
                bytes(sent),
                tollgate,
                ng,
                why.replace('|', "\\|")
            );
        }
    }
    std::fs::write(format!("{ROOT}/docs/conformance.md"), out).unwrap();
}
