//! The `upstreams` section as written: targets (an address, or a map of
//! nginx's per-server parameters), balancing, retries, resolving, checks.

use serde::{Deserialize, Deserializer, Serialize};
use serde_yaml::Value;

use super::Text;

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub targets: Vec<RawTarget>,
    pub tls: Option<RawUpstreamTls>,
    pub connect_timeout: Option<Text>,
    pub timeout: Option<Text>,
    pub idle_timeout: Option<Text>,
    pub max_idle_per_target: Option<Text>,
    pub cooldown: Option<Text>,
    pub host_header: Option<String>,
    /// `http1` (default), `h2` or `auto`.
    pub protocol: Option<String>,
    pub max_streams_per_connection: Option<Text>,
    /// nginx's balancing method, in its words: `round_robin` (default),
    /// `least_conn`, `random`, `random two least_conn`, `ip_hash`,
    /// `hash <key> [consistent]`.
    pub balance: Option<String>,
    pub next_upstream: Option<RawNextUpstream>,
    pub resolver: Option<RawResolver>,
    pub health_check: Option<RawHealthCheck>,
    /// An adaptive concurrency limit.
    pub concurrency: Option<RawConcurrency>,
    /// Where requests over the limit or `max_conns` wait.
    pub queue: Option<RawQueue>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConcurrency {
    pub min: Option<Text>,
    pub max: Option<Text>,
    pub tolerance: Option<Text>,
    pub interval: Option<Text>,
    pub probe_every: Option<Text>,
    pub probe_requests: Option<Text>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawQueue {
    pub size: Option<Text>,
    pub timeout: Option<Text>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealthCheck {
    pub path: Option<String>,
    pub interval: Option<Text>,
    pub timeout: Option<Text>,
    pub fails: Option<Text>,
    pub passes: Option<Text>,
    /// `200-399` (default), or one status.
    pub status: Option<Text>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawResolver {
    /// `ip[:port]` (port 53 when left out).
    pub address: Option<String>,
    pub valid: Option<Text>,
    pub timeout: Option<Text>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawNextUpstream {
    /// Conditions (`error`, `timeout`, `http_502`...), or `[off]`.
    pub on: Option<Vec<String>>,
    pub tries: Option<Text>,
    pub timeout: Option<Text>,
    pub max_body: Option<Text>,
    /// A retry budget (linkerd's): `{}` for its defaults.
    pub budget: Option<RawBudget>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBudget {
    pub ratio: Option<Text>,
    pub min_per_second: Option<Text>,
    pub window: Option<Text>,
}

/// A target: `"host:port"`, or a map with nginx's per-server parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum RawTarget {
    Address(Text),
    With(RawTargetMap),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTargetMap {
    pub address: Text,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backup: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub down: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_fails: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail_timeout: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_conns: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolve: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow_start: Option<Text>,
}

/// A string, or a map whose unknown keys are refused by name (serde's
/// untagged enums say only that nothing matched).
impl<'de> Deserialize<'de> for RawTarget {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::Mapping(m) => RawTargetMap::deserialize(Value::Mapping(m))
                .map(RawTarget::With)
                .map_err(serde::de::Error::custom),
            other => Text::deserialize(other)
                .map(RawTarget::Address)
                .map_err(serde::de::Error::custom),
        }
    }
}

impl From<&str> for RawTarget {
    fn from(s: &str) -> RawTarget {
        RawTarget::Address(Text::from(s))
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamTls {
    pub ca: Option<String>,
    pub server_name: Option<String>,
}
