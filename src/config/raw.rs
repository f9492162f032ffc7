//! The YAML file as written: serde types that mirror it key for key, with
//! unknown keys refused, and the loader that turns text into them.
//!
//! Loading reads the file into a `serde_yaml::Value`, replaces `${VAR}` in
//! string values from the environment (after parsing, so a variable can never
//! inject YAML structure), then deserialises each section and each list item
//! on its own. One bad route therefore does not hide a bad upstream: every
//! problem is collected with its YAML path and handed to `validate`.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_yaml::Value;

use super::Problem;

/// A scalar kept as the text the user wrote, whatever YAML type it parsed as,
/// so `timeout: 30` reaches validation and gets a duration message instead of
/// serde's "invalid type: integer".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text(pub String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(s) => Ok(Text(s)),
            Value::Number(n) => Ok(Text(n.to_string())),
            Value::Bool(b) => Ok(Text(b.to_string())),
            other => Err(serde::de::Error::custom(format!(
                "expected a single value, got {}",
                describe(&other)
            ))),
        }
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Default)]
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
}

#[derive(Debug, Deserialize)]
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBreaker {
    pub failures: Option<Text>,
    pub probe_interval: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStoreTls {
    /// PEM file of the CA that signed the Redis server's certificate.
    pub ca: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListener {
    pub name: Option<String>,
    pub bind: Text,
    pub tls: Option<RawListenerTls>,
    pub proxy_protocol: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListenerTls {
    pub certs: Vec<RawCert>,
    pub handshake_timeout: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCert {
    pub cert: String,
    pub key: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    pub enabled: Option<bool>,
    pub bind: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub header_read_timeout: Option<Text>,
    pub idle_timeout: Option<Text>,
    pub max_header_size: Option<Text>,
    pub max_headers: Option<Text>,
    pub max_body_size: Option<Text>,
    pub max_connections: Option<Text>,
    pub h2_max_concurrent_streams: Option<Text>,
    pub shutdown_grace: Option<Text>,
    pub body_read_timeout: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub targets: Vec<Text>,
    pub tls: Option<RawUpstreamTls>,
    pub connect_timeout: Option<Text>,
    pub timeout: Option<Text>,
    pub idle_timeout: Option<Text>,
    pub max_idle_per_target: Option<Text>,
    pub cooldown: Option<Text>,
    pub host_header: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamTls {
    pub ca: Option<String>,
    pub server_name: Option<String>,
}

#[derive(Debug, Deserialize)]
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
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    pub name: String,
    pub algorithm: String,
    pub key: Option<String>,
    pub limit: Option<Text>,
    pub window: Option<Text>,
    pub rate: Option<Text>,
    pub burst: Option<Text>,
    pub cost: Option<Text>,
    pub dry_run: Option<bool>,
    pub count: Option<RawCount>,
    pub size: Option<Text>,
    pub on_error: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCount {
    pub status: Vec<u16>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVerify {
    pub scheme: String,
    pub secret: String,
    pub header: Option<String>,
    pub tolerance: Option<Text>,
}

#[derive(Debug, Deserialize)]
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
    pub on_error: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBypass {
    pub paths: Option<Vec<String>>,
    pub tokens: Option<Vec<String>>,
    pub header: Option<String>,
    pub sources: Option<Vec<Text>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    pub host: Option<String>,
    pub path: Option<String>,
    pub path_prefix: Option<String>,
    pub methods: Option<Vec<String>>,
    pub case_insensitive: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRespond {
    pub status: Option<Text>,
    pub body: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    pub format: Option<String>,
    pub level: Option<String>,
    pub access_log: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientIp {
    pub trusted_proxies: Option<Vec<Text>>,
    pub headers: Option<Vec<String>>,
    pub ipv4_prefix: Option<Text>,
    pub ipv6_prefix: Option<Text>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIdentity {
    pub jwt: Option<RawJwt>,
    pub api_key: Option<RawApiKey>,
    pub on_invalid: Option<String>,
}

#[derive(Debug, Deserialize)]
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawApiKey {
    pub header: String,
}

/// The top-level keys this version understands, in the order `check` lists them.
const SECTIONS: &[&str] = &[
    "listeners",
    "admin",
    "server",
    "client_ip",
    "identity",
    "store",
    "bypass",
    "zones",
    "upstreams",
    "routes",
    "log",
];

/// Parses YAML text into raw sections, collecting every problem found.
/// `lookup` resolves `${VAR}` (the environment in production, a map in tests).
pub fn load(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> (RawConfig, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut raw = RawConfig::default();
    let mut doc: Value = match serde_yaml::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            let line = e.location().map(|l| l.line());
            problems.push(Problem {
                path: "(file)".into(),
                message: e.to_string(),
                line,
            });
            return (raw, problems);
        }
    };
    substitute_env(&mut doc, String::new(), lookup, &mut problems);
    let map = match doc {
        Value::Mapping(m) => m,
        Value::Null => {
            problems.push(Problem::new("(file)", "the file is empty"));
            return (raw, problems);
        }
        other => {
            problems.push(Problem::new(
                "(file)",
                format!("expected a mapping of sections, got {}", describe(&other)),
            ));
            return (raw, problems);
        }
    };
    for (key, value) in map {
        let Some(name) = key.as_str() else {
            problems.push(Problem::new(
                "(file)",
                format!("section names are strings, got {}", describe(&key)),
            ));
            continue;
        };
        match name {
            "listeners" => raw.listeners = list(value, "listeners", &mut problems),
            "routes" => raw.routes = list(value, "routes", &mut problems),
            "admin" => raw.admin = one(value, "admin", &mut problems),
            "server" => raw.server = one(value, "server", &mut problems),
            "log" => raw.log = one(value, "log", &mut problems),
            "client_ip" => raw.client_ip = one(value, "client_ip", &mut problems),
            "zones" => raw.zones = list(value, "zones", &mut problems),
            "bypass" => raw.bypass = one(value, "bypass", &mut problems),
            "store" => raw.store = one(value, "store", &mut problems),
            "identity" => raw.identity = one(value, "identity", &mut problems),
            "upstreams" => raw.upstreams = named(value, "upstreams", &mut problems),
            other => problems.push(Problem::new(
                other,
                format!("unknown section; expected one of: {}", SECTIONS.join(", ")),
            )),
        }
    }
    (raw, problems)
}

/// Deserialises one section, reporting a failure at its full YAML path.
fn one<T: DeserializeOwned>(value: Value, path: &str, problems: &mut Vec<Problem>) -> Option<T> {
    if value.is_null() {
        return None;
    }
    match serde_path_to_error::deserialize::<_, T>(value) {
        Ok(v) => Some(v),
        Err(e) => {
            let inner = e.path().to_string();
            let full = if inner == "." {
                path.to_owned()
            } else {
                format!("{path}.{inner}")
            };
            problems.push(Problem::new(
                full,
                clean_serde_message(&e.into_inner().to_string()),
            ));
            None
        }
    }
}

/// Deserialises a YAML list item by item, keeping each item's path.
fn list<T: DeserializeOwned>(
    value: Value,
    path: &str,
    problems: &mut Vec<Problem>,
) -> Vec<(String, T)> {
    match value {
        Value::Null => Vec::new(),
        Value::Sequence(items) => items
            .into_iter()
            .enumerate()
            .filter_map(|(i, item)| {
                let item_path = format!("{path}[{i}]");
                one(item, &item_path, problems).map(|v| (item_path, v))
            })
            .collect(),
        other => {
            problems.push(Problem::new(
                path,
                format!("expected a list, got {}", describe(&other)),
            ));
            Vec::new()
        }
    }
}

/// Deserialises a YAML mapping of name -> item, returning (path, name, item).
fn named<T: DeserializeOwned>(
    value: Value,
    path: &str,
    problems: &mut Vec<Problem>,
) -> Vec<(String, String, T)> {
    match value {
        Value::Null => Vec::new(),
        Value::Mapping(entries) => entries
            .into_iter()
            .filter_map(|(k, v)| {
                let Some(name) = k.as_str().map(str::to_owned) else {
                    problems.push(Problem::new(
                        path,
                        format!("names are strings, got {}", describe(&k)),
                    ));
                    return None;
                };
                let item_path = format!("{path}.{name}");
                one(v, &item_path, problems).map(|item| (item_path, name, item))
            })
            .collect(),
        other => {
            problems.push(Problem::new(
                path,
                format!(
                    "expected a mapping of name -> settings, got {}",
                    describe(&other)
                ),
            ));
            Vec::new()
        }
    }
}

/// Replaces `${VAR}` inside every string value. `$${` writes a literal `${`.
fn substitute_env(
    value: &mut Value,
    path: String,
    lookup: &dyn Fn(&str) -> Option<String>,
    problems: &mut Vec<Problem>,
) {
    match value {
        Value::String(s) if s.contains("${") => match expand(s, lookup) {
            Ok(expanded) => *s = expanded,
            Err(message) => problems.push(Problem::new(path, message)),
        },
        Value::Sequence(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                substitute_env(item, format!("{path}[{i}]"), lookup, problems);
            }
        }
        Value::Mapping(map) => {
            for (k, v) in map.iter_mut() {
                let key = k.as_str().unwrap_or("?");
                let child = if path.is_empty() {
                    key.to_owned()
                } else {
                    format!("{path}.{key}")
                };
                substitute_env(v, child, lookup, problems);
            }
        }
        _ => {}
    }
}

fn expand(s: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find('$') {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("${") {
            let end = tail
                .find('}')
                .ok_or_else(|| format!("unclosed \"${{\" in \"{s}\""))?;
            let name = &tail[..end];
            let valid =
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                return Err(format!(
                    "\"${{{name}}}\" is not a valid environment variable name"
                ));
            }
            let value =
                lookup(name).ok_or_else(|| format!("environment variable {name} is not set"))?;
            out.push_str(&value);
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn describe(v: &Value) -> String {
    match v {
        Value::Null => "nothing".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string \"{s}\""),
        Value::Sequence(_) => "a list".into(),
        Value::Mapping(_) => "a mapping".into(),
        Value::Tagged(_) => "a tagged value".into(),
    }
}

/// serde's messages are good but sometimes end with a position that is
/// meaningless after we split the document; drop it.
fn clean_serde_message(message: &str) -> String {
    match message.find(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cret".into()),
            "PORT" => Some("8081".into()),
            _ => None,
        }
    }

    #[test]
    fn variables_expand_inside_strings() {
        assert_eq!(expand("Bearer ${TOKEN}", &env).unwrap(), "Bearer s3cret");
        assert_eq!(expand("127.0.0.1:${PORT}", &env).unwrap(), "127.0.0.1:8081");
        assert_eq!(
            expand("cost $5 and $${TOKEN}", &env).unwrap(),
            "cost $5 and ${TOKEN}"
        );
    }

    #[test]
    fn a_missing_variable_is_named() {
        let err = expand("${NOPE}", &env).unwrap_err();
        assert_eq!(err, "environment variable NOPE is not set");
        assert!(expand("${bad-name}", &env)
            .unwrap_err()
            .contains("not a valid"));
        assert!(expand("${TOKEN", &env).unwrap_err().contains("unclosed"));
    }

    #[test]
    fn problems_in_different_sections_are_all_reported() {
        let yaml = "
listeners:
  - { bind: '127.0.0.1:0', colour: blue }
  - { bind: '127.0.0.1:0' }
routes:
  - { match: { path: / }, respond: { body: ok } }
  - { match: { path: / }, upstream: [1] }
server: { max_body_size: '${MISSING}' }
extra: 1
";
        let (raw, problems) = load(yaml, &env);
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(raw.listeners.len(), 1, "the good listener survives");
        assert_eq!(raw.routes.len(), 1, "the good route survives");
        assert!(paths.contains(&"listeners[0].colour"), "{problems:?}");
        assert!(paths.contains(&"routes[1].upstream"), "{problems:?}");
        assert!(paths.contains(&"server.max_body_size"), "{problems:?}");
        assert!(paths.contains(&"extra"), "{problems:?}");
        let unknown = problems
            .iter()
            .find(|p| p.path == "listeners[0].colour")
            .unwrap();
        assert!(unknown.message.contains("colour"), "{unknown:?}");
    }

    #[test]
    fn syntax_errors_carry_a_line() {
        let (_, problems) = load("listeners:\n  - bind: [\n", &env);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].line.is_some(), "{problems:?}");
    }
}
