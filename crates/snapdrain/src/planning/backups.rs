//! Which Velero Backups a node needs, which earlier ones can be reused, the Backup objects themselves, and
//! what a Backup's phase means.
//!
//! Scope of a Backup: one per workload namespace, `includedNamespaces: [ns]`, and `orLabelSelectors`:
//! - `backup.scope: Pods` (the default): one `statefulset.kubernetes.io/pod-name` entry per protected pod on
//!   the plan's nodes (the StatefulSet controller sets that label on every pod). Velero's pod backup item
//!   action adds the PVCs a selected pod mounts and the PVC action adds the bound PVs, whatever their
//!   labels (vmware-tanzu/velero `pkg/backup/actions/backup_pod_action.go`), so the node's own data is
//!   backed up and nothing else: the node waits for its own volumes only (DESIGN.md, "Backup scope").
//! - `backup.scope: StatefulSet`: one entry per affected StatefulSet (its `spec.selector`): every replica,
//!   for a consistent set at the cost of the StatefulSet's whole size. The StatefulSet controller copies the
//!   selector's matchLabels onto claims from volumeClaimTemplates, so the PVCs match as well; the
//!   StatefulSet object itself is only included when it carries the selector's labels.
//!
//! PVCs are not listed by name in either case.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

use super::naming::{PlanRef, backup_name, label_value};
use super::node::POD_NAME_LABEL;
use super::volumes::{needs_volume_policy, volume_policy_yaml};
use crate::api::plan::{BackupMethod, BackupScope, DisruptionPlanSpec};
use crate::api::status::BackupRecord;
use crate::api::velero::{self, BackupStatus};
use crate::api::volume::{VolumeMethod, VolumeRecord};

/// Label on every Backup snapdrain creates: the plan name (as a label value).
pub const PLAN_LABEL: &str = "snapdrain.io/plan";
/// Annotation: the plan's full name. The label holds a hash for names over 63 characters, so a Backup
/// change maps back to its plan through this.
pub const PLAN_ANNOTATION: &str = "snapdrain.io/plan-name";
/// Label: the plan uid.
pub const PLAN_UID_LABEL: &str = "snapdrain.io/plan-uid";
/// Label: the attempt number.
pub const ATTEMPT_LABEL: &str = "snapdrain.io/attempt";
/// Label: the workload namespace the Backup covers.
pub const NAMESPACE_LABEL: &str = "snapdrain.io/namespace";
/// Label `"true"` on a Backup that carries the DisruptionPolicy's backup hooks: the admission policy
/// `snapdrain-velero-backup-hooks` compares such a Backup's `spec.hooks` with the DisruptionPolicy, and
/// `snapdrain-velero-backups` refuses `spec.hooks` on any Backup without it.
pub const POLICY_HOOKS_LABEL: &str = "snapdrain.io/policy-hooks";
/// Annotation: comma-separated PVC names the plan expects in the backup (checked by verification).
pub const PVCS_ANNOTATION: &str = "snapdrain.io/pvcs";
/// Annotation: comma-separated StatefulSet names.
pub const STATEFULSETS_ANNOTATION: &str = "snapdrain.io/statefulsets";

/// The plan a Backup belongs to: the full-name annotation, else (Backups from older versions) the
/// label.
pub fn plan_of_backup(backup: &velero::Backup) -> Option<String> {
    use kube::ResourceExt;
    backup
        .annotations()
        .get(PLAN_ANNOTATION)
        .or_else(|| backup.labels().get(PLAN_LABEL))
        .cloned()
}

/// A backup one node needs in one workload namespace.
#[derive(Clone, Debug, PartialEq)]
pub struct BackupNeed {
    pub namespace: String,
    /// Affected StatefulSets, sorted.
    pub stateful_sets: Vec<String>,
    /// PVCs mounted by the protected pods on the node, sorted. Verification expects each of them.
    pub pvcs: Vec<String>,
    /// Protected pods on the node, sorted.
    pub pods: Vec<String>,
    /// Each PVC's class and method, in `pvcs` order.
    pub volumes: Vec<PlannedVolume>,
    /// One selector per StatefulSet, in `stateful_sets` order.
    pub or_label_selectors: Vec<LabelSelector>,
    /// An earlier Completed and verified backup that already covers these PVCs.
    pub reuse: Option<String>,
    /// CSI drivers whose volumes the Backup skips (a `skip` volume policy): the plan's EC2 snapshots hold
    /// every such volume of the selected pods ([`crate::planning::ebs_snapshots::leave_to_snapshots`]).
    pub skip_drivers: Vec<String>,
    /// The DisruptionPolicy's backup hooks the Backup carries as Velero's `spec.hooks.resources`
    /// ([`super::backup_hooks::hooks_for_namespace`]); set when the Backup is created.
    pub hooks: Vec<velero::BackupResourceHookSpec>,
}

/// One PVC of a backup: its class and method under the plan, and the method `Auto` would choose.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedVolume {
    pub record: VolumeRecord,
    pub auto_method: VolumeMethod,
}

/// An existing backup that might be reused (from this or another plan's status).
#[derive(Clone, Debug, PartialEq)]
pub struct ReusableBackup {
    pub name: String,
    /// The BackupStorageLocation the Backup went to, as Velero resolved it.
    pub storage_location: String,
    /// Workload namespace covered.
    pub namespace: String,
    pub pvcs: Vec<String>,
    /// Velero phase as last seen.
    pub phase: Option<String>,
    pub verified: bool,
    pub started_at: Option<Timestamp>,
}

impl ReusableBackup {
    /// From a plan's status record: its location is the one Velero wrote into the Backup
    /// (`record.storageLocation`), else `plan_location`, that plan's `spec.backup.storageLocation`.
    pub fn from_record(record: &BackupRecord, plan_location: Option<&str>) -> Self {
        Self {
            name: record.name.clone(),
            storage_location: record
                .storage_location
                .as_deref()
                .or(plan_location)
                .unwrap_or_default()
                .to_owned(),
            namespace: record.namespace.clone(),
            pvcs: record.pvcs.clone(),
            phase: record.phase.clone(),
            verified: record.verified,
            started_at: record.started_at.as_ref().map(|t| t.0),
        }
    }
}

/// When the disruption was decided, and now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clock {
    pub decided_at: Timestamp,
    pub now: Timestamp,
}

/// What a Backup selects (`orLabelSelectors`) under `scope`. `Pods`: each of `pods` (`name` or
/// `namespace/name`) by its `statefulset.kubernetes.io/pod-name` label, so only those pods and the PVCs
/// and PVs Velero adds for them are backed up. `StatefulSet`: `sts_selectors`, the StatefulSets' own
/// selectors, or the pods by name when none of the StatefulSets is left to read a selector from.
pub fn scope_selectors(
    scope: BackupScope,
    pods: &[String],
    sts_selectors: &[LabelSelector],
) -> Vec<LabelSelector> {
    let by_name = || {
        pods.iter()
            .map(|pod| LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    POD_NAME_LABEL.to_owned(),
                    pod.rsplit('/').next().unwrap_or(pod).to_owned(),
                )])),
                match_expressions: None,
            })
            .collect()
    };
    match scope {
        BackupScope::Pods => by_name(),
        BackupScope::StatefulSet if sts_selectors.is_empty() => by_name(),
        BackupScope::StatefulSet => sts_selectors.to_vec(),
    }
}

/// The newest backup that may stand in for a new one: Completed and verified, in `location` (the BSL a new
/// Backup would go to: the plan's, or Velero's default; `None` when unknown, and then nothing matches), same
/// namespace, covering every PVC, and started after the decision or within `reuse_if_newer_than` of now.
/// A match is only a candidate: [`check_reused_backup`] and a new bucket verification decide.
pub fn find_reusable<'a>(
    namespace: &str,
    pvcs: &[String],
    candidates: &'a [ReusableBackup],
    location: Option<&str>,
    reuse_if_newer_than: Option<Duration>,
    clock: Clock,
) -> Option<&'a ReusableBackup> {
    let location = location?;
    candidates
        .iter()
        .filter(|c| {
            c.verified
                && c.phase.as_deref() == Some("Completed")
                && c.namespace == namespace
                && c.storage_location == location
                && pvcs.iter().all(|p| c.pvcs.contains(p))
        })
        .filter_map(|c| c.started_at.map(|t| (t, c)))
        .filter(|(started, _)| {
            *started >= clock.decided_at
                || reuse_if_newer_than.is_some_and(|window| {
                    clock.now.duration_since(*started).unsigned_abs() <= window
                        && *started <= clock.now
                })
        })
        .max_by_key(|(started, _)| *started)
        .map(|(_, c)| c)
}

/// The Velero Backup for `need`, ready to create in `spec.backup.veleroNamespace`.
///
/// No ownerReference to the plan: deleting a Backup object makes Velero's sync controller re-create it from
/// the bucket, and garbage collection would fight that; the TTL governs its lifetime instead.
pub fn build_velero_backup(
    need: &BackupNeed,
    spec: &DisruptionPlanSpec,
    plan: &PlanRef<'_>,
    attempt: u32,
) -> serde_json::Value {
    let b = &spec.backup;
    let records: Vec<VolumeRecord> = need.volumes.iter().map(|v| v.record.clone()).collect();
    let policy = needs_volume_policy(b.method, &records);
    // A skip policy leaves the other volumes to the Backup's defaults (velero `internal/volumehelper`: no
    // match falls back to defaultVolumesToFsBackup or snapshotVolumes), so the flags below stay as they are.
    let with_policy = policy || !need.skip_drivers.is_empty();
    let (fs, snapshot, move_data) = match b.method {
        // Per volume, through the VolumePolicy of [`build_volume_policy`]; without a CSI volume, as FileSystem.
        BackupMethod::Auto if policy => (false, true, b.snapshot_move_data),
        BackupMethod::Auto | BackupMethod::FileSystem => (true, false, false),
        BackupMethod::CsiDataMover => (false, true, true),
        BackupMethod::Snapshot => (false, true, false),
    };
    let mut labels = BTreeMap::from([
        (PLAN_LABEL.to_owned(), label_value(plan.name)),
        (PLAN_UID_LABEL.to_owned(), label_value(plan.uid)),
        (ATTEMPT_LABEL.to_owned(), attempt.to_string()),
        (NAMESPACE_LABEL.to_owned(), need.namespace.clone()),
    ]);
    if !need.hooks.is_empty() {
        labels.insert(POLICY_HOOKS_LABEL.to_owned(), "true".to_owned());
    }
    let annotations = BTreeMap::from([
        (PLAN_ANNOTATION.to_owned(), plan.name.to_owned()),
        (PVCS_ANNOTATION.to_owned(), need.pvcs.join(",")),
        (
            STATEFULSETS_ANNOTATION.to_owned(),
            need.stateful_sets.join(","),
        ),
    ]);
    let backup = velero::Backup {
        metadata: ObjectMeta {
            name: Some(backup_name(plan, &need.namespace, attempt)),
            namespace: Some(b.velero_namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: velero::BackupSpec {
            included_namespaces: vec![need.namespace.clone()],
            or_label_selectors: need.or_label_selectors.clone(),
            // Unset unless the plan names one: Velero then uses the BSL marked `spec.default: true` and
            // writes its name here (velero pkg/controller/backup_controller.go prepareBackupRequest).
            storage_location: b.storage_location.clone(),
            ttl: b.ttl.clone(),
            default_volumes_to_fs_backup: Some(fs),
            snapshot_volumes: Some(snapshot),
            snapshot_move_data: Some(move_data),
            resource_policy: with_policy.then(|| velero::TypedLocalObjectReference {
                kind: "configmap".to_owned(),
                name: backup_name(plan, &need.namespace, attempt),
            }),
            // Absent without policy hooks: the admission policy lets a Backup without spec.hooks
            // through whatever the DisruptionPolicy holds.
            hooks: (!need.hooks.is_empty()).then(|| velero::BackupHooks {
                resources: need.hooks.clone(),
            }),
            ..velero::BackupSpec::default()
        },
        ..velero::Backup::default()
    };
    // Serializing plain structs of strings, bools and maps into a Value cannot fail.
    serde_json::to_value(backup).unwrap_or_default()
}

/// The ConfigMap of resource policies a Backup of `need` refers to (same name as the Backup, in the Velero
/// namespace), or None when the Backup needs none. Velero reads it when the Backup starts, requires exactly
/// one data key, and fails validation when it is missing (velero `internal/resourcepolicies`
/// `getResourcePoliciesFromConfig`, `pkg/controller/backup_controller.go` prepareBackupRequest), so it is
/// created first. Each volume policy selects by CSI driver or volume type: `skip` for the drivers of
/// `need.skip_drivers` (first: the first match decides), `snapshot` for the volumes that take a CSI snapshot,
/// `fs-backup` for those copied through the node-agent.
pub fn build_volume_policy(
    need: &BackupNeed,
    spec: &DisruptionPlanSpec,
    plan: &PlanRef<'_>,
    attempt: u32,
) -> Option<serde_json::Value> {
    let records: Vec<VolumeRecord> = need.volumes.iter().map(|v| v.record.clone()).collect();
    if !needs_volume_policy(spec.backup.method, &records) && need.skip_drivers.is_empty() {
        return None;
    }
    Some(serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": backup_name(plan, &need.namespace, attempt),
            "namespace": spec.backup.velero_namespace,
            "labels": {
                PLAN_LABEL: label_value(plan.name),
                PLAN_UID_LABEL: label_value(plan.uid),
                ATTEMPT_LABEL: attempt.to_string(),
                NAMESPACE_LABEL: need.namespace,
            },
            "annotations": {PLAN_ANNOTATION: plan.name},
        },
        "data": {"volume-policy.yaml": volume_policy_yaml(&records, &need.skip_drivers)},
    }))
}

/// What a Velero Backup's phase means for the drain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackupProgress {
    /// Not finished: keep waiting (New, Queued, ReadyToStart, InProgress, WaitingForPluginOperations*,
    /// Finalizing*, and phases this version does not know).
    Waiting,
    /// Completed: go on to verification.
    Completed,
    /// Finished without a usable backup.
    Failed(String),
}

/// The queue position a plan records for its queued Backup, given the one recorded and Velero's now
/// (`None`: not queued). Velero renumbers every queued Backup each time one starts (velero
/// pkg/controller/backup_queue_controller.go, "Updating queuePosition for remaining queued backups"), so
/// following each renumbering would rewrite every waiting plan's status each time: with n Backups
/// queued, n status writes per start. The record follows the queue when the position halves, for the
/// last three places and when it grows; between those it says where the Backup stood (never nearer than
/// it is). About log2(n) + 3 writes per Backup instead of n.
pub fn recorded_queue_position(recorded: Option<i64>, velero: Option<i64>) -> Option<i64> {
    match (recorded, velero) {
        (Some(was), Some(now)) if now > 3 && now < was && now > was / 2 => Some(was),
        (_, now) => now,
    }
}

/// Classifies a Backup `status.phase` (absent or empty means New).
///
/// Only `Completed` counts: `PartiallyFailed` lost some items. `failureReason` is not consulted because it
/// can stay set on a backup that later Completed (velero#7230); see [`classify_backup`] for messages.
pub fn classify_backup_phase(phase: Option<&str>) -> BackupProgress {
    match phase.unwrap_or_default() {
        "Completed" => BackupProgress::Completed,
        "PartiallyFailed" => {
            BackupProgress::Failed("Velero finished the backup as PartiallyFailed".to_owned())
        }
        "Failed" => BackupProgress::Failed("Velero marked the backup Failed".to_owned()),
        "FailedValidation" => {
            BackupProgress::Failed("Velero refused the backup spec (FailedValidation)".to_owned())
        }
        "Deleting" => BackupProgress::Failed("the backup is being deleted".to_owned()),
        // Not a Velero phase: snapdrain's record of a Backup that was created and has since gone.
        "Deleted" => BackupProgress::Failed("the Velero Backup no longer exists".to_owned()),
        // These can only end PartiallyFailed (velero pkg/controller/backup_finalizer_controller.go:
        // FinalizingPartiallyFailed -> PartiallyFailed; backup_operations_controller.go ends
        // WaitingForPluginOperationsPartiallyFailed in FinalizingPartiallyFailed or PartiallyFailed), and plugin
        // operations may run for itemOperationTimeout (4h): fail the attempt now and start the next.
        p @ ("WaitingForPluginOperationsPartiallyFailed" | "FinalizingPartiallyFailed") => {
            BackupProgress::Failed(format!(
                "Velero reported {p}: the backup can only end PartiallyFailed"
            ))
        }
        // New, Queued, ReadyToStart, InProgress, WaitingForPluginOperations, Finalizing, "" and
        // future phases: the backup timeout bounds the wait.
        _ => BackupProgress::Waiting,
    }
}

/// Like [`classify_backup_phase`], with Velero's failureReason and validationErrors in the message.
pub fn classify_backup(name: &str, status: Option<&BackupStatus>) -> BackupProgress {
    match classify_backup_phase(status.and_then(|s| s.phase.as_deref())) {
        BackupProgress::Failed(msg) => {
            let mut msg = format!("backup {name}: {msg}");
            if let Some(s) = status {
                if let Some(r) = s.failure_reason.as_deref().filter(|r| !r.is_empty()) {
                    msg.push_str(&format!(": {r}"));
                }
                if !s.validation_errors.is_empty() {
                    msg.push_str(&format!(": {}", s.validation_errors.join("; ")));
                }
            }
            msg.push_str(&format!(" (see `velero backup logs {name}`)"));
            BackupProgress::Failed(msg)
        }
        other => other,
    }
}

/// How long a reused Backup must still live: its `status.expiration` must be at least this far away.
///
/// Velero's GC deletes an expired Backup together with its bucket data (velero
/// pkg/controller/gc_controller.go creates a DeleteBackupRequest once `status.expiration` has passed; it runs
/// every hour by default). The backup is the way back if the drain goes wrong, so it must outlive the rest
/// of the plan and the time a person takes to notice and restore: a day covers a drain found broken the next
/// morning. A backup closer to its expiration than that is not reused; a fresh one (with the plan's ttl) is
/// made instead, which costs one backup, never data.
pub const REUSE_EXPIRY_MARGIN: Duration = Duration::from_secs(24 * 3600);

/// Whether the live Velero Backup behind a reused record can still stand in for a fresh one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReuseCheck {
    /// Completed, the same object, and not expiring within the margin: verify it in the bucket again.
    Usable,
    /// Make a fresh backup instead, for this reason.
    Unusable(String),
}

/// Checks the Backup (as read now) that a reused record points at: it must exist and not be deleting, be
/// the object that was verified (`expected_uid`), be `Completed`, and expire no sooner than `now + margin`
/// (no `status.expiration` means Velero never collects it: gc_controller.go skips it).
pub fn check_reused_backup(
    name: &str,
    expected_uid: Option<&str>,
    backup: Option<&velero::Backup>,
    now: Timestamp,
    margin: Duration,
) -> ReuseCheck {
    let Some(b) = backup else {
        return ReuseCheck::Unusable(format!("Velero Backup {name} no longer exists"));
    };
    if b.metadata.deletion_timestamp.is_some() {
        return ReuseCheck::Unusable(format!("Velero Backup {name} is being deleted"));
    }
    if let (Some(want), Some(got)) = (expected_uid, b.metadata.uid.as_deref())
        && want != got
    {
        return ReuseCheck::Unusable(format!(
            "Velero Backup {name} was re-created (uid {got}, verified uid {want})"
        ));
    }
    let status = b.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("New");
    if phase != "Completed" {
        return ReuseCheck::Unusable(format!("Velero Backup {name} is {phase}, not Completed"));
    }
    if let Some(expiration) = status.and_then(|s| s.expiration.as_ref()).map(|t| t.0) {
        let margin = jiff::SignedDuration::try_from(margin).unwrap_or(jiff::SignedDuration::MAX);
        if expiration <= now.saturating_add(margin).unwrap_or(Timestamp::MAX) {
            return ReuseCheck::Unusable(format!(
                "Velero Backup {name} expires at {expiration} (Velero's GC then deletes it with its bucket data), sooner than the {}h a reused backup must still live",
                REUSE_EXPIRY_MARGIN.as_secs() / 3600
            ));
        }
    }
    ReuseCheck::Usable
}

/// How to get rid of an attempt snapdrain gave up on, given the Backup's phase and `spec.storageLocation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbandonAction {
    /// Velero refuses or cannot take a deletion now: look again later.
    Wait,
    /// A DeleteBackupRequest, as `velero backup delete` makes (bucket data, snapshots, then the object).
    RequestDeletion,
    /// Delete the Backup object itself: it never started, so nothing of it is in the bucket.
    DeleteObject,
}

/// What to do with an abandoned attempt (velero pkg/controller/backup_deletion_controller.go Reconcile):
/// - InProgress, WaitingForPluginOperations*, Finalizing*: Velero refuses ("backup is still in
///   progress": the backupTracker holds them), so wait for the end.
/// - ReadyToStart: the queue controller counted it in the backupTracker and only the backup controller
///   releases that slot; removing it now could leak the slot, and it leaves the phase within moments.
/// - New/Queued without `spec.storageLocation` (the default BSL is resolved only when it starts): the
///   deletion controller looks up the BSL by that empty name and records "backup storage location  not
///   found" without deleting; nothing is in the bucket yet, so the object itself is deleted.
/// - Anything else has its location: a DeleteBackupRequest.
pub fn abandon_action(phase: Option<&str>, storage_location: Option<&str>) -> AbandonAction {
    let phase = phase.unwrap_or_default();
    match phase {
        "InProgress"
        | "WaitingForPluginOperations"
        | "WaitingForPluginOperationsPartiallyFailed"
        | "Finalizing"
        | "FinalizingPartiallyFailed"
        | "ReadyToStart" => AbandonAction::Wait,
        "" | "New" | "Queued" if storage_location.is_none_or(str::is_empty) => {
            AbandonAction::DeleteObject
        }
        _ => AbandonAction::RequestDeletion,
    }
}

/// Whether Velero would delete a Backup in `phase` when asked (see [`abandon_action`]).
pub fn velero_deletes_in_phase(phase: Option<&str>) -> bool {
    abandon_action(phase, Some("location")) != AbandonAction::Wait
}

/// Label Velero puts on (and GC looks up) DeleteBackupRequests: the backup name (velero
/// pkg/apis/velero/v1/labels.go `BackupNameLabel`).
pub const VELERO_BACKUP_NAME_LABEL: &str = "velero.io/backup-name";
/// Label: the backup uid (`BackupUIDLabel`).
pub const VELERO_BACKUP_UID_LABEL: &str = "velero.io/backup-uid";

/// The `velero.io/v1` DeleteBackupRequest for Backup `backup` (uid `uid`) in `velero_namespace`, labelled as
/// `velero backup delete` makes it (velero pkg/backup/delete_helpers.go NewDeleteBackupRequest). The name is
/// deterministic (`<backup>-delete`) so a restarted controller does not ask twice.
pub fn build_delete_request(
    backup: &str,
    uid: Option<&str>,
    velero_namespace: &str,
) -> serde_json::Value {
    let mut labels = serde_json::Map::new();
    labels.insert(
        VELERO_BACKUP_NAME_LABEL.into(),
        serde_json::Value::String(label_value(backup)),
    );
    if let Some(uid) = uid {
        labels.insert(
            VELERO_BACKUP_UID_LABEL.into(),
            serde_json::Value::String(uid.to_owned()),
        );
    }
    serde_json::json!({
        "apiVersion": velero::API_VERSION,
        "kind": "DeleteBackupRequest",
        "metadata": {
            "name": delete_request_name(backup),
            "namespace": velero_namespace,
            "labels": labels,
        },
        "spec": {"backupName": backup},
    })
}

/// `<backup>-delete` (Backup names are DNS labels of at most 63 characters, so this is a valid name).
pub fn delete_request_name(backup: &str) -> String {
    format!("{backup}-delete")
}

/// What to do after a backup attempt failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetryDecision {
    /// Create attempt `next_attempt` (a new Backup name) after `after`.
    Retry { next_attempt: u32, after: Duration },
    /// Attempts exhausted: fail (or, best-effort, go on without).
    GiveUp { message: String },
}

/// First retry waits this long, doubling per attempt up to [`MAX_BACKUP_BACKOFF`].
pub const BASE_BACKUP_BACKOFF: Duration = Duration::from_secs(30);
pub const MAX_BACKUP_BACKOFF: Duration = Duration::from_secs(300);

/// Retry with exponential backoff until `max_attempts` attempts (1-based `attempt` just failed) were made.
pub fn backup_retry(attempt: u32, max_attempts: u32, failure: &str) -> RetryDecision {
    if attempt >= max_attempts {
        return RetryDecision::GiveUp {
            message: format!("{failure}; gave up after {attempt} of {max_attempts} attempts"),
        };
    }
    let factor = 1u32 << attempt.saturating_sub(1).min(16);
    let after = BASE_BACKUP_BACKOFF
        .saturating_mul(factor)
        .min(MAX_BACKUP_BACKOFF);
    RetryDecision::Retry {
        next_attempt: attempt + 1,
        after,
    }
}

/// How long a retry still has to wait: `None` once `after` has passed since `since` (the failed attempt's
/// completion, or its start), else the time left.
pub fn retry_wait(since: Timestamp, now: Timestamp, after: Duration) -> Option<Duration> {
    let elapsed = if now > since {
        now.duration_since(since).unsigned_abs()
    } else {
        Duration::ZERO
    };
    (elapsed < after).then(|| after - elapsed)
}

/// True when an attempt created at `created_at` has run longer than `timeout` (None: never).
pub fn backup_timed_out(created_at: Timestamp, now: Timestamp, timeout: Option<Duration>) -> bool {
    timeout.is_some_and(|t| now > created_at && now.duration_since(created_at).unsigned_abs() > t)
}

/// How long until an attempt created at `created_at` times out (None: no timeout). A Queued backup sees no
/// phase change to wake the plan, so the plan must look again when its timeout comes.
pub fn backup_timeout_left(
    created_at: Timestamp,
    now: Timestamp,
    timeout: Option<Duration>,
) -> Option<Duration> {
    let elapsed = if now > created_at {
        now.duration_since(created_at).unsigned_abs()
    } else {
        Duration::ZERO
    };
    timeout.map(|t| t.saturating_sub(elapsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_position_is_recorded_as_it_halves_and_for_the_last_three_places() {
        // Velero renumbers 40 queued Backups by one at each start: the record changes 8 times, not 40.
        let mut recorded = None;
        let mut written = Vec::new();
        for now in (1..=40).rev().map(Some).chain([None]) {
            let next = recorded_queue_position(recorded, now);
            if next != recorded {
                written.push(next);
            }
            recorded = next;
        }
        assert_eq!(
            written,
            [
                Some(40),
                Some(20),
                Some(10),
                Some(5),
                Some(3),
                Some(2),
                Some(1),
                None
            ]
        );
        // Never nearer than it is; a Backup pushed back is followed at once.
        assert_eq!(recorded_queue_position(Some(10), Some(7)), Some(10));
        assert_eq!(recorded_queue_position(Some(10), Some(12)), Some(12));
        assert_eq!(recorded_queue_position(Some(2), Some(2)), Some(2));
        assert_eq!(recorded_queue_position(None, Some(9)), Some(9));
    }

    #[test]
    fn scope_pods_selects_the_recorded_pods_by_name_whatever_the_statefulsets_select() {
        let sts = LabelSelector {
            match_labels: Some(BTreeMap::from([("app".to_owned(), "pg".to_owned())])),
            match_expressions: None,
        };
        let pods = vec!["db/pg-1".to_owned(), "pg-2".to_owned()];
        let names = |sels: Vec<LabelSelector>| -> Vec<String> {
            sels.into_iter()
                .flat_map(|s| s.match_labels.unwrap_or_default().into_iter())
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        };
        assert_eq!(
            names(scope_selectors(
                BackupScope::Pods,
                &pods,
                std::slice::from_ref(&sts)
            )),
            [
                "statefulset.kubernetes.io/pod-name=pg-1",
                "statefulset.kubernetes.io/pod-name=pg-2"
            ]
        );
        assert_eq!(
            names(scope_selectors(BackupScope::StatefulSet, &pods, &[sts])),
            ["app=pg"]
        );
        // The StatefulSet is gone: its pods by name rather than a Backup that selects everything.
        assert_eq!(
            names(scope_selectors(BackupScope::StatefulSet, &pods, &[])).len(),
            2
        );
    }
    use serde_json::json;

    #[test]
    fn a_waiting_attempt_is_looked_at_again_when_its_timeout_comes() {
        let t0 = ts("2026-05-20T10:00:00Z");
        let t = Some(Duration::from_secs(10));
        assert_eq!(
            backup_timeout_left(t0, ts("2026-05-20T10:00:04Z"), t),
            Some(Duration::from_secs(6))
        );
        assert_eq!(
            backup_timeout_left(t0, ts("2026-05-20T10:00:40Z"), t),
            Some(Duration::ZERO)
        );
        assert_eq!(backup_timeout_left(t0, t0, None), None);
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn need() -> BackupNeed {
        BackupNeed {
            namespace: "db".into(),
            stateful_sets: vec!["pg".into()],
            pvcs: vec!["data-pg-0".into()],
            pods: vec!["pg-0".into()],
            volumes: Vec::new(),
            or_label_selectors: vec![
                serde_json::from_value(json!({"matchLabels": {"app": "pg"}})).expect("sel"),
            ],
            reuse: None,
            skip_drivers: Vec::new(),
            hooks: Vec::new(),
        }
    }

    const PLAN: PlanRef<'static> = PlanRef {
        name: "drain-n1",
        uid: "plan-uid-1",
    };

    /// Policy hooks go into `spec.hooks.resources` with the label the admission policy keys on; a
    /// Backup without them has neither.
    #[test]
    fn a_backup_carries_the_policy_hooks_and_says_so_in_a_label() {
        let spec: DisruptionPlanSpec =
            serde_json::from_value(json!({"nodes": ["n1"]})).expect("spec");
        let plain = build_velero_backup(&need(), &spec, &PLAN, 1);
        assert_eq!(plain["spec"].get("hooks"), None);
        assert_eq!(plain["metadata"]["labels"].get(POLICY_HOOKS_LABEL), None);
        let mut hooked = need();
        hooked.hooks = serde_json::from_value(json!([{"name": "pg-freeze",
            "includedNamespaces": ["db"], "pre": [{"exec": {"command": ["/sbin/fsfreeze", "--freeze", "/data"]}}]}]))
        .expect("hooks");
        let v = build_velero_backup(&hooked, &spec, &PLAN, 1);
        assert_eq!(v["metadata"]["labels"][POLICY_HOOKS_LABEL], "true");
        assert_eq!(
            v["spec"]["hooks"],
            json!({"resources": [{"name": "pg-freeze", "includedNamespaces": ["db"],
                "pre": [{"exec": {"command": ["/sbin/fsfreeze", "--freeze", "/data"]}}]}]})
        );
    }

    #[test]
    fn file_system_backup_object() {
        let spec: DisruptionPlanSpec =
            serde_json::from_value(json!({"nodes": ["n1"], "backup": {"ttl": "168h"}}))
                .expect("spec");
        let v = build_velero_backup(&need(), &spec, &PLAN, 2);
        assert_eq!(v["apiVersion"], "velero.io/v1");
        assert_eq!(v["kind"], "Backup");
        assert_eq!(v["metadata"]["namespace"], "velero");
        assert_eq!(v["metadata"]["name"], backup_name(&PLAN, "db", 2));
        assert_eq!(v["metadata"]["labels"]["snapdrain.io/plan"], "drain-n1");
        assert_eq!(v["metadata"]["labels"]["snapdrain.io/attempt"], "2");
        assert_eq!(
            v["metadata"]["annotations"]["snapdrain.io/plan-name"],
            "drain-n1"
        );
        assert_eq!(
            v["metadata"]["annotations"]["snapdrain.io/pvcs"],
            "data-pg-0"
        );
        let s = &v["spec"];
        assert_eq!(s["includedNamespaces"], json!(["db"]));
        assert_eq!(
            s["orLabelSelectors"],
            json!([{"matchLabels": {"app": "pg"}}])
        );
        assert!(
            s.get("labelSelector").is_none(),
            "Velero refuses labelSelector together with orLabelSelectors"
        );
        assert!(
            s.get("storageLocation").is_none(),
            "unset: Velero uses the BSL marked default"
        );
        assert_eq!(s["ttl"], "168h");
        assert_eq!(s["defaultVolumesToFsBackup"], true);
        assert_eq!(s["snapshotVolumes"], false);
        assert_eq!(s["snapshotMoveData"], false);
    }

    #[test]
    fn method_mapping() {
        let data_mover: DisruptionPlanSpec =
            serde_json::from_value(json!({"nodes": ["n1"], "backup": {"method": "csi-data-mover", "storageLocation": "minio", "veleroNamespace": "backup"}})).expect("spec");
        let v = build_velero_backup(&need(), &data_mover, &PLAN, 1);
        assert_eq!(v["metadata"]["namespace"], "backup");
        assert_eq!(v["spec"]["storageLocation"], "minio");
        assert_eq!(v["spec"]["snapshotMoveData"], true);
        assert_eq!(v["spec"]["snapshotVolumes"], true);
        assert_eq!(v["spec"]["defaultVolumesToFsBackup"], false);
        assert!(
            v["spec"].get("ttl").is_none(),
            "absent ttl leaves Velero's default"
        );
        let snap: DisruptionPlanSpec =
            serde_json::from_value(json!({"nodes": ["n1"], "backup": {"method": "snapshot"}}))
                .expect("spec");
        let v = build_velero_backup(&need(), &snap, &PLAN, 1);
        assert_eq!(v["spec"]["snapshotVolumes"], true);
        assert_eq!(v["spec"]["snapshotMoveData"], false);
        assert_eq!(v["spec"]["defaultVolumesToFsBackup"], false);
    }

    #[test]
    fn auto_carries_each_volume_method_in_a_volume_policy() {
        use crate::api::volume::{VolumeClass, VolumeMethod, VolumeRecord};
        let volume = |pvc: &str, source: &str, method| PlannedVolume {
            record: VolumeRecord {
                pvc: pvc.into(),
                pv: None,
                class: VolumeClass::Network,
                source: Some(source.into()),
                reason: String::new(),
                method,
                snapshot_class: None,
                release_at: crate::api::plan::ReleasePoint::Verified,
                snapshot: None,
                size_bytes: None,
                expected_seconds: None,
            },
            auto_method: method,
        };
        let auto: DisruptionPlanSpec =
            serde_json::from_value(json!({"nodes": ["n1"]})).expect("spec");
        // Nothing to snapshot: a file-system backup as before, no policy.
        let mut fs_only = need();
        fs_only.volumes = vec![volume("data-pg-0", "local", VolumeMethod::FileSystem)];
        let v = build_velero_backup(&fs_only, &auto, &PLAN, 1);
        assert_eq!(v["spec"]["defaultVolumesToFsBackup"], true);
        assert_eq!(v["spec"]["snapshotVolumes"], false);
        assert!(v["spec"].get("resourcePolicy").is_none());
        assert!(build_volume_policy(&fs_only, &auto, &PLAN, 1).is_none());
        // An EBS volume to snapshot and move, a local one to copy: one Backup, the choice in its policy.
        let mut both = need();
        both.volumes = vec![
            volume("data-pg-0", "ebs.csi.aws.com", VolumeMethod::CsiDataMover),
            volume("wal-pg-0", "local", VolumeMethod::FileSystem),
        ];
        let v = build_velero_backup(&both, &auto, &PLAN, 2);
        let name = v["metadata"]["name"].clone();
        assert_eq!(v["spec"]["defaultVolumesToFsBackup"], false);
        assert_eq!(v["spec"]["snapshotVolumes"], true);
        assert_eq!(v["spec"]["snapshotMoveData"], true);
        assert_eq!(
            v["spec"]["resourcePolicy"],
            json!({"kind": "configmap", "name": name})
        );
        let cm = build_volume_policy(&both, &auto, &PLAN, 2).expect("a policy");
        assert_eq!(cm["metadata"]["name"], name);
        assert_eq!(cm["metadata"]["namespace"], "velero");
        let data = cm["data"].as_object().expect("data");
        assert_eq!(data.len(), 1, "Velero reads exactly one key");
        let yaml = data["volume-policy.yaml"].as_str().expect("yaml");
        assert!(
            yaml.contains("ebs.csi.aws.com") && yaml.contains("type: snapshot"),
            "{yaml}"
        );
        assert!(
            yaml.contains("[\"local\"]") && yaml.contains("type: fs-backup"),
            "{yaml}"
        );
        // snapshotMoveData: false leaves the snapshots in EBS.
        let keep: DisruptionPlanSpec =
            serde_json::from_value(json!({"nodes": ["n1"], "backup": {"snapshotMoveData": false}}))
                .expect("spec");
        let v = build_velero_backup(&both, &keep, &PLAN, 1);
        assert_eq!(v["spec"]["snapshotMoveData"], false);
    }

    /// The EBS claims an emergency EC2 snapshot holds are skipped by driver, ahead of any other policy
    /// (Velero's first match decides); the rest keep the Backup's defaults.
    #[test]
    fn claims_left_to_ec2_snapshots_are_skipped_first() {
        let auto: DisruptionPlanSpec =
            serde_json::from_value(json!({"nodes": ["n1"]})).expect("spec");
        let mut local = need();
        local.volumes = vec![PlannedVolume {
            record: crate::api::volume::VolumeRecord {
                pvc: "scratch-pg-0".into(),
                pv: None,
                class: crate::api::volume::VolumeClass::NodeLocal,
                source: Some("local".into()),
                reason: String::new(),
                method: VolumeMethod::FileSystem,
                snapshot_class: None,
                release_at: crate::api::plan::ReleasePoint::Verified,
                snapshot: None,
                size_bytes: None,
                expected_seconds: None,
            },
            auto_method: VolumeMethod::FileSystem,
        }];
        local.skip_drivers = vec!["ebs.csi.aws.com".into()];
        let v = build_velero_backup(&local, &auto, &PLAN, 1);
        assert_eq!(v["spec"]["defaultVolumesToFsBackup"], true);
        assert_eq!(v["spec"]["snapshotVolumes"], false);
        assert_eq!(
            v["spec"]["resourcePolicy"]["name"],
            v["metadata"]["name"].clone()
        );
        let cm = build_volume_policy(&local, &auto, &PLAN, 1).expect("a skip policy");
        assert_eq!(
            cm["data"]["volume-policy.yaml"],
            "version: v1\nvolumePolicies:\n\
             - conditions: {\"csi\":{\"driver\":\"ebs.csi.aws.com\"}}\n  action:\n    type: skip\n\
             - conditions: {\"volumeTypes\":[\"local\"]}\n  action:\n    type: fs-backup\n"
        );
    }

    #[test]
    fn phases() {
        for p in [
            None,
            Some(""),
            Some("New"),
            Some("Queued"),
            Some("ReadyToStart"),
            Some("InProgress"),
            Some("WaitingForPluginOperations"),
            Some("Finalizing"),
        ] {
            assert_eq!(classify_backup_phase(p), BackupProgress::Waiting, "{p:?}");
        }
        assert_eq!(
            classify_backup_phase(Some("Completed")),
            BackupProgress::Completed
        );
        // The two *PartiallyFailed phases can only end PartiallyFailed: failed at once.
        for p in [
            "PartiallyFailed",
            "Failed",
            "FailedValidation",
            "Deleting",
            "Deleted",
            "WaitingForPluginOperationsPartiallyFailed",
            "FinalizingPartiallyFailed",
        ] {
            assert!(
                matches!(classify_backup_phase(Some(p)), BackupProgress::Failed(_)),
                "{p}"
            );
        }
    }

    #[test]
    fn completed_wins_over_a_stale_failure_reason() {
        let s = BackupStatus {
            phase: Some("Completed".into()),
            failure_reason: Some(
                "found a backup with status InProgress during the server starting".into(),
            ),
            ..Default::default()
        };
        assert_eq!(classify_backup("b", Some(&s)), BackupProgress::Completed);
    }

    #[test]
    fn failure_message_carries_velero_reasons() {
        let s = BackupStatus {
            phase: Some("FailedValidation".into()),
            validation_errors: vec!["an existing backup storage location was not specified".into()],
            ..Default::default()
        };
        match classify_backup("b1", Some(&s)) {
            BackupProgress::Failed(m) => {
                assert!(m.starts_with("backup b1: "), "{m}");
                assert!(m.contains("storage location was not specified"), "{m}");
                assert!(m.contains("velero backup logs b1"), "{m}");
            }
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn retries_are_bounded_with_backoff() {
        assert_eq!(
            backup_retry(1, 3, "x"),
            RetryDecision::Retry {
                next_attempt: 2,
                after: Duration::from_secs(30)
            }
        );
        assert_eq!(
            backup_retry(2, 3, "x"),
            RetryDecision::Retry {
                next_attempt: 3,
                after: Duration::from_secs(60)
            }
        );
        match backup_retry(3, 3, "backup b: Failed") {
            RetryDecision::GiveUp { message } => assert!(message.contains("3 of 3"), "{message}"),
            o => panic!("{o:?}"),
        }
        assert!(matches!(
            backup_retry(1, 1, "x"),
            RetryDecision::GiveUp { .. }
        ));
        assert_eq!(
            backup_retry(9, 10, "x"),
            RetryDecision::Retry {
                next_attempt: 10,
                after: MAX_BACKUP_BACKOFF
            }
        );
    }

    #[test]
    fn timeout() {
        let t0 = ts("2026-05-20T10:00:00Z");
        assert!(!backup_timed_out(
            t0,
            ts("2026-05-20T10:09:00Z"),
            Some(Duration::from_secs(600))
        ));
        assert!(backup_timed_out(
            t0,
            ts("2026-05-20T10:11:00Z"),
            Some(Duration::from_secs(600))
        ));
        assert!(!backup_timed_out(t0, ts("2026-05-21T10:11:00Z"), None));
    }

    fn candidate(name: &str, started: &str) -> ReusableBackup {
        ReusableBackup {
            name: name.into(),
            storage_location: "default".into(),
            namespace: "db".into(),
            pvcs: vec!["data-pg-0".into(), "data-pg-1".into()],
            phase: Some("Completed".into()),
            verified: true,
            started_at: Some(ts(started)),
        }
    }

    #[test]
    fn reuse_rule() {
        let spec = Some("default");
        let clock = Clock {
            decided_at: ts("2026-05-20T10:00:00Z"),
            now: ts("2026-05-20T10:30:00Z"),
        };
        let pvcs = vec!["data-pg-0".to_owned()];
        let old = candidate("old", "2026-05-20T09:40:00Z");
        let after = candidate("after", "2026-05-20T10:05:00Z");

        // Started after the decision: counts without a window.
        let both = [old.clone(), after.clone()];
        assert_eq!(
            find_reusable("db", &pvcs, &both, spec, None, clock).map(|c| c.name.as_str()),
            Some("after")
        );
        // Before the decision: only within the window.
        let only_old = [old.clone()];
        assert!(find_reusable("db", &pvcs, &only_old, spec, None, clock).is_none());
        assert!(
            find_reusable(
                "db",
                &pvcs,
                &only_old,
                spec,
                Some(Duration::from_secs(3600)),
                clock
            )
            .is_some()
        );
        assert!(
            find_reusable(
                "db",
                &pvcs,
                &only_old,
                spec,
                Some(Duration::from_secs(1200)),
                clock
            )
            .is_none()
        );

        // Not verified, not Completed, other PVCs, other namespace, other location: never.
        let mut unverified = after.clone();
        unverified.verified = false;
        let mut partial = after.clone();
        partial.phase = Some("PartiallyFailed".into());
        let mut other_pvcs = after.clone();
        other_pvcs.pvcs = vec!["data-pg-1".into()];
        let mut other_ns = after.clone();
        other_ns.namespace = "cache".into();
        let mut other_bsl = after.clone();
        other_bsl.storage_location = "secondary".into();
        for c in [unverified, partial, other_pvcs, other_ns, other_bsl] {
            assert!(
                find_reusable(
                    "db",
                    &pvcs,
                    std::slice::from_ref(&c),
                    spec,
                    Some(Duration::from_secs(86400)),
                    clock
                )
                .is_none(),
                "{c:?}"
            );
        }
    }

    #[test]
    fn reuse_needs_a_known_location() {
        let clock = Clock {
            decided_at: ts("2026-05-20T10:00:00Z"),
            now: ts("2026-05-20T10:30:00Z"),
        };
        let c = [candidate("after", "2026-05-20T10:05:00Z")];
        let pvcs = vec!["data-pg-0".to_owned()];
        // No BSL marked default and none named: nothing can match.
        assert!(find_reusable("db", &pvcs, &c, None, None, clock).is_none());
        assert!(find_reusable("db", &pvcs, &c, Some("aws"), None, clock).is_none());
        // The merged PVC set of two nodes is not covered by one node's backup.
        let merged = vec!["data-pg-0".to_owned(), "data-pg-2".to_owned()];
        assert!(find_reusable("db", &merged, &c, Some("default"), None, clock).is_none());
    }

    fn live(phase: &str, expiration: Option<&str>) -> velero::Backup {
        velero::Backup {
            metadata: ObjectMeta {
                name: Some("b".into()),
                uid: Some("u1".into()),
                ..ObjectMeta::default()
            },
            status: Some(BackupStatus {
                phase: Some(phase.into()),
                expiration: expiration
                    .map(|e| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts(e))),
                ..Default::default()
            }),
            ..velero::Backup::default()
        }
    }

    #[test]
    fn reused_backup_is_checked_in_the_cluster() {
        let now = ts("2026-05-20T10:00:00Z");
        let check = |b: Option<&velero::Backup>, uid: Option<&str>| {
            check_reused_backup("b", uid, b, now, REUSE_EXPIRY_MARGIN)
        };
        let far = live("Completed", Some("2026-05-27T10:00:00Z"));
        assert_eq!(check(Some(&far), Some("u1")), ReuseCheck::Usable);
        // Never expires (no status.expiration): Velero's GC skips it.
        assert_eq!(
            check(Some(&live("Completed", None)), Some("u1")),
            ReuseCheck::Usable
        );
        let unusable =
            |b: Option<&velero::Backup>, uid: Option<&str>, what: &str| match check(b, uid) {
                ReuseCheck::Unusable(m) => assert!(m.contains(what), "{m}"),
                ReuseCheck::Usable => panic!("usable: {b:?}"),
            };
        unusable(None, Some("u1"), "no longer exists");
        unusable(Some(&far), Some("u0"), "re-created");
        unusable(
            Some(&live("Deleting", Some("2026-05-27T10:00:00Z"))),
            None,
            "Deleting",
        );
        // Expired, expiring within the margin, and exactly at the margin: a fresh backup instead.
        unusable(
            Some(&live("Completed", Some("2026-05-20T09:00:00Z"))),
            None,
            "expires",
        );
        unusable(
            Some(&live("Completed", Some("2026-05-20T20:00:00Z"))),
            None,
            "expires",
        );
        unusable(
            Some(&live("Completed", Some("2026-05-21T10:00:00Z"))),
            None,
            "expires",
        );
        let mut deleting = far.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        unusable(Some(&deleting), None, "being deleted");
    }

    #[test]
    fn abandoned_attempts_are_removed_the_way_velero_allows() {
        for p in [
            "InProgress",
            "WaitingForPluginOperations",
            "WaitingForPluginOperationsPartiallyFailed",
            "Finalizing",
            "FinalizingPartiallyFailed",
            "ReadyToStart",
        ] {
            assert_eq!(
                abandon_action(Some(p), Some("aws")),
                AbandonAction::Wait,
                "{p}"
            );
            assert_eq!(abandon_action(Some(p), None), AbandonAction::Wait, "{p}");
        }
        for p in [None, Some("New"), Some("Queued")] {
            assert_eq!(
                abandon_action(p, None),
                AbandonAction::DeleteObject,
                "{p:?}"
            );
            assert_eq!(
                abandon_action(p, Some("")),
                AbandonAction::DeleteObject,
                "{p:?}"
            );
            assert_eq!(
                abandon_action(p, Some("aws")),
                AbandonAction::RequestDeletion,
                "{p:?}"
            );
        }
        for p in ["Failed", "PartiallyFailed", "Completed", "FailedValidation"] {
            assert_eq!(
                abandon_action(Some(p), Some("aws")),
                AbandonAction::RequestDeletion,
                "{p}"
            );
        }
    }

    #[test]
    fn delete_request_object() {
        let v = build_delete_request("drain-n1-db-1-abcd1234", Some("u1"), "velero");
        assert_eq!(v["apiVersion"], "velero.io/v1");
        assert_eq!(v["kind"], "DeleteBackupRequest");
        assert_eq!(v["metadata"]["name"], "drain-n1-db-1-abcd1234-delete");
        assert_eq!(v["metadata"]["namespace"], "velero");
        assert_eq!(
            v["metadata"]["labels"]["velero.io/backup-name"],
            "drain-n1-db-1-abcd1234"
        );
        assert_eq!(v["metadata"]["labels"]["velero.io/backup-uid"], "u1");
        assert_eq!(v["spec"]["backupName"], "drain-n1-db-1-abcd1234");
    }

    #[test]
    fn record_conversion() {
        let record = BackupRecord {
            name: "b".into(),
            namespace: "db".into(),
            pvcs: vec!["p".into()],
            phase: Some("Completed".into()),
            verified: true,
            started_at: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts(
                "2026-05-20T10:05:00Z",
            ))),
            ..Default::default()
        };
        let r = ReusableBackup::from_record(&record, Some("default"));
        assert_eq!(r.started_at, Some(ts("2026-05-20T10:05:00Z")));
        assert_eq!(r.storage_location, "default");
        assert!(r.verified);
        // The location Velero wrote into the Backup wins over the plan's spec.
        let resolved = BackupRecord {
            storage_location: Some("aws".into()),
            ..record
        };
        assert_eq!(
            ReusableBackup::from_record(&resolved, None).storage_location,
            "aws"
        );
    }

    #[test]
    fn a_retry_waits_out_its_backoff_from_the_failed_attempt() {
        let t0 = ts("2026-01-01T00:00:00Z");
        let at = |s: i64| t0 + jiff::SignedDuration::from_secs(s);
        let after = Duration::from_secs(10);
        assert_eq!(retry_wait(t0, at(4), after), Some(Duration::from_secs(6)));
        assert_eq!(retry_wait(t0, at(10), after), None);
        assert_eq!(retry_wait(t0, at(11), after), None);
        // A clock behind the record (another replica) waits the whole backoff, never less.
        assert_eq!(retry_wait(at(5), t0, after), Some(after));
    }
}
