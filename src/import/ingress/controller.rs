//! The ingress-nginx controller's own ConfigMap, where the input holds it
//! (`ingress-nginx-controller`, `<release>-ingress-nginx-controller`, or
//! the older `nginx-configuration`): the settings that change the status
//! of a refusal or who the client is. ingress-nginx's defaults otherwise.

use super::{ConfigMapSeen, IngressNote, Manifests};
use crate::import::Severity;

/// What the controller's settings make of the zones and the client.
pub(super) struct Controller {
    /// `limit-req-status-code` (503).
    pub req_status: String,
    /// `limit-conn-status-code` (503).
    pub conn_status: String,
    /// With `use-forwarded-headers` (or `enable-real-ip`): the peers
    /// trusted (`proxy-real-ip-cidr`, ingress-nginx's default 0.0.0.0/0)
    /// and the header read (`forwarded-for-header`).
    pub real_ip: Option<(Vec<String>, String)>,
    /// `proxy-body-size` (1m), `proxy-connect-timeout` (5) and
    /// `proxy-read-timeout` (60): the defaults of every route and upstream.
    pub body_size: String,
    pub connect_timeout: String,
    pub read_timeout: String,
    /// The ConfigMap read, if any.
    pub read: Option<usize>,
}

/// Settings whose absence changes nothing tollgate does.
const HARMLESS: &[&str] = &[
    "compute-full-forwarded-for",
    "forwarded-for-header",
    "proxy-real-ip-cidr",
    "use-forwarded-headers",
    "enable-real-ip",
    "limit-req-status-code",
    "limit-conn-status-code",
    "proxy-body-size",
    "proxy-connect-timeout",
    "proxy-read-timeout",
];

/// Settings that change who is limited, who gets in, or where requests go.
const LOST: &[&str] = &[
    "use-proxy-protocol",
    "limit-conn-zone-variable",
    "whitelist-source-range",
    "allowlist-source-range",
    "denylist-source-range",
    "block-cidrs",
    "block-user-agents",
    "block-referers",
    "global-rate-limit-memcached-host",
    "http-snippet",
    "server-snippet",
    "location-snippet",
    "main-snippet",
    "ssl-redirect",
    "force-ssl-redirect",
    "use-geoip2",
];

fn is_controllers(c: &ConfigMapSeen) -> bool {
    c.name == "ingress-nginx-controller"
        || c.name == "nginx-configuration"
        || c.name.ends_with("-ingress-nginx-controller")
}

pub(super) fn read(m: &Manifests, notes: &mut Vec<IngressNote>) -> Controller {
    let mut c = Controller {
        req_status: "503".into(),
        conn_status: "503".into(),
        real_ip: None,
        body_size: "1MB".into(),
        connect_timeout: "5s".into(),
        read_timeout: "60s".into(),
        read: None,
    };
    let Some(i) = m.configmaps.iter().position(is_controllers) else {
        return c;
    };
    c.read = Some(i);
    let map = &m.configmaps[i];
    let at = format!("ConfigMap {}/{}", map.namespace, map.name);
    let mut note = |key: &str, severity, message: String| {
        notes.push(IngressNote {
            at: format!("{at}: {key}"),
            severity,
            message,
        })
    };
    let data = &map.data;
    for (key, field) in [
        ("limit-req-status-code", &mut c.req_status),
        ("limit-conn-status-code", &mut c.conn_status),
    ] {
        if let Some(v) = data.get(key) {
            match v.trim().parse::<u16>() {
                Ok(code) if (400..600).contains(&code) => *field = code.to_string(),
                _ => note(
                    key,
                    Severity::Lost,
                    format!("\"{v}\" is not a 4xx or 5xx status; 503 kept"),
                ),
            }
        }
    }
    if let Some(v) = data.get("proxy-body-size") {
        let size = super::annotations::body_size(v, &mut |m| {
            note("proxy-body-size", Severity::Skipped, m)
        });
        c.body_size = size.unwrap_or(c.body_size);
    }
    for (key, field) in [
        ("proxy-connect-timeout", &mut c.connect_timeout),
        ("proxy-read-timeout", &mut c.read_timeout),
    ] {
        match data.get(key).map(|v| super::annotations::seconds(v)) {
            Some(Some(s)) => *field = s,
            Some(None) => note(
                key,
                Severity::Skipped,
                "not whole seconds; the default kept".into(),
            ),
            None => {}
        }
    }
    let on = |k: &str| data.get(k).is_some_and(|v| v.trim() == "true");
    if on("use-forwarded-headers") || on("enable-real-ip") {
        let header = data
            .get("forwarded-for-header")
            .map_or("x-forwarded-for".to_owned(), |h| {
                h.trim().to_ascii_lowercase()
            });
        let range = data
            .get("proxy-real-ip-cidr")
            .map_or("0.0.0.0/0", |r| r.as_str());
        match super::annotations::cidrs(range) {
            Ok(trusted) => {
                if trusted.iter().any(|t| t == "0.0.0.0/0" || t == "::/0") {
                    note("proxy-real-ip-cidr", Severity::Skipped, "every peer may set the client's address, as it could through ingress-nginx: narrow client_ip.trusted_proxies to your load balancers".into());
                }
                c.real_ip = Some((trusted, header));
            }
            Err(bad) => note(
                "proxy-real-ip-cidr",
                Severity::Lost,
                format!("\"{bad}\" is not an address or CIDR range; the client is the TCP peer"),
            ),
        }
    }
    let mut others = Vec::new();
    for (key, value) in data {
        if LOST.contains(&key.as_str()) {
            let unchanged =
                key == "limit-conn-zone-variable" && value.trim() == "$binary_remote_addr";
            if !unchanged {
                note(key, Severity::Lost, "not translated".into());
            }
        } else if !HARMLESS.contains(&key.as_str()) {
            others.push(key.as_str());
        }
    }
    if !others.is_empty() {
        note(
            "data",
            Severity::Skipped,
            format!(
                "not translated (nothing about limiting, access or routing depends on them): {}",
                others.join(", ")
            ),
        );
    }
    c
}
