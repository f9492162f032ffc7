//! TLS: both rustls builders (the listeners' server config with SNI and
//! session tickets, the upstream client's config with its trust roots) and
//! `SendOne`, the stream under a TLS session both sides use. Built from the
//! config at load (`config` calls them), used by the listener and the
//! upstream client; imports neither.

mod client;
mod server;

pub use client::client_config;
pub use server::{server_config, SendOne, TlsProblem};
