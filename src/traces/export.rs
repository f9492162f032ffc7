//! Spans to the collector: a queue bounded in spans (a full queue drops
//! the newest, counted: a request never waits for tracing), drained by one
//! task that POSTs batches as OTLP/HTTP protobuf over a kept connection,
//! each POST within the configured timeout (a failed one's spans are
//! dropped, counted).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use prost::Message;
use tokio::sync::mpsc;

use super::otlp;
use crate::config::TracesConfig;

pub(super) struct Exporter {
    shared: Arc<Shared>,
    /// Made (and the task spawned) by the first span, on the runtime that
    /// serves requests.
    tx: OnceLock<mpsc::UnboundedSender<Vec<otlp::Span>>>,
}

struct Shared {
    config: TracesConfig,
    /// Spans queued and not yet taken by the task.
    queued: AtomicUsize,
    exported: AtomicU64,
    dropped_full: AtomicU64,
    dropped_failed: AtomicU64,
}

impl Exporter {
    pub fn new(config: &TracesConfig) -> Exporter {
        Exporter {
            shared: Arc::new(Shared {
                config: config.clone(),
                queued: AtomicUsize::new(0),
                exported: AtomicU64::new(0),
                dropped_full: AtomicU64::new(0),
                dropped_failed: AtomicU64::new(0),
            }),
            tx: OnceLock::new(),
        }
    }

    pub fn counts(&self) -> [(&'static str, u64); 3] {
        let s = &self.shared;
        [
            ("exported", s.exported.load(Ordering::Relaxed)),
            ("queue_full", s.dropped_full.load(Ordering::Relaxed)),
            ("export_failed", s.dropped_failed.load(Ordering::Relaxed)),
        ]
    }

    /// Queues one request's spans, or drops them (counted) when the queue
    /// has no room for them all.
    pub fn queue(&self, spans: Vec<otlp::Span>) {
        let n = spans.len();
        let s = &self.shared;
        let room = s
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q + n <= s.config.queue).then_some(q + n)
            })
            .is_ok();
        if !room {
            s.dropped_full.fetch_add(n as u64, Ordering::Relaxed);
            return;
        }
        let Some(tx) = self.sender() else {
            s.queued.fetch_sub(n, Ordering::AcqRel);
            s.dropped_failed.fetch_add(n as u64, Ordering::Relaxed);
            return;
        };
        if tx.send(spans).is_err() {
            s.queued.fetch_sub(n, Ordering::AcqRel);
            s.dropped_failed.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// The queue's sender; the first call spawns the task (`None` outside
    /// a runtime, where nothing can be sent).
    fn sender(&self) -> Option<&mpsc::UnboundedSender<Vec<otlp::Span>>> {
        if let Some(tx) = self.tx.get() {
            return Some(tx);
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        Some(self.tx.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            runtime.spawn(run(rx, self.shared.clone()));
            tx
        }))
    }
}

/// Takes spans off the queue in batches of up to `batch`, each waiting at
/// most `interval` for company, and POSTs them one batch at a time. Ends
/// when the config that made it is gone (every sender dropped).
async fn run(mut rx: mpsc::UnboundedReceiver<Vec<otlp::Span>>, shared: Arc<Shared>) {
    let config = &shared.config;
    let mut client = Client::default();
    let mut batch: Vec<otlp::Span> = Vec::new();
    let take = |batch: &mut Vec<otlp::Span>, spans: Vec<otlp::Span>| {
        shared.queued.fetch_sub(spans.len(), Ordering::AcqRel);
        batch.extend(spans);
    };
    while let Some(first) = rx.recv().await {
        take(&mut batch, first);
        let until = tokio::time::Instant::now() + config.interval;
        while batch.len() < config.batch {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(spans)) => take(&mut batch, spans),
                Ok(None) | Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        let body = encode(config, std::mem::take(&mut batch));
        let sent = tokio::time::timeout(config.timeout, client.post(config, body)).await;
        match sent {
            Ok(Ok(())) => shared.exported.fetch_add(n, Ordering::Relaxed),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, spans = n, "traces: export failed; spans dropped");
                client.sender = None;
                shared.dropped_failed.fetch_add(n, Ordering::Relaxed)
            }
            Err(_) => {
                tracing::warn!(
                    spans = n,
                    timeout_ms = config.timeout.as_millis() as u64,
                    "traces: export timed out; spans dropped"
                );
                client.sender = None;
                shared.dropped_failed.fetch_add(n, Ordering::Relaxed)
            }
        };
    }
}

/// One `ExportTraceServiceRequest`: the service as the resource, tollgate
/// as the instrumentation scope.
fn encode(config: &TracesConfig, spans: Vec<otlp::Span>) -> Bytes {
    let request = otlp::ExportTraceServiceRequest {
        resource_spans: vec![otlp::ResourceSpans {
            resource: Some(otlp::Resource {
                attributes: vec![
                    otlp::KeyValue::string("service.name", config.service_name.clone()),
                    otlp::KeyValue::string("service.version", env!("CARGO_PKG_VERSION")),
                ],
            }),
            scope_spans: vec![otlp::ScopeSpans {
                scope: Some(otlp::InstrumentationScope {
                    name: "tollgate".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                spans,
            }],
        }],
    };
    Bytes::from(request.encode_to_vec())
}

/// One HTTP/1.1 connection to the collector, kept between batches and
/// made again after a failure.
#[derive(Default)]
struct Client {
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Client {
    async fn post(&mut self, config: &TracesConfig, body: Bytes) -> Result<(), String> {
        let uri = &config.uri;
        let ready = match self.sender.as_mut() {
            Some(s) => s.ready().await.is_ok(),
            None => false,
        };
        if !ready {
            self.sender = Some(connect(config).await?);
        }
        let sender = self.sender.as_mut().ok_or("no connection")?;
        let host = uri.authority().map(|a| a.as_str()).unwrap_or_default();
        let path = uri.path_and_query().map_or("/v1/traces", |p| p.as_str());
        let req = http::Request::post(path)
            .header(http::header::HOST, host)
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        // The answer's body (a partial-success message at most) is read so
        // the connection can carry the next batch.
        let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("the collector answered {status}"))
        }
    }
}

async fn connect(config: &TracesConfig) -> Result<SendRequest<Full<Bytes>>, String> {
    let uri = &config.uri;
    let host = uri.host().ok_or("no host")?.trim_matches(['[', ']']);
    let port = uri
        .port_u16()
        .unwrap_or(if config.tls.is_some() { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("cannot connect to {host}:{port}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    match &config.tls {
        None => handshake(TokioIo::new(tcp)).await,
        Some(tls) => {
            let name = rustls_pki_types::ServerName::try_from(host.to_owned())
                .map_err(|e| e.to_string())?;
            let stream = tokio_rustls::TlsConnector::from(tls.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS with {host}: {e}"))?;
            handshake(TokioIo::new(stream)).await
        }
    }
}

async fn handshake<T>(io: T) -> Result<SendRequest<Full<Bytes>>, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}
