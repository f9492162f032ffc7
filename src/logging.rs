//! Log output: `pretty` for people, `json` (one object per line) for log
//! pipelines. Access-log events use the target `tollgate::access`, so
//! `level: "info,tollgate::access=off"` silences them alone.
//!
//! The `h2` crate warns once per frame a peer gets wrong (a PING ACK
//! nobody asked for, a frame on a reset stream): a log flood the client
//! controls. Those warnings are counted (`tollgate_http2_peer_noise_total`)
//! and not printed, unless the level names `h2` itself.

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{LogConfig, LogFormat};

/// Counts the `h2` crate's warnings.
struct H2Noise;

impl<S: Subscriber> Layer<S> for H2Noise {
    fn on_event(&self, _event: &Event<'_>, _cx: Context<'_, S>) {
        crate::metrics::h2_noise_seen();
    }
}

/// The filter directives for `level`: `h2` quiet below `error` unless the
/// directives name it.
fn directives(level: &str) -> String {
    if level.split(',').any(|d| d.trim().starts_with("h2")) {
        level.to_owned()
    } else {
        format!("{level},h2=error")
    }
}

/// Installs the global subscriber. `RUST_LOG`, when set, overrides
/// `log.level`.
pub fn init(cfg: &LogConfig) {
    let level = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| EnvFilter::try_new(v).is_ok())
        .unwrap_or_else(|| cfg.level.clone());
    let filter = EnvFilter::new(directives(&level));
    let out = tracing_subscriber::fmt::layer().with_writer(std::io::stdout);
    let out = match cfg.format {
        LogFormat::Json => out
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_filter(filter)
            .boxed(),
        LogFormat::Pretty => out.compact().with_filter(filter).boxed(),
    };
    let noise = H2Noise.with_filter(Targets::new().with_target("h2", Level::WARN));
    // Only fails if a subscriber is already installed (tests): keep that one.
    let _ = tracing_subscriber::registry()
        .with(out)
        .with(noise)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h2_stays_quiet_unless_named() {
        assert_eq!(directives("info"), "info,h2=error");
        assert_eq!(
            directives("debug,tollgate::access=off"),
            "debug,tollgate::access=off,h2=error"
        );
        assert_eq!(directives("info,h2=debug"), "info,h2=debug");
    }
}
