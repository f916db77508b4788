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
use crate::world::WorldContext;

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
    /// SSE-C (base64 key, base64 MD5) every PUT and HEAD carries.
    sse_c: Option<(String, String)>,
    audit: Arc<Audit>,
}

fn secret_value(store: &Store, ns: &str, name: &str, key: &str) -> Result<Vec<u8>, VeleroError> {
    let secret = store
        .get(&ResKey::core("secrets"), Some(ns), name)
        .ok_or_else(|| VeleroError::Credentials(format!("secret {ns}/{name} not found")))?;
    if let Some(s) = secret
        .pointer(&format!("/stringData/{key}"))
        .and_then(Value::as_str)
    {
        return Ok(s.as_bytes().to_vec());
    }
    let b64 = secret
        .pointer(&format!("/data/{key}"))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            VeleroError::Credentials(format!("secret {ns}/{name} has no key {key:?}"))
        })?;
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| VeleroError::Credentials(format!("secret {ns}/{name} key {key}: {e}")))
}

fn secret_text(store: &Store, ns: &str, name: &str, key: &str) -> Result<String, VeleroError> {
    String::from_utf8(secret_value(store, ns, name, key)?)
        .map_err(|e| VeleroError::Credentials(format!("secret {ns}/{name} key {key}: {e}")))
}

/// Reads `aws_access_key_id` / `aws_secret_access_key` from an AWS shared-credentials INI text
/// (`[name]` or, as a shared config file, `[profile name]`).
fn parse_ini(text: &str, profile: &str) -> Result<(String, String), VeleroError> {
    let ini = ini::Ini::load_from_str(text)
        .map_err(|e| VeleroError::Credentials(format!("credentials file is not INI: {e}")))?;
    let section = ini
        .section(Some(profile))
        .or_else(|| ini.section(Some(format!("profile {profile}"))))
        .ok_or_else(|| {
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

/// Go's `strconv.ParseBool`, which velero-plugin-for-aws `object_store.go` `Init` applies to
/// `s3ForcePathStyle` and `insecureSkipTLSVerify`.
fn go_bool(field: &str, value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "could not parse {field} (expected bool): strconv.ParseBool: parsing {value:?}: invalid syntax"
        )),
    }
}

/// A Secret volume mount: (mountPath, secretName, items key→path).
type SecretMount = (String, String, Vec<(String, String)>);

/// What the Velero server container sees: its environment and, for a path under a Secret volume mount,
/// the Secret key the kubelet put there.
struct ServerPod {
    env: Vec<(String, String)>,
    secret_mounts: Vec<SecretMount>,
}

impl ServerPod {
    /// The Velero server Deployment of `ns` (its container is named `velero` in both `velero install`
    /// and the Helm chart).
    fn find(store: &Store, ns: &str) -> Option<Self> {
        let page = store.list(
            &ResKey::new("apps", "deployments"),
            Some(ns),
            &|_| true,
            None,
            None,
        );
        page.items.iter().find_map(|d| {
            let spec = d.pointer("/spec/template/spec")?;
            let c = spec
                .get("containers")?
                .as_array()?
                .iter()
                .find(|c| c.get("name").and_then(Value::as_str) == Some("velero"))?;
            let env = c
                .get("env")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|e| {
                    Some((
                        e.get("name")?.as_str()?.to_string(),
                        e.get("value")?.as_str()?.to_string(),
                    ))
                })
                .collect();
            let volumes = spec.get("volumes").and_then(Value::as_array);
            let secret_mounts = c
                .get("volumeMounts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|m| {
                    let vname = m.get("name")?.as_str()?;
                    let path = m
                        .get("mountPath")?
                        .as_str()?
                        .trim_end_matches('/')
                        .to_string();
                    let secret = volumes?
                        .iter()
                        .find(|v| v.get("name").and_then(Value::as_str) == Some(vname))?
                        .get("secret")?;
                    let items = secret
                        .get("items")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|i| {
                            Some((
                                i.get("key")?.as_str()?.to_string(),
                                i.get("path")?.as_str()?.to_string(),
                            ))
                        })
                        .collect();
                    Some((path, secret.get("secretName")?.as_str()?.to_string(), items))
                })
                .collect();
            Some(Self { env, secret_mounts })
        })
    }

    fn env(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The (Secret, key) a file path in the container comes from.
    fn file(&self, path: &str) -> Option<(String, String)> {
        self.secret_mounts.iter().find_map(|(dir, secret, items)| {
            let rel = path.strip_prefix(dir.as_str())?.strip_prefix('/')?;
            let key = if items.is_empty() {
                rel.to_string()
            } else {
                items.iter().find(|(_, p)| p == rel)?.0.clone()
            };
            Some((secret.clone(), key))
        })
    }
}

/// The keys the Velero server uses for `bsl`, found as the AWS SDK in its pod finds them: the BSL's
/// `spec.credential` (Velero core passes it to the plugin as `credentialsFile`), else the file in
/// `AWS_SHARED_CREDENTIALS_FILE` (velero-plugin-for-aws `config.go` `WithCredentialsFile`; the kubelet
/// fills it from the mounted Secret), else IRSA's web identity (`AWS_ROLE_ARN`), else nothing: the SDK's
/// default chain fails and so does the location.
fn server_credentials(
    store: &Store,
    bsl: &Value,
    ns: &str,
    profile: &str,
) -> Result<(String, String), VeleroError> {
    if let Some(c) = bsl.pointer("/spec/credential").filter(|c| c.is_object()) {
        let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
        let key = c.get("key").and_then(Value::as_str).unwrap_or_default();
        return parse_ini(&secret_text(store, ns, name, key)?, profile);
    }
    let pod = ServerPod::find(store, ns).ok_or_else(|| {
        VeleroError::Credentials(format!("no Velero server Deployment in namespace {ns}"))
    })?;
    if let Some(path) = pod.env("AWS_SHARED_CREDENTIALS_FILE") {
        let (secret, key) = pod.file(path).ok_or_else(|| {
            VeleroError::Credentials(format!(
                "open {path}: no such file or directory (no Secret volume is mounted there)"
            ))
        })?;
        return parse_ini(&secret_text(store, ns, &secret, &key)?, profile);
    }
    if let (Some(role), Some(_token)) = (
        pod.env(crate::sts::ROLE_ARN_ENV),
        pod.env(crate::sts::WEB_IDENTITY_TOKEN_FILE_ENV),
    ) {
        return Ok(crate::sts::role_credentials(role));
    }
    Err(VeleroError::Credentials(
        "failed to refresh cached credentials, no EC2 IMDS role found".into(),
    ))
}

/// The CA bundle Velero core passes the plugin as `caCert`: `objectStorage.caCertRef`'s Secret key, else
/// the inline (deprecated) `objectStorage.caCert` (base64 in the object).
fn ca_bundle(store: &Store, bsl: &Value, ns: &str) -> Result<Option<Vec<u8>>, VeleroError> {
    if let Some(r) = bsl.pointer("/spec/objectStorage/caCertRef") {
        let name = r.get("name").and_then(Value::as_str).unwrap_or_default();
        let key = r.get("key").and_then(Value::as_str).unwrap_or_default();
        return secret_value(store, ns, name, key).map(Some);
    }
    match bsl
        .pointer("/spec/objectStorage/caCert")
        .and_then(Value::as_str)
    {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map(Some)
            .map_err(|e| VeleroError::Credentials(format!("objectStorage.caCert: {e}"))),
        None => Ok(None),
    }
}

/// The SSE-C key of a location, read as velero-plugin-for-aws `object_store.go` `Init` does:
/// `customerKeyEncryptionFile` (a file in the server pod: here the Secret mounted there) or
/// `customerKeyEncryptionSecret` (`secretName/key`), exactly 32 bytes.
fn customer_key(store: &Store, bsl: &Value, ns: &str) -> Result<Option<(String, String)>, String> {
    let cfg = |k: &str| {
        bsl.pointer(&format!("/spec/config/{k}"))
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
    let (secret, key) = if let Some(path) = cfg("customerKeyEncryptionFile") {
        ServerPod::find(store, ns)
            .and_then(|p| p.file(path))
            .ok_or_else(|| format!("provided customerKeyEncryptionFile does not exist: {path}"))?
    } else if let Some(r) = cfg("customerKeyEncryptionSecret") {
        match r.split('/').collect::<Vec<_>>()[..] {
            [n, k] => (n.to_string(), k.to_string()),
            _ => {
                return Err(format!(
                    "invalid secret reference format: {r}, expected secretName/key"
                ));
            }
        }
    } else {
        return Ok(None);
    };
    let raw = secret_value(store, ns, &secret, &key).map_err(|e| e.to_string())?;
    if raw.len() != 32 {
        return Err(format!(
            "contents of customerKeyEncryptionFile are not exactly 32 bytes (got {})",
            raw.len()
        ));
    }
    use md5::Digest as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok(Some((b64.encode(&raw), b64.encode(md5::Md5::digest(&raw)))))
}

/// GetBucketRegion as the plugin calls it (`object_store.go` `Init` → aws-sdk-go-v2 `feature/s3/manager`
/// `GetBucketRegion`): HeadBucket in us-east-1, region from `x-amz-bucket-region`, on success or error.
async fn bucket_region(client: &aws_sdk_s3::Client, bucket: &str) -> Result<String, String> {
    let header = match client.head_bucket().bucket(bucket).send().await {
        Ok(out) => out.bucket_region().map(str::to_string),
        Err(aws_sdk_s3::error::SdkError::ServiceError(se)) => se
            .raw()
            .headers()
            .get("x-amz-bucket-region")
            .map(str::to_string),
        Err(e) => {
            return Err(aws_smithy_types::error::display::DisplayErrorContext(e).to_string());
        }
    };
    header.ok_or_else(|| format!("unable to determine bucket's region, bucket: {bucket}"))
}

impl Bucket {
    /// Resolves a BSL as velero-plugin-for-aws does: `config.s3Url` (else AWS S3, which the world's S3
    /// endpoint stands for), path style from `s3ForcePathStyle`, `config.region` (looked up from the
    /// bucket when neither it nor `s3Url` is set), the CA bundle, and the server's credentials (see
    /// [`server_credentials`]) for profile `config.profile` or `default`.
    pub async fn from_bsl(
        ctx: &WorldContext,
        bsl: &Value,
        velero_ns: &str,
    ) -> Result<Self, VeleroError> {
        let store = &ctx.store;
        let name = bsl
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let location = |message: String| VeleroError::Location {
            name: name.to_string(),
            message,
        };
        let cfg = |k: &str| {
            bsl.pointer(&format!("/spec/config/{k}"))
                .and_then(Value::as_str)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        let bucket = bsl
            .pointer("/spec/objectStorage/bucket")
            .and_then(Value::as_str)
            .filter(|b| !b.is_empty())
            .ok_or_else(|| location("spec.objectStorage.bucket is empty".into()))?
            .to_string();
        let prefix = bsl
            .pointer("/spec/objectStorage/prefix")
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim_matches('/')
            .to_string();
        let s3_url = cfg("s3Url");
        let endpoint = s3_url
            .clone()
            .or_else(|| ctx.s3_endpoint.clone())
            .ok_or_else(|| {
                location("config.s3Url is not set and no simulated AWS S3 endpoint runs".into())
            })?;
        let path_style = match cfg("s3ForcePathStyle") {
            Some(v) => go_bool("s3ForcePathStyle", &v).map_err(location)?,
            None => false,
        };
        let profile = cfg("profile").unwrap_or_else(|| "default".into());
        let (access, secret) = server_credentials(store, bsl, velero_ns, &profile)?;
        let mut builder = aws_sdk_s3::Config::builder()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .endpoint_url(endpoint)
            .credentials_provider(Credentials::new(access, secret, None, None, "velero-sim"))
            .force_path_style(path_style);
        let insecure = match cfg("insecureSkipTLSVerify") {
            Some(v) => go_bool("insecureSkipTLSVerify", &v).map_err(location)?,
            None => false,
        };
        let ca_cert = ca_bundle(store, bsl, velero_ns)?;
        if let Some(client) = tls_client(ctx, insecure, ca_cert).map_err(location)? {
            builder = builder.http_client(client);
        }
        let region = match cfg("region") {
            Some(r) => r,
            None if s3_url.is_none() => {
                let lookup = aws_sdk_s3::Client::from_conf(
                    builder
                        .clone()
                        .region(aws_sdk_s3::config::Region::from_static("us-east-1"))
                        .build(),
                );
                bucket_region(&lookup, &bucket).await.map_err(location)?
            }
            // The SDK's own default when an S3-compatible store names none.
            None => "us-east-1".into(),
        };
        let config = builder
            .region(aws_sdk_s3::config::Region::new(region))
            .build();
        Ok(Self {
            client: aws_sdk_s3::Client::from_conf(config),
            bucket,
            prefix,
            sse_c: customer_key(store, bsl, velero_ns).map_err(location)?,
            audit: ctx.audit.clone(),
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
        let mut request = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .body(ByteStream::from(body));
        if let Some((k, md5)) = &self.sse_c {
            request = request
                .sse_customer_algorithm("AES256")
                .sse_customer_key(k)
                .sse_customer_key_md5(md5);
        }
        request.send().await.map_err(|e| VeleroError::Upload {
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
        let mut request = self.client.head_object().bucket(&self.bucket).key(key);
        if let Some((k, md5)) = &self.sse_c {
            request = request
                .sse_customer_algorithm("AES256")
                .sse_customer_key(k)
                .sse_customer_key_md5(md5);
        }
        match request.send().await {
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

/// The plugin's TLS trust (`config.go` `WithTLSSettings`): the pod's system roots plus `caCert`, or no
/// certificate verification with `insecureSkipTLSVerify` (which wins over `caCert`). The simulated Velero
/// only ever talks to the world's S3 endpoint, so it skips verification by trusting that endpoint's CA:
/// the same server is accepted, which is all the world's behaviour depends on. `None`: the SDK's default
/// client (public roots only).
fn tls_client(
    ctx: &WorldContext,
    insecure: bool,
    ca_cert: Option<Vec<u8>>,
) -> Result<Option<aws_sdk_s3::config::SharedHttpClient>, String> {
    let mut pems = ctx.velero_system_cas.clone();
    if insecure {
        pems.extend(ctx.s3_ca_pem.clone());
    } else if let Some(pem) = ca_cert {
        pems.push(String::from_utf8(pem).map_err(|e| format!("caCert: {e}"))?);
    }
    if pems.is_empty() {
        return Ok(None);
    }
    crate::s3::trusting(&pems.join("\n"))
        .map(Some)
        .map_err(|e| format!("caCert: {e}"))
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

    #[test]
    fn booleans_are_go_booleans() {
        assert_eq!(go_bool("s3ForcePathStyle", "True"), Ok(true));
        assert_eq!(go_bool("s3ForcePathStyle", "0"), Ok(false));
        assert!(go_bool("s3ForcePathStyle", "yes").is_err());
    }
}
