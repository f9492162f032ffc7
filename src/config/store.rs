//! Validation of the `store` section: where limit state lives.

use std::time::Duration;

use redis::IntoConnectionInfo;

use super::checker::Checker;
use super::compiled::StoreConfig;
use super::raw::RawStore;
use crate::limiter::redis::{redact_url, RedisOptions};
use crate::limiter::OnError;

pub const DEFAULT_PREFIX: &str = "tollgate:";

pub fn store(raw: Option<&RawStore>, c: &mut Checker) -> StoreConfig {
    let mut out = StoreConfig {
        redis: None,
        on_error: OnError::Local,
        replicas: 1,
    };
    let Some(raw) = raw else {
        return out;
    };
    // (nodes, cluster), or None for the memory store.
    let target: Option<(Vec<String>, bool)> = match raw.kind.as_str() {
        "memory" => {
            for (set, key) in [(raw.url.is_some(), "url"), (raw.nodes.is_some(), "nodes")] {
                if set {
                    c.report(
                        format!("store.{key}"),
                        "only used with kind redis or redis_cluster",
                    );
                }
            }
            None
        }
        "redis" => {
            if raw.nodes.is_some() {
                c.report(
                    "store.nodes",
                    "is for kind redis_cluster; kind redis takes one url",
                );
            }
            match &raw.url {
                Some(url) => {
                    check_url("store.url", url, c);
                    Some((vec![url.clone()], false))
                }
                None => {
                    c.report(
                        "store.url",
                        "is required with kind redis, e.g. redis://127.0.0.1:6379",
                    );
                    None
                }
            }
        }
        "redis_cluster" => {
            if raw.url.is_some() {
                c.report(
                    "store.url",
                    "kind redis_cluster takes a list of seed nodes in store.nodes",
                );
            }
            let nodes = raw.nodes.clone().unwrap_or_default();
            if nodes.is_empty() {
                c.report(
                    "store.nodes",
                    "list at least one seed node, e.g. [redis://10.0.0.1:6379]",
                );
            }
            for (i, n) in nodes.iter().enumerate() {
                check_url(&format!("store.nodes[{i}]"), n, c);
            }
            Some((nodes, true))
        }
        other => {
            c.report(
                "store.kind",
                format!("expected memory, redis or redis_cluster, got \"{other}\""),
            );
            None
        }
    };
    let prefix = match &raw.prefix {
        Some(p) => {
            if p.contains(['{', '}']) {
                c.report(
                    "store.prefix",
                    "must not contain { or }: tollgate sets the hash tags",
                );
            }
            p.clone()
        }
        None => DEFAULT_PREFIX.to_owned(),
    };
    let timeout = c.positive_duration("store.timeout", &raw.timeout, Duration::from_millis(10));
    let connect_timeout = c.positive_duration(
        "store.connect_timeout",
        &raw.connect_timeout,
        Duration::from_secs(1),
    );
    if let Some(m) = &raw.on_error {
        match m.parse() {
            Ok(m) => out.on_error = m,
            Err(e) => c.report("store.on_error", e),
        }
    }
    out.replicas = c.number("store.replicas", &raw.replicas, 1u64, 1, 10_000);
    let breaker = raw.breaker.as_ref();
    let breaker_failures = c.number(
        "store.breaker.failures",
        &breaker.and_then(|b| b.failures.clone()),
        5u32,
        1,
        1_000_000,
    );
    let probe_interval = c.positive_duration(
        "store.breaker.probe_interval",
        &breaker.and_then(|b| b.probe_interval.clone()),
        Duration::from_millis(250),
    );
    let tls_ca = raw
        .tls
        .as_ref()
        .and_then(|t| t.ca.as_ref())
        .and_then(|path| {
            std::fs::read(path)
                .map_err(|e| c.report("store.tls.ca", format!("cannot read {path}: {e}")))
                .ok()
        });
    out.redis = target.map(|(nodes, cluster)| RedisOptions {
        nodes,
        cluster,
        prefix,
        timeout,
        connect_timeout,
        breaker_failures,
        probe_interval,
        cache_rejections: raw.cache_rejections.unwrap_or(true),
        tls_ca,
    });
    out
}

fn check_url(path: &str, url: &str, c: &mut Checker) {
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        c.report(
            path,
            format!(
                "expected a redis:// or rediss:// URL, got \"{}\"",
                redact_url(url)
            ),
        );
        return;
    }
    if let Err(e) = url.into_connection_info() {
        c.report(path, format!("not a valid Redis URL ({})", e.category()));
    }
}

/// A limit's failure mode: its own `on_error`, else the store's.
pub fn on_error(raw: &Option<String>, path: &str, store: &StoreConfig, c: &mut Checker) -> OnError {
    match raw {
        None => store.on_error,
        Some(m) => m.parse().unwrap_or_else(|e| {
            c.report(path, e);
            store.on_error
        }),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::testing::{assert_exactly, problems};
    use crate::config::Config;
    use crate::limiter::OnError;

    const ROUTES: &str = "listeners: [{ bind: '127.0.0.1:0' }]
routes:
  - match: { path_prefix: / }
    respond: {}
    limits:
      - { name: a, algorithm: fixed_window, limit: 10, window: 1m }
      - { name: b, algorithm: gcra, rate: 10/s, burst: 5, on_error: fail_open }
";

    fn config(store: &str) -> Config {
        Config::from_yaml(&format!("{ROUTES}store: {store}\n"), &|_| None)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn defaults_and_per_limit_overrides() {
        let c = Config::from_yaml(ROUTES, &|_| None).unwrap();
        assert!(c.store.redis.is_none(), "memory by default");
        assert_eq!(c.store.on_error, OnError::Local);
        let r = config("{ kind: redis, url: 'redis://127.0.0.1:6379' }")
            .store
            .redis
            .unwrap();
        assert_eq!(r.prefix, "tollgate:");
        assert_eq!(r.timeout, std::time::Duration::from_millis(10));

        let c = config("{ kind: redis, url: 'redis://u:p@10.0.0.5:6379/2', on_error: fail_closed, replicas: 4 }");
        let limits = &c.routes[0].limits;
        assert_eq!(limits[0].limit.on_error, OnError::FailClosed);
        assert_eq!(limits[1].limit.on_error, OnError::FailOpen);
        // local mode divides each limit among the replicas.
        assert_eq!(
            limits[0].limit.local,
            crate::limiter::Algorithm::FixedWindow {
                limit: 2,
                window_ms: 60_000
            }
        );
        // The password never shows in the summary or a debug print.
        assert!(!c.summary().contains("u:p@"), "{}", c.summary());
        assert!(!format!("{:?}", c.store).contains("u:p@"));
    }

    #[test]
    fn mistakes_name_their_path() {
        let found = problems(&format!(
            "{ROUTES}store: {{ kind: redis, prefix: 'a{{b}}', timeout: 5, on_error: explode, replicas: 0 }}\n"
        ));
        assert_exactly(
            &found,
            &[
                "store.url: is required with kind redis",
                "store.prefix: must not contain { or }",
                "store.timeout: expected a duration",
                "store.on_error: expected fail_open, fail_closed or local, got \"explode\"",
                "store.replicas:",
            ],
        );
        let found = problems(&format!(
            "{ROUTES}store: {{ kind: redis_cluster, url: 'redis://x:6379', nodes: ['http://user:hunter2@x'] }}\n"
        ));
        assert_exactly(
            &found,
            &[
                "store.url: kind redis_cluster takes a list of seed nodes",
                "store.nodes[0]: expected a redis:// or rediss:// URL, got \"http://x\"",
            ],
        );
        assert!(!found.join("\n").contains("hunter2"));
        assert_exactly(
            &problems(&format!("{ROUTES}store: {{ kind: etcd }}\n")),
            &["store.kind: expected memory, redis or redis_cluster, got \"etcd\""],
        );
        assert_exactly(
            &problems(&format!(
                "{ROUTES}store: {{ kind: memory, colour: blue }}\n"
            )),
            &["store.colour: unknown field"],
        );
    }
}
