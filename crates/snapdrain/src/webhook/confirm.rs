//! Whether Velero's own Backup confirms what a plan's status says (security review M-2): the gate lets a
//! protected pod go on the strength of a plan's verified backup only when the Backup that record names
//! exists in the plan's Velero namespace, is `Completed`, belongs to that plan (snapdrain's labels) and
//! includes the pod's namespace. A status edited by anyone but snapdrain (the `snapdrain-plan-status`
//! ValidatingAdmissionPolicy refuses that, but a cluster may run without it) cannot name a Backup that
//! does not exist, failed, or covers something else. Pure; the gate reads the Backup from its cache.

use kube::ResourceExt;

use crate::api::DisruptionPlan;
use crate::api::status::BackupRecord;
use crate::api::velero::Backup;
use crate::planning::backups::{NAMESPACE_LABEL, PLAN_UID_LABEL, plan_of_backup};

/// Velero's phase of a Backup that finished without errors (velero `pkg/apis/velero/v1/backup_types.go`,
/// `BackupPhaseCompleted`).
const COMPLETED: &str = "Completed";

/// The phases of a Backup whose CSI snapshots are cut and which has not failed: Velero moves past a
/// claim's PVC action only once its snapshot has a handle, and goes on to `WaitingForPluginOperations`
/// while the data mover uploads (velero `pkg/apis/velero/v1/backup_types.go`). The `PartiallyFailed`
/// variants are left out: an item of the backup failed, perhaps the claim's own snapshot.
const CUT_PHASES: &[&str] = &[
    "InProgress",
    "WaitingForPluginOperations",
    "Finalizing",
    COMPLETED,
];

/// Ok when `backup` (None: not in the cache) confirms `record` of `plan`; otherwise why not, for the
/// message of the 429.
pub fn backup_confirms(
    plan: &DisruptionPlan,
    record: &BackupRecord,
    backup: Option<&Backup>,
) -> Result<(), String> {
    confirms_in(plan, record, backup, &[COMPLETED])
}

/// Ok when `backup` confirms the CSI snapshot cuts `record` of `plan` lists (a release at the snapshot:
/// `planning::csi_release`): the plan's own Backup of the namespace, in a phase past the cuts that has not
/// failed ([`CUT_PHASES`]).
pub fn snapshot_confirms(
    plan: &DisruptionPlan,
    record: &BackupRecord,
    backup: Option<&Backup>,
) -> Result<(), String> {
    confirms_in(plan, record, backup, CUT_PHASES)
}

fn confirms_in(
    plan: &DisruptionPlan,
    record: &BackupRecord,
    backup: Option<&Backup>,
    phases: &[&str],
) -> Result<(), String> {
    let velero = &plan.spec.backup.velero_namespace;
    let shown = format!("Backup {velero}/{}", record.name);
    let Some(backup) = backup else {
        return Err(format!("{shown} does not exist"));
    };
    if let Some(uid) = &record.uid
        && backup.metadata.uid.as_deref() != Some(uid.as_str())
    {
        return Err(format!(
            "{shown} is not the one the plan recorded (uid {}, recorded {uid})",
            backup.metadata.uid.as_deref().unwrap_or("none")
        ));
    }
    let phase = backup
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("New");
    if !phases.contains(&phase) {
        return Err(format!("{shown} is {phase}, not {}", phases.join(" or ")));
    }
    let labels = backup.labels();
    match plan_of_backup(backup) {
        None => return Err(format!("{shown} was not made by snapdrain (no plan label)")),
        // A reused record names an earlier plan's Backup: made by snapdrain, for another plan.
        Some(_) if record.reused => {}
        Some(owner) => {
            let uid_label = labels.get(PLAN_UID_LABEL);
            if owner != plan.name_any()
                || uid_label.is_some_and(|u| Some(u.as_str()) != plan.metadata.uid.as_deref())
            {
                return Err(format!(
                    "{shown} belongs to plan {owner}, not to {}",
                    plan.name_any()
                ));
            }
        }
    }
    // snapdrain's Backups name their one namespace (`planning::backups::build_velero_backup`); a Backup
    // of every namespace (`*` or none listed) is not one of them.
    if !backup
        .spec
        .included_namespaces
        .iter()
        .any(|n| n == &record.namespace)
        || labels
            .get(NAMESPACE_LABEL)
            .is_some_and(|n| n != &record.namespace)
    {
        return Err(format!(
            "{shown} does not include namespace {} (it includes: {})",
            record.namespace,
            if backup.spec.included_namespaces.is_empty() {
                "every namespace".to_owned()
            } else {
                backup.spec.included_namespaces.join(", ")
            }
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan() -> DisruptionPlan {
        serde_json::from_value(json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": "drain-n1", "uid": "p-uid"}, "spec": {"nodes": ["n1"]}
        }))
        .expect("a plan")
    }

    fn record(reused: bool) -> BackupRecord {
        serde_json::from_value(json!({
            "name": "drain-n1-shop-1", "namespace": "shop", "uid": "b-uid", "pvcs": ["data-db-0"],
            "attempt": 1, "reused": reused, "verified": true
        }))
        .expect("a record")
    }

    fn backup(phase: &str, plan: &str, plan_uid: &str, namespaces: &[&str]) -> Backup {
        serde_json::from_value(json!({
            "metadata": {"name": "drain-n1-shop-1", "namespace": "velero", "uid": "b-uid",
                "labels": {"snapdrain.io/plan": plan, "snapdrain.io/plan-uid": plan_uid,
                           "snapdrain.io/namespace": "shop"},
                "annotations": {"snapdrain.io/plan-name": plan}},
            "spec": {"includedNamespaces": namespaces},
            "status": {"phase": phase}
        }))
        .expect("a Backup")
    }

    #[test]
    fn the_plans_own_completed_backup_of_the_namespace_confirms_it() {
        let b = backup("Completed", "drain-n1", "p-uid", &["shop"]);
        assert_eq!(backup_confirms(&plan(), &record(false), Some(&b)), Ok(()));
    }

    #[test]
    fn a_snapshot_release_is_confirmed_by_the_plans_backup_past_the_cut_and_not_failed() {
        let p = plan();
        let r = record(false);
        for phase in [
            "InProgress",
            "WaitingForPluginOperations",
            "Finalizing",
            "Completed",
        ] {
            let b = backup(phase, "drain-n1", "p-uid", &["shop"]);
            assert_eq!(snapshot_confirms(&p, &r, Some(&b)), Ok(()), "{phase}");
        }
        for phase in [
            "New",
            "Queued",
            "Failed",
            "PartiallyFailed",
            "WaitingForPluginOperationsPartiallyFailed",
        ] {
            let b = backup(phase, "drain-n1", "p-uid", &["shop"]);
            let why = snapshot_confirms(&p, &r, Some(&b)).expect_err(phase);
            assert!(
                why.contains(&format!("is {phase}, not InProgress or")),
                "{why}"
            );
        }
        let foreign = backup("InProgress", "other", "o-uid", &["shop"]);
        assert!(snapshot_confirms(&p, &r, Some(&foreign)).is_err());
    }

    #[test]
    fn a_missing_failed_foreign_or_other_namespace_backup_does_not() {
        let p = plan();
        let r = record(false);
        let why = |b: Option<&Backup>| backup_confirms(&p, &r, b).expect_err("refused");
        assert!(why(None).contains("does not exist"));
        assert!(
            why(Some(&backup("Failed", "drain-n1", "p-uid", &["shop"])))
                .contains("is Failed, not Completed")
        );
        assert!(
            why(Some(&backup("InProgress", "drain-n1", "p-uid", &["shop"])))
                .contains("is InProgress")
        );
        assert!(
            why(Some(&backup("Completed", "other", "o-uid", &["shop"])))
                .contains("belongs to plan other")
        );
        // Same name, another plan object (deleted and created again).
        assert!(
            why(Some(&backup("Completed", "drain-n1", "old-uid", &["shop"])))
                .contains("belongs to plan")
        );
        assert!(
            why(Some(&backup("Completed", "drain-n1", "p-uid", &["web"])))
                .contains("does not include namespace shop")
        );
        assert!(
            why(Some(&backup("Completed", "drain-n1", "p-uid", &[]))).contains("every namespace")
        );
        let mut other_uid = backup("Completed", "drain-n1", "p-uid", &["shop"]);
        other_uid.metadata.uid = Some("x".into());
        assert!(why(Some(&other_uid)).contains("not the one the plan recorded"));
        let mut unlabelled = backup("Completed", "drain-n1", "p-uid", &["shop"]);
        unlabelled.metadata.labels = None;
        unlabelled.metadata.annotations = None;
        assert!(why(Some(&unlabelled)).contains("not made by snapdrain"));
    }

    #[test]
    fn a_reused_record_accepts_an_earlier_plans_backup() {
        let b = backup("Completed", "drain-n1-earlier", "e-uid", &["shop"]);
        assert_eq!(backup_confirms(&plan(), &record(true), Some(&b)), Ok(()));
        assert!(backup_confirms(&plan(), &record(false), Some(&b)).is_err());
    }
}
