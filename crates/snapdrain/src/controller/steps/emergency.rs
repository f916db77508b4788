//! The emergency path of a plan with a deadline (BackingUp and Verifying): when Velero cannot finish
//! before it ([`crate::planning::ebs_snapshots::decide`]), EC2 `CreateSnapshots` cuts the node's protected
//! EBS volumes at one instant, and in Release mode the pods whose every volume is in the set are released
//! at that cut, loudly (a Warning Event and the `ReleasedAtSnapshot` condition). Velero still backs up
//! the claims EC2 cannot save (node-local volumes); the plan moves on only once every snapshot is
//! `completed` (the phase machine: [`crate::planning::phase::summarize_with_snapshots`]).
//!
//! Intent first: the set (volumes, exclusions) is written before CreateSnapshots is called, and the call
//! finds a set EC2 already holds by the plan's uid tag ([`crate::cloud::ebs::ensure_instance_snapshots`]),
//! so a pass resumed after a crash between the call and the status write never cuts a second set.
//!
//! Upstream behaviour relied on, checked against the pages named:
//! - EC2 API reference, "CreateSnapshots"
//!   (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateSnapshots.html): it "creates
//!   crash-consistent snapshots of multiple EBS volumes attached to an Amazon EC2 instance"; each attached
//!   volume produces "one snapshot that is crash-consistent across the instance", and the root volume or
//!   given data volumes can be left out.
//! - EBS user guide, "Create Amazon EBS snapshots"
//!   (https://docs.aws.amazon.com/ebs/latest/userguide/ebs-creating-snapshot.html): "Snapshot creation is
//!   asynchronous. The snapshot is created immediately, but it remains in the `pending` state until all of
//!   data has been transferred to Amazon S3"; the volume may be used meanwhile "without impacting the
//!   snapshot"; the snapshot "includes only the data that was written to the volume at the time the
//!   snapshot was requested", not data cached by applications or the operating system (crash-consistent,
//!   not application-consistent). So writes after the answer are not in it, and the pods may go.
//! - Snapshot states: the EC2 API reference's "Snapshot" data type lists `pending | completed | error`;
//!   the service model behind aws-sdk-ec2 (`types::SnapshotState`) also has `recoverable` and
//!   `recovering`, which no page found describes: they are neither `completed` nor `error` here, so the
//!   plan keeps waiting on them (bounded by its deadline and timeouts) and never counts them as saved.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::api::Api;

use crate::api::status::{
    AbandonedBackup, EmergencySnapshot, EmergencySnapshotSet, NodeProgress, UnsavedVolume,
    condition,
};
use crate::cloud::ebs::{EnsuredSnapshots, InstanceSnapshotRequest, ensure_instance_snapshots};
use crate::cloud::ec2::CloudError;
use crate::controller::error::ControllerError;
use crate::controller::report::What;
use crate::controller::step::{Io, Outcome, PlanView};
use crate::planning::ebs_snapshots::{
    EmergencyDecision, EmergencyInputs, EmergencyPolicy, FoundSnapshot, PLAN_UID_TAG,
    SnapshotProgress, SnapshotState, Supersede, decide, leave_to_snapshots, progress,
    snapshot_tags, supersede,
};
use crate::planning::ebs_volumes::{BadCapacity, attached_ebs_volumes, protected_volumes};
use crate::planning::inventory::pvc_claims;
use crate::planning::snapshot_window::{LastSnapshot, cut_at, delayed_message};

/// How often pending snapshots are looked at again: EC2 has no watch, and DescribeSnapshots is cheap.
const RECHECK: Duration = Duration::from_secs(2);

/// What the emergency path needs after this call.
#[derive(Debug)]
pub enum After {
    /// Nothing to do (no deadline, policy, or no set), or the sets are completed.
    Nothing,
    /// A set's intent was recorded: write it before calling EC2.
    Checkpoint,
    /// Snapshots pending: look again after this.
    Wait(Duration),
    /// The plan cannot go on: the message names the problem and the fix.
    Fail(String),
}

/// Why the emergency path cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum EmergencyError {
    #[error(
        "node {node}: its EC2 instance id is not known (the Node has no aws:///<zone>/<i-...> providerID), so its EBS volumes cannot be snapshotted; back it up with Velero (spec.backup.emergencySnapshots: Never) or fix the Node's providerID"
    )]
    NoInstance { node: String },
    #[error("{0}; emergency EBS snapshots need each protected PersistentVolume's size")]
    Capacity(#[from] BadCapacity),
    #[error(
        "{source}: snapdrain may not {action}; grant its role {action} as deploy/iam/snapdrain-policy.json does (CreateSnapshots on the cluster's instances and EBS CSI volumes, with the kubernetes.io/cluster/<name> tag in the request; CreateTags on snapshots at creation; DescribeSnapshots), and set --cluster-name so the request carries that tag"
    )]
    Denied { source: CloudError, action: String },
    #[error(
        "{source}: EC2 refused the emergency snapshots and a retry cannot fix it; check the request named above"
    )]
    Refused { source: CloudError },
}

/// EC2's permission errors (EC2 API reference, "Error codes": `UnauthorizedOperation`; IAM's
/// `AccessDenied`).
fn is_denied(e: &CloudError) -> bool {
    matches!(
        e.code(),
        Some("UnauthorizedOperation" | "AccessDenied" | "AccessDeniedException")
    )
}

/// An EC2 error as the step's answer: permanent ones fail the plan with the fix; the rest are retried.
/// A refusal names the operation EC2 refused (a CreateSnapshots pass asks DescribeSnapshots first), else
/// `action`.
fn ec2_failure(e: CloudError, action: &'static str) -> Result<After, ControllerError> {
    if is_denied(&e) {
        let action = match &e {
            CloudError::Api { operation, .. } => format!("ec2:{operation}"),
            _ => action.to_string(),
        };
        return Ok(After::Fail(
            EmergencyError::Denied { source: e, action }.to_string(),
        ));
    }
    if e.is_permanent() {
        return Ok(After::Fail(
            EmergencyError::Refused { source: e }.to_string(),
        ));
    }
    Err(ControllerError::Cloud(e))
}

/// Decides, cuts and follows the plan's emergency sets, and releases the pods they save.
pub async fn advance(
    v: &PlanView<'_>,
    io: &Io<'_>,
    out: &mut Outcome,
) -> Result<After, ControllerError> {
    let Some(deadline) = v.plan.spec.deadline.as_ref().map(|d| d.0) else {
        return Ok(After::Nothing);
    };
    let policy: EmergencyPolicy = v.plan.spec.backup.emergency_snapshots.into();
    if policy != EmergencyPolicy::Never {
        let time_left = deadline.duration_since(v.now).unsigned_abs();
        let time_left = if deadline > v.now {
            time_left
        } else {
            Duration::ZERO
        };
        for node in v.status.nodes.clone() {
            if out
                .status
                .emergency_snapshots
                .iter()
                .any(|s| s.node == node.name)
            {
                continue;
            }
            match decide_node(v, io, &node, policy, time_left).await {
                Ok(Some(set)) => {
                    out.note(
                        What::EmergencySnapshots,
                        format!(
                            "node {}: {}; taking EC2 snapshots of {} protected EBS volume(s) of instance {} in one CreateSnapshots call{}",
                            set.node,
                            set.reason,
                            set.volumes.len(),
                            set.instance_id,
                            unsaved_note(&set)
                        ),
                    );
                    out.status.emergency_snapshots.push(set);
                }
                Ok(None) => {}
                Err(e) => return Ok(After::Fail(e.to_string())),
            }
        }
        if out.status.emergency_snapshots.len() != v.status.emergency_snapshots.len() {
            leave_to_snapshots_in_backups(v, out);
            return Ok(After::Checkpoint);
        }
    }
    let mut wait = None;
    for i in 0..v.status.emergency_snapshots.len() {
        match follow(v, io, out, i, deadline).await? {
            After::Wait(d) => wait = Some(wait.map_or(d, |w: Duration| w.min(d))),
            After::Nothing => {}
            other => return Ok(other),
        }
    }
    release_at_snapshot(v, io, out).await?;
    Ok(wait.map_or(After::Nothing, After::Wait))
}

/// Takes the claims the sets hold out of each namespace's Backup still to be created, so Velero copies
/// only what no snapshot holds (written with the sets' intent, before any such Backup exists). A Backup
/// created before the sets (the deadline came later) that Velero has not started gives way: abandoned
/// (deleted once this is written, [`super::backups`]) when the sets hold all its claims, or replaced by a
/// next attempt without them, so it stops holding Velero's queue with a copy no longer needed.
fn leave_to_snapshots_in_backups(v: &PlanView<'_>, out: &mut Outcome) {
    let saved = saved_claims(&out.status.emergency_snapshots);
    let scope = v.plan.spec.backup.scope;
    for ns in crate::planning::facts::backup_namespaces(&out.status.backups) {
        let Some(i) = super::backups::latest_index(&out.status.backups, &ns) else {
            continue;
        };
        match supersede(&out.status.backups[i], &saved) {
            Supersede::Keep => {}
            Supersede::Abandon => {
                let record = &mut out.status.backups[i];
                record.abandoned = Some(AbandonedBackup::DeletePending);
                record.message = Some(
                    "superseded: the EC2 snapshots hold every claim, so no Velero copy is needed"
                        .into(),
                );
                let text = format!(
                    "Velero Backup {} of namespace {ns} is not needed (the EC2 snapshots hold every claim it copies) and had not started: deleting it",
                    record.name
                );
                out.note(What::EmergencySnapshots, text);
                continue;
            }
            Supersede::Replace => {
                let mut next = super::backups::next_attempt(&out.status.backups[i], v);
                if leave_to_snapshots(&mut next, &saved, scope).is_empty() {
                    continue;
                }
                let old = &mut out.status.backups[i];
                old.abandoned = Some(AbandonedBackup::DeletePending);
                old.message = Some(format!(
                    "superseded by {}, which copies only the claims the EC2 snapshots do not hold",
                    next.name
                ));
                let text = format!(
                    "Velero Backup {} of namespace {ns} had not started: replaced by {}, which copies only {}",
                    old.name,
                    next.name,
                    next.pvcs.join(", ")
                );
                out.note(What::EmergencySnapshots, text);
                out.status.backups.push(next);
                continue;
            }
        }
        let record = &mut out.status.backups[i];
        let left = leave_to_snapshots(record, &saved, scope);
        if !left.is_empty() {
            let text = format!(
                "Velero Backup {} of namespace {ns} skips {} (held by the EC2 snapshots) and copies only {}",
                record.name,
                left.join(", "),
                record.pvcs.join(", ")
            );
            out.note(What::EmergencySnapshots, text);
        }
    }
}

/// Every claim (`namespace/claim`) the plan's emergency sets hold.
pub fn saved_claims(sets: &[EmergencySnapshotSet]) -> BTreeSet<String> {
    sets.iter()
        .flat_map(|s| s.volumes.iter().map(|v| v.claim.clone()))
        .collect()
}

fn unsaved_note(set: &EmergencySnapshotSet) -> String {
    if set.unsaved.is_empty() {
        return String::new();
    }
    let claims: Vec<&str> = set.unsaved.iter().map(|u| u.claim.as_str()).collect();
    format!(
        "; EC2 cannot save {} (node-local): Velero still backs them up",
        claims.join(", ")
    )
}

/// The node's emergency set when the decision takes the path (None: Velero).
async fn decide_node(
    v: &PlanView<'_>,
    io: &Io<'_>,
    node: &NodeProgress,
    policy: EmergencyPolicy,
    time_left: Duration,
) -> Result<Option<EmergencySnapshotSet>, EmergencyError> {
    // The protected pods' claims on this node, per namespace, from the plan's backup records.
    let on_node = super::inventory::pods_on_node(io.caches, &node.name);
    let mut volumes = Vec::new();
    let mut pv_names = BTreeSet::new();
    let mut records_by_ns = Vec::new();
    for record in super::backups::latest_records(&v.status.backups) {
        if record.verified {
            continue;
        }
        let claims: BTreeSet<&str> = on_node
            .iter()
            .filter(|p| {
                p.namespace().as_deref() == Some(record.namespace.as_str())
                    && record.pods.contains(&p.name_any())
            })
            .flat_map(|p| pvc_claims(p).map(str::to_owned).collect::<Vec<_>>())
            .collect::<BTreeSet<String>>()
            .iter()
            .filter_map(|c| record.pvcs.iter().find(|r| *r == c).map(String::as_str))
            .collect();
        let here: Vec<_> = record
            .volumes
            .iter()
            .filter(|r| claims.contains(r.pvc.as_str()))
            .cloned()
            .collect();
        pv_names.extend(here.iter().filter_map(|r| r.pv.clone()));
        records_by_ns.push((record.namespace.clone(), here));
    }
    let attachments: Vec<_> = io
        .caches
        .volume_attachments
        .indexed(&node.name)
        .iter()
        .map(|va| va.to_volume_attachment())
        .collect();
    pv_names.extend(
        attachments
            .iter()
            .filter_map(|va| va.spec.source.persistent_volume_name.clone()),
    );
    let pvs = read_pvs(io, &pv_names).await;
    for (ns, here) in &records_by_ns {
        volumes.extend(protected_volumes(ns, here, &pvs)?);
    }
    if volumes.is_empty() {
        return Ok(None);
    }
    let inputs = EmergencyInputs {
        policy,
        time_left: Some(time_left),
        velero_mib_per_second: io.settings.velero_mib_per_second,
        velero_overhead: io.settings.velero_overhead,
        // The deadline already leaves the pods' grace and a margin (signals: deadline_for).
        drain_reserve: Duration::ZERO,
        volumes,
        attached_ebs_volumes: attached_ebs_volumes(&node.name, &attachments, &pvs),
    };
    let EmergencyDecision::EbsSnapshots {
        plan,
        estimate,
        reason,
    } = decide(&inputs)
    else {
        return Ok(None);
    };
    let instance_id = node
        .instance_id
        .clone()
        .ok_or_else(|| EmergencyError::NoInstance {
            node: node.name.clone(),
        })?;
    Ok(Some(EmergencySnapshotSet {
        node: node.name.clone(),
        instance_id,
        reason,
        velero_estimate_seconds: estimate.as_secs(),
        time_left_seconds: time_left.as_secs(),
        exclude: plan.exclude,
        volumes: plan
            .snapshot
            .into_iter()
            .map(|(volume_id, claim)| EmergencySnapshot {
                claim,
                volume_id,
                ..EmergencySnapshot::default()
            })
            .collect(),
        unsaved: plan
            .cannot_save
            .into_iter()
            .map(|(claim, why)| UnsavedVolume { claim, why })
            .collect(),
        ..EmergencySnapshotSet::default()
    }))
}

/// The PVs by name; one that cannot be read is left out (its claim then has no handle: EC2 cannot
/// save it, and the decision names it).
async fn read_pvs(io: &Io<'_>, names: &BTreeSet<String>) -> BTreeMap<String, PersistentVolume> {
    let api: Api<PersistentVolume> = Api::all(io.client.clone());
    let mut pvs = BTreeMap::new();
    for name in names {
        match api.get_opt(name).await {
            Ok(Some(pv)) => {
                pvs.insert(name.clone(), pv);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(pv = %name, error = %e, "cannot read the PersistentVolume"),
        }
    }
    pvs
}

/// Cuts set `i` (once, found again by tag) or reads it again, and records what EC2 says.
async fn follow(
    v: &PlanView<'_>,
    io: &Io<'_>,
    out: &mut Outcome,
    i: usize,
    deadline: jiff::Timestamp,
) -> Result<After, ControllerError> {
    let written = &v.status.emergency_snapshots[i];
    if written.completed_at.is_some() || written.error.is_some() {
        return Ok(After::Nothing);
    }
    let ec2 = io.cloud.ec2().await?;
    let wanted: Vec<String> = written
        .volumes
        .iter()
        .map(|s| s.volume_id.clone())
        .collect();
    let uid = v.uid();
    let found = if written.accepted() {
        match ec2.snapshots_tagged(PLAN_UID_TAG, &uid).await {
            Ok(mut f) => {
                f.retain(|s| wanted.contains(&s.volume_id));
                f
            }
            Err(e) => return ec2_failure(e, "ec2:DescribeSnapshots"),
        }
    } else {
        let cluster = v
            .status
            .join
            .as_ref()
            .map(|j| j.cluster_name.clone())
            .or_else(|| io.settings.cluster_name.clone());
        let req = InstanceSnapshotRequest {
            instance_id: written.instance_id.clone(),
            exclude: written.exclude.clone(),
            tags: snapshot_tags(&v.name(), &uid, cluster.as_deref()),
            description: format!(
                "snapdrain emergency snapshot: DisruptionPlan {} (node {})",
                v.name(),
                written.node
            ),
        };
        match ensure_instance_snapshots(ec2, &req, &wanted, PLAN_UID_TAG, &uid).await {
            Ok(EnsuredSnapshots::Found { snapshots, created }) => {
                if created {
                    tracing::info!(node = %written.node, instance = %written.instance_id, "cut emergency EBS snapshots");
                }
                snapshots
            }
            Ok(EnsuredSnapshots::TooSoon { newest }) => {
                return Ok(wait_for_window(v, out, i, &newest, deadline));
            }
            Err(e) => return ec2_failure(e, "ec2:CreateSnapshots"),
        }
    };
    let set = &mut out.status.emergency_snapshots[i];
    record_found(set, &found);
    if !written.accepted() && set.accepted() {
        set.accepted_at = Some(Time(v.now));
    }
    Ok(match progress(&wanted, &found) {
        SnapshotProgress::Completed => {
            set.completed_at = Some(Time(v.now));
            let text = format!(
                "node {}: every EC2 snapshot is completed ({})",
                set.node,
                set.volumes
                    .iter()
                    .map(|s| format!(
                        "{} {}",
                        s.claim,
                        s.snapshot_id.as_deref().unwrap_or_default()
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            out.note(What::EmergencySnapshotsCompleted, text);
            After::Nothing
        }
        SnapshotProgress::Pending { .. } => After::Wait(RECHECK),
        SnapshotProgress::Failed(failed) => {
            let text = failed
                .iter()
                .map(|(vol, snap, why)| {
                    format!("snapshot {snap} of volume {vol} ended in error: {why}")
                })
                .collect::<Vec<_>>()
                .join("; ");
            set.error = Some(text);
            After::Nothing
        }
        SnapshotProgress::Create | SnapshotProgress::Missing(_) => {
            let missing: Vec<&str> = set
                .volumes
                .iter()
                .filter(|s| s.snapshot_id.is_none())
                .map(|s| s.volume_id.as_str())
                .collect();
            set.error = Some(format!(
                "EC2 CreateSnapshots of instance {} made no snapshot of volume(s) {} (detached from the instance before the call?); their data is not saved",
                set.instance_id,
                missing.join(", ")
            ));
            After::Nothing
        }
    })
}

/// EC2 refused set `i` for its per-volume rate: records when the set will be cut and says so once per
/// window (a Warning Event naming the volume, the wait and the deadline), then waits exactly that long
/// rather than with the error backoff, which could miss a short deadline by seconds.
fn wait_for_window(
    v: &PlanView<'_>,
    out: &mut Outcome,
    i: usize,
    newest: &[LastSnapshot],
    deadline: jiff::Timestamp,
) -> After {
    let (at, holder) = cut_at(newest, v.now);
    let set = &mut out.status.emergency_snapshots[i];
    if set.cut_not_before.as_ref().map(|t| t.0) != Some(at) {
        set.cut_not_before = Some(Time(at));
        let text = delayed_message(&set.node, holder, at, v.now, deadline);
        out.note(What::EmergencySnapshotsDelayed, text);
    }
    After::Wait(at.duration_since(v.now).unsigned_abs())
}

/// Writes EC2's answer into the set: per volume, its completed snapshot if it has one, else the newest.
fn record_found(set: &mut EmergencySnapshotSet, found: &[FoundSnapshot]) {
    for vol in &mut set.volumes {
        let mine: Vec<&FoundSnapshot> = found
            .iter()
            .filter(|s| s.volume_id == vol.volume_id)
            .collect();
        let best = mine
            .iter()
            .find(|s| s.state == SnapshotState::Completed)
            .or(mine.last());
        if let Some(s) = best {
            vol.snapshot_id = Some(s.snapshot_id.clone());
            vol.state = Some(state_name(&s.state));
            vol.progress = s.progress.clone();
        }
    }
}

fn state_name(s: &SnapshotState) -> String {
    match s {
        SnapshotState::Pending => "pending".into(),
        SnapshotState::Completed => "completed".into(),
        SnapshotState::Error(_) => "error".into(),
        SnapshotState::Other(o) => o.clone(),
    }
}

/// Release mode: releases the holds of the pods on a node with an accepted set whose every claim is in
/// the set (or in a verified backup), and says so loudly. Execute mode drains only once the phase
/// machine moves on (every snapshot completed); its gate lets other drainers through at the cut.
async fn release_at_snapshot(
    v: &PlanView<'_>,
    io: &Io<'_>,
    out: &mut Outcome,
) -> Result<(), ControllerError> {
    if v.plan.spec.mode != crate::api::PlanMode::Release {
        return Ok(());
    }
    let pods = pods_saved_by_snapshots(v, io, &out.status.emergency_snapshots);
    let snapshots: Vec<String> = out
        .status
        .emergency_snapshots
        .iter()
        .flat_map(|s| &s.volumes)
        .filter_map(|s| s.snapshot_id.clone())
        .collect();
    release_loudly(v, io, out, pods, |names| {
        format!(
            "released {names} at EC2 snapshot(s) {} cut under the deadline, NOT at a verified copy in the bucket: the data is the volumes' state at the cut, crash-consistent (what applications still held in memory is not in it: EBS user guide, \"Create Amazon EBS snapshots\"); the plan completes once EC2 reports every snapshot completed",
            snapshots.join(", ")
        )
    })
    .await
}

/// Releases the holds of `pods` not released yet, and says so loudly (the `ReleasedAtSnapshot` condition
/// and Warning Event, with `message` given the pods' names): both releases at a snapshot, EC2's and the
/// CSI driver's, go through here.
pub(super) async fn release_loudly(
    v: &PlanView<'_>,
    io: &Io<'_>,
    out: &mut Outcome,
    pods: BTreeSet<(String, String)>,
    message: impl FnOnce(&str) -> String,
) -> Result<(), ControllerError> {
    let released: BTreeSet<(String, String)> = out
        .status
        .released_pods
        .iter()
        .map(|p| (p.namespace.clone(), p.name.clone()))
        .collect();
    let pods: BTreeSet<(String, String)> =
        pods.into_iter().filter(|p| !released.contains(p)).collect();
    if pods.is_empty() {
        return Ok(());
    }
    let view = PlanView {
        plan: v.plan,
        valid: v.valid,
        status: &out.status,
        now: v.now,
    };
    let (newly, changed) = super::release::release_pods(&view, io, pods).await?;
    if newly.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = newly
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    let message = message(&names.join(", "));
    out.status.released_pods.extend(newly);
    set_condition(out, &message, v.now, v.plan.metadata.generation);
    out.note(What::ReleasedAtSnapshot { pods: changed }, message);
    Ok(())
}

/// Pods (namespace, name) on a node with an accepted set whose every claim is saved: in the set's
/// accepted snapshots, or in a verified backup of its namespace.
fn pods_saved_by_snapshots(
    v: &PlanView<'_>,
    io: &Io<'_>,
    sets: &[EmergencySnapshotSet],
) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for set in sets.iter().filter(|s| s.accepted() && s.error.is_none()) {
        let saved: BTreeSet<&str> = set.saved_claims().collect();
        for pod in super::inventory::pods_on_node(io.caches, &set.node) {
            let ns = pod.namespace().unwrap_or_default();
            let claims: Vec<&str> = pvc_claims(&pod).collect();
            let planned = v
                .status
                .backups
                .iter()
                .any(|b| b.namespace == ns && b.pods.contains(&pod.name_any()));
            let all_saved = !claims.is_empty()
                && claims.iter().all(|c| {
                    saved.contains(format!("{ns}/{c}").as_str())
                        || v.status.backups.iter().any(|b| {
                            b.verified && b.namespace == ns && b.pvcs.iter().any(|p| p == c)
                        })
                });
            if planned && all_saved {
                out.insert((ns, pod.name_any()));
            }
        }
    }
    out
}

pub(super) fn set_condition(
    out: &mut Outcome,
    message: &str,
    now: jiff::Timestamp,
    generation: Option<i64>,
) {
    let new = Condition {
        type_: condition::RELEASED_AT_SNAPSHOT.into(),
        status: "True".into(),
        reason: "ReleasedAtSnapshot".into(),
        message: message.into(),
        last_transition_time: Time(now),
        observed_generation: generation,
    };
    match out
        .status
        .conditions
        .iter_mut()
        .find(|c| c.type_ == new.type_)
    {
        // Later releases (another node's set) update the message; the transition time stays.
        Some(c) => {
            c.message = new.message;
            c.observed_generation = generation;
        }
        None => out.status.conditions.push(new),
    }
}
