//! The workload `scripts/pgo-build` trains tollgate's profile-guided build
//! on: an instrumented tollgate serves it, and the counts it records decide
//! which code the final build lays out hot. Code the workload never runs is
//! laid out cold (it still works, a little slower), so it covers what a
//! deployment runs, not only the benchmark: HTTP/1.1 keep-alive at 8 to
//! 256 connections, requests allowed, rejected (429) and answered by
//! tollgate itself, a zone with two route limits per user (JWT), request
//! bodies, TLS with HTTP/1.1 and HTTP/2, HTTP/2 cleartext, the JSON access
//! log on and off, the admin API and metrics, and the Redis store when
//! `redis-server` is installed.
//!
//! ```text
//! cargo run --release --example pgo_train -- <tollgate binary> <work dir> [seconds per step]
//! ```
//!
//! Everything listens on 127.0.0.1; every step is bounded in time. It fails
//! when a step sees an answer it should not (tollgate not starting, a limit
//! not rejecting), so a broken training run cannot pass unseen.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The JWT secret of the training config (a throwaway, local only).
const SECRET: &str = "pgo-training-secret-not-used-anywhere-else";

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let [_, bin, dir, rest @ ..] = args.as_slice() else {
        return Err("usage: pgo_train <tollgate binary> <work dir> [seconds per step]".into());
    };
    let step = Duration::from_secs_f64(rest.first().map_or(Ok(2.0), |s| s.parse())?);
    run(bin, Path::new(dir), step).await
}

/// The workload, each step `step` long, against `bin`; its configs, logs
/// and certificates go to `dir`. (`tests/it/pgo_train.rs` runs it too.)
pub async fn run(bin: &str, dir: &Path, step: Duration) -> Result<(), Error> {
    std::fs::create_dir_all(dir)?;

    let upstream = upstream().await?;
    let tls = Tls::new(dir)?;
    let ports = Ports::free()?;
    let mut proxy = Proxy::start(bin, dir, "memory", &config(&ports, upstream, &tls, None))?;
    proxy.ready(ports.admin).await?;

    let plain = SocketAddr::from(([127, 0, 0, 1], ports.plain));
    let secure = SocketAddr::from(([127, 0, 0, 1], ports.tls));
    let token = token()?;
    let user = |i: u64| Some(token[(i % token.len() as u64) as usize].clone());
    let none = |_| None;
    let ok = [StatusCode::OK];
    let limited = [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS];
    for conns in [8, 64, 256] {
        h1(plain, None, "GET", "/", conns, step, none, &ok).await?;
    }
    h1(plain, None, "GET", "/health", 64, step, none, &ok).await?;
    let seen = h1(plain, None, "GET", "/reject/x", 64, step, none, &limited).await?;
    if seen[1] == 0 {
        return Err("the 1-per-hour limit rejected nothing".into());
    }
    for conns in [64, 256] {
        h1(plain, None, "GET", "/api/items", conns, step, user, &ok).await?;
    }
    h1(plain, None, "POST", "/api/items", 32, step, user, &ok).await?;
    h1(
        plain,
        None,
        "GET",
        "/nowhere",
        8,
        step / 4,
        none,
        &[StatusCode::NOT_FOUND],
    )
    .await?;
    h1(secure, Some(&tls), "GET", "/api/items", 32, step, user, &ok).await?;
    h2(plain, None, 4, step, &token).await?;
    h2(secure, Some(&tls), 4, step, &token).await?;
    for path in [
        "/metrics",
        "/api/overview",
        "/api/top?limit=short",
        "/api/limits",
    ] {
        let admin = SocketAddr::from(([127, 0, 0, 1], ports.admin));
        h1(admin, None, "GET", path, 2, step / 8, none, &ok).await?;
    }
    proxy.stop()?;

    // The same routes with their limits in Redis (the store is one per
    // process, so a second one), and without the access log.
    let Some(redis) = Redis::start(dir).await? else {
        return Ok(());
    };
    let ports = Ports::free()?;
    let config = config(&ports, upstream, &tls, Some(redis.port));
    let mut proxy = Proxy::start(bin, dir, "redis", &config)?;
    proxy.ready(ports.admin).await?;
    let plain = SocketAddr::from(([127, 0, 0, 1], ports.plain));
    h1(plain, None, "GET", "/", 64, step, none, &ok).await?;
    h1(plain, None, "GET", "/api/items", 64, step, user, &ok).await?;
    h1(plain, None, "GET", "/reject/x", 8, step / 2, none, &limited).await?;
    proxy.stop()?;
    // The limits were decided in Redis, not by the local fallback.
    let client = redis::Client::open(format!("redis://127.0.0.1:{}", redis.port))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let keys: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await?;
    if keys == 0 {
        return Err("the Redis store kept no keys".into());
    }
    // `redis` stops as it drops.
    Ok(())
}

/// Ports for the training tollgate's listeners, free when asked.
struct Ports {
    plain: u16,
    tls: u16,
    admin: u16,
}

impl Ports {
    fn free() -> Result<Ports, Error> {
        Ok(Ports {
            plain: free_port()?,
            tls: free_port()?,
            admin: free_port()?,
        })
    }
}

fn free_port() -> Result<u16, Error> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The config tollgate is trained on: one of each kind of route.
fn config(ports: &Ports, upstream: SocketAddr, tls: &Tls, redis: Option<u16>) -> String {
    let (cert, key) = (tls.cert.display(), tls.key.display());
    let mut c = format!(
        r#"listeners:
  - {{ name: plain, bind: "127.0.0.1:{plain}" }}
  - name: secure
    bind: "127.0.0.1:{secure}"
    tls: {{ certs: [{{ cert: "{cert}", key: "{key}" }}] }}
admin: {{ bind: "127.0.0.1:{admin}" }}
log: {{ format: json, level: info, access_log: {access_log} }}
identity: {{ jwt: {{ algorithms: [HS256], secret: "{SECRET}" }} }}
zones: [{{ name: per_ip, rate: 100000000r/s, burst: 1000, nodelay: true }}]
upstreams: {{ api: {{ targets: ["{upstream}"], max_idle_per_target: 256 }} }}
routes:
  - {{ name: health, match: {{ path: /health }}, respond: {{ body: "ok\n" }} }}
  - name: reject
    match: {{ path_prefix: /reject/ }}
    upstream: api
    limits: [{{ name: tiny, algorithm: fixed_window, limit: 1, window: 1h, key: ip }}]
  - name: api
    match: {{ path_prefix: /api/ }}
    upstream: api
    limits:
      - {{ name: short, algorithm: token_bucket, rate: 1000000/s, burst: 1000000, key: user_or_ip }}
      - {{ name: long, algorithm: sliding_window, limit: 1000000000, window: 1h, key: user_or_ip }}
  - {{ name: home, match: {{ path: / }}, upstream: api }}
"#,
        plain = ports.plain,
        secure = ports.tls,
        admin = ports.admin,
        // The Redis run has the access log off, as a deployment may.
        access_log = redis.is_none(),
    );
    if let Some(port) = redis {
        c.push_str(&format!(
            "store: {{ kind: redis, url: \"redis://127.0.0.1:{port}\", timeout: 100ms }}\n"
        ));
    }
    c
}

/// An upstream that answers every request 200 with a short body.
async fn upstream() -> Result<SocketAddr, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let service = hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async {
                // Read the request body as a backend does.
                let _ = req.into_body().collect().await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service),
            );
        }
    });
    Ok(addr)
}

/// Tokens of a few users, so per-user limits see several keys.
fn token() -> Result<Vec<String>, Error> {
    let exp = tollgate::clock::unix_ms() / 1000 + 3600;
    (0..16)
        .map(|i| {
            let claims = serde_json::json!({ "sub": format!("user-{i}"), "exp": exp });
            let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes());
            Ok(jsonwebtoken::encode(
                &jsonwebtoken::Header::default(),
                &claims,
                &key,
            )?)
        })
        .collect()
}

/// A CA and a certificate for 127.0.0.1 it signed, written to the work dir.
struct Tls {
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    client: Arc<rustls::ClientConfig>,
}

impl Tls {
    fn new(dir: &Path) -> Result<Tls, Error> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate()?;
        let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])?;
        let cert = leaf.signed_by(&key, &issuer)?;
        let (cert_path, key_path) = (dir.join("train.pem"), dir.join("train.key"));
        std::fs::write(&cert_path, cert.pem())?;
        std::fs::write(&key_path, key.serialize_pem())?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca_cert.der().clone())?;
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Tls {
            cert: cert_path,
            key: key_path,
            client: Arc::new(client),
        })
    }

    async fn connect(
        &self,
        addr: SocketAddr,
        alpn: &[u8],
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Error> {
        let mut config = (*self.client).clone();
        config.alpn_protocols = vec![alpn.to_vec()];
        let tcp = TcpStream::connect(addr).await?;
        let name = rustls_pki_types::ServerName::try_from("localhost")?;
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        Ok(connector.connect(name, tcp).await?)
    }
}

/// `conns` HTTP/1.1 keep-alive connections sending `method path` for
/// `time`; each answer's status must be one of `expect`. How many answers
/// had each of them.
#[allow(clippy::too_many_arguments)]
async fn h1(
    addr: SocketAddr,
    tls: Option<&Tls>,
    method: &'static str,
    path: &'static str,
    conns: u64,
    time: Duration,
    auth: impl Fn(u64) -> Option<String>,
    expect: &[StatusCode],
) -> Result<Vec<u64>, Error> {
    let counts: Arc<Vec<AtomicU64>> = Arc::new(expect.iter().map(|_| AtomicU64::new(0)).collect());
    let deadline = Instant::now() + time;
    let mut tasks = Vec::new();
    for i in 0..conns {
        let (counts, expect, auth) = (counts.clone(), expect.to_vec(), auth(i));
        let mut sender = match tls {
            None => handshake(TcpStream::connect(addr).await?).await?,
            Some(tls) => handshake(tls.connect(addr, b"http/1.1").await?).await?,
        };
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let status = status_of(sender.send_request(request(method, path, &auth)?)).await?;
                let Some(at) = expect.iter().position(|s| *s == status) else {
                    return Err(format!("{method} {path}: unexpected {status}").into());
                };
                counts[at].fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let seen: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    eprintln!("pgo_train: {method} {path} on {conns} connections: {seen:?} answers {expect:?}");
    if seen.iter().sum::<u64>() == 0 {
        return Err(format!("{method} {path}: no answer").into());
    }
    Ok(seen)
}

/// The status of the answer to a request sent, once its body is read
/// (as a client reads it).
async fn status_of(
    sent: impl std::future::Future<Output = hyper::Result<Response<hyper::body::Incoming>>>,
) -> Result<StatusCode, Error> {
    let resp = sent.await?;
    let status = resp.status();
    resp.into_body().collect().await?;
    Ok(status)
}

async fn handshake<S>(io: S) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

fn request(method: &str, path: &str, auth: &Option<String>) -> Result<Request<Full<Bytes>>, Error> {
    let body = if method == "POST" {
        Bytes::from(vec![b'x'; 1024])
    } else {
        Bytes::new()
    };
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost");
    if let Some(token) = auth {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    Ok(req.body(Full::new(body))?)
}

/// `conns` HTTP/2 connections (TLS with ALPN `h2`, else cleartext with
/// prior knowledge), 16 requests in flight on each, for `time`.
async fn h2(
    addr: SocketAddr,
    tls: Option<&Tls>,
    conns: u64,
    time: Duration,
    tokens: &[String],
) -> Result<(), Error> {
    let deadline = Instant::now() + time;
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..conns {
        let sender = match tls {
            None => h2_handshake(TcpStream::connect(addr).await?).await?,
            Some(tls) => h2_handshake(tls.connect(addr, b"h2").await?).await?,
        };
        for j in 0..16 {
            let (mut sender, done) = (sender.clone(), done.clone());
            let auth = Some(tokens[((i * 16 + j) % tokens.len() as u64) as usize].clone());
            tasks.push(tokio::spawn(async move {
                while Instant::now() < deadline {
                    let sent = sender.send_request(request("GET", "/api/items", &auth)?);
                    let status = status_of(sent).await?;
                    if status != StatusCode::OK {
                        return Err(format!("HTTP/2 GET /api/items: unexpected {status}").into());
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, Error>(())
            }));
        }
    }
    for t in tasks {
        t.await??;
    }
    let n = done.load(Ordering::Relaxed);
    let how = if tls.is_some() { "TLS" } else { "cleartext" };
    eprintln!("pgo_train: HTTP/2 ({how}) GET /api/items on {conns} connections: {n} answers");
    if n == 0 {
        return Err("HTTP/2: no answer".into());
    }
    Ok(())
}

async fn h2_handshake<S>(
    io: S,
) -> Result<hyper::client::conn::http2::SendRequest<Full<Bytes>>, Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// The tollgate being trained, its output in a log file.
struct Proxy(Child);

impl Proxy {
    /// Runs `bin` on `config`, written to `<dir>/<name>.yaml`.
    fn start(bin: &str, dir: &Path, name: &str, config: &str) -> Result<Proxy, Error> {
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&path, config)?;
        let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
        let child = Command::new(bin)
            .args(["run", "--config"])
            .arg(&path)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {bin}: {e}"))?;
        Ok(Proxy(child))
    }

    /// Waits (10 s at most) for its admin listener to say ready.
    async fn ready(&mut self, admin: u16) -> Result<(), Error> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(status) = self.0.try_wait()? {
                return Err(format!("tollgate exited at start ({status}); see its log").into());
            }
            if let Ok(tcp) = TcpStream::connect(("127.0.0.1", admin)).await {
                let mut sender = handshake(tcp).await?;
                let req = Request::get("/readyz").header("host", "localhost");
                let resp = sender
                    .send_request(req.body(Full::new(Bytes::new()))?)
                    .await?;
                if resp.status() == StatusCode::OK {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err("tollgate not ready within 10 s".into())
    }

    /// SIGTERM, then waits for it to exit: an instrumented build writes
    /// its counts as it exits.
    fn stop(&mut self) -> Result<(), Error> {
        // The shell's own `kill`: slim images have no /bin/kill.
        let kill = format!("kill -TERM {}", self.0.id());
        Command::new("sh").args(["-c", &kill]).status()?;
        let status = self.0.wait()?;
        if !status.success() {
            return Err(format!("tollgate exited with {status}").into());
        }
        Ok(())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `redis-server` of its own for the Redis store's path, when installed.
struct Redis {
    port: u16,
    child: Child,
}

impl Redis {
    /// Starts it and waits (5 s at most) until it takes connections.
    async fn start(dir: &Path) -> Result<Option<Redis>, Error> {
        let port = free_port()?;
        let spawned = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .spawn();
        let Ok(child) = spawned else {
            eprintln!("pgo_train: redis-server not installed, the Redis store is not trained (apt-get install redis-server)");
            return Ok(None);
        };
        let mut redis = Redis { port, child };
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            if Instant::now() > deadline {
                redis.stop();
                return Err("redis-server did not start within 5 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Some(redis))
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}
