//! The YAML file as written: serde types that mirror it key for key, with
//! unknown keys refused. `load` turns text into them; `import-nginx` builds
//! them and writes them back, so the schema lives here once.

use std::collections::BTreeMap;
use std::fmt;

use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_yaml::Value;

mod upstream;
pub use self::upstream::*;

/// A scalar kept as the text the user wrote, whatever YAML type it parsed as,
/// so `timeout: 30` reaches validation and gets a duration message instead of
/// serde's "invalid type: integer".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Text(pub String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(s) => Ok(Text(s)),
            Value::Number(n) => Ok(Text(n.to_string())),
            Value::Bool(b) => Ok(Text(b.to_string())),
            other => Err(serde::de::Error::custom(format!(
                "expected a single value, got {}",
                super::load::describe(&other)
            ))),
        }
    }
}

/// Written back as a number when it is one, so an imported `burst: 20`
/// reads as the user would have typed it.
impl Serialize for Text {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0.parse::<u64>() {
            Ok(n) if n.to_string() == self.0 => serializer.serialize_u64(n),
            _ => serializer.serialize_str(&self.0),
        }
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Text {
        Text(s.to_owned())
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Default, Clone)]
pub struct RawConfig {
    pub listeners: Vec<(String, RawListener)>,
    pub admin: Option<RawAdmin>,
    pub server: Option<RawServer>,
    pub upstreams: Vec<(String, String, RawUpstream)>,
    pub routes: Vec<(String, RawRoute)>,
    pub log: Option<RawLog>,
    pub client_ip: Option<RawClientIp>,
    pub identity: Option<RawIdentity>,
    pub zones: Vec<(String, RawZone)>,
    pub bypass: Option<RawBypass>,
    pub store: Option<RawStore>,
    pub alerts: Option<RawAlerts>,
    pub priorities: Option<RawPriorities>,
    pub traces: Option<RawTraces>,
}

/// Written as a file `load` reads back: the sections in the order `check`
/// lists them, absent ones left out. Absent keys inside a section are
/// written as nulls, which the writer (`import`) drops.
impl Serialize for RawConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct Items<'a, T>(&'a [(String, T)]);
        impl<T: Serialize> Serialize for Items<'_, T> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.iter().map(|(_, item)| item))
            }
        }
        struct Named<'a, T>(&'a [(String, String, T)]);
        impl<T: Serialize> Serialize for Named<'_, T> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map(self.0.iter().map(|(_, name, item)| (name, item)))
            }
        }
        let mut map = serializer.serialize_map(None)?;
        if !self.listeners.is_empty() {
            map.serialize_entry("listeners", &Items(&self.listeners))?;
        }
        if let Some(admin) = &self.admin {
            map.serialize_entry("admin", admin)?;
        }
        if let Some(server) = &self.server {
            map.serialize_entry("server", server)?;
        }
        if let Some(client_ip) = &self.client_ip {
            map.serialize_entry("client_ip", client_ip)?;
        }
        if let Some(identity) = &self.identity {
            map.serialize_entry("identity", identity)?;
        }
        if let Some(store) = &self.store {
            map.serialize_entry("store", store)?;
        }
        if let Some(bypass) = &self.bypass {
            map.serialize_entry("bypass", bypass)?;
        }
        if !self.zones.is_empty() {
            map.serialize_entry("zones", &Items(&self.zones))?;
        }
        if let Some(priorities) = &self.priorities {
            map.serialize_entry("priorities", priorities)?;
        }
        if !self.upstreams.is_empty() {
            map.serialize_entry("upstreams", &Named(&self.upstreams))?;
        }
        if !self.routes.is_empty() {
            map.serialize_entry("routes", &Items(&self.routes))?;
        }
        if let Some(log) = &self.log {
            map.serialize_entry("log", log)?;
        }
        if let Some(alerts) = &self.alerts {
            map.serialize_entry("alerts", alerts)?;
        }
        if let Some(traces) = &self.traces {
            map.serialize_entry("traces", traces)?;
        }
        map.end()
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    pub kind: String,
    pub url: Option<String>,
    pub nodes: Option<Vec<String>>,
    pub prefix: Option<String>,
    pub timeout: Option<Text>,
    pub connect_timeout: Option<Text>,
    pub on_error: Option<String>,
    pub replicas: Option<Text>,
    pub breaker: Option<RawBreaker>,
    pub cache_rejections: Option<bool>,
    pub tls: Option<RawStoreTls>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBreaker {
    pub failures: Option<Text>,
    pub probe_interval: Option<Text>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawStoreTls {
    /// PEM file of the CA that signed the Redis server's certificate.
    pub ca: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawListener {
    pub name: Option<String>,
    pub bind: Text,
    pub tls: Option<RawListenerTls>,
    pub proxy_protocol: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawListenerTls {
    pub certs: Vec<RawCert>,
    pub handshake_timeout: Option<Text>,
    pub session_tickets: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCert {
    pub cert: String,
    pub key: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    pub enabled: Option<bool>,
    pub bind: Option<Text>,
    pub token: Option<RawTokens>,
    pub protect_metrics: Option<bool>,
}

/// One token or a list of them.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum RawTokens {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub header_read_timeout: Option<Text>,
    pub idle_timeout: Option<Text>,
    pub max_header_size: Option<Text>,
    pub max_headers: Option<Text>,
    pub max_body_size: Option<Text>,
    pub max_connections: Option<Text>,
    pub h2_max_concurrent_streams: Option<Text>,
    pub h2_max_reset_streams: Option<Text>,
    pub shutdown_grace: Option<Text>,
    pub drain_delay: Option<Text>,
    pub body_read_timeout: Option<Text>,
    pub lingering_time: Option<Text>,
    pub lingering_timeout: Option<Text>,
    pub send_timeout: Option<Text>,
    pub workers: Option<Text>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub name: Option<String>,
    #[serde(rename = "match")]
    pub matcher: RawMatch,
    pub upstream: Option<String>,
    pub respond: Option<RawRespond>,
    pub max_body_size: Option<Text>,
    /// Zones this route is subject to; absent = all, `[]` = none.
    pub zones: Option<Vec<String>>,
    pub limits: Option<Vec<RawLimit>>,
    /// Skip every route limit (NestJS `@SkipThrottle`).
    pub skip: Option<bool>,
    pub headers: Option<String>,
    pub reset: Option<String>,
    pub warn_at: Option<Text>,
    pub allow_sources: Option<Vec<Text>>,
    pub only_allowed_sources: Option<bool>,
    pub verify: Option<RawVerify>,
    /// Protocols a client may switch to (`Upgrade`); default `[websocket]`.
    pub upgrades: Option<Vec<String>>,
    /// The priority class of its requests (`priorities.classes`).
    pub priority: Option<String>,
}

/// Priority classes: which requests an overloaded upstream sheds first.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPriorities {
    /// Highest first.
    pub classes: Vec<String>,
    pub default: Option<String>,
    pub never_shed: Option<Vec<String>>,
    /// Plan name -> class.
    pub plans: Option<std::collections::BTreeMap<String, String>>,
    /// A header naming the class, believed from trusted proxies only.
    pub header: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    pub name: String,
    pub algorithm: String,
    pub key: Option<String>,
    pub limit: Option<Text>,
    pub window: Option<Text>,
    pub rate: Option<Text>,
    pub burst: Option<Text>,
    pub cost: Option<RawCost>,
    pub dry_run: Option<bool>,
    pub count: Option<RawCount>,
    pub plans: Option<std::collections::BTreeMap<String, RawPlanNumbers>>,
    pub settle: Option<RawSettle>,
    pub size: Option<Text>,
    pub on_error: Option<String>,
    pub period: Option<String>,
    pub time_zone: Option<String>,
    pub anchor: Option<String>,
    pub penalty: Option<RawPenalty>,
    pub lease: Option<RawLease>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLease {
    pub slice: Option<Text>,
    pub hold: Option<Text>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPenalty {
    pub after: Option<Text>,
    pub within: Option<Text>,
    pub ban: Option<Vec<Text>>,
    pub forgive: Option<Text>,
    pub status: Option<Text>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCount {
    pub status: Vec<u16>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawVerify {
    pub scheme: String,
    pub secret: String,
    pub header: Option<String>,
    pub tolerance: Option<Text>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawZone {
    pub name: String,
    pub rate: Text,
    pub burst: Option<Text>,
    pub nodelay: Option<bool>,
    pub delay: Option<Text>,
    pub status: Option<Text>,
    pub key: Option<String>,
    pub size: Option<Text>,
    pub dry_run: Option<bool>,
    pub max_conn: Option<Text>,
    pub max_conn_lease: Option<Text>,
    pub on_error: Option<String>,
    pub penalty: Option<RawPenalty>,
    pub plans: Option<std::collections::BTreeMap<String, RawPlanNumbers>>,
}

/// OpenTelemetry traces: where spans go, which are kept.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTraces {
    pub endpoint: String,
    pub service_name: Option<String>,
    pub ratio: Option<Text>,
    pub keep_refused_and_failed: Option<bool>,
    pub trust_parent: Option<String>,
    pub user: Option<bool>,
    pub queue: Option<Text>,
    pub batch: Option<Text>,
    pub interval: Option<Text>,
    pub timeout: Option<Text>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlerts {
    pub cooldown: Option<Text>,
    pub webhook: Option<RawAlertWebhook>,
    #[serde(default)]
    pub rules: Vec<RawAlertRule>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlertWebhook {
    pub url: String,
    pub timeout: Option<Text>,
    pub secret: Option<String>,
    pub format: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlertRule {
    pub name: String,
    pub limit: String,
    pub rejections: Option<Text>,
    pub reject_ratio: Option<Text>,
    pub used: Option<Text>,
    pub min_requests: Option<Text>,
    pub per: Option<Text>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBypass {
    pub paths: Option<Vec<String>>,
    pub tokens: Option<Vec<String>>,
    pub header: Option<String>,
    pub sources: Option<Vec<Text>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    pub host: Option<String>,
    pub path: Option<String>,
    pub path_prefix: Option<String>,
    /// A gRPC service (`pkg.Service`) or method (`pkg.Service/Method`).
    pub grpc: Option<String>,
    pub methods: Option<Vec<String>>,
    pub case_insensitive: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRespond {
    pub status: Option<Text>,
    pub body: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    pub format: Option<String>,
    pub level: Option<String>,
    pub access_log: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientIp {
    pub trusted_proxies: Option<Vec<Text>>,
    pub headers: Option<Vec<String>>,
    pub ipv4_prefix: Option<Text>,
    pub ipv6_prefix: Option<Text>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawIdentity {
    pub jwt: Option<RawJwt>,
    pub api_key: Option<RawApiKey>,
    pub on_invalid: Option<String>,
    pub plans: Option<RawPlans>,
    pub billing_day: Option<RawBillingDay>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBillingDay {
    pub claim: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawJwt {
    pub algorithms: Vec<String>,
    pub secret: Option<String>,
    pub public_key: Option<String>,
    pub jwks: Option<String>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub leeway: Option<Text>,
    pub claim: Option<String>,
    pub header: Option<String>,
    pub cookie: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawApiKey {
    pub header: String,
    /// A YAML file: per key digest (SHA-256, hex), `{ plan: <name> }`.
    pub metadata: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPlans {
    pub names: Vec<String>,
    pub claim: Option<String>,
    pub header: Option<String>,
    pub default: Option<String>,
}

/// A plan's numbers on a limit: any of its own, replaced.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPlanNumbers {
    pub limit: Option<Text>,
    pub window: Option<Text>,
    pub rate: Option<Text>,
    pub burst: Option<Text>,
}

/// `cost: 5`, or where to read it from.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum RawCost {
    Fixed(Text),
    From(RawCostFrom),
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCostFrom {
    pub header: Option<String>,
    pub claim: Option<String>,
    pub default: Option<Text>,
    pub max: Option<Text>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawSettle {
    pub header: Option<String>,
    pub trailer: Option<String>,
    pub event: Option<String>,
    pub on_failure: Option<String>,
    pub max: Option<Text>,
}

#[cfg(test)]
mod tests {
    use super::super::load::load;

    /// What the importer writes is what `load` reads: every section and
    /// key of the example config survives a write and a read.
    #[test]
    fn the_example_config_survives_a_write_and_a_read() {
        let lookup = |_: &str| Some("x".to_owned());
        let (raw, problems) = load(include_str!("../../config.example.yaml"), &lookup);
        assert!(problems.is_empty(), "{problems:?}");
        let written = serde_yaml::to_string(&raw).unwrap();
        let (again, problems) = load(&written, &lookup);
        assert!(problems.is_empty(), "{problems:?}\n{written}");
        assert_eq!(serde_yaml::to_string(&again).unwrap(), written);
        assert!(!raw.routes.is_empty() && !raw.zones.is_empty());
        let original: serde_yaml::Value =
            serde_yaml::from_str(include_str!("../../config.example.yaml")).unwrap();
        let sections = original.as_mapping().unwrap().len();
        let back: serde_yaml::Value = serde_yaml::from_str(&written).unwrap();
        assert_eq!(back.as_mapping().unwrap().len(), sections, "{written}");
    }
}
