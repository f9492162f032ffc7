//! Targets written as names with `resolve` (nginx `server ... resolve`):
//! looked up in a task of their own, never on the request path, at
//! start and again when the answer's time is up (`resolver.valid`, or the
//! records' TTL within 1 s and 1 h). Every A and AAAA record becomes a
//! target with the entry's parameters; a target whose address stays
//! keeps its state (health, connections, figures) from one set to the
//! next. A failed or empty answer keeps the last good addresses (logged
//! and counted); a name that never resolved leaves its entry without
//! targets, and the upstream answers 502 until it does.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;
use tokio::sync::watch;

use super::target::TargetSet;
use crate::config::{Target, UpstreamConfig};

const MIN_VALID: Duration = Duration::from_secs(1);
const MAX_VALID: Duration = Duration::from_secs(3600);

/// The task keeping an upstream's targets resolved; it ends when this is
/// dropped (the upstream was replaced by a reload).
pub(super) struct Resolving {
    pub current: Arc<ArcSwap<TargetSet>>,
    /// True once every name has been asked once.
    pub first: watch::Receiver<bool>,
    /// Lookups that failed or came back empty.
    pub failures: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Resolving {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Resolving {
    /// Starts resolving `cfg`'s `resolve` targets; until the first answers
    /// the set holds the others only.
    pub fn start(cfg: &UpstreamConfig) -> Resolving {
        let fixed: Vec<Target> = cfg.targets.iter().filter(|t| !t.resolve).cloned().collect();
        let current = Arc::new(ArcSwap::from_pointee(TargetSet::new(cfg, fixed, &[])));
        let (done, first) = watch::channel(false);
        let failures = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(run(cfg.clone(), current.clone(), done, failures.clone()));
        Resolving {
            current,
            first,
            failures,
            task,
        }
    }
}

async fn run(
    cfg: UpstreamConfig,
    current: Arc<ArcSwap<TargetSet>>,
    done: watch::Sender<bool>,
    failures: Arc<AtomicU64>,
) {
    let resolver = match build(&cfg) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(upstream = %cfg.name, error = %e, "cannot read the system's DNS configuration; targets with resolve stay empty (set resolver.address)");
            failures.fetch_add(1, Ordering::Relaxed);
            let _ = done.send(true);
            return;
        }
    };
    // The last good addresses of each `resolve` entry.
    let mut known: Vec<Vec<IpAddr>> = vec![Vec::new(); cfg.targets.len()];
    loop {
        let mut next = MAX_VALID;
        for (i, entry) in cfg.targets.iter().enumerate().filter(|(_, t)| t.resolve) {
            let looked = tokio::time::timeout(
                cfg.resolver.timeout,
                resolver.lookup_ip(entry.host.as_str()),
            )
            .await;
            let (ips, valid) = match looked {
                Ok(Ok(answer)) => {
                    let mut ips: Vec<IpAddr> = answer.iter().collect();
                    ips.sort();
                    ips.dedup();
                    let ttl = answer
                        .valid_until()
                        .saturating_duration_since(tokio::time::Instant::now().into_std());
                    (ips, ttl)
                }
                Ok(Err(e)) => {
                    note_failure(&cfg, entry, &failures, &known[i], &e.to_string());
                    (Vec::new(), MIN_VALID * 5)
                }
                Err(_) => {
                    note_failure(&cfg, entry, &failures, &known[i], "timed out");
                    (Vec::new(), MIN_VALID * 5)
                }
            };
            if ips.is_empty() {
                next = next.min(MIN_VALID * 5);
                continue;
            }
            if ips != known[i] {
                tracing::info!(upstream = %cfg.name, name = %entry.authority, addresses = ?ips, "resolved");
                known[i] = ips;
            }
            next = next.min(
                cfg.resolver
                    .valid
                    .unwrap_or(valid)
                    .clamp(MIN_VALID, MAX_VALID),
            );
        }
        let targets = expand(&cfg.targets, &known);
        let now = current.load();
        let same = now.targets.len() == targets.len()
            && now
                .targets
                .iter()
                .zip(&targets)
                .all(|(a, b)| *a.authority == b.authority);
        if !same {
            current.store(Arc::new(TargetSet::new(&cfg, targets, &now.targets)));
        }
        drop(now);
        let _ = done.send(true);
        tokio::time::sleep(next).await;
    }
}

fn note_failure(
    cfg: &UpstreamConfig,
    entry: &Target,
    failures: &AtomicU64,
    kept: &[IpAddr],
    why: &str,
) {
    failures.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(upstream = %cfg.name, name = %entry.authority, error = why, kept = ?kept, "DNS lookup failed; keeping the last good addresses");
}

/// The targets: each fixed entry as it is, each `resolve` entry one per
/// address it resolved to.
fn expand(entries: &[Target], known: &[Vec<IpAddr>]) -> Vec<Target> {
    let mut out = Vec::new();
    for (entry, ips) in entries.iter().zip(known) {
        if !entry.resolve {
            out.push(entry.clone());
            continue;
        }
        for ip in ips {
            let addr = SocketAddr::new(*ip, entry.port);
            out.push(Target {
                authority: addr.to_string(),
                addr: Some(addr),
                entry: Some(entry.authority.clone()),
                ..entry.clone()
            });
        }
    }
    out
}

fn build(cfg: &UpstreamConfig) -> Result<TokioResolver, String> {
    let provider = TokioRuntimeProvider::default();
    let mut builder = match cfg.resolver.address {
        Some(at) => {
            let mut udp = ConnectionConfig::udp();
            udp.port = at.port();
            let mut tcp = ConnectionConfig::tcp();
            tcp.port = at.port();
            let server = NameServerConfig::new(at.ip(), true, vec![udp, tcp]);
            TokioResolver::builder_with_config(
                ResolverConfig::from_parts(None, vec![], vec![server]),
                provider,
            )
        }
        None => TokioResolver::builder(provider).map_err(|e| e.to_string())?,
    };
    let opts = builder.options_mut();
    opts.timeout = cfg.resolver.timeout;
    opts.attempts = 1;
    // Every A and AAAA record, asked for at once.
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    // Each lookup asks the server: the answer's TTL says when to ask again.
    opts.cache_size = 0;
    builder.build().map_err(|e| e.to_string())
}
