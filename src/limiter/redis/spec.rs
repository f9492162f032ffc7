//! What one request's checks become in a script call: its keys and its
//! spec (see decide.lua), and the refund of what a cluster part charged
//! for a request another part refused (refund.lua).

use smallvec::SmallVec;

use super::batch::{self, Job};
use super::setup::params;
use super::{Check, RedisStore};

impl RedisStore {
    pub(super) fn spawn_refund(&self, checks: &[Check<'_>], stamp: u64) {
        let Ok((_, mut conn)) = self.link.get() else {
            return;
        };
        // Built now: the refund finishes after the request has gone.
        // On a cluster (the only place refunds are made) with a receipt:
        // the client's retry gives back once.
        let keys: Vec<String> = checks.iter().map(|c| self.key(c)).collect();
        let receipt = self.link.receipt(&keys[0], self.timeout);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.refund.get_hash())
            .arg(keys.len() + usize::from(receipt.is_some()))
            .arg(keys)
            .arg(&receipt)
            .arg(stamp);
        for c in checks {
            let (tag, p1, p2, p3) = params(&c.limit.algorithm, || stamp);
            cmd.arg(tag).arg(p1).arg(p2).arg(p3).arg(c.cost);
        }
        if let Some(r) = &receipt {
            cmd.arg(&r.last);
        }
        let (script, timeout) = (self.refund.clone(), self.timeout * 4);
        tokio::spawn(async move {
            if batch::evalsha::<i64>(&mut conn, &script, &cmd, timeout)
                .await
                .is_err()
            {
                tracing::warn!("rate-limit store: could not give back a refused request's charge; it expires with its key");
            }
        });
    }

    /// The script's part for one request, written with no formatting
    /// machinery: this runs for every request.
    pub(super) fn job(&self, checks: &[Check<'_>], now: u64) -> Job {
        let mut job = Job {
            keys: String::with_capacity(checks.len() * (self.prefix.len() + 40)),
            ends: SmallVec::new(),
            spec: String::with_capacity(checks.len() * 40),
            // (a cluster keeps the version in another slot: not checked)
            version: checks
                .first()
                .and_then(|c| c.overrides)
                .filter(|_| !self.cluster),
        };
        let mut digits = itoa::Buffer::new();
        for c in checks {
            let (tag, p1, p2, p3) = params(&c.limit.algorithm, || match now {
                0 => self.clock.unix_ms(),
                pinned => pinned,
            });
            for n in [tag, p1, p2, p3] {
                job.spec.push_str(digits.format(n));
                job.spec.push(',');
            }
            job.spec.push_str(digits.format(c.cost));
            job.spec.push_str(if c.peek { ",1," } else { ",0," });
            job.spec.push_str(digits.format(c.group));
            job.spec.push_str(if c.dry_run { ",1;" } else { ",0;" });
            self.write_key(c, &mut job.keys);
            job.ends.push(job.keys.len());
        }
        job
    }
}
