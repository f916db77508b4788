//! Reads a backup's objects from its bucket with aws-sdk-s3 (GET and HEAD only: snapdrain never writes
//! under Velero's prefix) and runs the pure checks of [`super::verify`] on them.

use aws_config::SdkConfig;
use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sdk_s3::Client;
use aws_sdk_s3::config::Region;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};

use super::location::{S3Target, TargetCredentials};
use super::verify::{self, ObjectCheck, VerifyError};
use super::{credentials_file, insecure_tls};
use crate::api::status::VerifiedObject;

/// The region GetBucketRegion asks in when the location names none (velero-plugin-for-aws
/// `object_store.go` `Init`: `o.Region = "us-east-1"`).
const REGION_LOOKUP_REGION: &str = "us-east-1";

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
    /// The credentials could not be obtained. `permanent` when the file or profile itself is wrong.
    #[error("cannot get AWS credentials from {source_name}: {message}; {hint}")]
    Credentials {
        source_name: String,
        message: String,
        hint: &'static str,
        permanent: bool,
    },
    /// The CA bundle could not be used for TLS.
    #[error(
        "cannot use the CA bundle of the BackupStorageLocation for s3://{bucket}: {message}; fix objectStorage.caCertRef or caCert"
    )]
    Tls { bucket: String, message: String },
    /// The location names no region and the bucket's region could not be found.
    #[error(
        "cannot find the region of bucket {bucket} (the BackupStorageLocation has neither config.region nor config.s3Url): {message}; set config.region on the location"
    )]
    Region { bucket: String, message: String },
    /// The client that skips certificate verification (`config.insecureSkipTLSVerify`) could not be
    /// built: the crypto provider offers no safe protocol version.
    #[error(
        "cannot set up TLS without certificate verification (config.insecureSkipTLSVerify) for s3://{bucket}: {message}"
    )]
    InsecureTls { bucket: String, message: String },
    /// The endpoint's TLS handshake failed (an untrusted, expired or misnamed certificate): Velero's
    /// plugin reads the same settings, so this is the location's configuration, not an outage.
    #[error(
        "TLS handshake with {endpoint} for s3://{bucket} failed: {message}; the endpoint's certificate must be signed by a system CA or the one in the BackupStorageLocation's objectStorage.caCertRef (or caCert), or the location must set config.insecureSkipTLSVerify: \"true\" as Velero allows"
    )]
    TlsHandshake {
        endpoint: String,
        bucket: String,
        message: String,
    },
}

impl BucketError {
    /// An invalid backup is a verification verdict, handled by the verify step's retry policy; an
    /// unreachable bucket may come back, and so may the credential provider (STS, IMDS). A credentials
    /// file or profile that does not work, an unusable CA bundle or a certificate the location's TLS
    /// settings do not accept needs a person.
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::Invalid(_) | Self::Unreachable { .. } | Self::Region { .. } => false,
            Self::Credentials { permanent, .. } => *permanent,
            Self::Tls { .. } | Self::InsecureTls { .. } | Self::TlsHandshake { .. } => true,
        }
    }
}

/// An S3 client for a resolved BackupStorageLocation, with the location's region (looked up when it
/// names none). `own` is snapdrain's own AWS configuration: its identity stands in when Velero has no
/// credentials file, and its endpoint (if any) stands in for AWS S3.
pub async fn connect(target: &S3Target, own: &SdkConfig) -> Result<(Client, String), BucketError> {
    let mut builder = aws_sdk_s3::config::Builder::from(own).force_path_style(target.path_style);
    if let Some(endpoint) = &target.endpoint {
        builder = builder.endpoint_url(endpoint.clone());
    }
    // As Go's `InsecureSkipVerify` (velero-plugin-for-aws `config.go` `WithTLSSettings`), skipping
    // verification wins over a CA bundle.
    if target.insecure_skip_tls_verify {
        let client = insecure_tls::http_client().map_err(|e| BucketError::InsecureTls {
            bucket: target.bucket.clone(),
            message: e.to_string(),
        })?;
        builder = builder.http_client(client);
    } else if let Some(pem) = &target.ca_cert {
        builder = builder.http_client(tls_client(&target.bucket, pem)?);
    }
    let credentials = credentials(target, own).await?;
    builder = builder.credentials_provider(credentials);
    let region = match &target.region {
        Some(r) => r.clone(),
        None => {
            let lookup = Client::from_conf(
                builder
                    .clone()
                    .region(Region::from_static(REGION_LOOKUP_REGION))
                    .build(),
            );
            bucket_region(&lookup, &target.bucket).await?
        }
    };
    let client = Client::from_conf(builder.region(Region::new(region.clone())).build());
    Ok((client, region))
}

/// An HTTPS client trusting the system roots and `pem` (velero-plugin-for-aws `config.go`
/// `WithTLSSettings` appends `caCert` to `x509.SystemCertPool()`).
fn tls_client(
    bucket: &str,
    pem: &str,
) -> Result<aws_sdk_s3::config::SharedHttpClient, BucketError> {
    let context = TlsContext::builder()
        .with_trust_store(TrustStore::default().with_pem_certificate(pem.as_bytes().to_vec()))
        .build()
        .map_err(|e| BucketError::Tls {
            bucket: bucket.to_owned(),
            message: e.to_string(),
        })?;
    Ok(aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::AwsLc,
        ))
        .tls_context(context)
        .build_https())
}

/// The credentials of the location. A credentials file gives static keys only
/// ([`super::credentials_file`]): the plugin would also run its `credential_process` or assume its
/// `role_arn`, which snapdrain refuses to do on behalf of whoever can write Velero's Secret. Without a
/// file, snapdrain's own identity is fetched once now so a missing one fails here with its own message.
async fn credentials(
    target: &S3Target,
    own: &SdkConfig,
) -> Result<SharedCredentialsProvider, BucketError> {
    match &target.credentials {
        TargetCredentials::File {
            secret,
            origin,
            profile,
            contents,
        } => {
            let keys = credentials_file::static_keys(contents, profile).map_err(|e| {
                BucketError::Credentials {
                    source_name: format!(
                        "profile [{profile}] of Secret {} key {} ({origin})",
                        secret.name, secret.key
                    ),
                    message: e.to_string(),
                    hint: "fix the credentials file or config.profile of the location",
                    permanent: true,
                }
            })?;
            Ok(SharedCredentialsProvider::new(Credentials::new(
                keys.access_key_id,
                keys.secret_access_key,
                keys.session_token,
                None,
                "VeleroCredentialsFile",
            )))
        }
        TargetCredentials::Ambient => {
            let Some(provider) = own.credentials_provider() else {
                return Err(BucketError::Credentials {
                    source_name: "snapdrain's own AWS identity".into(),
                    message: "no credentials provider is configured".into(),
                    hint: "Velero runs without a credentials Secret, so snapdrain needs an IAM identity (IRSA or EKS Pod Identity) allowed s3:GetObject and s3:ListBucket on the bucket",
                    permanent: true,
                });
            };
            match provider.provide_credentials().await {
                Ok(_) => Ok(provider),
                Err(e) => Err(BucketError::Credentials {
                    source_name: "snapdrain's own AWS identity (Velero has no credentials Secret)"
                        .into(),
                    message: aws_smithy_types::error::display::DisplayErrorContext(&e).to_string(),
                    hint: "give snapdrain's service account an IAM role (IRSA or EKS Pod Identity) allowed s3:GetObject and s3:ListBucket on the bucket, or set --velero-credentials-secret",
                    permanent: matches!(
                        e,
                        CredentialsError::InvalidConfiguration(_)
                            | CredentialsError::CredentialsNotLoaded(_)
                    ),
                }),
            }
        }
    }
}

/// The bucket's region from HeadBucket's `x-amz-bucket-region`, which S3 sends on success and on the
/// 301/400/403 answers to a request made in the wrong region (velero-plugin-for-aws `object_store.go`
/// `Init` → aws-sdk-go-v2 `feature/s3/manager` `GetBucketRegion`).
async fn bucket_region(client: &Client, bucket: &str) -> Result<String, BucketError> {
    let header = match client.head_bucket().bucket(bucket).send().await {
        Ok(out) => out.bucket_region().map(str::to_owned),
        Err(SdkError::ServiceError(se)) => se
            .raw()
            .headers()
            .get("x-amz-bucket-region")
            .map(str::to_owned),
        Err(e) => {
            if let Some(message) = tls_failure(&e) {
                return Err(BucketError::TlsHandshake {
                    endpoint: "AWS S3".into(),
                    bucket: bucket.to_owned(),
                    message,
                });
            }
            return Err(BucketError::Region {
                bucket: bucket.to_owned(),
                message: aws_smithy_types::error::display::DisplayErrorContext(&e).to_string(),
            });
        }
    };
    header
        .filter(|r| !r.is_empty())
        .ok_or_else(|| BucketError::Region {
            bucket: bucket.to_owned(),
            message: "HeadBucket's answer has no x-amz-bucket-region header".into(),
        })
}

/// The TLS error in `e`'s chain, if the request failed in the handshake. hyper-rustls wraps the rustls
/// error in `io::Error`s, whose payload `source()` skips, so each one's payload is looked at too.
fn tls_failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            && let Some(found) = tls_failure(inner)
        {
            return Some(found);
        }
        next = err.source();
    }
    None
}

fn unreachable<E: ProvideErrorMetadata + std::error::Error + 'static>(
    target: &S3Target,
    key: &str,
    e: &SdkError<E, HttpResponse>,
) -> BucketError {
    let endpoint = target.endpoint.clone().unwrap_or_else(|| "AWS S3".into());
    if let Some(message) = tls_failure(e) {
        return BucketError::TlsHandshake {
            endpoint,
            bucket: target.bucket.clone(),
            message,
        };
    }
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
        endpoint,
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

/// The object at `key`, refused past `cap` bytes: by its Content-Length before reading, and while reading
/// (a server may send more than it announced, or none).
async fn get(
    client: &Client,
    target: &S3Target,
    key: &str,
    cap: u64,
) -> Result<Vec<u8>, BucketError> {
    let too_large = || BucketError::Invalid(verify::too_large(key, cap, ""));
    let mut request = client.get_object().bucket(&target.bucket).key(key);
    if let Some(k) = &target.sse_customer_key {
        request = request
            .sse_customer_algorithm("AES256")
            .sse_customer_key(&k.key)
            .sse_customer_key_md5(&k.key_md5);
    }
    match request.send().await {
        Ok(mut out) => {
            if out.content_length().is_some_and(|n| n.max(0) as u64 > cap) {
                return Err(too_large());
            }
            let mut data = Vec::new();
            while let Some(chunk) = out.body.next().await {
                let chunk = chunk.map_err(|e| BucketError::Unreachable {
                    endpoint: target.endpoint.clone().unwrap_or_default(),
                    bucket: target.bucket.clone(),
                    key: key.to_string(),
                    message: e.to_string(),
                })?;
                if (data.len() + chunk.len()) as u64 > cap {
                    return Err(too_large());
                }
                data.extend_from_slice(&chunk);
            }
            Ok(data)
        }
        Err(e) if is_not_found(&e) => Err(VerifyError::missing(key).into()),
        Err(e) => Err(unreachable(target, key, &e)),
    }
}

async fn head(client: &Client, target: &S3Target, key: &str) -> Result<Option<u64>, BucketError> {
    let mut request = client.head_object().bucket(&target.bucket).key(key);
    if let Some(k) = &target.sse_customer_key {
        request = request
            .sse_customer_algorithm("AES256")
            .sse_customer_key(&k.key)
            .sse_customer_key_md5(&k.key_md5);
    }
    match request.send().await {
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
    /// How the plan chose to back up each PVC ([`verify::check_volume_methods`]).
    pub volumes: Vec<crate::api::volume::VolumeRecord>,
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
                let bytes = get(client, req.target, key, verify::MAX_OBJECT_BYTES).await?;
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
                let bytes = get(client, req.target, key, verify::MAX_OBJECT_BYTES).await?;
                let results = verify::check_volume_info(key, &bytes, &req.pvcs)?;
                verify::check_volume_methods(key, &results, &req.volumes)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::velero::SecretKeyRef;
    use crate::backup::credentials::CredentialOrigin;

    fn target(contents: &str, profile: &str) -> S3Target {
        S3Target {
            endpoint: Some("http://127.0.0.1:9".into()),
            bucket: "velero".into(),
            prefix: String::new(),
            region: Some("us-east-1".into()),
            path_style: true,
            ca_cert: None,
            insecure_skip_tls_verify: false,
            credentials: TargetCredentials::File {
                secret: SecretKeyRef {
                    name: "velero".into(),
                    key: "cloud".into(),
                },
                origin: CredentialOrigin::Deployment("velero".into()),
                profile: profile.into(),
                contents: contents.into(),
            },
            sse_customer_key: None,
        }
    }

    fn own() -> SdkConfig {
        SdkConfig::builder().build()
    }

    #[tokio::test]
    async fn static_keys_in_credentials_or_config_form() {
        for file in [
            "[backup]\naws_access_key_id = AK\naws_secret_access_key = SK\n",
            "[profile backup]\naws_access_key_id = AK\naws_secret_access_key = SK\n",
        ] {
            let provider = credentials(&target(file, "backup"), &own())
                .await
                .unwrap_or_else(|e| panic!("{file:?}: {e}"));
            let c = provider.provide_credentials().await.expect("credentials");
            assert_eq!(c.access_key_id(), "AK");
        }
    }

    #[tokio::test]
    async fn a_missing_profile_fails_the_plan_with_its_name() {
        let e = credentials(
            &target("[other]\naws_access_key_id = a\n", "backup"),
            &own(),
        )
        .await
        .expect_err("no such profile");
        assert!(e.is_permanent(), "{e}");
        assert!(e.to_string().contains("profile [backup]"), "{e}");
    }

    #[tokio::test]
    async fn a_profile_with_another_credential_source_is_refused() {
        let file = "[default]\naws_access_key_id = a\naws_secret_access_key = b\ncredential_process = /bin/true\n";
        let e = credentials(&target(file, "default"), &own())
            .await
            .expect_err("refused");
        assert!(e.is_permanent(), "{e}");
        assert!(e.to_string().contains("sets credential_process"), "{e}");
    }

    #[tokio::test]
    async fn ambient_identity_needs_a_provider() {
        let mut t = target("", "default");
        t.credentials = TargetCredentials::Ambient;
        let e = credentials(&t, &own()).await.expect_err("no provider");
        assert!(e.is_permanent(), "{e}");
        assert!(e.to_string().contains("IRSA"), "{e}");
    }
}
