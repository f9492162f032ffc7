//! The `tollgate` binary: parse arguments, load the config, bind, run.
//! Everything else lives in the library.

#[path = "main/imports.rs"]
mod imports;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tollgate::{Config, ConfigError, Server};

#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

/// mimalloc, asked for alignment only when it is more than every block
/// has (16 bytes, and no more than the size), as Rust's own system
/// allocator does. `mi_malloc_aligned` for every layout (what the
/// `mimalloc` crate does) takes an over-allocating slow path for blocks
/// above 1 KiB, such as a request's future (docs/benchmarks.md, "Why
/// tollgate has its own HTTP/1.x server", has the cost).
struct Allocator;

/// The alignment every mimalloc block has, for sizes at least this large.
const MIN_ALIGN: usize = 16;

fn natural(align: usize, size: usize) -> bool {
    align <= MIN_ALIGN && align <= size
}

type Plain = unsafe extern "C" fn(usize) -> *mut std::ffi::c_void;
type Aligned = unsafe extern "C" fn(usize, usize) -> *mut std::ffi::c_void;

/// A block for `layout` from `plain`, or from `aligned` when the layout
/// needs more alignment than every block has.
///
/// # Safety
/// `layout` has a non-zero size (the GlobalAlloc contract).
#[inline]
unsafe fn allocate(layout: std::alloc::Layout, plain: Plain, aligned: Aligned) -> *mut u8 {
    let (size, align) = (layout.size(), layout.align());
    // SAFETY: mimalloc's allocation calls, for a valid layout.
    unsafe {
        if natural(align, size) {
            plain(size).cast()
        } else {
            aligned(size, align).cast()
        }
    }
}

// SAFETY: each call hands mimalloc a layout the GlobalAlloc contract made
// valid, and frees only what mimalloc allocated.
unsafe impl std::alloc::GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_malloc, mi_malloc_aligned};
        // SAFETY: a plain allocation; null when out of memory.
        unsafe { allocate(layout, mi_malloc, mi_malloc_aligned) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_zalloc, mi_zalloc_aligned};
        // SAFETY: as in `alloc`.
        unsafe { allocate(layout, mi_zalloc, mi_zalloc_aligned) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from this allocator, that is from mimalloc.
        unsafe { libmimalloc_sys::mi_free(ptr.cast()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        use libmimalloc_sys::{mi_realloc, mi_realloc_aligned};
        let align = layout.align();
        // SAFETY: `ptr` came from mimalloc with `layout`; `size` is non-zero.
        unsafe {
            if natural(align, size) {
                mi_realloc(ptr.cast(), size).cast()
            } else {
                mi_realloc_aligned(ptr.cast(), size, align).cast()
            }
        }
    }
}

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "An edge reverse proxy with rate limiting built in"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve with the given config until SIGTERM or SIGINT.
    Run {
        #[arg(short, long, default_value = "/etc/tollgate/tollgate.yaml")]
        config: PathBuf,
        /// Reload the config file when it changes (a ConfigMap's symlink
        /// swap, an editor's rename), as SIGHUP does; a bad file keeps the
        /// running config.
        #[arg(long)]
        watch: bool,
    },
    /// Ask a running tollgate to reload its config file (`POST /api/reload`
    /// on its admin listener) and print what changed or every problem.
    /// The admin token, when one is set, is read from TOLLGATE_ADMIN_TOKEN.
    Reload {
        #[arg(long, default_value = "127.0.0.1:9090")]
        admin: String,
    },
    /// Translate an nginx config into a tollgate config: the YAML goes to
    /// --output (or stdout), every directive not translated to stderr with
    /// its file:line. Exit 0: everything that touches limiting, real IP or
    /// routing was translated; 2: something was not (the YAML is still
    /// written); 1: the nginx config could not be read.
    ImportNginx {
        /// The nginx config (its includes are read too).
        nginx_conf: PathBuf,
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Translate Kubernetes Ingress objects with ingress-nginx annotations
    /// (files of manifests, several documents or a `kind: List` each; stdin
    /// without files or with -) into Helm values for deploy/helm/tollgate:
    /// routes, upstreams by the Services' DNS names, the rate limits as
    /// ingress-nginx applies them, the TLS Secrets. Every annotation not
    /// translated goes to stderr with its object. Exit 0, 2 (something that
    /// changes limiting, access or routing was not translated; the values
    /// are still written) or 1 (the manifests could not be read).
    ImportIngress {
        files: Vec<PathBuf>,
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Ingresses of another class are skipped (none set: imported).
        #[arg(long, default_value = "nginx")]
        ingress_class: String,
        /// The cluster's DNS domain: targets are <service>.<namespace>.svc.<domain>.
        #[arg(long, default_value = "cluster.local")]
        cluster_domain: String,
    },
    /// What a config would have done to the traffic of access logs (nginx
    /// `combined` or tollgate's JSON): replayed in time order through its
    /// routes, zones and limits on a virtual clock, on the memory store,
    /// nothing sent anywhere. Prints per route and per limit the requests,
    /// would-be refusals, keys refused most, first and last refusal and
    /// the busiest second. Exit 0, or 1 when a config or log cannot be read.
    Replay {
        #[arg(short, long)]
        config: PathBuf,
        /// Also replay through this config and print what changed.
        #[arg(long)]
        against: Option<PathBuf>,
        /// `text` or `json`.
        #[arg(long, default_value = "text")]
        format: ReplayFormat,
        /// The Host header every request is given (logs hold none).
        #[arg(long)]
        host: Option<String>,
        /// Write one line per request: log:line, logged status, replayed
        /// status, the limit that refused it (or -).
        #[arg(long)]
        decisions: Option<PathBuf>,
        /// How far a log's line order may stray from the requests' arrival
        /// (a log is written as requests end): lines are put back in
        /// arrival order within it. Default: the longest request in the
        /// logs (tollgate's `duration_ms`; 0 for nginx's combined).
        #[arg(long, value_parser = tollgate::replay::parse_window)]
        window: Option<std::time::Duration>,
        /// Access logs, merged in time order.
        #[arg(required = true)]
        logs: Vec<PathBuf>,
    },
    /// Validate a config file: print every problem and exit 1, or a summary and exit 0.
    Check {
        #[arg(short, long, default_value = "/etc/tollgate/tollgate.yaml")]
        config: PathBuf,
        /// Also connect to the rate-limit store (Redis) and load its script.
        #[arg(long)]
        connect: bool,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ReplayFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config, connect } => check(&config, connect),
        Command::Reload { admin } => reload(&admin),
        Command::ImportNginx { nginx_conf, output } => {
            imports::import_nginx(&nginx_conf, output.as_deref())
        }
        Command::ImportIngress {
            files,
            output,
            ingress_class,
            cluster_domain,
        } => imports::import_ingress(
            &files,
            output.as_deref(),
            &tollgate::import::IngressOptions {
                class: ingress_class,
                cluster_domain,
            },
        ),
        Command::Replay {
            config,
            against,
            format,
            host,
            decisions,
            window,
            logs,
        } => {
            let options = tollgate::replay::Options {
                logs,
                host,
                decisions,
                window,
            };
            replay(&config, against.as_deref(), format, &options)
        }
        Command::Run { config, watch } => match run(&config, watch) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tollgate: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

fn load(path: &Path) -> Result<Config, ExitCode> {
    Config::from_file(path).map_err(|e| {
        match &e {
            ConfigError::Invalid(problems) => {
                eprintln!(
                    "tollgate: {} has {} problem(s):",
                    path.display(),
                    problems.len()
                );
                for p in problems {
                    eprintln!("  {p}");
                }
            }
            ConfigError::Read { .. } => eprintln!("tollgate: {e}"),
        }
        ExitCode::FAILURE
    })
}

fn check(path: &Path, connect: bool) -> ExitCode {
    match load(path) {
        Ok(config) => {
            out(&format!("tollgate: {} is valid\n\n", path.display()));
            out(&config.summary());
            if connect {
                return check_store(&config);
            }
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

fn replay(
    config: &Path,
    against: Option<&Path>,
    format: ReplayFormat,
    options: &tollgate::replay::Options,
) -> ExitCode {
    let run = |path: &Path, options: &tollgate::replay::Options| {
        let config = load(path)?;
        tollgate::replay::replay(config, &path.display().to_string(), options).map_err(|e| {
            eprintln!("tollgate: {e}");
            ExitCode::FAILURE
        })
    };
    let new = match run(config, options) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let old = match against {
        None => None,
        Some(path) => {
            // The decisions file is the new config's.
            let options = tollgate::replay::Options {
                decisions: None,
                ..options.clone()
            };
            match run(path, &options) {
                Ok(r) => Some(r),
                Err(code) => return code,
            }
        }
    };
    match (format, &old) {
        (ReplayFormat::Text, None) => out(&new.text()),
        (ReplayFormat::Text, Some(old)) => {
            out(&new.text());
            out(&format!("\nagainst {}:\n", old.config));
            out(&tollgate::replay::diff(&new, old));
        }
        (ReplayFormat::Json, _) => {
            let doc = match &old {
                None => serde_json::to_value(&new),
                Some(old) => {
                    serde_json::to_value(serde_json::json!({ "replay": &new, "against": old }))
                }
            };
            match doc.and_then(|d| serde_json::to_string_pretty(&d)) {
                Ok(text) => out(&format!("{text}\n")),
                Err(e) => {
                    eprintln!("tollgate: cannot write the report: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    ExitCode::SUCCESS
}

/// Writes to stdout. A reader that went away (`tollgate check | head`)
/// ends the output quietly, where `print!` would panic.
fn out(text: &str) {
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// A one-thread runtime for the short commands.
fn small_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("tollgate: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        })
}

/// `check --connect`: reaches the store and loads the script, or says why not.
fn check_store(config: &Config) -> ExitCode {
    let runtime = match small_runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let result: Result<String, String> = runtime.block_on(async {
        let engine = tollgate::limiter::Engine::open(
            config.store.redis.as_ref(),
            &config.store_zones,
            tollgate::clock::Clock::system(),
        )
        .await?;
        match engine.redis() {
            None => Ok("memory (nothing to connect to)".to_owned()),
            Some(redis) => {
                let (version, loaded) = redis.check_connection().await?;
                Ok(format!("Redis {version}: connected, {loaded}"))
            }
        }
    });
    match result {
        Ok(what) => {
            out(&format!("\nstore: {what}\n"));
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("tollgate: the rate-limit store is not reachable: {why}");
            ExitCode::FAILURE
        }
    }
}

fn run(path: &Path, watch: bool) -> anyhow::Result<()> {
    let config = match load(path) {
        Ok(c) => c,
        Err(_) => anyhow::bail!("refusing to start with an invalid config"),
    };
    tollgate::logging::init(&config.log);
    // The accepting runtime; connections run on it too with one worker,
    // else on the worker threads (`listener::workers`).
    let runtime = tollgate::listener::event_loop().context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let server = Server::bind(config).await?.with_source(path.to_owned());
        reload_on_sighup(server.reload_handle());
        if watch {
            server.watch_source(std::time::Duration::from_secs(5));
        }
        for (name, addr) in server.addrs() {
            tracing::info!(listener = %name, %addr, "listening");
        }
        if let Some(addr) = server.admin_addr() {
            tracing::info!(%addr, "admin listening");
        }
        server.run(shutdown_signal()).await;
        Ok(())
    })
}

/// Reloads the config file on every SIGHUP (the outcome is logged).
fn reload_on_sighup(handle: tollgate::reload::ReloadHandle) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::hangup()) {
            Ok(mut hup) => {
                tokio::spawn(async move {
                    while hup.recv().await.is_some() {
                        let _ = handle.reload().await;
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP: reload through the admin API")
            }
        }
    }
    #[cfg(not(unix))]
    let _ = handle;
}

/// `tollgate reload --admin ADDR`: asks, prints the answer, exits 0 when
/// the new config is in place.
fn reload(admin: &str) -> ExitCode {
    let runtime = match small_runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let token = std::env::var("TOLLGATE_ADMIN_TOKEN").ok();
    match runtime.block_on(post_reload(admin, token.as_deref())) {
        Ok((200, body)) => {
            out("tollgate: reloaded\n");
            print_changes(&body);
            ExitCode::SUCCESS
        }
        Ok((status, body)) => {
            let detail = body["detail"].as_str().unwrap_or("refused");
            eprintln!("tollgate: reload refused ({status}): {detail}");
            for p in body["problems"].as_array().into_iter().flatten() {
                eprintln!("  {}", p.as_str().unwrap_or_default());
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("tollgate: cannot reach the admin listener at {admin}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_changes(body: &serde_json::Value) {
    let Some(changes) = body["changes"].as_object() else {
        return;
    };
    for (what, items) in changes {
        let items: Vec<&str> = items
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i.as_str())
            .collect();
        if !items.is_empty() {
            out(&format!(
                "  {}: {}\n",
                what.replace('_', " "),
                items.join(", ")
            ));
        }
    }
}

async fn post_reload(admin: &str, token: Option<&str>) -> anyhow::Result<(u16, serde_json::Value)> {
    use http_body_util::{BodyExt, Empty};
    let tcp = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        tokio::net::TcpStream::connect(admin),
    )
    .await
    .context("connecting timed out")??;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let mut req = http::Request::post("/api/reload").header("host", admin);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        sender.send_request(req.body(Empty::<bytes::Bytes>::new())?),
    )
    .await
    .context("no answer within 60s")??;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    Ok((status, json))
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod tests {
    use std::alloc::{GlobalAlloc, Layout};

    use super::Allocator;

    /// Every block is aligned as its layout asks and keeps its bytes when
    /// it grows or shrinks, on both sides of the 16-byte and 1 KiB lines.
    #[test]
    fn blocks_are_aligned_and_keep_their_bytes_across_realloc() {
        let sizes = [1, 8, 15, 16, 24, 48, 1000, 1024, 1025, 4096, 70_000];
        for align in [1, 8, 16, 32, 64, 4096] {
            for &size in &sizes {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: non-zero sizes; every block is used within its
                // size and freed or reallocated with the layout it has.
                unsafe {
                    let zeroed = Allocator.alloc_zeroed(layout);
                    assert_eq!(zeroed as usize % align, 0, "zeroed {size} @ {align}");
                    assert!((0..size).all(|i| *zeroed.add(i) == 0));
                    Allocator.dealloc(zeroed, layout);

                    let mut p = Allocator.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "{size} @ {align}");
                    for i in 0..size {
                        *p.add(i) = i as u8;
                    }
                    for new in [size * 3, size.div_ceil(2)] {
                        let q = Allocator.realloc(p, layout, new);
                        assert_eq!(q as usize % align, 0, "{size} -> {new} @ {align}");
                        let kept = size.min(new);
                        assert!((0..kept).all(|i| *q.add(i) == i as u8), "{size} -> {new}");
                        let grown = Layout::from_size_align(new, align).unwrap();
                        p = Allocator.realloc(q, grown, size);
                        assert_eq!(p as usize % align, 0, "{new} -> {size} @ {align}");
                        assert!((0..kept).all(|i| *p.add(i) == i as u8));
                        for i in kept..size {
                            *p.add(i) = i as u8;
                        }
                    }
                    Allocator.dealloc(p, layout);
                }
            }
        }
    }
}
