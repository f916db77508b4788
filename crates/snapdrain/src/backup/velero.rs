//! Velero objects through the Kubernetes API: create a plan's Backups (idempotently, by deterministic
//! name), read them, and resolve their BackupStorageLocation and credentials into an S3 target.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, Error as KubeError};

use super::location::{self, LocationError, S3Target};
use super::{credentials, sse};
use crate::api::velero::{Backup, BackupStorageLocation, SecretKeyRef};

#[derive(Debug, thiserror::Error)]
pub enum VeleroError {
    #[error(
        "cannot create Velero Backup {namespace}/{name}: {source}; check that Velero's CRDs are installed and snapdrain may create velero.io backups"
    )]
    Create {
        namespace: String,
        name: String,
        source: KubeError,
    },
    #[error("cannot read Velero Backup {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        source: KubeError,
    },
    #[error(
        "BackupStorageLocation {namespace}/{name} does not exist; create it or set spec.backup.storageLocation to an existing one"
    )]
    NoLocation { namespace: String, name: String },
    #[error("cannot read BackupStorageLocation {namespace}/{name} or its credentials: {source}")]
    ReadLocation {
        namespace: String,
        name: String,
        source: KubeError,
    },
    #[error(
        "cannot read Secret {namespace}/{secret} for BackupStorageLocation {namespace}/{location}: {source}; snapdrain may read only the Velero Secrets its Role names: add {secret} to the Helm value velero.secretNames (kustomize: resourceNames in role-velero-secrets.yaml)"
    )]
    ReadSecret {
        namespace: String,
        location: String,
        secret: String,
        source: KubeError,
    },
    #[error(
        "cannot create Velero DeleteBackupRequest {namespace}/{name} for an abandoned backup attempt: {source}; snapdrain needs create and get on velero.io deletebackuprequests (the Helm chart's ClusterRole grants them), and Velero's DeleteBackupRequest CRD must be installed"
    )]
    RequestDeletion {
        namespace: String,
        name: String,
        source: KubeError,
    },
    #[error(
        "cannot delete Velero Backup {namespace}/{name}, an abandoned attempt that never started: {source}; snapdrain needs delete on velero.io backups (the Helm chart's ClusterRole grants it)"
    )]
    Delete {
        namespace: String,
        name: String,
        source: KubeError,
    },
    #[error(transparent)]
    Location(#[from] LocationError),
}

impl VeleroError {
    /// True when retrying cannot help: the plan fails with this message instead.
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::Create { source, .. }
            | Self::Read { source, .. }
            | Self::ReadLocation { source, .. }
            | Self::ReadSecret { source, .. } => crate::api_errors::is_permanent(source),
            Self::NoLocation { .. } => true,
            Self::Delete { source, .. } => crate::api_errors::is_permanent(source),
            // 404: the CRD is not installed, which waiting does not change.
            Self::RequestDeletion { source, .. } => {
                matches!(source, KubeError::Api(e) if e.code == 404)
                    || crate::api_errors::is_permanent(source)
            }
            Self::Location(e) => e.is_permanent(),
        }
    }
}

/// Creates `backup` unless it exists already (a restarted controller re-creates the same name), and
/// returns the Backup as stored.
/// Creates the ConfigMap of resource policies a Backup refers to (a ConfigMap of that name already there,
/// from an earlier pass, is this one: names are per plan, namespace and attempt).
pub async fn ensure_volume_policy(
    client: &Client,
    config_map: &serde_json::Value,
) -> Result<(), VeleroError> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let namespace = config_map
        .pointer("/metadata/namespace")
        .and_then(|v| v.as_str())
        .unwrap_or("velero")
        .to_string();
    let name = config_map
        .pointer("/metadata/name")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string();
    let typed: ConfigMap =
        serde_json::from_value(config_map.clone()).map_err(|e| VeleroError::Create {
            namespace: namespace.clone(),
            name: name.clone(),
            source: KubeError::SerdeError(e),
        })?;
    match Api::<ConfigMap>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &typed)
        .await
    {
        Ok(_) => Ok(()),
        Err(KubeError::Api(e)) if e.code == 409 => Ok(()),
        Err(source) => Err(VeleroError::Create {
            namespace,
            name,
            source,
        }),
    }
}

pub async fn ensure_backup(
    client: &Client,
    backup: &serde_json::Value,
) -> Result<Backup, VeleroError> {
    let namespace = backup
        .pointer("/metadata/namespace")
        .and_then(|v| v.as_str())
        .unwrap_or("velero")
        .to_string();
    let name = backup
        .pointer("/metadata/name")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string();
    let api: Api<Backup> = Api::namespaced(client.clone(), &namespace);
    let typed: Backup =
        serde_json::from_value(backup.clone()).map_err(|e| VeleroError::Create {
            namespace: namespace.clone(),
            name: name.clone(),
            source: KubeError::SerdeError(e),
        })?;
    match api.create(&PostParams::default(), &typed).await {
        Ok(b) => Ok(b),
        Err(KubeError::Api(e)) if e.code == 409 => {
            api.get(&name).await.map_err(|source| VeleroError::Read {
                namespace,
                name,
                source,
            })
        }
        Err(source) => Err(VeleroError::Create {
            namespace,
            name,
            source,
        }),
    }
}

pub async fn get_backup(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<Backup>, VeleroError> {
    let api: Api<Backup> = Api::namespaced(client.clone(), namespace);
    api.get_opt(name).await.map_err(|source| VeleroError::Read {
        namespace: namespace.to_string(),
        name: name.to_string(),
        source,
    })
}

/// The S3 target of BackupStorageLocation `name` in `namespace`, with the credentials Velero uses for it
/// (see [`credentials`]): `credentials_override` is snapdrain's `--velero-credentials-secret`.
pub async fn resolve_location(
    client: &Client,
    namespace: &str,
    name: &str,
    credentials_override: Option<&SecretKeyRef>,
) -> Result<S3Target, VeleroError> {
    let read_err = |source| VeleroError::ReadLocation {
        namespace: namespace.to_string(),
        name: name.to_string(),
        source,
    };
    let bsls: Api<BackupStorageLocation> = Api::namespaced(client.clone(), namespace);
    let bsl =
        bsls.get_opt(name)
            .await
            .map_err(read_err)?
            .ok_or_else(|| VeleroError::NoLocation {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })?;
    location::check_available(&bsl)?;
    let sse_source =
        sse::key_source(&bsl.spec.config).map_err(|message| LocationError::CustomerKey {
            bsl: format!("{namespace}/{name}"),
            message,
        })?;
    // The Velero server's Deployment says which Secrets it mounts; only needed without a BSL credential
    // or an override, or for a customer key file.
    let needs_pod = (bsl.spec.credential.is_none() && credentials_override.is_none())
        || matches!(sse_source, Some(sse::KeySource::File(_)));
    let deployments = if needs_pod {
        let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        api.list(&ListParams::default())
            .await
            .map_err(read_err)?
            .items
    } else {
        Vec::new()
    };
    let chosen = credentials::credential_secret(&bsl, credentials_override, &deployments);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let read_secret = |secret: &str| {
        let secret = secret.to_string();
        let secrets = secrets.clone();
        async move {
            secrets
                .get_opt(&secret)
                .await
                .map_err(|source| VeleroError::ReadSecret {
                    namespace: namespace.to_string(),
                    location: name.to_string(),
                    secret,
                    source,
                })
        }
    };
    let credential_secret = match &chosen {
        Some(c) => read_secret(&c.secret.name).await?,
        None => None,
    };
    let ca_secret = match &bsl.spec.object_storage.ca_cert_ref {
        Some(r) => read_secret(&r.name).await?,
        None => None,
    };
    let sse_ref = match sse_source {
        None => None,
        Some(sse::KeySource::Secret(r)) => Some(r),
        Some(sse::KeySource::File(path)) => Some(
            credentials::mounted_file(&deployments, &path).ok_or_else(|| {
                LocationError::CustomerKey {
                    bsl: format!("{namespace}/{name}"),
                    message: format!(
                        "{path} is not in a Secret volume of the Velero Deployment, so snapdrain cannot read it; use customerKeyEncryptionSecret instead"
                    ),
                }
            })?,
        ),
    };
    let sse_secret = match &sse_ref {
        Some(r) => read_secret(&r.name).await?,
        None => None,
    };
    let fetched = location::Fetched {
        credentials: chosen.as_ref().map(|c| (c, credential_secret.as_ref())),
        ca_secret: ca_secret.as_ref(),
        sse_key: sse_ref.as_ref().map(|r| (r, sse_secret.as_ref())),
    };
    Ok(location::resolve_target(&bsl, fetched)?)
}

/// Creates the DeleteBackupRequest `request` (a `velero.io/v1` object) unless it exists already.
pub async fn request_deletion(
    client: &Client,
    request: &serde_json::Value,
) -> Result<(), VeleroError> {
    let namespace = request
        .pointer("/metadata/namespace")
        .and_then(|v| v.as_str())
        .unwrap_or("velero")
        .to_string();
    let name = request
        .pointer("/metadata/name")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string();
    let err = |source| VeleroError::RequestDeletion {
        namespace: namespace.clone(),
        name: name.clone(),
        source,
    };
    let resource = kube::api::ApiResource {
        group: "velero.io".into(),
        version: "v1".into(),
        api_version: crate::api::velero::API_VERSION.into(),
        kind: "DeleteBackupRequest".into(),
        plural: "deletebackuprequests".into(),
    };
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &resource);
    let object: kube::api::DynamicObject =
        serde_json::from_value(request.clone()).map_err(|e| err(KubeError::SerdeError(e)))?;
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(KubeError::Api(e)) if e.code == 409 => Ok(()),
        Err(source) => Err(err(source)),
    }
}

/// Deletes Backup `name` (an attempt Velero never started); already gone counts as done.
pub async fn delete_backup_object(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<(), VeleroError> {
    let api: Api<Backup> = Api::namespaced(client.clone(), namespace);
    match api.delete(name, &kube::api::DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(KubeError::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(VeleroError::Delete {
            namespace: namespace.to_string(),
            name: name.to_string(),
            source,
        }),
    }
}
