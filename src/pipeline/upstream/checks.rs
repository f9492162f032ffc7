//! Active health checks (nginx Plus `health_check`): one task per target
//! per process, never per worker and never on the request path, asks
//! `GET <path>` every `interval` (over a connection of its own, TLS where
//! the upstream speaks it; HTTP/2 to a `protocol: h2` upstream, and to an
//! `auto` one whose target picks h2 in the TLS handshake; else HTTP/1.1
//! with `Connection: close`) and reads the answer's
//! status within `timeout`. `fails` failed checks in a row take the
//! target out of the balancer; `passes` passed ones bring it back. When
//! every target fails its checks, requests still go to all of them (a
//! checker that is wrong, or a path that went away, must not cause the
//! outage it is there to avoid): `Upstream::send` sees to that, with a
//! log line and a metric.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use super::io::Io;
use super::target::TargetState;
use crate::config::{HealthCheck, UpstreamProtocol};

type Tls = (TlsConnector, Option<rustls_pki_types::ServerName<'static>>);

/// Starts checking `target` (the task ends once the target is gone).
pub(super) fn start(
    target: &Arc<TargetState>,
    check: HealthCheck,
    upstream: Arc<str>,
    connect_timeout: Duration,
    tls: Option<Tls>,
    protocol: UpstreamProtocol,
) {
    let weak = Arc::downgrade(target);
    tokio::spawn(run(weak, check, upstream, connect_timeout, tls, protocol));
}

async fn run(
    weak: Weak<TargetState>,
    check: HealthCheck,
    upstream: Arc<str>,
    connect_timeout: Duration,
    tls: Option<Tls>,
    protocol: UpstreamProtocol,
) {
    let (mut failed_in_row, mut passed_in_row) = (0u32, 0u32);
    loop {
        let Some(target) = weak.upgrade() else {
            return;
        };
        let probed = tokio::time::timeout(
            check.timeout,
            probe(
                &target,
                &check.path,
                connect_timeout,
                tls.as_ref(),
                protocol,
            ),
        )
        .await;
        let result = match probed {
            Ok(Ok(status)) if (check.status.0..=check.status.1).contains(&status) => Ok(()),
            Ok(Ok(status)) => Err(format!("answered {status}")),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("no answer within {}ms", check.timeout.as_millis())),
        };
        let out = target.check_failed.load(Ordering::Relaxed);
        match result {
            Ok(()) => {
                target.stats.checks[0].fetch_add(1, Ordering::Relaxed);
                failed_in_row = 0;
                passed_in_row += 1;
                if out && passed_in_row >= check.passes {
                    target.check_failed.store(false, Ordering::Relaxed);
                    target.came_back(crate::clock::unix_ms());
                    tracing::info!(upstream = %upstream, target = %target.authority, "health check passed: the target takes requests again");
                }
            }
            Err(why) => {
                target.stats.checks[1].fetch_add(1, Ordering::Relaxed);
                passed_in_row = 0;
                failed_in_row += 1;
                if !out && failed_in_row >= check.fails {
                    target.check_failed.store(true, Ordering::Relaxed);
                    tracing::warn!(upstream = %upstream, target = %target.authority, path = %check.path, error = %why, "health check failed: the target takes no requests");
                }
            }
        }
        drop(target);
        tokio::time::sleep(check.interval).await;
    }
}

/// One check: the status of `GET path`.
async fn probe(
    target: &TargetState,
    path: &str,
    connect_timeout: Duration,
    tls: Option<&Tls>,
    protocol: UpstreamProtocol,
) -> Result<u16, String> {
    let mut conn = target
        .connect(connect_timeout, tls)
        .await
        .map_err(|(_, e)| e)?;
    let host = String::from_utf8_lossy(target.host_value.as_bytes()).into_owned();
    let h2 = match (&conn.io, protocol) {
        (_, UpstreamProtocol::H2) => true,
        (Io::Tls(s), UpstreamProtocol::Auto) => s.get_ref().1.alpn_protocol() == Some(b"h2"),
        _ => false,
    };
    if h2 {
        return probe_h2(conn.io, &host, path).await;
    }
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: tollgate-health-check\r\nConnection: close\r\n\r\n"
    );
    conn.io
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    // The status line is all a check reads.
    let mut head = [0u8; 32];
    let mut got = 0;
    while got < 12 {
        let n = conn
            .io
            .read(&mut head[got..])
            .await
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed before a status line".into());
        }
        got += n;
    }
    let line = &head[..got];
    if !line.starts_with(b"HTTP/1.") || line[8] != b' ' {
        return Err("the answer is not HTTP/1.x".into());
    }
    std::str::from_utf8(&line[9..12])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| "no status code".to_owned())
}

/// One check over HTTP/2 (prior knowledge on TCP, ALPN h2 over TLS).
async fn probe_h2(io: Io, host: &str, path: &str) -> Result<u16, String> {
    let scheme = match io {
        Io::Tls(_) => "https",
        Io::Tcp(_) => "http",
    };
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(io),
    )
    .await
    .map_err(|e| format!("HTTP/2 handshake failed: {e}"))?;
    // The connection is driven here until the answer's head, then dropped.
    let driven = tokio::spawn(conn);
    let req = http::Request::get(format!("{scheme}://{host}{path}"))
        .header(http::header::USER_AGENT, "tollgate-health-check")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let answer = sender.send_request(req).await;
    driven.abort();
    answer
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("HTTP/2 request failed: {e}"))
}
