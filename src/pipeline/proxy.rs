//! The upstream stage for a `forward` route: turns the admitted request
//! into the upstream's (body size limit, upgrade, forwarding headers, Host,
//! origin-form target, a webhook body read whole and its signature
//! checked), sends it through the upstream's pool, and relays the answer
//! (or hands an upgraded connection over to a tunnel).

use std::time::Duration;

use http::header::{HeaderValue, CONTENT_LENGTH, HOST};
use http::uri::{PathAndQuery, Uri};
use http::{Request, Response, Version};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;

use super::body::{ClientBody, ProxyBody, Reply, RequestBody};
use super::client_ip;
use super::conn::ConnInfo;
use super::ctx::Ctx;
use super::forward::{self, Forwarded};
use super::response;
use super::upstream::h1::Conn;
use super::upstream::{Answer, Call, Upstream};
use super::webhook;
use crate::config::{HostHeader, RouteConfig};
use crate::error::ProxyError;

/// Forwards `req` to `upstream` and returns the response to relay, boxed
/// (see [`Reply`]).
/// `body` is taken once the request is accepted for forwarding; a request
/// refused before (a 413 by its length) leaves it to be discarded. `req`
/// is rewritten in place for the upstream (borrowed, as in
/// `Upstream::send`).
pub async fn forward(
    cx: &mut Ctx<'_>,
    req: &mut Request<()>,
    body: &mut Option<ClientBody>,
    conn: &ConnInfo,
    upstream: &Upstream,
    route: &RouteConfig,
    body_read_timeout: Duration,
) -> Result<Reply, ProxyError> {
    let max_body = route.max_body_bytes;
    let verify = route.webhook.as_ref().and_then(|w| w.verify.as_ref());
    // The length goes upstream as tollgate writes it (canonical digits,
    // from the body it forwards), never as the client spelt it: the field
    // is taken out here, in the one lookup that also reads it for the
    // limit. The server that read the head has checked that every value
    // agrees, so the first one says the length.
    if let Some(first) = req.headers_mut().remove(CONTENT_LENGTH) {
        if crate::http1::add_content_length(None, first.as_bytes()).is_ok_and(|n| n > max_body) {
            return Err(ProxyError::BodyTooLarge { limit: max_body });
        }
    }
    // Only a protocol the route allows is tunnelled (never h2c); any other
    // `Upgrade` is dropped with the hop-by-hop fields and the request is
    // served as plain HTTP/1.1.
    let upgrade = match req.version() {
        Version::HTTP_11 => forward::requested_upgrade(req.headers())
            .filter(|protocol| route.allows_upgrade(protocol.as_bytes())),
        _ => None,
    };
    let client_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut *req));
    // A cost settled from a trailer asks the upstream for trailers, on
    // either protocol.
    let settles_by_trailer = cx
        .reserved
        .iter()
        .any(|r| matches!(r.settle.from, crate::config::SettleFrom::Trailer(_)));
    // gRPC deadlines travel only to an HTTP/2 upstream, and trailers the
    // client asked for to either (an HTTP/1.1 client is never sent any: a
    // request from one to an HTTP/1.1 upstream looks up neither field).
    let call = if upstream.may_speak_h2() {
        let grpc = response::grpc::is_grpc(req.headers());
        Call {
            grpc,
            trailers: grpc || settles_by_trailer || asks_for_trailers(req.headers()),
            timeout: grpc
                .then(|| response::grpc::timeout(req.headers()))
                .flatten(),
            class: cx.class,
        }
    } else {
        Call {
            trailers: settles_by_trailer
                || (req.version() == Version::HTTP_2 && asks_for_trailers(req.headers())),
            class: cx.class,
            ..Call::default()
        }
    };
    // A gRPC call's deadline runs from here, through the response body.
    let deadline = call.timeout.map(|t| tokio::time::Instant::now() + t);

    // A keyed balancer (`hash`, `ip_hash`) reads the request as the
    // client sent it, before the forwarding fields are written.
    let key = upstream.balance_key(cx.client.client.ip, |part, out| {
        let user = match &cx.identity {
            super::identity::Identity::User(u) => Some(u.as_str()),
            super::identity::Identity::Anonymous => None,
        };
        super::upstream::hash_key::render(part, req, cx.client.client.ip, user, out)
    });
    let body = body.take();
    let client_host = req.headers().get(HOST).cloned();
    let client_sent_host = client_host.is_some();
    let host = client_host.or_else(|| {
        req.uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    let proto = if conn.tls { "https" } else { "http" };
    let client = &cx.client;
    let chain = client_ip::forwarded_for(req.headers(), &conn.client, client.peer_trusted);
    let mut added = forward::Added::new();
    forward::request_headers(
        req.headers_mut(),
        upgrade,
        Forwarded {
            client: &client.client.header,
            chain,
            trusted: client.peer_trusted,
            proto,
            host: host.clone(),
        },
        &mut added,
    );
    // Without a Host here, `send` writes the host:port of the target it
    // actually uses (`host_header: target`, or a request with no host).
    // Whether the request now carries the Host the upstream gets.
    let host_set = match (&upstream.host_header, host) {
        // The client's own Host stays where it is.
        (HostHeader::Preserve, Some(_)) if client_sent_host => true,
        (HostHeader::Preserve, Some(h)) => {
            req.headers_mut().insert(HOST, h);
            true
        }
        (HostHeader::Fixed(v), _) => {
            req.headers_mut().insert(HOST, v.clone());
            true
        }
        (HostHeader::Target | HostHeader::Preserve, _) => {
            req.headers_mut().remove(HOST);
            false
        }
    };
    if req.uri().authority().is_some() {
        // HTTP/2 and absolute-form requests; HTTP/1.1 ones already are
        // origin-form.
        *req.uri_mut() = origin_form(req.uri());
    }
    *req.version_mut() = Version::HTTP_11;
    let body = match verify {
        None => match body {
            Some(body) => RequestBody::new(body, max_body, body_read_timeout),
            None => RequestBody::empty(),
        },
        Some(v) => {
            // Signed bodies are read whole (within the size limit) and
            // checked before a byte goes upstream.
            let Some(body) = body else {
                return Err(ProxyError::BadRequest("no body"));
            };
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
            let now = cx.end.clock().unix_ms() / 1000;
            webhook::verify(v, req.headers(), &data, now)?;
            RequestBody::buffered(data)
        }
    };

    if let Some(t) = cx.end.trace.as_ref() {
        // tollgate's span is the upstream's parent; a client's malformed
        // or untrusted trace fields never reach it.
        let headers = req.headers_mut();
        headers.insert("traceparent", t.traceparent());
        match t.tracestate() {
            Some(state) => headers.insert("tracestate", state.clone()),
            None => headers.remove("tracestate"),
        };
    }
    let mut chosen = super::upstream::Chosen {
        target: None,
        attempts: cx.end.trace.is_some().then(smallvec::SmallVec::new),
    };
    let sent = upstream
        .send(
            req,
            body,
            host_set,
            (&added, call),
            &mut chosen,
            conn.state.is_h2().then_some(&conn.state),
            key,
        )
        .await;
    if let (Some(t), Some(attempts)) = (cx.end.trace.as_mut(), chosen.attempts) {
        t.attempts = attempts;
    }
    cx.end.set_target(chosen.target);
    let (answer, in_flight) = sent?;
    // The target counts the request in flight until its answer has ended.
    cx.end.in_flight = Some(in_flight);
    // The upstream's fields come stripped of hop-by-hop ones already.
    let (response, lines) = match answer {
        Answer::Response(response, lines) => (response, lines),
        Answer::Upgrade(response, conn) => {
            return tunnel(response, conn, client_upgrade, upstream);
        }
        Answer::H2(mut response, stream) => {
            forward::strip_hop_by_hop(response.headers_mut());
            if call.grpc {
                cx.end
                    .set_grpc_status(response::grpc::status_of(response.headers()));
            }
            let (parts, body) = response.into_parts();
            let body = ProxyBody::stream(body, stream, upstream.timeout, call.grpc, deadline);
            return Ok(Box::new(Response::from_parts(parts, body)));
        }
    };
    let (parts, body) = response.into_parts();
    let mut body = ProxyBody::upstream(body, upstream.timeout);
    *body.lines_mut() = lines;
    Ok(Box::new(Response::from_parts(parts, body)))
}

/// The upstream switched protocols: the client's connection and the
/// upstream's are joined once the client side has switched too.
fn tunnel(
    mut response: Response<()>,
    conn: Conn,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    upstream: &Upstream,
) -> Result<Reply, ProxyError> {
    let Some(client_upgrade) = client_upgrade else {
        return Err(ProxyError::UpstreamFailed {
            upstream: upstream.name.to_string(),
            reason: "answered 101 to a request that asked for no upgrade".into(),
        });
    };
    // The request ends when the tunnel closes: one access-log line and one
    // request in the metrics, with the tunnel's duration and bytes.
    let (end_to, end) = tokio::sync::oneshot::channel::<super::record::RequestEnd>();
    tokio::spawn(async move {
        let Conn {
            io: mut up,
            read: early,
            ..
        } = conn;
        let mut end = end.await.ok();
        match client_upgrade.await {
            Ok(down) => {
                let mut down = TokioIo::new(down);
                // What the upstream sent right after its 101 goes first.
                let mut sent = early.len() as u64;
                let copied = match down.write_all(&early).await {
                    Ok(()) => tokio::io::copy_bidirectional(&mut down, &mut up).await,
                    Err(e) => Err(e),
                };
                match copied {
                    Ok((_, to_client)) => sent += to_client,
                    Err(e) => {
                        tracing::debug!(error = %e, "upgraded tunnel closed with an error");
                        if let Some(end) = end.as_mut() {
                            end.mark_aborted();
                        }
                    }
                }
                if let Some(end) = end.as_mut() {
                    end.add_bytes(sent);
                }
            }
            Err(e) => tracing::debug!(error = %e, "upgrade did not complete"),
        }
        drop(end);
    });
    forward::switching_headers(response.headers_mut());
    let (parts, ()) = response.into_parts();
    Ok(Box::new(Response::from_parts(
        parts,
        ProxyBody::tunnel(end_to),
    )))
}

/// Whether `TE` lists `trailers`.
fn asks_for_trailers(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
}

/// `/path?query` for the upstream request line.
fn origin_form(uri: &Uri) -> Uri {
    let pq = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    Uri::from(pq)
}
