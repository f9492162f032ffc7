//! The admin listener (default `127.0.0.1:9090`): `/healthz` says the
//! process is alive, `/readyz` says the config is loaded and every listener
//! is bound, and turns 503 while draining so load balancers stop sending.
//! `/readyz` also reports the rate-limit store; a Redis that is down does
//! not make the replica unready (its limits follow `on_error`, and pulling
//! every replica out of the load balancer would not bring Redis back).
//! `/metrics` serves the Prometheus exposition (OpenMetrics when the scraper
//! asks for `application/openmetrics-text`); see `crate::metrics`.
//! `/api/top?limit=<name>` lists the keys a limit rejected most lately.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

pub struct AdminState {
    /// False once shutdown has begun.
    pub ready: Arc<AtomicBool>,
    pub listeners: Vec<(String, SocketAddr)>,
    pub pipeline: Arc<crate::pipeline::Pipeline>,
    pub auth: AdminAuth,
}

/// Who may use the protected endpoints (`/api/*`, and `/metrics` with
/// `protect_metrics`).
#[derive(Clone, Default)]
pub struct AdminAuth {
    /// SHA-256 of each accepted bearer token; empty: nothing is asked.
    pub token_hashes: Vec<[u8; 32]>,
    pub protect_metrics: bool,
}

impl AdminAuth {
    /// Whether `req` may use `path`: open paths always; protected ones with
    /// a bearer token whose digest matches one configured, compared in
    /// constant time against every one.
    fn allows(&self, path: &str, req: &Request<Incoming>) -> bool {
        let protected = path.starts_with("/api/") || (self.protect_metrics && path == "/metrics");
        if !protected || self.token_hashes.is_empty() {
            return true;
        }
        let Some(token) = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
        else {
            return false;
        };
        crate::pipeline::bypass::token_matches(&self.token_hashes, token.trim().as_bytes())
    }
}

pub async fn serve(listener: TcpListener, state: AdminState) {
    let state = Arc::new(state);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(&req, &state)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

const OPENMETRICS: &str = "application/openmetrics-text";

/// `GET /api/top?limit=<name>[&route=<route>][&n=10]`: the keys each limit
/// of that name rejected most in the last few minutes.
fn top(query: &str, state: &AdminState) -> (StatusCode, serde_json::Value) {
    let param = |name: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    };
    let Some(limit) = param("limit") else {
        return (
            StatusCode::BAD_REQUEST,
            problem(
                400,
                "Bad Request",
                "name the limit: /api/top?limit=<name>&n=10".into(),
            ),
        );
    };
    let n = param("n")
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
        .clamp(1, crate::metrics::top::CAPACITY);
    let found = state.pipeline.metrics().top(limit, param("route"), n);
    if found.is_empty() {
        return (
            StatusCode::NOT_FOUND,
            problem(404, "Not Found", format!("no limit named \"{limit}\"")),
        );
    }
    let limits: Vec<serde_json::Value> = found
        .into_iter()
        .map(|(l, offenders)| {
            serde_json::json!({
                "tier": l.tier,
                "route": &*l.route,
                "limit": &*l.name,
                "window_seconds": crate::metrics::top::WINDOW.as_secs(),
                "top": offenders
                    .iter()
                    .map(|o| serde_json::json!({ "key": o.key, "rejections": o.count, "error": o.error }))
                    .collect::<Vec<_>>(),
            })
        })
        .collect();
    (StatusCode::OK, serde_json::json!({ "limits": limits }))
}

fn problem(status: u16, title: &str, detail: String) -> serde_json::Value {
    serde_json::json!({ "type": "about:blank", "title": title, "status": status, "detail": detail })
}

fn answer(req: &Request<Incoming>, state: &AdminState) -> Response<Full<Bytes>> {
    if !state.auth.allows(req.uri().path(), req) {
        state.pipeline.metrics().admin_unauthorized();
        tracing::info!(path = %req.uri().path(), "admin request without a valid token");
        let body = problem(
            401,
            "Unauthorized",
            "this admin endpoint needs `Authorization: Bearer <admin.token>`".into(),
        );
        let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
        *resp.status_mut() = StatusCode::UNAUTHORIZED;
        resp.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        resp.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"tollgate-admin\""),
        );
        return resp;
    }
    if req.uri().path() == "/metrics" {
        let openmetrics = req
            .headers()
            .get_all(http::header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.contains(OPENMETRICS));
        let sources: Arc<dyn crate::metrics::Sources> = state.pipeline.clone();
        let body = state.pipeline.metrics().encode(sources, openmetrics);
        let content_type = if openmetrics {
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        } else {
            "text/plain; version=0.0.4; charset=utf-8"
        };
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        return resp;
    }
    let (status, body) = match req.uri().path() {
        "/api/top" => top(req.uri().query().unwrap_or(""), state),
        "/healthz" => (StatusCode::OK, serde_json::json!({ "status": "ok" })),
        "/readyz" => {
            let listeners: Vec<_> = state
                .listeners
                .iter()
                .map(|(name, addr)| serde_json::json!({ "name": name, "addr": addr.to_string() }))
                .collect();
            if state.ready.load(Ordering::SeqCst) {
                (
                    StatusCode::OK,
                    serde_json::json!({
                        "status": "ready",
                        "listeners": listeners,
                        "store": state.pipeline.store_report(),
                    }),
                )
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    serde_json::json!({ "status": "draining" }),
                )
            }
        }
        other => (
            StatusCode::NOT_FOUND,
            problem(
                404,
                "Not Found",
                format!("no admin endpoint {other}; try /healthz, /readyz, /metrics or /api/top"),
            ),
        ),
    };
    let content_type = if status.is_client_error() {
        "application/problem+json"
    } else {
        "application/json"
    };
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}
