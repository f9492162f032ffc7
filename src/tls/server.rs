//! TLS termination: loads PEM certificate chains and keys, picks a
//! certificate by SNI from the names in each certificate's SANs (exact name
//! first, then `*.` wildcard, then the first certificate as the default), and
//! offers ALPN `h2` then `http/1.1`. rustls speaks TLS 1.2 and 1.3 only.
//! Also the stream TLS runs on, on both sides of the proxy (`SendOne`).

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::crypto::ring::{default_provider, Ticketer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Picks the certificate for a handshake.
#[derive(Debug)]
struct SniResolver {
    /// Lower-case DNS name -> certificate.
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `.example.com` (from `*.example.com`) -> certificate.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    /// Answers clients that send no SNI (or a name no certificate has), so
    /// `curl https://1.2.3.4` still gets a certificate, like nginx's default.
    default: Arc<CertifiedKey>,
}

impl SniResolver {
    fn pick(&self, name: Option<&str>) -> Arc<CertifiedKey> {
        let Some(name) = name else {
            return self.default.clone();
        };
        let name = name.to_ascii_lowercase();
        if let Some(k) = self.exact.get(&name) {
            return k.clone();
        }
        if let Some(dot) = name.find('.') {
            if let Some(k) = self.wildcard.get(&name[dot..]) {
                return k.clone();
            }
        }
        self.default.clone()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.pick(hello.server_name()))
    }
}

/// One problem with the listener's `tls`: (where under it, e.g.
/// `certs[0].key`, or empty for the block itself; message).
pub type TlsProblem = (String, String);

/// Where under `tls` field `field` ("cert" or "key") of pair `i` is.
fn pair_field(i: usize, field: &str) -> String {
    format!("certs[{i}].{field}")
}

/// Builds the listener's rustls config from `(cert.pem, key.pem)` paths.
/// With `session_tickets`, clients resume their sessions from tickets
/// (nginx's `ssl_session_tickets on`, its default): no signature, no
/// certificate, and nothing stored per client; without, from rustls's
/// in-memory cache of the last 256 sessions. Each config gets keys of its
/// own (rotated by rustls every 6 hours), so that after a reload, which may
/// rotate a certificate, no session made before it resumes: as with
/// nginx's keys, made anew on each reload. Returns the names served, for
/// `tollgate check`.
pub fn server_config(
    pairs: &[(&str, &str)],
    session_tickets: bool,
) -> Result<(Arc<rustls::ServerConfig>, Vec<String>), Vec<TlsProblem>> {
    let provider = Arc::new(default_provider());
    let mut problems = Vec::new();
    let mut exact = HashMap::new();
    let mut wildcard = HashMap::new();
    let mut default = None;
    let mut names = Vec::new();
    for (i, (cert_path, key_path)) in pairs.iter().enumerate() {
        let chain: Result<Vec<CertificateDer<'static>>, _> =
            CertificateDer::pem_file_iter(cert_path).and_then(|it| it.collect());
        let chain = match chain {
            Ok(c) if !c.is_empty() => c,
            Ok(_) => {
                problems.push((
                    pair_field(i, "cert"),
                    format!("{cert_path} holds no PEM certificate"),
                ));
                continue;
            }
            Err(e) => {
                problems.push((
                    pair_field(i, "cert"),
                    format!("cannot load {cert_path}: {e}"),
                ));
                continue;
            }
        };
        let key = match PrivateKeyDer::from_pem_file(key_path) {
            Ok(k) => k,
            Err(e) => {
                problems.push((
                    pair_field(i, "key"),
                    format!("cannot load a private key from {key_path}: {e}"),
                ));
                continue;
            }
        };
        let certified = match CertifiedKey::from_der(chain, key, &provider) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                problems.push((
                    pair_field(i, "key"),
                    format!("{key_path} does not fit {cert_path}: {e}"),
                ));
                continue;
            }
        };
        let sans = match dns_names(&certified.cert[0]) {
            Ok(n) => n,
            Err(e) => {
                problems.push((pair_field(i, "cert"), format!("{cert_path}: {e}")));
                continue;
            }
        };
        for name in sans {
            let lower = name.to_ascii_lowercase();
            match lower.strip_prefix('*') {
                Some(suffix) => wildcard
                    .entry(suffix.to_owned())
                    .or_insert_with(|| certified.clone()),
                None => exact
                    .entry(lower.clone())
                    .or_insert_with(|| certified.clone()),
            };
            names.push(lower);
        }
        default.get_or_insert_with(|| certified.clone());
    }
    let Some(default) = default else {
        return Err(problems);
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    let resolver = SniResolver {
        exact,
        wildcard,
        default,
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| vec![(String::new(), format!("tls setup failed: {e}"))])?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    if session_tickets {
        config.ticketer = Ticketer::new().map_err(|e| {
            let why = format!("cannot make session ticket keys: {e}");
            vec![("session_tickets".to_owned(), why)]
        })?;
    }
    Ok((Arc::new(config), names))
}

/// The DNS names (wildcards included) in a certificate's SAN list, read by
/// the X.509 parser rustls itself uses. (SNI carries no IP address, so IP
/// SANs select nothing.)
fn dns_names(der: &CertificateDer<'_>) -> Result<Vec<String>, String> {
    let cert = webpki::EndEntityCert::try_from(der)
        .map_err(|e| format!("not a valid X.509 certificate: {e}"))?;
    Ok(cert.valid_dns_names().map(str::to_owned).collect())
}

/// The stream under a TLS session, passed through but for one thing:
/// tokio-rustls writes every record vectored, which a TCP stream sends
/// with `writev` even for the one slice a record usually is; this sends
/// one slice with a plain write (`send`, the shorter path in the kernel),
/// as the HTTP/1 writers do on plain connections (`poll_write_bufs`).
pub struct SendOne<I>(pub I);

impl<I> SendOne<I> {
    pub fn get_ref(&self) -> &I {
        &self.0
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for SendOne<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for SendOne<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // One slice by a plain write (`http1::poll_write_bufs` does the
        // same for the HTTP/1 writers; this floor does not import it).
        let io = Pin::new(&mut self.get_mut().0);
        match bufs {
            [one] => io.poll_write(cx, one),
            _ => io.poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}
