//! `DisruptionPlan` spec: what to take down, how to back it up first, how to drain, terminate and replace.
//!
//! Every field has a serde default so that `spec: {nodes: [n1]}` is a complete plan meaning: Execute mode,
//! backup required (file-system backup to BSL `default` in namespace `velero`), kubectl-like drain, terminate
//! the instance, delete the Node, no replacement. The schema constraints and CEL rules below are repeated by
//! [`crate::api::validate()`] for API servers that do not enforce them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::status::DisruptionPlanStatus;

/// Go duration strings (`90s`, `1h30m`, `1.5h`), as Velero and Kubernetes write them. No sign: a negative
/// duration is meaningless for every field that uses it.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$";

/// The longest duration string a field takes (the CRD's `maxLength`): `2562047h47m16s854ms775us807ns`,
/// Go's longest duration, has 29 characters.
pub const DURATION_MAX_LENGTH: usize = 32;

/// A node name: a DNS-1123 subdomain (RFC 1123 labels joined by dots), at most 253 characters.
pub const NODE_NAME_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// A Bottlerocket taint value, `value:Effect` (value may be empty).
pub const TAINT_VALUE_PATTERN: &str = r"^[^:]*:(NoSchedule|PreferNoSchedule|NoExecute)$";

/// Plan a safe disruption of one or more nodes: back up the StatefulSet volumes on them with Velero,
/// verify the backup in object storage, then cordon, drain, terminate and optionally replace.
// kube's `printcolumn(...)` lists repeat `type_ = ...`, which clippy mistakes for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "snapdrain.io",
    version = "v1alpha1",
    kind = "DisruptionPlan",
    doc = "A safe, backup-first disruption of one or more nodes (snapdrain).",
    plural = "disruptionplans",
    shortname = "dplan",
    category = "snapdrain",
    status = "DisruptionPlanStatus",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Nodes", type_ = "string", json_path = ".status.summary.nodes"),
    printcolumn(
        name = "Backups",
        type_ = "string",
        json_path = ".status.summary.backups"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.message",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.nodes) != has(self.nodeSelector)")
    .message("set exactly one of spec.nodes or spec.nodeSelector"))]
#[x_kube(validation = Rule::new("!has(self.nodeSelector) || (has(self.nodeSelector.matchLabels) && size(self.nodeSelector.matchLabels) > 0) || (has(self.nodeSelector.matchExpressions) && size(self.nodeSelector.matchExpressions) > 0)")
    .message("spec.nodeSelector must not be empty: an empty selector would select every node"))]
#[x_kube(validation = Rule::new("!has(self.replacement) || self.replacement.when == 'none' || !has(self.mode) || self.mode != 'Release'")
    .message("spec.replacement is only launched in Execute mode; in Release mode the autoscaler provisions capacity"))]
#[x_kube(validation = Rule::new("has(self.replacement) == has(oldSelf.replacement) && (!has(self.replacement) || self.replacement == oldSelf.replacement)")
    .message("spec.replacement is immutable (the DisruptionPolicy judged it when the plan was created); create a new DisruptionPlan"))]
pub struct DisruptionPlanSpec {
    /// Names of the nodes to disrupt. Exclusive with `nodeSelector`. Immutable: create a new plan instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(min = 1, max = 1000),
        inner(length(max = 253), regex(pattern = NODE_NAME_PATTERN)),
        extend("x-kubernetes-list-type" = "set")
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.nodes is immutable; create a new DisruptionPlan"))]
    pub nodes: Vec<String>,

    /// Selects the nodes to disrupt by label, resolved once when the plan is decided. Exclusive with `nodes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.nodeSelector is immutable; create a new DisruptionPlan"))]
    pub node_selector: Option<LabelSelector>,

    /// Why the nodes go away, for people reading the plan (e.g. "Drifted", "AMI upgrade").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub reason: Option<String>,

    /// Who asked for the disruption.
    #[serde(default)]
    pub source: PlanSource,

    /// Execute: snapdrain drains, terminates and replaces. Release: snapdrain backs up, verifies and releases
    /// its holds; the autoscaler does the rest.
    #[serde(default)]
    pub mode: PlanMode,

    /// When the node goes away regardless (spot interruption, expiry + terminationGracePeriod). Backups that
    /// cannot finish by then fail the plan instead of holding the drain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Time>,

    /// Release mode: how long released holds wait for the disruptor to take the node before they come
    /// back (the plan then completes; its verified backup stays reusable). Go duration; default 15m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = DURATION_MAX_LENGTH))]
    pub release_window: Option<String>,

    /// How the StatefulSet volumes are backed up before the drain.
    #[serde(default)]
    pub backup: BackupSpec,

    /// How pods are evicted.
    #[serde(default)]
    pub drain: DrainSpec,

    /// What happens to the node after the drain (Execute mode).
    #[serde(default)]
    pub termination: TerminationSpec,

    /// Replacement capacity (Execute mode). Absent means none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<ReplacementSpec>,

    /// Plan only: compute and record what would happen, change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// Who asked for the disruption.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PlanSource {
    Manual,
    Karpenter,
    ClusterAutoscaler,
    NodeTerminationHandler,
    /// Made by the eviction gate when it first refused the eviction of a protected pod on the node (a person
    /// running `kubectl drain`, or any other drainer).
    EvictionGate,
    /// Created directly through the Kubernetes API (the default for hand-written plans).
    #[default]
    Api,
}

/// Who carries out the drain once the backup is verified.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PlanMode {
    #[default]
    Execute,
    Release,
}

/// Backup settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// required: no drain without a verified backup. best-effort: try, drain anyway on failure.
    /// skip: no backup.
    #[serde(default)]
    pub policy: BackupPolicy,

    /// Velero BackupStorageLocation name. Absent: Velero's default location, the BSL with
    /// `spec.default: true` (Velero writes its name into the Backup's `spec.storageLocation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_location: Option<String>,

    /// Namespace where Velero runs (Backups, BSLs and their credential Secrets live there).
    #[serde(default = "default_velero_namespace")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub velero_namespace: String,

    /// How Velero copies volume data. `Auto` (the default) picks per volume: a CSI snapshot for a network
    /// volume whose CSI driver has a VolumeSnapshotClass, a file-system backup for everything else.
    #[serde(default)]
    pub method: BackupMethod,

    /// Under `method: Auto`, whether Velero's data mover uploads each CSI snapshot to the bucket
    /// (`snapshotMoveData`). The default, true, keeps the promise "verified in the bucket" for every volume;
    /// false leaves snapshots in the storage system only.
    #[serde(default = "default_true")]
    pub snapshot_move_data: bool,

    /// What the Velero Backup selects: the protected pods on the plan's nodes (their PVCs and PVs follow
    /// as Velero additional items), or every pod of their StatefulSets.
    #[serde(default)]
    pub scope: BackupScope,

    /// Velero Backup `spec.ttl` (e.g. `168h`). Absent: Velero's server default (720h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = DURATION_MAX_LENGTH))]
    pub ttl: Option<String>,

    /// Reuse a Completed and verified backup of the same PVCs started at most this long ago, instead of a
    /// new one. Absent: only backups started after the plan was decided count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = DURATION_MAX_LENGTH))]
    pub reuse_if_newer_than: Option<String>,

    /// How long one backup attempt may take (including Velero's queue) before it counts as failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = DURATION_MAX_LENGTH))]
    pub timeout: Option<String>,

    /// Attempts per namespace before the plan fails (1-10).
    #[serde(default = "default_max_attempts")]
    #[schemars(range(min = 1, max = 10))]
    pub max_attempts: u32,

    /// Under a deadline (a forceful signal: spot interruption, a deleted NodeClaim), whether EC2
    /// `CreateSnapshots` cuts the node's protected EBS volumes at one instant and their pods are released
    /// at that cut instead of at a verified Velero backup. `WhenVeleroCannotFinish` (the default): only
    /// when Velero's estimate does not fit before the deadline. `Always`: for every plan with a deadline.
    /// `Never`: Velero or nothing. Plans without a deadline are never affected.
    #[serde(default)]
    pub emergency_snapshots: EmergencySnapshots,

    /// When a pod whose every volume is a network volume backed up by a CSI snapshot may go.
    /// `Verified` (the default): once its backup is verified in the bucket, as for every other pod.
    /// `Snapshot`: once Velero's CSI snapshot of each of its volumes is cut (the VolumeSnapshotContent has
    /// its snapshot handle), crash-consistent at that instant; the plan still completes only once the
    /// backup is verified. Node-local volumes always wait for the verified copy. A plan may ask for
    /// `Snapshot` only when the DisruptionPolicy's `planSettings.allowReleaseAtSnapshot` allows it.
    #[serde(default)]
    pub release_network_volumes_at: ReleasePoint,
}

/// The point at which a protected pod's volumes count as saved, so the pod may go.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReleasePoint {
    /// The backup is verified in the bucket.
    #[default]
    Verified,
    /// The volume's CSI snapshot is cut (network volumes only; others wait for `Verified`).
    Snapshot,
}

/// When a plan with a deadline takes EC2 snapshots of its EBS volumes instead of waiting for Velero.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EmergencySnapshots {
    #[default]
    WhenVeleroCannotFinish,
    Always,
    Never,
}

impl From<EmergencySnapshots> for crate::planning::ebs_snapshots::EmergencyPolicy {
    fn from(e: EmergencySnapshots) -> Self {
        match e {
            EmergencySnapshots::WhenVeleroCannotFinish => Self::WhenVeleroCannotFinish,
            EmergencySnapshots::Always => Self::Always,
            EmergencySnapshots::Never => Self::Never,
        }
    }
}

impl Default for BackupSpec {
    fn default() -> Self {
        Self {
            policy: BackupPolicy::default(),
            storage_location: None,
            velero_namespace: default_velero_namespace(),
            method: BackupMethod::default(),
            snapshot_move_data: true,
            scope: BackupScope::default(),
            ttl: None,
            reuse_if_newer_than: None,
            timeout: None,
            max_attempts: default_max_attempts(),
            emergency_snapshots: EmergencySnapshots::default(),
            release_network_volumes_at: ReleasePoint::default(),
        }
    }
}

/// What a plan's Velero Backup selects (DESIGN.md, "Backup scope").
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BackupScope {
    /// The protected pods on the plan's nodes, by `statefulset.kubernetes.io/pod-name`: the node's own
    /// data, so the node waits for its own volumes only. Velero's pod action adds each pod's PVCs (and
    /// their PVs) as additional items (vmware-tanzu/velero `pkg/backup/actions/backup_pod_action.go`).
    #[default]
    Pods,
    /// Every pod of the StatefulSets involved, by the StatefulSet's selector (all replicas' data).
    StatefulSet,
}

/// Whether a verified backup is a precondition of the drain.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum BackupPolicy {
    #[default]
    Required,
    BestEffort,
    Skip,
}

/// How Velero copies the volume data.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum BackupMethod {
    /// Per volume: a CSI snapshot (moved to the bucket when `snapshotMoveData`) for network volumes whose
    /// driver has a VolumeSnapshotClass, a file-system backup for node-local and all other volumes.
    #[default]
    Auto,
    /// Kopia file-system backup by the node-agent (data lands in the bucket; works on any storage).
    FileSystem,
    /// CSI snapshot moved into the bucket by the data mover.
    CsiDataMover,
    /// Native or CSI snapshot left in the storage system (data does not land in the bucket).
    Snapshot,
}

/// Drain settings, modelled on `kubectl drain`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// How long the drain of one node may take. Absent: no limit (the deadline still applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = DURATION_MAX_LENGTH))]
    pub timeout: Option<String>,

    /// Grace period passed to each eviction. Absent: each pod's own terminationGracePeriodSeconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub grace_period_seconds: Option<i64>,

    /// Evictions in flight at once, per node.
    #[serde(default = "default_max_concurrent_evictions")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_concurrent_evictions: u32,

    /// Leave DaemonSet pods running (kubectl `--ignore-daemonsets`). When false they are evicted last.
    #[serde(default = "default_true")]
    pub ignore_daemon_sets: bool,

    /// Allow evicting pods with emptyDir volumes, losing their data (kubectl `--delete-emptydir-data`).
    #[serde(default)]
    pub delete_empty_dir_data: bool,

    /// Only evict pods matching this selector (kubectl `--pod-selector`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,

    /// Evict pods that no controller owns (lost for good once evicted) and pods with an active
    /// `karpenter.sh/do-not-disrupt` annotation (kubectl `--force`). Without it such pods refuse or hold
    /// the drain.
    #[serde(default)]
    pub force: bool,
}

impl Default for DrainSpec {
    fn default() -> Self {
        Self {
            timeout: None,
            grace_period_seconds: None,
            max_concurrent_evictions: default_max_concurrent_evictions(),
            ignore_daemon_sets: true,
            delete_empty_dir_data: false,
            pod_selector: None,
            force: false,
        }
    }
}

/// What happens to the node after its drain.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TerminationSpec {
    /// Terminate the EC2 instance behind the node (or delete its Karpenter NodeClaim).
    #[serde(default = "default_true")]
    pub terminate_instance: bool,
    /// Delete the Node object once drained.
    #[serde(default = "default_true")]
    pub delete_node: bool,
    /// For an instance in an Auto Scaling group (or EKS managed node group): lower the group's desired
    /// capacity when terminating it, so the group does not launch a replacement. Absent: true when
    /// snapdrain launches the replacement itself, false otherwise (the group replaces the node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decrement_desired_capacity: Option<bool>,
}

impl Default for TerminationSpec {
    fn default() -> Self {
        Self {
            terminate_instance: true,
            delete_node: true,
            decrement_desired_capacity: None,
        }
    }
}

/// Replacement capacity launched by snapdrain on EC2.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.when == 'none' || (has(self.instanceTypes) && size(self.instanceTypes) > 0) || has(self.launchTemplate)")
    .message("replacement needs instanceTypes or launchTemplate unless replacement.when is none"))]
#[x_kube(validation = Rule::new("!has(self.nodeClassRef) || (!has(self.launchTemplate) && !has(self.imageId) && !has(self.iamInstanceProfile) && !has(self.securityGroupIds) && !has(self.subnets) && !has(self.metadataOptions))")
    .message("spec.replacement.nodeClassRef carries the AMI, instance profile, security groups, subnets and IMDS options: remove launchTemplate, imageId, iamInstanceProfile, securityGroupIds, subnets and metadataOptions"))]
pub struct ReplacementSpec {
    /// none, before-drain ("make before break") or after-drain.
    pub when: ReplacementWhen,

    /// A Karpenter EC2NodeClass (`karpenter.k8s.aws/v1`) the platform team governs: the replacement
    /// launches with what Karpenter resolved for it (`status.amis`, `status.subnets`,
    /// `status.securityGroups`, `status.instanceProfile`) and its `spec.userData`, `spec.tags` and
    /// `spec.metadataOptions`. Exclusive with the free-form launch settings below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_class_ref: Option<NodeClassRef>,

    /// EC2 launch template to start from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_template: Option<LaunchTemplateRef>,

    /// Instance types, in order of preference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50), inner(length(min = 1, max = 64)))]
    pub instance_types: Vec<String>,

    /// on-demand or spot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_type: Option<CapacityType>,

    /// Subnet ids to launch into, those in the zone of the evicted pods' volumes first. Absent: the
    /// launch template's, or the replaced node's subnet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub subnets: Vec<String>,

    /// IAM instance profile (name or ARN) of the node role; the kubelet authenticates to EKS with it.
    /// Absent: the replaced instance's (or the launch template's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub iam_instance_profile: Option<String>,

    /// Security groups that let the node reach the control plane. Absent: the replaced instance's (or
    /// the launch template's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(regex(pattern = r"^sg-[0-9a-f]+$")))]
    pub security_group_ids: Vec<String>,

    /// IMDS settings. Absent: the replaced instance's, else IMDSv2 required with hop limit 1 (as
    /// Karpenter's EC2NodeClass defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_options: Option<MetadataOptionsSpec>,

    /// How long a launched replacement may take to join as a Ready node before it is terminated and the
    /// launch is retried (or the plan fails). Default 10m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = DURATION_MAX_LENGTH))]
    pub join_timeout: Option<String>,

    /// Launches per node (each with its own ClientToken) before the plan fails (1-5).
    #[serde(default = "default_launch_attempts")]
    #[schemars(range(min = 1, max = 5))]
    pub max_attempts: u32,

    /// AMI id (a Bottlerocket image). Absent: the node class's, the launch template's, or the replaced
    /// instance's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,

    /// Bottlerocket user-data settings for the new node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bottlerocket: Option<BottlerocketSpec>,
}

impl Default for ReplacementSpec {
    fn default() -> Self {
        Self {
            when: ReplacementWhen::default(),
            node_class_ref: None,
            launch_template: None,
            instance_types: Vec::new(),
            capacity_type: None,
            subnets: Vec::new(),
            iam_instance_profile: None,
            security_group_ids: Vec::new(),
            metadata_options: None,
            join_timeout: None,
            max_attempts: default_launch_attempts(),
            image_id: None,
            bottlerocket: None,
        }
    }
}

/// IMDS options of the replacement instance.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MetadataOptionsSpec {
    /// `required` (IMDSv2 only) or `optional`.
    #[serde(default = "default_http_tokens")]
    #[schemars(regex(pattern = r"^(required|optional)$"))]
    pub http_tokens: String,
    /// IMDS response hop limit (2 lets pods without host networking reach IMDS).
    #[serde(default = "default_hop_limit")]
    #[schemars(range(min = 1, max = 64))]
    pub http_put_response_hop_limit: i32,
}

fn default_http_tokens() -> String {
    "required".into()
}

fn default_hop_limit() -> i32 {
    1
}

fn default_launch_attempts() -> u32 {
    2
}

/// When replacement capacity is launched.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ReplacementWhen {
    #[default]
    None,
    BeforeDrain,
    AfterDrain,
}

/// EC2 capacity type.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityType {
    OnDemand,
    Spot,
}

/// A Karpenter EC2NodeClass, by name (the class is cluster-scoped).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeClassRef {
    /// `metadata.name` of the EC2NodeClass.
    #[schemars(length(min = 1, max = 253), regex(pattern = NODE_NAME_PATTERN))]
    pub name: String,
}

/// An EC2 launch template, by id or by name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.id) != has(self.name)")
    .message("launchTemplate needs exactly one of id or name"))]
pub struct LaunchTemplateRef {
    /// `lt-` and 17 hex characters, as EC2 writes launch template ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^lt-[0-9a-f]{17}$"))]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 128))]
    pub name: Option<String>,
    /// A version number, `$Latest` or `$Default`. Absent: `$Default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+|\$Latest|\$Default)$"))]
    pub version: Option<String>,
}

impl LaunchTemplateRef {
    /// The id, else the name (the CRD's validation keeps exactly one of them).
    pub fn id_or_name(&self) -> &str {
        self.id
            .as_deref()
            .or(self.name.as_deref())
            .unwrap_or_default()
    }

    /// The version as a launch names it: the one given, else `$Default` (EC2's own when none is sent).
    pub fn version_or_default(&self) -> &str {
        self.version.as_deref().unwrap_or("$Default")
    }
}

/// Bottlerocket settings rendered into the replacement's user data (TOML).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BottlerocketSpec {
    /// `settings.kubernetes.cluster-name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// `settings.kubernetes.api-server`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server: Option<String>,
    /// `settings.kubernetes.cluster-certificate` (base64 CA bundle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_certificate: Option<String>,
    /// `settings.kubernetes.cluster-dns-ip`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_dns_ip: Option<String>,
    /// `settings.kubernetes.node-labels`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// `settings.kubernetes.node-taints`: key → list of `value:Effect`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "node_taints_schema")]
    pub node_taints: BTreeMap<String, Vec<String>>,
    /// `settings.kernel.sysctl`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sysctls: BTreeMap<String, String>,
    /// Any other Bottlerocket settings, merged under `[settings]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub settings: Option<serde_json::Map<String, serde_json::Value>>,
}

// schemars' `inner` does not reach through a map into its list values, so the pattern is spelled out.
fn node_taints_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "description": "`settings.kubernetes.node-taints`: key → list of `value:Effect`.",
        "additionalProperties": {
            "type": "array",
            "items": {"type": "string", "pattern": TAINT_VALUE_PATTERN}
        }
    })
}

fn default_velero_namespace() -> String {
    "velero".to_owned()
}

fn default_max_attempts() -> u32 {
    3
}

fn default_max_concurrent_evictions() -> u32 {
    10
}

fn default_true() -> bool {
    true
}
