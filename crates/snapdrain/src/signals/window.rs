//! Maintenance windows: graceful signals start plans only inside one; forceful ones never wait.
//!
//! A window opens at each minute its five-field cron schedule matches (minute, hour, day of month,
//! month, day of week; `*`, `a`, `a-b`, `*/n`, `a-b/n` and comma lists, numbers only, day of week 0-7 with
//! 0 and 7 for Sunday, as Vixie cron and Kubernetes CronJobs read it) in its time zone, and stays open
//! for its duration. As in cron, when both day fields are restricted a day matching either one counts.

use std::time::Duration;

use jiff::Zoned;
use jiff::tz::TimeZone;

use crate::api::policy::MaintenanceWindow;

/// A schedule field: the values it allows, as a bit set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Field {
    bits: u64,
    /// Written as `*` (for the day-of-month / day-of-week rule).
    any: bool,
}

impl Field {
    fn has(self, v: i8) -> bool {
        v >= 0 && self.bits & (1 << v) != 0
    }
}

fn parse_field(text: &str, lo: u8, hi: u8, what: &str) -> Result<Field, String> {
    let mut bits = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u8 = s
                    .parse()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| format!("{what}: step {s:?} is not a positive number"))?;
                (r, step)
            }
            None => (part, 1),
        };
        let number = |s: &str| -> Result<u8, String> {
            s.parse::<u8>()
                .ok()
                .filter(|v| (lo..=hi).contains(v))
                .ok_or_else(|| format!("{what}: {s:?} is not a number from {lo} to {hi}"))
        };
        let (from, to) = if range == "*" {
            (lo, hi)
        } else if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (number(a)?, number(b)?);
            if a > b {
                return Err(format!("{what}: range {range:?} runs backwards"));
            }
            (a, b)
        } else {
            let a = number(range)?;
            (a, if part.contains('/') { hi } else { a })
        };
        for v in (from..=to).step_by(usize::from(step)) {
            bits |= 1 << v;
        }
    }
    Ok(Field {
        bits,
        any: text == "*",
    })
}

/// A parsed five-field schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    minute: Field,
    hour: Field,
    day: Field,
    month: Field,
    weekday: Field,
}

impl Schedule {
    pub fn parse(text: &str) -> Result<Self, String> {
        let fields: Vec<&str> = text.split_whitespace().collect();
        let [m, h, d, mo, w] = fields[..] else {
            return Err(format!(
                "{text:?} has {} fields; a schedule has five: minute hour day-of-month month day-of-week",
                fields.len()
            ));
        };
        let mut weekday = parse_field(w, 0, 7, "day of week")?;
        // 7 is Sunday too.
        if weekday.bits & (1 << 7) != 0 {
            weekday.bits |= 1;
        }
        Ok(Self {
            minute: parse_field(m, 0, 59, "minute")?,
            hour: parse_field(h, 0, 23, "hour")?,
            day: parse_field(d, 1, 31, "day of month")?,
            month: parse_field(mo, 1, 12, "month")?,
            weekday,
        })
    }

    /// The day-of-month, month and day-of-week fields (cron: either day field matches when both are
    /// restricted).
    fn date_matches(&self, t: &Zoned) -> bool {
        let weekday = t.weekday().to_sunday_zero_offset();
        let day_ok = match (self.day.any, self.weekday.any) {
            (true, true) => true,
            (true, false) => self.weekday.has(weekday),
            (false, true) => self.day.has(t.day()),
            (false, false) => self.day.has(t.day()) || self.weekday.has(weekday),
        };
        day_ok && self.month.has(t.month())
    }

    #[cfg(test)]
    fn matches(&self, t: &Zoned) -> bool {
        self.date_matches(t) && self.minute.has(t.minute()) && self.hour.has(t.hour())
    }
}

/// A window ready to evaluate.
#[derive(Clone, Debug)]
pub struct Window {
    schedule: Schedule,
    duration: Duration,
    zone: TimeZone,
}

/// Longest window accepted: a week (the scan below walks back minute by minute).
pub const MAX_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

impl Window {
    pub fn new(spec: &MaintenanceWindow) -> Result<Self, String> {
        let schedule = Schedule::parse(&spec.schedule)?;
        let duration = crate::api::validate::parse_duration(&spec.duration)
            .filter(|d| !d.is_zero() && *d <= MAX_WINDOW)
            .ok_or_else(|| {
                format!(
                    "duration {:?} must be a Go duration above 0 and at most 168h",
                    spec.duration
                )
            })?;
        let zone = TimeZone::get(&spec.time_zone).map_err(|e| {
            format!(
                "time zone {:?}: {e} (an IANA name such as Europe/Berlin or UTC)",
                spec.time_zone
            )
        })?;
        Ok(Self {
            schedule,
            duration,
            zone,
        })
    }

    /// True when a start of this window lies in `(now - duration, now]`. Walks back from `now` a
    /// minute at a time, but jumps over a whole day whose date the schedule does not match and a whole
    /// hour it does not match (review I-3: a week-long window that never matches cost 10,080 steps per
    /// window on every signal evaluation; now a few hundred at most).
    pub fn open_at(&self, now: jiff::Timestamp) -> bool {
        let local = now.to_zoned(self.zone.clone());
        let Ok(mut t) = local.round(
            jiff::ZonedRound::new()
                .smallest(jiff::Unit::Minute)
                .mode(jiff::RoundMode::Trunc),
        ) else {
            return false;
        };
        let window = self.duration.as_secs_f64();
        let minute = jiff::Span::new().minutes(1);
        while now.duration_since(t.timestamp()).as_secs_f64() < window {
            let before = if !self.schedule.date_matches(&t) {
                // The last minute of the day before.
                t.start_of_day().and_then(|d| d.checked_sub(minute))
            } else if !self.schedule.hour.has(t.hour()) {
                // The last minute of the hour before.
                t.with()
                    .minute(0)
                    .build()
                    .and_then(|h| h.checked_sub(minute))
            } else if self.schedule.minute.has(t.minute()) {
                return true;
            } else {
                t.checked_sub(minute)
            };
            match before {
                // Always earlier (a zone transition could otherwise hold the walk in place).
                Ok(prev) if prev.timestamp() < t.timestamp() => t = prev,
                _ => return false,
            }
        }
        false
    }
}

/// True when graceful work may start now: no windows configured, or one of them is open.
pub fn open(windows: &[Window], now: jiff::Timestamp) -> bool {
    windows.is_empty() || windows.iter().any(|w| w.open_at(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(schedule: &str, duration: &str, zone: &str) -> Window {
        Window::new(&MaintenanceWindow {
            schedule: schedule.into(),
            duration: duration.into(),
            time_zone: zone.into(),
        })
        .expect("a valid window")
    }

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().expect("valid")
    }

    #[test]
    fn a_nightly_window_is_open_for_its_duration_in_its_zone() {
        // 02:00-06:00 Berlin time; 2026-12-01 is in CET (UTC+1).
        let w = window("0 2 * * *", "4h", "Europe/Berlin");
        assert!(!w.open_at(at("2026-12-01T00:59:00Z")), "01:59 local");
        assert!(w.open_at(at("2026-12-01T01:00:00Z")), "02:00 local");
        assert!(w.open_at(at("2026-12-01T04:59:59Z")), "05:59:59 local");
        assert!(!w.open_at(at("2026-12-01T05:00:00Z")), "06:00 local");
    }

    #[test]
    fn time_zones_resolve_without_a_zoneinfo_directory() {
        // The image has no /usr/share/zoneinfo: jiff falls back to the database compiled in (feature
        // tzdb-bundle-always, jiff src/tz/db/mod.rs `from_env`), which must know the zones and agree
        // with the system's where there is one.
        let bundled = jiff::tz::TimeZoneDatabase::bundled();
        for name in [
            "Europe/Berlin",
            "America/New_York",
            "Asia/Kolkata",
            "Australia/Sydney",
        ] {
            let zone = bundled
                .get(name)
                .unwrap_or_else(|e| panic!("{name} is not in the bundled database: {e}"));
            let t = at("2026-07-01T12:00:00Z");
            assert_eq!(
                zone.to_offset(t),
                TimeZone::get(name).expect("known").to_offset(t),
                "{name}"
            );
        }
    }

    #[test]
    fn weekdays_ranges_steps_and_sunday_as_seven() {
        // Saturdays and Sundays, every 6 hours, for one hour.
        let w = window("0 */6 * * 6,7", "1h", "UTC");
        assert!(w.open_at(at("2026-12-05T06:30:00Z")), "Saturday 06:30");
        assert!(w.open_at(at("2026-12-06T18:10:00Z")), "Sunday 18:10");
        assert!(!w.open_at(at("2026-12-07T06:30:00Z")), "Monday");
        assert!(!w.open_at(at("2026-12-05T07:30:00Z")), "Saturday 07:30");
        let weekdays = window("30 9-17 * * 1-5", "10m", "UTC");
        assert!(
            weekdays.open_at(at("2026-12-01T17:35:00Z")),
            "Tuesday 17:35"
        );
        assert!(!weekdays.open_at(at("2026-12-01T18:35:00Z")));
    }

    #[test]
    fn restricted_day_fields_match_either_as_cron_does() {
        // The 1st of the month or any Monday.
        let w = window("0 0 1 * 1", "1h", "UTC");
        assert!(w.open_at(at("2026-12-01T00:30:00Z")), "Tuesday the 1st");
        assert!(w.open_at(at("2026-12-07T00:30:00Z")), "Monday the 7th");
        assert!(!w.open_at(at("2026-12-08T00:30:00Z")), "Tuesday the 8th");
    }

    #[test]
    fn no_window_means_always_and_bad_windows_say_what_is_wrong() {
        assert!(open(&[], at("2026-12-01T12:00:00Z")));
        let bad = |schedule: &str, duration: &str, zone: &str| {
            Window::new(&MaintenanceWindow {
                schedule: schedule.into(),
                duration: duration.into(),
                time_zone: zone.into(),
            })
            .expect_err("invalid")
        };
        assert!(bad("0 2 * *", "1h", "UTC").contains("five"));
        assert!(bad("61 2 * * *", "1h", "UTC").contains("minute"));
        assert!(bad("0 2 * * MON", "1h", "UTC").contains("day of week"));
        assert!(bad("0 5-2 * * *", "1h", "UTC").contains("backwards"));
        assert!(bad("0 2 * * *", "200h", "UTC").contains("168h"));
        assert!(bad("0 2 * * *", "1h", "Mars/Olympus").contains("time zone"));
    }

    /// The minute-by-minute walk `open_at` replaced: the reference it must agree with.
    fn open_by_minutes(w: &Window, now: jiff::Timestamp) -> bool {
        let local = now.to_zoned(w.zone.clone());
        let mut t = local
            .round(
                jiff::ZonedRound::new()
                    .smallest(jiff::Unit::Minute)
                    .mode(jiff::RoundMode::Trunc),
            )
            .expect("rounds");
        for _ in 0..w.duration.as_secs().div_ceil(60) {
            let since = now.duration_since(t.timestamp()).as_secs_f64();
            if w.schedule.matches(&t) && since < w.duration.as_secs_f64() {
                return true;
            }
            t = t
                .checked_sub(jiff::Span::new().minutes(1))
                .expect("in range");
        }
        false
    }

    /// The skipping walk answers as the minute walk did, over schedules with rare and frequent
    /// matches, zones with daylight-saving changes, and instants a few hours apart across a year.
    #[test]
    fn skipping_days_and_hours_answers_as_the_minute_walk() {
        let schedules = [
            "0 2 * * *",
            "30 9-17 * * 1-5",
            "0 */6 * * 6,7",
            "0 0 1 * 1",
            "59 23 31 12 *",
            "15,45 3 * 2-4 *",
            "* * * * *",
            "0 2 30 2 *",
        ];
        let zones = ["UTC", "Europe/Berlin", "Australia/Lord_Howe"];
        let mut checked = 0;
        // Instants through 2026, every 41 h 13 min for the shorter windows (every hour of the day and
        // both DST changes come up), every 9 days for the week-long one (the reference walks 10,080
        // minutes for each).
        for (duration, step_minutes) in [
            ("10m", 41 * 60 + 13),
            ("1h", 41 * 60 + 13),
            ("4h", 41 * 60 + 13),
            ("26h", 41 * 60 + 13),
            ("168h", 9 * 24 * 60 + 7),
        ] {
            for schedule in schedules {
                for zone in zones {
                    let w = window(schedule, duration, zone);
                    let mut now = at("2026-01-01T00:00:00Z");
                    let end = at("2027-01-01T00:00:00Z");
                    while now < end {
                        assert_eq!(
                            w.open_at(now),
                            open_by_minutes(&w, now),
                            "{schedule} for {duration} in {zone} at {now}"
                        );
                        checked += 1;
                        now += jiff::SignedDuration::from_mins(step_minutes);
                    }
                }
            }
        }
        assert!(checked > 20_000, "{checked}");
    }
}
