//! BackingUp: one Velero Backup per namespace and attempt, created idempotently (deterministic names), its
//! phase followed through the controller's watch on Backups; failed attempts retried with backoff up to
//! `backup.maxAttempts`; abandoned attempts deleted so they stop holding Velero's queue.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, MicroTime, Time};
use k8s_openapi::jiff::Timestamp;

use crate::api::plan::BackupScope;
use crate::api::status::{AbandonedBackup, BackupRecord, DisruptionPlanStatus};
use crate::api::velero::Backup;
use crate::backup::velero::{delete_backup_object, ensure_backup, get_backup, request_deletion};
use crate::controller::error::ControllerError;
use crate::controller::report::What;
use crate::controller::step::{Io, Next, Outcome, PlanView, Wake};
use crate::planning::backups::{
    AbandonAction, REUSE_EXPIRY_MARGIN, ReuseCheck, abandon_action, backup_timeout_left,
    build_delete_request, check_reused_backup, recorded_queue_position, scope_selectors,
    velero_deletes_in_phase,
};
use crate::planning::facts::backup_namespaces;
use crate::planning::{
    BackupNeed, BackupProgress, PlanRef, RetryDecision, backup_name, backup_retry,
    backup_timed_out, build_velero_backup, build_volume_policy, classify_backup,
    classify_backup_phase, retry_wait,
};

/// How long to wait before looking at a Backup again when no watch event came (the watch on Backups
/// normally wakes the plan first).
const RECHECK: Duration = Duration::from_secs(30);

/// How often a Backup waiting for the controller's first read of the DisruptionPolicy looks again.
const POLICY_WAIT: Duration = Duration::from_millis(200);

fn min_wait(wait: &mut Option<Duration>, d: Duration) {
    *wait = Some(wait.map_or(d, |w| w.min(d)));
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

/// The latest attempt of each namespace.
pub fn latest_records(records: &[BackupRecord]) -> Vec<&BackupRecord> {
    backup_namespaces(records)
        .iter()
        .filter_map(|ns| latest_index(records, ns).map(|i| &records[i]))
        .collect()
}

/// Takes and follows the emergency EBS snapshots a deadline may call for, advances every namespace's
/// latest attempt that still needs Velero, records its CSI snapshots' cuts and releases the pods they
/// save (`releaseNetworkVolumesAt: Snapshot`), then deletes abandoned attempts once that intent is
/// written.
pub async fn run(v: &PlanView<'_>, io: &Io<'_>) -> Result<Outcome, ControllerError> {
    let mut out = v.outcome();
    let mut wait = None;
    // Decided before any Velero Backup is created, so a namespace the snapshots save gets none.
    match super::emergency::advance(v, io, &mut out).await? {
        super::emergency::After::Nothing => {}
        super::emergency::After::Checkpoint => return Ok(out.then(Next::Checkpoint)),
        super::emergency::After::Wait(d) => min_wait(&mut wait, d),
        super::emergency::After::Fail(why) => return Ok(out.then(Next::Fail(why))),
    }
    let namespaces = crate::planning::phase::velero_namespaces(
        &backup_namespaces(&v.status.backups),
        &v.status.backups,
        &out.status.emergency_snapshots,
    );
    for ns in namespaces {
        if let Some(w) = advance(v, io, &ns, &mut out).await? {
            min_wait(&mut wait, w);
        }
    }
    if let Some(w) = super::csi_release::advance(v, io, &mut out).await? {
        min_wait(&mut wait, w);
    }
    // Intent before act: the decision to abandon is written before the deletion is asked for, so a
    // lost write cannot make the next pass mistake Velero's deletion for an outside one.
    if abandon_added(v.status, &out.status) {
        return Ok(out.then(Next::Checkpoint));
    }
    if let Some(w) = delete_abandoned(v, io, &mut out).await? {
        min_wait(&mut wait, w);
    }
    Ok(match wait {
        Some(recheck) => out.then(Next::Wait {
            wake: Wake::Never,
            recheck,
        }),
        None => out,
    })
}

/// True when `after` marks an attempt for deletion that `written` does not.
pub fn abandon_added(written: &DisruptionPlanStatus, after: &DisruptionPlanStatus) -> bool {
    after.backups.iter().any(|b| {
        b.abandoned == Some(AbandonedBackup::DeletePending)
            && !written
                .backups
                .iter()
                .any(|w| w.name == b.name && w.abandoned == Some(AbandonedBackup::DeletePending))
    })
}

/// Advances namespace `ns`'s latest attempt: check a reused backup, retry a failed one, create or read
/// the current one. Returns when to look again.
async fn advance(
    v: &PlanView<'_>,
    io: &Io<'_>,
    ns: &str,
    out: &mut Outcome,
) -> Result<Option<Duration>, ControllerError> {
    let velero_ns = &v.plan.spec.backup.velero_namespace;
    let Some(i) = latest_index(&out.status.backups, ns) else {
        return Ok(None);
    };
    let record = out.status.backups[i].clone();
    if record.reused && !record.verified {
        match reused_unusable(io, velero_ns, &record, v.now).await? {
            Some(reason) => replace_reused(out, i, &v.name(), &v.uid(), &reason),
            // Verification in the bucket (the Verifying step) decides.
            None => return Ok(None),
        }
    }
    let record = out.status.backups[i].clone();
    if record.reused || record.verified {
        return Ok(None);
    }
    match retry(&record, v, io.settings.backup_retry_cap) {
        Retry::No => {}
        Retry::Wait(left) => return Ok(Some(left)),
        Retry::Next(next, text) => {
            out.note(What::BackupRetry, text);
            out.status.backups.push(*next);
        }
    }
    let Some(i) = latest_index(&out.status.backups, ns) else {
        return Ok(None);
    };
    let record = out.status.backups[i].clone();
    if record.phase.is_some()
        && classify_backup_phase(record.phase.as_deref()) != BackupProgress::Waiting
    {
        return Ok(None);
    }
    if record.uid.is_none() && io.policy.is_none() {
        // The DisruptionPolicy's backup hooks go into the Backup: wait for its first read (at most
        // the policy's FIRST_POLICY_WAIT, then its defaults) rather than create one without them.
        return Ok(Some(POLICY_WAIT));
    }
    Ok(match current(v, io, i, out).await? {
        Some(backup) => observe(out, i, &backup, v.now, v.valid.backup_timeout),
        None => None,
    })
}

/// Record `i`'s Backup: created now if it never was, found after a restart; None when it was created
/// and is gone (deleted by Velero's GC, a person, or snapdrain abandoning it on a newer copy of this
/// status): never re-created, which would put an abandoned attempt back into Velero's queue.
async fn current(
    v: &PlanView<'_>,
    io: &Io<'_>,
    i: usize,
    out: &mut Outcome,
) -> Result<Option<Backup>, ControllerError> {
    let velero_ns = &v.plan.spec.backup.velero_namespace;
    let record = out.status.backups[i].clone();
    if let Some(b) = get_backup(io.client, velero_ns, &record.name).await? {
        return Ok(Some(b));
    }
    if record.uid.is_some() {
        let entry = &mut out.status.backups[i];
        entry.phase = Some("Deleted".into());
        entry.completed_at.get_or_insert(MicroTime(v.now));
        entry.message = Some(format!(
            "Velero Backup {velero_ns}/{} no longer exists",
            record.name
        ));
        return Ok(None);
    }
    let mut need = need_for(v, io, &record);
    need.skip_drivers = crate::planning::ebs_snapshots::skip_drivers(
        &record,
        &super::emergency::saved_claims(&out.status.emergency_snapshots),
        v.plan.spec.backup.scope,
    );
    // The policy's hooks as it stands now: the admission policy compares them with the live
    // DisruptionPolicy, so a Backup never carries hooks the admin has since changed or removed.
    need.hooks = crate::planning::backup_hooks::hooks_for_namespace(
        io.policy.as_ref().map_or(&[][..], |p| &p.backup_hooks),
        &record.namespace,
    );
    let plan_ref = PlanRef {
        name: &v.name(),
        uid: &v.uid(),
    };
    if let Some(policy) = build_volume_policy(&need, &v.plan.spec, &plan_ref, record.attempt) {
        crate::backup::velero::ensure_volume_policy(io.client, &policy).await?;
    }
    let body = build_velero_backup(&need, &v.plan.spec, &plan_ref, record.attempt);
    let created = ensure_backup(io.client, &body).await?;
    tracing::info!(backup = %record.name, namespace = %record.namespace, attempt = record.attempt, "created Velero Backup");
    out.note(
        What::BackupCreated,
        format!(
            "Velero Backup {velero_ns}/{} for namespace {} (PVCs {}), attempt {}",
            record.name,
            record.namespace,
            record.pvcs.join(", "),
            record.attempt
        ),
    );
    Ok(Some(created))
}

/// What to do about a failed latest attempt.
pub enum Retry {
    /// Not failed, or out of attempts (the phase machine decides).
    No,
    /// Failed; the next attempt starts after this backoff.
    Wait(Duration),
    /// Failed and due: this attempt's record, and the Event text.
    Next(Box<BackupRecord>, String),
}

/// Whether and when record `record` (the latest attempt of its namespace) is retried.
pub fn retry(record: &BackupRecord, v: &PlanView<'_>, cap: Duration) -> Retry {
    let max_attempts = v.plan.spec.backup.max_attempts;
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
    let Some(failure) = failure else {
        return Retry::No;
    };
    let RetryDecision::Retry {
        next_attempt: attempt,
        after,
    } = backup_retry(record.attempt, max_attempts, &failure)
    else {
        return Retry::No;
    };
    let since = record
        .completed_at
        .as_ref()
        .map(|t| t.0)
        .or(record.started_at.as_ref().map(|t| t.0))
        .unwrap_or(v.now);
    if let Some(left) = retry_wait(since, v.now, after.min(cap)) {
        return Retry::Wait(left);
    }
    let next = next_attempt(record, v);
    let text = format!(
        "backup {} of namespace {} failed ({failure}); retrying as {} (attempt {attempt} of {max_attempts})",
        record.name, record.namespace, next.name
    );
    Retry::Next(Box::new(next), text)
}

/// The attempt after `record`: the same namespace, workloads, claims and volumes, a fresh Backup name.
pub fn next_attempt(record: &BackupRecord, v: &PlanView<'_>) -> BackupRecord {
    let attempt = record.attempt + 1;
    BackupRecord {
        name: backup_name(
            &PlanRef {
                name: &v.name(),
                uid: &v.uid(),
            },
            &record.namespace,
            attempt,
        ),
        namespace: record.namespace.clone(),
        stateful_sets: record.stateful_sets.clone(),
        pvcs: record.pvcs.clone(),
        pods: record.pods.clone(),
        volumes: record.volumes.clone(),
        attempt,
        ..BackupRecord::default()
    }
}

/// Records what Velero says of record `i`'s Backup; returns when to look again.
pub fn observe(
    out: &mut Outcome,
    i: usize,
    backup: &Backup,
    now: Timestamp,
    timeout: Option<Duration>,
) -> Option<Duration> {
    let entry = &mut out.status.backups[i];
    let name = entry.name.clone();
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
        entry.started_at = Some(Time(now));
    }
    let status = backup.status.as_ref();
    entry.phase = status.and_then(|s| s.phase.clone()).or(Some("New".into()));
    // Velero 1.18 queues Backups whose namespaces overlap a running one: where this one waits, as the
    // record follows it (not at every renumbering).
    entry.queue_position = recorded_queue_position(
        entry.queue_position,
        status
            .filter(|s| s.phase.as_deref() == Some("Queued"))
            .and_then(|s| s.queue_position),
    );
    if let Some(h) = status.and_then(|s| s.hook_status) {
        entry.hooks = Some(h);
    }
    // Read from the Backup itself (not from what this pass meant to create), so a restart after a
    // lost status write still records what Velero was asked to run.
    entry.policy_hooks = crate::planning::backup_hooks::describe(
        backup.spec.hooks.as_ref().map_or(&[][..], |h| &h.resources),
    );
    match classify_backup(&name, status) {
        BackupProgress::Completed => {
            if entry.completed_at.is_none() {
                entry.completed_at = Some(MicroTime(now));
                if let Some(start) = &entry.started_at {
                    let took = now.duration_since(start.0).unsigned_abs();
                    out.note(What::BackupCompleted { took }, String::new());
                }
            }
            None
        }
        BackupProgress::Failed(reason) => {
            entry.completed_at.get_or_insert(MicroTime(now));
            entry.message = Some(reason);
            // Still running in Velero (a phase that can only end PartiallyFailed): delete it once Velero
            // allows, so it does not linger as a usable-looking backup.
            if !velero_deletes_in_phase(entry.phase.as_deref()) {
                entry.abandoned = Some(AbandonedBackup::DeletePending);
            }
            None
        }
        BackupProgress::Waiting => {
            let created = backup
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(now, |t| t.0);
            if backup_timed_out(created, now, timeout) {
                entry.phase = Some("Failed".into());
                entry.queue_position = None;
                entry.completed_at = Some(MicroTime(now));
                entry.message = Some(format!(
                    "Velero Backup {name} did not complete within backup.timeout"
                ));
                // Queued or running, it holds Velero's queue (--concurrent-backups 1): the retry would
                // wait behind it.
                entry.abandoned = Some(AbandonedBackup::DeletePending);
                return None;
            }
            // The watch on Backups wakes the plan on the next phase change; a Queued backup may not
            // change before its timeout, so look again then.
            let left = backup_timeout_left(created, now, timeout)
                .map_or(RECHECK, |l| l.max(Duration::from_millis(100)));
            Some(left.min(RECHECK))
        }
    }
}

/// Rebuilds what a record's Backup must select under the plan's `backup.scope`: the recorded pods by
/// name (`Pods`), or the StatefulSets' own selectors (`StatefulSet`; each pod by name when its
/// StatefulSet is gone). The selectors come from the shared StatefulSet cache, not one GET each:
/// `spec.selector` is immutable (kubernetes `pkg/apis/apps/validation/validation.go`
/// `ValidateStatefulSetUpdate`), so a cache a moment behind gives the same selector, and a StatefulSet
/// not in it is taken as gone (its pods by name).
fn need_for(v: &PlanView<'_>, io: &Io<'_>, record: &BackupRecord) -> BackupNeed {
    let scope = v.plan.spec.backup.scope;
    let mut sts_selectors: Vec<LabelSelector> = Vec::new();
    if scope == BackupScope::StatefulSet {
        for sts in &record.stateful_sets {
            let found = io.caches.stateful_sets.get(&record.namespace, sts);
            if let Some(sel) = found.as_deref().and_then(|s| s.selector())
                && !sts_selectors.contains(sel)
            {
                sts_selectors.push(sel.clone());
            }
        }
    }
    BackupNeed {
        namespace: record.namespace.clone(),
        stateful_sets: record.stateful_sets.clone(),
        pvcs: record.pvcs.clone(),
        pods: record.pods.clone(),
        volumes: record
            .volumes
            .iter()
            .map(|r| crate::planning::backups::PlannedVolume {
                record: r.clone(),
                auto_method: r.method,
            })
            .collect(),
        or_label_selectors: scope_selectors(scope, &record.pods, &sts_selectors),
        reuse: None,
        skip_drivers: Vec::new(),
        hooks: Vec::new(),
    }
}

/// Why the live Backup behind reused record `record` cannot stand in for a fresh one (None: it can, once
/// the bucket verification passes again).
async fn reused_unusable(
    io: &Io<'_>,
    velero_ns: &str,
    record: &BackupRecord,
    now: Timestamp,
) -> Result<Option<String>, ControllerError> {
    if let Some(e) = &record.verification_error {
        return Ok(Some(format!("it failed verification in the bucket: {e}")));
    }
    let live = get_backup(io.client, velero_ns, &record.name).await?;
    Ok(
        match check_reused_backup(
            &record.name,
            record.uid.as_deref(),
            live.as_ref(),
            now,
            REUSE_EXPIRY_MARGIN,
        ) {
            ReuseCheck::Usable => None,
            ReuseCheck::Unusable(reason) => Some(reason),
        },
    )
}

/// Replaces reused record `i` by this plan's own first attempt.
pub fn replace_reused(out: &mut Outcome, i: usize, plan: &str, uid: &str, reason: &str) {
    let old = out.status.backups[i].clone();
    let fresh = BackupRecord {
        name: backup_name(&PlanRef { name: plan, uid }, &old.namespace, 1),
        namespace: old.namespace.clone(),
        stateful_sets: old.stateful_sets.clone(),
        pvcs: old.pvcs.clone(),
        pods: old.pods.clone(),
        attempt: 1,
        ..BackupRecord::default()
    };
    tracing::info!(backup = %old.name, reason, "reused backup is not usable; making a fresh one");
    out.note(
        What::ReusedBackupUnusable,
        format!(
            "not reusing Velero Backup {} for namespace {}: {reason}; creating {}",
            old.name, old.namespace, fresh.name
        ),
    );
    out.status.backups[i] = fresh;
}

/// Asks Velero (through a DeleteBackupRequest) to delete each abandoned attempt it is willing to delete
/// now, acting only on marks already written; returns when to look again for those it still refuses.
async fn delete_abandoned(
    v: &PlanView<'_>,
    io: &Io<'_>,
    out: &mut Outcome,
) -> Result<Option<Duration>, ControllerError> {
    let velero_ns = &v.plan.spec.backup.velero_namespace;
    let mut wait = None;
    for (i, written) in v.status.backups.iter().enumerate() {
        if written.abandoned != Some(AbandonedBackup::DeletePending) {
            continue;
        }
        let name = &written.name;
        let Some(backup) = get_backup(io.client, velero_ns, name).await? else {
            out.status.backups[i].abandoned = Some(AbandonedBackup::Gone);
            continue;
        };
        let phase = backup.status.as_ref().and_then(|s| s.phase.as_deref());
        match abandon_action(phase, backup.spec.storage_location.as_deref()) {
            AbandonAction::Wait => min_wait(&mut wait, RECHECK),
            AbandonAction::DeleteObject => {
                delete_backup_object(io.client, velero_ns, name).await?;
                out.status.backups[i].abandoned = Some(AbandonedBackup::Deleted);
                tracing::info!(backup = %name, "deleted an abandoned backup attempt that never started");
                out.note(What::BackupDeleted, format!(
                    "deleted abandoned attempt {velero_ns}/{name}, still {}, so it stops holding Velero's backup queue (it never started: nothing is in the bucket)",
                    phase.unwrap_or("New")
                ));
            }
            AbandonAction::RequestDeletion => {
                let request = build_delete_request(name, backup.metadata.uid.as_deref(), velero_ns);
                request_deletion(io.client, &request).await?;
                out.status.backups[i].abandoned = Some(AbandonedBackup::DeleteRequested);
                tracing::info!(backup = %name, "requested deletion of an abandoned backup attempt");
                out.note(What::BackupDeleteRequested, format!(
                    "asked Velero to delete abandoned attempt {velero_ns}/{name} (DeleteBackupRequest {}) so it stops holding Velero's backup queue",
                    crate::planning::backups::delete_request_name(name)
                ));
            }
        }
    }
    Ok(wait)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{DisruptionPlan, ValidSpec};
    use serde_json::json;

    fn plan() -> DisruptionPlan {
        serde_json::from_value(json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": "p", "uid": "u-1"}, "spec": {"nodes": ["n1"], "backup": {"maxAttempts": 3}}
        }))
        .expect("a plan")
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("a timestamp")
    }

    fn failed(attempt: u32, completed: &str) -> BackupRecord {
        BackupRecord {
            name: format!("b-{attempt}"),
            namespace: "shop".into(),
            pvcs: vec!["data-db-0".into()],
            attempt,
            phase: Some("Failed".into()),
            completed_at: Some(MicroTime(at(completed))),
            ..BackupRecord::default()
        }
    }

    fn view<'a>(
        p: &'a DisruptionPlan,
        valid: &'a ValidSpec,
        status: &'a DisruptionPlanStatus,
        now: &str,
    ) -> PlanView<'a> {
        PlanView {
            plan: p,
            valid,
            status,
            now: at(now),
        }
    }

    #[test]
    fn a_failed_attempt_waits_its_backoff_then_becomes_the_next_attempt() {
        let (p, valid, status) = (
            plan(),
            ValidSpec::default(),
            DisruptionPlanStatus::default(),
        );
        let record = failed(1, "2026-12-03T10:00:00Z");
        let cap = Duration::from_secs(300);
        assert!(matches!(
            retry(
                &record,
                &view(&p, &valid, &status, "2026-12-03T10:00:05Z"),
                cap
            ),
            Retry::Wait(_)
        ));
        let Retry::Next(next, text) = retry(
            &record,
            &view(&p, &valid, &status, "2026-12-03T10:10:00Z"),
            cap,
        ) else {
            panic!("due for a retry");
        };
        assert_eq!(
            (next.attempt, next.namespace.as_str(), next.pvcs.len()),
            (2, "shop", 1)
        );
        assert!(next.phase.is_none() && next.uid.is_none());
        assert!(text.contains("attempt 2 of 3"), "{text}");
        // The last attempt is not retried: the phase machine fails the plan.
        assert!(matches!(
            retry(
                &failed(3, "2026-12-03T10:00:00Z"),
                &view(&p, &valid, &status, "2026-12-03T11:00:00Z"),
                cap
            ),
            Retry::No
        ));
    }

    #[test]
    fn a_completed_backup_is_timed_once_and_a_stuck_one_is_abandoned() {
        let now = at("2026-12-03T10:05:00Z");
        let mut record = failed(1, "2026-12-03T10:00:00Z");
        record.phase = None;
        record.completed_at = None;
        record.started_at = Some(Time(at("2026-12-03T10:00:00Z")));
        let mut out = Outcome::decide(DisruptionPlanStatus {
            backups: vec![record],
            ..Default::default()
        });
        let done: Backup = serde_json::from_value(json!({
            "apiVersion": "velero.io/v1", "kind": "Backup",
            "metadata": {"name": "b-1", "namespace": "velero", "uid": "bu-1"},
            "spec": {"storageLocation": "default"}, "status": {"phase": "Completed"}
        }))
        .expect("a Backup");
        assert_eq!(observe(&mut out, 0, &done, now, None), None);
        assert_eq!(
            out.notes[0].what,
            What::BackupCompleted {
                took: Duration::from_secs(300)
            }
        );
        assert_eq!(
            out.status.backups[0].storage_location.as_deref(),
            Some("default")
        );
        // Seen again: no second duration sample.
        assert_eq!(observe(&mut out, 0, &done, now, None), None);
        assert_eq!(out.notes.len(), 1);

        let mut queued = done.clone();
        queued.status = None;
        queued.metadata.creation_timestamp = Some(Time(at("2026-12-03T09:00:00Z")));
        let mut out = Outcome::decide(DisruptionPlanStatus {
            backups: vec![failed(1, "2026-12-03T09:00:00Z")],
            ..Default::default()
        });
        out.status.backups[0].phase = None;
        out.status.backups[0].completed_at = None;
        assert_eq!(
            observe(&mut out, 0, &queued, now, Some(Duration::from_secs(600))),
            None
        );
        assert_eq!(
            out.status.backups[0].abandoned,
            Some(AbandonedBackup::DeletePending)
        );
        assert!(abandon_added(&DisruptionPlanStatus::default(), &out.status));
        assert!(!abandon_added(&out.status.clone(), &out.status));
    }
}
