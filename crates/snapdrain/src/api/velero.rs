//! The parts of Velero's `velero.io/v1` Backup and BackupStorageLocation that snapdrain reads and writes.
//!
//! Plain serde structs, not CRDs: snapdrain never installs Velero's CRDs, it only talks to them (through
//! `DynamicObject` or these types). Unknown fields are ignored on read, and absent optional fields are left
//! out on write so that Velero's server defaults apply. Field names follow Velero v1.18
//! (`pkg/apis/velero/v1/backup_types.go`, `backupstoragelocation_types.go`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use serde::{Deserialize, Serialize};

/// `velero.io/v1`
pub const API_VERSION: &str = "velero.io/v1";

/// A Velero Backup.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Backup {
    #[serde(default = "api_version")]
    pub api_version: String,
    #[serde(default = "backup_kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: BackupSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<BackupStatus>,
}

/// Backup `spec` (the fields snapdrain uses).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub included_namespaces: Vec<String>,
    /// Exclusive with `orLabelSelectors` (Velero rejects both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    /// Items matching any of these are backed up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub or_label_selectors: Vec<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_location: Option<String>,
    /// Go duration string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_volumes_to_fs_backup: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_volumes: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_move_data: Option<bool>,
    /// A ConfigMap (in the Velero namespace) holding Velero resource policies: `{kind: configmap, name}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_policy: Option<TypedLocalObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<BackupHooks>,
}

/// `spec.resourcePolicy` (core/v1 TypedLocalObjectReference; Velero reads only kind `configmap`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TypedLocalObjectReference {
    pub kind: String,
    pub name: String,
}

/// Backup `spec.hooks`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BackupHooks {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<BackupResourceHookSpec>,
}

/// One entry of `spec.hooks.resources`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BackupResourceHookSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub included_namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub included_resources: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre: Vec<BackupResourceHook>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post: Vec<BackupResourceHook>,
}

/// A hook: `{exec: {...}}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BackupResourceHook {
    pub exec: ExecHook,
}

/// An exec hook, run in a container of the pod without a shell.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ExecHook {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    pub command: Vec<String>,
    /// `Continue` or `Fail`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// Backup `status` (the fields snapdrain uses).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// See [`crate::planning::backups::classify_backup_phase`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_timestamp: Option<Time>,
    /// When Velero's GC deletes the backup (start + ttl); absent when it never does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration: Option<Time>,
    /// Can stay set on a backup that later Completed (velero#7230): trust `phase`, not this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation_errors: Vec<String>,
    /// Set while Queued (Velero 1.18).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<i64>,
    /// Items backed up of those found, updated while InProgress (`snapdrain drain` shows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<BackupItemsProgress>,
    /// The exec hooks Velero ran and those that failed (velero `pkg/backup/backup.go` sets it from its
    /// hook tracker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_status: Option<HookStatus>,
}

/// Backup `status.hookStatus`.
#[derive(
    Serialize, Deserialize, schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
#[serde(rename_all = "camelCase")]
pub struct HookStatus {
    #[serde(default)]
    pub hooks_attempted: u64,
    #[serde(default)]
    pub hooks_failed: u64,
}

/// Backup `status.progress` (Velero `BackupProgress`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BackupItemsProgress {
    #[serde(default)]
    pub total_items: u64,
    #[serde(default)]
    pub items_backed_up: u64,
}

/// A Velero BackupStorageLocation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackupStorageLocation {
    #[serde(default = "api_version")]
    pub api_version: String,
    #[serde(default = "bsl_kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: BackupStorageLocationSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<BackupStorageLocationStatus>,
}

/// BSL `spec`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BackupStorageLocationSpec {
    /// `aws` or `velero.io/aws` for S3 and MinIO.
    #[serde(default)]
    pub provider: String,
    #[serde(default)]
    pub object_storage: ObjectStorage,
    /// Provider config: `region`, `s3Url`, `s3ForcePathStyle`, `profile`, ...
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, String>,
    /// Per-BSL credentials; absent means the file the Velero server reads (see `backup::credentials`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<SecretKeyRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<String>,
}

/// BSL `spec.objectStorage`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStorage {
    #[serde(default)]
    pub bucket: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// PEM CA bundle for the endpoint's TLS (base64 in JSON). Deprecated upstream for `caCertRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<k8s_openapi::ByteString>,
    /// A key of a Secret in the BSL's namespace holding the PEM CA bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert_ref: Option<SecretKeyRef>,
}

/// A key in a Secret of the Velero namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    pub name: String,
    pub key: String,
}

/// BSL `status`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BackupStorageLocationStatus {
    /// `Available` or `Unavailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_validation_time: Option<Time>,
}

impl Default for Backup {
    fn default() -> Self {
        Self {
            api_version: api_version(),
            kind: backup_kind(),
            metadata: ObjectMeta::default(),
            spec: BackupSpec::default(),
            status: None,
        }
    }
}

impl Default for BackupStorageLocation {
    fn default() -> Self {
        Self {
            api_version: api_version(),
            kind: bsl_kind(),
            metadata: ObjectMeta::default(),
            spec: BackupStorageLocationSpec::default(),
            status: None,
        }
    }
}

fn api_version() -> String {
    API_VERSION.to_owned()
}

fn backup_kind() -> String {
    "Backup".to_owned()
}

fn bsl_kind() -> String {
    "BackupStorageLocation".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_example_backup_json() {
        // Trimmed from shared/fixtures/examples/velero-backup.example.json (Velero 1.18 shape).
        let b: Backup = serde_json::from_value(serde_json::json!({
            "kind": "Backup", "apiVersion": "velero.io/v1",
            "metadata": {"name": "pre-drain-worker-3", "namespace": "velero",
                         "uid": "5b0f2c9e-7d41-4a8e-9c1b-2f6d3e8a7b10", "generation": 7,
                         "labels": {"velero.io/storage-location": "default"}},
            "spec": {"metadata": {}, "includedNamespaces": ["db"],
                     "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "postgres"}},
                     "snapshotVolumes": false, "ttl": "168h0m0s",
                     "volumeGroupSnapshotLabelKey": "velero.io/volume-group",
                     "hooks": {"resources": [{"name": "pg-checkpoint", "includedNamespaces": ["db"],
                        "includedResources": ["pods"],
                        "pre": [{"exec": {"container": "postgres",
                                          "command": ["/bin/sh", "-c", "psql -U postgres -c CHECKPOINT"],
                                          "onError": "Fail", "timeout": "1m0s"}}]}]},
                     "storageLocation": "default", "defaultVolumesToFsBackup": true,
                     "csiSnapshotTimeout": "10m0s", "itemOperationTimeout": "4h0m0s", "snapshotMoveData": false},
            "status": {"version": 1, "formatVersion": "1.1.0", "expiration": "2026-05-27T10:15:00Z",
                       "phase": "Completed", "startTimestamp": "2026-05-20T10:15:01Z",
                       "completionTimestamp": "2026-05-20T10:17:42Z",
                       "progress": {"totalItems": 31, "itemsBackedUp": 31}}
        }))
        .expect("example parses");
        assert_eq!(
            b.metadata.uid.as_deref(),
            Some("5b0f2c9e-7d41-4a8e-9c1b-2f6d3e8a7b10")
        );
        assert_eq!(b.spec.included_namespaces, vec!["db"]);
        assert_eq!(b.spec.default_volumes_to_fs_backup, Some(true));
        assert_eq!(
            b.spec
                .hooks
                .as_ref()
                .map(|h| h.resources[0].pre[0].exec.command.len()),
            Some(3)
        );
        let status = b.status.expect("status");
        assert_eq!(status.phase.as_deref(), Some("Completed"));
        assert!(status.completion_timestamp.is_some());
    }

    #[test]
    fn reads_a_minio_bsl() {
        let b: BackupStorageLocation = serde_json::from_value(serde_json::json!({
            "apiVersion": "velero.io/v1", "kind": "BackupStorageLocation",
            "metadata": {"name": "default", "namespace": "velero"},
            "spec": {"provider": "aws", "objectStorage": {"bucket": "velero", "prefix": "cluster-a"},
                     "credential": {"name": "cloud-credentials", "key": "cloud"},
                     "config": {"region": "minio", "s3ForcePathStyle": "true", "s3Url": "http://minio:9000"}},
            "status": {"phase": "Available"}
        }))
        .expect("bsl parses");
        assert_eq!(b.spec.object_storage.prefix.as_deref(), Some("cluster-a"));
        assert_eq!(b.spec.credential.map(|c| c.key), Some("cloud".to_owned()));
        assert_eq!(b.status.and_then(|s| s.phase), Some("Available".to_owned()));
    }

    #[test]
    fn absent_optionals_are_not_written() {
        let v = serde_json::to_value(Backup::default()).expect("serializes");
        assert_eq!(v["apiVersion"], "velero.io/v1");
        assert_eq!(v["kind"], "Backup");
        assert!(
            v["spec"].as_object().is_some_and(|o| o.is_empty()),
            "spec was {}",
            v["spec"]
        );
        assert!(v.get("status").is_none());
    }
}

/// Velero's kinds as typed kube-rs resources, so `Api<Backup>` and watchers work without dynamic objects.
macro_rules! velero_resource {
    ($ty:ty, $kind:literal, $plural:literal) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = kube::core::NamespaceResourceScope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                "velero.io".into()
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                "v1".into()
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

velero_resource!(Backup, "Backup", "backups");
velero_resource!(
    BackupStorageLocation,
    "BackupStorageLocation",
    "backupstoragelocations"
);
