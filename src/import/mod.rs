//! `tollgate import-nginx`: an nginx config (`limit_req_zone` tier, real
//! IP, locations, upstreams, TLS servers) as a tollgate config, with every
//! directive it does not translate named by file and line.
//!
//! - `reader`: nginx's syntax and `include`s, each directive with its place.
//! - `translate`: directives -> the config types of `config::raw`, written
//!   as YAML with serde, and the notes.
//! - `ingress`: `tollgate import-ingress`, Kubernetes Ingress objects with
//!   ingress-nginx annotations -> Helm values for the chart.

pub(crate) mod ingress;
pub(crate) mod reader;
pub(crate) mod translate;

pub use ingress::{IngressImport, IngressNote, ManifestError, Options as IngressOptions};
pub use reader::{read, Directive, Place, ReadError};
pub use translate::{translate, Import, Note, Severity};

/// Reads and translates the nginx config at `path`.
pub fn import(path: &std::path::Path) -> Result<Import, ReadError> {
    Ok(translate(&read(path)?))
}

/// Reads and translates Kubernetes manifests (`(name, text)` each).
pub fn import_ingress(
    sources: &[(String, String)],
    options: &ingress::Options,
) -> Result<IngressImport, ManifestError> {
    ingress::import(sources, options)
}
