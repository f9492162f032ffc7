//! Limits that follow the customer (issue 56): plans from a verified JWT
//! claim, API-key metadata and a trusted header; per-key overrides set
//! through one replica's admin API and enforced by another; costs read
//! from the request; costs reserved at admission and settled from an
//! upstream's header, trailer or last server-sent event. Each runs on the
//! memory store and on a real Redis shared by two replicas.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use jsonwebtoken::{encode, EncodingKey, Header};
use tokio::net::TcpListener;

use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::*;

const SECRET: &str = "plans-test-secret-0123456789abcdef";
const TOKEN: &str = "plans-admin-token-0123456789";
/// The metadata file's one key: "pro-key-0001", as its SHA-256.
const PRO_KEY: &str = "pro-key-0001";

fn jwt(sub: &str, plan: Option<&str>, cost: Option<u64>) -> String {
    let mut claims = serde_json::json!({ "sub": sub, "exp": 4_000_000_000u64 });
    if let Some(p) = plan {
        claims["plan"] = p.into();
    }
    if let Some(c) = cost {
        claims["cost"] = c.into();
    }
    encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

/// The stores each test runs on: the memory store, and a Redis that two
/// replicas share (the server is kept alive by the caller).
enum Store {
    Memory,
    Redis(RedisServer),
    Cluster(RedisCluster),
}

impl Store {
    fn yaml(&self) -> String {
        match self {
            Store::Memory => String::new(),
            Store::Redis(r) => r.store_yaml(""),
            Store::Cluster(c) => format!(
                "store: {{ kind: redis_cluster, nodes: {}, timeout: 2s }}",
                c.seeds()
            ),
        }
    }
}

fn stores() -> Vec<Store> {
    vec![Store::Memory, Store::Redis(RedisServer::start())]
}

/// Plans from every source, and a route limit with numbers per plan.
fn plans_config(store: &Store, dir: &tempfile::TempDir, routes: &str) -> String {
    let meta = dir.path().join("keys.yaml");
    std::fs::write(
        &meta,
        format!(
            "# key digests only\n{}: {{ plan: pro }}\n",
            sha256_hex(PRO_KEY)
        ),
    )
    .unwrap();
    format!(
        "listeners: [{{ name: plain, bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0', token: '{TOKEN}' }}
log: {{ access_log: false }}
{store}
client_ip: {{ trusted_proxies: ['127.0.0.2/32'] }}
identity:
  jwt: {{ algorithms: [HS256], secret: '{SECRET}' }}
  api_key: {{ header: x-api-key, metadata: '{meta}' }}
  plans: {{ names: [free, pro], claim: plan, header: x-plan, default: free }}
{routes}",
        store = store.yaml(),
        meta = meta.display(),
    )
}

const PLAN_ROUTES: &str = "routes:
  - match: { path_prefix: / }
    respond: { body: ok }
    limits:
      - name: api
        algorithm: fixed_window
        limit: 2
        window: 1h
        plans: { pro: { limit: 5 } }
";

/// Requests admitted in a row for one caller (at most 20).
async fn admitted(addr: SocketAddr, from: &str, headers: &[(&str, &str)]) -> (usize, String) {
    admitted_on(&[addr], from, headers).await
}

/// [`admitted`], the requests taking turns between replicas.
async fn admitted_on(
    addrs: &[SocketAddr],
    from: &str,
    headers: &[(&str, &str)],
) -> (usize, String) {
    let mut policy = String::new();
    for n in 0..20 {
        let got = get_from(from, addrs[n % addrs.len()], "/", headers).await;
        match got.status {
            StatusCode::OK => {
                policy = got.headers["ratelimit-policy"].to_str().unwrap().to_owned();
            }
            StatusCode::TOO_MANY_REQUESTS => return (n, policy),
            other => panic!("unexpected {other}: {:?}", got.body),
        }
    }
    (20, policy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_come_from_a_claim_a_key_file_or_a_trusted_header() {
    for store in stores() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = plans_config(&store, &dir, PLAN_ROUTES);
        let proxy = TestProxy::spawn(&yaml).await;
        // On Redis two replicas share the limits: requests take turns.
        let second = match store {
            Store::Memory => None,
            _ => Some(TestProxy::spawn(&yaml).await),
        };
        let addr: Vec<SocketAddr> = std::iter::once(proxy.addr())
            .chain(second.as_ref().map(TestProxy::addr))
            .collect();
        let addr = &addr[..];
        let bearer = |t: String| format!("Bearer {t}");
        // A verified claim.
        let pro = bearer(jwt("alice", Some("pro"), None));
        assert_eq!(
            admitted_on(addr, "127.0.0.1", &[("authorization", &pro)]).await,
            (5, "\"api\";q=5;w=3600".to_owned())
        );
        // An unknown plan, or none: the default (free), never unlimited.
        for (sub, plan) in [("bob", Some("platinum")), ("carol", None)] {
            let t = bearer(jwt(sub, plan, None));
            assert_eq!(
                admitted_on(addr, "127.0.0.1", &[("authorization", &t)])
                    .await
                    .0,
                2,
                "{plan:?}"
            );
        }
        // An API key the metadata file names, and one it does not.
        assert_eq!(
            admitted_on(addr, "127.0.0.1", &[("x-api-key", PRO_KEY)])
                .await
                .0,
            5
        );
        assert_eq!(
            admitted_on(addr, "127.0.0.1", &[("x-api-key", "other-key")])
                .await
                .0,
            2
        );
        // The plan header from a trusted proxy (the client behind it is
        // 198.51.100.7) is believed; from anyone else it is ignored.
        let behind = [("x-plan", "pro"), ("x-forwarded-for", "198.51.100.7")];
        assert_eq!(admitted_on(addr, "127.0.0.2", &behind).await.0, 5);
        assert_eq!(
            admitted_on(addr, "127.0.0.3", &[("x-plan", "pro")]).await.0,
            2
        );
        // The admin API shows the plans, and the metrics count by plan.
        let limits = admin_call(&proxy, "GET", "/api/limits", None).await.json();
        let api = &limits["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["limit"] == "api")
            .unwrap()
            .clone();
        assert_eq!(api["plans"][0]["plan"], "pro");
        assert_eq!(api["plans"][0]["quota"], 5);
        let metrics = String::from_utf8(
            admin_call(&proxy, "GET", "/metrics", None)
                .await
                .body
                .to_vec(),
        )
        .unwrap();
        assert!(
            metrics.contains("tollgate_plan_requests_total{plan=\"pro\"}"),
            "{metrics}"
        );
        let overview = admin_call(&proxy, "GET", "/api/overview", None)
            .await
            .json();
        assert_eq!(overview["plans"][1]["plan"], "pro");
        // 18 requests on pro, half of them on this replica with Redis.
        let want = if second.is_some() { 9 } else { 18 };
        assert!(overview["plans"][1]["requests"].as_u64().unwrap() >= want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_keeps_the_share_used_and_an_upgrade_keeps_the_debt() {
    for store in stores() {
        let dir = tempfile::tempdir().unwrap();
        let proxy = TestProxy::spawn(&plans_config(&store, &dir, PLAN_ROUTES)).await;
        let addr = proxy.addr();
        let as_plan = |plan: &str| format!("Bearer {}", jwt("dana", Some(plan), None));
        // 4 of pro's 5 used ...
        for _ in 0..4 {
            let got = get_from(
                "127.0.0.1",
                addr,
                "/",
                &[("authorization", &as_plan("pro"))],
            )
            .await;
            assert_eq!(got.status, StatusCode::OK);
        }
        // ... is 2 of free's 2 (rounded against the client): refused, no
        // fresh burst from changing plan.
        let got = get_from(
            "127.0.0.1",
            addr,
            "/",
            &[("authorization", &as_plan("free"))],
        )
        .await;
        assert_eq!(
            got.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{:?}",
            got.headers
        );
        assert!(got.json()["detail"]
            .as_str()
            .unwrap()
            .contains("2 requests per 1h"));
        // Back on pro: still 4 of 5 used (the refusal charged nothing).
        assert_eq!(
            admitted(addr, "127.0.0.1", &[("authorization", &as_plan("pro"))])
                .await
                .0,
            0
        );
    }
}

/// How many overrides `GET /api/overrides` lists.
async fn listed(proxy: &TestProxy) -> usize {
    admin_call(proxy, "GET", "/api/overrides", None)
        .await
        .json()["overrides"]
        .as_array()
        .unwrap()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_set_on_one_replica_holds_on_the_other_at_the_next_request() {
    let redis = RedisServer::start();
    let store = Store::Redis(redis);
    let dir = tempfile::tempdir().unwrap();
    let yaml = plans_config(&store, &dir, PLAN_ROUTES);
    let a = TestProxy::spawn(&yaml).await;
    let b = TestProxy::spawn(&yaml).await;
    let erin = format!("Bearer {}", jwt("erin", None, None));
    let auth = [("authorization", erin.as_str())];
    // B has decided for erin already (it holds the overrides it read).
    assert_eq!(
        get_from("127.0.0.1", b.addr(), "/", &auth).await.status,
        StatusCode::OK
    );
    let set = admin_call(
        &a,
        "PUT",
        "/api/overrides/api/user:jwt:erin",
        Some(r#"{"limit": 7, "ttl": "1h"}"#),
    )
    .await;
    assert_eq!(set.status, StatusCode::OK, "{:?}", set.body);
    assert_eq!(set.json()["policies"][0]["quota"], 7);
    // The very next request on B is decided under 7.
    // (1 of 2 used is 4 of 7, rounded against the client: 3 more)
    assert_eq!(
        admitted(b.addr(), "127.0.0.1", &auth).await,
        (3, "\"api\";q=7;w=3600".to_owned())
    );
    let overrides = admin_call(&b, "GET", "/api/overrides", None).await.json();
    assert_eq!(overrides["overrides"][0]["key"], "user:jwt:erin");
    assert_eq!(overrides["overrides"][0]["numbers"]["limit"], 7);
    // Deleted through B: A decides under the default at once (7 of 7 used
    // is 2 of 2: still refused).
    let del = admin_call(&b, "DELETE", "/api/overrides/api/user:jwt:erin", None).await;
    assert_eq!(del.status, StatusCode::OK);
    let got = get_from("127.0.0.1", a.addr(), "/", &auth).await;
    assert_eq!(got.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(got.json()["detail"]
        .as_str()
        .unwrap()
        .contains("2 requests per 1h"));
    assert_eq!(
        admin_call(&b, "DELETE", "/api/overrides/api/user:jwt:erin", None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    // Bad input: a clear 4xx with a problem body, nothing stored.
    for (path, body, status) in [
        (
            "/api/overrides/nope/user:1",
            r#"{"limit": 3}"#,
            StatusCode::NOT_FOUND,
        ),
        (
            "/api/overrides/api/user:1",
            r#"{"rate": "5/s"}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            "/api/overrides/api/user:1",
            r#"{"limit": 0}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            "/api/overrides/api/user:1",
            "not json",
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let got = admin_call(&a, "PUT", path, Some(body)).await;
        assert_eq!(got.status, status, "{path} {body}");
        assert!(got.json()["detail"].is_string());
    }
    assert_eq!(listed(&a).await, 0);
    // An expired override is dropped from Redis at the next change.
    let short = admin_call(
        &a,
        "PUT",
        "/api/overrides/api/user:jwt:short",
        Some(r#"{"limit": 3, "ttl": "1s"}"#),
    )
    .await;
    assert_eq!(short.status, StatusCode::OK);
    assert_eq!(listed(&b).await, 1);
    until(Duration::from_secs(5), "the override to expire", || async {
        listed(&b).await == 0
    })
    .await;
    admin_call(
        &a,
        "PUT",
        "/api/overrides/api/user:jwt:kept",
        Some(r#"{"limit": 3}"#),
    )
    .await;
    let Store::Redis(redis) = &store else {
        unreachable!()
    };
    assert_eq!(redis.cli(&["HLEN", "tollgate:{overrides}"]), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_clears_cached_rejections_on_every_replica() {
    // With store.cache_rejections, a replica refuses a key Redis refused
    // until its retry time (here the end of an hour's window) without
    // asking Redis.
    let store = Store::Redis(RedisServer::start());
    let dir = tempfile::tempdir().unwrap();
    let routes = "routes:
  - match: { path_prefix: / }
    respond: { body: ok }
    limits:
      - { name: api, algorithm: fixed_window, limit: 10, window: 1h, cost: { claim: cost, max: 10 } }
";
    let yaml = plans_config(&store, &dir, routes)
        .replace("timeout: 2s }", "timeout: 2s, cache_rejections: true }");
    assert!(yaml.contains("cache_rejections: true"));
    let a = TestProxy::spawn(&yaml).await;
    let b = TestProxy::spawn(&yaml).await;
    // Calls of 6 units: the first fits 10, the second is refused (and
    // cached on B).
    let t = format!("Bearer {}", jwt("ivy", None, Some(6)));
    let auth = [("authorization", t.as_str())];
    assert_eq!(admitted(b.addr(), "127.0.0.1", &auth).await.0, 1);
    // 100: 6 of 10 used is 60 of 100, so a call of 6 fits again. B forgets
    // its cached refusal (told through Redis) and asks Redis.
    let set = admin_call(
        &a,
        "PUT",
        "/api/overrides/api/user:jwt:ivy",
        Some(r#"{"limit": 100}"#),
    )
    .await;
    assert_eq!(set.status, StatusCode::OK);
    until(
        Duration::from_secs(5),
        "B to admit ivy under the override",
        || async { get_from("127.0.0.1", b.addr(), "/", &auth).await.status == StatusCode::OK },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_on_the_memory_store_expires_and_survives_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, plans_config(&Store::Memory, &dir, PLAN_ROUTES)).unwrap();
    let proxy = TestProxy::spawn_file(&path).await;
    let t = format!("Bearer {}", jwt("fay", None, None));
    let auth = [("authorization", t.as_str())];
    let set = admin_call(
        &proxy,
        "PUT",
        "/api/overrides/api/user:jwt:fay",
        Some(r#"{"limit": 4}"#),
    )
    .await;
    assert_eq!(set.status, StatusCode::OK);
    proxy.reload.reload().await.expect("reload");
    assert_eq!(admitted(proxy.addr(), "127.0.0.1", &auth).await.0, 4);
    // A short one on another key runs out.
    let g = format!("Bearer {}", jwt("gus", None, None));
    let set = admin_call(
        &proxy,
        "PUT",
        "/api/overrides/api/user:jwt:gus",
        Some(r#"{"limit": 9, "ttl": "1s"}"#),
    )
    .await;
    assert_eq!(set.status, StatusCode::OK);
    until(Duration::from_secs(5), "the override to expire", || async {
        listed(&proxy).await == 1
    })
    .await;
    assert_eq!(
        admitted(proxy.addr(), "127.0.0.1", &[("authorization", &g)])
            .await
            .0,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_comes_from_a_trusted_header_or_a_claim_and_is_capped() {
    for store in stores() {
        let dir = tempfile::tempdir().unwrap();
        let routes = "routes:
  - match: { path_prefix: / }
    respond: { body: ok }
    limits:
      - { name: weighted, algorithm: fixed_window, key: ip, limit: 100, window: 1h, cost: { header: x-weight, claim: cost, default: 1, max: 40 } }
";
        let proxy = TestProxy::spawn(&plans_config(&store, &dir, routes)).await;
        let remaining = |got: &Got| {
            got.headers["x-ratelimit-remaining"]
                .to_str()
                .unwrap()
                .to_owned()
        };
        let addr = proxy.addr();
        let behind = |ip: &'static str, w: &'static str| [("x-forwarded-for", ip), ("x-weight", w)];
        // From the trusted proxy: its weight; past the maximum: the maximum.
        assert_eq!(
            remaining(&get_from("127.0.0.2", addr, "/", &behind("198.51.100.1", "25")).await),
            "75"
        );
        assert_eq!(
            remaining(&get_from("127.0.0.2", addr, "/", &behind("198.51.100.1", "999")).await),
            "35"
        );
        // Not a number: the default.
        assert_eq!(
            remaining(&get_from("127.0.0.2", addr, "/", &behind("198.51.100.1", "lots")).await),
            "34"
        );
        // From anyone else the header is ignored.
        assert_eq!(
            remaining(&get_from("127.0.0.4", addr, "/", &[("x-weight", "30")]).await),
            "99"
        );
        // A verified claim.
        let t = format!("Bearer {}", jwt("hal", None, Some(12)));
        assert_eq!(
            remaining(&get_from("127.0.0.5", addr, "/", &[("authorization", &t)]).await),
            "88"
        );
    }
}

// ------------------------------------------------------------ settlement

/// A fake LLM API: every answer reports the tokens the request asked for
/// (`?tokens=N`, after `?ms=` of thinking) in a header (`/header`), a
/// trailer (`/trailer`: HTTP/2's, or HTTP/1.1's after the last chunk), or
/// a last server-sent event (`/stream`). It speaks whichever protocol the
/// proxy opens with.
async fn llm() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let q = |k: &str| -> u64 {
                        req.uri()
                            .query()
                            .unwrap_or("")
                            .split('&')
                            .find_map(|kv| {
                                kv.strip_prefix(&format!("{k}="))
                                    .and_then(|v| v.parse().ok())
                            })
                            .unwrap_or(0)
                    };
                    let (tokens, ms) = (q("tokens"), q("ms"));
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    // `?silent=1`: usage is not reported at all.
                    let mut headers = http::HeaderMap::new();
                    if q("silent") == 0 {
                        headers.insert("x-tokens-used", tokens.to_string().parse().unwrap());
                    }
                    let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = match req
                        .uri()
                        .path()
                    {
                        "/trailer" => vec![
                            Ok(Frame::data(Bytes::from("answer"))),
                            Ok(Frame::trailers(headers.clone())),
                        ],
                        "/stream" => vec![
                            Ok(Frame::data(Bytes::from(
                                "data: {\"choices\":[{\"text\":\"hi\"}]}\n\n",
                            ))),
                            Ok(Frame::data(Bytes::from(if q("silent") == 0 {
                                format!("data: {{\"choices\":[],\"usage\":{{\"total_tokens\":{tokens}}}}}\n")
                            } else {
                                "data: {}\n".to_owned()
                            }))),
                            Ok(Frame::data(Bytes::from("\ndata: [DONE]\n\n"))),
                        ],
                        _ => vec![Ok(Frame::data(Bytes::from("answer")))],
                    };
                    let mut resp =
                        Response::new(StreamBody::new(futures_util::stream::iter(frames)).boxed());
                    if matches!(req.uri().path(), "/header" | "/log") {
                        *resp.headers_mut() = headers;
                    } else if req.uri().path() == "/trailer" {
                        // (hyper's HTTP/1.1 server sends only the trailer
                        // fields its head declares, and only to a request
                        // that asked for them with `TE: trailers`)
                        resp.headers_mut()
                            .insert("trailer", "x-tokens-used".parse().unwrap());
                    }
                    Ok::<_, std::convert::Infallible>(resp)
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

/// Both protocols tollgate speaks to an upstream: every settlement test
/// runs on each.
const UPSTREAM_PROTOCOLS: [&str; 2] = ["http1", "h2"];

/// Four routes on the fake LLM, one per way it reports usage; each limit
/// is 1000 tokens an hour per key, 100 reserved per call. `protocol`: the
/// upstream's.
fn llm_config(store: &Store, upstream: SocketAddr, protocol: &str, extra_store: &str) -> String {
    let store = match store {
        Store::Redis(r) => r.store_yaml(extra_store),
        other => other.yaml(),
    };
    let route = |path: &str, settle: &str| {
        let name = &path[1..];
        // /log: the same, counted exactly (one entry per instant)
        let algorithm = if path == "/log" {
            "sliding_log"
        } else {
            "fixed_window"
        };
        format!(
            "  - name: {name}
    match: {{ path: {path} }}
    upstream: llm
    limits: [{{ name: tokens, algorithm: {algorithm}, key: 'header:x-tenant', limit: 1000, window: 1h, cost: 100, settle: {settle} }}]
"
        )
    };
    config(&format!(
        "{store}
upstreams:
  llm: {{ targets: ['{upstream}'], protocol: {protocol}, timeout: 10s }}
routes:
{}{}{}{}",
        route("/header", "{ header: x-tokens-used, on_failure: refund }"),
        route("/trailer", "{ trailer: x-tokens-used }"),
        route("/stream", "{ event: usage.total_tokens }"),
        route("/log", "{ header: x-tokens-used }"),
    ))
}

/// `X-RateLimit-Remaining` of a call (after its own 100 are reserved).
async fn call(addr: SocketAddr, path: &str, tenant: &str) -> (StatusCode, u64) {
    let mut c = h2(addr).await;
    let req = Request::get(format!("http://api.test{path}"))
        .header("x-tenant", tenant)
        .body(empty())
        .unwrap();
    let resp = c.send_request(req).await.unwrap();
    let status = resp.status();
    let remaining = resp
        .headers()
        .get("x-ratelimit-remaining")
        .map_or(0, |v| v.to_str().unwrap().parse().unwrap());
    // Read the whole body (and trailers): the call ends there.
    let body = resp.into_body().collect().await.unwrap();
    if path.starts_with("/trailer") && !path.contains("silent") && status == StatusCode::OK {
        // The trailer reaches the client too, from either protocol.
        let trailers = body.trailers().expect("the upstream's trailers relayed");
        assert!(trailers.contains_key("x-tokens-used"), "{trailers:?}");
    }
    (status, remaining)
}

/// Tokens `tenant` has used of its hour, as the store holds them (read
/// without charging).
async fn used(proxy: &TestProxy, path: &str, tenant: &str) -> Option<u64> {
    let views = proxy.pipeline.limit_views();
    let view = views
        .iter()
        .find(|v| v.route == &path[1..])
        .expect("route limit");
    let key = format!("header:x-tenant:{}", &sha256_hex(tenant)[..32]);
    match proxy.pipeline.engine().inspect(view.limit, &key).await {
        Ok(Some(d)) => Some(d.limit - d.remaining - 1),
        Ok(None) => Some(0),
        Err(_) => None,
    }
}

async fn settled_to(proxy: &TestProxy, path: &str, tenant: &str, want: u64) {
    let mut last = None;
    for _ in 0..100 {
        last = used(proxy, path, tenant).await;
        if last == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{tenant} used {last:?} of {path}, not {want}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_settles_from_a_header_a_trailer_or_the_last_event() {
    let upstream = llm().await;
    for (store, protocol) in UPSTREAM_PROTOCOLS
        .into_iter()
        .flat_map(|p| stores().into_iter().map(move |s| (s, p)))
    {
        let proxy = TestProxy::spawn(&llm_config(&store, upstream, protocol, "")).await;
        let addr = proxy.addr();
        for path in ["/header", "/trailer", "/stream", "/log"] {
            let tenant = format!("tenant{path}{protocol}");
            // 100 reserved (the headers speak in tokens), 30 used: 70 back.
            let first = call(addr, &format!("{path}?tokens=30"), &tenant).await;
            assert_eq!(first, (StatusCode::OK, 900), "{path} over {protocol}");
            settled_to(&proxy, path, &tenant, 30).await;
            // 250 used: 150 more than reserved.
            let second = call(addr, &format!("{path}?tokens=250"), &tenant).await;
            assert_eq!(second, (StatusCode::OK, 870), "{path} over {protocol}");
            settled_to(&proxy, path, &tenant, 280).await;
            // No usage reported: /header refunds all, the others keep the
            // reservation.
            call(addr, &format!("{path}?silent=1"), &tenant).await;
            let kept = if path == "/header" { 280 } else { 380 };
            settled_to(&proxy, path, &tenant, kept).await;
        }
        let metrics = proxy.pipeline.metrics().costs();
        let row = metrics
            .iter()
            .find(|((_, route, _), _)| &**route == "header")
            .expect("counted")
            .1;
        // reserved, settled, refunded, extra
        assert_eq!(*row, [300, 280, 170, 150], "over {protocol}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_expensive_calls_overshoot_only_by_their_settled_extra() {
    let upstream = llm().await;
    for (store, protocol) in UPSTREAM_PROTOCOLS
        .into_iter()
        .flat_map(|p| stores().into_iter().map(move |s| (s, p)))
    {
        let yaml = llm_config(&store, upstream, protocol, "");
        // Two replicas share Redis; the memory store is one process's.
        let a = TestProxy::spawn(&yaml).await;
        let b = match store {
            Store::Memory => None,
            _ => Some(TestProxy::spawn(&yaml).await),
        };
        let b = b.as_ref().unwrap_or(&a);
        // 30 calls at once, each really costing 150 of the 1000 and taking
        // 300 ms. Admit-then-charge would let all 30 in (4500 tokens);
        // reserving 100 admits 10, and the bound is 1000 + 10 x 50.
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..30 {
            let addr = if i % 2 == 0 { a.addr() } else { b.addr() };
            calls.spawn(async move { call(addr, "/header?tokens=150&ms=300", "burst").await.0 });
        }
        let mut ok = 0;
        while let Some(s) = calls.join_next().await {
            match s.unwrap() {
                StatusCode::OK => ok += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("{other}"),
            }
        }
        assert_eq!(ok, 10, "over {protocol}");
        // All settled: 1000 reserved, 1500 charged (the 500 extra is the
        // overshoot, all of it from calls already admitted).
        let settled = |p: &TestProxy| {
            p.pipeline
                .metrics()
                .costs()
                .values()
                .fold([0; 4], |mut t, r| {
                    (0..4).for_each(|i| t[i] += r[i]);
                    t
                })
        };
        until(Duration::from_secs(5), "every call to settle", || async {
            let (x, y) = (settled(&a), settled(b));
            let both = if std::ptr::eq(&a, b) {
                x
            } else {
                std::array::from_fn(|i| x[i] + y[i])
            };
            both == [1000, 1500, 0, 500]
        })
        .await;
        // Over: refused until the balance recovers (the next hour).
        assert_eq!(
            call(b.addr(), "/header?tokens=1", "burst").await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_failing_between_reserve_and_settle_keeps_the_reservation_once() {
    let upstream = llm().await;
    for protocol in UPSTREAM_PROTOCOLS {
        let redis = RedisServer::start();
        let store = Store::Redis(redis);
        let yaml = llm_config(&store, upstream, protocol, "")
            .replace("timeout: 2s }", "timeout: 300ms, on_error: fail_open }");
        let proxy = TestProxy::spawn(&yaml).await;
        let Store::Redis(redis) = &store else {
            unreachable!()
        };
        // Reserved with Redis up; Redis stops answering while the upstream
        // thinks; the settlement times out within the store timeout.
        let answer = tokio::spawn(call(proxy.addr(), "/header?tokens=250&ms=800", "outage"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        redis.pause(true);
        let got = tokio::time::timeout(Duration::from_secs(5), answer)
            .await
            .expect("answered in time")
            .unwrap();
        assert_eq!(got.0, StatusCode::OK, "over {protocol}");
        until(
            Duration::from_secs(5),
            "the failed settlement to be counted",
            || async { proxy.pipeline.engine().unsettled() == 1 },
        )
        .await;
        redis.pause(false);
        // Back. The settlement was not repeated: the one sent (queued in
        // the stopped server's socket) applied once, 250, never 400.
        until(Duration::from_secs(10), "Redis to answer again", || async {
            used(&proxy, "/header", "outage").await.is_some()
        })
        .await;
        assert_eq!(
            used(&proxy, "/header", "outage").await,
            Some(250),
            "over {protocol}"
        );
    }
}

#[test]
fn the_readme_plans_example_is_a_valid_config() {
    let config = readme_config("identity:\n  jwt:", SECRET);
    let limits: Vec<_> = config.routes.iter().flat_map(|r| &r.limits).collect();
    assert!(limits.iter().any(|l| l.settle.is_some()), "a settled cost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_raises_a_zone_for_one_address() {
    for store in stores() {
        let dir = tempfile::tempdir().unwrap();
        let routes = "zones: [{ name: per_ip, rate: 1r/m, burst: 1, nodelay: true }]
routes:
  - match: { path_prefix: / }
    respond: { body: ok }
";
        let proxy = TestProxy::spawn(&plans_config(&store, &dir, routes)).await;
        // A partner behind one address gets a bigger burst; everyone else
        // keeps the zone's 2.
        let set = admin_call(
            &proxy,
            "PUT",
            "/api/overrides/per_ip/127.0.0.7",
            Some(r#"{"burst": 5}"#),
        )
        .await;
        assert_eq!(set.status, StatusCode::OK, "{:?}", set.body);
        let count = |from: &'static str| {
            let addr = proxy.addr();
            async move {
                for n in 0..20 {
                    let got = get_from(from, addr, "/", &[]).await;
                    if got.status == StatusCode::TOO_MANY_REQUESTS {
                        return (n, got.json()["detail"].as_str().unwrap().to_owned());
                    }
                }
                (20, String::new())
            }
        };
        let (partner, detail) = count("127.0.0.7").await;
        assert_eq!(partner, 6);
        assert!(detail.contains("burst 5"), "{detail}");
        assert_eq!(count("127.0.0.8").await.0, 2);
        // The admin API reads the key under its override.
        let state = admin_call(&proxy, "GET", "/api/keys/per_ip/127.0.0.7", None)
            .await
            .json();
        assert_eq!(state["states"][0]["quota"], 6);
        assert_eq!(state["states"][0]["override"], true);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_an_override_reaches_the_other_replica_within_a_second() {
    let store = Store::Cluster(RedisCluster::start());
    let dir = tempfile::tempdir().unwrap();
    let yaml = plans_config(&store, &dir, PLAN_ROUTES);
    let a = TestProxy::spawn(&yaml).await;
    let b = TestProxy::spawn(&yaml).await;
    let t = format!("Bearer {}", jwt("jo", None, None));
    let auth = [("authorization", t.as_str())];
    let policy = |got: &Got| got.headers["ratelimit-policy"].to_str().unwrap().to_owned();
    assert_eq!(
        policy(&get_from("127.0.0.1", b.addr(), "/", &auth).await),
        "\"api\";q=2;w=3600"
    );
    let set = admin_call(
        &a,
        "PUT",
        "/api/overrides/api/user:jwt:jo",
        Some(r#"{"limit": 70}"#),
    )
    .await;
    assert_eq!(set.status, StatusCode::OK, "{:?}", set.body);
    // B re-reads the overrides once a second on a cluster.
    until(
        Duration::from_secs(3),
        "B to decide jo under the override",
        || async {
            policy(&get_from("127.0.0.1", b.addr(), "/", &auth).await) == "\"api\";q=70;w=3600"
        },
    )
    .await;
}

async fn admin_call(proxy: &TestProxy, method: &str, path: &str, body: Option<&str>) -> Got {
    admin_with(proxy, TOKEN, method, path, body).await
}
