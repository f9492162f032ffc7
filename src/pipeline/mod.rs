//! The request path, one stage per module, called in order by
//! [`Pipeline::handle`]:
//!
//! ```text
//! client_ip -> normalize + route -> identity -> bypass / webhook sources
//!   -> zones + route limits (one store decision) -> upstream (forward)
//!   -> response
//! ```
//!
//! Route matching precedes the zones because a route may list the zones it
//! is subject to; a request that matches no route meets every zone before
//! its 404. `handle` is the outer handler: it logs once and turns a
//! `ProxyError` into a problem response; `serve` is the inner one and uses `?`.

pub mod body;
pub mod client_ip;
pub mod forward;
pub mod identity;
pub mod key;
pub mod limits;
pub mod normalize;
pub mod response;
pub mod route;
pub mod upstream;
pub mod webhook;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{HeaderValue, CONTENT_LENGTH, HOST};
use http::uri::{PathAndQuery, Uri};
use http::{HeaderMap, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use self::body::{ProxyBody, RequestBody};
use self::client_ip::{ClientIp, Resolved};
use self::forward::Forwarded;
use self::identity::Identity;
use self::key::KeySource;
use self::limits::{Limiter, RouteOutcome};
use self::response::{AccessRecord, RequestEnd};
use self::route::RouteMatch;
use self::upstream::{Exchange, Upstream};
use crate::config::{ClientIpConfig, Config, HostHeader, IdentityConfig, RouteAction, RouteConfig};
use crate::error::ProxyError;
use crate::listener::conn::ConnState;

/// Everything a request needs, shared by all connections.
pub struct Pipeline {
    routes: Vec<RouteConfig>,
    /// Indexed like `Config::upstreams`, which routes refer to.
    upstreams: Vec<Arc<Upstream>>,
    max_header_bytes: usize,
    max_headers: usize,
    body_read_timeout: std::time::Duration,
    access_log: bool,
    /// Trusted proxies, forwarding headers and key prefixes.
    client_ip: ClientIpConfig,
    /// Verifies JWTs / API keys when configured.
    identity: Option<IdentityConfig>,
    /// Zones, route-limit state and bypass rules.
    limiter: Limiter,
    /// `0..zones`: what a request that matches no route is subject to.
    all_zones: Vec<usize>,
}

/// What the listener knows about a connection.
pub struct ConnInfo {
    pub listener: Arc<str>,
    pub peer: SocketAddr,
    /// The peer (the TCP peer, or a trusted PROXY header's source), as a
    /// client address rendered once per connection.
    pub client: ClientIp,
    /// Whether tollgate terminated TLS on this connection (`X-Forwarded-Proto`).
    pub tls: bool,
    pub state: Arc<ConnState>,
}

impl Pipeline {
    /// Takes the routes out of `config`; the rest of it is only read.
    pub fn new(config: &mut Config, redis: Option<crate::limiter::redis::RedisStore>) -> Self {
        Pipeline {
            routes: std::mem::take(&mut config.routes),
            upstreams: config
                .upstreams
                .iter()
                .map(|u| Arc::new(Upstream::new(u)))
                .collect(),
            max_header_bytes: config.server.max_header_bytes,
            max_headers: config.server.max_headers,
            body_read_timeout: config.server.body_read_timeout,
            access_log: config.log.access_log,
            client_ip: config.client_ip.clone(),
            identity: config.identity.take(),
            all_zones: (0..config.zones.len()).collect(),
            limiter: Limiter::new(
                std::mem::take(&mut config.zones),
                std::mem::take(&mut config.bypass),
                &config.store_zones,
                redis,
            ),
        }
    }

    /// The rate-limit store's state, for `/readyz`.
    pub fn store_report(&self) -> serde_json::Value {
        match self.limiter.redis() {
            None => serde_json::json!({ "kind": "memory", "up": true }),
            Some(r) => serde_json::json!({
                "kind": "redis",
                "up": r.is_up(),
                "calls": r.calls(),
            }),
        }
    }

    pub fn client_ip_config(&self) -> &ClientIpConfig {
        &self.client_ip
    }

    /// The outer handler: never fails, logs errors once, and settles the
    /// request (access log, in-flight count) when the response body ends.
    pub async fn handle(&self, req: Request<Incoming>, conn: &ConnInfo) -> Response<ProxyBody> {
        let started = Instant::now();
        let resolved = self.client_ip.resolve(&conn.client, req.headers());
        let client = &resolved.client;
        let record = self.access_log.then(|| {
            Box::new(AccessRecord {
                listener: conn.listener.clone(),
                client: client.ip,
                method: req.method().clone(),
                path: req.uri().path().to_owned(),
                route: None,
                user: None,
                rate_limit: None,
                upstream: None,
                target: None,
                // nginx's "client closed request", kept if the client goes
                // away before there is a response.
                status: StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            })
        });
        let mut end = RequestEnd::new(started, record, conn.state.clone());
        let mut resp = match self.serve(req, conn, &resolved, &mut end).await {
            Ok(resp) => resp,
            Err(err) => {
                if err.is_client_error() {
                    tracing::debug!(client = %client.ip, error = %err, "request refused");
                } else {
                    tracing::warn!(client = %client.ip, error = %err, "request failed");
                }
                if let ProxyError::RateLimited { limit, .. } = &err {
                    end.set_rate_limit(|| format!("rejected:{limit}"));
                }
                response::problem(&err)
            }
        };
        end.set_status(resp.status());
        resp.body_mut().set_end(end);
        resp
    }

    async fn serve(
        &self,
        mut req: Request<Incoming>,
        conn: &ConnInfo,
        client: &Resolved,
        end: &mut RequestEnd,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        self.check_headers(req.headers())?;
        // One spelling per path before anything matches or counts on it;
        // the normalised path is also what the upstream receives.
        if let Cow::Owned(path) =
            normalize::normalize(req.uri().path()).map_err(|e| ProxyError::BadRequest(e.0))?
        {
            *req.uri_mut() = with_path(req.uri(), &path)?;
        }
        let host = request_host(&req)?;
        let found = route::find(&self.routes, host, req.uri().path(), req.method());
        let route = match &found {
            RouteMatch::Found(r) => Some(*r),
            _ => None,
        };
        let identity = match &self.identity {
            Some(id) => id
                .identify(req.headers())
                .map_err(|e| ProxyError::Unauthorized(e.0))?,
            None => Identity::Anonymous,
        };
        if let Identity::User(user) = &identity {
            end.set_user(user);
        }
        let ip = client.client.ip;
        let webhook = route.and_then(|r| r.webhook.as_ref());
        let allowed_source = webhook.is_some_and(|w| w.allows(ip));
        if webhook.is_some_and(|w| w.only_allowed) && !allowed_source {
            return Err(ProxyError::Forbidden(
                "this route only accepts requests from its allowed sources",
            ));
        }
        let exempt = allowed_source || self.limiter.bypassed(req.uri().path(), req.headers(), ip);
        if exempt {
            end.set_rate_limit(|| "bypass".to_owned());
        }
        let src = KeySource {
            client: ip,
            identity: &identity,
            headers: req.headers(),
        };
        // Both tiers in one decision. A request that matches no route
        // still meets every zone.
        let outcome = if exempt {
            RouteOutcome::default()
        } else {
            let zones = route.map_or(self.all_zones.as_slice(), |r| r.zones.as_slice());
            self.limiter
                .limit(zones, route, &src, &self.client_ip, &mut end.slots)
                .await?
        };
        let route = match found {
            RouteMatch::Found(r) => r,
            RouteMatch::MethodNotAllowed(allow) => {
                return Err(ProxyError::MethodNotAllowed {
                    method: req.method().to_string(),
                    path: req.uri().path().to_owned(),
                    allow,
                })
            }
            RouteMatch::NotFound => {
                return Err(ProxyError::NoRoute {
                    method: req.method().to_string(),
                    path: req.uri().path().to_owned(),
                })
            }
        };
        end.set_route(&route.name);
        let mut resp = match &route.action {
            RouteAction::Respond(r) => response::respond(r, req.method()),
            RouteAction::Forward(i) => {
                let upstream = &self.upstreams[*i];
                end.set_upstream(&upstream.name);
                self.forward(req, conn, client, upstream, route, end)
                    .await?
            }
        };
        if !outcome.deferred.is_empty() {
            self.limiter
                .charge_outcome(route, &outcome.deferred, resp.status().as_u16())
                .await;
        }
        limits::add_headers(
            resp.headers_mut(),
            route.headers,
            route.warn_at,
            &outcome.applied,
            false,
        );
        Ok(resp)
    }

    fn check_headers(&self, headers: &HeaderMap) -> Result<(), ProxyError> {
        if headers.len() > self.max_headers {
            return Err(ProxyError::TooManyHeaders {
                count: headers.len(),
                limit: self.max_headers,
            });
        }
        let size: usize = headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum();
        if size > self.max_header_bytes {
            return Err(ProxyError::HeadersTooLarge {
                size,
                limit: self.max_header_bytes,
            });
        }
        Ok(())
    }

    async fn forward(
        &self,
        mut req: Request<Incoming>,
        conn: &ConnInfo,
        client: &Resolved,
        upstream: &Upstream,
        route: &RouteConfig,
        end: &mut RequestEnd,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let max_body = route.max_body_bytes;
        let verify = route.webhook.as_ref().and_then(|w| w.verify.as_ref());
        if let Some(len) = content_length(req.headers()) {
            if len > max_body {
                return Err(ProxyError::BodyTooLarge { limit: max_body });
            }
        }
        let upgrade = match req.version() {
            Version::HTTP_11 => forward::requested_upgrade(req.headers()),
            _ => None,
        };
        let client_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));

        let (mut parts, body) = req.into_parts();
        let host = parts.headers.get(HOST).cloned().or_else(|| {
            parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
        let proto = if conn.tls { "https" } else { "http" };
        let chain = client_ip::forwarded_for(&parts.headers, &conn.client, client.peer_trusted);
        forward::request_headers(
            &mut parts.headers,
            upgrade,
            Forwarded {
                client: &client.client.header,
                chain,
                trusted: client.peer_trusted,
                proto,
                host: host.clone(),
            },
        );
        let host = match (&upstream.host_header, host) {
            (HostHeader::Preserve, Some(h)) => h,
            (HostHeader::Fixed(v), _) => v.clone(),
            (HostHeader::Target | HostHeader::Preserve, _) => upstream.target_host_value(),
        };
        parts.headers.insert(HOST, host);
        if parts.uri.authority().is_some() {
            // HTTP/2 and absolute-form requests; HTTP/1.1 ones already are
            // origin-form.
            parts.uri = origin_form(&parts.uri);
        }
        parts.version = Version::HTTP_11;
        let body = match verify {
            None => RequestBody::new(body, max_body, self.body_read_timeout),
            Some(v) => {
                // Signed bodies are read whole (within the size limit) and
                // checked before a byte goes upstream.
                let data = match http_body_util::BodyExt::collect(http_body_util::Limited::new(
                    body,
                    max_body as usize,
                ))
                .await
                {
                    Ok(c) => c.to_bytes(),
                    Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                        return Err(ProxyError::BodyTooLarge { limit: max_body })
                    }
                    Err(_) => return Err(ProxyError::BadRequest("the request body was cut off")),
                };
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                webhook::verify(v, &parts.headers, &data, now)?;
                RequestBody::buffered(data)
            }
        };
        let req = Request::from_parts(parts, body);

        let mut target = None;
        let sent = upstream.send(req, &mut target).await;
        end.set_target(target);
        let Exchange {
            mut response,
            conn: pooled,
        } = sent?;

        let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
        if switching {
            let Some(client_upgrade) = client_upgrade else {
                return Err(ProxyError::UpstreamFailed {
                    upstream: upstream.name.to_string(),
                    reason: "answered 101 to a request that asked for no upgrade".into(),
                });
            };
            let upstream_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                // Keeps the upstream connection's sender alive until the
                // upgrade has been handed over.
                let _sender = pooled;
                match tokio::try_join!(client_upgrade, upstream_upgrade) {
                    Ok((down, up)) => {
                        let (mut down, mut up) = (TokioIo::new(down), TokioIo::new(up));
                        if let Err(e) = tokio::io::copy_bidirectional(&mut down, &mut up).await {
                            tracing::debug!(error = %e, "upgraded tunnel closed with an error");
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "upgrade did not complete"),
                }
            });
            forward::response_headers(response.headers_mut(), true);
            let (parts, _) = response.into_parts();
            return Ok(Response::from_parts(parts, ProxyBody::empty()));
        }
        forward::response_headers(response.headers_mut(), false);
        let (parts, incoming) = response.into_parts();
        Ok(Response::from_parts(
            parts,
            ProxyBody::upstream(incoming, upstream.timeout, Some(pooled)),
        ))
    }
}

/// The host the request is for: the URI authority (HTTP/2, absolute-form)
/// or the `Host` header, without port. HTTP/1.1 requires one.
fn request_host(req: &Request<Incoming>) -> Result<Option<&str>, ProxyError> {
    if let Some(h) = req.uri().host() {
        return Ok(Some(h));
    }
    match req.headers().get(HOST) {
        Some(v) => match v.to_str() {
            Ok(s) if !s.is_empty() => Ok(Some(route::strip_port(s))),
            _ => Err(ProxyError::BadRequest(
                "the Host header is not a valid host",
            )),
        },
        None if req.version() == Version::HTTP_11 => Err(ProxyError::BadRequest(
            "HTTP/1.1 requests need a Host header",
        )),
        None => Ok(None),
    }
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// `uri` with its path replaced by `path` (the query is kept).
fn with_path(uri: &Uri, path: &str) -> Result<Uri, ProxyError> {
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(
        PathAndQuery::try_from(pq)
            .map_err(|_| ProxyError::BadRequest("the path cannot be normalised"))?,
    );
    Uri::from_parts(parts).map_err(|_| ProxyError::BadRequest("the path cannot be normalised"))
}

/// `/path?query` for the upstream request line.
fn origin_form(uri: &Uri) -> Uri {
    let pq = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    Uri::from(pq)
}
