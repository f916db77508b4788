//! Verifying: each Completed backup is checked in its bucket (velero-backup.json uid and phase, non-empty
//! tarball, every PVC succeeded in the volume info, the kopia repository) before anything is evicted.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

use super::backups::latest_index;
use crate::api::status::{BackupRecord, DisruptionPlanStatus, VerifiedObject};
use crate::backup::bucket::{self, BucketError, VerifyRequest};
use crate::backup::location::S3Target as BucketTarget;
use crate::backup::velero::resolve_location;
use crate::backup::verify::{VerifyError, verification_plan};
use crate::controller::error::ControllerError;
use crate::controller::report::What;
use crate::controller::step::{Io, Next, Outcome, PlanView};
use crate::planning::{BackupProgress, classify_backup_phase};

pub async fn run(v: &PlanView<'_>, io: &Io<'_>) -> Result<Outcome, ControllerError> {
    let spec = &v.plan.spec.backup;
    let mut out = v.outcome();
    // One target per location: a reused Backup may sit in another BSL than this plan's own.
    let mut targets: BTreeMap<String, BucketTarget> = BTreeMap::new();
    for (i, location) in to_verify(v.status, spec.storage_location.as_deref()) {
        if !targets.contains_key(&location) {
            let t = resolve_location(
                io.client,
                &spec.velero_namespace,
                &location,
                io.settings.velero_credentials_secret.as_ref(),
            )
            .await?;
            if t.insecure_skip_tls_verify {
                tracing::warn!(location = %location, bucket = %t.bucket, "BackupStorageLocation sets config.insecureSkipTLSVerify: its backups are verified without checking the endpoint's TLS certificate");
            }
            targets.insert(location.clone(), t);
        }
        let Some(t) = targets.get(&location) else {
            continue;
        };
        let record = &v.status.backups[i];
        let request = VerifyRequest {
            target: t,
            checks: verification_plan(
                t,
                &record.name,
                crate::backup::verify::kopia_expected(spec.method, &record.volumes),
                std::slice::from_ref(&record.namespace),
            ),
            uid: record.uid.as_deref().unwrap_or_default(),
            pvcs: record
                .pvcs
                .iter()
                .map(|p| (record.namespace.clone(), p.clone()))
                .collect(),
            volumes: record.volumes.clone(),
        };
        let result = match bucket::connect(t, io.cloud.aws_config().await).await {
            Ok((client, _region)) => bucket::verify_backup(&client, request).await,
            Err(e) => Err(e),
        };
        if let Some(next) = record_result(&mut out, i, t, &location, result, v.now) {
            return Ok(out.then(next));
        }
    }
    Ok(out)
}

/// The records to verify now, with their location: the latest attempt of each namespace, Completed, not
/// verified nor failed yet, created (a uid), in a known location (the one Velero wrote into the Backup,
/// else the plan's).
pub fn to_verify(
    status: &DisruptionPlanStatus,
    plan_location: Option<&str>,
) -> Vec<(usize, String)> {
    status
        .backups
        .iter()
        .enumerate()
        .filter(|(i, r)| {
            latest_index(&status.backups, &r.namespace) == Some(*i)
                && !r.verified
                && r.verification_error.is_none()
                && r.uid.is_some()
                && classify_backup_phase(r.phase.as_deref()) == BackupProgress::Completed
        })
        .filter_map(|(i, r)| {
            let location = r.storage_location.as_deref().or(plan_location)?;
            Some((i, location.to_owned()))
        })
        .collect()
}

/// Records what the bucket said about record `i`, with the note to announce. Some(next) ends the call:
/// the bucket cannot be read (retried loudly; permanent problems fail the plan).
pub fn record_result(
    out: &mut Outcome,
    i: usize,
    t: &BucketTarget,
    location: &str,
    result: Result<Vec<VerifiedObject>, BucketError>,
    now: Timestamp,
) -> Option<Next> {
    let name = out.status.backups[i].name.clone();
    match result {
        Ok(objects) => {
            let entry = &mut out.status.backups[i];
            entry.verified = true;
            entry.verified_objects = objects;
            entry.verified_at = Some(MicroTime(now));
            if t.insecure_skip_tls_verify {
                entry.message = Some(format!(
                    "verified without checking the TLS certificate of the endpoint: BackupStorageLocation {location} sets config.insecureSkipTLSVerify"
                ));
            }
            tracing::info!(backup = %name, bucket = %t.bucket, "backup verified in the bucket");
            let text = verified_text(&out.status.backups[i], t);
            out.note(What::BackupVerified, text);
            None
        }
        Err(BucketError::Invalid(e)) => {
            let message = format!(
                "backup {name} failed verification in s3://{}: {e}",
                t.bucket
            );
            tracing::warn!(backup = %name, error = %e, "backup failed verification");
            out.note(
                What::BackupVerificationFailed {
                    reason: failure_reason(&e),
                },
                message.clone(),
            );
            let entry = &mut out.status.backups[i];
            entry.verification_error = Some(e.to_string());
            entry.message = Some(message);
            None
        }
        Err(e) if e.is_permanent() => {
            // A credentials file, CA bundle or setting that cannot work: the plan fails with why.
            tracing::warn!(error = %e, "bucket cannot be read");
            out.note(What::BucketUnreadable, e.to_string());
            Some(Next::Retry(e.into()))
        }
        Err(e) => {
            // Loud, and nothing moves on: the plan stays here and the pass is retried.
            out.status.message = Some(e.to_string());
            out.note(What::BucketUnreachable, e.to_string());
            Some(Next::Retry(e.into()))
        }
    }
}

fn verified_text(record: &BackupRecord, t: &BucketTarget) -> String {
    format!(
        "Velero Backup {} verified in s3://{}/{}: {} objects, PVCs {}{}",
        record.name,
        t.bucket,
        t.prefix,
        record.verified_objects.len(),
        record.pvcs.join(", "),
        if t.insecure_skip_tls_verify {
            " (TLS certificate not checked: config.insecureSkipTLSVerify)"
        } else {
            ""
        }
    )
}

/// The `reason` label of `snapdrain_verification_failures_total`.
fn failure_reason(e: &VerifyError) -> &'static str {
    match e {
        VerifyError::Missing { .. } => "missing",
        VerifyError::UidMismatch { .. } => "uid_mismatch",
        VerifyError::WrongPhase { .. } => "wrong_phase",
        VerifyError::EmptyTarball { .. } => "empty_tarball",
        VerifyError::Volumes { .. } => "volume_failed",
        VerifyError::KopiaRepositoryMissing { .. } => "kopia_missing",
        VerifyError::Unreadable { .. } => "unreadable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ns: &str, attempt: u32, phase: &str) -> BackupRecord {
        BackupRecord {
            name: format!("b-{ns}-{attempt}"),
            namespace: ns.into(),
            attempt,
            uid: Some(format!("uid-{ns}-{attempt}")),
            phase: Some(phase.into()),
            ..BackupRecord::default()
        }
    }

    #[test]
    fn only_the_latest_completed_unverified_attempt_with_a_location_is_verified() {
        let mut verified = record("c", 1, "Completed");
        verified.verified = true;
        let mut elsewhere = record("d", 1, "Completed");
        elsewhere.storage_location = Some("backup-east".into());
        let status = DisruptionPlanStatus {
            backups: vec![
                record("a", 1, "Completed"),
                record("a", 2, "InProgress"),
                record("b", 1, "Completed"),
                verified,
                elsewhere,
            ],
            ..Default::default()
        };
        assert_eq!(
            to_verify(&status, Some("default")),
            vec![(2, "default".to_string()), (4, "backup-east".to_string())]
        );
        assert_eq!(
            to_verify(&status, None),
            vec![(4, "backup-east".to_string())]
        );
    }

    #[test]
    fn an_unreachable_bucket_is_retried_loudly_and_a_bad_backup_is_recorded() {
        let t = BucketTarget {
            endpoint: None,
            bucket: "velero".into(),
            prefix: String::new(),
            region: None,
            path_style: false,
            ca_cert: None,
            insecure_skip_tls_verify: false,
            credentials: crate::backup::location::TargetCredentials::Ambient,
            sse_customer_key: None,
        };
        let status = DisruptionPlanStatus {
            backups: vec![record("a", 1, "Completed")],
            ..Default::default()
        };
        let now: Timestamp = "2026-12-03T10:00:00Z".parse().expect("a timestamp");
        let mut out = Outcome::decide(status.clone());
        let bad = Err(BucketError::Invalid(VerifyError::Missing {
            key: "backups/b/velero-backup.json".into(),
        }));
        assert!(record_result(&mut out, 0, &t, "default", bad, now).is_none());
        assert!(out.status.backups[0].verification_error.is_some());
        assert_eq!(
            out.notes[0].what,
            What::BackupVerificationFailed { reason: "missing" }
        );

        let mut out = Outcome::decide(status);
        let ok = Ok(vec![VerifiedObject::default()]);
        assert!(record_result(&mut out, 0, &t, "default", ok, now).is_none());
        assert!(out.status.backups[0].verified);
        assert_eq!(out.status.backups[0].verified_at, Some(MicroTime(now)));
        assert_eq!(out.notes[0].what, What::BackupVerified);
    }
}
