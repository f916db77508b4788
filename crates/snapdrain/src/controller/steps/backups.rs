//! BackingUp: one Velero Backup per namespace and attempt, created idempotently (deterministic names), its
//! phase followed through the controller's watch on Backups; failed attempts retried with backoff up to
//! `backup.maxAttempts`.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, MicroTime, Time};
use kube::api::Api;
use kube::runtime::events::EventType;

use crate::api::status::BackupRecord;
use crate::backup::velero::{ensure_backup, get_backup};
use crate::controller::error::ControllerError;
use crate::controller::reconcile::PlanRun;
use crate::planning::{
    BackupNeed, BackupProgress, PhaseFacts, PlanRef, RetryDecision, backup_name, backup_retry,
    backup_timed_out, build_velero_backup, classify_backup, classify_backup_phase, retry_wait,
    summarize_backups,
};

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

/// Rebuilds what a record's Backup must select: the StatefulSets' own selectors (read now), or each pod by
/// name when its StatefulSet is gone.
async fn need_for(run: &PlanRun, record: &BackupRecord) -> Result<BackupNeed, ControllerError> {
    let api: Api<StatefulSet> = Api::namespaced(run.ctx.client.clone(), &record.namespace);
    let mut selectors: Vec<LabelSelector> = Vec::new();
    for sts in &record.stateful_sets {
        let found = api
            .get_opt(sts)
            .await
            .map_err(|source| ControllerError::Read {
                what: format!("StatefulSet {}/{sts}", record.namespace),
                source,
            })?;
        if let Some(sel) = found.and_then(|s| s.spec).map(|s| s.selector)
            && !selectors.contains(&sel)
        {
            selectors.push(sel);
        }
    }
    if selectors.is_empty() {
        for pod in &record.pods {
            let name = pod.rsplit('/').next().unwrap_or(pod);
            selectors.push(LabelSelector {
                match_labels: Some(
                    [(
                        "statefulset.kubernetes.io/pod-name".to_string(),
                        name.to_string(),
                    )]
                    .into(),
                ),
                match_expressions: None,
            });
        }
    }
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
                } else {
                    // The watch on Backups wakes the plan on the next phase change.
                    wait = Some(
                        wait.map_or(Duration::from_secs(30), |w| w.min(Duration::from_secs(30))),
                    );
                }
            }
        }
    }
    let nss = namespaces(&run.status.backups);
    facts.backups = summarize_backups(&nss, &run.status.backups, max_attempts);
    Ok(wait)
}
