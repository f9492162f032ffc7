//! Attack alerts: `alerts.rules` watch limits for one key piling up
//! rejections (a Space-Saving sketch per rule and window, so memory is fixed
//! whatever the number of keys) or for a limit refusing a large share of
//! what it decides. A rule that fires logs one `warn` event (target
//! `tollgate::alert`) and, with `alerts.webhook`, queues a JSON POST, signed
//! with HMAC-SHA256 when a secret is set. At most once per key (or limit)
//! per `cooldown`.
//!
//! The request path only ever `try_send`s on a bounded queue: a slow or dead
//! receiver delays no request; what cannot be queued is dropped and counted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, HOST};
use http::{Method, Request};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;

use crate::clock::Clock;
use crate::config::{AlertKind, AlertWebhook, AlertsConfig};
use crate::metrics::top::Sketch;

/// Alerts waiting for the webhook; more are dropped (and counted).
const QUEUE: usize = 64;
/// Keys remembered for the cooldown; past it the oldest are forgotten.
const RECENT: usize = 4096;
/// Alerts kept for the dashboard.
const LATEST: usize = 20;

/// One alert, as logged and posted.
#[derive(Debug, Clone)]
pub struct Alert {
    pub rule: Arc<str>,
    pub limit: Arc<str>,
    /// The key (as operators write it), or `-` for a whole-limit rule.
    pub key: String,
    pub count: u64,
    pub window: Duration,
}

struct Rule {
    name: Arc<str>,
    limit: Arc<str>,
    kind: AlertKind,
    per: Duration,
    /// Shared with the same rule of the config a reload replaced, like
    /// `recent`: a reload neither restarts a window nor forgets a
    /// cool-down.
    window: Arc<Mutex<Window>>,
    /// Keys this rule fired for, and when.
    recent: Arc<Mutex<HashMap<String, Instant>>>,
}

struct Window {
    started: Instant,
    keys: Sketch,
    decided: u64,
    rejected: u64,
}

pub struct Alerts {
    rules: Vec<Rule>,
    /// Per metrics limit index: the rules watching it.
    by_limit: Vec<Vec<usize>>,
    cooldown: Duration,
    /// What windows and cool-downs are timed by.
    clock: Clock,
    queue: Option<mpsc::Sender<Alert>>,
    /// Per rule; shared with the alerts of the config a reload replaced
    /// (by rule name), like the two below: a reload resets no count.
    fired: Box<[Arc<AtomicU64>]>,
    /// Webhook deliveries: ok, failed, dropped (queue full).
    deliveries: Arc<[AtomicU64; 3]>,
    /// The last alerts fired, with their Unix time in ms, oldest first.
    latest: Arc<Mutex<std::collections::VecDeque<(u64, Alert)>>>,
}

impl Alerts {
    /// `limits` are the metrics limit names, in metrics order; counts,
    /// and the windows and cool-downs of unchanged rules, carry on from
    /// `previous` (the running config's alerts).
    pub fn new(
        cfg: &AlertsConfig,
        limits: &[Arc<str>],
        previous: Option<&Alerts>,
        clock: &Clock,
    ) -> Arc<Self> {
        let now = clock.now();
        let rules: Vec<Rule> = cfg
            .rules
            .iter()
            .map(|r| {
                // The same rule watching the same limit the same way.
                let same = previous.and_then(|p| {
                    p.rules.iter().find(|o| {
                        o.name == r.name && o.limit == r.limit && o.kind == r.kind && o.per == r.per
                    })
                });
                Rule {
                    name: r.name.clone(),
                    limit: r.limit.clone(),
                    kind: r.kind.clone(),
                    per: r.per,
                    window: same.map(|o| o.window.clone()).unwrap_or_else(|| {
                        Arc::new(Mutex::new(Window {
                            started: now,
                            keys: Sketch::default(),
                            decided: 0,
                            rejected: 0,
                        }))
                    }),
                    recent: same.map(|o| o.recent.clone()).unwrap_or_default(),
                }
            })
            .collect();
        let by_limit = limits
            .iter()
            .map(|l| {
                rules
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.limit == *l)
                    .map(|(i, _)| i)
                    .collect()
            })
            .collect();
        let (queue, rx) = match (&cfg.webhook, tokio::runtime::Handle::try_current()) {
            (Some(_), Ok(_)) => {
                let (tx, rx) = mpsc::channel(QUEUE);
                (Some(tx), Some(rx))
            }
            _ => (None, None),
        };
        let fired = rules
            .iter()
            .map(|r| {
                previous
                    .and_then(|p| {
                        p.rules
                            .iter()
                            .position(|o| o.name == r.name)
                            .map(|i| p.fired[i].clone())
                    })
                    .unwrap_or_default()
            })
            .collect();
        let alerts = Arc::new(Alerts {
            fired,
            rules,
            by_limit,
            cooldown: cfg.cooldown,
            clock: clock.clone(),
            queue,
            deliveries: previous.map(|p| p.deliveries.clone()).unwrap_or_default(),
            latest: previous.map(|p| p.latest.clone()).unwrap_or_else(|| {
                Arc::new(Mutex::new(std::collections::VecDeque::with_capacity(
                    LATEST,
                )))
            }),
        });
        if let (Some(rx), Some(hook)) = (rx, cfg.webhook.clone()) {
            tokio::spawn(deliver(rx, hook, Arc::downgrade(&alerts)));
        }
        alerts
    }

    /// Whether any rule watches limit `limit` (so its decisions are worth
    /// reporting).
    pub fn watches(&self, limit: usize) -> bool {
        self.by_limit.get(limit).is_some_and(|r| !r.is_empty())
    }

    /// A limit's decision for a request; `key` when it rejected.
    pub fn decided(&self, limit: usize, rejected: Option<&str>) {
        let Some(rules) = self.by_limit.get(limit) else {
            return;
        };
        for &i in rules {
            let rule = &self.rules[i];
            let now = self.clock.now();
            let fired = {
                let mut w = rule.window.lock().unwrap_or_else(|e| e.into_inner());
                if now.duration_since(w.started) >= rule.per {
                    w.started = now;
                    w.keys.clear();
                    w.decided = 0;
                    w.rejected = 0;
                }
                w.decided += 1;
                match (&rule.kind, rejected) {
                    (AlertKind::KeyRejections(n), Some(key)) => {
                        w.rejected += 1;
                        let (count, error) = w.keys.record(key);
                        // Fire on the guaranteed count, not the estimate.
                        (count - error >= *n).then(|| (key.to_owned(), count - error))
                    }
                    (
                        AlertKind::RejectRatio {
                            ratio,
                            min_requests,
                        },
                        r,
                    ) => {
                        w.rejected += u64::from(r.is_some());
                        let share = w.rejected as f64 / w.decided as f64;
                        (r.is_some() && w.decided >= *min_requests && share >= *ratio)
                            .then(|| ("-".to_owned(), w.rejected))
                    }
                    (AlertKind::KeyRejections(_), None) | (AlertKind::QuotaUsed(_), _) => None,
                }
            };
            if let Some((key, count)) = fired {
                self.fire(i, key, count, now);
            }
        }
    }

    fn fire(&self, i: usize, key: String, count: u64, now: Instant) {
        let rule = &self.rules[i];
        {
            let mut recent = rule.recent.lock().unwrap_or_else(|e| e.into_inner());
            if recent
                .get(&key)
                .is_some_and(|at| now.duration_since(*at) < self.cooldown)
            {
                return;
            }
            if recent.len() >= RECENT {
                recent.retain(|_, at| now.duration_since(*at) < self.cooldown);
                if recent.len() >= RECENT {
                    recent.clear();
                }
            }
            recent.insert(key.clone(), now);
        }
        self.fired[i].fetch_add(1, Ordering::Relaxed);
        let alert = Alert {
            rule: rule.name.clone(),
            limit: rule.limit.clone(),
            key,
            count,
            window: rule.per,
        };
        tracing::warn!(
            target: "tollgate::alert",
            rule = %alert.rule,
            limit = %alert.limit,
            key = %alert.key,
            count = alert.count,
            window_s = alert.window.as_secs(),
            "alert"
        );
        self.publish(alert);
    }

    /// A key's calendar quota after an admitted request: `used` of
    /// `quota`. Rules `used:` fire once the share is reached (once per key
    /// per cool-down).
    pub fn quota(&self, limit: usize, key: &str, used: u64, quota: u64) {
        let Some(rules) = self.by_limit.get(limit) else {
            return;
        };
        for &i in rules {
            if let AlertKind::QuotaUsed(share) = self.rules[i].kind {
                if quota > 0 && used as f64 >= share * quota as f64 {
                    self.fire(i, key.to_owned(), used, self.clock.now());
                }
            }
        }
    }

    /// A penalty box banned `key` under `limit` (its `level`-th ban, for
    /// `seconds`): logged and posted like an alert of the rule
    /// `penalty_box`, without a cool-down (a ban starts once per strikes).
    pub fn banned(&self, limit: &Arc<str>, key: &str, level: u32, seconds: u64) {
        let alert = Alert {
            rule: Arc::from("penalty_box"),
            limit: limit.clone(),
            key: key.to_owned(),
            count: u64::from(level),
            window: Duration::from_secs(seconds),
        };
        self.publish(alert);
    }

    /// Keeps `alert` for the dashboard and queues it for the webhook.
    fn publish(&self, alert: Alert) {
        {
            let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
            if latest.len() == LATEST {
                latest.pop_front();
            }
            let at_ms = self.clock.unix_ms();
            latest.push_back((at_ms, alert.clone()));
        }
        if let Some(q) = &self.queue {
            if q.try_send(alert).is_err() {
                self.deliveries[2].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// `(rule, times fired)` for metrics.
    pub fn fired(&self) -> Vec<(Arc<str>, u64)> {
        self.rules
            .iter()
            .zip(self.fired.iter())
            .map(|(r, n)| (r.name.clone(), n.load(Ordering::Relaxed)))
            .collect()
    }

    /// The last alerts fired (at most 20), newest first, with their Unix
    /// time in ms.
    pub fn latest(&self) -> Vec<(u64, Alert)> {
        let latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        latest.iter().rev().cloned().collect()
    }

    /// `(result, deliveries)`: ok, failed, dropped.
    pub fn deliveries(&self) -> Vec<(&'static str, u64)> {
        ["ok", "failed", "dropped"]
            .into_iter()
            .zip(self.deliveries.iter())
            .map(|(r, n)| (r, n.load(Ordering::Relaxed)))
            .collect()
    }
}

/// The JSON body (or Slack's `{"text": ...}`) for an alert.
pub fn payload(alert: &Alert, slack: bool) -> String {
    let at = crate::clock::unix_ms() / 1000;
    if slack {
        return serde_json::json!({
            "text": format!(
                "tollgate alert {}: {} rejected by {} {} times in {}s",
                alert.rule, alert.key, alert.limit, alert.count, alert.window.as_secs()
            )
        })
        .to_string();
    }
    serde_json::json!({
        "alert": &*alert.rule,
        "limit": &*alert.limit,
        "key": alert.key,
        "count": alert.count,
        "window_seconds": alert.window.as_secs(),
        "at": at,
    })
    .to_string()
}

/// Posts queued alerts one at a time, each within the webhook's timeout.
async fn deliver(
    mut rx: mpsc::Receiver<Alert>,
    hook: AlertWebhook,
    alerts: std::sync::Weak<Alerts>,
) {
    while let Some(alert) = rx.recv().await {
        let ok = tokio::time::timeout(hook.timeout, post(&hook, &alert))
            .await
            .map_err(|_| "timed out".to_owned())
            .and_then(|r| r);
        let Some(alerts) = alerts.upgrade() else {
            return;
        };
        match ok {
            Ok(()) => alerts.deliveries[0].fetch_add(1, Ordering::Relaxed),
            Err(why) => {
                // The URL may carry a secret (Slack's do): only its host is logged.
                tracing::warn!(host = ?hook.uri.host(), error = %why, "alert webhook delivery failed");
                alerts.deliveries[1].fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

async fn post(hook: &AlertWebhook, alert: &Alert) -> Result<(), String> {
    let host = hook.uri.host().unwrap_or_default().to_owned();
    let port = hook
        .uri
        .port_u16()
        .unwrap_or(if hook.tls.is_some() { 443 } else { 80 });
    let body = payload(alert, hook.slack);
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(hook.uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(
            HOST,
            hook.uri.authority().map_or(host.as_str(), |a| a.as_str()),
        )
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.clone())))
        .map_err(|e| e.to_string())?;
    if let Some(secret) = &hook.secret {
        let sig = crate::secret::sign(secret, &[body.as_bytes()]);
        if let Ok(v) = HeaderValue::from_str(&format!("sha256={sig}")) {
            req.headers_mut().insert("x-tollgate-signature", v);
        }
    }
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| e.to_string())?;
    let status = match &hook.tls {
        None => send(TokioIo::new(tcp), req).await?,
        Some(cfg) => {
            let name = rustls_pki_types::ServerName::try_from(host.clone())
                .map_err(|_| format!("\"{host}\" is not a valid TLS server name"))?;
            let tls = tokio_rustls::TlsConnector::from(cfg.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| e.to_string())?;
            send(TokioIo::new(tls), req).await?
        }
    };
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("the receiver answered {status}"))
    }
}

async fn send<T>(io: T, req: Request<Full<Bytes>>) -> Result<http::StatusCode, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    Ok(resp.status())
}
