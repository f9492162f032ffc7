//! `tollgate import-ingress`: Kubernetes Ingress objects with
//! ingress-nginx annotations as Helm values for the tollgate chart (a
//! tollgate config under `config`, the TLS Secrets under `tls.secrets`),
//! with every annotation it does not translate named by its object.
//!
//! - here: the manifests (several files, several documents each, `kind:
//!   List` from `kubectl get -o yaml`), read into the Ingress and Service
//!   objects the translation needs.
//! - `translate`: hosts and paths to routes as ingress-nginx reads them,
//!   backends to upstreams, the rate-limit annotations to zones.

mod annotations;
mod controller;
mod translate;

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_yaml::Value;

pub use translate::translate;

/// What the translation says of one object (or the whole input).
#[derive(Debug, Clone, PartialEq)]
pub struct IngressNote {
    /// `Ingress web/api` (and the annotation), or the file.
    pub at: String,
    pub severity: super::Severity,
    pub message: String,
}

/// The values file and what it says about the Ingresses.
#[derive(Debug)]
pub struct IngressImport {
    pub yaml: String,
    pub notes: Vec<IngressNote>,
    /// The tollgate config alone (listeners left to the chart), for checking.
    pub config: Value,
}

impl IngressImport {
    /// Whether something that changes limiting, access or routing was not
    /// translated.
    pub fn lost(&self) -> bool {
        self.notes
            .iter()
            .any(|n| n.severity == super::Severity::Lost)
    }
}

/// Options of the command line.
#[derive(Debug, Clone)]
pub struct Options {
    /// Ingresses of this class (or of none) are translated; others skipped.
    pub class: String,
    /// The cluster's DNS domain, for `<service>.<namespace>.svc.<domain>`.
    pub cluster_domain: String,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            class: "nginx".into(),
            cluster_domain: "cluster.local".into(),
        }
    }
}

/// An Ingress as read (networking.k8s.io/v1, and the v1beta1 shape of
/// `serviceName` / `servicePort` backends).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Ingress {
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: IngressSpec,
    /// Which file and document, for notes.
    #[serde(skip)]
    pub source: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Metadata {
    #[serde(default)]
    pub name: String,
    pub namespace: Option<String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct IngressSpec {
    pub ingress_class_name: Option<String>,
    /// `backend` in v1beta1.
    #[serde(alias = "backend")]
    pub default_backend: Option<Backend>,
    #[serde(default)]
    pub tls: Vec<IngressTls>,
    #[serde(default)]
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct IngressTls {
    pub secret_name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Rule {
    pub host: Option<String>,
    pub http: Option<Http>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Http {
    #[serde(default)]
    pub paths: Vec<HttpPath>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HttpPath {
    pub path: Option<String>,
    pub path_type: Option<String>,
    #[serde(default)]
    pub backend: Backend,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Backend {
    pub service: Option<ServiceBackend>,
    pub service_name: Option<String>,
    pub service_port: Option<Value>,
    pub resource: Option<Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ServiceBackend {
    pub name: String,
    #[serde(default)]
    pub port: ServicePort,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ServicePort {
    pub number: Option<u16>,
    pub name: Option<String>,
}

/// The Services of the input: (namespace, name) -> port name -> number,
/// to resolve backends that name their port.
pub(crate) type Services = BTreeMap<(String, String), BTreeMap<String, u16>>;

/// What the manifests hold, in input order.
#[derive(Debug, Default)]
pub(crate) struct Manifests {
    pub ingresses: Vec<Ingress>,
    pub services: Services,
    /// ConfigMaps: (namespace, name, data, where read).
    pub configmaps: Vec<ConfigMapSeen>,
    /// Objects of other kinds, by kind, with their count.
    pub others: BTreeMap<String, usize>,
}

/// A ConfigMap of the input (the controller's may be among them).
#[derive(Debug, Default)]
pub(crate) struct ConfigMapSeen {
    pub namespace: String,
    pub name: String,
    pub data: BTreeMap<String, String>,
}

/// Why the manifests could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{source_name}: document {document}: {message}")]
    Yaml {
        source_name: String,
        document: usize,
        message: String,
    },
}

/// Reads every document of every `(name, text)` source.
pub(crate) fn read(sources: &[(String, String)]) -> Result<Manifests, ManifestError> {
    let mut out = Manifests::default();
    for (name, text) in sources {
        for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let value = Value::deserialize(document).map_err(|e| ManifestError::Yaml {
                source_name: name.clone(),
                document: i + 1,
                message: e.to_string(),
            })?;
            let at = format!("{name}, document {}", i + 1);
            object(value, &at, &mut out).map_err(|message| ManifestError::Yaml {
                source_name: name.clone(),
                document: i + 1,
                message,
            })?;
        }
    }
    Ok(out)
}

/// One object, or each item of a `List`.
fn object(value: Value, at: &str, out: &mut Manifests) -> Result<(), String> {
    if value.is_null() {
        return Ok(());
    }
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    match kind.as_str() {
        "List" | "IngressList" | "ServiceList" => {
            let items = value.get("items").and_then(Value::as_sequence);
            for item in items.into_iter().flatten() {
                object(item.clone(), at, out)?;
            }
        }
        "Ingress" => {
            let mut ingress: Ingress =
                serde_yaml::from_value(value).map_err(|e| format!("an Ingress: {e}"))?;
            ingress.source = at.to_owned();
            out.ingresses.push(ingress);
        }
        "Service" => {
            let field = |k: &str| metadata(&value, k);
            let ports = value
                .get("spec")
                .and_then(|s| s.get("ports"))
                .and_then(Value::as_sequence);
            let named = ports
                .into_iter()
                .flatten()
                .filter_map(|p| {
                    let name = p.get("name")?.as_str()?.to_owned();
                    let port = u16::try_from(p.get("port")?.as_u64()?).ok()?;
                    Some((name, port))
                })
                .collect();
            let key = (
                field("namespace").unwrap_or_else(|| "default".into()),
                field("name").unwrap_or_default(),
            );
            out.services.insert(key, named);
        }
        "ConfigMap" => {
            let field = |k: &str| metadata(&value, k);
            let data = value
                .get("data")
                .and_then(Value::as_mapping)
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), annotation_text(v))))
                .collect();
            out.configmaps.push(ConfigMapSeen {
                namespace: field("namespace").unwrap_or_else(|| "default".into()),
                name: field("name").unwrap_or_default(),
                data,
            });
        }
        "" => return Err("no kind: not a Kubernetes object".into()),
        other => *out.others.entry(other.to_owned()).or_default() += 1,
    }
    Ok(())
}

/// `metadata.<key>` of an object.
fn metadata(value: &Value, key: &str) -> Option<String> {
    value.get("metadata")?.get(key)?.as_str().map(str::to_owned)
}

/// A scalar as text (YAML may have read `"5"` written bare as a number).
pub(crate) fn annotation_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => String::new(),
    }
}

/// Reads and translates the manifests.
pub fn import(
    sources: &[(String, String)],
    options: &Options,
) -> Result<IngressImport, ManifestError> {
    Ok(translate(&read(sources)?, options))
}
