//! Which target serves each request, against real nginx: an `upstream {}`
//! block imported with `import-nginx`, the same requests sent one after
//! another to nginx and to tollgate, and the sequence of targets that
//! answered compared request for request (weights, `down`, `backup`).

use std::net::SocketAddr;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::common::*;
use crate::nginx_differential::{free_port, launch, Nginx};

/// A backend that answers every request with its own name; dropping
/// `stop` (`Named::stop`) closes its listener and every connection, so its
/// port refuses from then on.
pub(crate) struct Named {
    pub addr: SocketAddr,
    tasks: JoinSet<()>,
}

impl Named {
    pub async fn spawn(name: &'static str) -> Named {
        Named::serve(name, "127.0.0.1:0".parse().unwrap(), 200, Duration::ZERO).await
    }

    /// Answers `status` with its name, after `delay`, on `at`.
    pub async fn serve(name: &'static str, at: SocketAddr, status: u16, delay: Duration) -> Named {
        Named::on(name, TcpListener::bind(at).await.unwrap(), status, delay)
    }

    /// Answers `status` with its name, after `delay`, on a bound listener.
    pub fn on(name: &'static str, listener: TcpListener, status: u16, delay: Duration) -> Named {
        let addr = listener.local_addr().unwrap();
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                conns.spawn(async move {
                    let svc = service_fn(move |_req| async move {
                        tokio::time::sleep(delay).await;
                        let mut res = http::Response::new(full(name));
                        *res.status_mut() = http::StatusCode::from_u16(status).unwrap();
                        Ok::<_, std::convert::Infallible>(res)
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Named { addr, tasks }
    }

    pub fn stop(&mut self) {
        self.tasks.abort_all();
    }
}

/// nginx (one worker) and tollgate on the import of `upstream`'s body,
/// every path proxied to it (with `location`'s directives).
pub(crate) async fn both(upstream: &str, location: &str) -> (Nginx, SocketAddr, TestProxy) {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let conf = format!(
        "worker_processes 1;
events {{}}
http {{
    access_log off;
    upstream app {{
{upstream}
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{ proxy_pass http://app; {location} }}
    }}
}}
"
    );
    std::fs::write(dir.path().join("nginx.conf"), &conf).unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let import = std::process::Command::new(BIN)
        .args(["import-nginx", "nginx.conf", "-o", "tollgate.yaml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        import.status.success(),
        "{}",
        String::from_utf8_lossy(&import.stderr)
    );
    let yaml = std::fs::read_to_string(dir.path().join("tollgate.yaml"))
        .unwrap()
        .replace(
            &format!("127.0.0.1:{port}"),
            &format!("127.0.0.1:{}", free_port()),
        )
        + "admin: { bind: \"127.0.0.1:0\", token: \"tollgate-test-token\" }\nlog: { access_log: false }\n";
    let proxy = TestProxy::spawn(&yaml).await;
    let (nginx, addr) = launch(dir, port).await;
    (nginx, addr, proxy)
}

/// The names of the targets that answered `n` requests sent one after
/// another on one keep-alive connection (`!<status>` for an answer that
/// is not a 200).
pub(crate) async fn sequence(addr: SocketAddr, n: usize) -> Vec<String> {
    sequence_of("GET", addr, n).await
}

pub(crate) async fn sequence_of(method: &str, addr: SocketAddr, n: usize) -> Vec<String> {
    let mut c = h1(addr).await;
    let mut seen = Vec::with_capacity(n);
    for _ in 0..n {
        let got = send1(&mut c, request(method, "/", empty())).await;
        seen.push(if got.status == 200 {
            String::from_utf8_lossy(&got.body).into_owned()
        } else {
            format!("!{}", got.status.as_u16())
        });
    }
    seen
}

pub(crate) fn count(seq: &[String], name: &str) -> usize {
    seq.iter().filter(|s| *s == name).count()
}

/// Weights 5:1:1: nginx's smooth weighted round robin spreads them
/// `a a b a c a a`, and tollgate chooses the same target as nginx for each
/// of 1,000 requests; a server marked `down` gets none from either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_choose_the_same_target_as_nginx_request_for_request() {
    let (a, b, c, d) = (
        Named::spawn("a").await,
        Named::spawn("b").await,
        Named::spawn("c").await,
        Named::spawn("d").await,
    );
    let upstream = format!(
        "        server {} weight=5;\n        server {};\n        server {} down;\n        server {};",
        a.addr, b.addr, d.addr, c.addr
    );
    let (_nginx, nginx, proxy) = both(&upstream, "").await;
    let want = sequence(nginx, 1000).await;
    let got = sequence(proxy.addr(), 1000).await;
    assert_eq!(want[..7].join(" "), "a a b a c a a", "nginx's own order");
    assert_eq!(count(&want, "d"), 0);
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w, g, "request {i}: nginx chose {w}, tollgate {g}");
    }
    assert_eq!(
        (count(&got, "a"), count(&got, "b"), count(&got, "c")),
        (714, 143, 143)
    );
}

/// A backup takes nothing while a primary lives; with both primaries
/// refusing connections, every request is answered by the backup, by
/// nginx and by tollgate alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_serves_only_when_the_primaries_refuse_as_in_nginx() {
    let (mut a, mut b, c) = (
        Named::spawn("a").await,
        Named::spawn("b").await,
        Named::spawn("c").await,
    );
    let upstream = format!(
        "        server {};\n        server {};\n        server {} backup;",
        a.addr, b.addr, c.addr
    );
    let (_nginx, nginx, proxy) = both(&upstream, "").await;
    let want = sequence(nginx, 20).await;
    let got = sequence(proxy.addr(), 20).await;
    assert_eq!(want, got);
    assert_eq!(count(&got, "c"), 0, "{got:?}");
    a.stop();
    b.stop();
    until(Duration::from_secs(5), "the primaries to refuse", || {
        let (a, b) = (a.addr, b.addr);
        async move {
            tokio::net::TcpStream::connect(a).await.is_err()
                && tokio::net::TcpStream::connect(b).await.is_err()
        }
    })
    .await;
    let want = sequence(nginx, 10).await;
    let got = sequence(proxy.addr(), 10).await;
    assert_eq!(want, vec!["c".to_owned(); 10], "nginx");
    assert_eq!(got, want, "tollgate");
}

/// A backend that accepts connections and never answers (hung).
pub(crate) async fn hung() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    addr
}

/// Two targets, one hung, a 1 s read timeout: nginx answers every GET,
/// the first after a timeout and a retry on the live target, which then
/// takes all the traffic for `fail_timeout`; tollgate answers the same
/// request for request (35 of 40 with 200 and five 504s before). A POST
/// is not passed on once sent: nginx and tollgate both answer the first
/// 504, then route the rest around the target marked down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_target_is_routed_around_as_nginx_does() {
    let live = Named::spawn("b").await;
    let stuck = hung().await;
    let upstream = format!("        server {stuck};\n        server {};", live.addr);
    let (_nginx, nginx, proxy) = both(&upstream, "proxy_read_timeout 1s;").await;
    let want = sequence(nginx, 40).await;
    let got = sequence(proxy.addr(), 40).await;
    assert_eq!(want, vec!["b".to_owned(); 40], "nginx");
    assert_eq!(got, want, "tollgate");

    let (_nginx, nginx, proxy) = both(&upstream, "proxy_read_timeout 1s;").await;
    let want = sequence_of("POST", nginx, 5).await;
    let got = sequence_of("POST", proxy.addr(), 5).await;
    assert_eq!(want[0], "!504", "nginx: {want:?}");
    assert_eq!(got, want, "tollgate");
}

/// `max_fails=2 fail_timeout=2s`: one failure leaves the target in the
/// rotation, the second marks it down for 2 s; then one request probes
/// it. Counted the same by nginx and tollgate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_fails_and_fail_timeout_mark_a_target_down_as_nginx_does() {
    let live = Named::spawn("b").await;
    let stuck = hung().await;
    let upstream = format!(
        "        server {stuck} max_fails=2 fail_timeout=2s;\n        server {};",
        live.addr
    );
    let (_nginx, nginx, proxy) = both(&upstream, "proxy_read_timeout 1s;").await;
    // Each POST that meets the hung target fails there (not passed on).
    let want = sequence_of("POST", nginx, 6).await;
    let got = sequence_of("POST", proxy.addr(), 6).await;
    assert_eq!(got, want, "tollgate | nginx");
    assert_eq!(
        want.iter().filter(|s| *s == "!504").count(),
        2,
        "nginx: two failures mark it down: {want:?}"
    );
}
