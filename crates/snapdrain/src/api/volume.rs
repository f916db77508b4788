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
}
