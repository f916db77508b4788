//! Reads a backup's objects from its bucket with aws-sdk-s3 (GET and HEAD only: snapdrain never writes
//! under Velero's prefix) and runs the pure checks of [`super::verify`] on them.

use aws_sdk_s3::Client;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::{Credentials, Region};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};

use super::location::S3Target;
use super::verify::{self, ObjectCheck, VerifyError};
use crate::api::status::VerifiedObject;

/// Why a verification did not succeed: the backup is bad, or the bucket could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    /// The bucket answered, and the backup is not what it must be.
    #[error(transparent)]
    Invalid(#[from] VerifyError),
    /// The bucket did not answer properly (network, credentials, outage): the step fails loudly and is
    /// retried; nothing is evicted meanwhile.
    #[error(
        "cannot read s3://{bucket}/{key} at {endpoint}: {message}; check that the BackupStorageLocation's endpoint is reachable from snapdrain and its credentials are valid"
    )]
    Unreachable {
        endpoint: String,
        bucket: String,
        key: String,
        message: String,
    },
}

impl BucketError {
    /// An invalid backup is a verification verdict, handled by the verify step's retry policy; an
    /// unreachable bucket may come back. Neither fails the plan on its own.
    pub fn is_permanent(&self) -> bool {
        false
    }
}

/// An S3 client for a resolved BackupStorageLocation.
pub fn client(target: &S3Target) -> Client {
    let creds = Credentials::new(
        target.access_key_id.clone(),
        target.secret_access_key.clone(),
        target.session_token.clone(),
        None,
        "backup-storage-location",
    );
    let mut builder = aws_sdk_s3::Config::builder()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .region(Region::new(target.region.clone()))
        .credentials_provider(creds)
        .force_path_style(target.path_style);
    if let Some(endpoint) = &target.endpoint {
        builder = builder.endpoint_url(endpoint.clone());
    }
    Client::from_conf(builder.build())
}

fn unreachable<E: ProvideErrorMetadata + std::error::Error + 'static>(
    target: &S3Target,
    key: &str,
    e: &SdkError<E, HttpResponse>,
) -> BucketError {
    let message = match e {
        SdkError::ServiceError(se) => {
            let err = se.err();
            format!(
                "{}: {}",
                err.code().unwrap_or("error"),
                err.message().unwrap_or("")
            )
        }
        other => aws_smithy_types::error::display::DisplayErrorContext(other).to_string(),
    };
    BucketError::Unreachable {
        endpoint: target.endpoint.clone().unwrap_or_else(|| "AWS S3".into()),
        bucket: target.bucket.clone(),
        key: key.to_string(),
        message,
    }
}

fn is_not_found<E: ProvideErrorMetadata>(e: &SdkError<E, HttpResponse>) -> bool {
    match e {
        SdkError::ServiceError(se) => {
            se.raw().status().as_u16() == 404
                || matches!(se.err().code(), Some("NoSuchKey") | Some("NotFound"))
        }
        _ => false,
    }
}

async fn get(client: &Client, target: &S3Target, key: &str) -> Result<Vec<u8>, BucketError> {
    match client
        .get_object()
        .bucket(&target.bucket)
        .key(key)
        .send()
        .await
    {
        Ok(out) => {
            let data = out
                .body
                .collect()
                .await
                .map_err(|e| BucketError::Unreachable {
                    endpoint: target.endpoint.clone().unwrap_or_default(),
                    bucket: target.bucket.clone(),
                    key: key.to_string(),
                    message: e.to_string(),
                })?;
            Ok(data.into_bytes().to_vec())
        }
        Err(e) if is_not_found(&e) => Err(VerifyError::missing(key).into()),
        Err(e) => Err(unreachable(target, key, &e)),
    }
}

async fn head(client: &Client, target: &S3Target, key: &str) -> Result<Option<u64>, BucketError> {
    match client
        .head_object()
        .bucket(&target.bucket)
        .key(key)
        .send()
        .await
    {
        Ok(out) => Ok(Some(out.content_length().unwrap_or(0).max(0) as u64)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(unreachable(target, key, &e)),
    }
}

/// What verification of one backup needs to know.
pub struct VerifyRequest<'a> {
    pub target: &'a S3Target,
    pub checks: Vec<ObjectCheck>,
    /// The cluster Backup's uid, which the bucket copy must carry.
    pub uid: &'a str,
    /// `(namespace, pvc)` pairs that must be backed up.
    pub pvcs: Vec<(String, String)>,
}

/// Runs every check; returns the objects verified with their sizes.
pub async fn verify_backup(
    client: &Client,
    req: VerifyRequest<'_>,
) -> Result<Vec<VerifiedObject>, BucketError> {
    let mut verified = Vec::new();
    for check in &req.checks {
        match check {
            ObjectCheck::BackupJson(key) => {
                let bytes = get(client, req.target, key).await?;
                verify::check_backup_json(key, &bytes, req.uid)?;
                verified.push(VerifiedObject {
                    key: key.clone(),
                    size: bytes.len() as u64,
                });
            }
            ObjectCheck::Tarball(key) => {
                let size = head(client, req.target, key)
                    .await?
                    .ok_or_else(|| VerifyError::missing(key))?;
                verify::check_tarball_size(key, size)?;
                verified.push(VerifiedObject {
                    key: key.clone(),
                    size,
                });
            }
            ObjectCheck::VolumeInfo(key) => {
                let bytes = get(client, req.target, key).await?;
                verify::check_volume_info(key, &bytes, &req.pvcs)?;
                verified.push(VerifiedObject {
                    key: key.clone(),
                    size: bytes.len() as u64,
                });
            }
            ObjectCheck::KopiaRepository(key) => {
                let size = head(client, req.target, key).await?;
                verify::check_kopia_repository(key, size)?;
                verified.push(VerifiedObject {
                    key: key.clone(),
                    size: size.unwrap_or(0),
                });
            }
        }
    }
    Ok(verified)
}
