//! An Ingress's `nginx.ingress.kubernetes.io/*` annotations, read as
//! ingress-nginx reads them (its defaults where one is absent), and a note
//! for each that is not translated.

use super::{Ingress, IngressNote};
use crate::import::Severity;

pub(super) const PREFIX: &str = "nginx.ingress.kubernetes.io/";

/// ingress-nginx's `limit-burst-multiplier` default.
const BURST_MULTIPLIER: u64 = 5;

/// What tollgate translates of one Ingress's annotations.
#[derive(Debug, Default)]
pub(super) struct Annotations {
    pub rps: u64,
    pub rpm: u64,
    pub connections: u64,
    pub burst_multiplier: u64,
    /// `limit-allowlist` (`limit-whitelist`): sources the limits skip.
    pub limit_allowlist: Vec<String>,
    /// `allowlist-source-range` (`whitelist-source-range`): only these.
    pub source_range: Option<Vec<String>>,
    /// `proxy-body-size`, as a tollgate size.
    pub body_size: Option<String>,
    /// `proxy-connect-timeout` and `proxy-read-timeout`, as durations.
    pub connect_timeout: Option<String>,
    pub read_timeout: Option<String>,
    /// `backend-protocol: GRPC` (or H2C): HTTP/2 without TLS upstream.
    pub h2: bool,
    /// `ssl-redirect` (default true where the Ingress has TLS).
    pub ssl_redirect: bool,
}

impl Annotations {
    /// Whether any rate or connection limit is set.
    pub fn limited(&self) -> bool {
        self.rps > 0 || self.rpm > 0 || self.connections > 0
    }
}

/// Annotations that change nothing about limiting, access or routing (or
/// that tollgate does by itself): noted, not an inequivalence.
const HARMLESS: &[&str] = &[
    "proxy-send-timeout",
    "proxy-buffering",
    "proxy-buffer-size",
    "proxy-buffers-number",
    "proxy-max-temp-file-size",
    "proxy-request-buffering",
    "proxy-http-version",
    "client-body-buffer-size",
    "enable-access-log",
    "enable-rewrite-log",
    "enable-opentelemetry",
    "opentelemetry-trust-incoming-span",
    "opentelemetry-operation-name",
    "proxy-next-upstream",
    "proxy-next-upstream-timeout",
    "proxy-next-upstream-tries",
    "service-upstream",
    "ssl-ciphers",
    "ssl-prefer-server-ciphers",
    "server-alias",
    "http2-push-preload",
];

pub(super) fn read(ing: &Ingress, who: &str, notes: &mut Vec<IngressNote>) -> Annotations {
    let mut note = |key: &str, severity: Severity, message: String| {
        notes.push(IngressNote {
            at: format!("{who}: {key}"),
            severity,
            message,
        })
    };
    let mut a = Annotations {
        burst_multiplier: BURST_MULTIPLIER,
        ssl_redirect: true,
        ..Annotations::default()
    };
    let mut allowlist = None;
    for (key, value) in &ing.metadata.annotations {
        let value = super::annotation_text(value);
        let Some(name) = key.strip_prefix(PREFIX) else {
            if key.starts_with("cert-manager.io/") {
                note(key, Severity::Skipped, "cert-manager issues this Ingress's certificates: keep the Ingress (or write Certificate objects for its Secrets) so they are renewed".into());
            }
            continue;
        };
        let mut int = |field: &mut u64| match value.trim().parse::<u64>() {
            Ok(n) => *field = n,
            Err(_) => note(
                key,
                Severity::Lost,
                format!(
                    "\"{value}\" is not a whole number: ingress-nginx refuses it; not translated"
                ),
            ),
        };
        match name {
            "limit-rps" => int(&mut a.rps),
            "limit-rpm" => int(&mut a.rpm),
            "limit-connections" => int(&mut a.connections),
            "limit-burst-multiplier" => int(&mut a.burst_multiplier),
            "limit-allowlist" | "limit-whitelist" => allowlist = Some((key.clone(), value)),
            "allowlist-source-range" | "whitelist-source-range" => {
                match cidrs(&value) {
                    Ok(nets) => a.source_range = Some(nets),
                    Err(bad) => note(key, Severity::Lost, format!("\"{bad}\" is not an address or CIDR range; not translated")),
                }
            }
            "proxy-body-size" => a.body_size = body_size(&value, &mut |m| note(key, Severity::Skipped, m)),
            "proxy-connect-timeout" | "proxy-read-timeout" => match seconds(&value) {
                Some(s) if name == "proxy-connect-timeout" => a.connect_timeout = Some(s),
                Some(s) => a.read_timeout = Some(s),
                None => note(key, Severity::Skipped, format!("\"{value}\" is not whole seconds; the default applies")),
            },
            "backend-protocol" => match value.to_ascii_uppercase().as_str() {
                "HTTP" => {}
                "GRPC" | "H2C" => a.h2 = true,
                _ => note(key, Severity::Lost, format!("backend protocol {value} is not translated (tollgate speaks HTTP/1.1 or h2c to these targets; add tls: to the upstream for HTTPS)")),
            },
            "ssl-redirect" | "force-ssl-redirect" if value == "false" => {
                if name == "ssl-redirect" {
                    a.ssl_redirect = false;
                }
            }
            "ssl-redirect" | "force-ssl-redirect" => note(
                key,
                Severity::Lost,
                "tollgate does not redirect plain HTTP to HTTPS: expose only the TLS port, or keep a redirect in front".into(),
            ),
            "limit-rate" | "limit-rate-after" => note(
                key,
                Severity::Lost,
                "bandwidth limits (nginx limit_rate) are not supported: responses are not slowed".into(),
            ),
            "server-snippet" | "configuration-snippet" | "stream-snippet" | "auth-snippet" => note(
                key,
                Severity::Lost,
                "nginx configuration in a snippet is not run (ingress-nginx runs it where allow-snippet-annotations is on): translate what it does by hand".into(),
            ),
            "use-regex" | "rewrite-target" => note(
                key,
                Severity::Lost,
                "regular-expression paths and rewrites are not translated (ingress-nginx then matches every path of the host as a case-insensitive regex); the paths are translated literally".into(),
            ),
            n if HARMLESS.contains(&n) => note(key, Severity::Skipped, "not translated (nothing about limiting, access or routing depends on it)".into()),
            _ => note(key, Severity::Lost, "not translated".into()),
        }
    }
    if let Some((key, value)) = allowlist {
        match cidrs(&value) {
            Ok(nets) if a.limited() => a.limit_allowlist = nets,
            Ok(_) => note(
                &key,
                Severity::Skipped,
                "no limit-rps, limit-rpm or limit-connections on this Ingress: nothing to skip"
                    .into(),
            ),
            Err(bad) => note(
                &key,
                Severity::Lost,
                format!("\"{bad}\" is not an address or CIDR range; not translated"),
            ),
        }
    }
    a
}

/// A comma-separated list of addresses and ranges, each as a CIDR range
/// (a bare address as its /32 or /128), or the first that is neither.
pub(super) fn cidrs(list: &str) -> Result<Vec<String>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            if let Ok(net) = s.parse::<ipnet::IpNet>() {
                Ok(net.to_string())
            } else if let Ok(ip) = s.parse::<std::net::IpAddr>() {
                Ok(ipnet::IpNet::from(ip).to_string())
            } else {
                Err(s.to_owned())
            }
        })
        .collect()
}

/// nginx's `client_max_body_size` value as a tollgate size: `8m` -> `8MB`;
/// `0` (no limit in nginx) -> 1 GB, said in a note.
pub(super) fn body_size(v: &str, note: &mut dyn FnMut(String)) -> Option<String> {
    let lower = v.trim().to_ascii_lowercase();
    if lower == "0" {
        note("0 (no limit) written as 1GB".into());
        return Some("1GB".into());
    }
    match lower.chars().last() {
        Some('k' | 'm' | 'g' | '0'..='9') => Some(crate::import::translate::size(&lower)),
        _ => {
            note(format!("\"{v}\" is not a size; the default (1MB) applies"));
            None
        }
    }
}

/// ingress-nginx's timeouts are whole seconds.
pub(super) fn seconds(v: &str) -> Option<String> {
    let v = v.trim().trim_end_matches('s');
    v.parse::<u64>().ok().map(|n| format!("{n}s"))
}
