//! Velero Schedules, as the 1.18 schedule controller runs them (velero `pkg/controller/schedule_controller.go`,
//! `pkg/apis/velero/v1/schedule_types.go`, `pkg/builder/backup_builder.go` `FromSchedule`):
//!
//! - a paused Schedule is skipped;
//! - an absent `spec.skipImmediately` is set to the server's default (false, `--schedule-skip-immediately`);
//!   a true one is set back to false and `status.lastSkipped` to now;
//! - `spec.schedule` is parsed (robfig/cron `ParseStandard`); a failure sets phase `FailedValidation` with
//!   `validationErrors`, else `Enabled`;
//! - it is due when now is after the next run after `status.lastBackup` (else the creation time), or after
//!   `status.lastSkipped` when that is later; missed runs are not caught up;
//! - a due Schedule with a Backup of its own still `""`, `New` or `InProgress` waits (no overlap);
//! - the Backup is `<schedule>-<YYYYMMDDhhmmss>`, its spec the template, its labels the template's
//!   `metadata.labels` or else the Schedule's, plus `velero.io/schedule-name`; the Schedule's annotations;
//!   an owner reference to the Schedule only with `useOwnerReferencesInBackup: true`; then
//!   `status.lastBackup` is set to now. It then runs through the ordinary backup queue.
//!
//! Differences: only `@every <duration>` is evaluated (robfig `ConstantDelaySchedule`: under a second
//! counts as one second, fractions of a second are dropped, and the next run falls on a whole second).
//! Another expression is accepted (phase Enabled, as Velero would for a valid one) but never runs here.
//! Velero looks at each Schedule on its changes and once a minute (`scheduleSyncPeriod`); the sim looks on
//! every pass of its server loop, so a run comes within a fraction of a second of its time.

use std::time::Duration;

use serde_json::{Value, json};

use super::{INTERNAL, VeleroConfig, backups_key, parse_go_duration, rfc3339, schedules_key};
use crate::apiserver::meta::meta_str;
use crate::world::WorldContext;

/// Label Velero puts on each Backup a Schedule makes (`velero.io/schedule-name`).
pub const SCHEDULE_NAME_LABEL: &str = "velero.io/schedule-name";

/// What the sim makes of `spec.schedule`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cron {
    /// `@every <d>`: runs `d` apart (whole seconds, at least one).
    Every(Duration),
    /// Another expression: valid for all the sim knows, never run.
    NotModelled,
}

/// Parses `spec.schedule` as far as the sim models it; `Err` with Velero's validation error.
pub fn parse(schedule: &str) -> Result<Cron, String> {
    if schedule.is_empty() {
        // parseCronSchedule's message for the empty string (cron.Parse would panic on it).
        return Err("Schedule must be a non-empty valid Cron expression".into());
    }
    let Some(rest) = schedule.strip_prefix("@every ") else {
        return Ok(Cron::NotModelled);
    };
    let d = parse_go_duration(rest.trim())
        .ok_or_else(|| format!("invalid schedule: failed to parse duration {schedule}"))?;
    // robfig/cron Every: below a second is a second; the sub-second part is dropped.
    let secs = d.as_secs().max(1);
    Ok(Cron::Every(Duration::from_secs(secs)))
}

/// robfig `ConstantDelaySchedule.Next`: `t + delay`, rounded down to the whole second.
pub fn next_run(t: jiff::Timestamp, every: Duration) -> jiff::Timestamp {
    let whole = jiff::Timestamp::from_second(t.as_second()).unwrap_or(t);
    let delay = jiff::SignedDuration::try_from(every).unwrap_or(jiff::SignedDuration::MAX);
    whole.saturating_add(delay).unwrap_or(jiff::Timestamp::MAX)
}

fn time_at(v: &Value, pointer: &str) -> Option<jiff::Timestamp> {
    v.pointer(pointer)?.as_str()?.parse().ok()
}

/// getNextRunTime: whether `schedule` is due at `now` under `every`.
pub fn due(schedule: &Value, every: Duration, now: jiff::Timestamp) -> bool {
    let mut last = time_at(schedule, "/status/lastBackup")
        .or_else(|| time_at(schedule, "/metadata/creationTimestamp"))
        .unwrap_or(now);
    if let Some(skipped) = time_at(schedule, "/status/lastSkipped")
        && skipped > last
    {
        last = skipped;
    }
    now > next_run(last, every)
}

/// checkIfBackupInNewOrProgress: a Backup of this Schedule in `""`, `New` or `InProgress`.
pub fn backup_in_flight(schedule: &str, backups: &[std::sync::Arc<Value>]) -> bool {
    backups.iter().any(|b| {
        b.pointer(&format!(
            "/metadata/labels/{}",
            SCHEDULE_NAME_LABEL.replace('/', "~1")
        ))
        .and_then(Value::as_str)
            == Some(schedule)
            && matches!(
                b.pointer("/status/phase")
                    .and_then(Value::as_str)
                    .unwrap_or(""),
                "" | "New" | "InProgress"
            )
    })
}

/// `Schedule.TimestampedName`: `<schedule>-<YYYYMMDDhhmmss>` (the server's clock, UTC here).
pub fn backup_name(schedule: &str, at: jiff::Timestamp) -> String {
    format!("{schedule}-{}", at.strftime("%Y%m%d%H%M%S"))
}

/// getBackup / `FromSchedule`: the Backup the Schedule makes at `at`.
pub fn backup_from(schedule: &Value, at: jiff::Timestamp) -> Value {
    let name = meta_str(schedule, "name").unwrap_or("");
    let template = schedule
        .pointer("/spec/template")
        .cloned()
        .unwrap_or(json!({}));
    let mut labels = template
        .pointer("/metadata/labels")
        .filter(|l| l.is_object())
        .or_else(|| {
            schedule
                .pointer("/metadata/labels")
                .filter(|l| l.is_object())
        })
        .cloned()
        .unwrap_or(json!({}));
    labels[SCHEDULE_NAME_LABEL] = json!(name);
    let mut metadata = json!({
        "name": backup_name(name, at),
        "namespace": meta_str(schedule, "namespace").unwrap_or(""),
        "labels": labels,
    });
    if let Some(a) = schedule
        .pointer("/metadata/annotations")
        .filter(|a| a.is_object())
    {
        metadata["annotations"] = a.clone();
    }
    if schedule
        .pointer("/spec/useOwnerReferencesInBackup")
        .and_then(Value::as_bool)
        == Some(true)
    {
        metadata["ownerReferences"] = json!([{
            "apiVersion": "velero.io/v1", "kind": "Schedule", "name": name,
            "uid": meta_str(schedule, "uid").unwrap_or(""), "controller": true,
        }]);
    }
    json!({"apiVersion": "velero.io/v1", "kind": "Backup", "metadata": metadata, "spec": template})
}

/// The Schedule after Reconcile's first part: `skipImmediately` settled, phase and validation errors.
fn validated(cur: &Value, parsed: &Result<Cron, String>, now: jiff::Timestamp) -> Value {
    let mut v = cur.clone();
    if !v.get("status").is_some_and(Value::is_object) {
        v["status"] = json!({});
    }
    match v.pointer("/spec/skipImmediately").and_then(Value::as_bool) {
        None => v["spec"]["skipImmediately"] = json!(false),
        Some(true) => {
            v["spec"]["skipImmediately"] = json!(false);
            v["status"]["lastSkipped"] = json!(rfc3339(now));
        }
        Some(false) => {}
    }
    match parsed {
        Ok(_) => {
            v["status"]["phase"] = json!("Enabled");
            if let Some(st) = v["status"].as_object_mut() {
                st.remove("validationErrors");
            }
        }
        Err(e) => {
            v["status"]["phase"] = json!("FailedValidation");
            v["status"]["validationErrors"] = json!([e]);
        }
    }
    v
}

/// One pass of the schedule controller over every Schedule in Velero's namespace.
pub(super) fn reconcile(ctx: &WorldContext, config: &VeleroConfig) {
    let key = schedules_key();
    // Schedules only exist when their CRD is installed.
    if ctx.store.def(&key).is_none() {
        return;
    }
    let ns = config.namespace.as_str();
    let schedules = ctx.store.list(&key, Some(ns), &|_| true, None, None).items;
    if schedules.is_empty() {
        return;
    }
    let backups = ctx
        .store
        .list(&backups_key(), Some(ns), &|_| true, None, None)
        .items;
    let now = jiff::Timestamp::now();
    for s in schedules {
        if s.pointer("/spec/paused").and_then(Value::as_bool) == Some(true)
            || s.pointer("/metadata/deletionTimestamp").is_some()
        {
            continue;
        }
        let name = meta_str(&s, "name").unwrap_or("").to_owned();
        let parsed = parse(
            s.pointer("/spec/schedule")
                .and_then(Value::as_str)
                .unwrap_or(""),
        );
        // Written only when it changes: a patch that changes nothing leaves the object (and its
        // resourceVersion) as it is on a real API server too.
        let updated = if validated(&s, &parsed, now) == *s {
            s.clone()
        } else {
            match ctx
                .store
                .modify(&key, Some(ns), &name, None, INTERNAL, |cur| {
                    Ok(validated(cur, &parsed, now))
                }) {
                Ok(v) => v,
                Err(_) => continue,
            }
        };
        let Ok(Cron::Every(every)) = parsed else {
            continue;
        };
        if !due(&updated, every, now) || backup_in_flight(&name, &backups) {
            continue;
        }
        match ctx.store.create(
            &backups_key(),
            Some(ns),
            backup_from(&updated, now),
            INTERNAL,
        ) {
            Ok(_) => {
                ctx.audit.world(
                    "create",
                    "backups.velero.io",
                    Some(ns),
                    Some(&backup_name(&name, now)),
                    json!({"schedule": name}),
                );
                let _ = ctx
                    .store
                    .modify(&key, Some(ns), &name, None, INTERNAL, |cur| {
                        let mut v = cur.clone();
                        v["status"]["lastBackup"] = json!(rfc3339(now));
                        Ok(v)
                    });
            }
            Err(e) => {
                tracing::warn!(schedule = %name, error = %e.message, "velero sim: error creating Backup")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> jiff::Timestamp {
        s.parse().expect("a time")
    }

    #[test]
    fn every_is_robfig_constant_delay() {
        assert_eq!(
            parse("@every 6h"),
            Ok(Cron::Every(Duration::from_secs(6 * 3600)))
        );
        // robfig/cron Every: under a second is a second, fractions are dropped.
        assert_eq!(
            parse("@every 250ms"),
            Ok(Cron::Every(Duration::from_secs(1)))
        );
        assert_eq!(
            parse("@every 2500ms"),
            Ok(Cron::Every(Duration::from_secs(2)))
        );
        assert_eq!(parse("0 */6 * * *"), Ok(Cron::NotModelled));
        assert!(parse("@every soon").is_err());
        assert_eq!(
            parse(""),
            Err("Schedule must be a non-empty valid Cron expression".into())
        );
        // ConstantDelaySchedule.Next lands on a whole second.
        assert_eq!(
            next_run(ts("2026-01-01T00:00:00.700Z"), Duration::from_secs(2)),
            ts("2026-01-01T00:00:02Z")
        );
    }

    #[test]
    fn due_counts_from_the_last_backup_or_creation_or_a_later_skip() {
        let every = Duration::from_secs(60);
        let new = json!({"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"}});
        assert!(
            !due(&new, every, ts("2026-01-01T00:01:00Z")),
            "not after the next run"
        );
        assert!(due(&new, every, ts("2026-01-01T00:01:01Z")));
        let ran = json!({"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
                         "status": {"lastBackup": "2026-01-01T00:05:00Z"}});
        assert!(!due(&ran, every, ts("2026-01-01T00:05:30Z")));
        assert!(
            due(&ran, every, ts("2026-01-01T00:06:01Z")),
            "missed runs are not caught up, one is made"
        );
        let skipped = json!({"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
                             "status": {"lastBackup": "2026-01-01T00:05:00Z", "lastSkipped": "2026-01-01T00:10:00Z"}});
        assert!(!due(&skipped, every, ts("2026-01-01T00:10:30Z")));
    }

    #[test]
    fn the_backup_is_named_and_labelled_as_velero_makes_it() {
        let s = json!({
            "metadata": {"name": "snapdrain-warm-shop", "namespace": "velero", "uid": "s-1",
                         "labels": {"snapdrain.io/warm-backup": "true"}, "annotations": {"a": "b"}},
            "spec": {"schedule": "@every 1m", "template": {"includedNamespaces": ["shop"], "ttl": "72h"}}
        });
        let b = backup_from(&s, ts("2026-03-04T05:06:07Z"));
        assert_eq!(b["metadata"]["name"], "snapdrain-warm-shop-20260304050607");
        assert_eq!(b["metadata"]["namespace"], "velero");
        assert_eq!(
            b["metadata"]["labels"],
            json!({"snapdrain.io/warm-backup": "true", "velero.io/schedule-name": "snapdrain-warm-shop"})
        );
        assert_eq!(b["metadata"]["annotations"], json!({"a": "b"}));
        assert_eq!(b["spec"], s["spec"]["template"]);
        assert!(b["metadata"].get("ownerReferences").is_none());
        // Template labels win over the Schedule's; owner references only when asked.
        let mut t = s.clone();
        t["spec"]["template"]["metadata"] = json!({"labels": {"x": "y"}});
        t["spec"]["useOwnerReferencesInBackup"] = json!(true);
        let b = backup_from(&t, ts("2026-03-04T05:06:07Z"));
        assert_eq!(
            b["metadata"]["labels"],
            json!({"x": "y", "velero.io/schedule-name": "snapdrain-warm-shop"})
        );
        assert_eq!(b["metadata"]["ownerReferences"][0]["uid"], "s-1");
    }

    #[test]
    fn a_backup_still_new_or_in_progress_holds_the_next_run() {
        let b = |phase: &str| {
            std::sync::Arc::new(json!({"metadata": {"labels": {SCHEDULE_NAME_LABEL: "s"}},
                                       "status": {"phase": phase}}))
        };
        assert!(backup_in_flight("s", &[b("InProgress")]));
        assert!(backup_in_flight("s", &[b("New")]));
        assert!(backup_in_flight("s", &[b("")]));
        // As checkIfBackupInNewOrProgress reads it: Queued and the rest do not hold it.
        assert!(!backup_in_flight("s", &[b("Queued"), b("Completed")]));
        assert!(!backup_in_flight("other", &[b("InProgress")]));
    }

    #[test]
    fn validation_settles_skip_immediately_and_the_phase() {
        let now = ts("2026-01-01T00:00:00Z");
        let v = validated(
            &json!({"spec": {"schedule": "@every 1m"}}),
            &parse("@every 1m"),
            now,
        );
        assert_eq!(
            v["spec"]["skipImmediately"],
            json!(false),
            "the server default is written"
        );
        assert_eq!(v["status"]["phase"], "Enabled");
        let v = validated(
            &json!({"spec": {"schedule": "@every 1m", "skipImmediately": true}}),
            &parse("@every 1m"),
            now,
        );
        assert_eq!(v["spec"]["skipImmediately"], json!(false));
        assert_eq!(v["status"]["lastSkipped"], "2026-01-01T00:00:00Z");
        let v = validated(&json!({"spec": {"schedule": ""}}), &parse(""), now);
        assert_eq!(v["status"]["phase"], "FailedValidation");
        assert_eq!(
            v["status"]["validationErrors"][0],
            "Schedule must be a non-empty valid Cron expression"
        );
        // Settled: a second pass changes nothing (nothing is written).
        let settled = validated(
            &json!({"spec": {"schedule": "@every 1m"}}),
            &parse("@every 1m"),
            now,
        );
        assert_eq!(validated(&settled, &parse("@every 1m"), now), settled);
    }
}
