//! Criterion benches for the per-request hot path: route matching, header
//! hygiene, and whole requests through an in-process tollgate (a `respond`
//! route, and a proxied route to an in-process upstream) over loopback.
//!
//! Run: `cargo bench --bench pipeline`. The whole-proxy comparison against
//! nginx lives in `benches/load.sh`.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, HeaderValue, Method, Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tollgate::pipeline::find_route;
use tollgate::pipeline::{request_headers, Added, Forwarded};
use tollgate::Config;

fn routes_config(upstream: Option<SocketAddr>) -> Config {
    let mut yaml = String::from("listeners: [{ bind: '127.0.0.1:0' }]\nadmin: { enabled: false }\nlog: { access_log: false }\n");
    if let Some(up) = upstream {
        yaml.push_str(&format!("upstreams: {{ api: {{ targets: ['{up}'] }} }}\n"));
    }
    yaml.push_str("routes:\n");
    for i in 0..40 {
        yaml.push_str(&format!(
            "  - {{ match: {{ path_prefix: /svc{i}/ }}, respond: {{ body: s{i} }} }}\n"
        ));
    }
    yaml.push_str("  - { match: { path: /login, methods: [POST] }, respond: { body: login } }\n");
    yaml.push_str(
        "  - { match: { host: api.example.com, path_prefix: /v1/ }, respond: { body: v1 } }\n",
    );
    yaml.push_str("  - { match: { path: /hello }, respond: { body: hello } }\n");
    if upstream.is_some() {
        yaml.push_str("  - { match: { path_prefix: /proxy/ }, upstream: api }\n");
    }
    Config::from_yaml(&yaml, &|_| None).expect("bench config")
}

fn bench_route(c: &mut Criterion) {
    let config = routes_config(None);
    let routes = &config.routes;
    c.bench_function("route/find 43 routes, prefix hit", |b| {
        b.iter(|| {
            find_route(
                routes,
                Some("www.example.com"),
                "/svc37/items/42",
                &Method::GET,
            )
        })
    });
    c.bench_function("route/find 43 routes, miss", |b| {
        b.iter(|| {
            find_route(
                routes,
                Some("www.example.com"),
                "/nothing/here",
                &Method::GET,
            )
        })
    });
}

fn bench_headers(c: &mut Criterion) {
    let mut base = HeaderMap::new();
    for (k, v) in [
        ("host", "api.example.com"),
        ("user-agent", "curl/8.5.0"),
        ("accept", "*/*"),
        ("authorization", "Bearer abc.def.ghi"),
        ("connection", "keep-alive"),
        ("x-forwarded-for", "6.6.6.6"),
        ("content-type", "application/json"),
    ] {
        base.insert(k, HeaderValue::from_static(v));
    }
    let client = HeaderValue::from_static("203.0.113.7");
    c.bench_function("forward/request_headers (7 headers)", |b| {
        b.iter_batched(
            || base.clone(),
            |mut h| {
                let mut added = Added::new();
                request_headers(
                    &mut h,
                    None,
                    Forwarded {
                        client: &client,
                        chain: client.clone(),
                        trusted: false,
                        proto: "https",
                        host: Some(HeaderValue::from_static("api.example.com")),
                    },
                    &mut added,
                );
                (h, added)
            },
            criterion::BatchSize::SmallInput,
        )
    });
}

fn bench_requests(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (proxy_addr, _stop) = rt.block_on(async {
        let up = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up_addr = up.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = up.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    let svc = service_fn(|_req| async {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                            b"upstream ok",
                        ))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        let server = tollgate::Server::bind(routes_config(Some(up_addr)))
            .await
            .unwrap();
        let addr = server.addrs()[0].1;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(server.run(async move {
            let _ = rx.await;
        }));
        (addr, tx)
    });
    let mut sender = rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(proxy_addr).await.unwrap();
        let (s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        s
    });
    let mut one = |path: &'static str| {
        let req = Request::builder()
            .uri(path)
            .header("host", "bench")
            .body(Empty::<Bytes>::new())
            .unwrap();
        rt.block_on(async {
            sender.ready().await.unwrap();
            let resp = sender.send_request(req).await.unwrap();
            resp.into_body().collect().await.unwrap().to_bytes()
        })
    };
    c.bench_function("request/respond route, keep-alive h1", |b| {
        b.iter(|| one("/hello"))
    });
    c.bench_function("request/proxied to upstream, keep-alive h1", |b| {
        b.iter(|| one("/proxy/x"))
    });
}

criterion_group!(benches, bench_route, bench_headers, bench_requests);
criterion_main!(benches);
