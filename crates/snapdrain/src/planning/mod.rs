//! Pure decisions, no I/O: which pods are protected, which backups a node needs, what to evict in which
//! order, what eviction and backup answers mean, deterministic names, and the plan's phase machine.
//!
//! - [`architecture`]: which of a replacement's instance types run its AMI's architecture.
//! - [`inventory`]: pod classification (protected, DaemonSet, mirror, terminal, critical, emptyDir) and PDBs.
//! - [`protection`]: which pods a DisruptionPolicy protects.
//! - [`holds`]: the hold annotations on protected pods: place, release, restore.
//! - [`node`]: [`plan_node`], the plan for one node.
//! - [`backup_hooks`]: which of the DisruptionPolicy's backup hooks a Velero Backup carries.
//! - [`backups`]: backup needs, reuse, the Velero Backup object, phase meaning, retries.
//! - [`drain`]: the eviction gate for protected pods, the pass's batch, drain completion and timeout.
//! - [`evictions`]: eviction tiers and eviction answer classification.
//! - [`naming`]: Backup names, EC2 client tokens, label values.
//! - [`node_class`]: a replacement's launch settings from a Karpenter EC2NodeClass.
//! - [`phase`]: the phase machine.
//! - [`facts`]: the phase machine's facts, from a plan's written status.
//! - [`history`]: which finished plans the policy's history settings delete.
//! - [`join`]: what a replacement needs to join (cluster, profile, security groups, subnets), resolved while planning.
//! - [`launch_policy`]: what a replacement may launch under the DisruptionPolicy, and its cap on nodes per plan.
//! - [`replacement`]: subnet order, Auto Scaling decrement and join timeout of replacements.
//! - [`status_size`]: bounds on a plan's status, so it stays under etcd's object limit.
//! - [`taint`]: snapdrain's drain taint and toleration matching.
//! - [`volumes`]: each protected volume's class (network or node-local) and backup method.
//! - [`snapshot_window`]: EC2's 15 s between snapshots of a volume: when a refused emergency set may be cut.
//! - [`velero_pods`]: Velero's data-path pods (1.17+) and server pod, which a running backup needs.
//! - [`warm`]: the warm-backup Schedules snapdrain keeps, one per protected namespace.

pub mod architecture;
pub mod backup_hooks;
pub mod backups;
pub mod csi_release;
pub mod drain;
pub mod ebs_snapshots;
pub mod ebs_volumes;
pub mod estimate;
pub mod evictions;
pub mod facts;
pub mod history;
pub mod holds;
pub mod inventory;
pub mod join;
pub mod launch_policy;
pub mod naming;
pub mod node;
pub mod node_class;
pub mod phase;
pub mod protection;
pub mod replacement;
pub mod snapshot_window;
pub mod status_size;
pub mod taint;
pub mod velero_pods;
pub mod volumes;
pub mod warm;

pub use backups::{
    BackupNeed, BackupProgress, Clock, RetryDecision, ReusableBackup, backup_retry,
    backup_timed_out, build_velero_backup, build_volume_policy, classify_backup,
    classify_backup_phase, find_reusable, retry_wait,
};
pub use evictions::{
    EvictionOutcome, EvictionTier, PlannedEviction, classify_eviction, eviction_tier, pod_gone,
};
pub use inventory::{PdbIndex, ProtectionRule};
pub use naming::{PlanRef, backup_name, client_token, label_value, launch_token};
pub use node::{NodeInputs, NodePlan, SkipReason, SkippedPod, plan_node};
pub use phase::{
    BackupsState, DrainState, PhaseDecision, PhaseFacts, next_phase, summarize_backups,
};
