//! Headless Chromium driven over the DevTools protocol: open a page, read
//! its DOM with JavaScript, take a screenshot, and record every exception
//! the page throws (a syntax error included), so a test fails on any.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const EXECUTABLES: [&str; 3] = ["chromium", "chromium-browser", "google-chrome"];

pub struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    ws: Ws,
    next: u64,
    session: Option<String>,
    /// What the page threw, in order.
    pub exceptions: Vec<String>,
}

fn executable() -> &'static str {
    EXECUTABLES
        .into_iter()
        .find(|exe| {
            Command::new(exe)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .expect("no Chromium found; the dashboard test needs it: apt-get install -y chromium (scripts/test does this)")
}

impl Browser {
    pub async fn launch(width: u32, height: u32) -> Browser {
        let profile = tempfile::tempdir().expect("profile dir");
        let mut child = Command::new(executable())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-extensions",
                "--disable-sync",
                "--no-first-run",
                "--hide-scrollbars",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--window-size={width},{height}"))
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start chromium");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    let _ = tx.send(url.trim().to_owned());
                }
            }
        });
        let url = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(60)))
            .await
            .unwrap()
            .expect("chromium did not open its DevTools port within 60s");
        let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .expect("connect to DevTools");
        let mut b = Browser {
            child,
            _profile: profile,
            ws,
            next: 0,
            session: None,
            exceptions: Vec::new(),
        };
        let target = b
            .call("Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let attached = b
            .call(
                "Target.attachToTarget",
                json!({ "targetId": target["targetId"], "flatten": true }),
            )
            .await;
        b.session = Some(attached["sessionId"].as_str().expect("session").to_owned());
        b.call("Runtime.enable", json!({})).await;
        b.call("Page.enable", json!({})).await;
        b
    }

    /// One DevTools command (on the page once attached); events that come
    /// meanwhile are read, exceptions kept.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = &self.session {
            msg["sessionId"] = json!(s);
        }
        self.ws
            .send(Message::Text(msg.to_string().into()))
            .await
            .expect("send to DevTools");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let frame = tokio::time::timeout(left, self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("DevTools did not answer {method} within 30s"))
                .expect("DevTools closed")
                .expect("DevTools read");
            let Message::Text(text) = frame else {
                continue;
            };
            let v: Value = serde_json::from_str(&text).expect("DevTools JSON");
            if v["method"] == "Runtime.exceptionThrown" {
                let d = &v["params"]["exceptionDetails"];
                let what = d["exception"]["description"]
                    .as_str()
                    .or(d["text"].as_str())
                    .unwrap_or("exception");
                self.exceptions
                    .push(format!("{what} (line {})", d["lineNumber"]));
            }
            if v["id"] == id {
                if let Some(e) = v.get("error") {
                    panic!("DevTools {method} failed: {e}");
                }
                return v["result"].clone();
            }
        }
    }

    /// Navigates and waits until `url` has loaded.
    pub async fn goto(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url })).await;
        let loaded = format!(
            "location.href === {} && document.readyState === 'complete'",
            json!(url)
        );
        self.wait_for(&loaded, Duration::from_secs(30)).await;
    }

    /// The value of a JavaScript expression in the page.
    pub async fn eval(&mut self, expression: &str) -> Value {
        self.try_eval(expression)
            .await
            .unwrap_or_else(|e| panic!("evaluating {expression}: {e}"))
    }

    /// The value of an expression, or what it threw (not counted as a
    /// page exception: the expression is the test's).
    async fn try_eval(&mut self, expression: &str) -> Result<Value, Value> {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
            )
            .await;
        match r.get("exceptionDetails") {
            Some(e) => Err(e.clone()),
            None => Ok(r["result"]["value"].clone()),
        }
    }

    /// Polls `expression` until it is truthy (its value), or fails after
    /// `within` showing the last value and what the page threw.
    pub async fn wait_for(&mut self, expression: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            // A document still loading may throw on what it asks for: the
            // last answer, value or exception, is shown if it never holds.
            let last = match self.try_eval(expression).await {
                Ok(v) if truthy(&v) => return v,
                Ok(v) | Err(v) => v,
            };
            assert!(
                Instant::now() < deadline,
                "page never satisfied `{expression}` within {within:?} (last: {last}); exceptions: {:?}",
                self.exceptions
            );
            // Paces the looks; the condition orders events.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A PNG of the viewport.
    /// Opens the dashboard at `admin` and signs in with `token` (the page
    /// asks for it once).
    pub async fn open_dashboard(&mut self, admin: std::net::SocketAddr, token: &str) {
        self.goto(&format!("http://{admin}/dashboard")).await;
        self.wait_for(
            "!document.getElementById('login').hidden",
            Duration::from_secs(20),
        )
        .await;
        self.eval(&format!(
            "document.getElementById('token').value = '{token}'; \
             document.getElementById('login-form').requestSubmit(); true"
        ))
        .await;
    }

    pub async fn screenshot(&mut self) -> Vec<u8> {
        use base64::Engine;
        let shot = self
            .call("Page.captureScreenshot", json!({ "format": "png" }))
            .await;
        base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("screenshot base64")
    }
}

fn truthy(v: &Value) -> bool {
    !matches!(v, Value::Null | Value::Bool(false)) && *v != json!(0) && *v != json!("")
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
