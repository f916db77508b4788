//! Verifying: each Completed backup is checked in its bucket (velero-backup.json uid and phase, non-empty
//! tarball, every PVC succeeded in the volume info, the kopia repository) before anything is evicted.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::runtime::events::EventType;

use super::backups::{latest_index, namespaces};
use crate::backup::bucket::{self, BucketError, VerifyRequest};
use crate::backup::velero::resolve_location;
use crate::backup::verify::verification_plan;
use crate::controller::error::ControllerError;
use crate::controller::reconcile::PlanRun;
use crate::planning::{BackupProgress, PhaseFacts, classify_backup_phase, summarize_backups};
use crate::telemetry::metrics::ReasonLabel;

pub async fn run(
    run: &mut PlanRun,
    facts: &mut PhaseFacts,
) -> Result<Option<Duration>, ControllerError> {
    let spec = run.plan.spec.backup.clone();
    // One target per location: a reused Backup may sit in another BSL than this plan's own.
    let mut targets: std::collections::BTreeMap<String, _> = std::collections::BTreeMap::new();
    for i in 0..run.status.backups.len() {
        let record = run.status.backups[i].clone();
        if latest_index(&run.status.backups, &record.namespace) != Some(i)
            || record.verified
            || record.verification_error.is_some()
            || classify_backup_phase(record.phase.as_deref()) != BackupProgress::Completed
        {
            continue;
        }
        let Some(uid) = record.uid.clone() else {
            continue;
        };
        // The location Velero wrote into the Backup (the default BSL when the plan names none).
        let Some(location) = record
            .storage_location
            .clone()
            .or_else(|| spec.storage_location.clone())
        else {
            continue;
        };
        if !targets.contains_key(&location) {
            let t = resolve_location(
                &run.ctx.client,
                &spec.velero_namespace,
                &location,
                run.ctx.settings.velero_credentials_secret.as_ref(),
            )
            .await?;
            if t.insecure_skip_tls_verify {
                tracing::warn!(plan = %run.name(), location = %location, bucket = %t.bucket, "BackupStorageLocation sets config.insecureSkipTLSVerify: its backups are verified without checking the endpoint's TLS certificate");
            }
            targets.insert(location.clone(), t);
        }
        let Some(t) = targets.get(&location) else {
            continue;
        };
        let request = VerifyRequest {
            target: t,
            checks: verification_plan(
                t,
                &record.name,
                spec.method,
                std::slice::from_ref(&record.namespace),
            ),
            uid: &uid,
            pvcs: record
                .pvcs
                .iter()
                .map(|p| (record.namespace.clone(), p.clone()))
                .collect(),
        };
        let outcome = match bucket::connect(t, run.ctx.aws_config().await).await {
            Ok((client, _region)) => bucket::verify_backup(&client, request).await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(objects) => {
                let entry = &mut run.status.backups[i];
                entry.verified = true;
                entry.verified_objects = objects;
                entry.verified_at = Some(MicroTime(PlanRun::now()));
                if t.insecure_skip_tls_verify {
                    entry.message = Some(format!(
                        "verified without checking the TLS certificate of the endpoint: BackupStorageLocation {location} sets config.insecureSkipTLSVerify"
                    ));
                }
                tracing::info!(plan = %run.name(), backup = %record.name, bucket = %t.bucket, "backup verified in the bucket");
                run.event(
                    EventType::Normal,
                    "BackupVerified",
                    "Verify",
                    format!(
                        "Velero Backup {} verified in s3://{}/{}: {} objects, PVCs {}{}",
                        record.name,
                        t.bucket,
                        t.prefix,
                        run.status.backups[i].verified_objects.len(),
                        record.pvcs.join(", "),
                        if t.insecure_skip_tls_verify {
                            " (TLS certificate not checked: config.insecureSkipTLSVerify)"
                        } else {
                            ""
                        }
                    ),
                )
                .await;
            }
            Err(BucketError::Invalid(e)) => {
                let reason = match &e {
                    crate::backup::verify::VerifyError::Missing { .. } => "missing",
                    crate::backup::verify::VerifyError::UidMismatch { .. } => "uid_mismatch",
                    crate::backup::verify::VerifyError::WrongPhase { .. } => "wrong_phase",
                    crate::backup::verify::VerifyError::EmptyTarball { .. } => "empty_tarball",
                    crate::backup::verify::VerifyError::Volumes { .. } => "volume_failed",
                    crate::backup::verify::VerifyError::KopiaRepositoryMissing { .. } => {
                        "kopia_missing"
                    }
                    crate::backup::verify::VerifyError::Unreadable { .. } => "unreadable",
                };
                run.ctx
                    .metrics
                    .verification_failures
                    .get_or_create(&ReasonLabel {
                        reason: reason.into(),
                    })
                    .inc();
                let message = format!(
                    "backup {} failed verification in s3://{}: {e}",
                    record.name, t.bucket
                );
                tracing::warn!(plan = %run.name(), backup = %record.name, error = %e, "backup failed verification");
                run.event(
                    EventType::Warning,
                    "BackupVerificationFailed",
                    "Verify",
                    message.clone(),
                )
                .await;
                let entry = &mut run.status.backups[i];
                entry.verification_error = Some(e.to_string());
                entry.message = Some(message);
            }
            Err(e) if e.is_permanent() => {
                // A credentials file, CA bundle or setting that cannot work: the plan fails with why.
                tracing::warn!(plan = %run.name(), error = %e, "bucket cannot be read");
                run.event(
                    EventType::Warning,
                    "BucketUnreadable",
                    "Verify",
                    e.to_string(),
                )
                .await;
                return Err(e.into());
            }
            Err(e) => {
                // Loud, and nothing moves on: the plan stays here and the reconcile is retried.
                run.ctx
                    .metrics
                    .verification_failures
                    .get_or_create(&ReasonLabel {
                        reason: "unreachable".into(),
                    })
                    .inc();
                run.status.message = Some(e.to_string());
                run.event(
                    EventType::Warning,
                    "BucketUnreachable",
                    "Verify",
                    e.to_string(),
                )
                .await;
                run.save().await?;
                return Err(e.into());
            }
        }
    }
    let nss = namespaces(&run.status.backups);
    facts.backups = summarize_backups(&nss, &run.status.backups, spec.max_attempts);
    Ok(None)
}
