//! Which target a request goes to: nginx's smooth weighted round robin
//! (`ngx_http_upstream_get_peer`), in nginx's order. Each pick adds every
//! usable target's weight to its current weight, takes the target with
//! the highest (the first of equals), and takes the round's total weight
//! off it: weights 5:1:1 give a a b a c a a, spread rather than bunched.
//! Backup targets are a round of their own, picked from only when no
//! primary target is usable; a target marked `down` is never picked.
//!
//! One state per upstream, shared by every worker of the process (a
//! short lock per pick); an upstream of one target keeps none.

use std::sync::Mutex;

use crate::config::Target;

pub struct Balancer {
    /// Per target, from its config.
    weights: Box<[i64]>,
    backup: Box<[bool]>,
    down: Box<[bool]>,
    /// Smooth round robin's current weights, per target.
    current: Mutex<Box<[i64]>>,
}

impl Balancer {
    pub fn new(targets: &[Target]) -> Self {
        Balancer {
            weights: targets.iter().map(|t| i64::from(t.weight)).collect(),
            backup: targets.iter().map(|t| t.backup).collect(),
            down: targets.iter().map(|t| t.down).collect(),
            current: Mutex::new(vec![0; targets.len()].into()),
        }
    }

    /// The next target among those `usable` says may take the request
    /// (not tried yet, not cooling down...): a primary if any is, else a
    /// backup; `None` when none is.
    pub fn pick(&self, usable: impl Fn(usize) -> bool) -> Option<usize> {
        if self.weights.len() == 1 {
            return (!self.down[0] && usable(0)).then_some(0);
        }
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        self.round(&mut current, false, &usable)
            .or_else(|| self.round(&mut current, true, &usable))
    }

    fn round(
        &self,
        current: &mut [i64],
        backup: bool,
        usable: &impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let mut total = 0;
        let mut best: Option<usize> = None;
        for i in 0..self.weights.len() {
            if self.backup[i] != backup || self.down[i] || !usable(i) {
                continue;
            }
            current[i] += self.weights[i];
            total += self.weights[i];
            if best.is_none_or(|b| current[i] > current[b]) {
                best = Some(i);
            }
        }
        let best = best?;
        current[best] -= total;
        Some(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(spec: &[(u32, bool, bool)]) -> Vec<Target> {
        spec.iter()
            .enumerate()
            .map(|(i, &(weight, backup, down))| Target {
                authority: format!("127.0.0.1:{}", 9000 + i),
                host: "127.0.0.1".into(),
                port: 9000 + i as u16,
                weight,
                backup,
                down,
                max_fails: 1,
                fail_timeout: None,
            })
            .collect()
    }

    fn sequence(b: &Balancer, n: usize, usable: impl Fn(usize) -> bool) -> String {
        (0..n)
            .map(|_| b.pick(&usable).map_or('-', |i| (b'a' + i as u8) as char))
            .collect()
    }

    #[test]
    fn weights_are_spread_smoothly_in_nginx_order() {
        let b = Balancer::new(&targets(&[
            (5, false, false),
            (1, false, false),
            (1, false, false),
        ]));
        assert_eq!(sequence(&b, 14, |_| true), "aabacaaaabacaa");
        let even = Balancer::new(&targets(&[(1, false, false); 3]));
        assert_eq!(sequence(&even, 6, |_| true), "abcabc");
    }

    #[test]
    fn backups_only_when_no_primary_is_usable_and_down_never() {
        let b = Balancer::new(&targets(&[
            (1, false, false),
            (1, false, true),
            (1, true, false),
        ]));
        assert_eq!(sequence(&b, 3, |_| true), "aaa");
        assert_eq!(sequence(&b, 2, |i| i != 0), "cc");
        assert_eq!(sequence(&b, 1, |i| i == 1), "-");
        let one = Balancer::new(&targets(&[(3, false, true)]));
        assert_eq!(sequence(&one, 1, |_| true), "-");
    }
}
