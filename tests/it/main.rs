//! The integration tests, one binary: every file below is a module, so
//! the suite compiles and links the crate once. Real sockets on 127.0.0.1,
//! real upstreams, `redis-server`, nginx and Chromium; nothing is mocked.

mod common;

mod admin;
mod balancing;
mod chart;
mod cli;
mod client_ip;
mod conformance;
mod contrib;
mod drain;
mod ewma;
mod forwarding;
mod framing;
mod grpc;
mod grpc_pass;
mod h1_server;
mod h2_abuse;
mod health_checks;
mod import_ingress;
mod import_nginx;
mod layering;
mod leases;
mod limits;
mod metrics;
mod next_upstream;
mod nginx_differential;
mod package;
mod parsers;
mod penalty;
mod pgo_train;
mod plans;
mod protection;
mod quotas;
mod redis_cluster;
mod redis_proxy;
mod redis_replicas;
mod redis_store;
mod reload;
mod replay;
mod request_order;
mod resolve;
mod retry_bodies;
mod shared_conns;
mod shedding;
mod streaming;
mod tls;
mod traces;
mod upgrades;
mod upstream_failures;
mod upstream_h1;
mod upstream_view;
mod watch_config;
