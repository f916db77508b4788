//! From a Velero BackupStorageLocation (and its credentials Secret) to the S3 bucket, prefix, endpoint and
//! keys the verifier reads. Pure: the caller fetches the BSL and the Secret.
//!
//! Follows velero-plugin-for-aws: bucket and prefix from `spec.objectStorage`, endpoint `config.s3Url`,
//! path-style when `config.s3ForcePathStyle == "true"`, `config.region`; credentials from
//! `spec.credential` or else Secret `cloud-credentials` key `cloud`, an AWS shared-credentials INI file whose
//! `[config.profile or default]` section holds the keys.

use std::fmt;

use k8s_openapi::api::core::v1::Secret;
use thiserror::Error;

use crate::api::velero::{BackupStorageLocation, SecretKeyRef};

/// Velero's server-wide credentials Secret (`velero install --secret-file`).
pub const DEFAULT_CREDENTIAL_SECRET: &str = "cloud-credentials";
/// Key of the INI file in that Secret.
pub const DEFAULT_CREDENTIAL_KEY: &str = "cloud";
/// Region when the BSL names none (AWS SDK default).
pub const DEFAULT_REGION: &str = "us-east-1";

/// Where a BSL's objects are and how to reach them.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Target {
    /// `config.s3Url` (MinIO and other S3-compatible stores); None means AWS S3.
    pub endpoint: Option<String>,
    pub bucket: String,
    /// Without leading or trailing slashes; empty when the BSL has no prefix.
    pub prefix: String,
    pub region: String,
    pub path_style: bool,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

// Keys stay out of logs.
impl fmt::Debug for S3Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Target")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("region", &self.region)
            .field("path_style", &self.path_style)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl S3Target {
    /// `<prefix>/<rest>`, or `<rest>` without a prefix.
    pub fn key(&self, rest: &str) -> String {
        if self.prefix.is_empty() {
            rest.to_owned()
        } else {
            format!("{}/{rest}", self.prefix)
        }
    }
}

/// Why a BSL cannot be turned into an [`S3Target`].
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum LocationError {
    #[error(
        "BackupStorageLocation {bsl} uses provider {provider:?}; snapdrain verifies only S3-compatible locations (provider aws or velero.io/aws). Use backup.policy best-effort or point backup.storageLocation at an S3/MinIO location"
    )]
    UnsupportedProvider { bsl: String, provider: String },
    #[error("BackupStorageLocation {bsl} has no spec.objectStorage.bucket; set it")]
    NoBucket { bsl: String },
    #[error(
        "BackupStorageLocation {bsl} is {phase}: {message}. Fix the location (velero backup-location get) before draining"
    )]
    Unavailable {
        bsl: String,
        phase: String,
        message: String,
    },
    #[error(
        "credentials Secret {namespace}/{secret} of BackupStorageLocation {bsl} does not exist; create it or set spec.credential on the location"
    )]
    SecretMissing {
        bsl: String,
        namespace: String,
        secret: String,
    },
    #[error(
        "credentials Secret {secret} of BackupStorageLocation {bsl} has no key {key:?}; add it or fix spec.credential.key"
    )]
    KeyMissing {
        bsl: String,
        secret: String,
        key: String,
    },
    #[error(
        "key {key:?} of Secret {secret} (BackupStorageLocation {bsl}) is not an AWS credentials file: {reason}"
    )]
    BadCredentialsFile {
        bsl: String,
        secret: String,
        key: String,
        reason: String,
    },
    #[error(
        "key {key:?} of Secret {secret} (BackupStorageLocation {bsl}) has no [{profile}] profile; add it or set config.profile on the location"
    )]
    ProfileMissing {
        bsl: String,
        secret: String,
        key: String,
        profile: String,
    },
    #[error(
        "profile [{profile}] in key {key:?} of Secret {secret} (BackupStorageLocation {bsl}) has no {field}; add it"
    )]
    FieldMissing {
        bsl: String,
        secret: String,
        key: String,
        profile: String,
        field: &'static str,
    },
}

impl LocationError {
    /// True when retrying cannot help. A BSL that Velero marks Unavailable may recover, so it is
    /// retried; the rest need a person to change the location or its Secret.
    pub fn is_permanent(&self) -> bool {
        !matches!(self, Self::Unavailable { .. })
    }
}

/// The Secret and key holding the BSL's credentials (in the Velero namespace).
pub fn credential_ref(bsl: &BackupStorageLocation) -> SecretKeyRef {
    bsl.spec.credential.clone().unwrap_or_else(|| SecretKeyRef {
        name: DEFAULT_CREDENTIAL_SECRET.to_owned(),
        key: DEFAULT_CREDENTIAL_KEY.to_owned(),
    })
}

/// Err unless the BSL reports `Available`. A BSL Velero has not validated yet (no phase) passes: Velero
/// itself would still accept backups into it.
pub fn check_available(bsl: &BackupStorageLocation) -> Result<(), LocationError> {
    let status = bsl.status.as_ref();
    match status.and_then(|s| s.phase.as_deref()) {
        None | Some("Available") => Ok(()),
        Some(phase) => Err(LocationError::Unavailable {
            bsl: bsl_name(bsl),
            phase: phase.to_owned(),
            message: status
                .and_then(|s| s.message.clone())
                .unwrap_or_else(|| "no message".to_owned()),
        }),
    }
}

/// Resolves the BSL and its credentials Secret (`None` when it was not found) into an [`S3Target`].
pub fn resolve_target(
    bsl: &BackupStorageLocation,
    secret: Option<&Secret>,
) -> Result<S3Target, LocationError> {
    let name = bsl_name(bsl);
    let provider = bsl.spec.provider.as_str();
    if !matches!(provider, "aws" | "velero.io/aws") {
        return Err(LocationError::UnsupportedProvider {
            bsl: name,
            provider: provider.to_owned(),
        });
    }
    let bucket = bsl.spec.object_storage.bucket.trim();
    if bucket.is_empty() {
        return Err(LocationError::NoBucket { bsl: name });
    }
    let config = &bsl.spec.config;
    let cref = credential_ref(bsl);
    let Some(secret) = secret else {
        return Err(LocationError::SecretMissing {
            bsl: name,
            namespace: bsl.metadata.namespace.clone().unwrap_or_default(),
            secret: cref.name,
        });
    };
    let raw = secret_value(secret, &cref.key).ok_or_else(|| LocationError::KeyMissing {
        bsl: name.clone(),
        secret: cref.name.clone(),
        key: cref.key.clone(),
    })?;
    let profile = config
        .get("profile")
        .map(String::as_str)
        .filter(|p| !p.is_empty())
        .unwrap_or("default");
    let creds = parse_credentials(&raw, profile).map_err(|e| match e {
        CredError::Parse(reason) => LocationError::BadCredentialsFile {
            bsl: name.clone(),
            secret: cref.name.clone(),
            key: cref.key.clone(),
            reason,
        },
        CredError::NoProfile => LocationError::ProfileMissing {
            bsl: name.clone(),
            secret: cref.name.clone(),
            key: cref.key.clone(),
            profile: profile.to_owned(),
        },
        CredError::NoField(field) => LocationError::FieldMissing {
            bsl: name.clone(),
            secret: cref.name.clone(),
            key: cref.key.clone(),
            profile: profile.to_owned(),
            field,
        },
    })?;
    Ok(S3Target {
        endpoint: config
            .get("s3Url")
            .map(|u| u.trim_end_matches('/').to_owned())
            .filter(|u| !u.is_empty()),
        bucket: bucket.to_owned(),
        prefix: normalize_prefix(
            bsl.spec
                .object_storage
                .prefix
                .as_deref()
                .unwrap_or_default(),
        ),
        region: config
            .get("region")
            .filter(|r| !r.is_empty())
            .cloned()
            .unwrap_or_else(|| DEFAULT_REGION.to_owned()),
        path_style: config.get("s3ForcePathStyle").is_some_and(|v| v == "true"),
        access_key_id: creds.0,
        secret_access_key: creds.1,
        session_token: creds.2,
    })
}

/// The objects Velero writes for one backup, under `<prefix>/backups/<name>/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupKeys {
    /// `velero-backup.json`: the Backup object (uid, phase).
    pub metadata: String,
    /// `<name>.tar.gz`: the resource manifests.
    pub tarball: String,
    /// `<name>-volumeinfo.json.gz`: per-PVC results.
    pub volume_info: String,
    /// `<name>-podvolumebackups.json.gz`: the PodVolumeBackups (file-system backups).
    pub pod_volume_backups: String,
}

/// Keys of backup `backup_name` in `target`.
pub fn backup_keys(target: &S3Target, backup_name: &str) -> BackupKeys {
    let dir = target.key(&format!("backups/{backup_name}"));
    BackupKeys {
        metadata: format!("{dir}/velero-backup.json"),
        tarball: format!("{dir}/{backup_name}.tar.gz"),
        volume_info: format!("{dir}/{backup_name}-volumeinfo.json.gz"),
        pod_volume_backups: format!("{dir}/{backup_name}-podvolumebackups.json.gz"),
    }
}

/// The kopia repository marker of a workload namespace: `<prefix>/kopia/<ns>/kopia.repository`.
pub fn kopia_repository_key(target: &S3Target, namespace: &str) -> String {
    target.key(&format!("kopia/{namespace}/kopia.repository"))
}

fn normalize_prefix(prefix: &str) -> String {
    prefix
        .split('/')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("/")
}

fn bsl_name(bsl: &BackupStorageLocation) -> String {
    format!(
        "{}/{}",
        bsl.metadata.namespace.as_deref().unwrap_or_default(),
        bsl.metadata.name.as_deref().unwrap_or_default()
    )
}

/// `data` (what the API returns) or `stringData` (what a hand-made object may carry).
fn secret_value(secret: &Secret, key: &str) -> Option<String> {
    if let Some(v) = secret.data.as_ref().and_then(|d| d.get(key)) {
        return Some(String::from_utf8_lossy(&v.0).into_owned());
    }
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .cloned()
}

enum CredError {
    Parse(String),
    NoProfile,
    NoField(&'static str),
}

/// (access key id, secret access key, session token) from an AWS shared-credentials file. Accepts both
/// `[name]` (credentials file) and `[profile name]` (config file) sections.
fn parse_credentials(
    text: &str,
    profile: &str,
) -> Result<(String, String, Option<String>), CredError> {
    let ini = ini::Ini::load_from_str(text).map_err(|e| CredError::Parse(e.to_string()))?;
    let section = ini
        .section(Some(profile))
        .or_else(|| ini.section(Some(format!("profile {profile}"))))
        .ok_or(CredError::NoProfile)?;
    let field = |name: &'static str| {
        section
            .get(name)
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .ok_or(CredError::NoField(name))
    };
    Ok((
        field("aws_access_key_id")?,
        field("aws_secret_access_key")?,
        field("aws_session_token").ok(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bsl(v: serde_json::Value) -> BackupStorageLocation {
        let mut base = json!({
            "apiVersion": "velero.io/v1", "kind": "BackupStorageLocation",
            "metadata": {"name": "default", "namespace": "velero"},
            "spec": {"provider": "aws", "objectStorage": {"bucket": "velero", "prefix": "/cluster-a/"},
                     "config": {"region": "minio", "s3ForcePathStyle": "true", "s3Url": "http://minio.velero.svc:9000/"}}
        });
        if let (Some(spec), Some(extra)) = (base["spec"].as_object_mut(), v.as_object()) {
            spec.extend(extra.clone());
        }
        serde_json::from_value(base).expect("bsl")
    }

    fn secret(key: &str, ini: &str) -> Secret {
        Secret {
            data: Some(
                [(
                    key.to_owned(),
                    k8s_openapi::ByteString(ini.as_bytes().to_vec()),
                )]
                .into(),
            ),
            ..Secret::default()
        }
    }

    const INI: &str = "[default]\naws_access_key_id = minio\naws_secret_access_key = minio123\n";

    #[test]
    fn minio_location_resolves() {
        let t = resolve_target(&bsl(json!({})), Some(&secret("cloud", INI))).expect("target");
        assert_eq!(t.endpoint.as_deref(), Some("http://minio.velero.svc:9000"));
        assert_eq!(t.bucket, "velero");
        assert_eq!(t.prefix, "cluster-a");
        assert_eq!(t.region, "minio");
        assert!(t.path_style);
        assert_eq!(t.access_key_id, "minio");
        assert_eq!(t.secret_access_key, "minio123");
        assert_eq!(t.session_token, None);
        assert!(
            !format!("{t:?}").contains("minio123"),
            "secret leaked into Debug"
        );
    }

    #[test]
    fn defaults_without_config() {
        let b = bsl(json!({"config": {}, "objectStorage": {"bucket": "backups"}}));
        let t = resolve_target(&b, Some(&secret("cloud", INI))).expect("target");
        assert_eq!(
            (
                t.endpoint,
                t.region.as_str(),
                t.path_style,
                t.prefix.as_str()
            ),
            (None, "us-east-1", false, "")
        );
        assert_eq!(
            credential_ref(&b),
            SecretKeyRef {
                name: "cloud-credentials".into(),
                key: "cloud".into()
            }
        );
    }

    #[test]
    fn explicit_credential_and_profile() {
        let b = bsl(json!({"credential": {"name": "minio-creds", "key": "aws"},
                           "config": {"profile": "backup", "region": "eu-west-1"}}));
        assert_eq!(credential_ref(&b).name, "minio-creds");
        let ini = "[default]\naws_access_key_id=a\naws_secret_access_key=b\n[profile backup]\naws_access_key_id=AK\naws_secret_access_key=SK\naws_session_token=TOK\n";
        let t = resolve_target(&b, Some(&secret("aws", ini))).expect("target");
        assert_eq!(
            (t.access_key_id.as_str(), t.session_token.as_deref()),
            ("AK", Some("TOK"))
        );
    }

    #[test]
    fn each_missing_piece_is_named() {
        let b = bsl(json!({}));
        let e = resolve_target(&b, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "credentials Secret velero/cloud-credentials of BackupStorageLocation velero/default does not exist; create it or set spec.credential on the location"
        );
        let e = resolve_target(&b, Some(&secret("other", INI))).unwrap_err();
        assert!(
            matches!(&e, LocationError::KeyMissing { key, .. } if key == "cloud"),
            "{e}"
        );
        let e = resolve_target(
            &b,
            Some(&secret(
                "cloud",
                "[prod]\naws_access_key_id=a\naws_secret_access_key=b\n",
            )),
        )
        .unwrap_err();
        assert!(e.to_string().contains("no [default] profile"), "{e}");
        let e = resolve_target(
            &b,
            Some(&secret("cloud", "[default]\naws_access_key_id=a\n")),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("has no aws_secret_access_key"),
            "{e}"
        );
        let e = resolve_target(
            &bsl(json!({"objectStorage": {"bucket": ""}})),
            Some(&secret("cloud", INI)),
        )
        .unwrap_err();
        assert_eq!(
            e,
            LocationError::NoBucket {
                bsl: "velero/default".into()
            }
        );
        let e = resolve_target(
            &bsl(json!({"provider": "velero.io/gcp"})),
            Some(&secret("cloud", INI)),
        )
        .unwrap_err();
        assert!(matches!(e, LocationError::UnsupportedProvider { .. }));
    }

    #[test]
    fn availability() {
        let mut b = bsl(json!({}));
        assert!(check_available(&b).is_ok());
        b.status = serde_json::from_value(json!({"phase": "Unavailable", "message": "BackupStorageLocation \"default\" is unavailable: rpc error"})).ok();
        let e = check_available(&b).unwrap_err();
        assert!(
            e.to_string()
                .contains("is Unavailable: BackupStorageLocation"),
            "{e}"
        );
        b.status = serde_json::from_value(json!({"phase": "Available"})).ok();
        assert!(check_available(&b).is_ok());
    }

    #[test]
    fn keys_with_and_without_prefix() {
        let t = resolve_target(&bsl(json!({})), Some(&secret("cloud", INI))).expect("target");
        let k = backup_keys(&t, "b1");
        assert_eq!(k.metadata, "cluster-a/backups/b1/velero-backup.json");
        assert_eq!(k.tarball, "cluster-a/backups/b1/b1.tar.gz");
        assert_eq!(k.volume_info, "cluster-a/backups/b1/b1-volumeinfo.json.gz");
        assert_eq!(
            k.pod_volume_backups,
            "cluster-a/backups/b1/b1-podvolumebackups.json.gz"
        );
        assert_eq!(
            kopia_repository_key(&t, "db"),
            "cluster-a/kopia/db/kopia.repository"
        );
        let bare = S3Target {
            prefix: String::new(),
            ..t
        };
        assert_eq!(
            backup_keys(&bare, "b1").metadata,
            "backups/b1/velero-backup.json"
        );
        assert_eq!(
            kopia_repository_key(&bare, "db"),
            "kopia/db/kopia.repository"
        );
        assert_eq!(normalize_prefix("//a//b/"), "a/b");
    }
}
