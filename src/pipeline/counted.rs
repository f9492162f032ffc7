//! What a request's limits decided, counted once it ends: metrics by
//! limit and outcome, the alert rules' views of it (rejections, a quota's
//! share used, a ban started), bypasses and delays.

use super::ctx::Ctx;
use super::{identity, Pipeline};
use crate::metrics::Outcome;

impl Pipeline {
    /// Counts what the request's limits decided, now that the identity (and
    /// so the user type) is known.
    pub(super) fn count(&self, cx: &Ctx<'_>) {
        let m = &self.metrics;
        if let Some(b) = cx.bypass {
            m.bypass(b as usize);
        }
        let authenticated = matches!(cx.identity, identity::Identity::User(_));
        let index = |origin| self.limit_index(origin, cx.route);
        for &(origin, outcome) in &cx.counted {
            if let Some(limit) = index(origin) {
                m.decision(limit, outcome, authenticated);
                if outcome != Outcome::Rejected && self.alerts.watches(limit) {
                    self.alerts.decided(limit, None);
                }
            }
        }
        for (origin, outcome, key) in &cx.rejected_keys {
            if let Some(limit) = index(*origin) {
                m.rejected_key(limit, key);
                if *outcome == Outcome::Rejected && self.alerts.watches(limit) {
                    self.alerts
                        .decided(limit, Some(crate::metrics::top::display(key)));
                }
            }
        }
        if cx.delayed_ms > 0 {
            m.delay(std::time::Duration::from_millis(cx.delayed_ms));
        }
        for (origin, key, used, quota) in &cx.quotas {
            if let Some(limit) = index(*origin).filter(|&l| self.alerts.watches(l)) {
                let shown = crate::metrics::top::display(key);
                self.alerts.quota(limit, shown, *used, *quota);
            }
        }
        if let Some((limit, key, level, seconds)) = &cx.banned {
            self.alerts.banned(limit, key, *level, *seconds);
        }
    }
}
