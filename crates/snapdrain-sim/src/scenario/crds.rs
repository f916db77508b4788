//! The third-party CRDs the simulated world serves, copied unmodified (below their source header) from
//! Velero v1.18.2 (DeleteBackupRequest: main at d30d389), Karpenter v1.14.1 and the CSI snapshot API of
//! kubernetes-csi/external-snapshotter v8.6.0 (see the header of each file).

use serde_json::Value;

use crate::apiserver::resources::ResKey;
use crate::apiserver::store::{Store, WriteOptions};

const CRDS: &[(&str, &str)] = &[
    (
        "velero.io_backups.yaml",
        include_str!("crds/velero.io_backups.yaml"),
    ),
    (
        "velero.io_backupstoragelocations.yaml",
        include_str!("crds/velero.io_backupstoragelocations.yaml"),
    ),
    (
        "velero.io_podvolumebackups.yaml",
        include_str!("crds/velero.io_podvolumebackups.yaml"),
    ),
    (
        "velero.io_datauploads.yaml",
        include_str!("crds/velero.io_datauploads.yaml"),
    ),
    (
        // velero config/crd/v1/bases (commit d30d389): snapdrain deletes abandoned attempts through it.
        "velero.io_deletebackuprequests.yaml",
        include_str!("crds/velero.io_deletebackuprequests.yaml"),
    ),
    (
        "velero.io_schedules.yaml",
        include_str!("crds/velero.io_schedules.yaml"),
    ),
    (
        "snapshot.storage.k8s.io_volumesnapshotclasses.yaml",
        include_str!("crds/snapshot.storage.k8s.io_volumesnapshotclasses.yaml"),
    ),
    (
        "snapshot.storage.k8s.io_volumesnapshotcontents.yaml",
        include_str!("crds/snapshot.storage.k8s.io_volumesnapshotcontents.yaml"),
    ),
    (
        "snapshot.storage.k8s.io_volumesnapshots.yaml",
        include_str!("crds/snapshot.storage.k8s.io_volumesnapshots.yaml"),
    ),
    (
        "karpenter.sh_nodepools.yaml",
        include_str!("crds/karpenter.sh_nodepools.yaml"),
    ),
    (
        "karpenter.sh_nodeclaims.yaml",
        include_str!("crds/karpenter.sh_nodeclaims.yaml"),
    ),
    (
        "karpenter.k8s.aws_ec2nodeclasses.yaml",
        include_str!("crds/karpenter.k8s.aws_ec2nodeclasses.yaml"),
    ),
];

/// Creates every CRD that is not there yet.
pub fn install(store: &Store) -> Result<(), String> {
    let key = ResKey::new("apiextensions.k8s.io", "customresourcedefinitions");
    for (file, text) in CRDS {
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(text).map_err(|e| format!("embedded CRD {file}: {e}"))?;
        for crd in docs.into_iter().filter(|d| !d.is_null()) {
            let name = crd
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            if store.get(&key, None, name).is_some() {
                continue;
            }
            store
                .create(&key, None, crd, WriteOptions::default())
                .map_err(|e| format!("CRD {file}: {}", e.message))?;
        }
    }
    Ok(())
}
