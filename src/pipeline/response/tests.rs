//! Rate-limit headers and problem bodies, as a client reads them.

use super::*;
use crate::limiter::{Decision, Verdict};

fn route() -> RouteConfig {
    let mut config = crate::Config::from_yaml(
        "listeners: [{ bind: '127.0.0.1:0' }]
routes:
  - match: { path_prefix: / }
    respond: {}
    limits:
      - { name: watch, algorithm: fixed_window, limit: 50, window: 1h, dry_run: true }
      - { name: short, algorithm: token_bucket, rate: 3/s, burst: 3 }
",
        &|_| None,
    )
    .unwrap();
    config.routes.remove(0)
}

fn applied(route: &RouteConfig, quotas: [u64; 2]) -> Vec<Applied> {
    // Decided as the pipeline decides them: enforced, then dry run.
    let (short, watch) = (&route.limits[1].limit, &route.limits[0].limit);
    [(short, quotas[0]), (watch, quotas[1])]
        .into_iter()
        .map(|(l, q)| Applied {
            name: l.name.clone(),
            decision: Decision {
                verdict: Verdict::Allow,
                limit: q,
                remaining: q - 1,
                reset_ms: 1000,
                retry_after_ms: 0,
                window_ms: l.algorithm.policy().1,
            },
        })
        .collect()
}

/// The response's fields as hyper's servers get them.
fn limited(route: &RouteConfig, applied: &[Applied]) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::empty());
    limit_headers(&mut resp, Some(route), applied);
    fields_into_map(&mut resp);
    resp
}

fn policy(route: &RouteConfig, applied: &[Applied]) -> String {
    let resp = limited(route, applied);
    resp.headers()[RATELIMIT_POLICY]
        .to_str()
        .unwrap()
        .to_owned()
}

#[test]
fn the_policy_rendered_at_load_is_the_one_formatted_per_request() {
    let route = route();
    let expected = "\"short\";q=3;w=1, \"watch\";q=50;w=3600";
    assert_eq!(
        route.policy.value.as_ref().unwrap().to_str().unwrap(),
        expected
    );
    assert_eq!(policy(&route, &applied(&route, [3, 50])), expected);
    // A `local` fallback on two replicas halves the quotas: the header
    // says so rather than repeat the configured policy.
    assert_eq!(
        policy(&route, &applied(&route, [1, 25])),
        "\"short\";q=1;w=1, \"watch\";q=25;w=3600"
    );
    // A limit whose key did not apply is left out.
    assert_eq!(
        policy(&route, &applied(&route, [3, 50])[..1]),
        "\"short\";q=3;w=1"
    );
}

#[test]
fn every_rate_limit_field_reads_its_own_value_from_the_shared_buffer() {
    let route = route();
    let fields = |applied: &[Applied]| {
        let resp = limited(&route, applied);
        [X_LIMIT, X_REMAINING, X_RESET, RATELIMIT_POLICY, RATELIMIT]
            .map(|name| resp.headers()[name].to_str().unwrap().to_owned())
    };
    // Quotas past the table of small numbers are written per response;
    // the most restrictive limit (fewest left) is the legacy fields'.
    let mut applied = applied(&route, [1_000_000, 50]);
    applied[0].decision.remaining = 987_654;
    applied[0].decision.reset_ms = 7_200_000;
    assert_eq!(
        fields(&applied),
        [
            "50",
            "49",
            "1",
            "\"short\";q=1000000;w=1, \"watch\";q=50;w=3600",
            "\"short\";r=987654;t=7200, \"watch\";r=49;t=1",
        ]
    );
    // The large numbers in the legacy fields.
    applied[1].decision.limit = 5_000_000;
    applied[1].decision.remaining = 4_999_999;
    assert_eq!(
        fields(&applied),
        [
            "1000000",
            "987654",
            "7200",
            "\"short\";q=1000000;w=1, \"watch\";q=5000000;w=3600",
            "\"short\";r=987654;t=7200, \"watch\";r=4999999;t=1",
        ]
    );
}

#[test]
fn a_limit_name_that_is_no_field_value_leaves_out_only_the_fields_it_is_in() {
    let route = route();
    let mut applied = applied(&route, [3, 50]);
    applied[1].name = "bad\u{1}name".into();
    let mut resp = Response::new(ProxyBody::empty());
    limit_headers(&mut resp, Some(&route), &applied);
    let lines = std::str::from_utf8(&resp.body().lines().lines)
        .unwrap()
        .to_owned();
    let names: Vec<&str> = lines
        .split_terminator("\r\n")
        .map(|l| l.split(':').next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset"
        ],
        "{lines:?}"
    );
    assert!(lines.starts_with("x-ratelimit-limit: 3\r\n"), "{lines:?}");
}

fn rejection(limit: &Arc<str>, what: &Arc<str>, retry_after: u64) -> Rejection {
    Rejection {
        limit: limit.clone(),
        cause: Cause::Rate(what.clone()),
        retry_after,
        status: StatusCode::TOO_MANY_REQUESTS,
        route_limit: false,
    }
}

fn body(r: &Rejection) -> serde_json::Value {
    serde_json::from_slice(&rejection_body(r)).unwrap()
}

#[test]
fn rejection_bodies_are_reused_only_for_the_same_limit_and_retry() {
    let (login, five): (Arc<str>, Arc<str>) = ("login".into(), "5 per 1m".into());
    let first = body(&rejection(&login, &five, 42));
    assert_eq!(
        first,
        serde_json::json!({
            "type": "about:blank",
            "title": "Too Many Requests",
            "status": 429,
            "detail": "rate limit 'login' exceeded: 5 per 1m; retry in 42s",
            "limit": "login",
            "retry_after": 42,
        })
    );
    assert_eq!(body(&rejection(&login, &five, 42)), first);
    let later = body(&rejection(&login, &five, 41));
    assert_eq!(later["retry_after"], 41);
    assert_eq!(
        later["detail"],
        "rate limit 'login' exceeded: 5 per 1m; retry in 41s"
    );
    // A reload's limit of the same name with new numbers: its own body.
    let (login2, ten): (Arc<str>, Arc<str>) = ("login".into(), "10 per 1m".into());
    assert_eq!(
        body(&rejection(&login2, &ten, 42))["detail"],
        "rate limit 'login' exceeded: 10 per 1m; retry in 42s"
    );
    // More distinct rejections than are kept: each still gets its own.
    for retry in 1..=100 {
        assert_eq!(body(&rejection(&login, &five, retry))["retry_after"], retry);
    }
    let conns = Rejection {
        cause: Cause::Concurrency(2),
        retry_after: 1,
        ..rejection(&login, &five, 1)
    };
    assert_eq!(
        body(&conns)["detail"],
        "concurrency limit 'login' exceeded: at most 2 requests at once; retry in 1s"
    );
}
