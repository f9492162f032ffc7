//! When a request goes on to another target: nginx's
//! `proxy_next_upstream` conditions, `_tries` and `_timeout`, by nginx's
//! rules (`ngx_http_upstream_next`, `ngx_http_upstream_test_next`):
//!
//! - a connect error, a timeout or an invalid answer head is always a
//!   failure of the target (it counts towards `max_fails`); the request
//!   goes on only when its condition is listed;
//! - an answer whose status is listed (`http_502`...) is dropped and the
//!   request goes on while tries are left (a failure, except 403 and
//!   404); on the last try it is passed on as it came. An unlisted status,
//!   429 included, is an answer like any other;
//! - nothing is sent twice that cannot be: a request whose body was
//!   streamed (larger than `max_body`, or of unknown length) goes on only
//!   if none of it was sent, and POST, PATCH and LOCK only with
//!   `non_idempotent` listed;
//! - never after any byte of the answer reached the client: the answer
//!   head is the last point a retry is decided.

use std::time::Instant;

use http::Method;

pub use crate::config::Failure;
use crate::config::NextUpstream;

const NON_IDEMPOTENT: u16 = 1 << 10;

/// One request's retries.
pub struct Retries<'a> {
    policy: &'a NextUpstream,
    /// POST, PATCH or LOCK, without `non_idempotent` listed.
    once_sent: bool,
    /// Its body can be sent again (none, or kept whole).
    replayable: bool,
    /// Targets tried at most.
    limit: u32,
    pub tried: u32,
    started: Instant,
}

impl<'a> Retries<'a> {
    pub fn new(
        policy: &'a NextUpstream,
        method: &Method,
        replayable: bool,
        targets: usize,
        started: Instant,
    ) -> Self {
        let targets = targets as u32;
        Retries {
            policy,
            once_sent: is_non_idempotent(method) && policy.on & NON_IDEMPOTENT == 0,
            replayable,
            limit: match policy.tries {
                0 => targets,
                n => n.min(targets),
            },
            tried: 0,
            started,
        }
    }

    /// Whether another attempt may start at `now` after `failure` (`sent`:
    /// some of the request may have reached the target).
    pub fn go_on(&self, failure: Failure, sent: bool, now: Instant) -> bool {
        self.policy.on & failure.bit() != 0
            && (!sent || (self.replayable && !self.once_sent))
            && self.left(now)
    }

    /// Whether tries and time are left for another attempt.
    fn left(&self, now: Instant) -> bool {
        self.tried < self.limit
            && self
                .policy
                .timeout
                .is_none_or(|t| now.saturating_duration_since(self.started) < t)
    }

    /// The condition an answer's `status` meets when it is listed and a
    /// retry may follow: the answer is then dropped for the next target.
    pub fn on_status(&self, status: u16, now: Instant) -> Option<Failure> {
        let failure = Failure::of_status(status)?;
        self.go_on(failure, true, now).then_some(failure)
    }

    /// Whether a request body up to `length` bytes is read whole first, so
    /// a retry can send it again.
    pub fn keeps_body(
        policy: &NextUpstream,
        method: &Method,
        length: Option<u64>,
        targets: usize,
    ) -> bool {
        targets > 1
            && policy.tries != 1
            && policy.on & !NON_IDEMPOTENT != 0
            && (!is_non_idempotent(method) || policy.on & NON_IDEMPOTENT != 0)
            && length.is_some_and(|n| n > 0 && n <= policy.max_body)
    }
}

/// nginx's non-idempotent methods: never passed on once sent unless
/// `non_idempotent` is listed.
fn is_non_idempotent(m: &Method) -> bool {
    *m == Method::POST || *m == Method::PATCH || m.as_str() == "LOCK"
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn policy(on: &[&str], tries: u32) -> NextUpstream {
        NextUpstream {
            on: on
                .iter()
                .map(|c| NextUpstream::bit(c).unwrap())
                .fold(0, |a, b| a | b),
            tries,
            ..NextUpstream::default()
        }
    }

    #[test]
    fn nginx_rules_for_going_on() {
        let now = crate::clock::FrozenClock::new().clock().now();
        let p = NextUpstream::default();
        let get = Retries::new(&p, &Method::GET, true, 3, now);
        assert!(get.go_on(Failure::Error, true, now));
        assert!(get.go_on(Failure::Timeout, true, now));
        assert!(!get.go_on(Failure::InvalidHeader, false, now));
        assert_eq!(get.on_status(502, now), None);
        // POST: on only when nothing was sent, unless non_idempotent.
        let post = Retries::new(&p, &Method::POST, true, 3, now);
        assert!(post.go_on(Failure::Error, false, now));
        assert!(!post.go_on(Failure::Error, true, now));
        let p2 = policy(&["error", "non_idempotent"], 0);
        assert!(Retries::new(&p2, &Method::POST, true, 3, now).go_on(Failure::Error, true, now));
        // A streamed body is not sent twice.
        assert!(!Retries::new(&p, &Method::PUT, false, 3, now).go_on(Failure::Error, true, now));
        // Listed statuses, tries.
        let p3 = policy(&["http_502", "http_429"], 2);
        let mut r = Retries::new(&p3, &Method::GET, true, 3, now);
        r.tried = 1;
        assert_eq!(r.on_status(502, now), Some(Failure::Http502));
        assert_eq!(r.on_status(503, now), None);
        r.tried = 2;
        assert_eq!(r.on_status(502, now), None, "the last try passes it on");
        assert!(Failure::Http429.marks() && !Failure::Http404.marks());
    }

    #[test]
    fn each_failure_is_its_condition_bit() {
        for f in Failure::ALL {
            assert_eq!(NextUpstream::bit(f.name()), Some(f.bit()));
        }
        assert_eq!(NextUpstream::bit("non_idempotent"), Some(NON_IDEMPOTENT));
    }

    #[test]
    fn timeout_bounds_the_attempts() {
        let now = crate::clock::FrozenClock::new().clock().now();
        let p = NextUpstream {
            timeout: Some(Duration::from_secs(1)),
            ..NextUpstream::default()
        };
        let r = Retries::new(&p, &Method::GET, true, 3, now);
        assert!(r.go_on(Failure::Error, true, now + Duration::from_millis(900)));
        assert!(!r.go_on(Failure::Error, true, now + Duration::from_secs(1)));
    }
}
