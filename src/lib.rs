//! tollgate: an edge reverse proxy with rate limiting built in.
//!
//! The crate is laid out in the order a request travels:
//!
//! ```text
//! accept (listener)          TCP, max-connections cap, graceful shutdown
//!   -> TLS (listener::tls)   rustls; SNI picks the certificate; ALPN h2 / http/1.1
//!   -> HTTP (listener::conn) hyper-util auto: HTTP/1.1 and HTTP/2; header/idle limits
//!   (listener::proxy_protocol: PROXY v1/v2 from trusted peers, before TLS)
//!   -> pipeline::client_ip   who the client is: trusted real-IP resolution
//!   -> pipeline::route       host / path / method match
//!      (pipeline::normalize: one spelling per path, before matching)
//!   -> pipeline::identity    verified JWT claim or API-key hash -> user
//!      (pipeline::key builds rate-limit keys from the client and identity)
//!   -> pipeline::limits      bypass, tier-1 zones, tier-2 route limits, headers
//!      (pipeline::webhook: allowed sources and signature checks)
//!   -> pipeline::upstream    pooled keep-alive forward, round robin, timeouts
//!   -> pipeline::response    problem bodies, canned answers, access log
//! ```
//!
//! `limiter` is the rate-limit engine the limiting stages call: six pure
//! algorithms and the bounded in-memory store behind a `Store` trait.
//! `config` turns the YAML file into the runtime types every stage reads;
//! `error` holds the one error -> HTTP status table; `admin` serves
//! `/healthz` and `/readyz`.

#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod admin;
pub mod config;
pub mod error;
pub mod limiter;
pub mod listener;
pub mod logging;
pub mod pipeline;

pub use config::Config;
pub use error::{ConfigError, ProxyError};
pub use listener::Server;
