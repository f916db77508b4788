//! BackingUp: one Velero Backup per namespace and attempt, created idempotently (deterministic names), its
//! phase followed through the controller's watch on Backups; failed attempts retried with backoff up to
//! `backup.maxAttempts`.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, MicroTime, Time};
use kube::runtime::events::EventType;

use crate::api::plan::BackupScope;
use crate::api::status::{AbandonedBackup, BackupRecord};
use crate::backup::velero::{delete_backup_object, ensure_backup, get_backup, request_deletion};
use crate::controller::error::ControllerError;
use crate::controller::reconcile::PlanRun;
use crate::planning::backups::{
    AbandonAction, REUSE_EXPIRY_MARGIN, ReuseCheck, abandon_action, backup_timeout_left,
    build_delete_request, check_reused_backup, scope_selectors, velero_deletes_in_phase,
};
use crate::planning::{
    BackupNeed, BackupProgress, PhaseFacts, PlanRef, RetryDecision, backup_name, backup_retry,
    backup_timed_out, build_velero_backup, classify_backup, classify_backup_phase, retry_wait,
    summarize_backups,
};

/// How long to wait before looking at a Backup again when no watch event came (the watch on Backups
/// normally wakes the plan first).
const RECHECK: Duration = Duration::from_secs(30);

fn min_wait(wait: &mut Option<Duration>, d: Duration) {
    *wait = Some(wait.map_or(d, |w| w.min(d)));
}

/// Namespaces this plan backs up (one record per attempt each).
pub fn namespaces(records: &[BackupRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| r.namespace.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Index of the latest attempt's record for namespace `ns`.
pub(super) fn latest_index(records: &[BackupRecord], ns: &str) -> Option<usize> {
    records
        .iter()
        .enumerate()
        .filter(|(_, r)| r.namespace == ns)
        .max_by_key(|(_, r)| r.attempt)
        .map(|(i, _)| i)
}

/// Rebuilds what a record's Backup must select under the plan's `backup.scope`: the recorded pods by
/// name (`Pods`), or the StatefulSets' own selectors (`StatefulSet`; each pod by name when its
/// StatefulSet is gone). The selectors come from the shared StatefulSet cache, not one GET each:
/// `spec.selector` is immutable (kubernetes `pkg/apis/apps/validation/validation.go`
/// `ValidateStatefulSetUpdate`), so a cache a moment behind gives the same selector, and a StatefulSet
/// not in it is taken as gone (its pods by name).
async fn need_for(run: &PlanRun, record: &BackupRecord) -> Result<BackupNeed, ControllerError> {
    let scope = run.plan.spec.backup.scope;
    let mut sts_selectors: Vec<LabelSelector> = Vec::new();
    if scope == BackupScope::StatefulSet {
        let caches = run.ctx.synced_caches().await?;
        for sts in &record.stateful_sets {
            let found = caches.stateful_sets.get(&record.namespace, sts);
            if let Some(sel) = found
                .as_deref()
                .and_then(|s| s.spec.as_ref())
                .map(|s| &s.selector)
                && !sts_selectors.contains(sel)
            {
                sts_selectors.push(sel.clone());
            }
        }
    }
    let selectors = scope_selectors(scope, &record.pods, &sts_selectors);
    Ok(BackupNeed {
        namespace: record.namespace.clone(),
        stateful_sets: record.stateful_sets.clone(),
        pvcs: record.pvcs.clone(),
        pods: record.pods.clone(),
        or_label_selectors: selectors,
        reuse: None,
    })
}

/// Advances every namespace's latest attempt; fills `facts.backups`.
pub async fn run(
    run: &mut PlanRun,
    facts: &mut PhaseFacts,
) -> Result<Option<Duration>, ControllerError> {
    let max_attempts = run.plan.spec.backup.max_attempts;
    let velero_ns = run.plan.spec.backup.velero_namespace.clone();
    let mut wait: Option<Duration> = None;
    for ns in namespaces(&run.status.backups) {
        let Some(i) = latest_index(&run.status.backups, &ns) else {
            continue;
        };
        let record = run.status.backups[i].clone();
        if record.reused && !record.verified {
            if let Some(reason) = reused_unusable(run, &velero_ns, &record).await? {
                replace_reused(run, i, &ns, &reason).await;
            } else {
                // Verification in the bucket (the Verifying step) decides.
                continue;
            }
        }
        let record = run.status.backups[i].clone();
        if record.reused || record.verified {
            continue;
        }
        let failure = record
            .verification_error
            .as_ref()
            .map(|e| format!("verification failed: {e}"))
            .or_else(|| match classify_backup_phase(record.phase.as_deref()) {
                BackupProgress::Failed(reason) if record.phase.is_some() => {
                    Some(record.message.clone().unwrap_or(reason))
                }
                _ => None,
            });
        if let Some(failure) = failure {
            match backup_retry(record.attempt, max_attempts, &failure) {
                RetryDecision::GiveUp { .. } => {}
                RetryDecision::Retry {
                    next_attempt,
                    after,
                } => {
                    let after = after.min(run.ctx.settings.backup_retry_cap);
                    let since = record
                        .completed_at
                        .as_ref()
                        .map(|t| t.0)
                        .or(record.started_at.as_ref().map(|t| t.0))
                        .unwrap_or_else(PlanRun::now);
                    if let Some(left) = retry_wait(since, PlanRun::now(), after) {
                        wait = Some(wait.map_or(left, |w| w.min(left)));
                        continue;
                    }
                    let plan_ref_name = run.name();
                    let plan_uid = run.uid();
                    let plan_ref = PlanRef {
                        name: &plan_ref_name,
                        uid: &plan_uid,
                    };
                    let next = BackupRecord {
                        name: backup_name(&plan_ref, &ns, next_attempt),
                        attempt: next_attempt,
                        uid: None,
                        phase: None,
                        verified: false,
                        verified_objects: Vec::new(),
                        verification_error: None,
                        started_at: None,
                        completed_at: None,
                        verified_at: None,
                        message: None,
                        reused: false,
                        storage_location: None,
                        abandoned: None,
                        ..record.clone()
                    };
                    run.event(EventType::Warning, "BackupRetry", "Backup", format!(
                        "backup {} of namespace {ns} failed ({failure}); retrying as {} (attempt {next_attempt} of {max_attempts})",
                        record.name, next.name
                    ))
                    .await;
                    run.status.backups.push(next);
                }
            }
        }
        let Some(i) = latest_index(&run.status.backups, &ns) else {
            continue;
        };
        let record = run.status.backups[i].clone();
        if record.phase.is_some()
            && !matches!(
                classify_backup_phase(record.phase.as_deref()),
                BackupProgress::Waiting
            )
        {
            continue;
        }
        // Create (or find, after a restart) this attempt's Backup, then read its phase.
        let backup = match get_backup(&run.ctx.client, &velero_ns, &record.name).await? {
            Some(b) => b,
            // Created before (its uid is recorded) and gone now: deleted (by Velero's GC, a person, or
            // snapdrain abandoning it on a newer copy of this status). Never re-create it: that would
            // put an abandoned attempt back into Velero's queue.
            None if record.uid.is_some() => {
                let entry = &mut run.status.backups[i];
                entry.phase = Some("Deleted".into());
                entry.completed_at.get_or_insert(MicroTime(PlanRun::now()));
                entry.message = Some(format!(
                    "Velero Backup {velero_ns}/{} no longer exists",
                    record.name
                ));
                continue;
            }
            None => {
                let need = need_for(run, &record).await?;
                let plan_name = run.name();
                let plan_uid = run.uid();
                let body = build_velero_backup(
                    &need,
                    &run.plan.spec,
                    &PlanRef {
                        name: &plan_name,
                        uid: &plan_uid,
                    },
                    record.attempt,
                );
                let created = ensure_backup(&run.ctx.client, &body).await?;
                tracing::info!(plan = %plan_name, backup = %record.name, namespace = %ns, attempt = record.attempt, "created Velero Backup");
                run.event(
                    EventType::Normal,
                    "BackupCreated",
                    "Backup",
                    format!(
                        "Velero Backup {velero_ns}/{} for namespace {ns} (PVCs {}), attempt {}",
                        record.name,
                        record.pvcs.join(", "),
                        record.attempt
                    ),
                )
                .await;
                created
            }
        };
        let entry = &mut run.status.backups[i];
        entry.uid = backup.metadata.uid.clone();
        // Velero writes the resolved location (the default BSL when the plan names none) into the spec.
        if let Some(location) = backup
            .spec
            .storage_location
            .clone()
            .filter(|l| !l.is_empty())
        {
            entry.storage_location = Some(location);
        }
        if entry.started_at.is_none() {
            entry.started_at = Some(Time(PlanRun::now()));
        }
        let status = backup.status.as_ref();
        entry.phase = status.and_then(|s| s.phase.clone()).or(Some("New".into()));
        match classify_backup(&record.name, status) {
            BackupProgress::Completed => {
                if entry.completed_at.is_none() {
                    let now = PlanRun::now();
                    entry.completed_at = Some(MicroTime(now));
                    if let Some(start) = &entry.started_at {
                        run.ctx
                            .metrics
                            .backup_duration
                            .observe(now.duration_since(start.0).as_secs_f64());
                    }
                }
            }
            BackupProgress::Failed(reason) => {
                entry.completed_at.get_or_insert(MicroTime(PlanRun::now()));
                entry.message = Some(reason);
                // Still running in Velero (a phase that can only end PartiallyFailed): delete it once
                // Velero allows, so it does not linger as a usable-looking backup.
                if !velero_deletes_in_phase(entry.phase.as_deref()) {
                    entry.abandoned = Some(AbandonedBackup::DeletePending);
                }
            }
            BackupProgress::Waiting => {
                let created = backup
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0)
                    .unwrap_or_else(PlanRun::now);
                if backup_timed_out(created, PlanRun::now(), run.valid.backup_timeout) {
                    entry.phase = Some("Failed".into());
                    entry.completed_at = Some(MicroTime(PlanRun::now()));
                    entry.message = Some(format!(
                        "Velero Backup {} did not complete within backup.timeout",
                        record.name
                    ));
                    // Queued or running, it holds Velero's queue (--concurrent-backups 1): the retry
                    // would wait behind it.
                    entry.abandoned = Some(AbandonedBackup::DeletePending);
                } else {
                    // The watch on Backups wakes the plan on the next phase change; a Queued backup
                    // may not change before its timeout, so look again then.
                    let left =
                        backup_timeout_left(created, PlanRun::now(), run.valid.backup_timeout)
                            .map_or(RECHECK, |l| l.max(Duration::from_millis(100)));
                    min_wait(&mut wait, left.min(RECHECK));
                }
            }
        }
    }
    if let Some(w) = delete_abandoned(run, &velero_ns).await? {
        min_wait(&mut wait, w);
    }
    let nss = namespaces(&run.status.backups);
    facts.backups = summarize_backups(&nss, &run.status.backups, max_attempts);
    Ok(wait)
}

/// Why the live Backup behind reused record `record` cannot stand in for a fresh one (None: it can, once
/// the bucket verification passes again).
async fn reused_unusable(
    run: &PlanRun,
    velero_ns: &str,
    record: &BackupRecord,
) -> Result<Option<String>, ControllerError> {
    if let Some(e) = &record.verification_error {
        return Ok(Some(format!("it failed verification in the bucket: {e}")));
    }
    let live = get_backup(&run.ctx.client, velero_ns, &record.name).await?;
    Ok(
        match check_reused_backup(
            &record.name,
            record.uid.as_deref(),
            live.as_ref(),
            PlanRun::now(),
            REUSE_EXPIRY_MARGIN,
        ) {
            ReuseCheck::Usable => None,
            ReuseCheck::Unusable(reason) => Some(reason),
        },
    )
}

/// Replaces reused record `i` of namespace `ns` by this plan's own first attempt.
async fn replace_reused(run: &mut PlanRun, i: usize, ns: &str, reason: &str) {
    let plan_name = run.name();
    let plan_uid = run.uid();
    let old = run.status.backups[i].clone();
    let fresh = BackupRecord {
        name: backup_name(
            &PlanRef {
                name: &plan_name,
                uid: &plan_uid,
            },
            ns,
            1,
        ),
        namespace: ns.to_owned(),
        stateful_sets: old.stateful_sets.clone(),
        pvcs: old.pvcs.clone(),
        pods: old.pods.clone(),
        attempt: 1,
        ..BackupRecord::default()
    };
    tracing::info!(plan = %plan_name, backup = %old.name, reason, "reused backup is not usable; making a fresh one");
    run.event(
        EventType::Warning,
        "ReusedBackupUnusable",
        "Backup",
        format!(
            "not reusing Velero Backup {} for namespace {ns}: {reason}; creating {}",
            old.name, fresh.name
        ),
    )
    .await;
    run.status.backups[i] = fresh;
}

/// Asks Velero (through a DeleteBackupRequest) to delete each abandoned attempt it is willing to delete
/// now; returns when to look again for those it still refuses.
async fn delete_abandoned(
    run: &mut PlanRun,
    velero_ns: &str,
) -> Result<Option<Duration>, ControllerError> {
    let mut wait = None;
    // Persist the decision to abandon before acting on it: if this pass's later status write is lost
    // (a stale copy, a crash), the next pass still knows the attempt was abandoned, and finds it Gone
    // rather than mistaking Velero's deletion for an outside one.
    if run
        .status
        .backups
        .iter()
        .any(|b| b.abandoned == Some(AbandonedBackup::DeletePending))
    {
        run.save().await?;
    }
    for i in 0..run.status.backups.len() {
        if run.status.backups[i].abandoned != Some(AbandonedBackup::DeletePending) {
            continue;
        }
        let name = run.status.backups[i].name.clone();
        let Some(backup) = get_backup(&run.ctx.client, velero_ns, &name).await? else {
            run.status.backups[i].abandoned = Some(AbandonedBackup::Gone);
            continue;
        };
        let phase = backup.status.as_ref().and_then(|s| s.phase.as_deref());
        match abandon_action(phase, backup.spec.storage_location.as_deref()) {
            AbandonAction::Wait => {
                min_wait(&mut wait, RECHECK);
                continue;
            }
            AbandonAction::DeleteObject => {
                delete_backup_object(&run.ctx.client, velero_ns, &name).await?;
                run.status.backups[i].abandoned = Some(AbandonedBackup::Deleted);
                tracing::info!(plan = %run.name(), backup = %name, "deleted an abandoned backup attempt that never started");
                run.event(
                    EventType::Normal,
                    "BackupDeleted",
                    "Backup",
                    format!(
                        "deleted abandoned attempt {velero_ns}/{name}, still {}, so it stops holding Velero's backup queue (it never started: nothing is in the bucket)",
                        phase.unwrap_or("New")
                    ),
                )
                .await;
                continue;
            }
            AbandonAction::RequestDeletion => {}
        }
        let request = build_delete_request(&name, backup.metadata.uid.as_deref(), velero_ns);
        request_deletion(&run.ctx.client, &request).await?;
        run.status.backups[i].abandoned = Some(AbandonedBackup::DeleteRequested);
        tracing::info!(plan = %run.name(), backup = %name, "requested deletion of an abandoned backup attempt");
        run.event(
            EventType::Normal,
            "BackupDeleteRequested",
            "Backup",
            format!(
                "asked Velero to delete abandoned attempt {velero_ns}/{name} (DeleteBackupRequest {}) so it stops holding Velero's backup queue",
                crate::planning::backups::delete_request_name(&name)
            ),
        )
        .await;
    }
    Ok(wait)
}
