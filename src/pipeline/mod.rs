//! The request path, one stage per module, called in order by
//! [`Pipeline::serve`]:
//!
//! ```text
//! client_ip -> normalize + route -> bypass -> zones -> identity -> webhook
//!   -> limits (route limits + zones keyed by user) -> proxy (upstream)
//!   -> response
//! ```
//!
//! Route matching precedes the zones because a route may list the zones it
//! is subject to; a request that matches no route meets every zone before
//! its 404. The zones count every request before any credential or webhook
//! rule is looked at; their checks go to the store with the route limits
//! (one call) unless something in between may refuse the request or check
//! a signature, in which case they are decided first, on their own.
//!
//! `handle` is the outer handler: it renders a rejection or an error and
//! logs once; `serve` is the inner one and uses `?`. What a request carries
//! between stages is its [`ctx::Ctx`].

pub(crate) mod body;
pub(crate) mod bypass;
pub(crate) mod client_ip;
pub(crate) mod conn;
mod counted;
pub(crate) mod ctx;
pub(crate) mod decide;
pub(crate) mod discard;
pub(crate) mod forward;
pub(crate) mod host;
pub(crate) mod identity;
pub(crate) mod key;
pub(crate) mod limits;
pub(crate) mod normalize;
pub(crate) mod penalty;
pub(crate) mod protect;
pub(crate) mod proxy;
pub(crate) mod record;
mod replayed;
pub use replayed::Replayed;
pub(crate) mod response;
pub(crate) mod route;
pub(crate) mod settle;
mod traced;
pub(crate) mod upstream;
pub(crate) mod webhook;
pub(crate) mod zones;

// What the integration tests and benches call directly.
pub use self::client_ip::ClientIp;
pub use self::forward::{request_headers, Added, Forwarded};
pub use self::host::is_host;
pub use self::normalize::normalize;
pub use self::route::find as find_route;
pub use self::webhook::sign;

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{EXPECT, TRANSFER_ENCODING};
use http::{HeaderMap, Request, Response, StatusCode};
use hyper::body::Incoming;

use self::body::{ClientBody, ProxyBody, Reply};
use self::conn::ConnInfo;
use self::ctx::{Ctx, Stop};
use self::decide::Origin;
use self::identity::Identify;
use self::record::{AccessRecord, RequestEnd};
use self::route::RouteMatch;
use self::upstream::Upstream;
use self::zones::Zones;
use crate::alerts::Alerts;
use crate::config::{BypassConfig, ClientIpConfig, Config, RouteAction, RouteConfig};
use crate::error::ProxyError;
use crate::limiter::engine::Engine;
use crate::metrics::{LimitLabel, Metrics};

/// The running config's request path: every request loads it once, so a
/// reload swaps it whole and requests already inside finish on theirs.
pub type Live = Arc<arc_swap::ArcSwap<Pipeline>>;

/// Everything a request needs, shared by all connections.
pub struct Pipeline {
    pub(crate) routes: Vec<RouteConfig>,
    /// Indexed like `Config::upstreams`, which routes refer to.
    pub(crate) upstreams: Vec<Arc<Upstream>>,
    max_header_bytes: usize,
    max_headers: usize,
    body_read_timeout: std::time::Duration,
    /// How long to wait for each piece of an unread body being discarded,
    /// and for all of it (`lingering_timeout`, `lingering_time`).
    discard_bounds: (std::time::Duration, std::time::Duration),
    access_log: bool,
    /// Trusted proxies, forwarding headers and key prefixes.
    client_ip: ClientIpConfig,
    bypass: BypassConfig,
    /// Tier 1, and the `max_conn` slots per key.
    pub(crate) zones: Zones,
    /// Verifies JWTs / API keys when configured.
    pub(crate) identity: Identify,
    /// Where limit state lives, and what happens when it fails.
    pub(crate) engine: Arc<Engine>,
    pub(crate) metrics: Arc<Metrics>,
    /// Per route: the metrics index of its first limit (zones come first).
    limit_base: Box<[usize]>,
    /// Per metrics limit: its memory partition, for keys and evictions.
    pub(crate) partitions: Box<[usize]>,
    /// Attack alert rules on the limits.
    pub(crate) alerts: Arc<Alerts>,
    /// The listeners, in config order (as the metrics count them).
    pub(crate) listeners: Box<[ListenerView]>,
    /// Which requests an overloaded upstream sheds first.
    pub(crate) priorities: crate::config::Priorities,
    /// Spans of requests, when `traces` is configured.
    pub(crate) tracer: Option<Arc<crate::traces::Tracer>>,
}

/// A listener as the admin API shows it.
pub struct ListenerView {
    pub bind: SocketAddr,
    pub tls: bool,
    pub proxy_protocol: bool,
}

impl Pipeline {
    /// Takes the routes, zones and identity out of `config`; the rest of it
    /// is only read.
    pub fn new(config: &mut Config, engine: Engine) -> Self {
        Self::build(config, engine, None)
    }

    /// The request path of a reloaded config: `engine` comes from the
    /// running one's (`Engine::reloaded`), metrics series and upstream
    /// pools that did not change are shared with `previous`.
    pub fn reloaded(config: &mut Config, engine: Engine, previous: &Pipeline) -> Self {
        Self::build(config, engine, Some(previous))
    }

    fn build(config: &mut Config, engine: Engine, previous: Option<&Pipeline>) -> Self {
        let routes = std::mem::take(&mut config.routes);
        let zones = std::mem::take(&mut config.zones);
        let mut limits: Vec<LimitLabel> = zones
            .iter()
            .map(|z| LimitLabel {
                tier: "zone",
                name: z.limit.name.clone(),
                route: Arc::from("-"),
            })
            .collect();
        let mut partitions: Vec<usize> = zones.iter().map(|z| z.limit.zone).collect();
        let mut limit_base = Vec::with_capacity(routes.len());
        for r in &routes {
            limit_base.push(limits.len());
            for l in &r.limits {
                limits.push(LimitLabel {
                    tier: "route",
                    name: l.limit.name.clone(),
                    route: r.name.clone(),
                });
                partitions.push(l.limit.zone);
            }
        }
        let boxes = zones.iter().any(|z| z.penalty.is_some())
            || routes
                .iter()
                .flat_map(|r| &r.limits)
                .any(|l| l.penalty.is_some());
        if boxes {
            engine.watch_bans();
        }
        let listeners: Vec<&str> = config.listeners.iter().map(|l| l.name.as_str()).collect();
        let limit_names: Vec<Arc<str>> = limits.iter().map(|l| l.name.clone()).collect();
        let route_names: Vec<Arc<str>> = routes.iter().map(|r| r.name.clone()).collect();
        let plans: Vec<Arc<str>> = config
            .identity
            .as_ref()
            .and_then(|i| i.plans.as_ref())
            .map(|p| p.names.clone())
            .unwrap_or_default();
        Pipeline {
            priorities: config.priorities.clone(),
            metrics: Arc::new(
                Metrics::carried(
                    &listeners,
                    &route_names,
                    limits,
                    previous.map(|p| &*p.metrics),
                    engine.clock(),
                )
                .with_plans(&plans, previous.map(|p| &*p.metrics)),
            ),
            alerts: Alerts::new(
                &config.alerts,
                &limit_names,
                previous.map(|p| &*p.alerts),
                engine.clock(),
            ),
            listeners: config
                .listeners
                .iter()
                .map(|l| ListenerView {
                    bind: l.bind,
                    tls: l.tls.is_some(),
                    proxy_protocol: l.proxy_protocol,
                })
                .collect(),
            limit_base: limit_base.into(),
            partitions: partitions.into(),
            routes,
            upstreams: config
                .upstreams
                .iter()
                .map(|u| {
                    // An unchanged upstream keeps its pool of connections.
                    let same = previous.and_then(|p| p.upstreams.iter().find(|o| o.same_config(u)));
                    same.inspect(|u| u.end_drains())
                        .cloned()
                        .unwrap_or_else(|| Arc::new(Upstream::new(u, engine.clock().clone())))
                })
                .collect(),
            max_header_bytes: config.server.max_header_bytes,
            max_headers: config.server.max_headers,
            body_read_timeout: config.server.body_read_timeout,
            discard_bounds: (
                config.server.lingering_timeout,
                // lingering_time 0 turns lingering off, not discarding.
                config
                    .server
                    .lingering_time
                    .max(config.server.lingering_timeout),
            ),
            access_log: config.log.access_log,
            tracer: config.traces.take().map(|c| {
                let same = previous
                    .and_then(|p| p.tracer.as_ref())
                    .filter(|t| *t.config() == c);
                same.cloned()
                    .unwrap_or_else(|| crate::traces::Tracer::new(c))
            }),
            client_ip: config.client_ip.clone(),
            bypass: std::mem::take(&mut config.bypass),
            zones: Zones::new(zones, previous.map(|p| &p.zones)),
            identity: Identify::new(config.identity.take(), engine.clock().clone()),
            engine: Arc::new(engine),
        }
    }

    /// The routes' names, in precedence order.
    pub fn route_names(&self) -> Vec<Arc<str>> {
        self.routes.iter().map(|r| r.name.clone()).collect()
    }

    /// The counters every request adds to (`/metrics`).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The store the limits are decided by (for the admin API's key reads
    /// and resets).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn client_ip_config(&self) -> &ClientIpConfig {
        &self.client_ip
    }

    /// The outer handler: never fails, renders a rejection or an error
    /// (logged once), and settles the request (access log, in-flight
    /// count, `max_conn` slots) when the response body ends.
    pub async fn handle(&self, req: Request<Incoming>, conn: &ConnInfo) -> Response<ProxyBody> {
        let (parts, body) = req.into_parts();
        let mut req = Request::from_parts(parts, ());
        let mut body = Some(body.into());
        let mut resp = self.handle_parts(&mut req, &mut body, conn).await;
        // hyper writes only the header map.
        response::fields_into_map(&mut resp);
        *resp
    }

    /// A request whose body (if any) is `body`: for tollgate's HTTP/1
    /// server, which writes the response's encoded fields itself
    /// (`body::HeadLines`); hyper's servers go through [`Pipeline::handle`].
    /// Both are the caller's, borrowed: the request's future holds no copy
    /// of them. The body is taken (forwarded or discarded).
    pub async fn handle_parts(
        &self,
        req: &mut Request<()>,
        body: &mut Option<ClientBody>,
        conn: &ConnInfo,
    ) -> Reply {
        let resolved = self.client_ip.resolve(&conn.client, req.headers());
        // (the span reads the record too)
        let record = (self.access_log || self.tracer.is_some()).then(|| {
            Box::new(AccessRecord {
                listener: conn.listener.clone(),
                client: resolved.client.ip,
                method: req.method().clone(),
                path: req.uri().path().to_owned(),
                tls: conn.tls,
                version: req.version(),
                route: None,
                plan: None,
                user: None,
                rate_limit: None,
                upstream: None,
                target: None,
            })
        });
        let h2 = req.version() == http::Version::HTTP_2;
        let mut cx = Ctx::new(resolved, self.end(record, conn, h2));
        traced::begin(self.tracer.as_ref(), &mut cx, req);
        let version = req.version();
        let expects_continue = body
            .as_ref()
            .is_some_and(|b| !http_body::Body::is_end_stream(b))
            && req.headers().contains_key(EXPECT);
        // The body travels apart: one nobody forwards is discarded below.
        // The request is borrowed by the stages (see `Upstream::send`).
        let served = self.serve(req, body, conn, &mut cx, None).await;
        let failed = matches!(served, Err(Stop::Failed(_)));
        let mut resp = match served {
            Ok(resp) => resp,
            Err(Stop::Limited(rejection)) => {
                self.metrics.limited();
                tracing::debug!(client = %cx.client.client.ip, limit = %rejection.limit, "request refused by a rate limit");
                let how = match rejection.cause {
                    ctx::Cause::Penalty(_) => "banned",
                    _ => "rejected",
                };
                cx.end
                    .set_rate_limit(|| format!("{how}:{}", rejection.limit));
                traced::refused(&mut cx, &rejection);
                let resp = response::rejected(&rejection, cx.route, &cx.applied);
                if response::grpc::is_grpc(req.headers()) {
                    let detail = rejection.detail();
                    let refusal = response::grpc::Refusal {
                        limit: &rejection.limit,
                        detail: &detail,
                        retry_after: rejection.retry_after,
                    };
                    let code = response::grpc::Code::ResourceExhausted;
                    cx.end.set_grpc_status(Some(code as u16));
                    Box::new(response::grpc::answer(resp, code, &detail, Some(refusal)))
                } else {
                    Box::new(resp)
                }
            }
            Err(Stop::Failed(err)) => {
                traced::failed(&mut cx, &err);
                if err.is_client_error() {
                    tracing::debug!(client = %cx.client.client.ip, error = %err, "request refused");
                } else {
                    tracing::warn!(client = %cx.client.client.ip, error = %err, "request failed");
                }
                let resp = response::problem(&err);
                // Over HTTP/1.x a gRPC request gets a plain problem: the
                // refusal is of gRPC itself.
                let http2 = !matches!(err, ProxyError::GrpcNeedsHttp2);
                if http2 && response::grpc::is_grpc(req.headers()) {
                    let code = response::grpc::code(err.status());
                    cx.end.set_grpc_status(Some(code as u16));
                    let message = err.to_string();
                    // A shed call: UNAVAILABLE with when to retry.
                    let refusal = match &err {
                        ProxyError::Shed { retry_after, .. } => Some(response::grpc::Refusal {
                            limit: "",
                            detail: &message,
                            retry_after: *retry_after,
                        }),
                        _ => None,
                    };
                    Box::new(response::grpc::answer(resp, code, &message, refusal))
                } else {
                    Box::new(resp)
                }
            }
        };
        if body.is_none() && failed {
            // The body was on its way upstream when the request failed
            // (cut off at its size limit, say): the client may still be
            // sending it, so a close must linger for the answer to arrive.
            conn.state.linger_on_close();
        }
        if let Some(body) = body.take() {
            let bounds = self.discard_bounds;
            discard::settle(
                body,
                &mut resp,
                version,
                expects_continue,
                &conn.state,
                bounds,
            );
        }
        self.count(&cx);
        let route = cx.route;
        traced::decisions(&mut cx, &self.metrics, |o| self.limit_index(o, route));
        cx.end.set_status(resp.status());
        if !http_body::Body::is_end_stream(resp.body()) {
            cx.end.start_response();
        }
        resp.body_mut().set_end(cx.end);
        resp
    }

    /// What settles a request when its response ends: the access log line
    /// (`record`), the connection's in-flight count, the metrics.
    fn end(&self, record: Option<Box<AccessRecord>>, conn: &ConnInfo, h2: bool) -> RequestEnd {
        RequestEnd::new(
            self.engine.clock(),
            record,
            conn.state.clone(),
            self.metrics.clone(),
            self.metrics.listener_index(&conn.listener),
            (h2, self.access_log),
        )
    }

    /// The metrics index of a decision's limit (zones first, then each
    /// route's limits).
    fn limit_index(&self, origin: Origin, route: Option<&RouteConfig>) -> Option<usize> {
        match (origin, route) {
            (Origin::Zone(z), _) => Some(z),
            (Origin::Route(i), Some(r)) => Some(self.limit_base[r.index] + i),
            (Origin::Route(_), None) => None,
        }
    }

    /// The inner handler: the stages in request order. `logged`: a
    /// replay's answer in place of the upstream's.
    async fn serve<'p>(
        &'p self,
        req: &mut Request<()>,
        body: &mut Option<ClientBody>,
        conn: &ConnInfo,
        cx: &mut Ctx<'p>,
        logged: Option<StatusCode>,
    ) -> Result<Reply, Stop> {
        self.check_request(req)?;
        let found = self.find_route(req, cx);
        let (path, headers, ip) = (req.uri().path(), req.headers(), cx.client.client.ip);
        cx.bypass = bypass::check(&self.bypass, cx.route, path, headers, ip);
        if cx.bypass.is_some() {
            cx.end.set_rate_limit(|| "bypass".to_owned());
        }
        let (zones, client_ip) = (self.zones.configs(), &self.client_ip);
        penalty::check(&self.engine, zones, cx, headers, client_ip, false)?;
        // Decide the zones on their own when a later stage may refuse the
        // request or check a signature; else with the route limits.
        let early = self.identity.has_token(headers) || webhook::refuses(cx.route, ip);
        self.zones
            .count(&self.engine, cx, headers, client_ip, early)
            .await?;
        let verified = self.identity.identify(headers, cx.client.peer_trusted)?;
        self.identified(cx, verified);
        webhook::check_source(cx.route, ip)?;
        limits::decide(&self.engine, &self.zones, cx, headers, client_ip).await?;
        let route = route::required(found, req.method(), req.uri().path())?;
        let mut resp = self.answer(req, body, conn, cx, route, logged).await?;
        self.settle(cx, route, Some(settle::Head::of(&resp))).await;
        if !cx.deferred.is_empty() {
            let status = resp.status().as_u16();
            decide::charge_outcome(&self.engine, route, &cx.deferred, status).await;
        }
        response::limit_headers(&mut resp, cx.route, &cx.applied);
        Ok(resp)
    }

    /// What is refused before any stage: too many or too large headers, a
    /// coding tollgate cannot frame, gRPC over HTTP/1.x, a path or Host
    /// that cannot be made canonical (the path normalised in place).
    fn check_request(&self, req: &mut Request<()>) -> Result<(), ProxyError> {
        self.check_headers(req.headers())?;
        // gRPC is HTTP/2 only (its trailers, its streams): one sent over
        // HTTP/1.x is refused before it meets a limit or an upstream.
        if req.method() == http::Method::POST
            && req.version() < http::Version::HTTP_2
            && response::grpc::is_grpc(req.headers())
        {
            return Err(ProxyError::GrpcNeedsHttp2);
        }
        normalize::normalize_path(req)?;
        host::resolve(req)
    }

    /// The route of `req`, noted in `cx` when one matches.
    fn find_route<'p>(&'p self, req: &Request<()>, cx: &mut Ctx<'p>) -> RouteMatch<'p> {
        let host = host::for_routing(req.headers());
        let found = route::find(&self.routes, host, req.uri().path(), req.method());
        if let RouteMatch::Found(r) = found {
            cx.route = Some(r);
            cx.end.set_route(r);
        }
        found
    }

    /// Who the identity stage found, kept for the later stages, the access
    /// log and the metrics.
    fn identified(&self, cx: &mut Ctx<'_>, verified: identity::Verified) {
        cx.identity = verified.identity;
        // (kept only when a limit reads a cost from a claim)
        cx.claims = verified.claims.map(Box::new);
        cx.plan = verified.plan;
        cx.billing_day = verified.billing_day;
        if let identity::Identity::User(user) = &cx.identity {
            cx.end.set_user(user);
        }
        if let Some(plan) = cx.plan {
            self.metrics.plan_request(plan);
            cx.end.set_plan(|| self.metrics.plan_name(Some(plan)));
        }
    }

    /// The admitted request's answer: the route's own, the upstream's, or
    /// (a replay) the status the log holds. A forward that fails settles
    /// its reservations as failed.
    async fn answer<'p>(
        &'p self,
        req: &mut Request<()>,
        body: &mut Option<ClientBody>,
        conn: &ConnInfo,
        cx: &mut Ctx<'p>,
        route: &'p RouteConfig,
        logged: Option<StatusCode>,
    ) -> Result<Reply, Stop> {
        let i = match (&route.action, logged) {
            (RouteAction::Respond(r), _) => {
                return Ok(Box::new(response::respond(r, req.method())));
            }
            // A replay: what was forwarded is answered as it was.
            (RouteAction::Forward(_), Some(status)) => {
                let mut resp = Box::new(Response::new(ProxyBody::empty()));
                *resp.status_mut() = status;
                return Ok(resp);
            }
            (RouteAction::Forward(i), None) => *i,
        };
        let upstream = &self.upstreams[i];
        cx.end.set_upstream(&upstream.name);
        let (gate, p) = (upstream.gate.as_ref(), &self.priorities);
        protect::admit(gate, &upstream.name, p, cx, req.headers()).await?;
        let timeout = self.body_read_timeout;
        let forwarded = proxy::forward(cx, req, body, conn, upstream, route, timeout)
            .await
            .map_err(|e| protect::named(e, p, cx));
        if forwarded.is_err() {
            self.settle(cx, route, None).await;
        }
        Ok(forwarded?)
    }

    fn check_headers(&self, headers: &HeaderMap) -> Result<(), ProxyError> {
        if headers.len() > self.max_headers {
            return Err(ProxyError::TooManyHeaders {
                count: headers.len(),
                limit: self.max_headers,
            });
        }
        // One walk: the size, and (on connections hyper serves; tollgate's
        // own HTTP/1 server refused it already) a transfer coding tollgate
        // cannot frame.
        let mut coding = None;
        let mut size = 0;
        for (k, v) in headers {
            size += k.as_str().len() + v.len() + 4;
            if k == TRANSFER_ENCODING {
                coding = Some(crate::http1::add_coding(coding, v.as_bytes()));
            }
        }
        if coding == Some(crate::http1::Coding::Other) {
            return Err(ProxyError::UnsupportedCoding);
        }
        if size > self.max_header_bytes {
            return Err(ProxyError::HeadersTooLarge {
                size,
                limit: self.max_header_bytes,
            });
        }
        Ok(())
    }
}
