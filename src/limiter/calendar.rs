//! Calendar periods for quotas: a day, an ISO week (from Monday), a month
//! or a year, starting at local midnight in an IANA time zone, or a month
//! anchored on a billing day (day 31 falls on a month's last day).
//!
//! A period is `[start, end)` in Unix milliseconds, found from the instant
//! asked about, so daylight-saving changes (a 23- or 25-hour day), month
//! ends and leap years come from the zone's rules, never from a fixed
//! length. The rules are jiff's copy of the IANA database (built in, so a
//! container without `/usr/share/zoneinfo` counts the same periods).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// How long a period is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    Day,
    Week,
    Month,
    Year,
}

impl Period {
    /// The name it is configured by.
    pub fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
            Period::Year => "year",
        }
    }

    /// Its usual length, for what needs one number (a policy summary).
    pub fn nominal_ms(self) -> u64 {
        const DAY: u64 = 86_400_000;
        match self {
            Period::Day => DAY,
            Period::Week => 7 * DAY,
            Period::Month => 30 * DAY,
            Period::Year => 365 * DAY,
        }
    }
}

impl std::str::FromStr for Period {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "day" => Ok(Period::Day),
            "week" => Ok(Period::Week),
            "month" => Ok(Period::Month),
            "year" => Ok(Period::Year),
            _ => Err(format!("expected day, week, month or year, got \"{s}\"")),
        }
    }
}

/// An IANA time zone, compared by its name.
#[derive(Clone)]
pub struct Zone {
    name: Arc<str>,
    tz: TimeZone,
}

impl Zone {
    /// The zone named `name` (`Europe/Berlin`, `UTC`).
    pub fn named(name: &str) -> Result<Zone, String> {
        let tz = TimeZone::get(name).map_err(|_| {
            format!("unknown time zone \"{name}\"; use an IANA name such as \"Europe/Berlin\" or \"UTC\"")
        })?;
        Ok(Zone {
            name: Arc::from(name),
            tz,
        })
    }

    pub fn utc() -> Zone {
        Zone {
            name: Arc::from("UTC"),
            tz: TimeZone::UTC,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl PartialEq for Zone {
    fn eq(&self, other: &Zone) -> bool {
        self.name == other.name
    }
}
impl Eq for Zone {}
impl std::hash::Hash for Zone {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.name.hash(h)
    }
}
impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// A quota's periods: which length, in which zone, from which day.
#[derive(Debug, Clone)]
pub struct Calendar {
    pub period: Period,
    pub zone: Zone,
    /// A monthly period's first day (1-31; past a month's end, its last
    /// day); 0 for the calendar's own (the 1st).
    pub day: u8,
    /// Per day (0-31), the latest period found, as whole seconds packed
    /// in one word (start << 32 | end; 0: none): a decision within it
    /// costs two loads, not a time zone conversion. Shared by the
    /// calendar's clones and its other days (`anchored`).
    latest: Arc<[AtomicU64; 32]>,
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Calendar) -> bool {
        (self.period, &self.zone, self.day) == (other.period, &other.zone, other.day)
    }
}
impl Eq for Calendar {}
impl std::hash::Hash for Calendar {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.period, &self.zone, self.day).hash(h)
    }
}

impl Calendar {
    pub fn new(period: Period, zone: Zone) -> Calendar {
        Calendar {
            period,
            zone,
            day: 0,
            latest: Arc::new(std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    /// The same periods from another billing day (a key's own).
    pub fn anchored(&self, day: u8) -> Calendar {
        Calendar {
            day,
            ..self.clone()
        }
    }

    /// The period holding `now_ms`: its start and end, Unix ms.
    pub fn bounds(&self, now_ms: u64) -> (u64, u64) {
        let slot = &self.latest[usize::from(self.day) % 32];
        let packed = slot.load(Ordering::Relaxed);
        let (start, end) = ((packed >> 32) * 1000, (packed & 0xffff_ffff) * 1000);
        if now_ms >= start && now_ms < end {
            return (start, end);
        }
        let (s, e) = self.find(now_ms);
        // Kept when later than the one kept (an idle state's old period
        // asked about does not push it out) and in whole seconds below
        // 2^32 (zone offsets are whole seconds; dates to 2106).
        let (ss, es) = (s / 1000, e / 1000);
        if s > start && s % 1000 == 0 && e % 1000 == 0 && es <= u64::from(u32::MAX) {
            slot.store(ss << 32 | es, Ordering::Relaxed);
        }
        (s, e)
    }

    /// [`Calendar::bounds`], worked out from the zone's rules.
    fn find(&self, now_ms: u64) -> (u64, u64) {
        let today = instant(now_ms).to_zoned(self.zone.tz.clone()).date();
        let (start, end) = match self.period {
            Period::Day => (today, today.tomorrow().unwrap_or(today)),
            Period::Week => {
                let back = i64::from(today.weekday().to_monday_zero_offset());
                let monday = today.checked_sub(back.days()).unwrap_or(today);
                (monday, monday.checked_add(7.days()).unwrap_or(monday))
            }
            Period::Month => {
                let here = self.anchor(today.year(), today.month());
                if today >= here {
                    (here, self.anchor_after(here))
                } else {
                    let before = today.first_of_month().yesterday().unwrap_or(today);
                    (self.anchor(before.year(), before.month()), here)
                }
            }
            Period::Year => {
                let first = today.first_of_year();
                (first, first.checked_add(1.year()).unwrap_or(first))
            }
        };
        (self.midnight(start), self.midnight(end))
    }

    /// The billing day in month `m` of year `y`.
    fn anchor(&self, y: i16, m: i8) -> Date {
        let first = Date::new(y, m, 1).unwrap_or_default();
        let day = i8::try_from(self.day.max(1)).unwrap_or(31);
        Date::new(y, m, day.min(first.days_in_month())).unwrap_or(first)
    }

    /// The billing day of the month after `d`'s.
    fn anchor_after(&self, d: Date) -> Date {
        let next = d.last_of_month().tomorrow().unwrap_or(d);
        self.anchor(next.year(), next.month())
    }

    /// The first instant of day `d` in the zone (local midnight, or the
    /// end of a daylight-saving gap that swallowed it).
    fn midnight(&self, d: Date) -> u64 {
        d.to_zoned(self.zone.tz.clone())
            .map(|z| z.timestamp().as_millisecond().max(0) as u64)
            .unwrap_or(0)
    }

    /// `at_ms` as local time with its offset, RFC 3339
    /// (`2027-01-01T00:00:00+01:00`).
    pub fn local(&self, at_ms: u64) -> String {
        instant(at_ms)
            .to_zoned(self.zone.tz.clone())
            .strftime("%Y-%m-%dT%H:%M:%S%:z")
            .to_string()
    }
}

/// Unix ms as an instant (past jiff's range: its last).
fn instant(ms: u64) -> Timestamp {
    Timestamp::from_millisecond(ms.min(i64::MAX as u64) as i64).unwrap_or(Timestamp::MAX)
}

impl fmt::Display for Calendar {
    /// "month (Europe/Berlin)", "month from day 15 (UTC)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.period.name())?;
        if self.day > 1 {
            write!(f, " from day {}", self.day)?;
        }
        write!(f, " ({})", self.zone.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> u64 {
        s.parse::<Timestamp>().unwrap().as_millisecond() as u64
    }
    fn cal(p: Period, zone: &str) -> Calendar {
        Calendar::new(p, Zone::named(zone).unwrap())
    }

    #[test]
    fn days_follow_local_midnight_across_both_dst_changes() {
        let berlin = cal(Period::Day, "Europe/Berlin");
        // 2027-03-28: clocks go 02:00 -> 03:00, a 23-hour day
        let (s, e) = berlin.bounds(ms("2027-03-28T12:00:00Z"));
        assert_eq!(
            (s, e),
            (ms("2027-03-27T23:00:00Z"), ms("2027-03-28T22:00:00Z"))
        );
        assert_eq!(e - s, 23 * 3_600_000);
        // 2027-10-31: clocks go 03:00 -> 02:00, a 25-hour day
        let (s, e) = berlin.bounds(ms("2027-10-31T12:00:00Z"));
        assert_eq!(
            (s, e),
            (ms("2027-10-30T22:00:00Z"), ms("2027-10-31T23:00:00Z"))
        );
        assert_eq!(e - s, 25 * 3_600_000);
        // the last millisecond of a day and the first of the next
        let midnight = ms("2027-10-31T23:00:00Z");
        assert_eq!(berlin.bounds(midnight - 1).1, midnight);
        assert_eq!(berlin.bounds(midnight).0, midnight);
    }

    #[test]
    fn months_end_on_the_last_day_and_leap_years_count() {
        let ny = cal(Period::Month, "America/New_York");
        let (s, e) = ny.bounds(ms("2028-02-15T12:00:00Z"));
        assert_eq!(s, ms("2028-02-01T05:00:00Z"));
        assert_eq!(e, ms("2028-03-01T05:00:00Z"));
        assert_eq!(e - s, 29 * 86_400_000, "2028 is a leap year");
        // March in New York spans the spring change: 31 days less an hour
        let (s, e) = ny.bounds(ms("2028-03-20T12:00:00Z"));
        assert_eq!(e - s, 31 * 86_400_000 - 3_600_000);
        // a minute before local midnight on the 31st is still in March
        assert_eq!(ny.bounds(ms("2028-04-01T03:59:00Z")).0, s);
        assert_eq!(ny.bounds(ms("2028-04-01T04:00:00Z")).0, e);
    }

    #[test]
    fn billing_day_31_falls_on_each_months_last_day() {
        let c = cal(Period::Month, "UTC").anchored(31);
        let (s, e) = c.bounds(ms("2027-02-10T00:00:00Z"));
        assert_eq!(
            (s, e),
            (ms("2027-01-31T00:00:00Z"), ms("2027-02-28T00:00:00Z"))
        );
        let (s, e) = c.bounds(ms("2027-02-28T00:00:00Z"));
        assert_eq!(
            (s, e),
            (ms("2027-02-28T00:00:00Z"), ms("2027-03-31T00:00:00Z"))
        );
        let leap = c.bounds(ms("2028-02-29T10:00:00Z"));
        assert_eq!(leap.0, ms("2028-02-29T00:00:00Z"));
        let c15 = cal(Period::Month, "Asia/Tokyo").anchored(15);
        let (s, e) = c15.bounds(ms("2027-01-05T00:00:00Z"));
        assert_eq!(
            (s, e),
            (ms("2026-12-14T15:00:00Z"), ms("2027-01-14T15:00:00Z"))
        );
    }

    #[test]
    fn weeks_start_monday_and_years_on_the_first() {
        let w = cal(Period::Week, "UTC");
        // 2027-01-03 is a Sunday: its week began Monday 2026-12-28
        let (s, e) = w.bounds(ms("2027-01-03T23:59:59Z"));
        assert_eq!(
            (s, e),
            (ms("2026-12-28T00:00:00Z"), ms("2027-01-04T00:00:00Z"))
        );
        let y = cal(Period::Year, "Australia/Sydney");
        let (s, e) = y.bounds(ms("2028-06-01T00:00:00Z"));
        assert_eq!(
            (s, e),
            (ms("2027-12-31T13:00:00Z"), ms("2028-12-31T13:00:00Z"))
        );
    }

    #[test]
    fn a_remembered_period_answers_like_a_worked_out_one() {
        let c = cal(Period::Month, "Europe/Berlin");
        let billing = c.anchored(15);
        let mut t = ms("2027-01-01T00:00:00Z");
        while t < ms("2027-12-31T00:00:00Z") {
            assert_eq!(c.bounds(t), c.find(t), "{t}");
            assert_eq!(billing.bounds(t), billing.find(t), "{t}");
            // an old period asked about in between changes nothing
            assert_eq!(c.bounds(t - 40 * 86_400_000), c.find(t - 40 * 86_400_000));
            t += 3_600_000 * 7 + 59_999;
        }
        assert_eq!(
            c,
            cal(Period::Month, "Europe/Berlin"),
            "compared without the cache"
        );
        assert_ne!(c, billing);
    }

    #[test]
    fn unknown_zones_are_refused_by_name() {
        let e = Zone::named("Mars/Olympus").unwrap_err();
        assert!(e.contains("Mars/Olympus") && e.contains("IANA"), "{e}");
        assert_eq!(
            cal(Period::Day, "Europe/Berlin").local(ms("2027-01-01T00:00:00Z")),
            "2027-01-01T01:00:00+01:00"
        );
    }
}
