//! tollgate: an edge reverse proxy with rate limiting built in.
//!
//! The crate is laid out in the order a request travels:
//!
//! ```text
//! accept (listener)          TCP, max-connections cap, graceful shutdown
//!   -> TLS (listener::tls)   rustls; SNI picks the certificate; ALPN h2 / http/1.1
//!   -> HTTP (listener::conn) hyper-util auto: HTTP/1.1 and HTTP/2; header/idle limits
//!   -> pipeline::client_ip   who the client is
//!   -> pipeline::route       host / path / method match
//!   -> pipeline::upstream    pooled keep-alive forward, round robin, timeouts
//!   -> pipeline::response    problem bodies, canned answers, access log
//! ```
//!
//! `config` turns the YAML file into the runtime types every stage reads;
//! `error` holds the one error -> HTTP status table; `admin` serves
//! `/healthz` and `/readyz`. The limiting stages (bypass, zones, identity,
//! policy limits) slot into `pipeline` between `route` and `upstream`.

#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod admin;
pub mod config;
pub mod error;
pub mod listener;
pub mod logging;
pub mod pipeline;

pub use config::Config;
pub use error::{ConfigError, ProxyError};
pub use listener::Server;
