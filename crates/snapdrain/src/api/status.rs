//! `DisruptionPlan` status: everything a restarted controller needs to resume without repeating a step
//! (backup names and attempts, EC2 client tokens, who cordoned the node), and what a person needs to know.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Condition types the controller sets on a plan.
pub mod condition {
    /// True when the spec passed validation. False with reason `Invalid` and the problems as message.
    pub const VALID: &str = "Valid";
    /// True when every needed backup is Completed and verified in the bucket.
    pub const BACKUPS_VERIFIED: &str = "BackupsVerified";
    /// True when every node is drained.
    pub const DRAINED: &str = "Drained";
    /// True when the replacement capacity is Ready.
    pub const REPLACED: &str = "Replaced";
    /// True once the plan reached a terminal phase.
    pub const DONE: &str = "Done";
    /// True (reason `ReleasedAtSnapshot`) when pods were released at an EC2 snapshot their plan cut
    /// under its deadline, not at a verified copy in the bucket.
    pub const RELEASED_AT_SNAPSHOT: &str = "ReleasedAtSnapshot";
    /// False while the last pass failed with an error that is retried (reason `Retrying`, the error as
    /// message); True again once a pass succeeds.
    pub const PROGRESSING: &str = "Progressing";
}

/// Where a plan is in its lifecycle. Terminal: Completed, Failed, Aborted.
#[derive(
    Serialize,
    Deserialize,
    JsonSchema,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    Default,
    PartialOrd,
    Ord,
)]
pub enum PlanPhase {
    #[default]
    Pending,
    BackingUp,
    Verifying,
    Cordoning,
    Draining,
    Terminating,
    Replacing,
    Completed,
    Failed,
    Aborted,
}

impl PlanPhase {
    /// Every phase, in lifecycle order (Execute cordons right after Pending, before the backup).
    pub const ALL: [PlanPhase; 10] = [
        Self::Pending,
        Self::Cordoning,
        Self::BackingUp,
        Self::Verifying,
        Self::Draining,
        Self::Terminating,
        Self::Replacing,
        Self::Completed,
        Self::Failed,
        Self::Aborted,
    ];

    /// Completed, Failed and Aborted never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Aborted)
    }

    /// The name as written in the status (and used as `stepTimings` key).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::BackingUp => "BackingUp",
            Self::Verifying => "Verifying",
            Self::Cordoning => "Cordoning",
            Self::Draining => "Draining",
            Self::Terminating => "Terminating",
            Self::Replacing => "Replacing",
            Self::Completed => "Completed",
            Self::Failed => "Failed",
            Self::Aborted => "Aborted",
        }
    }
}

impl std::fmt::Display for PlanPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Observed state of a DisruptionPlan.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionPlanStatus {
    #[serde(default)]
    pub phase: PlanPhase,

    /// metav1 Conditions; types in [`condition`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,

    /// Per-node progress, one entry per node the plan covers (resolved from nodes or nodeSelector).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeProgress>,

    /// One record per Velero Backup attempt (or reused backup).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backups: Vec<BackupRecord>,

    /// The EC2 snapshots a plan with a deadline cut of its nodes' EBS volumes because Velero could not
    /// finish in time (`spec.backup.emergencySnapshots`), one set per node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub emergency_snapshots: Vec<EmergencySnapshotSet>,

    /// Release mode: the pods whose holds this plan released (their backups verified), and when.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released_pods: Vec<ReleasedPod>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<Time>,
    /// Release mode: how the release ended (the phase machine decides from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<ReleaseEnd>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// When the disruption was decided: backups must start after this (or be within reuseIfNewerThan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<Time>,

    /// The cluster the replacements join, resolved while planning (before any node is touched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<ClusterJoinRecord>,

    /// The EC2NodeClass the replacements launch from (`spec.replacement.nodeClassRef`), as it was read
    /// while planning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_class: Option<NodeClassRecord>,

    /// When the current phase began (drain timeouts count from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_started_at: Option<MicroTime>,

    /// What is happening or what went wrong, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// Seconds spent in each phase, keyed by phase name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub step_timings: BTreeMap<String, f64>,

    /// Short strings for `kubectl get` columns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<StatusSummary>,
}

/// Short strings shown by `kubectl get dplan`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct StatusSummary {
    /// e.g. `1/3 drained`.
    pub nodes: String,
    /// e.g. `2/2 verified`, or `none needed`.
    pub backups: String,
}

impl StatusSummary {
    /// Computes the summary from the rest of the status. Backups count per namespace: the latest attempt
    /// of each (workload namespace) decides.
    pub fn of(status: &DisruptionPlanStatus) -> Self {
        let drained = status
            .nodes
            .iter()
            .filter(|n| {
                matches!(
                    n.phase,
                    NodePhase::Drained | NodePhase::Terminating | NodePhase::Gone | NodePhase::Kept
                )
            })
            .count();
        let mut latest: BTreeMap<&str, &BackupRecord> = BTreeMap::new();
        for b in &status.backups {
            match latest.get(b.namespace.as_str()) {
                Some(prev) if prev.attempt >= b.attempt => {}
                _ => {
                    latest.insert(b.namespace.as_str(), b);
                }
            }
        }
        let verified = latest.values().filter(|b| b.verified).count();
        let backups = if latest.is_empty() {
            "none".to_owned()
        } else {
            format!("{verified}/{} verified", latest.len())
        };
        Self {
            nodes: format!("{drained}/{} drained", status.nodes.len()),
            backups,
        }
    }
}

/// Progress of one node.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeProgress {
    pub name: String,
    /// The Node's uid when the plan was decided: a Node recreated under the same name is a different node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// EC2 instance id from `spec.providerID` (`aws:///<az>/<i-...>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// True when snapdrain set `spec.unschedulable`; only then does a rollback uncordon the node.
    #[serde(default)]
    pub cordoned_by_snapdrain: bool,
    /// True when snapdrain added its `snapdrain.io/draining:NoSchedule` taint; only then does a rollback
    /// remove it.
    #[serde(default)]
    pub tainted_by_snapdrain: bool,
    /// The pods the drain evicts, fixed (by UID) on its first pass: the drain is done when these are
    /// gone, whatever else runs on the node. Absent until the drain starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_targets: Option<Vec<EvictionTarget>>,
    #[serde(default)]
    pub pods_total: u32,
    #[serde(default)]
    pub pods_evicted: u32,
    #[serde(default)]
    pub pods_blocked: u32,
    /// Why pods are blocked (PDB, emptyDir refusal, eviction gate...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<ReplacementProgress>,
    #[serde(default)]
    pub phase: NodePhase,
    /// How the node's instance was launched, read from EC2 while it ran (a terminated instance loses
    /// its subnet and security groups): a replacement is launched the same way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<InstanceRecord>,
    /// What the node's replacement is launched with, resolved while planning (before any node is
    /// touched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<NodeJoinRecord>,
}

/// The cluster settings (Bottlerocket `settings.kubernetes`) every replacement of the plan joins with:
/// from the plan, else the controller's flags, else the replaced instance's user data.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterJoinRecord {
    /// `settings.kubernetes.cluster-name`.
    pub cluster_name: String,
    /// `settings.kubernetes.api-server`; absent when a launch template carries the user data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server: Option<String>,
    /// `settings.kubernetes.cluster-certificate` (base64); absent when a launch template carries the
    /// user data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_certificate: Option<String>,
    /// Where each setting came from, e.g. `clusterName: user data of instance i-0abc (node n1)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<String>,
}

/// What the plan's EC2NodeClass gave its replacements besides what each node's [`NodeJoinRecord`]
/// holds (AMI, instance profile, security groups, subnets, IMDS options).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeClassRecord {
    pub name: String,
    /// The class's uid when it was read: a class recreated under the same name is another class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// `metadata.generation` of the class when it was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// `status.amis[].name` of the AMI chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_name: Option<String>,
    /// SHA-256 (hex) of the class's `spec.userData` when it was read. The user data itself is not
    /// copied here (it may carry registry credentials; plan readers need not see it): the launch reads
    /// the class again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_sha256: Option<String>,
    /// `spec.tags`, put on the replacement instance as Karpenter puts them on its nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// What a node's replacement needs to join besides its user data: from the plan, else copied from the
/// replaced instance (none with a launch template, which carries its own).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeJoinRecord {
    /// The AMI: the plan's, the EC2NodeClass's or the replaced instance's (absent when a launch
    /// template carries it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// Instance profile ARN or name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_profile: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_group_ids: Vec<String>,
    /// Subnets to launch into; those in the zone of the drained pods' volumes are tried first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnet_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_tokens_required: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hop_limit: Option<i32>,
    /// The AMI's architecture (DescribeImages), checked against the instance types while planning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_architecture: Option<String>,
    /// The instance types the replacement launches with: those of `spec.replacement.instanceTypes` that
    /// run the AMI's architecture (DescribeInstanceTypes), in the plan's order. Empty: not checked (a
    /// launch template carries the AMI or the type), the plan's are used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instance_types: Vec<String>,
    /// The number of the launch template version checked while planning (`spec.replacement.launchTemplate`
    /// as `$Latest`, `$Default` or a number): the launch names this number, so a version made or made
    /// default after the check is never launched unchecked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_template_version: Option<String>,
    /// Where each setting came from, e.g. `instanceProfile: instance i-0abc`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<String>,
}

/// What EC2 said about a node's instance while it ran.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRecord {
    /// The AMI it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Instance profile ARN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_profile: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_group_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_tokens_required: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hop_limit: Option<i32>,
    /// `aws:autoscaling:groupName`: the instance is in this Auto Scaling group (or EKS node group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_scaling_group: Option<String>,
}

/// One pod the drain evicts, with the backoff of refused (`Failed`) evictions. Only the UID is recorded,
/// so that thousands fit in one plan (the whole object must stay under etcd's request limit, 1.5 MiB
/// by default). Statuses written by earlier versions carry the namespace and name too.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct EvictionTarget {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub uid: String,
    /// Consecutive evictions refused for good (RBAC 403, a webhook's 400/403...).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
    /// No eviction is sent before this time (set after a refusal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Time>,
    /// The last refusal, for `status.message` (at most 80 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Where one node is.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NodePhase {
    #[default]
    Pending,
    /// Waiting for the backups of its StatefulSet pods.
    BackingUp,
    /// Backups verified (or not needed); holds released.
    Released,
    Cordoned,
    Draining,
    Drained,
    Terminating,
    /// Instance terminated and/or Node deleted.
    Gone,
    Failed,
    /// Drained, and kept as `spec.termination` asks (the instance and Node stay).
    Kept,
}

/// Replacement capacity launched for one node.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReplacementProgress {
    /// EC2 ClientToken: a retried launch with the same token never starts a second instance.
    pub client_token: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instance_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default)]
    pub ready: bool,
    /// 1-based launch attempt (part of the ClientToken); a replacement that never joined is terminated
    /// and the next attempt gets a new token.
    #[serde(default)]
    pub attempt: u32,
    /// When this attempt's instance was launched (the join timeout counts from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launched_at: Option<Time>,
    /// Consecutive capacity errors (InsufficientInstanceCapacity) of this attempt's launch. Each retry
    /// launches with a ClientToken of its own (recorded here, in `clientToken`, before it is sent).
    #[serde(default)]
    pub capacity_errors: u32,
    /// What EC2 answered to the last launch without capacity: why the replacement waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_error: Option<String>,
    /// After a capacity error, the launch is not tried again before this (persisted, so the status
    /// write that records the error and wakes the plan does not turn the backoff into a tight loop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Time>,
}

/// How a Release plan's release ended.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseEnd {
    pub ended_at: Time,
    pub outcome: ReleaseOutcome,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The released nodes are gone: the disruptor took them.
    NodesGone,
    /// Every released pod left its node (a `kubectl drain`, say).
    PodsLeft,
    /// The release window passed first: the holds are back.
    WindowPassed,
    /// Protected pods no backup covers arrived on a released node: the holds are back, the next run
    /// backs them up.
    NewProtectedPods,
}

impl ReleaseOutcome {
    /// The disruptor took the nodes (otherwise the release expired).
    pub fn taken(self) -> bool {
        matches!(self, Self::NodesGone | Self::PodsLeft)
    }
}

/// A pod whose holds a Release plan removed.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReleasedPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One Velero Backup attempt for one workload namespace (or a reused backup).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BackupRecord {
    /// Velero Backup name (in the plan's Velero namespace).
    pub name: String,
    /// The workload namespace it covers.
    pub namespace: String,
    /// The Velero Backup's uid, compared with `velero-backup.json` in the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stateful_sets: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pvcs: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<String>,
    /// Each PVC's class (network or node-local) and the method that backs it up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<super::volume::VolumeRecord>,
    /// 1-based attempt number (part of the Backup name).
    #[serde(default)]
    pub attempt: u32,
    /// True when this record points at an earlier backup instead of one this plan created. It is checked
    /// again in the cluster (Completed, not about to expire) and in the bucket before it counts.
    #[serde(default)]
    pub reused: bool,
    /// The Backup's `spec.storageLocation` as Velero resolved it (the default BSL when the plan names none);
    /// verification reads this location's bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_location: Option<String>,
    /// Set when snapdrain gave up on this attempt (timeout, or a phase that can only end PartiallyFailed):
    /// the Backup is deleted through a Velero DeleteBackupRequest so it stops holding Velero's queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abandoned: Option<AbandonedBackup>,
    /// Velero Backup `status.phase` as last seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The Velero backup hooks run for the Backup's pods (the workloads' own
    /// `pre/post.hook.backup.velero.io/*` annotations, e.g. a file-system freeze or a database
    /// checkpoint, and the policy's hooks in `policyHooks`) and how many failed, as Velero counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<crate::api::velero::HookStatus>,
    /// The DisruptionPolicy's `spec.backupHooks` entries the Backup carries as Velero's
    /// `spec.hooks.resources`: `name (pre N, post M)` each. Velero counts them in `hooks` too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub policy_hooks: Vec<String>,
    /// While the Backup is `Queued`: its `status.queuePosition` in Velero 1.18's backup queue (1: next to
    /// start), refreshed when it halves and for the last three places (Velero renumbers the whole queue at
    /// every start), so it can say a place further back than the Backup is. Velero runs Backups
    /// concurrently only when their namespaces do not overlap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<i64>,
    /// True once the bucket contents were checked.
    #[serde(default)]
    pub verified: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verified_objects: Vec<VerifiedObject>,
    /// Set when the bucket contents were found wrong (not merely unreachable): the attempt counts as failed
    /// and a new Backup is made while attempts remain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<MicroTime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<MicroTime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One node's emergency EBS snapshot set: the intent (written before CreateSnapshots is called), then
/// what EC2 answered.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct EmergencySnapshotSet {
    pub node: String,
    pub instance_id: String,
    /// Why: Velero's estimate against the time left.
    pub reason: String,
    pub velero_estimate_seconds: u64,
    pub time_left_seconds: u64,
    /// Attached EBS volumes no protected pod uses (`ExcludeDataVolumeId`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    pub volumes: Vec<EmergencySnapshot>,
    /// Protected claims an EC2 snapshot cannot save (node-local volumes): Velero's to save, or lost.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unsaved: Vec<UnsavedVolume>,
    /// When EC2 accepted the set (every volume has a snapshot id): the data's point in time, and
    /// the release point of the pods whose every volume is in the set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_at: Option<Time>,
    /// EC2 refused the cut for its per-volume rate (a volume snapshotted less than 15 s before): when
    /// the set will be cut, once that window ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_not_before: Option<Time>,
    /// When every snapshot was `completed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// A snapshot ended in `error`, or a volume has no snapshot: the plan fails with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One protected EBS volume of an emergency set.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct EmergencySnapshot {
    /// `namespace/claim`.
    pub claim: String,
    pub volume_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// EC2's state: `pending`, `completed`, `error` (or another it reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// EC2's `NN%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
}

/// A protected claim the emergency set cannot save, and why.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct UnsavedVolume {
    /// `namespace/claim`.
    pub claim: String,
    pub why: String,
}

impl EmergencySnapshotSet {
    /// True once EC2 gave every volume a snapshot id (the point in time is fixed).
    pub fn accepted(&self) -> bool {
        !self.volumes.is_empty() && self.volumes.iter().all(|v| v.snapshot_id.is_some())
    }

    /// Claims (`namespace/claim`) whose snapshot EC2 accepted.
    pub fn saved_claims(&self) -> impl Iterator<Item = &str> {
        self.volumes
            .iter()
            .filter(|v| v.snapshot_id.is_some())
            .map(|v| v.claim.as_str())
    }
}

/// Where the deletion of an abandoned attempt stands.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbandonedBackup {
    /// Velero refuses to delete a backup while it runs or post-processes: asked again later.
    DeletePending,
    /// A DeleteBackupRequest was created.
    DeleteRequested,
    /// It never started (nothing in the bucket), so the Backup object itself was deleted.
    Deleted,
    /// The Backup was already gone.
    Gone,
}

/// An object checked in the bucket.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct VerifiedObject {
    pub key: String,
    pub size: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ns: &str, attempt: u32, verified: bool) -> BackupRecord {
        BackupRecord {
            name: format!("b-{ns}-{attempt}"),
            namespace: ns.into(),
            attempt,
            verified,
            ..Default::default()
        }
    }

    #[test]
    fn summary_counts_latest_attempts_and_drained_nodes() {
        let status = DisruptionPlanStatus {
            nodes: vec![
                NodeProgress {
                    name: "n1".into(),
                    phase: NodePhase::Gone,
                    ..Default::default()
                },
                NodeProgress {
                    name: "n2".into(),
                    phase: NodePhase::Draining,
                    ..Default::default()
                },
            ],
            backups: vec![
                record("db", 1, false),
                record("db", 2, true),
                record("mq", 1, false),
            ],
            ..Default::default()
        };
        let s = StatusSummary::of(&status);
        assert_eq!(s.nodes, "1/2 drained");
        assert_eq!(s.backups, "1/2 verified");
        assert_eq!(
            StatusSummary::of(&DisruptionPlanStatus::default()).backups,
            "none"
        );
    }

    #[test]
    fn phases_serialize_as_written_in_the_crd() {
        assert_eq!(
            serde_json::to_value(PlanPhase::BackingUp).ok(),
            Some(serde_json::json!("BackingUp"))
        );
        assert!(PlanPhase::Aborted.is_terminal() && !PlanPhase::Draining.is_terminal());
        let s: DisruptionPlanStatus =
            serde_json::from_value(serde_json::json!({})).expect("empty status");
        assert_eq!(s.phase, PlanPhase::Pending);
    }
}
