//! The overload experiment's driver (`benches/overload.sh` runs it): a
//! backend simulator of `workers` that each serve a request in `service`
//! (capacity C = workers / service; more requests wait their turn, as in
//! a thread pool), and an open-loop load of three priority classes
//! against a proxy in front of it, in phases: 0.5C, 2C, 4C, then 2C while
//! the simulator's capacity halves and comes back. Latency is measured
//! from when each request was due, so a slow proxy cannot slow the load.
//!
//!   overload run <name> <sim addr> <proxy addr> <out.json> [admin addr]
//!   overload plot <out.svg> <results.json>...
//!
//! With the admin address, the upstream's concurrency limit is read every
//! 100 ms from `/api/upstreams` (bearer `$TOLLGATE_ADMIN_TOKEN`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;

const WORKERS: usize = 10;
const SERVICE: Duration = Duration::from_millis(100);
/// C, requests a second.
const CAPACITY: f64 = WORKERS as f64 / 0.1;
/// An answer later than this is not goodput.
const OBJECTIVE: Duration = Duration::from_millis(300);
/// A request unanswered this long is abandoned (and counted).
const GIVE_UP: Duration = Duration::from_secs(3);
/// Classes by share of requests: never-shed, standard, bulk.
const CLASSES: [(&str, u32); 3] = [("critical", 10), ("standard", 60), ("bulk", 30)];

fn secs(name: &str, default: f64) -> Duration {
    let v = std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Duration::from_secs_f64(v)
}

/// The simulated backend: `free` workers serve one request each.
async fn simulator(addr: SocketAddr, pool: Arc<Semaphore>) {
    let listener = TcpListener::bind(addr).await.expect("simulator port");
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let pool = pool.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |_req| {
                let pool = pool.clone();
                async move {
                    let _worker = pool.acquire().await;
                    tokio::time::sleep(SERVICE).await;
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                        Bytes::from_static(b"done"),
                    )))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

/// Keep-alive connections to the proxy, reused.
#[derive(Clone)]
struct Pool {
    addr: SocketAddr,
    idle: Arc<Mutex<Vec<SendRequest<Empty<Bytes>>>>>,
}

impl Pool {
    async fn get(&self, path: &str, class: &str) -> Option<u16> {
        let idle = self.idle.lock().unwrap().pop();
        let mut sender = match idle {
            Some(s) if s.is_ready() => s,
            _ => {
                let tcp = TcpStream::connect(self.addr).await.ok()?;
                let _ = tcp.set_nodelay(true);
                let (s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                    .await
                    .ok()?;
                tokio::spawn(conn);
                s
            }
        };
        let req = hyper::Request::get(path)
            .header("host", "sim")
            .header("x-priority", class)
            .body(Empty::new())
            .ok()?;
        let resp = sender.send_request(req).await.ok()?;
        let status = resp.status().as_u16();
        resp.into_body().collect().await.ok()?;
        self.idle.lock().unwrap().push(sender);
        Some(status)
    }
}

/// One request's outcome: phase, class, status (0: failed or abandoned),
/// latency from when it was due.
type Outcome = (usize, usize, u16, Duration);

/// The phases: (name, offered load as a share of C, seconds).
fn phases() -> Vec<(&'static str, f64, Duration)> {
    vec![
        ("0.5C", 0.5, secs("PHASE_SECS", 8.0)),
        ("2C", 2.0, secs("PHASE_SECS", 8.0) + Duration::from_secs(2)),
        ("4C", 4.0, secs("PHASE_SECS", 8.0) + Duration::from_secs(2)),
        ("step", 2.0, secs("STEP_SECS", 24.0)),
    ]
}

async fn run(name: &str, sim: SocketAddr, proxy: SocketAddr, out: &str, admin: Option<SocketAddr>) {
    let pool = Arc::new(Semaphore::new(WORKERS));
    tokio::spawn(simulator(sim, pool.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = Pool {
        addr: proxy,
        idle: Arc::default(),
    };
    let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let limits: Arc<Mutex<Vec<(f64, u64)>>> = Arc::default();
    let start = Instant::now();
    if let Some(admin) = admin {
        tokio::spawn(poll_limit(admin, start, limits.clone()));
    }
    let mut events = Vec::new();
    let mut at = start;
    let seq = AtomicU64::new(0);
    for (p, (phase, share, length)) in phases().into_iter().enumerate() {
        events.push((phase.to_owned(), (at - start).as_secs_f64()));
        let rate = CAPACITY * share;
        let every = Duration::from_secs_f64(1.0 / rate);
        let end = at + length;
        let (half_at, back_at) = (at + length / 6, at + length * 7 / 12);
        let mut halved = false;
        let mut held = None;
        let mut due = at;
        while due < end {
            tokio::time::sleep_until(due).await;
            if phase == "step" {
                let now = Instant::now();
                if !halved && now >= half_at && now < back_at {
                    halved = true;
                    held = pool
                        .clone()
                        .acquire_many_owned(WORKERS as u32 / 2)
                        .await
                        .ok();
                    events.push(("capacity C/2".into(), (now - start).as_secs_f64()));
                }
                if halved && now >= back_at && held.is_some() {
                    held = None;
                    events.push(("capacity C".into(), (now - start).as_secs_f64()));
                }
            }
            let n = seq.fetch_add(1, Ordering::Relaxed);
            let pick = (n % 100) as u32;
            let class = if pick < CLASSES[0].1 {
                0
            } else if pick < CLASSES[0].1 + CLASSES[1].1 {
                1
            } else {
                2
            };
            let (client, outcomes) = (client.clone(), outcomes.clone());
            let sent_due = due;
            tokio::spawn(async move {
                let got =
                    tokio::time::timeout(GIVE_UP, client.get("/work", CLASSES[class].0)).await;
                let status = got.ok().flatten().unwrap_or(0);
                let took = Instant::now() - sent_due;
                outcomes.lock().unwrap().push((p, class, status, took));
            });
            due += every;
        }
        drop(held);
        at = end;
    }
    events.push(("end".to_owned(), (at - start).as_secs_f64()));
    tokio::time::sleep(GIVE_UP + Duration::from_millis(200)).await;
    let outcomes = outcomes.lock().unwrap().clone();
    let limits = limits.lock().unwrap().clone();
    let report = summarize(name, &outcomes, &limits, &events);
    std::fs::write(out, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    println!("{}", serde_json::to_string(&report["phases"]).unwrap());
}

/// The limit every 100 ms, as (seconds since the start, limit).
async fn poll_limit(admin: SocketAddr, start: Instant, into: Arc<Mutex<Vec<(f64, u64)>>>) {
    let token = std::env::var("TOLLGATE_ADMIN_TOKEN").unwrap_or_default();
    let mut every = tokio::time::interval(Duration::from_millis(100));
    loop {
        every.tick().await;
        let Ok(tcp) = TcpStream::connect(admin).await else {
            continue;
        };
        let Ok((mut s, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await
        else {
            continue;
        };
        tokio::spawn(conn);
        let req = hyper::Request::get("/api/upstreams")
            .header("host", "admin")
            .header("authorization", format!("Bearer {token}"))
            .body(Empty::<Bytes>::new())
            .unwrap();
        let Ok(resp) = s.send_request(req).await else {
            continue;
        };
        let Ok(body) = resp.into_body().collect().await else {
            continue;
        };
        let v: Value = serde_json::from_slice(&body.to_bytes()).unwrap_or_default();
        if let Some(limit) = v["upstreams"][0]["protect"]["limit"].as_u64() {
            let t = (Instant::now() - start).as_secs_f64();
            into.lock().unwrap().push((t, limit));
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// How long after each event the limit took to settle: from the event
/// until its moving average over one second stays within 25% of where it
/// ended before the next event (the median of the window's last half).
/// The average smooths the controller's small swings; its lag makes the
/// figure an upper bound.
fn settle_times(limits: &[(f64, u64)], events: &[(String, f64)]) -> Vec<Value> {
    let mut out = Vec::new();
    for (i, (what, from)) in events.iter().enumerate() {
        let Some((_, to)) = events.get(i + 1) else {
            break;
        };
        let window: Vec<(f64, f64)> = limits
            .iter()
            .filter(|(t, _)| *t >= *from && *t < *to)
            .map(|(t, l)| (*t, *l as f64))
            .collect();
        if window.len() < 10 {
            continue;
        }
        let mut tail: Vec<f64> = window[window.len() / 2..].iter().map(|x| x.1).collect();
        tail.sort_by(f64::total_cmp);
        let settled = tail[tail.len() / 2];
        let average: Vec<(f64, f64)> = (0..window.len())
            .map(|j| {
                let part = &window[j.saturating_sub(9)..=j];
                (
                    window[j].0,
                    part.iter().map(|x| x.1).sum::<f64>() / part.len() as f64,
                )
            })
            .collect();
        let last_out = average
            .iter()
            .rposition(|(_, l)| (l - settled).abs() > settled * 0.25);
        let settle = match last_out {
            None => 0.0,
            Some(j) => average.get(j + 1).map_or(*to, |x| x.0) - from,
        };
        out.push(json!({ "after": what, "at_s": from, "settled_at": settled, "settle_s": settle }));
    }
    out
}

fn summarize(
    name: &str,
    outcomes: &[Outcome],
    limits: &[(f64, u64)],
    events: &[(String, f64)],
) -> Value {
    let mut phases_out = Vec::new();
    for (p, (phase, share, length)) in phases().into_iter().enumerate() {
        let mine: Vec<&Outcome> = outcomes.iter().filter(|o| o.0 == p).collect();
        let mut ok: Vec<Duration> = mine.iter().filter(|o| o.2 == 200).map(|o| o.3).collect();
        ok.sort_unstable();
        let good = ok.iter().filter(|d| **d <= OBJECTIVE).count();
        let by_class = |status: fn(u16) -> bool| -> Value {
            CLASSES
                .iter()
                .enumerate()
                .map(|(c, (n, _))| {
                    let k = mine.iter().filter(|o| o.1 == c && status(o.2)).count();
                    ((*n).to_owned(), json!(k))
                })
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        phases_out.push(json!({
            "phase": phase,
            "offered_rps": CAPACITY * share,
            "sent": mine.len(),
            "ok": ok.len(),
            "goodput_rps": good as f64 / length.as_secs_f64(),
            "goodput_share_of_c": good as f64 / length.as_secs_f64() / CAPACITY,
            "p50_ms": percentile(&ok, 0.5),
            "p99_ms": percentile(&ok, 0.99),
            "shed_503": by_class(|s| s == 503),
            "refused_502": by_class(|s| s == 502),
            "failed_or_abandoned": by_class(|s| s == 0),
            "not_ok": by_class(|s| s != 200),
        }));
    }
    json!({
        "name": name,
        "capacity_rps": CAPACITY,
        "objective_ms": OBJECTIVE.as_millis() as u64,
        "phases": phases_out,
        "events": events.iter().map(|(w, t)| json!([w, t])).collect::<Vec<_>>(),
        "limit": limits.iter().map(|(t, l)| json!([t, l])).collect::<Vec<_>>(),
        "settle": settle_times(limits, events),
    })
}

/// Goodput per phase for every configuration (bars), and the adaptive
/// limit over time (a line), as one SVG.
fn plot(out: &str, files: &[String]) {
    let runs: Vec<Value> = files
        .iter()
        .map(|f| serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap())
        .collect();
    let colors = ["#9e9e9e", "#e57373", "#64b5f6", "#2e7d32", "#ffb300"];
    let mut svg = String::from(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="900" height="640" font-family="sans-serif" font-size="12">
<rect width="900" height="640" fill="white"/>
<text x="20" y="24" font-size="15">Goodput (answers within 300 ms per second) by offered load, C = 100 req/s</text>
"#,
    );
    let (x0, y0, h) = (60.0, 280.0, 220.0);
    let max = 1.2 * CAPACITY;
    for tick in [0.0, 0.5, 1.0] {
        let y = y0 - h * tick * CAPACITY / max;
        svg += &format!(
            "<line x1=\"{x0}\" x2=\"860\" y1=\"{y}\" y2=\"{y}\" stroke=\"#ddd\"/><text x=\"20\" y=\"{}\">{}C</text>\n",
            y + 4.0,
            tick
        );
    }
    let phases = phases();
    let group = 800.0 / phases.len() as f64;
    let bar = group / (runs.len() as f64 + 1.0);
    for (p, (phase, _, _)) in phases.iter().enumerate() {
        let gx = x0 + group * p as f64;
        svg += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
            gx + group / 2.0,
            y0 + 16.0,
            if *phase == "step" {
                "2C, capacity halves"
            } else {
                phase
            }
        );
        for (r, run) in runs.iter().enumerate() {
            let g = run["phases"][p]["goodput_rps"].as_f64().unwrap_or(0.0);
            let bh = h * g / max;
            svg += &format!(
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"/>\n",
                gx + bar * (r as f64 + 0.5),
                y0 - bh,
                bar * 0.9,
                bh,
                colors[r % colors.len()]
            );
        }
    }
    for (r, run) in runs.iter().enumerate() {
        svg += &format!(
            "<rect x=\"{}\" y=\"40\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"50\">{}</text>\n",
            x0 + 200.0 * r as f64,
            colors[r % colors.len()],
            x0 + 200.0 * r as f64 + 16.0,
            run["name"].as_str().unwrap_or("?")
        );
    }
    // The adaptive limit over time.
    let (ly0, lh) = (600.0, 220.0);
    svg += "<text x=\"20\" y=\"350\" font-size=\"15\">Concurrency limit over time (tollgate adaptive; the backend has 10 workers, then 5, then 10)</text>\n";
    if let Some(run) = runs
        .iter()
        .find(|r| !r["limit"].as_array().unwrap().is_empty())
    {
        let pts = run["limit"].as_array().unwrap();
        let tmax = pts.last().and_then(|p| p[0].as_f64()).unwrap_or(1.0);
        let lmax = pts
            .iter()
            .filter_map(|p| p[1].as_f64())
            .fold(10.0f64, f64::max)
            * 1.1;
        for tick in [0.0, 0.5, 1.0] {
            let y = ly0 - lh * tick;
            svg += &format!(
                "<line x1=\"{x0}\" x2=\"860\" y1=\"{y}\" y2=\"{y}\" stroke=\"#ddd\"/><text x=\"20\" y=\"{}\">{:.0}</text>\n",
                y + 4.0,
                lmax * tick
            );
        }
        for e in run["events"].as_array().unwrap() {
            let x = x0 + 800.0 * e[1].as_f64().unwrap() / tmax;
            svg += &format!(
                "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{}\" y2=\"{ly0}\" stroke=\"#999\" stroke-dasharray=\"4\"/><text x=\"{:.1}\" y=\"{}\" font-size=\"10\">{}</text>\n",
                ly0 - lh,
                x + 2.0,
                ly0 - lh + 10.0,
                e[0].as_str().unwrap()
            );
        }
        let line: Vec<String> = pts
            .iter()
            .map(|p| {
                let (t, l) = (p[0].as_f64().unwrap(), p[1].as_f64().unwrap());
                format!("{:.1},{:.1}", x0 + 800.0 * t / tmax, ly0 - lh * l / lmax)
            })
            .collect();
        svg += &format!(
            "<polyline fill=\"none\" stroke=\"#2e7d32\" stroke-width=\"1.5\" points=\"{}\"/>\n",
            line.join(" ")
        );
        svg += &format!(
            "<text x=\"{x0}\" y=\"{}\">0 s</text><text x=\"830\" y=\"{}\">{tmax:.0} s</text>\n",
            ly0 + 16.0,
            ly0 + 16.0
        );
    }
    svg += "</svg>\n";
    std::fs::write(out, svg).unwrap();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("run") if args.len() >= 5 => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let admin = args.get(5).map(|a| a.parse().unwrap());
            rt.block_on(run(
                &args[1],
                args[2].parse().unwrap(),
                args[3].parse().unwrap(),
                &args[4],
                admin,
            ));
        }
        Some("plot") if args.len() >= 3 => plot(&args[1], &args[2..]),
        _ => {
            eprintln!("usage: overload run <name> <sim addr> <proxy addr> <out.json> [admin addr]\n       overload plot <out.svg> <results.json>...");
            std::process::exit(2);
        }
    }
}
