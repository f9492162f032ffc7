//! The order of the request path as an attacker meets it: the zones count
//! every request before any credential or webhook rule is looked at, so a
//! flood of bad tokens or refused sources is limited like any other flood,
//! and a client over its zone costs no signature check. Also: the upstream
//! sees the Host of the target actually used, and a refused request is
//! logged with its route.

use crate::common::process::Running;
use crate::common::*;
use jsonwebtoken::{encode, EncodingKey, Header};

const SECRET: &str = "0123456789abcdef0123456789abcdef-test";

/// One route to a spawned upstream, with `rest` (zones, identity...) first.
async fn start(rest: &str) -> (Upstream, TestProxy) {
    start_routes(
        rest,
        "  - { name: api, match: { path_prefix: / }, upstream: api }\n",
    )
    .await
}

async fn start_routes(rest: &str, routes: &str) -> (Upstream, TestProxy) {
    let up = Upstream::spawn().await;
    let yaml = config(&format!(
        "{rest}\nupstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n{routes}",
        up.addr
    ));
    let proxy = TestProxy::spawn(&yaml).await;
    (up, proxy)
}

async fn send(proxy: &TestProxy, method: &str, path: &str, headers: &[(&str, &str)]) -> Got {
    send_with(proxy.addr(), method, path, headers, b"{}").await
}

/// Sends `n` requests and returns their statuses.
async fn flood(proxy: &TestProxy, n: usize, path: &str, headers: &[(&str, &str)]) -> Vec<u16> {
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        statuses.push(send(proxy, "POST", path, headers).await.status.as_u16());
    }
    statuses
}

/// `first` times `a`, then `b` for the rest of `n`.
fn expect(n: usize, first: usize, a: u16, b: u16) -> Vec<u16> {
    (0..n).map(|i| if i < first { a } else { b }).collect()
}

/// A zone that admits 6 requests (burst 5) and refills far slower than
/// any test runs.
const ZONE: &str = "zones: [{ name: per_ip, rate: 1r/m, burst: 5, nodelay: true }]";

const BAD_TOKEN: (&str, &str) = ("authorization", "Bearer abc.def.ghi");

#[tokio::test]
async fn a_bad_token_flood_is_counted_by_the_zone_before_any_verification() {
    let (up, proxy) = start(&format!(
        "{ZONE}\nidentity: {{ on_invalid: reject, jwt: {{ algorithms: [HS256], secret: '{SECRET}' }} }}"
    ))
    .await;
    let statuses = flood(&proxy, 20, "/api", &[BAD_TOKEN]).await;
    assert_eq!(statuses, expect(20, 6, 401, 429));
    assert_eq!(
        proxy.pipeline.token_verifications(),
        6,
        "requests refused by the zone are never verified"
    );
    // The same client without a token is over its zone too.
    let got = send(&proxy, "GET", "/api", &[]).await;
    assert_eq!(got.status, 429);
    assert_eq!(got.json()["limit"], "per_ip");
    assert_eq!(up.hits(), 0, "nothing reached the upstream");
}

/// An RSA key pair: the private key as PKCS#8 PEM, the public key's PEM,
/// and a JWKS holding it under `kid`.
fn rsa_pair(kid: &str) -> (String, String, serde_json::Value) {
    use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
    use rsa::traits::PublicKeyParts;
    let private = rsa::RsaPrivateKey::new(&mut rand::thread_rng(), 2048).unwrap();
    let public = private.to_public_key();
    let b64 = |b: Vec<u8>| {
        const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in b.chunks(3) {
            let n =
                chunk.iter().fold(0u32, |acc, &x| acc << 8 | x as u32) << (8 * (3 - chunk.len()));
            for i in 0..=chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
        out
    };
    let jwks = serde_json::json!({ "keys": [{ "kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig",
        "n": b64(public.n().to_bytes_be()), "e": b64(public.e().to_bytes_be()) }] });
    (
        private.to_pkcs8_pem(LineEnding::LF).unwrap().to_string(),
        public.to_public_key_pem(LineEnding::LF).unwrap(),
        jwks,
    )
}

fn rs256_token(private_pem: &str, kid: &str, sub: &str) -> String {
    let mut header = Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some(kid.into());
    let exp = tollgate::clock::unix_ms() / 1000 + 600;
    encode(
        &header,
        &serde_json::json!({ "sub": sub, "exp": exp }),
        &EncodingKey::from_rsa_pem(private_pem.as_bytes()).unwrap(),
    )
    .unwrap()
}

#[tokio::test]
async fn rs256_floods_signed_with_the_wrong_key_cost_six_verifications() {
    let (_, public_pem, jwks) = rsa_pair("k1");
    let (forger, _, _) = rsa_pair("k1");
    let dir = tempfile::tempdir().unwrap();
    let pem_path = dir.path().join("jwt.pub.pem");
    std::fs::write(&pem_path, public_pem).unwrap();
    let jwks_path = dir.path().join("jwks.json");
    std::fs::write(&jwks_path, jwks.to_string()).unwrap();
    let forged = format!("Bearer {}", rs256_token(&forger, "k1", "mallory"));
    for keys in [
        format!("public_key: '{}'", pem_path.display()),
        format!("jwks: '{}'", jwks_path.display()),
    ] {
        let (up, proxy) = start(&format!(
            "{ZONE}\nidentity: {{ on_invalid: reject, jwt: {{ algorithms: [RS256], {keys} }} }}"
        ))
        .await;
        let statuses = flood(&proxy, 20, "/api", &[("authorization", &forged)]).await;
        assert_eq!(statuses, expect(20, 6, 401, 429), "{keys}");
        assert_eq!(proxy.pipeline.token_verifications(), 6, "{keys}");
        assert_eq!(up.hits(), 0);
    }
}

#[tokio::test]
async fn zones_keyed_by_header_or_global_count_refused_requests_too() {
    let (_up, proxy) = start(&format!(
        "zones: [{{ name: per_key, key: 'header:x-api-key', rate: 1r/m, burst: 5, nodelay: true }}]\nidentity: {{ on_invalid: reject, jwt: {{ algorithms: [HS256], secret: '{SECRET}' }} }}"
    ))
    .await;
    let key_a = [BAD_TOKEN, ("x-api-key", "key-a")];
    assert_eq!(
        flood(&proxy, 20, "/api", &key_a).await,
        expect(20, 6, 401, 429)
    );
    let key_b = [BAD_TOKEN, ("x-api-key", "key-b")];
    assert_eq!(
        send(&proxy, "POST", "/api", &key_b).await.status,
        401,
        "another header value is another bucket"
    );
    assert_eq!(proxy.pipeline.token_verifications(), 7);

    let (_up, proxy) = start(&format!(
        "zones: [{{ name: everyone, key: global, rate: 1r/m, burst: 5, nodelay: true }}]\nidentity: {{ on_invalid: reject, jwt: {{ algorithms: [HS256], secret: '{SECRET}' }} }}"
    ))
    .await;
    assert_eq!(
        flood(&proxy, 20, "/api", &[BAD_TOKEN]).await,
        expect(20, 6, 401, 429)
    );
    assert_eq!(send(&proxy, "GET", "/api", &[]).await.status, 429);
}

#[tokio::test]
async fn refused_webhook_sources_and_bad_signatures_are_counted() {
    let (up, proxy) = start_routes(
        ZONE,
        "  - match: { path: /hooks/strict }
    upstream: api
    allow_sources: ['192.30.252.0/22']
    only_allowed_sources: true
  - match: { path: /hooks/signed }
    upstream: api
    verify: { scheme: github, secret: 'github-webhook-secret-123' }
",
    )
    .await;
    assert_eq!(
        flood(&proxy, 20, "/hooks/strict", &[]).await,
        expect(20, 6, 403, 429)
    );
    assert_eq!(up.hits(), 0);

    let (up, proxy) = start_routes(
        "zones: [{ name: per_ip, rate: 1r/m, burst: 2, nodelay: true }]",
        "  - match: { path: /hooks/signed }
    upstream: api
    verify: { scheme: github, secret: 'github-webhook-secret-123' }
",
    )
    .await;
    let forged = [("x-hub-signature-256", "sha256=00")];
    assert_eq!(
        flood(&proxy, 6, "/hooks/signed", &forged).await,
        expect(6, 3, 401, 429)
    );
    assert_eq!(up.hits(), 0);
}

#[tokio::test]
async fn bypassed_clients_are_never_limited_and_user_zones_see_the_user() {
    let (up, proxy) = start(&format!(
        "{ZONE}\nbypass: {{ tokens: ['monitoring-token-0123456789'] }}\nidentity: {{ on_invalid: reject, jwt: {{ algorithms: [HS256], secret: '{SECRET}' }} }}"
    ))
    .await;
    let bypass = ("x-bypass-token", "monitoring-token-0123456789");
    assert_eq!(flood(&proxy, 20, "/api", &[bypass]).await, vec![200; 20]);
    assert_eq!(
        flood(&proxy, 10, "/api", &[bypass, BAD_TOKEN]).await,
        vec![401; 10],
        "a bypassed client with a bad token is refused by identity, never limited"
    );
    assert_eq!(up.hits(), 20);

    let (_up, proxy) = start(&format!(
        "zones: [{{ name: per_user, key: user, rate: 1r/m, burst: 1, nodelay: true }}]\nidentity: {{ jwt: {{ algorithms: [HS256], secret: '{SECRET}' }} }}"
    ))
    .await;
    let token = |sub: &str| {
        let exp = tollgate::clock::unix_ms() / 1000 + 600;
        let jwt = encode(
            &Header::new(jsonwebtoken::Algorithm::HS256),
            &serde_json::json!({ "sub": sub, "exp": exp }),
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap();
        format!("Bearer {jwt}")
    };
    let (alice, bob) = (token("alice"), token("bob"));
    assert_eq!(
        flood(&proxy, 3, "/api", &[("authorization", &alice)]).await,
        vec![200, 200, 429]
    );
    assert_eq!(
        flood(&proxy, 2, "/api", &[("authorization", &bob)]).await,
        vec![200, 200],
        "another user has a bucket of its own"
    );
    assert_eq!(
        flood(&proxy, 5, "/api", &[]).await,
        vec![200; 5],
        "anonymous requests have no user to count"
    );
}

#[tokio::test]
async fn host_header_target_names_the_target_actually_used() {
    let ups = [
        Upstream::spawn().await,
        Upstream::spawn().await,
        Upstream::spawn().await,
    ];
    // A port nothing listens on: connects fail and the target cools down.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for targets in [
        ups.iter()
            .map(|u| format!("'{}'", u.addr))
            .collect::<Vec<_>>(),
        vec![
            format!("'{}'", ups[0].addr),
            format!("'{dead}'"),
            format!("'{}'", ups[1].addr),
        ],
    ] {
        let proxy = TestProxy::spawn(&forward_all(
            &targets.join(", "),
            ", host_header: target, cooldown: 50ms",
            "",
        ))
        .await;
        let addr = proxy.addr();
        let tasks: Vec<_> = (0..30)
            .map(|i| {
                tokio::spawn(async move {
                    let mut c = h1(addr).await;
                    // A body that arrives in pieces keeps requests in
                    // flight together while targets are being picked.
                    let body = if i % 2 == 0 {
                        chunked(vec![b"a", b"b", b"c"])
                    } else {
                        empty()
                    };
                    send1(&mut c, request("POST", "/echo", body)).await
                })
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        for t in tasks {
            let got = t.await.unwrap();
            assert_eq!(got.status, 200);
            let server = got.json()["server"].as_str().unwrap().to_owned();
            assert_eq!(
                got.seen_header("host").as_deref(),
                Some(server.as_str()),
                "targets {targets:?}"
            );
            seen.insert(server);
        }
        assert!(seen.len() >= 2, "round robin spread the requests: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_by_a_route_limit_is_logged_with_its_route() {
    let up = Upstream::spawn().await;
    let run = Running::start_logging(
        &format!(
            "upstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - name: login\n    match: {{ path: /login }}\n    upstream: api\n    limits: [{{ name: login_ip, algorithm: fixed_window, key: ip, limit: 1, window: 1h }}]\n",
            up.addr
        ),
        true,
    );
    assert_eq!(get(run.addr, "/login").await.status, 200);
    assert_eq!(get(run.addr, "/login").await.status, 429);
    let events = run.access_events(2).await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[1]["status"], 429);
    assert_eq!(events[1]["route"], "login");
    assert_eq!(events[1]["rate_limit"], "rejected:login_ip");
    assert_eq!(events[1]["upstream"], "-", "it never reached the upstream");
}
