//! The bypass stage: requests that skip every limit (they are still
//! proxied and logged): a bypass path such as `/health`, a bypass token
//! (compared as SHA-256 digests, in constant time), a bypass source CIDR,
//! or a webhook route's `allow_sources`. Decided on the resolved client, so
//! a spoofed forwarding header from an untrusted peer bypasses nothing.

use std::net::IpAddr;

use http::HeaderMap;

use crate::config::{BypassConfig, RouteConfig};
use crate::secret::token_matches;

/// Why a request skips the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bypass {
    Path,
    Token,
    Source,
    WebhookSource,
}

/// Whether (and why) a request to `route` skips every limit.
pub fn check(
    cfg: &BypassConfig,
    route: Option<&RouteConfig>,
    path: &str,
    headers: &HeaderMap,
    client: IpAddr,
) -> Option<Bypass> {
    if cfg.paths.iter().any(|p| p == path) {
        return Some(Bypass::Path);
    }
    if let Some(v) = cfg.header.as_ref().and_then(|name| headers.get(name)) {
        if token_matches(&cfg.token_hashes, v.as_bytes()) {
            return Some(Bypass::Token);
        }
    }
    if cfg.sources.iter().any(|net| net.contains(&client)) {
        return Some(Bypass::Source);
    }
    route
        .and_then(|r| r.webhook.as_ref())
        .filter(|w| w.allows(client))
        .map(|_| Bypass::WebhookSource)
}
