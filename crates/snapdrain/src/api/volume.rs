//! What a protected volume is and how it is backed up, as the plan's status and `snapdrain plan` show it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Whether a volume outlives its node.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VolumeClass {
    /// Attached over the network (EBS, EFS, NFS, any CSI volume not pinned to one node): it outlives the
    /// node, and a snapshot of it stays usable once the node is gone.
    Network,
    /// On the node itself (a `local` PV, `hostPath`, a CSI volume pinned to one node such as TopoLVM's or
    /// OpenEBS LocalPV's): it dies with the node, so its data must be copied off before the node goes.
    NodeLocal,
    /// The PV could not be read (claim unbound, PV gone): treated as node-local, the safe side.
    Unknown,
}

/// How one volume's data is backed up.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VolumeMethod {
    /// Velero file-system backup (kopia, through the node-agent on the pod's node): the data lands in the bucket.
    FileSystem,
    /// A CSI VolumeSnapshot made by Velero, left in the storage system.
    CsiSnapshot,
    /// A CSI VolumeSnapshot whose data Velero's data mover then uploads to the bucket (`snapshotMoveData`).
    CsiDataMover,
}

/// One protected volume of a backup: what it is and how it is backed up.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeRecord {
    /// The PersistentVolumeClaim (in the backup's namespace).
    pub pvc: String,
    /// The bound PersistentVolume, when the claim is bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pv: Option<String>,
    pub class: VolumeClass,
    /// The CSI driver, or the in-tree volume type (`local`, `hostPath`, `nfs`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Why the volume has this class, for a person reading the plan.
    pub reason: String,
    pub method: VolumeMethod,
    /// The VolumeSnapshotClass Velero would use, for the CSI methods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_class: Option<String>,
    /// When this volume's pod may go as far as this volume is concerned: `Snapshot` only for a network
    /// volume backed up by a CSI method under `releaseNetworkVolumesAt: Snapshot`.
    #[serde(default, skip_serializing_if = "is_verified")]
    pub release_at: crate::api::plan::ReleasePoint,
    /// Velero's CSI snapshot of the volume for this backup attempt, once seen cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<CsiSnapshot>,
    /// The PV's capacity: what a first backup moves (a later one moves only what changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// The expected copy time of `sizeBytes` at Velero's rate as the controller is told it
    /// (`--velero-mib-per-second`): an upper bound, for the estimate against a deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_seconds: Option<u64>,
}

fn is_verified(p: &crate::api::plan::ReleasePoint) -> bool {
    *p == crate::api::plan::ReleasePoint::Verified
}

/// A CSI snapshot Velero cut of a volume: the VolumeSnapshot (in the claim's namespace) and its bound
/// VolumeSnapshotContent with the storage system's snapshot handle (an EBS `snap-...` id).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CsiSnapshot {
    pub volume_snapshot: String,
    pub content: String,
    pub handle: String,
    /// The content's `status.creationTime`: the data's point in time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// The content's `status.readyToUse` as last seen (EBS: EC2 reports the snapshot `completed`).
    #[serde(default)]
    pub ready: bool,
}
