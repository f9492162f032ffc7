//! Validation: defaults, targets, hosts, and every semantic problem at once.

use super::*;
use crate::config::routes::parse_host;
use crate::config::upstreams::parse_target;

#[test]
fn targets_parse_and_name_their_mistakes() {
    let t = parse_target("127.0.0.1:3000").unwrap();
    assert_eq!((t.host.as_str(), t.port), ("127.0.0.1", 3000));
    let t = parse_target("[::1]:8080").unwrap();
    assert_eq!((t.host.as_str(), t.port), ("::1", 8080));
    let t = parse_target("api.internal:443").unwrap();
    assert_eq!(t.authority, "api.internal:443");
    assert!(parse_target("http://api:80")
        .unwrap_err()
        .contains("without a scheme"));
    for bad in [
        "api",
        "api:",
        "api:http",
        ":80",
        "api:0",
        "api:70000",
        "[::1:80",
    ] {
        assert!(parse_target(bad).is_err(), "{bad}");
    }
}

#[test]
fn hosts_are_exact_or_wildcard() {
    assert_eq!(
        parse_host("API.example.com"),
        Ok(HostMatch::Exact("api.example.com".into()))
    );
    assert_eq!(
        parse_host("*.example.com"),
        Ok(HostMatch::Suffix(".example.com".into()))
    );
    assert!(parse_host("api.example.com:8080").is_err());
    assert!(parse_host("a.*.com").is_err());
}

use crate::config::testing::problems;

#[test]
fn every_semantic_problem_is_reported_with_its_path() {
    let found = problems(
        "listeners:
  - { name: a, bind: '127.0.0.1:8080' }
  - { name: a, bind: '127.0.0.1:8080' }
  - { bind: 'localhost' }
  - { bind: '127.0.0.1:0', tls: { certs: [{ cert: /nonexistent.pem, key: /nonexistent.key }] } }
admin: { bind: '127.0.0.1:8080' }
server: { max_body_size: 10TB, idle_timeout: 0s, max_connections: 0, workers: many }
upstreams:
  api: { targets: ['http://127.0.0.1:3000', 'noport'], host_header: 'bäd' }
routes:
  - { match: { path: api }, upstream: api }
  - { match: { path_prefix: /a, path: /b }, upstream: api }
  - { match: { path: /c, methods: [get] }, upstream: api, respond: {} }
  - { match: { path: /d, host: 'a:80' }, respond: { status: 700, headers: { 'bad name': x } } }
  - { match: { path: /e }, upstream: api }
  - { match: { path: /e }, upstream: api }
  - { match: { path: /f }, respond: { status: 100, headers: { Content-Length: '5', connection: close, x-ok: y } } }
  - { match: { path: /g }, upstream: api, upgrades: [websocket, H2C, 'a/1'] }
log: { format: xml, level: 'tollgate=loud' }
",
    );
    let expect = [
        "listeners[1].name: \"a\" is already used by listeners[0]",
        "listeners[1].bind: 127.0.0.1:8080 is already bound by listener \"a\"",
        "listeners[2].bind: expected an address",
        "listeners[3].tls.certs[0].cert: cannot load /nonexistent.pem",
        "admin.bind: 127.0.0.1:8080 is already bound",
        "server.max_body_size: expected a size",
        "server.idle_timeout: must be greater than zero",
        "server.max_connections: expected a whole number from 1",
        "server.workers: expected auto or a whole number from 1 to 1024, got \"many\"",
        "upstreams.api.targets[0]: expected \"host:port\" without a scheme",
        "upstreams.api.targets[1]: expected \"host:port\", got \"noport\"",
        "upstreams.api.host_header: expected \"preserve\", \"target\" or a host name",
        "routes[0].match.path: must start with \"/\", got \"api\"",
        "routes[1].match: give one of path, path_prefix and grpc",
        "routes[2].match.methods[0]: expected an upper-case HTTP method like GET, got \"get\"",
        "routes[2]: give either upstream or respond, not both",
        "routes[3].match.host: expected a host name",
        "routes[3].respond.status: expected a whole number from 200 to 599, got \"700\"",
        "routes[3].respond.headers.bad name: \"bad name\" is not a valid header name",
        "routes[5]: matches exactly the same requests as routes[4]",
        "routes[6].respond.status: expected a whole number from 200 to 599, got \"100\"",
        "routes[6].respond.headers.Content-Length: \"Content-Length\" is framing or hop-by-hop",
        "routes[6].respond.headers.connection: \"connection\" is framing or hop-by-hop",
        "routes[7].upgrades[1]: h2c is never tunnelled",
        "routes[7].upgrades[2]: expected a protocol name like \"websocket\", got \"a/1\"",
        "log.format: expected \"pretty\" or \"json\", got \"xml\"",
        "log.level: expected a level",
    ];
    crate::config::testing::assert_exactly(&found, &expect);
}

#[test]
fn defaults_fill_everything_left_out() {
    let c = crate::Config::from_yaml(
        "listeners: [{ bind: '127.0.0.1:0' }]\nroutes: [{ match: { path: / }, respond: {} }]\n",
        &|_| None,
    )
    .unwrap();
    assert_eq!(c.listeners[0].name, "listener0");
    assert_eq!(
        c.admin.as_ref().unwrap().bind.to_string(),
        DEFAULT_ADMIN_BIND
    );
    assert_eq!(c.server.header_read_timeout, Duration::from_secs(10));
    assert_eq!(c.server.max_body_bytes, 10 << 20);
    // auto: one worker per core this process may run on.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(c.server.workers, cores);
    assert_eq!(c.routes[0].max_body_bytes, 10 << 20);
    assert_eq!(c.log.format, LogFormat::Pretty);
    assert!(c.log.access_log);
}

#[test]
fn alert_problems_are_reported_with_their_paths() {
    let found = problems(
        "listeners: [{ bind: '127.0.0.1:0' }]
zones: [{ name: per_ip, rate: 10r/s }]
alerts:
  webhook: { url: 'ftp://example.com/x', secret: short, format: teams }
  rules:
    - { name: a, limit: per_ip, rejections: 5 }
    - { name: a, limit: nope, reject_ratio: 1.5 }
    - { name: b, limit: per_ip, rejections: 5, reject_ratio: 0.5 }
routes: [{ match: { path: / }, respond: {} }]
",
    );
    crate::config::testing::assert_exactly(
        &found,
        &[
            "alerts.webhook.url: expected an http:// or https:// URL, got \"ftp://example.com/x\"",
            "alerts.rules[1].name: needs a name of its own, got \"a\"",
            "alerts.rules[1].limit: no zone or route limit is named \"nope\"",
            "alerts.rules[1].reject_ratio: expected a share above 0 and at most 1, got \"1.5\"",
            "alerts.rules[2]: set exactly one of rejections (per key), reject_ratio (per limit) and used (per key, a quota's share)",
        ],
    );
}

#[test]
fn an_admin_listener_beyond_loopback_needs_a_token() {
    let found = problems(
        "listeners: [{ bind: '127.0.0.1:0' }]
admin: { bind: '0.0.0.0:9090' }
routes: [{ match: { path: / }, respond: {} }]
",
    );
    crate::config::testing::assert_exactly(
        &found,
        &["admin.token: the admin listener on 0.0.0.0:9090 is reachable beyond this host"],
    );
    let found = problems(
        "listeners: [{ bind: '127.0.0.1:0' }]
admin: { bind: '0.0.0.0:9090', token: [short] }
routes: [{ match: { path: / }, respond: {} }]
",
    );
    crate::config::testing::assert_exactly(
        &found,
        &["admin.token[0]: an admin token needs at least 16 characters, this one has 5"],
    );
    assert!(problems(
        "listeners: [{ bind: '127.0.0.1:0' }]
admin: { bind: '0.0.0.0:9090', token: 'a-long-enough-admin-token' }
routes: [{ match: { path: / }, respond: {} }]
"
    )
    .is_empty());
}

#[test]
fn grpc_routes_match_a_service_or_a_method_and_post_only() {
    let c = crate::Config::from_yaml(
        "listeners: [{ bind: '127.0.0.1:0' }]
routes:
  - { match: { grpc: shop.v1.Cart }, respond: {} }
  - { match: { grpc: shop.v1.Cart/Add }, respond: {} }
  - { match: { grpc: shop.Cart, methods: [GET, POST] }, respond: {} }
",
        &|_| None,
    )
    .unwrap();
    // Routes are kept in precedence order: the exact method first.
    let route = |p: PathMatch| c.routes.iter().find(|r| r.path == p).unwrap();
    let service = route(PathMatch::Prefix("/shop.v1.Cart/".into()));
    let method = route(PathMatch::Exact("/shop.v1.Cart/Add".into()));
    assert_eq!(service.methods, Some(vec![http::Method::POST]));
    assert_eq!(method.methods, Some(vec![http::Method::POST]));
    let both = route(PathMatch::Prefix("/shop.Cart/".into()));
    assert_eq!(both.methods.as_ref().map(Vec::len), Some(2));
    let found = problems(
        "listeners: [{ bind: '127.0.0.1:0' }]
routes:
  - { match: { grpc: 'shop.Cart/Add/More' }, respond: {} }
  - { match: { grpc: '.shop' }, respond: {} }
  - { match: { grpc: shop.Cart, path: /x }, respond: {} }
",
    );
    crate::config::testing::assert_exactly(
        &found,
        &[
            "routes[0].match.grpc: expected a gRPC service like \"shop.Cart\" or method like \"shop.Cart/Add\", got \"shop.Cart/Add/More\"",
            "routes[1].match.grpc: expected a gRPC service",
            "routes[2].match: give one of path, path_prefix and grpc",
        ],
    );
}

#[test]
fn an_upstream_speaks_http1_unless_it_says_h2_or_auto() {
    let c = crate::Config::from_yaml(
        "listeners: [{ bind: '127.0.0.1:0' }]
upstreams:
  plain: { targets: ['127.0.0.1:1'] }
  grpc: { targets: ['127.0.0.1:2'], protocol: h2, max_streams_per_connection: 8 }
  either: { targets: ['127.0.0.1:3'], protocol: auto, tls: {} }
",
        &|_| None,
    )
    .unwrap();
    let by = |name: &str| c.upstreams.iter().find(|u| u.name == name).unwrap();
    assert_eq!(
        (by("plain").protocol, by("plain").max_streams),
        (UpstreamProtocol::Http1, 100)
    );
    assert_eq!(
        (by("grpc").protocol, by("grpc").max_streams),
        (UpstreamProtocol::H2, 8)
    );
    // Over TLS, `auto` offers both in ALPN, h2 first; `http1` offers none.
    let alpn = &by("either").tls.as_ref().unwrap().config.alpn_protocols;
    assert_eq!(alpn, &[b"h2".to_vec(), b"http/1.1".to_vec()]);
    let found = problems(
        "listeners: [{ bind: '127.0.0.1:0' }]
upstreams:
  a: { targets: ['127.0.0.1:1'], protocol: h3, max_streams_per_connection: 0 }
",
    );
    crate::config::testing::assert_exactly(
        &found,
        &[
            "upstreams.a.protocol: expected \"http1\", \"h2\" or \"auto\", got \"h3\"",
            "upstreams.a.max_streams_per_connection:",
        ],
    );
}

#[test]
fn target_maps_take_weight_backup_and_down_and_name_their_mistakes() {
    let ok = crate::Config::from_yaml(
        "listeners: [{ bind: '127.0.0.1:0' }]
upstreams:
  api:
    targets:
      - '127.0.0.1:3000'
      - { address: '127.0.0.1:3001', weight: 5 }
      - { address: '127.0.0.1:3002', backup: true, down: true }
routes:
  - { match: { path_prefix: / }, upstream: api }
",
        &|_| None,
    )
    .unwrap();
    let t = &ok.upstreams[0].targets;
    assert_eq!(
        t.iter()
            .map(|t| (t.weight, t.backup, t.down))
            .collect::<Vec<_>>(),
        [(1, false, false), (5, false, false), (1, true, true)]
    );
    let found = problems(
        "listeners: [{ bind: '127.0.0.1:0' }]
upstreams:
  api: { targets: [{ address: '127.0.0.1:3000', weight: 0 }, { address: nope, weight: heavy }] }
  all_backup: { targets: [{ address: '127.0.0.1:3000', backup: true }] }
routes:
  - { match: { path_prefix: / }, upstream: api }
",
    );
    let expect = [
        "upstreams.api.targets[0].weight: expected a whole number from 1 to 1000, got \"0\"",
        "upstreams.api.targets[1].address: expected \"host:port\", got \"nope\"",
        "upstreams.all_backup.targets: every target is a backup",
    ];
    crate::config::testing::assert_exactly(&found, &expect);
    let unknown = problems(
        "listeners: [{ bind: '127.0.0.1:0' }]
upstreams:
  api: { targets: [{ address: '127.0.0.1:3000', wieght: 2 }] }
routes:
  - { match: { path_prefix: / }, upstream: api }
",
    );
    assert!(
        unknown.iter().any(|p| p.contains("upstreams.api.targets[0]")
            && p.contains("unknown field `wieght`")),
        "{unknown:?}"
    );
}

#[test]
fn balancing_retries_and_resolving_name_their_mistakes() {
    let ok = crate::Config::from_yaml(
        "listeners: [{ bind: '127.0.0.1:0' }]
upstreams:
  a:
    targets: [{ address: 'api.internal:80', resolve: true, max_conns: 10 }, '127.0.0.1:81']
    balance: hash $cookie_session consistent
    next_upstream: { on: [error, http_503, non_idempotent], tries: 2, timeout: 3s, max_body: 8KiB, budget: {} }
    resolver: { address: 10.0.0.2, valid: 30s }
    health_check: { path: /healthz, status: 204 }
",
        &|_| None,
    )
    .unwrap();
    let u = &ok.upstreams[0];
    assert_eq!(u.balance.to_string(), "hash $cookie_session consistent");
    assert_eq!(
        (u.next_upstream.tries, u.next_upstream.max_body),
        (2, 8 * 1024)
    );
    assert!(u.next_upstream.lists("http_503") && !u.next_upstream.lists("timeout"));
    assert_eq!(
        u.next_upstream.budget,
        Some(crate::config::RetryBudget {
            per_mille: 200,
            min_per_second: 10,
            window: std::time::Duration::from_secs(10)
        }),
        "linkerd's defaults"
    );
    assert_eq!(u.resolver.address, Some("10.0.0.2:53".parse().unwrap()));
    assert!(u.targets[0].resolve && u.targets[0].max_conns == 10);
    let check = u.health_check.as_ref().unwrap();
    assert_eq!(
        (
            check.path.as_str(),
            check.status,
            check.interval,
            check.fails
        ),
        ("/healthz", (204, 204), std::time::Duration::from_secs(5), 1),
        "nginx Plus's defaults where none is given"
    );
    let found = problems(
        "listeners: [{ bind: '127.0.0.1:0' }]
upstreams:
  a: { targets: ['127.0.0.1:1'], balance: fastest }
  b: { targets: ['127.0.0.1:1', { address: '127.0.0.1:2', backup: true }], balance: ip_hash }
  c: { targets: ['127.0.0.1:1'], balance: 'hash $upstream_addr' }
  d: { targets: ['127.0.0.1:1'], next_upstream: { on: [error, http_501] } }
  e: { targets: ['127.0.0.1:1'], next_upstream: { on: [off], tries: 3 } }
  f: { targets: [{ address: '127.0.0.1:1', resolve: true }], resolver: { address: 'dns.example' } }
  g: { targets: [{ address: '127.0.0.1:1', max_conns: -1 }] }
  h: { targets: ['127.0.0.1:1'], next_upstream: { budget: { ratio: -1, window: 0s } } }
  i: { targets: ['127.0.0.1:1'], health_check: { path: health, status: 500-200, fails: 0 } }
  j: { targets: ['127.0.0.1:1', { address: '127.0.0.1:2', slow_start: 30s }], balance: random }
",
    );
    crate::config::testing::assert_exactly(
        &found,
        &[
            "upstreams.a.balance: expected round_robin, least_conn, random",
            "upstreams.b.targets[1].backup: backup targets cannot be used with balance ip_hash",
            "upstreams.c.balance: hash key \"$upstream_addr\": $upstream_addr is not a variable",
            "upstreams.d.next_upstream.on[1]: unknown condition \"http_501\"",
            "upstreams.e.next_upstream.tries: tries without a condition",
            "upstreams.f.targets[0].resolve: \"127.0.0.1\" is an address, not a name to resolve",
            "upstreams.f.resolver.address: expected an IP address",
            "upstreams.g.targets[0].max_conns:",
            "upstreams.h.next_upstream.budget.ratio:",
            "upstreams.h.next_upstream.budget.window:",
            "upstreams.i.health_check.path: expected a path starting with /",
            "upstreams.i.health_check.status: expected a status or a range like 200-399",
            "upstreams.i.health_check.fails:",
            "upstreams.j.targets[1].slow_start: slow_start cannot be used with balance random",
        ],
    );
}

#[test]
fn protection_names_its_mistakes() {
    let ok = crate::Config::from_yaml(
        "listeners: [{ bind: '127.0.0.1:0' }]
identity: { plans: { names: [free, pro], header: x-plan } }
priorities:
  classes: [critical, paid, standard, bulk]
  default: standard
  never_shed: [critical]
  plans: { pro: paid }
  header: x-priority
upstreams:
  a:
    targets: ['127.0.0.1:1']
    concurrency: { min: 2, max: 50, tolerance: 0.5 }
    queue: { size: 20, timeout: 500ms }
routes:
  - { match: { path: /healthz }, upstream: a, priority: critical }
  - { match: { path_prefix: /export }, upstream: a, priority: bulk }
",
        &|_| None,
    )
    .unwrap();
    let p = &ok.priorities;
    assert_eq!(p.names.len(), 4);
    assert_eq!(p.default, 2);
    assert!(p.never_shed(0) && !p.never_shed(1));
    assert_eq!(p.plans, vec![None, Some(1)]);
    let healthz = ok.routes.iter().find(|r| r.priority == Some(0));
    assert!(healthz.is_some(), "a route names its class");
    let u = &ok.upstreams[0];
    let c = u.concurrency.as_ref().unwrap();
    assert_eq!((c.min, c.max, c.tolerance), (2, 50, 0.5));
    assert_eq!(c.interval, std::time::Duration::from_millis(100));
    assert_eq!(u.queue.as_ref().unwrap().size, 20);
    let summary = ok.summary();
    assert!(
        summary.contains("concurrency: adaptive (gradient) 2..50, tolerance 0.5"),
        "{summary}"
    );
    assert!(
        summary.contains("critical (never shed) > paid > standard > bulk"),
        "{summary}"
    );

    let found = problems(
        "listeners: [{ bind: '127.0.0.1:0' }]
identity: { plans: { names: [free, pro], header: x-plan } }
priorities:
  classes: [critical, bulk, critical]
  default: normal
  never_shed: [vip]
  plans: { gold: bulk, pro: premium }
upstreams:
  a: { targets: ['127.0.0.1:1'], concurrency: { min: 100, max: 10 } }
  b: { targets: ['127.0.0.1:1'], queue: { size: 10 } }
  c: { targets: ['127.0.0.1:1'], concurrency: { tolerance: -1, interval: 2m }, queue: { size: 0, timeout: 1s } }
routes:
  - { match: { path_prefix: / }, upstream: a, priority: urgent }
",
    );
    crate::config::testing::assert_exactly(
        &found,
        &[
            "priorities.classes[2]: \"critical\" is listed twice",
            "priorities.default: unknown priority class \"normal\"",
            "priorities.never_shed[0]: unknown priority class \"vip\"",
            "priorities.plans.gold: \"gold\" is not in identity.plans.names",
            "priorities.plans.pro: unknown priority class \"premium\"",
            "upstreams.a.concurrency.min: min (100) is above max (10)",
            "upstreams.b.queue.timeout: a queue needs a timeout",
            "upstreams.c.concurrency.tolerance: expected a fraction from 0 to 10",
            "upstreams.c.concurrency.interval: interval is longer than probe_every",
            "upstreams.c.queue.size:",
            "routes[0].priority: unknown priority class \"urgent\"",
        ],
    );
}
