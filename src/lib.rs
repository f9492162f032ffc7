//! tollgate: an edge reverse proxy with rate limiting built in.
//!
//! The crate is laid out in the order a request travels:
//!
//! ```text
//! accept (listener)          TCP, max-connections cap, graceful shutdown
//!   -> TLS (tls)             rustls; SNI picks the certificate; ALPN h2 / http/1.1
//!   -> HTTP (listener::h1) HTTP/1.x fast path: bodiless and small-body requests;
//!      (listener::conn) hyper for HTTP/2 and every other HTTP/1.x connection;
//!      one watchdog for header/idle/send limits
//!   (listener::proxy_protocol: PROXY v1/v2 from trusted peers, before TLS)
//!   -> pipeline::client_ip   who the client is: trusted real-IP resolution
//!   -> pipeline::route       host / path / method match
//!      (pipeline::normalize: one spelling per path, before matching)
//!   -> pipeline::bypass      bypass paths / tokens / sources, webhook sources
//!   -> pipeline::penalty     a key serving a ban is refused before any limit
//!                            (keys by user: again right after the identity)
//!   -> pipeline::zones       tier 1 keyed by ip / header / global: counts
//!                            every request, before any credential
//!   -> pipeline::identity    verified JWT claim or API-key hash -> user, plan
//!   -> pipeline::webhook     only_allowed_sources (403); signature checks
//!   -> pipeline::limits      tier 2 route limits + zones keyed by user
//!      (pipeline::decide: the store call both tiers make, each limit's
//!       numbers chosen by plan or override; pipeline::key builds
//!       rate-limit keys from the client and identity)
//!   -> pipeline::proxy       the upstream request: headers, Host, body;
//!      (pipeline::upstream: pooled keep-alive, round robin, timeouts)
//!   -> pipeline::response    429s, problem bodies, RateLimit headers
//!      (pipeline::settle: reserved costs settled from the answer)
//!      (pipeline::record: the access log and in-flight count, settled
//!       when the response body ends; pipeline::ctx: what a request
//!       carries between stages)
//! ```
//!
//! `limiter` is the rate-limit engine the limiting stages call: six pure
//! algorithms, the bounded in-memory store and the Redis store behind a
//! `Store` trait, and `limiter::engine`, the store the pipeline asks, where
//! each limit's failure mode is applied.
//! `config` turns the YAML file into the runtime types every stage reads;
//! `server` is the composition root (binding, the lifecycle, reloads);
//! `tls` builds both rustls configs; `secret` signs and matches secrets;
//! `error` holds the one error -> HTTP status table; `http1` the HTTP/1.x
//! framing rules both roles share (one `Content-Length` rule, one chunk-size
//! rule, what a `Transfer-Encoding` asks for); `metrics` holds the
//! counters the request path adds to (atomics indexed at config load);
//! `import` translates an nginx config (`tollgate import-nginx`);
//! `reload` is the reload contract (the swap and what it carries are in
//! `server`); `docs/architecture.md` draws the floors;
//! `admin` serves `/healthz`, `/readyz`, `/metrics`, the JSON API under
//! `/api/` (limits, one key's state and its reset, top offenders) and the
//! dashboard.

#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

// Public: what the binary, the integration tests, the benches and the
// fuzz targets name. Everything else is the crate's own.
pub(crate) mod admin;
pub(crate) mod alerts;
pub mod clock;
pub(crate) mod config;
pub(crate) mod error;
pub(crate) mod http1;
pub mod import;
pub mod limiter;
pub mod listener;
pub mod logging;
pub(crate) mod metrics;
pub mod pipeline;
pub mod reload;
pub mod replay;
pub(crate) mod secret;
pub(crate) mod server;
#[cfg(any(test, feature = "test-util"))]
#[doc(hidden)]
pub mod testing;
pub mod tls;
pub mod traces;

pub use config::Config;
pub use error::{ConfigError, ProxyError};
pub use metrics::ProtocolError;
pub use server::Server;
