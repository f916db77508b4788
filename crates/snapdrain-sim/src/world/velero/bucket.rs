//! Velero's object-store side: the BackupStorageLocation resolved to an S3 client, bucket and prefix,
//! the keys of `pkg/persistence/object_store_layout.go`, and every write recorded in the audit log.

use std::sync::Arc;

use aws_credential_types::Credentials;
use aws_sdk_s3::primitives::ByteStream;
use base64::Engine;
use serde_json::{Value, json};

use super::VeleroError;
use crate::apiserver::audit::Audit;
use crate::apiserver::resources::ResKey;
use crate::apiserver::store::Store;

/// The top-level directories Velero allows under a BSL prefix (`IsValid`); anything else makes the
/// location Unavailable.
pub const ALLOWED_TOP_LEVEL: &[&str] = &[
    "backups", "restores", "restic", "metadata", "plugins", "kopia",
];

/// Where a BackupStorageLocation's objects live, with a client that can reach them.
#[derive(Clone)]
pub struct Bucket {
    pub client: aws_sdk_s3::Client,
    pub bucket: String,
    /// Without a trailing slash; empty when the BSL has none.
    pub prefix: String,
    audit: Arc<Audit>,
}

fn secret_value(store: &Store, ns: &str, name: &str, key: &str) -> Result<String, VeleroError> {
    let secret = store
        .get(&ResKey::core("secrets"), Some(ns), name)
        .ok_or_else(|| VeleroError::Credentials(format!("secret {ns}/{name} not found")))?;
    if let Some(s) = secret
        .pointer(&format!("/stringData/{key}"))
        .and_then(Value::as_str)
    {
        return Ok(s.to_string());
    }
    let b64 = secret
        .pointer(&format!("/data/{key}"))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            VeleroError::Credentials(format!("secret {ns}/{name} has no key {key:?}"))
        })?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| VeleroError::Credentials(format!("secret {ns}/{name} key {key}: {e}")))?;
    String::from_utf8(raw)
        .map_err(|e| VeleroError::Credentials(format!("secret {ns}/{name} key {key}: {e}")))
}

/// Reads `aws_access_key_id` / `aws_secret_access_key` from an AWS shared-credentials INI text.
fn parse_ini(text: &str, profile: &str) -> Result<(String, String), VeleroError> {
    let ini = ini::Ini::load_from_str(text)
        .map_err(|e| VeleroError::Credentials(format!("credentials file is not INI: {e}")))?;
    let section = ini.section(Some(profile)).ok_or_else(|| {
        VeleroError::Credentials(format!("credentials file has no [{profile}] profile"))
    })?;
    let get = |k: &str| {
        section
            .get(k)
            .map(str::to_string)
            .ok_or_else(|| VeleroError::Credentials(format!("profile [{profile}] has no {k}")))
    };
    Ok((get("aws_access_key_id")?, get("aws_secret_access_key")?))
}

impl Bucket {
    /// Resolves a BSL as velero-plugin-for-aws does: `config.s3Url` (path style when
    /// `s3ForcePathStyle` is "true"), `config.region`, and credentials from `spec.credential` or the
    /// server-wide Secret `cloud-credentials` key `cloud`, profile `config.profile` or `default`.
    pub fn from_bsl(
        store: &Store,
        audit: Arc<Audit>,
        bsl: &Value,
        velero_ns: &str,
    ) -> Result<Self, VeleroError> {
        let name = bsl
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let cfg = |k: &str| {
            bsl.pointer(&format!("/spec/config/{k}"))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let bucket = bsl
            .pointer("/spec/objectStorage/bucket")
            .and_then(Value::as_str)
            .filter(|b| !b.is_empty())
            .ok_or_else(|| VeleroError::Location {
                name: name.to_string(),
                message: "spec.objectStorage.bucket is empty".into(),
            })?
            .to_string();
        let prefix = bsl
            .pointer("/spec/objectStorage/prefix")
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim_matches('/')
            .to_string();
        let endpoint = cfg("s3Url").ok_or_else(|| VeleroError::Location {
            name: name.to_string(),
            message:
                "config.s3Url is not set; the simulated object store is only reachable through it"
                    .into(),
        })?;
        let (secret_name, secret_key) = match bsl.pointer("/spec/credential") {
            Some(c) if c.is_object() => (
                c.get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("cloud-credentials")
                    .to_string(),
                c.get("key")
                    .and_then(Value::as_str)
                    .unwrap_or("cloud")
                    .to_string(),
            ),
            _ => ("cloud-credentials".to_string(), "cloud".to_string()),
        };
        let text = secret_value(store, velero_ns, &secret_name, &secret_key)?;
        let profile = cfg("profile").unwrap_or_else(|| "default".into());
        let (access, secret) = parse_ini(&text, &profile)?;
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .region(aws_sdk_s3::config::Region::new(
                cfg("region").unwrap_or_else(|| "us-east-1".into()),
            ))
            .endpoint_url(endpoint)
            .credentials_provider(Credentials::new(access, secret, None, None, "velero-sim"))
            .force_path_style(cfg("s3ForcePathStyle").as_deref() == Some("true"))
            .build();
        Ok(Self {
            client: aws_sdk_s3::Client::from_conf(config),
            bucket,
            prefix,
            audit,
        })
    }

    /// The full key of `rel` under the prefix.
    pub fn key(&self, rel: &str) -> String {
        if self.prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }

    /// `backups/<name>/<file>`.
    pub fn backup_key(&self, backup: &str, file: &str) -> String {
        self.key(&format!("backups/{backup}/{file}"))
    }

    /// Uploads one object; `extra` is merged into the audit detail (e.g. the phase a JSON carries).
    pub async fn put(&self, key: &str, body: Vec<u8>, extra: Value) -> Result<(), VeleroError> {
        let size = body.len();
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| VeleroError::Upload {
                bucket: self.bucket.clone(),
                key: key.to_string(),
                message: aws_smithy_types::error::display::DisplayErrorContext(e).to_string(),
            })?;
        let mut detail = json!({"bucket": self.bucket, "size": size});
        if let (Some(d), Value::Object(extra)) = (detail.as_object_mut(), extra) {
            d.extend(extra);
        }
        self.audit
            .world("s3-put", "objects", None, Some(key), detail);
        Ok(())
    }

    /// Best effort: used to clean up a partial upload, as PutBackup does.
    pub async fn delete(&self, key: &str) {
        if self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .is_ok()
        {
            self.audit.world(
                "s3-delete",
                "objects",
                None,
                Some(key),
                json!({"bucket": self.bucket}),
            );
        }
    }

    /// Removes every object under `backups/<name>/`, as the object store's DeleteBackup does
    /// (velero pkg/persistence/object_store.go DeleteBackup: list the backup's directory, delete each).
    pub async fn delete_backup(&self, name: &str) -> Result<(), String> {
        let prefix = self.backup_key(name, "");
        let mut token: Option<String> = None;
        loop {
            let out = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&prefix)
                .set_continuation_token(token.clone())
                .send()
                .await
                .map_err(|e| {
                    format!(
                        "error listing objects under {prefix}: {}",
                        aws_smithy_types::error::display::DisplayErrorContext(e)
                    )
                })?;
            for key in out.contents().iter().filter_map(|o| o.key()) {
                self.delete(key).await;
            }
            match out.next_continuation_token() {
                Some(t) if out.is_truncated() == Some(true) => token = Some(t.to_string()),
                _ => return Ok(()),
            }
        }
    }

    pub async fn exists(&self, key: &str) -> Result<bool, VeleroError> {
        match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => Ok(false),
            Err(e) => Err(VeleroError::Upload {
                bucket: self.bucket.clone(),
                key: key.to_string(),
                message: aws_smithy_types::error::display::DisplayErrorContext(e).to_string(),
            }),
        }
    }

    /// Validates the location as Velero's BSL controller does: the bucket is reachable and holds no
    /// top-level directory under the prefix other than Velero's own. Returns why it is not valid.
    pub async fn validate(&self) -> Result<(), String> {
        let list_prefix = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let out = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(&list_prefix)
            .delimiter("/")
            .send()
            .await
            .map_err(|e| {
                format!(
                    "rpc error: code = Unknown desc = {}",
                    aws_smithy_types::error::display::DisplayErrorContext(e)
                )
            })?;
        let invalid: Vec<String> = out
            .common_prefixes()
            .iter()
            .filter_map(|p| p.prefix())
            .map(|p| p[list_prefix.len()..].trim_end_matches('/').to_string())
            .filter(|d| !ALLOWED_TOP_LEVEL.contains(&d.as_str()))
            .collect();
        if invalid.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "Backup store contains invalid top-level directories: {invalid:?}"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ini_profiles_are_read_and_missing_keys_named() {
        let text = "[default]\naws_access_key_id = minio\naws_secret_access_key = minio123\n";
        assert_eq!(
            parse_ini(text, "default").unwrap(),
            ("minio".into(), "minio123".into())
        );
        let err = parse_ini(text, "other").unwrap_err().to_string();
        assert!(err.contains("[other]"), "{err}");
    }
}
