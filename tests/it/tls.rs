//! TLS listeners: rcgen-made CA and certificates, SNI picks the matching
//! certificate (the first is the default), ALPN negotiates h2, and
//! `X-Forwarded-Proto` says https.

use crate::common::*;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use sha2::{Digest, Sha256};

fn tls_yaml(ca: &TestCa, up: &Upstream) -> String {
    let (api_cert, api_key) = ca.leaf("api", &["api.example.com"]);
    let (www_cert, www_key) = ca.leaf("www", &["www.example.com", "*.shop.example.com"]);
    format!(
        "listeners:\n  - name: public\n    bind: '127.0.0.1:0'\n    tls:\n      certs:\n        - {{ cert: '{api_cert}', key: '{api_key}' }}\n        - {{ cert: '{www_cert}', key: '{www_key}' }}\nadmin: {{ enabled: false }}\nlog: {{ access_log: false }}\nupstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, upstream: api }}\n",
        up.addr
    )
}

/// The first DNS name in the certificate the server presented.
fn served_name(stream: &tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> String {
    let certs = stream
        .get_ref()
        .1
        .peer_certificates()
        .expect("server certificate");
    let cert = webpki::EndEntityCert::try_from(&certs[0]).unwrap();
    let first = cert.valid_dns_names().next().expect("a DNS name");
    first.to_owned()
}

#[tokio::test]
async fn sni_picks_the_matching_certificate() {
    let ca = TestCa::new();
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&tls_yaml(&ca, &up)).await;
    let cfg = ca.client_config(&[b"http/1.1"]);

    let s = tls_connect(proxy.addr(), cfg.clone(), "www.example.com").await;
    assert_eq!(served_name(&s), "www.example.com");
    let s = tls_connect(proxy.addr(), cfg.clone(), "api.example.com").await;
    assert_eq!(served_name(&s), "api.example.com");
    // Wildcard SAN.
    let s = tls_connect(proxy.addr(), cfg.clone(), "eu.shop.example.com").await;
    assert_eq!(served_name(&s), "www.example.com");
}

#[tokio::test]
async fn unknown_names_get_the_default_certificate() {
    let ca = TestCa::new();
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&tls_yaml(&ca, &up)).await;
    // The client verifies against api.example.com but sends no SNI: rustls
    // omits SNI for IP addresses, so connect by IP and accept the default.
    let mut cfg = (*ca.client_config(&[b"http/1.1"])).clone();
    cfg.enable_sni = false;
    let s = tls_connect(proxy.addr(), std::sync::Arc::new(cfg), "api.example.com").await;
    assert_eq!(
        served_name(&s),
        "api.example.com",
        "the first certificate is the default"
    );
}

#[tokio::test]
async fn alpn_negotiates_h2_and_requests_are_forwarded() {
    let ca = TestCa::new();
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&tls_yaml(&ca, &up)).await;

    let s = tls_connect(
        proxy.addr(),
        ca.client_config(&[b"h2", b"http/1.1"]),
        "api.example.com",
    )
    .await;
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut c, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method("POST")
        .uri("https://api.example.com/tls?q=1")
        .body(full(&b"secret payload"[..]))
        .unwrap();
    let got = collect(c.send_request(req).await.unwrap()).await;
    assert_eq!(got.status, 200);
    let seen = got.json();
    assert_eq!(seen["body"], "secret payload");
    assert_eq!(seen["headers"]["x-forwarded-proto"], "https");
    assert_eq!(seen["headers"]["host"], "api.example.com");

    // HTTP/1.1 over TLS too.
    let s = tls_connect(
        proxy.addr(),
        ca.client_config(&[b"http/1.1"]),
        "api.example.com",
    )
    .await;
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let mut c = h1_over(s).await;
    let got = send1(&mut c, request("GET", "/tls1", empty())).await;
    assert_eq!(got.json()["headers"]["x-forwarded-proto"], "https");
}

#[tokio::test]
async fn plain_http_on_a_tls_port_is_refused() {
    let ca = TestCa::new();
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&tls_yaml(&ca, &up)).await;
    let out = raw(
        proxy.addr(),
        b"GET / HTTP/1.1\r\nhost: a\r\n\r\n",
        std::time::Duration::from_secs(2),
    )
    .await;
    assert!(
        !out.contains("HTTP/1.1 200"),
        "plain HTTP must not be served on a TLS port: {out}"
    );
    assert_eq!(up.hits(), 0);
}

#[tokio::test]
async fn a_silent_client_is_dropped_after_the_handshake_timeout() {
    let ca = TestCa::new();
    let (cert, key) = ca.leaf("api", &["api.example.com"]);
    let yaml = format!(
        "listeners:\n  - {{ bind: '127.0.0.1:0', tls: {{ handshake_timeout: 300ms, certs: [{{ cert: '{cert}', key: '{key}' }}] }} }}\nadmin: {{ enabled: false }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, respond: {{ body: ok }} }}\n"
    );
    let proxy = TestProxy::spawn(&yaml).await;
    use tokio::io::AsyncReadExt;
    let mut tcp = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let started = tokio::time::Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), tcp.read(&mut buf))
        .await
        .expect("the connection must be closed, not left open")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(started.elapsed() >= std::time::Duration::from_millis(300));
}

#[tokio::test]
async fn tls_1_2_and_1_3_clients_are_both_served() {
    let ca = TestCa::new();
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&tls_yaml(&ca, &up)).await;
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let base = ca.client_config(&[b"http/1.1"]);
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(
            rustls_pki_types::CertificateDer::pem_file_iter(&ca.ca_pem)
                .unwrap()
                .map(|c| c.unwrap()),
        );
        let mut cfg = rustls::ClientConfig::builder_with_provider(base.crypto_provider().clone())
            .with_protocol_versions(&[version])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let s = tls_connect(proxy.addr(), std::sync::Arc::new(cfg), "api.example.com").await;
        assert_eq!(s.get_ref().1.protocol_version(), Some(version.version));
        let mut c = h1_over(s).await;
        assert_eq!(
            send1(&mut c, request("GET", "/v", empty())).await.status,
            200
        );
    }
}

#[tokio::test]
async fn large_bodies_cross_tls_on_both_sides_intact() {
    // A TLS listener in front of an HTTPS upstream: 16 MB up and 16 MB
    // down over HTTP/1.1, so that every write on both TLS streams (records
    // of one slice and of several, partial writes under back-pressure)
    // carries real data; checked by hash at the far end.
    const SIZE: u64 = 16 * 1024 * 1024;
    let ca = TestCa::new();
    let up = Upstream::spawn_tls(ca.acceptor(&["api.internal"])).await;
    let (cert, key) = ca.leaf("edge", &["api.example.com"]);
    let yaml = format!(
        "listeners:\n  - bind: '127.0.0.1:0'\n    tls: {{ certs: [{{ cert: '{cert}', key: '{key}' }}] }}\nadmin: {{ enabled: false }}\nlog: {{ access_log: false }}\nserver: {{ max_body_size: 64MB }}\nupstreams:\n  api: {{ targets: ['{}'], tls: {{ ca: '{}', server_name: api.internal }} }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, upstream: api }}\n",
        up.addr,
        ca.ca_pem.display()
    );
    let proxy = TestProxy::spawn(&yaml).await;
    let s = tls_connect(
        proxy.addr(),
        ca.client_config(&[b"http/1.1"]),
        "api.example.com",
    )
    .await;
    let mut c = h1_over(s).await;

    let got = send1(&mut c, request("POST", "/upload", pattern(SIZE))).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["body_len"], SIZE);
    assert_eq!(got.json()["body_sha256"], Pattern::sha256(SIZE));

    // The same connection, the other way.
    let got = send1(
        &mut c,
        request("GET", &format!("/download?bytes={SIZE}"), empty()),
    )
    .await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body.len() as u64, SIZE);
    assert_eq!(hex(&Sha256::digest(&got.body)), Pattern::sha256(SIZE));
}

/// Connects with `config`, sends one request (its answer brings the
/// session tickets along), and says how the handshake went.
async fn one_session(
    addr: std::net::SocketAddr,
    config: std::sync::Arc<rustls::ClientConfig>,
) -> rustls::HandshakeKind {
    let s = tls_connect(addr, config, "api.example.com").await;
    let kind = s.get_ref().1.handshake_kind().expect("handshake done");
    let mut c = h1_over(s).await;
    assert_eq!(
        send1(&mut c, request("GET", "/s", empty())).await.status,
        200
    );
    kind
}

#[tokio::test]
async fn sessions_resume_from_tickets_however_many_clients_came_between() {
    // With tickets (the default) a client resumes after 300 others; with
    // `session_tickets: false` only rustls's cache of the last 256 sessions
    // (two per handshake) remains, which those 300 have pushed it out of.
    let ca = TestCa::new();
    let up = Upstream::spawn().await;
    for (tickets, resumes) in [(true, true), (false, false)] {
        let yaml = tls_yaml(&ca, &up).replace(
            "    tls:\n",
            &format!("    tls:\n      session_tickets: {tickets}\n"),
        );
        let proxy = TestProxy::spawn(&yaml).await;
        let returning = ca.client_config(&[b"http/1.1"]);
        let first = one_session(proxy.addr(), returning.clone()).await;
        assert_eq!(first, rustls::HandshakeKind::Full);
        assert_eq!(
            one_session(proxy.addr(), returning.clone()).await,
            rustls::HandshakeKind::Resumed,
            "a client back at once resumes either way (tickets: {tickets})"
        );
        for _ in 0..300 {
            one_session(proxy.addr(), ca.client_config(&[b"http/1.1"])).await;
        }
        let again = one_session(proxy.addr(), returning).await;
        assert_eq!(
            again == rustls::HandshakeKind::Resumed,
            resumes,
            "tickets: {tickets}, handshake: {again:?}"
        );
    }
}
