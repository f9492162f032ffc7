//! A request on a Redis Cluster: its checks on different client keys live
//! in different slots, each slot's part decided by its own script call,
//! all at once; the parts' decisions merged into the outcome one script
//! would give, and what a part charged for a group another part refused
//! given back (`refund.lua`).

use super::super::{groups, stops, Check, Decision, LimiterError};
use super::RedisStore;

impl RedisStore {
    /// One script call, or on a cluster one per client key (see the
    /// module docs), merged.
    pub(super) async fn send(
        &self,
        checks: &[Check<'_>],
        now: u64,
    ) -> Result<Vec<Decision>, LimiterError> {
        if !self.cluster || checks.iter().all(|c| c.key == checks[0].key) {
            return Ok(self.call(checks, now).await?.1);
        }
        let mut parts: Vec<(&str, Vec<usize>)> = Vec::new();
        for (i, c) in checks.iter().enumerate() {
            match parts.iter_mut().find(|(k, _)| *k == c.key) {
                Some((_, idx)) => idx.push(i),
                None => parts.push((c.key, vec![i])),
            }
        }
        let subsets: Vec<Vec<Check<'_>>> = parts
            .iter()
            .map(|(_, idx)| idx.iter().map(|&i| checks[i]).collect())
            .collect();
        let results =
            futures_util::future::join_all(subsets.iter().map(|sub| self.call(sub, now))).await;
        // Per check: its decision, and whether its part charged it.
        let mut merged: Vec<Option<(Decision, bool)>> = vec![None; checks.len()];
        let mut failure = None;
        let mut stamps = vec![0u64; parts.len()];
        for (p, result) in results.into_iter().enumerate() {
            match result {
                Ok((stamp, decided)) => {
                    stamps[p] = stamp;
                    let sub = &subsets[p];
                    let mut at = 0;
                    for group in groups(sub) {
                        let end = (at + group.len()).min(decided.len());
                        let admitted = decided.len() >= at + group.len()
                            && decided[at..end].iter().all(Decision::admitted);
                        for k in at..end {
                            let charged = admitted && !sub[k].peek;
                            merged[parts[p].1[k]] = Some((decided[k], charged));
                        }
                        at += group.len();
                    }
                }
                Err(e) => failure = Some(e),
            }
        }
        // The request's outcome, group by group, as one script would give.
        let mut decisions = Vec::with_capacity(checks.len());
        let mut keep = vec![false; checks.len()];
        let mut start = 0;
        if failure.is_none() {
            for group in groups(checks) {
                let end = start + group.len();
                let mut complete = true;
                for m in &merged[start..end] {
                    match m {
                        Some((d, _)) => decisions.push(*d),
                        None => complete = false,
                    }
                }
                let admitted = complete
                    && decisions[decisions.len() - group.len()..]
                        .iter()
                        .all(Decision::admitted);
                if admitted {
                    keep[start..end].iter_mut().for_each(|k| *k = true);
                }
                if !complete {
                    // A part stopped early although every earlier group was
                    // admitted: cannot happen; never guess an admission.
                    failure = Some(LimiterError::Unavailable(
                        "cluster parts answered inconsistently".into(),
                    ));
                    break;
                }
                if stops(group, &decisions[decisions.len() - group.len()..]) {
                    break;
                }
                start = end;
            }
        }
        // Give back what a part charged but the request as a whole did not.
        for (p, (_, idx)) in parts.iter().enumerate() {
            let back: Vec<Check<'_>> = idx
                .iter()
                .filter(|&&i| merged[i].is_some_and(|(_, charged)| charged) && !keep[i])
                .map(|&i| checks[i])
                .collect();
            if !back.is_empty() {
                self.spawn_refund(&back, stamps[p]);
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(decisions),
        }
    }
}
