//! The reload contract: how a reload is asked for (`ReloadHandle`: SIGHUP,
//! `POST /api/reload`, `tollgate reload`), what it reports and why it may
//! refuse. The swap itself, and what state a reload carries, are the
//! server's (`server/`), which owns the sockets and the request path.

use std::fmt;

use tokio::sync::{mpsc, oneshot};

/// What a reload changed, for its log line and the API's answer.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReloadReport {
    pub listeners_added: Vec<String>,
    pub listeners_removed: Vec<String>,
    pub routes_added: Vec<String>,
    pub routes_removed: Vec<String>,
    pub limits_added: Vec<String>,
    pub limits_removed: Vec<String>,
    /// Kept with their numbers changed: state rescaled.
    pub limits_rescaled: Vec<String>,
    /// Kept with another algorithm or key kind: state started fresh.
    pub limits_reset: Vec<String>,
    /// What the reload could not apply (needs a restart).
    pub warnings: Vec<String>,
}

/// Why a reload kept the running config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadError {
    /// The file was refused: every problem, with its YAML path.
    Invalid(Vec<String>),
    /// The new config could not be put in place (a port in use, Redis).
    Failed(String),
}

impl fmt::Display for ReloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReloadError::Invalid(p) => {
                write!(f, "the config has {} problem(s): {}", p.len(), p.join("; "))
            }
            ReloadError::Failed(why) => f.write_str(why),
        }
    }
}

pub type ReloadResult = Result<ReloadReport, ReloadError>;

/// Asks the running server to reload its config file (SIGHUP, `POST
/// /api/reload`); cheap to clone.
#[derive(Clone)]
pub struct ReloadHandle {
    pub(crate) tx: mpsc::Sender<oneshot::Sender<ReloadResult>>,
}

impl ReloadHandle {
    /// Reloads and waits for the outcome (reloads run one at a time).
    pub async fn reload(&self) -> ReloadResult {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(reply)
            .await
            .map_err(|_| ReloadError::Failed("the server is shutting down".into()))?;
        answer
            .await
            .map_err(|_| ReloadError::Failed("the server is shutting down".into()))?
    }
}
