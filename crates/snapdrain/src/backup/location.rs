//! From a Velero BackupStorageLocation (and the Secrets it points at) to the S3 bucket, prefix, endpoint,
//! TLS settings and credentials the verifier reads with. Pure: the caller fetches the BSL and the Secrets.
//!
//! Follows velero-plugin-for-aws `object_store.go` `Init`: bucket and prefix from `spec.objectStorage`,
//! endpoint `config.s3Url`, `config.region` (looked up from the bucket when neither it nor `s3Url` is
//! set), `s3ForcePathStyle` and `insecureSkipTLSVerify` read with Go's `strconv.ParseBool`, the CA bundle
//! that Velero core passes as `caCert` (from `objectStorage.caCertRef` or `objectStorage.caCert`), and the
//! credentials file of [`super::credentials`] read as an AWS shared config/credentials file for profile
//! `config.profile` or `default` (`config.go` `WithCredentialsFile`, `WithProfile`).

use std::fmt;

use k8s_openapi::api::core::v1::Secret;
use thiserror::Error;

use super::credentials::{CredentialOrigin, CredentialSecret};
use super::gobool::parse_go_bool;
use super::sse::{self, CustomerKey};
use crate::api::velero::{BackupStorageLocation, SecretKeyRef};

/// The credentials snapdrain reads the bucket with.
#[derive(Clone, PartialEq, Eq)]
pub enum TargetCredentials {
    /// The AWS shared config/credentials file Velero reads, from a Secret key.
    File {
        secret: SecretKeyRef,
        origin: CredentialOrigin,
        /// `config.profile` or `default`.
        profile: String,
        contents: String,
    },
    /// Velero has no credentials file (IRSA, EKS Pod Identity, `--no-secret`): snapdrain uses its own
    /// AWS identity, which needs s3:GetObject and s3:ListBucket on the bucket.
    Ambient,
}

// The file's contents stay out of logs.
impl fmt::Debug for TargetCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File {
                secret, profile, ..
            } => write!(f, "file {}/{} [{profile}]", secret.name, secret.key),
            Self::Ambient => f.write_str("snapdrain's own AWS identity"),
        }
    }
}

/// Where a BSL's objects are and how to reach them.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Target {
    /// `config.s3Url` (MinIO and other S3-compatible stores); None means AWS S3.
    pub endpoint: Option<String>,
    pub bucket: String,
    /// Without leading or trailing slashes; empty when the BSL has no prefix.
    pub prefix: String,
    /// `config.region`; None when the bucket's region must be looked up (AWS S3 without a region).
    pub region: Option<String>,
    pub path_style: bool,
    /// PEM CA bundle to trust for the endpoint (instead of the system roots).
    pub ca_cert: Option<String>,
    pub insecure_skip_tls_verify: bool,
    pub credentials: TargetCredentials,
    /// The SSE-C key every GET and HEAD must carry (`customerKeyEncryptionFile`/`...Secret`).
    pub sse_customer_key: Option<CustomerKey>,
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
            .field("ca_cert", &self.ca_cert.as_ref().map(|_| "<pem>"))
            .field("insecure_skip_tls_verify", &self.insecure_skip_tls_verify)
            .field("credentials", &self.credentials)
            .field("sse_customer_key", &self.sse_customer_key)
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
        "credentials Secret {namespace}/{secret} of BackupStorageLocation {bsl} ({origin}) does not exist; create it, set spec.credential on the location, or point snapdrain's --velero-credentials-secret at the right one"
    )]
    SecretMissing {
        bsl: String,
        namespace: String,
        secret: String,
        origin: String,
    },
    #[error(
        "Secret {secret} of BackupStorageLocation {bsl} ({what}) has no key {key:?}; add it or fix the reference"
    )]
    KeyMissing {
        bsl: String,
        secret: String,
        key: String,
        what: String,
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
        "config.{field} of BackupStorageLocation {bsl} is {value:?}, which is not a boolean (Velero accepts 1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False); fix the location"
    )]
    NotABool {
        bsl: String,
        field: &'static str,
        value: String,
    },
    #[error(
        "the CA bundle of BackupStorageLocation {bsl} ({what}) is not PEM text; put the PEM certificates there"
    )]
    BadCaCert { bsl: String, what: String },
    #[error(
        "the SSE-C customer key of BackupStorageLocation {bsl} cannot be used: {message}; fix config.customerKeyEncryptionFile or customerKeyEncryptionSecret"
    )]
    CustomerKey { bsl: String, message: String },
}

impl LocationError {
    /// True when retrying cannot help. A BSL that Velero marks Unavailable may recover, so it is
    /// retried; the rest need a person to change the location or its Secrets.
    pub fn is_permanent(&self) -> bool {
        !matches!(self, Self::Unavailable { .. })
    }
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

/// What the caller fetched for a BSL besides the BSL itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fetched<'a> {
    /// The credentials Secret Velero uses (None: Velero has none, see [`super::credentials`]) and the
    /// Secret as read (None: not found).
    pub credentials: Option<(&'a CredentialSecret, Option<&'a Secret>)>,
    /// The Secret `objectStorage.caCertRef` names (None: not found or no reference).
    pub ca_secret: Option<&'a Secret>,
    /// The Secret key holding the SSE-C customer key (resolved from the config by the caller) and the
    /// Secret as read.
    pub sse_key: Option<(&'a SecretKeyRef, Option<&'a Secret>)>,
}

/// Resolves the BSL and the Secrets it needs into an [`S3Target`].
pub fn resolve_target(
    bsl: &BackupStorageLocation,
    fetched: Fetched<'_>,
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
    let flag = |field: &'static str| -> Result<bool, LocationError> {
        match config.get(field).map(String::as_str) {
            None | Some("") => Ok(false),
            Some(v) => parse_go_bool(v).ok_or_else(|| LocationError::NotABool {
                bsl: name.clone(),
                field,
                value: v.to_owned(),
            }),
        }
    };
    let path_style = flag("s3ForcePathStyle")?;
    let insecure_skip_tls_verify = flag("insecureSkipTLSVerify")?;
    let profile = config
        .get("profile")
        .map(String::as_str)
        .filter(|p| !p.is_empty())
        .unwrap_or("default");
    let credentials = match fetched.credentials {
        None => TargetCredentials::Ambient,
        Some((cs, secret)) => {
            let Some(secret) = secret else {
                return Err(LocationError::SecretMissing {
                    bsl: name,
                    namespace: bsl.metadata.namespace.clone().unwrap_or_default(),
                    secret: cs.secret.name.clone(),
                    origin: cs.origin.to_string(),
                });
            };
            let raw =
                secret_bytes(secret, &cs.secret.key).ok_or_else(|| LocationError::KeyMissing {
                    bsl: name.clone(),
                    secret: cs.secret.name.clone(),
                    key: cs.secret.key.clone(),
                    what: format!("credentials, {}", cs.origin),
                })?;
            let contents =
                String::from_utf8(raw).map_err(|_| LocationError::BadCredentialsFile {
                    bsl: name.clone(),
                    secret: cs.secret.name.clone(),
                    key: cs.secret.key.clone(),
                    reason: "it is not UTF-8 text".into(),
                })?;
            TargetCredentials::File {
                secret: cs.secret.clone(),
                origin: cs.origin.clone(),
                profile: profile.to_owned(),
                contents,
            }
        }
    };
    let ca_cert = ca_bundle(bsl, &name, fetched.ca_secret)?;
    let sse_customer_key = match fetched.sse_key {
        None => None,
        Some((r, None)) => {
            return Err(LocationError::SecretMissing {
                bsl: name,
                namespace: bsl.metadata.namespace.clone().unwrap_or_default(),
                secret: r.name.clone(),
                origin: "the SSE-C customer key".into(),
            });
        }
        Some((r, Some(secret))) => {
            let bytes = secret_bytes(secret, &r.key).ok_or_else(|| LocationError::KeyMissing {
                bsl: name.clone(),
                secret: r.name.clone(),
                key: r.key.clone(),
                what: "SSE-C customer key".into(),
            })?;
            Some(
                sse::customer_key(&bytes).map_err(|message| LocationError::CustomerKey {
                    bsl: name.clone(),
                    message,
                })?,
            )
        }
    };
    let endpoint = config
        .get("s3Url")
        .map(|u| u.trim_end_matches('/').to_owned())
        .filter(|u| !u.is_empty());
    Ok(S3Target {
        endpoint,
        bucket: bucket.to_owned(),
        prefix: normalize_prefix(
            bsl.spec
                .object_storage
                .prefix
                .as_deref()
                .unwrap_or_default(),
        ),
        region: config.get("region").filter(|r| !r.is_empty()).cloned(),
        path_style,
        ca_cert,
        insecure_skip_tls_verify,
        credentials,
        sse_customer_key,
    })
}

/// The CA bundle Velero core hands the plugin: `caCertRef`'s Secret key first, else the inline
/// (deprecated) `caCert` (velero `pkg/persistence/object_store.go`, `pkg/repository/provider/unified_repo.go`).
fn ca_bundle(
    bsl: &BackupStorageLocation,
    name: &str,
    ca_secret: Option<&Secret>,
) -> Result<Option<String>, LocationError> {
    let storage = &bsl.spec.object_storage;
    let (bytes, what) = if let Some(r) = &storage.ca_cert_ref {
        let Some(secret) = ca_secret else {
            return Err(LocationError::SecretMissing {
                bsl: name.to_owned(),
                namespace: bsl.metadata.namespace.clone().unwrap_or_default(),
                secret: r.name.clone(),
                origin: "objectStorage.caCertRef".into(),
            });
        };
        let bytes = secret_bytes(secret, &r.key).ok_or_else(|| LocationError::KeyMissing {
            bsl: name.to_owned(),
            secret: r.name.clone(),
            key: r.key.clone(),
            what: "objectStorage.caCertRef".into(),
        })?;
        (bytes, format!("Secret {} key {}", r.name, r.key))
    } else if let Some(b) = &storage.ca_cert {
        (b.0.clone(), "objectStorage.caCert".to_owned())
    } else {
        return Ok(None);
    };
    match String::from_utf8(bytes) {
        Ok(pem) if pem.contains("-----BEGIN CERTIFICATE-----") => Ok(Some(pem)),
        _ => Err(LocationError::BadCaCert {
            bsl: name.to_owned(),
            what,
        }),
    }
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
fn secret_bytes(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    if let Some(v) = secret.data.as_ref().and_then(|d| d.get(key)) {
        return Some(v.0.clone());
    }
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|s| s.clone().into_bytes())
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

    fn mounted(name: &str) -> CredentialSecret {
        CredentialSecret {
            secret: SecretKeyRef {
                name: name.into(),
                key: "cloud".into(),
            },
            origin: CredentialOrigin::Deployment("velero".into()),
        }
    }

    const INI: &str = "[default]\naws_access_key_id = minio\naws_secret_access_key = minio123\n";
    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    fn with_file<'a>(cs: &'a CredentialSecret, s: &'a Secret) -> Fetched<'a> {
        Fetched {
            credentials: Some((cs, Some(s))),
            ca_secret: None,
            sse_key: None,
        }
    }

    #[test]
    fn minio_location_resolves() {
        let cs = mounted("velero");
        let s = secret("cloud", INI);
        let t = resolve_target(&bsl(json!({})), with_file(&cs, &s)).expect("target");
        assert_eq!(t.endpoint.as_deref(), Some("http://minio.velero.svc:9000"));
        assert_eq!(t.bucket, "velero");
        assert_eq!(t.prefix, "cluster-a");
        assert_eq!(t.region.as_deref(), Some("minio"));
        assert!(t.path_style);
        assert!(
            matches!(&t.credentials, TargetCredentials::File { secret, profile, contents, .. }
                if secret.name == "velero" && profile == "default" && contents == INI)
        );
        assert!(
            !format!("{t:?}").contains("minio123"),
            "secret leaked into Debug"
        );
    }

    #[test]
    fn defaults_without_config() {
        let b = bsl(json!({"config": {}, "objectStorage": {"bucket": "backups"}}));
        let t = resolve_target(&b, Fetched::default()).expect("target");
        assert_eq!(
            (
                t.endpoint,
                t.region,
                t.path_style,
                t.prefix.as_str(),
                t.credentials
            ),
            (None, None, false, "", TargetCredentials::Ambient)
        );
    }

    #[test]
    fn booleans_are_go_booleans() {
        for (v, want) in [("True", true), ("1", true), ("t", true), ("FALSE", false)] {
            let b = bsl(
                json!({"config": {"s3ForcePathStyle": v, "insecureSkipTLSVerify": v, "s3Url": "http://x"}}),
            );
            let t = resolve_target(&b, Fetched::default()).expect("target");
            assert_eq!(
                (t.path_style, t.insecure_skip_tls_verify),
                (want, want),
                "{v}"
            );
        }
        let b = bsl(json!({"config": {"s3ForcePathStyle": "yes"}}));
        let e = resolve_target(&b, Fetched::default()).unwrap_err();
        assert_eq!(
            e,
            LocationError::NotABool {
                bsl: "velero/default".into(),
                field: "s3ForcePathStyle",
                value: "yes".into()
            }
        );
        assert!(e.is_permanent());
        assert!(e.to_string().contains("1, t, T, TRUE"), "{e}");
    }

    #[test]
    fn profile_comes_from_config() {
        let b = bsl(json!({"config": {"profile": "backup", "region": "eu-west-1"}}));
        let cs = mounted("velero");
        let s = secret("cloud", INI);
        let t = resolve_target(&b, with_file(&cs, &s)).expect("target");
        assert!(
            matches!(t.credentials, TargetCredentials::File { profile, .. } if profile == "backup")
        );
    }

    #[test]
    fn ca_bundle_from_ref_or_inline() {
        let b = bsl(json!({"objectStorage": {"bucket": "b", "caCert": base64_of(PEM)}}));
        let t = resolve_target(&b, Fetched::default()).expect("target");
        assert_eq!(t.ca_cert.as_deref(), Some(PEM));
        let b = bsl(
            json!({"objectStorage": {"bucket": "b", "caCertRef": {"name": "ca", "key": "ca.crt"}}}),
        );
        let ca = secret("ca.crt", PEM);
        let t = resolve_target(
            &b,
            Fetched {
                ca_secret: Some(&ca),
                ..Fetched::default()
            },
        )
        .expect("target");
        assert_eq!(t.ca_cert.as_deref(), Some(PEM));
        let e = resolve_target(&b, Fetched::default()).unwrap_err();
        assert!(e.to_string().contains("Secret velero/ca "), "{e}");
        let bad = secret("ca.crt", "not a cert");
        let e = resolve_target(
            &b,
            Fetched {
                ca_secret: Some(&bad),
                ..Fetched::default()
            },
        )
        .unwrap_err();
        assert!(matches!(e, LocationError::BadCaCert { .. }), "{e}");
    }

    #[test]
    fn customer_key_from_its_secret() {
        let r = SecretKeyRef {
            name: "sse".into(),
            key: "key".into(),
        };
        let good = secret("key", &"k".repeat(32));
        let t = resolve_target(
            &bsl(json!({})),
            Fetched {
                sse_key: Some((&r, Some(&good))),
                ..Fetched::default()
            },
        )
        .expect("target");
        assert!(t.sse_customer_key.is_some());
        let short = secret("key", "short");
        let e = resolve_target(
            &bsl(json!({})),
            Fetched {
                sse_key: Some((&r, Some(&short))),
                ..Fetched::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("exactly 32 bytes"), "{e}");
    }

    fn base64_of(s: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn each_missing_piece_is_named() {
        let b = bsl(json!({}));
        let cs = mounted("velero");
        let e = resolve_target(
            &b,
            Fetched {
                credentials: Some((&cs, None)),
                ..Fetched::default()
            },
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "credentials Secret velero/velero of BackupStorageLocation velero/default (mounted by the Velero Deployment velero) does not exist; create it, set spec.credential on the location, or point snapdrain's --velero-credentials-secret at the right one"
        );
        let other = secret("other", INI);
        let e = resolve_target(&b, with_file(&cs, &other)).unwrap_err();
        assert!(
            matches!(&e, LocationError::KeyMissing { key, .. } if key == "cloud"),
            "{e}"
        );
        let e = resolve_target(
            &bsl(json!({"objectStorage": {"bucket": ""}})),
            Fetched::default(),
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
            Fetched::default(),
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
        assert!(!e.is_permanent());
        b.status = serde_json::from_value(json!({"phase": "Available"})).ok();
        assert!(check_available(&b).is_ok());
    }

    #[test]
    fn keys_with_and_without_prefix() {
        let t = resolve_target(&bsl(json!({})), Fetched::default()).expect("target");
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
