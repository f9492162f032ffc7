//! The world the integration tests build: a spawned hyper upstream that
//! echoes what it received, an in-process tollgate on 127.0.0.1:0, an rcgen
//! CA with leaf certificates, and small HTTP/1.1, HTTP/2 and TLS clients.
#![allow(dead_code)]

pub mod browser;
pub mod process;
pub mod redis;

#[allow(unused_imports)]
pub use process::{write_config, Running, BIN};

use std::convert::Infallible;
use std::error::Error as StdError;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_rustls::{TlsAcceptor, TlsConnector};

pub type BoxError = Box<dyn StdError + Send + Sync>;
pub type ClientBody = BoxBody<Bytes, BoxError>;

// ----------------------------------------------------------------- waits

/// Polls `check` until it gives a value and returns it; fails naming
/// `what` once `within` has passed. Events are ordered by the condition,
/// never by a fixed pause: this is the one place the tests wait on real
/// time between looks (the pause only paces them), and `within` is a
/// generous bound that catches a hang, not a timing assertion.
pub async fn until_some<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`until_some`] for a condition.
pub async fn until<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    until_some(within, what, || {
        let f = check();
        async move { f.await.then_some(()) }
    })
    .await
}

// ---------------------------------------------------------------- bodies

/// A deterministic stream of `len` bytes in 64 KiB chunks, never held whole.
pub struct Pattern {
    remaining: u64,
    offset: u64,
}

pub fn pattern_byte(i: u64) -> u8 {
    ((i.wrapping_mul(31) + 7) % 251) as u8
}

impl Pattern {
    pub fn new(len: u64) -> Self {
        Pattern {
            remaining: len,
            offset: 0,
        }
    }

    /// The SHA-256 of the whole stream, computed chunk by chunk.
    pub fn sha256(len: u64) -> String {
        let mut h = Sha256::new();
        let mut p = Pattern::new(len);
        while let Some(chunk) = p.next_chunk() {
            h.update(&chunk);
        }
        hex(&h.finalize())
    }

    fn next_chunk(&mut self) -> Option<Bytes> {
        if self.remaining == 0 {
            return None;
        }
        let n = self.remaining.min(64 * 1024);
        let chunk: Vec<u8> = (self.offset..self.offset + n).map(pattern_byte).collect();
        self.offset += n;
        self.remaining -= n;
        Some(Bytes::from(chunk))
    }
}

impl Body for Pattern {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.next_chunk().map(|c| Ok(Frame::data(c))))
    }
    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

/// Sends 1000 bytes, waits so they reach the client, then fails: an
/// upstream dying mid-body.
struct DiesMidBody {
    sent: bool,
    pause: Pin<Box<tokio::time::Sleep>>,
}

impl Body for DiesMidBody {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        use std::future::Future;
        if !self.sent {
            self.sent = true;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; 1000])))));
        }
        match self.pause.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err("upstream crashed".into()))),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A secret's SHA-256 in hex, as key metadata files list keys.
pub fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(s.as_bytes()))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn full(data: impl Into<Bytes>) -> ClientBody {
    Full::new(data.into())
        .map_err(|e: Infallible| match e {})
        .boxed()
}

pub fn empty() -> ClientBody {
    full(Bytes::new())
}

pub fn pattern(len: u64) -> ClientBody {
    Pattern::new(len)
        .map_err(|e: Infallible| match e {})
        .boxed()
}

/// A body sent as chunked (no size hint) in pieces.
pub fn chunked(pieces: Vec<&'static [u8]>) -> ClientBody {
    struct Chunks(std::collections::VecDeque<&'static [u8]>);
    impl Body for Chunks {
        type Data = Bytes;
        type Error = BoxError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(
                self.0
                    .pop_front()
                    .map(|c| Ok(Frame::data(Bytes::from_static(c)))),
            )
        }
    }
    Chunks(pieces.into()).boxed()
}

// -------------------------------------------------------------- upstream

/// For upstreams written byte by byte: reads one request head, returning
/// its target and its `Content-Length` (0 without one); `None` when the
/// peer closed or sent no HTTP head.
pub async fn read_head(r: &mut tokio::io::BufReader<TcpStream>) -> Option<(String, usize)> {
    use tokio::io::AsyncBufReadExt;
    let mut target = None;
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        if target.is_none() {
            target = line.split(' ').nth(1).map(str::to_owned);
        } else if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
        if line == "\r\n" {
            return Some((target?, length));
        }
    }
}

/// A hyper upstream on 127.0.0.1 that echoes requests as JSON and has a
/// few misbehaving paths. Stops when dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    /// Requests received.
    pub hits: Arc<AtomicUsize>,
    /// TCP connections accepted.
    pub conns: Arc<AtomicUsize>,
    _stop: oneshot::Sender<()>,
}

impl Upstream {
    pub async fn spawn() -> Upstream {
        Self::spawn_with(None).await
    }

    pub async fn spawn_tls(acceptor: TlsAcceptor) -> Upstream {
        Self::spawn_with(Some(acceptor)).await
    }

    async fn spawn_with(tls: Option<TlsAcceptor>) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let conns = Arc::new(AtomicUsize::new(0));
        let (stop, mut stopped) = oneshot::channel::<()>();
        let (h, c) = (hits.clone(), conns.clone());
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
                    _ = &mut stopped => return,
                };
                c.fetch_add(1, Ordering::SeqCst);
                let hits = h.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        hits.fetch_add(1, Ordering::SeqCst);
                        upstream_answer(req, addr)
                    });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    match tls {
                        Some(acc) => {
                            if let Ok(s) = acc.accept(tcp).await {
                                let _ = builder
                                    .serve_connection_with_upgrades(TokioIo::new(s), svc)
                                    .await;
                            }
                        }
                        None => {
                            let _ = builder
                                .serve_connection_with_upgrades(TokioIo::new(tcp), svc)
                                .await;
                        }
                    }
                });
            }
        });
        Upstream {
            addr,
            hits,
            conns,
            _stop: stop,
        }
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    pub fn conns(&self) -> usize {
        self.conns.load(Ordering::SeqCst)
    }
}

fn query(req: &Request<Incoming>, key: &str) -> Option<u64> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.parse().ok()).flatten()
    })
}

async fn upstream_answer(
    mut req: Request<Incoming>,
    server: SocketAddr,
) -> Result<Response<ClientBody>, Infallible> {
    let path = req.uri().path().to_owned();
    let resp = |status: u16, body: ClientBody| {
        let mut r = Response::new(body);
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        r
    };
    // The pauses below are how a slow or hanging upstream behaves; tests
    // wait on the answers, never on these.
    Ok(match path.as_str() {
        "/hang" => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            resp(200, empty())
        }
        "/slow" => {
            tokio::time::sleep(Duration::from_millis(query(&req, "ms").unwrap_or(1000))).await;
            resp(200, full("slow done"))
        }
        "/download" => {
            let n = query(&req, "bytes").unwrap_or(1024);
            resp(200, pattern(n))
        }
        "/die-mid-body" => {
            let pause = Duration::from_millis(query(&req, "pause_ms").unwrap_or(200));
            let mut r = resp(
                200,
                DiesMidBody {
                    sent: false,
                    pause: Box::pin(tokio::time::sleep(pause)),
                }
                .boxed(),
            );
            r.headers_mut()
                .insert("content-length", "100000".parse().unwrap());
            r
        }
        "/status" => resp(query(&req, "code").unwrap_or(200) as u16, full("status")),
        "/refuse-upgrade" => {
            let mut r = resp(
                query(&req, "status").unwrap_or(426) as u16,
                full("no upgrade for you"),
            );
            r.headers_mut().insert("x-refused", "1".parse().unwrap());
            r
        }
        "/own-rate-limit-fields" => {
            // An upstream that rate-limits too, and says so.
            let mut r = resp(200, full("limited upstream"));
            for (name, value) in [
                ("x-ratelimit-limit", "7"),
                ("ratelimit", "\"upstream\";r=6;t=9"),
                ("x-ratelimit-warning", "upstream: 6 of 7 used"),
            ] {
                r.headers_mut().insert(name, value.parse().unwrap());
            }
            r
        }
        "/ws" => websocket(&mut req),
        _ => echo(req, server).await,
    })
}

/// Accepts a WebSocket upgrade and echoes every message back.
fn websocket(req: &mut Request<Incoming>) -> Response<ClientBody> {
    use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
    let key = req.headers().get("sec-websocket-key").cloned();
    let Some(key) = key else {
        let mut r = Response::new(full("not a websocket request"));
        *r.status_mut() = StatusCode::BAD_REQUEST;
        return r;
    };
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        use futures_util::{SinkExt, StreamExt};
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        while let Some(Ok(msg)) = ws.next().await {
            if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                return;
            }
        }
    });
    let mut r = Response::new(empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    r.headers_mut()
        .insert("connection", "upgrade".parse().unwrap());
    r.headers_mut()
        .insert("upgrade", "websocket".parse().unwrap());
    r.headers_mut().insert(
        "sec-websocket-accept",
        derive_accept_key(key.as_bytes()).parse().unwrap(),
    );
    r
}

/// Echoes method, path, headers and a streaming hash of the body, and
/// which upstream (`server`) answered.
async fn echo(req: Request<Incoming>, server: SocketAddr) -> Response<ClientBody> {
    let (parts, mut body) = req.into_parts();
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    let mut text = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        if let Some(d) = frame.data_ref() {
            hasher.update(d);
            len += d.len() as u64;
            if text.len() < 4096 {
                text.extend_from_slice(d);
            }
        }
    }
    let mut headers = serde_json::Map::new();
    for name in parts.headers.keys() {
        let values: Vec<String> = parts
            .headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        headers.insert(
            name.as_str().to_owned(),
            serde_json::Value::String(values.join(", ")),
        );
    }
    let json = serde_json::json!({
        "method": parts.method.as_str(),
        "uri": parts.uri.to_string(),
        "version": format!("{:?}", parts.version),
        "headers": headers,
        "body_len": len,
        "body_sha256": hex(&hasher.finalize()),
        "body": String::from_utf8_lossy(&text),
        "server": server.to_string(),
    });
    let mut r = Response::new(full(json.to_string()));
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}

// ----------------------------------------------------------------- proxy

/// tollgate running in-process on the YAML given. Listeners bind
/// 127.0.0.1:0; `addr(name)` tells the real port. Shuts down when dropped.
pub struct TestProxy {
    pub addrs: Vec<(String, SocketAddr)>,
    pub admin: Option<SocketAddr>,
    /// The running request path (counters a test may read).
    pub pipeline: Arc<tollgate::pipeline::Pipeline>,
    stop: Option<oneshot::Sender<()>>,
    pub done: Option<tokio::task::JoinHandle<()>>,
    /// Reloads the config file (for proxies started with `spawn_file`).
    pub reload: tollgate::reload::ReloadHandle,
    /// The request path running now (a reload replaces it).
    pub live: tollgate::pipeline::Live,
}

impl TestProxy {
    pub async fn spawn(yaml: &str) -> TestProxy {
        Self::spawn_clocked(yaml, tollgate::clock::Clock::system()).await
    }

    /// On a clock that stands still until the test advances it: limits,
    /// pool ages and cool-downs move only with it (socket timeouts still
    /// run on real time).
    pub async fn spawn_frozen(yaml: &str) -> (TestProxy, tollgate::clock::FrozenClock) {
        let frozen = tollgate::clock::FrozenClock::new();
        (Self::spawn_clocked(yaml, frozen.clock()).await, frozen)
    }

    /// [`TestProxy::spawn_frozen`], its clock stopped at `unix_ms`.
    pub async fn spawn_at(yaml: &str, unix_ms: u64) -> (TestProxy, tollgate::clock::FrozenClock) {
        let frozen = tollgate::clock::FrozenClock::at_unix_ms(unix_ms);
        (Self::spawn_clocked(yaml, frozen.clock()).await, frozen)
    }

    async fn spawn_clocked(yaml: &str, clock: tollgate::clock::Clock) -> TestProxy {
        let config = tollgate::Config::from_yaml(yaml, &|name| std::env::var(name).ok())
            .unwrap_or_else(|e| panic!("test config is invalid: {e}\n{yaml}"));
        let server = tollgate::Server::bind_with_clock(config, clock).await;
        Self::start(server.expect("bind"))
    }

    /// tollgate on the config file at `path`, which reloads read again.
    pub async fn spawn_file(path: &std::path::Path) -> TestProxy {
        let config = tollgate::Config::from_file(path)
            .unwrap_or_else(|e| panic!("test config is invalid: {e}"));
        let server = tollgate::Server::bind(config).await.expect("bind");
        Self::start(server.with_source(path.to_owned()))
    }

    fn start(server: tollgate::Server) -> TestProxy {
        let addrs = server.addrs();
        let admin = server.admin_addr();
        let pipeline = server.pipeline();
        let reload = server.reload_handle();
        let live = server.live();
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        TestProxy {
            addrs,
            admin,
            pipeline,
            stop: Some(stop),
            done: Some(done),
            reload,
            live,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addrs[0].1
    }

    pub fn addr_of(&self, name: &str) -> SocketAddr {
        self.addrs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| *a)
            .expect("listener")
    }

    /// Starts the graceful shutdown and returns the run task to await.
    pub fn shutdown(&mut self) -> tokio::task::JoinHandle<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.done.take().expect("running")
    }
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// A minimal config around the given routes/upstreams, admin off.
pub fn config(rest: &str) -> String {
    format!("listeners:\n  - {{ name: plain, bind: '127.0.0.1:0' }}\nadmin: {{ enabled: false }}\nlog: {{ access_log: false }}\n{rest}")
}

/// One upstream `api` over `targets` (YAML list items such as `'127.0.0.1:80'`)
/// with `upstream_extra` settings, a catch-all route to it, and `extra`
/// top-level YAML (a `server:` section, more routes after `routes:` ...).
pub fn forward_all(targets: &str, upstream_extra: &str, extra: &str) -> String {
    config(&format!(
        "{extra}\nupstreams:\n  api: {{ targets: [{targets}] {upstream_extra} }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, upstream: api }}\n"
    ))
}

/// `forward_all` to one spawned upstream.
pub fn proxied(up: &Upstream) -> String {
    forward_all(&format!("'{}'", up.addr), "", "")
}

// --------------------------------------------------------------- clients

/// What a test client got back.
#[derive(Debug)]
pub struct Got {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Got {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The echo upstream's view of a forwarded header.
    pub fn seen_header(&self, name: &str) -> Option<String> {
        self.json()["headers"][name].as_str().map(str::to_owned)
    }
}

pub async fn h1(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<ClientBody> {
    h1_over(TcpStream::connect(addr).await.unwrap()).await
}

/// An HTTP/1.1 client on `io` (a TCP stream, a TLS session), its
/// connection driven by a task of its own.
pub async fn h1_over<S>(io: S) -> hyper::client::conn::http1::SendRequest<ClientBody>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(conn.with_upgrades());
    sender
}

pub async fn h2(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<ClientBody> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

pub async fn collect(resp: Response<Incoming>) -> Got {
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("response body").to_bytes();
    Got {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub async fn send1(
    sender: &mut hyper::client::conn::http1::SendRequest<ClientBody>,
    req: Request<ClientBody>,
) -> Got {
    sender.ready().await.unwrap();
    collect(sender.send_request(req).await.expect("response")).await
}

pub fn request(method: &str, path: &str, body: ClientBody) -> Request<ClientBody> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", "test.local")
        .body(body)
        .unwrap()
}

/// One HTTP/1.1 request to host `api.test` with extra `headers`, on a
/// fresh connection.
pub async fn send_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &'static [u8],
) -> Got {
    let mut c = h1(addr).await;
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "api.test");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    send1(&mut c, req.body(full(body)).unwrap()).await
}

/// A GET from `from` (another loopback address such as 127.0.0.2), so a
/// test can play several clients with different IPs.
pub async fn get_from(from: &str, addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Got {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut sender = h1_over(socket.connect(addr).await.unwrap()).await;
    let mut req = Request::get(path).header("host", "api.test");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    send1(&mut sender, req.body(empty()).unwrap()).await
}

/// One HTTP/1.1 request on a fresh connection.
pub async fn get(addr: SocketAddr, path: &str) -> Got {
    let mut s = h1(addr).await;
    send1(&mut s, request("GET", path, empty())).await
}

/// Writes raw bytes and reads until the peer closes or `wait` passes.
pub async fn raw(addr: SocketAddr, bytes: &[u8], wait: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, tcp.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

// ------------------------------------------------------------------ TLS

/// A throwaway CA that signs leaf certificates into a temp dir.
pub struct TestCa {
    pub dir: tempfile::TempDir,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub ca_pem: PathBuf,
    ca_der: rustls_pki_types::CertificateDer<'static>,
}

impl TestCa {
    pub fn new() -> TestCa {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "tollgate test CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let cert = params.self_signed(&key).unwrap();
        let ca_pem = dir.path().join("ca.pem");
        std::fs::write(&ca_pem, cert.pem()).unwrap();
        let ca_der = cert.der().clone();
        TestCa {
            dir,
            issuer: rcgen::Issuer::new(params, key),
            ca_pem,
            ca_der,
        }
    }

    /// Writes `<name>.pem` (leaf + CA chain) and `<name>.key`; returns their paths.
    pub fn leaf(&self, file: &str, names: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, names[0]);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let cert_path = self.dir.path().join(format!("{file}.pem"));
        let key_path = self.dir.path().join(format!("{file}.key"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (
            cert_path.display().to_string(),
            key_path.display().to_string(),
        )
    }

    pub fn client_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).unwrap();
        let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(c)
    }

    /// A server-side acceptor for a leaf (for TLS upstreams).
    pub fn acceptor(&self, names: &[&str]) -> TlsAcceptor {
        let (cert, key) = self.leaf(&format!("up-{}", names[0]), names);
        let (config, _) = tollgate::tls::server_config(&[(&cert, &key)], true).unwrap();
        TlsAcceptor::from(config)
    }
}

/// Connects with TLS; returns the stream for the caller's HTTP client.
pub async fn tls_connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    sni: &str,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from(sni.to_owned()).unwrap();
    TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .expect("TLS handshake")
}

// ----------------------------------------------------------------- metrics and alerts

/// The value of the series named exactly `series` (name and labels).
pub fn value(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// An HTTP receiver for alert webhooks: every POST's signature header and
/// body, in order. `answer: false` accepts connections and never answers.
pub async fn receiver(
    answer: bool,
) -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
) {
    use http_body_util::BodyExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            if !answer {
                held.push(tcp);
                continue;
            }
            let tx = tx.clone();
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let tx = tx.clone();
                        async move {
                            let sig = req
                                .headers()
                                .get("x-tollgate-signature")
                                .map(|v| v.to_str().unwrap().to_owned())
                                .unwrap_or_default();
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let _ = tx.send((sig, String::from_utf8_lossy(&body).into_owned()));
                            Ok::<_, std::convert::Infallible>(http::Response::new(empty()))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (addr, rx)
}

/// An admin API call with `token`.
pub async fn admin_with(
    proxy: &TestProxy,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Got {
    let mut c = h1(proxy.admin.expect("admin listener")).await;
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "admin")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(full(body.unwrap_or("").to_owned()))
        .unwrap();
    send1(&mut c, req).await
}

/// The README's YAML block that starts with `start` (after "```yaml\n"),
/// as a config with a listener, loaded with `JWT_SECRET` = `secret`.
pub fn readme_config(start: &str, secret: &str) -> tollgate::Config {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let at = readme
        .find(&format!("```yaml\n{start}"))
        .unwrap_or_else(|| panic!("no README block starts with {start:?}"));
    let block = &readme[at + 8..];
    let block = &block[..block.find("```").unwrap()];
    let yaml = format!("listeners: [{{ bind: '127.0.0.1:0' }}]\n{block}");
    let env = |name: &str| (name == "JWT_SECRET").then(|| secret.to_owned());
    tollgate::Config::from_yaml(&yaml, &env)
        .unwrap_or_else(|e| panic!("the README's example does not load: {e}\n{yaml}"))
}
