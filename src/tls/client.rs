//! TLS towards upstreams: the rustls client config, trusting either the
//! system roots or the CA file named in `upstreams.<name>.tls.ca`.

use std::sync::Arc;

use rustls::crypto::ring::default_provider;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// Builds the client config once per upstream; the error names the file.
pub fn client_config(ca: Option<&str>) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect())
                .map_err(|e| format!("cannot load CA certificates from {path}: {e}"))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(format!("{path} holds no usable CA certificate"));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(
                    "no system CA certificates found (install ca-certificates, or set tls.ca to a PEM file)"
                        .to_owned(),
                );
            }
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("tls setup failed: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // The upstream leg is HTTP/1.1 (it carries upgrades and maps 1:1 onto
    // pooled keep-alive connections).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
