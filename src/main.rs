//! The `tollgate` binary: parse arguments, load the config, bind, run.
//! Everything else lives in the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tollgate::{Config, ConfigError, Server};

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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config, connect } => check(&config, connect),
        Command::Run { config } => match run(&config) {
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
            println!("tollgate: {} is valid\n", path.display());
            print!("{}", config.summary());
            if connect {
                return check_store(&config);
            }
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

/// `check --connect`: reaches the store and loads the script, or says why not.
fn check_store(config: &Config) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tollgate: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: Result<String, String> = runtime.block_on(async {
        let engine = tollgate::limiter::engine::Engine::open(
            config.store.redis.as_ref(),
            &config.store_zones,
        )
        .await?;
        match engine.redis() {
            None => Ok("memory (nothing to connect to)".to_owned()),
            Some(redis) => {
                let version = redis.check_connection().await?;
                Ok(format!("Redis {version}: connected, script loaded"))
            }
        }
    });
    match result {
        Ok(what) => {
            println!("\nstore: {what}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("tollgate: the rate-limit store is not reachable: {why}");
            ExitCode::FAILURE
        }
    }
}

fn run(path: &Path) -> anyhow::Result<()> {
    let config = match load(path) {
        Ok(c) => c,
        Err(_) => anyhow::bail!("refusing to start with an invalid config"),
    };
    tollgate::logging::init(&config.log);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let server = Server::bind(config).await?;
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
