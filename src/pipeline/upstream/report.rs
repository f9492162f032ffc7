//! What the operator reads and changes on a running upstream: its
//! figures for metrics and the admin API, and drains.

use std::sync::atomic::Ordering;

use super::{Set, Upstream};
use crate::metrics::{TargetReport, UpstreamReport};

impl Upstream {
    /// This upstream's figures, for metrics and the admin API.
    pub fn report(&self) -> UpstreamReport {
        let now_ms = self.ms_at(self.clock.now());
        let unix_ms = self.clock.unix_ms();
        UpstreamReport {
            name: self.name.clone(),
            protect: self.gate.as_ref().map(|g| g.report()),
            all_failing_checks: self
                .checks
                .then(|| self.sent_all_failing.load(Ordering::Relaxed)),
            budget_refused: self
                .budget
                .as_ref()
                .map(|b| b.refused.load(Ordering::Relaxed)),
            resolve_failures: match &self.set {
                Set::Fixed(_) => None,
                Set::Resolved(r) => Some(r.failures.load(Ordering::Relaxed)),
            },
            targets: self
                .now()
                .targets
                .iter()
                .map(|t| {
                    let down_for = t
                        .health
                        .down_until()
                        .filter(|until| *until > now_ms)
                        .map(|until| until - now_ms);
                    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
                    TargetReport {
                        authority: t.authority.clone(),
                        backup: t.backup,
                        down: t.down,
                        draining: t.draining.load(Ordering::Relaxed),
                        down_until_unix_ms: down_for.map(|ms| unix_ms + ms),
                        in_flight: t.load(),
                        max_conns: t.max_conns,
                        ok: load(&t.stats.ok),
                        failures: t.stats.failures.each_ref().map(load),
                        retries: t.stats.retries.each_ref().map(load),
                        marked_down: load(&t.stats.marked_down),
                        check_failed: t.check_failed.load(Ordering::Relaxed),
                        checks: t.stats.checks.each_ref().map(load),
                        ramping: Some(t.ramp(unix_ms) as u16)
                            .filter(|&r| i64::from(r) < super::balancer::FULL),
                        last_failure: t.last_failure(),
                    }
                })
                .collect(),
            duration: self.duration.snapshot(),
            h2: self.may_speak_h2().then(|| self.h2_counts()),
        }
    }

    /// Drains `target` (no new requests; those in flight finish) or
    /// brings it back; false when it is not one of this upstream's.
    pub fn set_draining(&self, target: &str, draining: bool) -> bool {
        match self.now().targets.iter().find(|t| &*t.authority == target) {
            Some(t) => {
                t.draining.store(draining, Ordering::Relaxed);
                tracing::info!(upstream = %self.name, target, draining, "target drain set by the admin API");
                true
            }
            None => false,
        }
    }

    /// The balancing method, as configured.
    pub fn balance_name(&self) -> &str {
        &self.balance_name
    }

    /// A reload keeps this upstream: drains set by the admin API end.
    pub fn end_drains(&self) {
        for t in self.now().targets.iter() {
            if t.draining.swap(false, Ordering::Relaxed) {
                tracing::info!(upstream = %self.name, target = %t.authority, "reload: the target's drain ends");
            }
        }
    }
}
