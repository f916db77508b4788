//! The DisruptionPolicy's `spec.warmBackups`: a Velero Schedule per protected namespace that keeps a
//! recent backup in the namespace's kopia repository, so a pre-drain backup moves only what changed
//! since (kopia deduplicates against what the repository already holds). Absent: off.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::plan::{DURATION_MAX_LENGTH, DURATION_PATTERN};

/// How often the warm backup runs and how long Velero keeps each one.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WarmBackupsSpec {
    /// When Velero takes the warm backup, as Velero's Schedule reads it: `@every <Go duration>` (e.g.
    /// `@every 6h`), `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`, or a five-field cron
    /// expression in UTC with numbers only (e.g. `0 */6 * * *`). The first backup comes one interval
    /// (or the next match) after the Schedule is created.
    #[schemars(length(min = 1, max = 100))]
    pub schedule: String,
    /// How long Velero keeps each warm backup (the Backups' `spec.ttl`). Go duration, e.g. `72h`.
    #[serde(default = "default_ttl")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = DURATION_MAX_LENGTH))]
    pub ttl: String,
}

fn default_ttl() -> String {
    // Three days: a weekend's warm backups are still there on Monday, and the repository holds the
    // data of the last one however long it is kept.
    "72h".into()
}

/// The descriptors robfig/cron (which Velero's Schedule controller parses with `cron.ParseStandard`)
/// accepts besides `@every`.
const DESCRIPTORS: &[&str] = &[
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@midnight",
    "@hourly",
];

/// The interval of an `@every` schedule (None for the other forms), or what is wrong with `schedule`.
pub fn check_schedule(schedule: &str) -> Result<Option<Duration>, String> {
    let s = schedule.trim();
    if let Some(rest) = s.strip_prefix("@every ") {
        let every = super::duration::parse_go_duration(rest.trim())
            .map_err(|e| format!("{schedule:?}: {e}"))?;
        // robfig/cron rounds an interval under a second up to one second and drops fractions.
        if every < Duration::from_secs(1) {
            return Err(format!(
                "{schedule:?} runs more than once a second; write @every with at least 1s (e.g. @every 6h)"
            ));
        }
        return Ok(Some(every));
    }
    if s.starts_with('@') {
        if DESCRIPTORS.contains(&s) {
            return Ok(None);
        }
        return Err(format!(
            "{schedule:?} is not a schedule Velero knows; write @every <duration> (e.g. @every 6h), one of {}, or five cron fields",
            DESCRIPTORS.join(", ")
        ));
    }
    if s.starts_with("TZ=") || s.starts_with("CRON_TZ=") {
        return Err(format!(
            "{schedule:?}: time zones are not supported here; write the cron fields in UTC"
        ));
    }
    crate::signals::window::Schedule::parse(s)
        .map(|_| None)
        .map_err(|e| format!("{e} (or write @every <duration>, e.g. @every 6h)"))
}

impl WarmBackupsSpec {
    /// Every problem, as `spec.warmBackups.<field>: what is wrong and how to fix it`.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Err(e) = check_schedule(&self.schedule) {
            problems.push(format!("spec.warmBackups.schedule: {e}"));
        }
        if let Err(e) = super::validate::spec_duration(&self.ttl) {
            problems.push(format!("spec.warmBackups.ttl: {e}"));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_descriptor_and_cron_are_accepted() {
        assert_eq!(
            check_schedule("@every 6h"),
            Ok(Some(Duration::from_secs(6 * 3600)))
        );
        assert_eq!(
            check_schedule("@every 1h30m"),
            Ok(Some(Duration::from_secs(5400)))
        );
        assert_eq!(check_schedule("@daily"), Ok(None));
        assert_eq!(check_schedule("0 */6 * * *"), Ok(None));
    }

    #[test]
    fn bad_schedules_name_the_fix() {
        for (bad, says) in [
            ("@every", "not a schedule"),
            ("@every soon", "not a duration"),
            ("@every 500ms", "at least 1s"),
            ("@often", "not a schedule"),
            ("0 */6 * *", "five"),
            ("CRON_TZ=Europe/Paris 0 2 * * *", "UTC"),
        ] {
            let e = check_schedule(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn problems_name_the_field() {
        let spec = WarmBackupsSpec {
            schedule: "sometimes".into(),
            ttl: "a week".into(),
        };
        let p = spec.problems().join("\n");
        assert!(p.contains("spec.warmBackups.schedule:"), "{p}");
        assert!(p.contains("spec.warmBackups.ttl:"), "{p}");
        let ok = WarmBackupsSpec {
            schedule: "@every 6h".into(),
            ttl: default_ttl(),
        };
        assert!(ok.problems().is_empty());
    }
}
