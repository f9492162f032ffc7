//! The admin listener (default `127.0.0.1:9090`):
//!
//! - `/healthz` says the process is alive; `/readyz` says the config is
//!   loaded and every listener is bound, and turns 503 while draining so
//!   load balancers stop sending. `/readyz` also reports the rate-limit
//!   store; a Redis that is down does not make the replica unready (its
//!   limits follow `on_error`, and pulling every replica out of the load
//!   balancer would not bring Redis back).
//! - `/metrics` serves the Prometheus exposition (OpenMetrics when the
//!   scraper asks for `application/openmetrics-text`); see `crate::metrics`.
//! - `/api/*` is the JSON API an operator answers tickets with ([`api`]):
//!   the limits, one key's state, its reset, the top offenders, the
//!   upstreams' targets and their drain ([`upstreams`]).
//! - `/dashboard` is one self-contained page drawn from `/api/overview`
//!   ([`dashboard`]).
//!
//! With `admin.token` set, `/api/*` (and `/metrics` with `protect_metrics`)
//! need `Authorization: Bearer <token>`. The dashboard page itself holds no
//! data: it asks for the token once and sends it with every API call.

mod api;
mod bans;
mod dashboard;
pub(crate) mod keys;
mod overrides;
pub(crate) mod report;
mod upstreams;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::metrics::history::STEP;

pub struct AdminState {
    /// False once shutdown has begun.
    pub ready: Arc<AtomicBool>,
    /// The listeners accepting now (a reload replaces the list).
    pub listeners: Arc<arc_swap::ArcSwap<Vec<(String, SocketAddr)>>>,
    /// The running request path (swapped by reloads).
    pub live: crate::pipeline::Live,
    /// Tokens (replaced by reloads).
    pub auth: Arc<arc_swap::ArcSwap<AdminAuth>>,
    /// Asks the server to reload its config (`POST /api/reload`).
    pub reload: Option<crate::reload::ReloadHandle>,
}

/// Who may use the protected endpoints (`/api/*`, and `/metrics` with
/// `protect_metrics`).
#[derive(Clone, Default)]
pub struct AdminAuth {
    /// SHA-256 of each accepted bearer token; empty: nothing is asked.
    pub token_hashes: Vec<[u8; 32]>,
    pub protect_metrics: bool,
}

/// Who made an admin request, as logged: the token's digest prefix (never
/// the token) and the peer address.
struct Caller {
    token: Option<String>,
    peer: SocketAddr,
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.token {
            Some(t) => write!(f, "token sha256:{t} from {}", self.peer),
            None => write!(f, "{} (no admin token configured)", self.peer),
        }
    }
}

impl AdminAuth {
    /// Whether `req` may use `path` (and with which token): open paths
    /// always; protected ones with a bearer token whose digest matches one
    /// configured, compared in constant time against every one.
    fn allows(&self, path: &str, req: &Request<Incoming>) -> Result<Option<String>, ()> {
        let protected = path.starts_with("/api/") || (self.protect_metrics && path == "/metrics");
        if !protected || self.token_hashes.is_empty() {
            return Ok(None);
        }
        let token = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .ok_or(())?;
        let i =
            crate::secret::matching_token(&self.token_hashes, token.trim().as_bytes()).ok_or(())?;
        let prefix: String = self.token_hashes[i][..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(Some(prefix))
    }
}

pub async fn serve(listener: TcpListener, state: AdminState) {
    let state = Arc::new(state);
    tokio::spawn(sample(Arc::downgrade(&state.live)));
    loop {
        let Ok((tcp, peer)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(req, &state, peer).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

/// Samples the totals every [`STEP`] for the dashboard's last 15 minutes,
/// until the server is gone.
async fn sample(live: std::sync::Weak<arc_swap::ArcSwap<crate::pipeline::Pipeline>>) {
    let mut every = tokio::time::interval(STEP);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(live) = live.upgrade() else {
            return;
        };
        let p = live.load_full();
        p.metrics().history().record(p.sample());
    }
}

const OPENMETRICS: &str = "application/openmetrics-text";

/// An RFC 9457 problem body.
fn problem(status: StatusCode, detail: impl Into<String>) -> (StatusCode, serde_json::Value) {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or(""),
        "status": status.as_u16(),
        "detail": detail.into(),
    });
    (status, body)
}

fn json((status, body): (StatusCode, serde_json::Value)) -> Response<Full<Bytes>> {
    // Errors are RFC 9457 problems; `/readyz`'s 503 is a plain status.
    let content_type = if status.as_u16() >= 400 && body.get("title").is_some() {
        "application/problem+json"
    } else {
        "application/json"
    };
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    resp
}

async fn answer(
    req: Request<Incoming>,
    state: &AdminState,
    peer: SocketAddr,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    let pipeline = state.live.load_full();
    let token = match state.auth.load().allows(&path, &req) {
        Ok(token) => token,
        Err(()) => {
            pipeline.metrics().admin_unauthorized();
            tracing::info!(%path, %peer, "admin request without a valid token");
            let mut resp = json(problem(
                StatusCode::UNAUTHORIZED,
                "this admin endpoint needs `Authorization: Bearer <admin.token>`",
            ));
            resp.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"tollgate-admin\""),
            );
            return resp;
        }
    };
    let caller = Caller { token, peer };
    let query = req.uri().query().unwrap_or("").to_owned();
    let method = req.method().clone();
    match (&method, path.as_str()) {
        (_, "/metrics") => metrics(&req, &pipeline),
        (&Method::GET, "/dashboard" | "/dashboard/") => dashboard::page(),
        (&Method::GET, "/healthz") => json((StatusCode::OK, serde_json::json!({ "status": "ok" }))),
        (&Method::GET, "/readyz") => json(ready(state, &pipeline)),
        (&Method::GET, "/api/top") => json(api::top(&query, &pipeline)),
        (&Method::GET, "/api/limits") => json(api::limits(&pipeline)),
        (&Method::GET, "/api/overview") => json(api::overview(&query, &pipeline)),
        (&Method::POST, "/api/reload") => json(reload(state, &caller).await),
        (m, p) if p.starts_with("/api/keys/") => {
            let rest = &p["/api/keys/".len()..];
            json(match *m {
                Method::GET => api::key(rest, &query, &pipeline).await,
                Method::DELETE => api::reset(rest, &query, &pipeline, &caller).await,
                _ => problem(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "/api/keys/<limit>/<key> takes GET (read) or DELETE (reset)",
                ),
            })
        }
        (&Method::GET, "/api/bans") => json(bans::list(&pipeline, &query)),
        (&Method::DELETE, p) if p.starts_with("/api/bans/") => {
            json(bans::lift(&p["/api/bans/".len()..], &pipeline, &caller).await)
        }
        (&Method::GET, "/api/overrides") => json(overrides::list(&pipeline).await),
        (m, p) if p.starts_with("/api/overrides/") => {
            let rest = &p["/api/overrides/".len()..];
            json(match *m {
                Method::PUT => match body(req).await {
                    Ok(body) => overrides::put(rest, &body, &pipeline, &caller).await,
                    Err(reply) => reply,
                },
                Method::DELETE => overrides::delete(rest, &pipeline, &caller).await,
                _ => problem(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "/api/overrides/<limit>/<key> takes PUT (set, JSON body) or DELETE",
                ),
            })
        }
        (&Method::GET, "/api/upstreams") => json(upstreams::list(&pipeline)),
        (m, p) if p.starts_with("/api/upstreams/") => {
            let rest = &p["/api/upstreams/".len()..];
            json(match *m {
                Method::PUT => match body(req).await {
                    Ok(body) => upstreams::put(rest, &body, &pipeline, &caller),
                    Err(reply) => reply,
                },
                _ => problem(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "/api/upstreams/<upstream>/<target> takes PUT with {\"down\": true|false}",
                ),
            })
        }
        (_, p) if p.starts_with("/api/bans/") => json(problem(
            StatusCode::METHOD_NOT_ALLOWED,
            "/api/bans/<limit>/<key> takes DELETE (lift the ban)",
        )),
        (_, "/healthz" | "/readyz" | "/dashboard" | "/api/top" | "/api/limits" | "/api/overview" | "/api/overrides" | "/api/bans" | "/api/upstreams") => {
            json(problem(StatusCode::METHOD_NOT_ALLOWED, format!("{path} takes GET")))
        }
        (_, "/api/reload") => json(problem(StatusCode::METHOD_NOT_ALLOWED, "/api/reload takes POST")),
        _ => json(problem(
            StatusCode::NOT_FOUND,
            format!("no admin endpoint {path}; try /healthz, /readyz, /metrics, /dashboard or /api/limits"),
        )),
    }
}

/// A request body of at most 64 KiB, or the reply to give instead.
async fn body(req: Request<Incoming>) -> Result<Bytes, (StatusCode, serde_json::Value)> {
    use http_body_util::BodyExt;
    let limited = http_body_util::Limited::new(req.into_body(), 64 << 10);
    match limited.collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) => Err(problem(
            StatusCode::BAD_REQUEST,
            format!("the body could not be read (at most 64 KiB): {e}"),
        )),
    }
}

/// `POST /api/reload`: reads the config file again; 200 with what changed,
/// 400 with every problem (the running config stays), 500 when it could
/// not be put in place.
async fn reload(state: &AdminState, caller: &Caller) -> (StatusCode, serde_json::Value) {
    let Some(handle) = &state.reload else {
        return problem(StatusCode::SERVICE_UNAVAILABLE, "reloads are not available");
    };
    tracing::info!(by = %caller, "admin: config reload asked");
    match handle.reload().await {
        Ok(report) => (
            StatusCode::OK,
            serde_json::json!({ "status": "reloaded", "changes": report }),
        ),
        Err(crate::reload::ReloadError::Invalid(problems)) => {
            let (status, mut body) = problem(
                StatusCode::BAD_REQUEST,
                format!(
                    "the config has {} problem(s); the running config stays",
                    problems.len()
                ),
            );
            body["problems"] = serde_json::json!(problems);
            (status, body)
        }
        Err(crate::reload::ReloadError::Failed(why)) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{why}; the running config stays"),
        ),
    }
}

fn metrics(
    req: &Request<Incoming>,
    pipeline: &Arc<crate::pipeline::Pipeline>,
) -> Response<Full<Bytes>> {
    let openmetrics = req
        .headers()
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains(OPENMETRICS));
    let sources: Arc<dyn crate::metrics::Sources> = pipeline.clone();
    let body = pipeline.metrics().encode(sources, openmetrics);
    let content_type = if openmetrics {
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    } else {
        "text/plain; version=0.0.4; charset=utf-8"
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn ready(
    state: &AdminState,
    pipeline: &crate::pipeline::Pipeline,
) -> (StatusCode, serde_json::Value) {
    if !state.ready.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({ "status": "draining" }),
        );
    }
    let listeners: Vec<_> = state
        .listeners
        .load()
        .iter()
        .map(|(name, addr)| serde_json::json!({ "name": name, "addr": addr.to_string() }))
        .collect();
    (
        StatusCode::OK,
        serde_json::json!({
            "status": "ready",
            "listeners": listeners,
            "store": pipeline.store_report(),
        }),
    )
}
