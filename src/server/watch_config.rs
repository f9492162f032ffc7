//! `tollgate run --watch`: the config file is reloaded when it changes,
//! as SIGHUP reloads it. A Kubernetes ConfigMap changes by an atomic swap
//! of a `..data` symlink in the file's directory (the file itself a
//! symlink through it), an editor by writing a new file and renaming it
//! over the old: so the directory is watched (inotify), not the file, and
//! what counts is the file's content as read through every link. A burst
//! of events (the kubelet's swap is several) is one reload, after things
//! have been quiet for `SETTLE`; a look every `every` catches what a
//! notification missed (a file system without inotify, a watch that
//! could not be set). A bad file keeps the running config, as SIGHUP
//! does: the reload logs why and counts it
//! (`tollgate_config_reloads_total{result="error"}`); the same content is
//! not tried again until it changes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::reload::ReloadHandle;

/// Quiet time after the last event before the file is read.
const SETTLE: Duration = Duration::from_millis(250);

/// Watches `path` until the runtime ends; reloads through `handle`.
pub fn watch(path: PathBuf, handle: ReloadHandle, every: Duration) {
    tokio::spawn(async move {
        let mut seen = digest(&path);
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_owned();
        let mut events = match notifications(&dir) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the config's directory; looking at the file every {}s", every.as_secs());
                None
            }
        };
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            use inotify::StreamExt;
            tokio::select! {
                got = async {
                    match events.as_mut() {
                        Some(s) => s.next().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if got.is_none() {
                        events = None;
                        continue;
                    }
                    // The rest of the burst.
                    if let Some(s) = events.as_mut() {
                        while let Ok(Some(_)) = tokio::time::timeout(SETTLE, s.next()).await {}
                    }
                }
                _ = tick.tick() => {}
            }
            let now = digest(&path);
            if now.is_none() || now == seen {
                continue;
            }
            seen = now;
            tracing::info!(config = %path.display(), "the config file changed; reloading");
            let _ = handle.reload().await;
        }
    });
}

type Events = inotify::EventStream<Vec<u8>>;

/// Events in `dir`: files created, written, moved in or out, removed.
fn notifications(dir: &Path) -> std::io::Result<Events> {
    use inotify::WatchMask;
    let inotify = inotify::Inotify::init()?;
    inotify.watches().add(
        dir,
        WatchMask::CREATE
            | WatchMask::CLOSE_WRITE
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM
            | WatchMask::DELETE
            | WatchMask::ATTRIB,
    )?;
    inotify.into_event_stream(vec![0u8; 4096])
}

/// The file's content as read through its links (`None`: unreadable,
/// as for a moment during a swap).
fn digest(path: &Path) -> Option<[u8; 32]> {
    std::fs::read(path).ok().map(|b| Sha256::digest(&b).into())
}
