//! Calendar quotas (issue 57): a count per day, week, month or year from
//! local midnight in an IANA time zone, or per month from each key's
//! billing day (a JWT claim, API-key metadata). Time moves by the test's
//! clock, never by sleeping: on Redis the proxies' frozen clock is pinned
//! into the scripts, so two replicas sharing one server count the same
//! period. Each test runs on the memory store and on a real Redis.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use jsonwebtoken::{encode, EncodingKey, Header};

use crate::common::redis::RedisServer;
use crate::common::*;

const SECRET: &str = "quota-test-secret-0123456789abcdef";
const TOKEN: &str = "quota-admin-token-0123456789";

fn jwt(sub: &str, billing_day: Option<u64>) -> String {
    let mut claims = serde_json::json!({ "sub": sub, "exp": 4_000_000_000u64 });
    if let Some(d) = billing_day {
        claims["billing_day"] = d.into();
    }
    encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

/// Unix ms of an RFC 3339 instant.
fn at(rfc3339: &str) -> u64 {
    let t = time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .unwrap();
    (t.unix_timestamp_nanos() / 1_000_000) as u64
}

fn config(store: &str, limits: &str, extra: &str) -> String {
    format!(
        "listeners: [{{ name: plain, bind: '127.0.0.1:0' }}]
admin: {{ bind: '127.0.0.1:0', token: '{TOKEN}' }}
log: {{ access_log: false }}
{store}
identity:
  jwt: {{ algorithms: [HS256], secret: '{SECRET}' }}
  billing_day: {{ claim: billing_day }}
{extra}
routes:
  - match: {{ path_prefix: / }}
    respond: {{ body: ok }}
    limits:
{limits}"
    )
}

/// The replicas of one test, each on its own frozen clock started at the
/// same instant: one on the memory store; two sharing a Redis.
struct Replicas {
    proxies: Vec<(TestProxy, tollgate::clock::FrozenClock)>,
    _redis: Option<RedisServer>,
}

impl Replicas {
    async fn start(redis: bool, start_ms: u64, yaml: impl Fn(&str) -> String) -> Replicas {
        let server = redis.then(RedisServer::start);
        let store = server
            .as_ref()
            .map(|r| r.store_yaml(""))
            .unwrap_or_default();
        let mut proxies = Vec::new();
        for _ in 0..if redis { 2 } else { 1 } {
            proxies.push(TestProxy::spawn_at(&yaml(&store), start_ms).await);
        }
        Replicas {
            proxies,
            _redis: server,
        }
    }

    fn advance(&self, by: Duration) {
        for (_, clock) in &self.proxies {
            clock.advance(by);
        }
    }

    /// Request `n`, sent to the replicas in turn.
    fn addr(&self, n: usize) -> SocketAddr {
        self.proxies[n % self.proxies.len()].0.addr()
    }

    fn name(&self) -> &'static str {
        if self.proxies.len() > 1 {
            "redis"
        } else {
            "memory"
        }
    }
}

/// Requests admitted in a row (at most 20), and the last answer.
async fn admitted(r: &Replicas, headers: &[(&str, &str)]) -> (usize, Got) {
    for n in 0..20 {
        let got = get_from("127.0.0.1", r.addr(n), "/", headers).await;
        match got.status {
            StatusCode::OK => {}
            StatusCode::TOO_MANY_REQUESTS => return (n, got),
            other => panic!("unexpected {other}: {:?}", got.body),
        }
    }
    panic!("20 requests admitted: the quota did not hold");
}

async fn admin_get(proxy: &TestProxy, path: &str) -> serde_json::Value {
    let got = admin_with(proxy, TOKEN, "GET", path, None).await;
    assert_eq!(got.status, StatusCode::OK, "{path}: {:?}", got.body);
    serde_json::from_slice(&got.body).unwrap()
}

fn header<'g>(got: &'g Got, name: &str) -> &'g str {
    got.headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {:?}", got.headers))
        .to_str()
        .unwrap()
}

const MONTHLY: &str = "      - { name: burst, algorithm: token_bucket, rate: 100/s, burst: 50 }
      - { name: monthly, algorithm: quota, key: user, limit: 3, period: month, time_zone: America/New_York }
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monthly_quota_in_new_york_resets_at_local_midnight() {
    for redis in [false, true] {
        // Two minutes before midnight on 31 January in New York (UTC-5).
        let start = at("2027-02-01T04:58:00Z");
        let r = Replicas::start(redis, start, |s| config(s, MONTHLY, "")).await;
        let token = format!("Bearer {}", jwt("alice", None));
        let auth = [("authorization", token.as_str())];

        // An allowed answer names both limits, the quota with its own
        // window: January's 31 days.
        let ok = get_from("127.0.0.1", r.addr(0), "/", &auth).await;
        assert_eq!(ok.status, StatusCode::OK);
        let policy = header(&ok, "ratelimit-policy");
        assert!(
            policy.contains("\"burst\";q=50;w=1") && policy.contains("\"monthly\";q=3;w=2678400"),
            "{}: {policy}",
            r.name()
        );
        assert!(header(&ok, "ratelimit").contains("\"monthly\";r=2;t=120"));

        let (n, refused) = admitted(&r, &auth).await;
        assert_eq!(n, 2, "{}: 3 a month, one used", r.name());
        assert_eq!(header(&refused, "retry-after"), "120");
        let body: serde_json::Value = serde_json::from_slice(&refused.body).unwrap();
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains("3 requests per month (America/New_York)")
                && detail.contains("resets at 2027-02-01T00:00:00-05:00"),
            "{}: {detail}",
            r.name()
        );
        // The admin API reads the quota back on every replica.
        for (proxy, _) in &r.proxies {
            let read = admin_get(proxy, "/api/keys/monthly/user:jwt:alice").await;
            let s = &read["states"][0];
            assert_eq!(
                (s["used"].as_u64(), s["remaining"].as_u64()),
                (Some(3), Some(0)),
                "{read}"
            );
            assert_eq!(s["resets_at"], "2027-02-01T00:00:00-05:00", "{read}");
            assert_eq!(s["period_start"], "2027-01-01T00:00:00-05:00", "{read}");
        }

        // /api/limits names the period, with January's real length.
        let limits = admin_get(&r.proxies[0].0, "/api/limits").await;
        let monthly = limits["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["limit"] == "monthly")
            .cloned()
            .unwrap_or_else(|| panic!("{limits}"));
        assert_eq!(monthly["period"], "month (America/New_York)", "{monthly}");
        assert_eq!(monthly["window_seconds"], 2_678_400.0, "{monthly}");
        assert_eq!(monthly["algorithm"], "quota", "{monthly}");
        // A millisecond before local midnight: still January.
        r.advance(Duration::from_millis(119_999));
        let still = get_from("127.0.0.1", r.addr(1), "/", &auth).await;
        assert_eq!(still.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.name());
        // Midnight in New York (05:00 UTC): February, 28 days, all of it.
        r.advance(Duration::from_millis(1));
        let (n, refused) = admitted(&r, &auth).await;
        assert_eq!(n, 3, "{}: a new month, the whole quota", r.name());
        assert!(header(&refused, "ratelimit-policy").contains("\"monthly\";q=3;w=2419200"));
        let read = admin_get(&r.proxies[0].0, "/api/keys/monthly/user:jwt:alice").await;
        assert_eq!(read["states"][0]["resets_at"], "2027-03-01T00:00:00-05:00");
        // Another user's quota is untouched and reads as whole.
        let bob = admin_get(&r.proxies[0].0, "/api/keys/monthly/user:jwt:bob").await;
        assert_eq!(bob["states"][0]["remaining"], 3, "{bob}");

        if let Some(server) = &r._redis {
            // Its key lives to the end of the month, not longer.
            let keys = server.cli(&["KEYS", "*jwt:alice*monthly*"]);
            let key = keys.lines().next().expect("the quota's key");
            let ttl: u64 = server.cli(&["PTTL", key]).parse().unwrap();
            let month = 28 * 86_400_000;
            assert!(ttl > month - 60_000 && ttl <= month, "PTTL {ttl}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_billing_day_from_a_claim_or_key_metadata_anchors_the_month() {
    let dir = tempfile::tempdir().unwrap();
    let meta = dir.path().join("keys.yaml");
    let key = "billing-key-0001";
    std::fs::write(
        &meta,
        format!("{}: {{ billing_day: 15 }}\n", sha256_hex(key)),
    )
    .unwrap();
    let api_key = format!(
        "  api_key: {{ header: x-api-key, metadata: '{}' }}",
        meta.display()
    );
    let limits = "      - { name: monthly, algorithm: quota, key: user, limit: 2, period: month, time_zone: Europe/Berlin, anchor: billing_day }\n";
    for redis in [false, true] {
        // 28 February 2028, 23:59 in Berlin (UTC+1); 2028 is a leap year.
        let start = at("2028-02-28T22:59:00Z");
        let r = Replicas::start(redis, start, |s| config(s, limits, &api_key)).await;
        // Billing day 31: February's period began on 31 January and ends
        // on its last day, the 29th.
        let token = format!("Bearer {}", jwt("carol", Some(31)));
        let carol = [("authorization", token.as_str())];
        let (n, refused) = admitted(&r, &carol).await;
        assert_eq!(n, 2, "{}", r.name());
        assert_eq!(header(&refused, "retry-after"), "60");
        let detail = String::from_utf8_lossy(&refused.body).into_owned();
        assert!(
            detail.contains("resets at 2028-02-29T00:00:00+01:00"),
            "{detail}"
        );
        // Without a billing day, the calendar month (to 1 March).
        let plain = format!("Bearer {}", jwt("dave", None));
        let dave = [("authorization", plain.as_str())];
        let (_, refused) = admitted(&r, &dave).await;
        let wait: u64 = header(&refused, "retry-after").parse().unwrap();
        assert_eq!(wait, 86_400 + 60, "{}", r.name());
        // An API key's metadata: from the 15th (14 Feb to 15 Mar).
        let by_key = [("x-api-key", key)];
        let (n, refused) = admitted(&r, &by_key).await;
        assert_eq!(n, 2);
        let detail = String::from_utf8_lossy(&refused.body).into_owned();
        assert!(
            detail.contains("resets at 2028-03-15T00:00:00+01:00"),
            "{detail}"
        );
        let user = format!("user:apikey:{}", &sha256_hex(key)[..32]);
        let read = admin_get(
            &r.proxies[0].0,
            &format!("/api/keys/monthly/{user}?billing_day=15"),
        )
        .await;
        assert_eq!(
            read["states"][0]["resets_at"], "2028-03-15T00:00:00+01:00",
            "{read}"
        );
        assert_eq!(read["states"][0]["used"], 2, "{read}");

        // The leap day begins carol's next period: two more.
        r.advance(Duration::from_secs(60));
        let (n, _) = admitted(&r, &carol).await;
        assert_eq!(n, 2, "{}: a new period on 29 February", r.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daily_quota_follows_both_daylight_saving_changes() {
    let limits = "      - { name: daily, algorithm: quota, key: ip, limit: 1, period: day, time_zone: Europe/Berlin }\n";
    for redis in [false, true] {
        // Noon on 28 March 2027 in Berlin: the day clocks skip 02:00-03:00.
        let r = Replicas::start(redis, at("2027-03-28T10:00:00Z"), |s| config(s, limits, "")).await;
        let (n, refused) = admitted(&r, &[]).await;
        assert_eq!(n, 1);
        // 23-hour day: it ends at 22:00 UTC, 12 hours on.
        assert_eq!(header(&refused, "retry-after"), "43200", "{}", r.name());
        assert!(header(&refused, "ratelimit-policy").contains("w=82800"));
        r.advance(Duration::from_secs(43_200));
        assert_eq!(
            admitted(&r, &[]).await.0,
            1,
            "{}: a new day at local midnight",
            r.name()
        );

        // Noon on 31 October 2027: clocks go back, a 25-hour day.
        let r = Replicas::start(redis, at("2027-10-31T11:00:00Z"), |s| config(s, limits, "")).await;
        let (_, refused) = admitted(&r, &[]).await;
        assert_eq!(header(&refused, "retry-after"), "43200", "{}", r.name());
        assert!(header(&refused, "ratelimit-policy").contains("w=90000"));
        r.advance(Duration::from_secs(43_199));
        assert_eq!(admitted(&r, &[]).await.0, 0, "{}: still the 31st", r.name());
        r.advance(Duration::from_secs(1));
        assert_eq!(admitted(&r, &[]).await.0, 1, "{}", r.name());
    }
}

#[test]
fn quota_config_problems_name_their_paths() {
    let bad = |limit: &str| {
        let yaml = config("", &format!("      - {limit}\n"), "");
        tollgate::Config::from_yaml(&yaml, &|_| None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_else(|| panic!("accepted: {limit}"))
    };
    let e = bad("{ name: q, algorithm: quota, limit: 5, period: fortnight }");
    assert!(
        e.contains("routes[0].limits[0].period") && e.contains("fortnight"),
        "{e}"
    );
    let e = bad("{ name: q, algorithm: quota, limit: 5, period: month, time_zone: Mars/Base }");
    assert!(
        e.contains("routes[0].limits[0].time_zone") && e.contains("Mars/Base"),
        "{e}"
    );
    let e = bad("{ name: q, algorithm: quota, limit: 5, period: day, anchor: billing_day }");
    assert!(
        e.contains("routes[0].limits[0].anchor") && e.contains("monthly"),
        "{e}"
    );
    let e = bad("{ name: q, algorithm: quota, limit: 5, window: 1m, period: day }");
    assert!(e.contains("not window"), "{e}");
    let e = bad("{ name: q, algorithm: fixed_window, limit: 5, window: 1m, period: day }");
    assert!(
        e.contains("routes[0].limits[0].period") && e.contains("only a quota"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_near_its_end_warns_and_fires_its_alert_rule() {
    let (hook, mut posts) = receiver(true).await;
    let alerts = format!(
        "alerts:
  webhook: {{ url: 'http://{hook}/hooks', timeout: 1s }}
  rules: [{{ name: quota_low, limit: monthly, used: 0.75 }}]"
    );
    let limits =
        "      - { name: monthly, algorithm: quota, key: user, limit: 4, period: month }\n";
    let (proxy, _clock) =
        TestProxy::spawn_at(&config("", limits, &alerts), at("2027-05-10T12:00:00Z")).await;
    let token = format!("Bearer {}", jwt("erin", None));
    let auth = [("authorization", token.as_str())];
    for n in 1..=3 {
        let got = get_from("127.0.0.1", proxy.addr(), "/", &auth).await;
        assert_eq!(got.status, StatusCode::OK);
        // warn_at (0.9 by default) is passed at the fourth, not before
        assert!(
            got.headers.get("x-ratelimit-warning").is_none(),
            "request {n}"
        );
    }
    let (_, body) = tokio::time::timeout(Duration::from_secs(5), posts.recv())
        .await
        .expect("the quota rule fired at 3 of 4")
        .unwrap();
    let alert: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(alert["alert"], "quota_low", "{alert}");
    assert_eq!(alert["count"], 3, "{alert}");
    assert!(alert["key"].as_str().unwrap().contains("erin"), "{alert}");
    let last = get_from("127.0.0.1", proxy.addr(), "/", &auth).await;
    assert_eq!(
        header(&last, "x-ratelimit-warning"),
        "\"monthly\": 4 of 4 used"
    );
    // A rule by share on a limit that is no quota is refused.
    let wrong = config(
        "",
        "      - { name: monthly, algorithm: fixed_window, limit: 4, window: 1h }\n",
        "alerts: { rules: [{ name: q, limit: monthly, used: 0.9 }] }",
    );
    let e = tollgate::Config::from_yaml(&wrong, &|_| None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("alerts.rules[0].used") && e.contains("not a quota"),
        "{e}"
    );
}

#[test]
fn the_readme_quota_and_penalty_example_is_a_valid_config() {
    let start = "identity:\n  jwt: { algorithms: [HS256], secret: \"${JWT_SECRET}\" }\n  plans: { names: [free, pro], claim: plan, default: free }\n  billing_day:";
    let config = readme_config(start, SECRET);
    let limits: Vec<_> = config.routes.iter().flat_map(|r| &r.limits).collect();
    assert!(limits.iter().any(|l| l.penalty.is_some()), "a penalty box");
    assert!(
        limits
            .iter()
            .any(|l| l.limit.algorithm.calendar().is_some()),
        "a quota"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_gives_its_own_quota() {
    let limits = "      - { name: monthly, algorithm: quota, key: user, limit: 2, period: month, time_zone: Europe/Paris, plans: { pro: { limit: 4 } } }\n";
    let plans = "  plans: { names: [free, pro], claim: plan, default: free }";
    for redis in [false, true] {
        let r = Replicas::start(redis, at("2027-07-14T10:00:00Z"), |s| {
            config(s, limits, plans)
        })
        .await;
        let token = |sub: &str, plan: &str| {
            let claims = serde_json::json!({ "sub": sub, "plan": plan, "exp": 4_000_000_000u64 });
            let t = encode(
                &Header::default(),
                &claims,
                &EncodingKey::from_secret(SECRET.as_bytes()),
            );
            format!("Bearer {}", t.unwrap())
        };
        let (pro, free) = (token("pam", "pro"), token("fred", "free"));
        let (n, refused) = admitted(&r, &[("authorization", pro.as_str())]).await;
        assert_eq!(n, 4, "{}: pro's quota", r.name());
        let detail = String::from_utf8_lossy(&refused.body).into_owned();
        assert!(
            detail.contains("4 requests per month (Europe/Paris)"),
            "{detail}"
        );
        assert!(
            detail.contains("resets at 2027-08-01T00:00:00+02:00"),
            "{detail}"
        );
        assert_eq!(
            admitted(&r, &[("authorization", free.as_str())]).await.0,
            2,
            "{}",
            r.name()
        );
    }
}
