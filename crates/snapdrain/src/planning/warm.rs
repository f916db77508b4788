//! Warm backups (the policy's `spec.warmBackups`): which Velero Schedules snapdrain keeps, one per namespace
//! with protected pods, and what to change to get there. Pure: the keeper in
//! [`crate::controller::warm`] reads the caches and writes the changes.
//!
//! Each Schedule's template is shaped as the namespace's pre-drain Backups are
//! ([`super::backups::build_velero_backup`]): the one namespace, the same storage location and the same
//! volume method flags, so its runs fill the same kopia repository through the same data path, and a
//! pre-drain backup afterwards moves only what changed. It selects the StatefulSets the protected pods
//! belong to (as `backup.scope: StatefulSet` does), so every protected volume of the namespace is warm
//! whichever node is drained next. Under `method: Auto` the template is a file-system backup (what Auto
//! takes for a namespace without CSI-snapshotted volumes): no per-volume policy is written for Schedules.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

use super::backups::NAMESPACE_LABEL;
use super::naming::{MAX_LABEL, dns_label_chars, short_hash, truncate_label};
use super::node::POD_NAME_LABEL;
use crate::api::plan::BackupMethod;
use crate::api::policy::DisruptionPolicySpec;
use crate::api::velero::{self, BackupSpec};
use crate::api::velero_schedule::{Schedule, ScheduleSpec};

/// Label on every Schedule snapdrain keeps (value `"true"`). Velero copies a Schedule's labels onto the
/// Backups it makes (velero `pkg/builder/backup_builder.go` `FromSchedule`), so those carry it too, and
/// never snapdrain's plan label: a scheduled Backup is no plan's.
pub const WARM_LABEL: &str = "snapdrain.io/warm-backup";
/// Label Velero puts on each Backup a Schedule makes: the Schedule's name (velero
/// `pkg/apis/velero/v1/labels_annotations.go` `ScheduleNameLabel`).
pub const SCHEDULE_NAME_LABEL: &str = "velero.io/schedule-name";

const PREFIX: &str = "snapdrain-warm-";

/// The Schedule of namespace `ns`: `snapdrain-warm-<ns>`, or, when that is longer than a label value
/// (Velero puts the name in each Backup's `velero.io/schedule-name` label), cut with a hash of `ns`.
pub fn schedule_name(ns: &str) -> String {
    let plain = format!("{PREFIX}{ns}");
    if plain.len() <= MAX_LABEL {
        return plain;
    }
    let suffix = format!("-{}", short_hash(&[ns]));
    let room = MAX_LABEL - PREFIX.len() - suffix.len();
    format!(
        "{PREFIX}{}{suffix}",
        truncate_label(&dns_label_chars(ns), room)
    )
}

/// What a Backup of the namespace selects: each StatefulSet's selector (the pods' owners), or the pod by
/// its `statefulset.kubernetes.io/pod-name` label when its StatefulSet is not known. `pods` holds each
/// protected pod's name and its StatefulSet's selector. Sorted, without repeats, so the result does not
/// depend on the order the caches list pods in.
pub fn namespace_selectors(pods: &[(String, Option<LabelSelector>)]) -> Vec<LabelSelector> {
    let mut by_key: BTreeMap<String, LabelSelector> = BTreeMap::new();
    for (pod, sts) in pods {
        let sel = sts.clone().unwrap_or_else(|| LabelSelector {
            match_labels: Some(BTreeMap::from([(POD_NAME_LABEL.to_owned(), pod.clone())])),
            match_expressions: None,
        });
        // A selector's JSON is a stable key (its maps are sorted).
        by_key.insert(serde_json::to_string(&sel).unwrap_or_default(), sel);
    }
    by_key.into_values().collect()
}

/// The Schedules snapdrain should keep: one per namespace of `protected` (namespace → what its Backups
/// select), in the policy's Velero namespace, or none when `spec.warmBackups` is absent.
pub fn desired(
    policy: &DisruptionPolicySpec,
    protected: &BTreeMap<String, Vec<LabelSelector>>,
) -> Vec<Schedule> {
    let Some(warm) = &policy.warm_backups else {
        return Vec::new();
    };
    let b = &policy.backup;
    // As build_velero_backup sets them for a Backup without a volume policy.
    let (fs, snapshot, move_data) = match b.method {
        BackupMethod::Auto | BackupMethod::FileSystem => (true, false, false),
        BackupMethod::CsiDataMover => (false, true, true),
        BackupMethod::Snapshot => (false, true, false),
    };
    protected
        .iter()
        .filter(|(_, selectors)| !selectors.is_empty())
        .map(|(ns, selectors)| {
            let spec = ScheduleSpec {
                template: BackupSpec {
                    included_namespaces: vec![ns.clone()],
                    or_label_selectors: selectors.clone(),
                    storage_location: b.storage_location.clone(),
                    ttl: Some(warm.ttl.clone()),
                    default_volumes_to_fs_backup: Some(fs),
                    snapshot_volumes: Some(snapshot),
                    snapshot_move_data: Some(move_data),
                    ..BackupSpec::default()
                },
                schedule: warm.schedule.trim().to_owned(),
                use_owner_references_in_backup: false,
                skip_immediately: false,
            };
            Schedule {
                metadata: ObjectMeta {
                    name: Some(schedule_name(ns)),
                    namespace: Some(b.velero_namespace.clone()),
                    labels: Some(labels(ns)),
                    ..ObjectMeta::default()
                },
                // Plain strings, bools and maps: serializing cannot fail.
                spec: serde_json::to_value(spec).unwrap_or_default(),
                ..Schedule::default()
            }
        })
        .collect()
}

fn labels(ns: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (WARM_LABEL.to_owned(), "true".to_owned()),
        (NAMESPACE_LABEL.to_owned(), ns.to_owned()),
    ])
}

/// One write that brings the Schedules snapdrain keeps to the desired ones.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Create(Schedule),
    /// `existing` as read, with the desired spec and labels (its resourceVersion guards the write, and
    /// the status Velero wrote is carried).
    Update(Schedule),
    /// A Schedule snapdrain labelled that no protected namespace needs any more (or warm backups are
    /// off); deleted by uid so a re-created one is left to the next pass.
    Delete {
        namespace: String,
        name: String,
        uid: Option<String>,
    },
}

/// The writes from `existing` (the Schedules labelled [`WARM_LABEL`], in any namespace) to `desired`.
/// A Schedule being deleted is left alone (its create comes on a later pass).
pub fn changes(desired: &[Schedule], existing: &[Schedule]) -> Vec<Change> {
    let key = |s: &Schedule| {
        (
            s.metadata.namespace.clone().unwrap_or_default(),
            s.metadata.name.clone().unwrap_or_default(),
        )
    };
    let have: BTreeMap<_, _> = existing.iter().map(|s| (key(s), s)).collect();
    let want: BTreeMap<_, _> = desired.iter().map(|s| (key(s), s)).collect();
    let mut out = Vec::new();
    for (k, d) in &want {
        match have.get(k) {
            None => out.push(Change::Create((*d).clone())),
            Some(e) if e.metadata.deletion_timestamp.is_some() => {}
            Some(e) => {
                let labels_ok =
                    d.metadata.labels.iter().flatten().all(|(lk, lv)| {
                        e.metadata.labels.as_ref().and_then(|l| l.get(lk)) == Some(lv)
                    });
                if e.spec != d.spec || !labels_ok {
                    let mut u = (*e).clone();
                    u.spec = d.spec.clone();
                    let mut l = u.metadata.labels.take().unwrap_or_default();
                    l.extend(d.metadata.labels.clone().unwrap_or_default());
                    u.metadata.labels = Some(l);
                    out.push(Change::Update(u));
                }
            }
        }
    }
    for (k, e) in &have {
        if !want.contains_key(k) && e.metadata.deletion_timestamp.is_none() {
            out.push(Change::Delete {
                namespace: k.0.clone(),
                name: k.1.clone(),
                uid: e.metadata.uid.clone(),
            });
        }
    }
    out
}

/// A warm backup of a namespace: the newest Completed Backup its Schedule made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmBackup {
    pub name: String,
    pub completed_at: Timestamp,
}

/// The newest Completed Backup among `backups` that the warm Schedule of `ns` made (by Velero's
/// `velero.io/schedule-name` label), completed no later than `now`.
pub fn latest_warm(ns: &str, backups: &[velero::Backup], now: Timestamp) -> Option<WarmBackup> {
    let schedule = schedule_name(ns);
    backups
        .iter()
        .filter(|b| {
            b.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SCHEDULE_NAME_LABEL))
                == Some(&schedule)
        })
        .filter_map(|b| {
            let s = b.status.as_ref()?;
            if s.phase.as_deref() != Some("Completed") {
                return None;
            }
            let at = s.completion_timestamp.as_ref()?.0;
            (at <= now).then(|| WarmBackup {
                name: b.metadata.name.clone().unwrap_or_default(),
                completed_at: at,
            })
        })
        .max_by_key(|w| w.completed_at)
}

/// `3h12m` / `4m` / `20s`: an age for a person.
pub fn age(since: Timestamp, now: Timestamp) -> String {
    let secs = now.duration_since(since).as_secs().max(0);
    match secs {
        s if s >= 3600 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(v: serde_json::Value) -> DisruptionPolicySpec {
        serde_json::from_value(v).expect("a valid policy")
    }

    fn sel(k: &str, v: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some(BTreeMap::from([(k.to_owned(), v.to_owned())])),
            match_expressions: None,
        }
    }

    fn protected() -> BTreeMap<String, Vec<LabelSelector>> {
        BTreeMap::from([
            ("shop".to_owned(), vec![sel("app", "postgres")]),
            ("empty".to_owned(), vec![]),
        ])
    }

    #[test]
    fn off_keeps_no_schedule() {
        assert!(desired(&DisruptionPolicySpec::defaults(), &protected()).is_empty());
    }

    #[test]
    fn one_schedule_per_protected_namespace_shaped_as_a_pre_drain_backup() {
        let p = policy(json!({
            "warmBackups": {"schedule": "@every 6h", "ttl": "48h"},
            "backup": {"storageLocation": "primary", "veleroNamespace": "backup-system"}
        }));
        let d = desired(&p, &protected());
        assert_eq!(d.len(), 1, "a namespace with nothing to select gets none");
        let s = &d[0];
        assert_eq!(s.metadata.name.as_deref(), Some("snapdrain-warm-shop"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("backup-system"));
        let labels = s.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(WARM_LABEL).map(String::as_str), Some("true"));
        assert_eq!(
            labels.get(NAMESPACE_LABEL).map(String::as_str),
            Some("shop")
        );
        assert!(!labels.contains_key(super::super::backups::PLAN_LABEL));
        assert_eq!(
            s.spec,
            json!({
                "schedule": "@every 6h",
                "useOwnerReferencesInBackup": false,
                "skipImmediately": false,
                "template": {
                    "includedNamespaces": ["shop"],
                    "orLabelSelectors": [{"matchLabels": {"app": "postgres"}}],
                    "storageLocation": "primary",
                    "ttl": "48h",
                    "defaultVolumesToFsBackup": true,
                    "snapshotVolumes": false,
                    "snapshotMoveData": false
                }
            })
        );
    }

    #[test]
    fn the_method_flags_follow_the_policy_backup_method() {
        let flags = |method: &str| {
            let p = policy(
                json!({"warmBackups": {"schedule": "@daily"}, "backup": {"method": method}}),
            );
            let t = desired(&p, &protected())[0].spec["template"].clone();
            (
                t["defaultVolumesToFsBackup"].as_bool(),
                t["snapshotVolumes"].as_bool(),
                t["snapshotMoveData"].as_bool(),
            )
        };
        assert_eq!(flags("file-system"), (Some(true), Some(false), Some(false)));
        assert_eq!(
            flags("csi-data-mover"),
            (Some(false), Some(true), Some(true))
        );
        assert_eq!(flags("snapshot"), (Some(false), Some(true), Some(false)));
        assert_eq!(flags("auto"), (Some(true), Some(false), Some(false)));
    }

    #[test]
    fn long_namespaces_get_a_label_sized_name() {
        let ns = "n".repeat(63);
        let name = schedule_name(&ns);
        assert!(name.len() <= 63, "{name}");
        assert!(name.starts_with(PREFIX));
        assert_ne!(name, schedule_name(&"n".repeat(62)));
        // Its Backups' names (<schedule>-<14 digits>) never take the shape the DeleteBackupRequest
        // admission policy allows (`-<attempt>-<8 hex>` at the end).
        let backup = format!("{name}-20260101000000");
        let re = regex::Regex::new("^[a-z0-9]([-a-z0-9]*[a-z0-9])?-[0-9]+-[0-9a-f]{8}$")
            .expect("the policy's pattern");
        assert!(!re.is_match(&backup), "{backup}");
    }

    #[test]
    fn selectors_are_the_owners_and_the_orphans_by_name() {
        let pods = vec![
            ("pg-1".to_owned(), Some(sel("app", "pg"))),
            ("pg-0".to_owned(), Some(sel("app", "pg"))),
            ("lost-0".to_owned(), None),
        ];
        let s = namespace_selectors(&pods);
        assert_eq!(s.len(), 2);
        assert!(s.contains(&sel("app", "pg")));
        assert!(s.contains(&sel(POD_NAME_LABEL, "lost-0")));
        let mut reversed = pods.clone();
        reversed.reverse();
        assert_eq!(namespace_selectors(&reversed), s);
    }

    fn existing(from: &Schedule, uid: &str) -> Schedule {
        let mut e = from.clone();
        e.metadata.uid = Some(uid.into());
        e.metadata.resource_version = Some("7".into());
        e.status = Some(json!({"phase": "Enabled", "lastBackup": "2026-01-01T00:00:00Z"}));
        e
    }

    #[test]
    fn changes_create_update_and_delete_only_what_differs() {
        let p = policy(json!({"warmBackups": {"schedule": "@every 6h"}}));
        let want = desired(&p, &protected());
        assert!(matches!(&changes(&want, &[])[..], [Change::Create(s)] if s == &want[0]));
        let same = existing(&want[0], "u1");
        assert!(
            changes(&want, std::slice::from_ref(&same)).is_empty(),
            "idempotent"
        );
        let mut edited = same.clone();
        edited.spec["template"]["includedNamespaces"] = json!(["*"]);
        let c = changes(&want, &[edited]);
        let [Change::Update(u)] = &c[..] else {
            panic!("one update: {c:?}")
        };
        assert_eq!(u.spec, want[0].spec);
        assert_eq!(u.status, same.status, "Velero's status is carried");
        assert_eq!(u.metadata.resource_version.as_deref(), Some("7"));
        // The option off, or the namespace no longer protected: the Schedule goes, by uid.
        assert_eq!(
            changes(&[], std::slice::from_ref(&same)),
            vec![Change::Delete {
                namespace: "velero".into(),
                name: "snapdrain-warm-shop".into(),
                uid: Some("u1".into())
            }]
        );
        let mut going = same;
        going.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
        );
        assert!(changes(&want, std::slice::from_ref(&going)).is_empty());
        assert!(changes(&[], &[going]).is_empty());
    }

    fn backup(name: &str, schedule: &str, phase: &str, completed: &str) -> velero::Backup {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "velero", "labels": {SCHEDULE_NAME_LABEL: schedule}},
            "status": {"phase": phase, "completionTimestamp": completed}
        }))
        .expect("a backup")
    }

    #[test]
    fn the_warm_backup_is_the_newest_completed_one_of_the_namespace_schedule() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().expect("a time");
        let backups = vec![
            backup(
                "snapdrain-warm-shop-20260101060000",
                "snapdrain-warm-shop",
                "Completed",
                "2026-01-01T06:01:00Z",
            ),
            backup(
                "snapdrain-warm-shop-20260101000000",
                "snapdrain-warm-shop",
                "Completed",
                "2026-01-01T00:01:00Z",
            ),
            backup(
                "snapdrain-warm-shop-20260101113000",
                "snapdrain-warm-shop",
                "PartiallyFailed",
                "2026-01-01T11:31:00Z",
            ),
            backup(
                "nightly-20260101110000",
                "nightly",
                "Completed",
                "2026-01-01T11:01:00Z",
            ),
        ];
        let w = latest_warm("shop", &backups, now).expect("a warm backup");
        assert_eq!(w.name, "snapdrain-warm-shop-20260101060000");
        assert_eq!(age(w.completed_at, now), "5h59m");
        assert_eq!(latest_warm("web", &backups, now), None);
    }
}
