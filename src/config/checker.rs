//! The problem collector every validation step writes to, with the parsers
//! for values that appear all over the file (durations, sizes, bounded
//! numbers, addresses), so each section reports the same way.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use super::raw::Text;
use super::units::{parse_duration, parse_size};
use super::Problem;

/// Collects problems while walking the raw config.
pub struct Checker {
    pub problems: Vec<Problem>,
}

impl Checker {
    pub fn report(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem::new(path, message));
    }

    /// Whether `name` is a label (a plan, a priority class: a metric label
    /// value, so 1 to 32 letters, digits, `_` or `-`); reported at `path`
    /// as a `kind` name when it is not.
    pub fn label(&mut self, path: String, kind: &str, name: &str) -> bool {
        let ok = !name.is_empty()
            && name.len() <= 32
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !ok {
            self.report(
                path,
                format!("a {kind} name is 1 to 32 letters, digits, '_' or '-', got \"{name}\""),
            );
        }
        ok
    }

    pub fn duration(&mut self, path: &str, value: &Option<Text>, default: Duration) -> Duration {
        let Some(text) = value else { return default };
        match parse_duration(&text.0) {
            Ok(d) => d,
            Err(e) => {
                self.report(path, e);
                default
            }
        }
    }

    /// A duration that must be strictly positive (a zero timeout is a typo).
    pub fn positive_duration(
        &mut self,
        path: &str,
        value: &Option<Text>,
        default: Duration,
    ) -> Duration {
        let d = self.duration(path, value, default);
        if d.is_zero() {
            self.report(path, "must be greater than zero");
            return default;
        }
        d
    }

    pub fn size(&mut self, path: &str, value: &Option<Text>, default: u64) -> u64 {
        let Some(text) = value else { return default };
        match parse_size(&text.0) {
            Ok(n) => n,
            Err(e) => {
                self.report(path, e);
                default
            }
        }
    }

    pub fn number<T: FromStr + PartialOrd + Copy + std::fmt::Display>(
        &mut self,
        path: &str,
        value: &Option<Text>,
        default: T,
        min: T,
        max: T,
    ) -> T {
        let Some(text) = value else { return default };
        match text.0.trim().parse::<T>() {
            Ok(n) if n >= min && n <= max => n,
            _ => {
                self.report(
                    path,
                    format!("expected a whole number from {min} to {max}, got \"{text}\""),
                );
                default
            }
        }
    }

    /// An http:// or https:// URL with a host, and for https the client
    /// TLS settings (the system's roots).
    pub fn http_url(
        &mut self,
        path: &str,
        url: &str,
    ) -> Option<(http::Uri, Option<std::sync::Arc<rustls::ClientConfig>>)> {
        let Ok(uri) = url.parse::<http::Uri>() else {
            self.report(path, format!("not a URL: \"{url}\""));
            return None;
        };
        let tls = match uri.scheme_str() {
            Some("http") => None,
            Some("https") => match crate::tls::client_config(None) {
                Ok(cfg) => Some(cfg),
                Err(e) => {
                    self.report(path, e);
                    return None;
                }
            },
            _ => {
                self.report(
                    path,
                    format!("expected an http:// or https:// URL, got \"{url}\""),
                );
                return None;
            }
        };
        if uri.host().is_none() {
            self.report(path, format!("the URL has no host: \"{url}\""));
            return None;
        }
        Some((uri, tls))
    }

    pub fn socket_addr(&mut self, path: &str, text: &str) -> Option<SocketAddr> {
        match text.trim().parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                self.report(
                    path,
                    format!("expected an address like \"0.0.0.0:8080\" or \"[::]:8443\", got \"{text}\""),
                );
                None
            }
        }
    }
}
