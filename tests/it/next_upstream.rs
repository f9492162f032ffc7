//! Failures and retries against real nginx: the same requests through
//! nginx and through its imported config, the answers compared request
//! for request (`proxy_next_upstream` with and without `http_502`, a
//! target refusing connections, a group of one, `max_conns` under load,
//! keyed balancing), and the one intended difference: every target down.

use std::net::SocketAddr;
use std::time::Duration;

use crate::balancing::{both, count, sequence, Named};
use crate::common::*;

/// One target answers 502, the other 200. Without `http_502` listed the
/// 502s are passed on as they come, in round robin turn; with it, the
/// first 502 is a failure that sends the request on and marks the target
/// down, so every answer is the live target's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_502_is_passed_on_or_retried_as_listed_like_nginx() {
    let bad = Named::serve("bad", "127.0.0.1:0".parse().unwrap(), 502, Duration::ZERO).await;
    let good = Named::spawn("good").await;
    let upstream = format!(
        "        server {};\n        server {};",
        bad.addr, good.addr
    );
    let (_nginx, nginx, proxy) = both(&upstream, "").await;
    let want = sequence(nginx, 10).await;
    let got = sequence(proxy.addr(), 10).await;
    assert_eq!(count(&want, "!502"), 5, "nginx passes them on: {want:?}");
    assert_eq!(got, want, "tollgate");

    let listed = "proxy_next_upstream error timeout http_502;";
    let (_nginx, nginx, proxy) = both(&upstream, listed).await;
    let want = sequence(nginx, 10).await;
    let got = sequence(proxy.addr(), 10).await;
    assert_eq!(want, vec!["good".to_owned(); 10], "nginx");
    assert_eq!(got, want, "tollgate");
    let metrics = String::from_utf8_lossy(
        &admin_with(&proxy, "tollgate-test-token", "GET", "/metrics", None)
            .await
            .body,
    )
    .into_owned();
    assert!(
        metrics.contains(&format!(
            "tollgate_upstream_retries_total{{upstream=\"app\",target=\"{}\",reason=\"http_502\"}} 1",
            bad.addr
        )),
        "{metrics}"
    );
}

/// One target refuses connections: nginx and tollgate send the first
/// request on to the other and leave the refusing one out for its
/// `fail_timeout`; every client gets a 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_target_is_routed_around_like_nginx() {
    let refused = refused_addr();
    let live = Named::spawn("live").await;
    let upstream = format!("        server {refused};\n        server {};", live.addr);
    let (_nginx, nginx, proxy) = both(&upstream, "").await;
    let want = sequence(nginx, 12).await;
    let got = sequence(proxy.addr(), 12).await;
    assert_eq!(want, vec!["live".to_owned(); 12], "nginx");
    assert_eq!(got, want, "tollgate");
    // The admin API shows it failed, with its reason.
    let got = admin_with(&proxy, "tollgate-test-token", "GET", "/api/upstreams", None).await;
    let api: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    let targets = &api["upstreams"][0]["targets"];
    assert_eq!(targets[0]["state"], "failed", "{api}");
    assert_eq!(targets[0]["last_failure"]["reason"], "error", "{api}");
    assert_eq!(targets[1]["state"], "up", "{api}");
}

/// A group of one target is never marked down: while it refuses, each
/// request is a 502; the first request after it comes back is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_one_is_never_marked_down_like_nginx() {
    let at = refused_addr();
    let upstream = format!("        server {at};");
    let (_nginx, nginx, proxy) = both(&upstream, "").await;
    let want = sequence(nginx, 3).await;
    let got = sequence(proxy.addr(), 3).await;
    assert_eq!(want, vec!["!502".to_owned(); 3], "nginx");
    assert_eq!(got, want, "tollgate");
    let _back = Named::serve("back", at, 200, Duration::ZERO).await;
    let want = sequence(nginx, 2).await;
    let got = sequence(proxy.addr(), 2).await;
    assert_eq!(want, vec!["back".to_owned(); 2], "nginx");
    assert_eq!(got, want, "tollgate");
}

/// Every target down: nginx answers 502 "no live upstreams" until
/// `fail_timeout` passes, even once they are back; tollgate answers the
/// request that finds them all down 502 naming the upstream and lets the
/// next one try them again (the one intended difference, written in
/// docs/upstreams.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_target_down_502s_once_then_tries_again_unlike_nginx() {
    let (a, b) = (refused_addr(), refused_addr());
    let upstream =
        format!("        server {a} fail_timeout=30s;\n        server {b} fail_timeout=30s;");
    let (_nginx, nginx, proxy) = both(&upstream, "").await;
    // Both refuse: each marked down by the first request's two attempts.
    assert_eq!(sequence(nginx, 1).await, ["!502"]);
    assert_eq!(sequence(proxy.addr(), 1).await, ["!502"]);
    let _a = Named::serve("a", a, 200, Duration::ZERO).await;
    let _b = Named::serve("b", b, 200, Duration::ZERO).await;
    let want = sequence(nginx, 4).await;
    assert_eq!(
        want,
        vec!["!502".to_owned(); 4],
        "nginx waits out fail_timeout"
    );
    let mut c = h1(proxy.addr()).await;
    let first = send1(&mut c, request("GET", "/", empty())).await;
    assert_eq!(first.status, 502);
    let body = String::from_utf8_lossy(&first.body);
    assert!(
        body.contains(r#"upstream \"app\""#) && body.contains("the next request tries them again"),
        "{body}"
    );
    let got = sequence(proxy.addr(), 4).await;
    assert_eq!(
        (count(&got, "a"), count(&got, "b")),
        (2, 2),
        "tollgate tries them again: {got:?}"
    );
}

/// `max_conns=2` on each of two targets, 32 clients at once against
/// backends that take 600 ms: four are served, and the rest get 502 at
/// once, from nginx and from tollgate alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_conns_caps_each_target_like_nginx() {
    let slow = Duration::from_millis(600);
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = Named::serve("a", any, 200, slow).await;
    let b = Named::serve("b", any, 200, slow).await;
    let upstream = format!(
        "        server {} max_conns=2;\n        server {} max_conns=2;",
        a.addr, b.addr
    );
    let (_nginx, nginx, proxy) = both(&upstream, "").await;
    for (who, addr) in [("nginx", nginx), ("tollgate", proxy.addr())] {
        let mut clients = tokio::task::JoinSet::new();
        for _ in 0..32 {
            clients.spawn(async move {
                let mut c = h1(addr).await;
                let got = send1(&mut c, request("GET", "/", empty())).await;
                match got.status.as_u16() {
                    200 => String::from_utf8_lossy(&got.body).into_owned(),
                    s => format!("!{s}"),
                }
            });
        }
        let seen: Vec<String> = clients.join_all().await;
        assert_eq!(
            (count(&seen, "a"), count(&seen, "b"), count(&seen, "!502")),
            (2, 2, 28),
            "{who}: {seen:?}"
        );
    }
}

/// `hash $arg_user consistent`: each user lands on the target nginx
/// picks; after a third target is added, still the same as nginx, and
/// about a third of the users move (ketama: at most about 1/(n+1) plus
/// the ring's unevenness).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_hash_places_each_key_where_nginx_does() {
    let (a, b, c) = (
        Named::spawn("a").await,
        Named::spawn("b").await,
        Named::spawn("c").await,
    );
    let users: Vec<String> = (0..200).map(|i| format!("/?user=u{i}")).collect();
    let mut before = Vec::new();
    for servers in [vec![&a, &b], vec![&a, &b, &c]] {
        let lines: Vec<String> = servers
            .iter()
            .map(|s| format!("        server {};", s.addr))
            .collect();
        let upstream = format!("        hash $arg_user consistent;\n{}", lines.join("\n"));
        let (_nginx, nginx, proxy) = both(&upstream, "").await;
        let want = targets_of(nginx, &users, &[]).await;
        let got = targets_of(proxy.addr(), &users, &[]).await;
        assert_eq!(got, want, "tollgate | nginx, per user");
        if before.is_empty() {
            before = want;
        } else {
            let moved = before.iter().zip(&want).filter(|(x, y)| x != y).count();
            assert!((30..=110).contains(&moved), "{moved} of 200 users moved");
            assert!(
                before.iter().zip(&want).all(|(x, y)| x == y || y == "c"),
                "only to the new target"
            );
        }
    }
}

/// `ip_hash` behind a trusted proxy: the client from X-Forwarded-For,
/// keyed by its first three octets; each client lands where nginx sends
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ip_hash_places_each_client_where_nginx_does() {
    let (a, b, c) = (
        Named::spawn("a").await,
        Named::spawn("b").await,
        Named::spawn("c").await,
    );
    let upstream = format!(
        "        ip_hash;\n        server {};\n        server {};\n        server {};",
        a.addr, b.addr, c.addr
    );
    let realip = "set_real_ip_from 127.0.0.1; real_ip_header X-Forwarded-For;";
    let (_nginx, nginx, proxy) = both(&upstream, realip).await;
    let clients: Vec<String> = (0..60)
        .map(|i| format!("10.{}.{}.{}", i % 7, i * 3 % 256, i))
        .collect();
    let paths = vec!["/".to_owned(); clients.len()];
    let want = targets_of(nginx, &paths, &clients).await;
    let got = targets_of(proxy.addr(), &paths, &clients).await;
    assert_eq!(got, want, "tollgate | nginx, per client");
    assert!(
        ["a", "b", "c"].iter().all(|t| want.iter().any(|w| w == t)),
        "{want:?}"
    );
}

/// The target that answered each of `paths`, sent one after another
/// (with `X-Forwarded-For: clients[i]` where given).
async fn targets_of(addr: SocketAddr, paths: &[String], clients: &[String]) -> Vec<String> {
    let mut c = h1(addr).await;
    let mut seen = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let mut req = request("GET", path, empty());
        if let Some(client) = clients.get(i) {
            req.headers_mut()
                .insert("x-forwarded-for", client.parse().unwrap());
        }
        let got = send1(&mut c, req).await;
        assert_eq!(got.status, 200, "{path}");
        seen.push(String::from_utf8_lossy(&got.body).into_owned());
    }
    seen
}

/// A loopback address nothing listens on (it refuses connections).
fn refused_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// The migration sample docs/upstreams.md shows: its `upstream {}` block and
/// `proxy_next_upstream` import as the README shows, and the imported
/// config runs: the primaries share the requests, a primary answering
/// 502 is routed around, the backup serves only once both are down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_upstream_block_imports_as_shown_and_runs() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/upstreams.md")).unwrap();
    let block = doc
        .split("<!-- upstream-sample")
        .nth(1)
        .and_then(|rest| rest.split("```text\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("docs/upstreams.md's upstream-sample block");
    let dir = tempfile::tempdir().unwrap();
    let yaml_path = dir.path().join("tollgate.yaml");
    let import = std::process::Command::new(BIN)
        .args(["import-nginx", "contrib/replay-sample/nginx.conf", "-o"])
        .arg(&yaml_path)
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        import.status.success(),
        "{}",
        String::from_utf8_lossy(&import.stderr)
    );
    let yaml = std::fs::read_to_string(&yaml_path).unwrap();
    let section: Vec<&str> = yaml
        .lines()
        .skip_while(|l| *l != "upstreams:")
        .take_while(|l| *l != "routes:")
        .chain(["routes:"])
        .collect();
    let shown: Vec<&str> = block.lines().skip(1).collect();
    assert_eq!(
        section, shown,
        "docs/upstreams.md's upstream block is stale"
    );

    let (mut a, mut b) = (Named::spawn("a").await, Named::spawn("b").await);
    let c = Named::spawn("c").await;
    let running = yaml
        .replace("127.0.0.1:3000", &a.addr.to_string())
        .replace("127.0.0.1:3001", &b.addr.to_string())
        .replace("127.0.0.1:3002", &c.addr.to_string())
        .replace("0.0.0.0:8080", "127.0.0.1:0")
        + "admin: { enabled: false }\nlog: { access_log: false }\n";
    let proxy = TestProxy::spawn(&running).await;
    let seen = sequence(proxy.addr(), 6).await;
    assert_eq!(
        (count(&seen, "a"), count(&seen, "b"), count(&seen, "c")),
        (3, 3, 0),
        "{seen:?}"
    );
    a.stop();
    let seen = sequence(proxy.addr(), 4).await;
    assert_eq!(seen, ["b"; 4], "routed around the stopped primary");
    b.stop();
    // `tries 2`: the first request may spend both tries on the two stopped
    // primaries (a 502, as nginx); by then both are marked down.
    let seen = sequence(proxy.addr(), 4).await;
    assert!(seen[0] == "c" || seen[0] == "!502", "{seen:?}");
    assert_eq!(
        seen[1..],
        ["c"; 3],
        "the backup, once both primaries are down"
    );
}
