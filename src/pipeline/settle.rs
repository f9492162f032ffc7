//! Costs settled after the answer (a route limit's `settle`): admission
//! reserved the request's cost (its estimate) in every limit of the
//! request, all or nothing; the answer tells the real cost, from a
//! response header (settled as the head arrives), a trailer or the last
//! server-sent event naming it (settled when the body ends). The unused
//! part goes back, the extra is charged even past the limit, and an
//! answer that never says (an upstream that failed, timed out, or sent no
//! cost) keeps or refunds the reservation as `on_failure` says.
//!
//! The bound: admitted cost never exceeds a limit by more than the extra
//! settled on calls already admitted; a key that went over is refused
//! until its balance recovers.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;

use super::body::HeadLines;
use crate::clock::Clock;
use crate::config::{OnSettleFailure, Settle, SettleFrom};
use crate::limiter::engine::Engine;
use crate::limiter::Limit;
use crate::metrics::Metrics;

/// One limit's reservation for one request.
#[derive(Debug)]
pub struct Reserved {
    /// The numbers it was reserved under (a plan's, an override's).
    pub limit: Limit,
    pub key: String,
    pub units: u64,
    pub settle: Settle,
    /// Reserved in this process's memory (the store's failure mode).
    pub degraded: bool,
    /// For metrics: the limit's index and the caller's plan.
    pub metric: usize,
    pub plan: Option<u8>,
    /// When it was reserved (ms on the pipeline's clock).
    pub at_ms: u64,
}

/// What the answer said a reservation really cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reported {
    Units(u64),
    /// The answer ended without saying.
    Missing,
    /// The upstream failed or timed out.
    Failed,
}

/// A number as an upstream reports a cost: digits, maybe a fraction
/// (rounded up), nothing else.
fn units(text: &str) -> Option<u64> {
    let t = text.trim();
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    let n: u64 = whole.parse().ok()?;
    let up = frac.bytes().all(|b| b.is_ascii_digit()) && frac.bytes().any(|b| b != b'0');
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(n + u64::from(up))
}

fn from_headers(headers: &HeaderMap, name: &http::HeaderName) -> Reported {
    match headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(units)
    {
        Some(n) => Reported::Units(n),
        None => Reported::Missing,
    }
}

/// A response head as settlement reads it: the header map, and the
/// fields an HTTP/1.1 upstream's answer carries as lines beside it
/// ([`HeadLines`]: names in lower case, never in the map).
#[derive(Clone, Copy)]
pub struct Head<'a> {
    pub headers: &'a HeaderMap,
    pub lines: &'a [u8],
}

impl<'a> Head<'a> {
    /// The head of a response on its way to the client.
    pub fn of(resp: &'a http::Response<super::body::ProxyBody>) -> Self {
        Head {
            headers: resp.headers(),
            lines: &resp.body().lines().lines,
        }
    }

    /// The cost the field `name` reports, from the map or else the lines
    /// (the first of either).
    fn reported(&self, name: &http::HeaderName) -> Reported {
        if self.headers.contains_key(name) {
            return from_headers(self.headers, name);
        }
        let value = HeadLines::fields(self.lines)
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_str().as_bytes()))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
            .and_then(units);
        match value {
            Some(n) => Reported::Units(n),
            None => Reported::Missing,
        }
    }
}

/// Units more than reserved (fewer when negative), and what to count.
fn delta(r: &Reserved, reported: Reported) -> Option<i64> {
    let units = r.units as i64;
    match reported {
        Reported::Units(n) => Some(n.min(r.settle.max) as i64 - units),
        Reported::Missing | Reported::Failed => match r.settle.on_failure {
            OnSettleFailure::Keep => None,
            OnSettleFailure::Refund => Some(-units),
        },
    }
}

/// Settles `done` (reservations with what their answer said) in the store
/// that took them, and counts the units.
pub async fn settle(
    engine: &Engine,
    metrics: &Metrics,
    now_ms: u64,
    done: Vec<(Reserved, Reported)>,
) {
    let mut by_store: [Vec<(&Limit, &str, i64)>; 2] = Default::default();
    let mut ages = [0u64; 2];
    for (r, reported) in &done {
        let d = delta(r, *reported);
        let settled = match d {
            Some(d) => (r.units as i64 + d).max(0) as u64,
            None => r.units,
        };
        metrics.cost_units(r.metric, r.plan, settled, r.units);
        if let Some(d) = d.filter(|d| *d != 0) {
            let s = usize::from(r.degraded);
            by_store[s].push((&r.limit, &r.key, d));
            ages[s] = ages[s].max(now_ms.saturating_sub(r.at_ms));
        }
    }
    for (degraded, items) in by_store.iter().enumerate() {
        if !items.is_empty() {
            // (a failure is logged and counted by the engine)
            let _ = engine.settle(items, ages[degraded], degraded == 1).await;
        }
    }
}

/// The head has arrived: settles the reservations read from a header now
/// and returns the ones that wait for the body (`None` when none do).
pub async fn after_head(
    engine: &Arc<Engine>,
    metrics: &Metrics,
    clock: &Clock,
    reserved: Vec<Reserved>,
    head: Head<'_>,
) -> Option<Box<Watch>> {
    let (now, later): (Vec<_>, Vec<_>) = reserved
        .into_iter()
        .partition(|r| matches!(r.settle.from, SettleFrom::Header(_)));
    let done = now
        .into_iter()
        .map(|r| {
            let SettleFrom::Header(name) = &r.settle.from else {
                unreachable!("partitioned on it")
            };
            let reported = head.reported(name);
            (r, reported)
        })
        .collect();
    settle(engine, metrics, clock.unix_ms(), done).await;
    (!later.is_empty()).then(|| {
        Box::new(Watch {
            engine: engine.clone(),
            seen: vec![Reported::Missing; later.len()],
            reserved: later,
            line: Vec::new(),
        })
    })
}

/// The upstream failed before a head: every reservation's `on_failure`.
pub async fn failed(engine: &Engine, metrics: &Metrics, clock: &Clock, reserved: Vec<Reserved>) {
    let done = reserved
        .into_iter()
        .map(|r| (r, Reported::Failed))
        .collect();
    settle(engine, metrics, clock.unix_ms(), done).await;
}

/// Reservations waiting for the body: it watches the frames going to the
/// client for their trailer or event, and settles when the body ends.
pub struct Watch {
    engine: Arc<Engine>,
    reserved: Vec<Reserved>,
    seen: Vec<Reported>,
    /// An event line not ended yet (at most `MAX_LINE` bytes kept).
    line: Vec<u8>,
}

/// Longest server-sent event line looked into.
const MAX_LINE: usize = 64 << 10;

impl Watch {
    pub fn data(&mut self, data: &Bytes) {
        if !self
            .reserved
            .iter()
            .any(|r| matches!(r.settle.from, SettleFrom::Event(_)))
        {
            return;
        }
        let mut rest = &data[..];
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            if self.line.len() + nl <= MAX_LINE {
                self.line.extend_from_slice(&rest[..nl]);
                let line = std::mem::take(&mut self.line);
                self.event_line(&line);
            }
            self.line.clear();
            rest = &rest[nl + 1..];
        }
        if self.line.len() + rest.len() <= MAX_LINE {
            self.line.extend_from_slice(rest);
        }
    }

    /// One `data:` line of a server-sent event: a JSON object whose field
    /// names the cost (the last one seen wins).
    fn event_line(&mut self, line: &[u8]) {
        let Some(json) = line.strip_prefix(b"data:") else {
            return;
        };
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(json.trim_ascii()) else {
            return;
        };
        for (r, seen) in self.reserved.iter().zip(&mut self.seen) {
            if let SettleFrom::Event(path) = &r.settle.from {
                let found = path.iter().try_fold(&value, |v, f| v.get(f));
                let n =
                    found.and_then(|v| v.as_u64().or_else(|| v.as_f64().map(|f| f.ceil() as u64)));
                if let Some(n) = n {
                    *seen = Reported::Units(n);
                }
            }
        }
    }

    pub fn trailers(&mut self, trailers: &HeaderMap) {
        for (r, seen) in self.reserved.iter().zip(&mut self.seen) {
            if let SettleFrom::Trailer(name) = &r.settle.from {
                if let Reported::Units(n) = from_headers(trailers, name) {
                    *seen = Reported::Units(n);
                }
            }
        }
    }

    /// The body ended (`aborted`: not whole): settles in a task of its own.
    pub fn finish(self, metrics: Arc<Metrics>, now_ms: u64, aborted: bool) {
        let engine = self.engine;
        let done: Vec<_> = self
            .reserved
            .into_iter()
            .zip(self.seen)
            .map(|(r, seen)| match seen {
                Reported::Missing if aborted => (r, Reported::Failed),
                seen => (r, seen),
            })
            .collect();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { settle(&engine, &metrics, now_ms, done).await });
        }
    }
}

impl super::Pipeline {
    /// Settles what the request reserved, if anything: from the answer's
    /// head (`None`: the upstream failed before one), or, for a trailer or
    /// an event, when its body ends.
    pub(super) async fn settle(
        &self,
        cx: &mut super::ctx::Ctx<'_>,
        route: &crate::config::RouteConfig,
        head: Option<Head<'_>>,
    ) {
        if cx.reserved.is_empty() {
            return;
        }
        if let Some(t) = cx.end.trace.as_mut() {
            let units: u64 = cx.reserved.iter().map(|r| r.units).sum();
            t.cost_reserved = Some(units);
        }
        let mut reserved = std::mem::take(&mut cx.reserved);
        for r in &mut reserved {
            // (the route limit's index made the limit's metrics index)
            r.metric += self.limit_base[route.index];
        }
        let clock = self.engine.clock();
        match head {
            None => failed(&self.engine, &self.metrics, clock, reserved).await,
            Some(h) => {
                cx.end.watch = after_head(&self.engine, &self.metrics, clock, reserved, h).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_costs_read_as_whole_units_rounded_up() {
        assert_eq!(units("1234"), Some(1234));
        assert_eq!(units(" 12.5 "), Some(13));
        assert_eq!(units("12.0"), Some(12));
        for bad in ["", "-3", "12a", "1.2.3", "many"] {
            assert_eq!(units(bad), None, "{bad}");
        }
    }
}
