//! The emergency path of a forceful plan: when its deadline leaves Velero no time to copy the node's
//! protected volumes, EC2 `CreateSnapshots` cuts every EBS volume of the instance at one instant (crash-
//! consistent across the instance, EC2 API reference "CreateSnapshots") in seconds, with no Velero.
//!
//! Pure decisions only: whether to take the path ([`decide`]), which volumes it can save and which it
//! cannot ([`EmergencyPlan`]), and how far the snapshots EC2 reports are ([`progress`]). The EC2 calls are
//! in [`crate::cloud::ebs`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::api::plan::BackupScope;
use crate::api::status::BackupRecord;
use crate::api::volume::VolumeClass;

/// The EBS CSI driver's name (kubernetes-sigs/aws-ebs-csi-driver `pkg/driver/driver.go` `DriverName`).
pub const EBS_CSI_DRIVER: &str = "ebs.csi.aws.com";
/// Tag on every emergency snapshot naming the plan's uid: a crash-resumed pass finds them by
/// DescribeSnapshots with a `tag:` filter instead of cutting them twice.
pub const PLAN_UID_TAG: &str = "snapdrain.io/plan-uid";
/// Tag naming the plan, for a person reading the snapshots.
pub const PLAN_NAME_TAG: &str = "snapdrain.io/plan";

/// Whether a plan may take EC2 snapshots instead of waiting for Velero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EmergencyPolicy {
    /// Only when the deadline leaves Velero too little time (the default).
    #[default]
    WhenVeleroCannotFinish,
    /// Always, for a plan with a deadline.
    Always,
    /// Never: Velero or nothing.
    Never,
}

/// One protected volume on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtectedVolume {
    /// `namespace/claim`, for messages.
    pub claim: String,
    pub class: VolumeClass,
    /// CSI driver or in-tree type.
    pub source: Option<String>,
    /// The CSI volume handle: for the EBS driver, the EC2 volume id.
    pub volume_handle: Option<String>,
    pub size_bytes: u64,
}

impl ProtectedVolume {
    /// The EC2 volume id, when this is an EBS CSI volume.
    fn ebs_volume_id(&self) -> Option<&str> {
        if self.class != VolumeClass::Network || self.source.as_deref() != Some(EBS_CSI_DRIVER) {
            return None;
        }
        self.volume_handle
            .as_deref()
            .filter(|h| h.starts_with("vol-"))
    }
}

/// What the plan knows when its backup step starts.
#[derive(Clone, Debug, PartialEq)]
pub struct EmergencyInputs {
    pub policy: EmergencyPolicy,
    /// Time from now to the plan's deadline (None: no deadline, not a forceful plan).
    pub time_left: Option<Duration>,
    /// Velero's copy rate the estimate uses, MiB/s (configured or measured).
    pub velero_mib_per_second: f64,
    /// Velero's fixed cost per backup (queue, tarball, upload).
    pub velero_overhead: Duration,
    /// Time the drain needs after the backup (the pods' stop, before the node goes).
    pub drain_reserve: Duration,
    pub volumes: Vec<ProtectedVolume>,
    /// EC2 volume ids of every EBS CSI volume attached to the node (from its VolumeAttachments): those not
    /// protected are left out of the CreateSnapshots call.
    pub attached_ebs_volumes: Vec<String>,
}

/// The volumes EC2 will snapshot and those it cannot save.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmergencyPlan {
    /// EC2 volume id to claim, for the protected EBS volumes.
    pub snapshot: BTreeMap<String, String>,
    /// `ExcludeDataVolumeId`s: attached EBS volumes no protected pod uses.
    pub exclude: Vec<String>,
    /// Claim and why an EC2 snapshot cannot save it.
    pub cannot_save: Vec<(String, String)>,
}

/// What the backup step does.
#[derive(Clone, Debug, PartialEq)]
pub enum EmergencyDecision {
    /// Velero as usual, with the estimate (None when there is no deadline to compare with).
    Velero { estimate: Duration, reason: String },
    /// EC2 snapshots now, release at the cut.
    EbsSnapshots {
        plan: EmergencyPlan,
        estimate: Duration,
        reason: String,
    },
}

/// The tags of a plan's emergency snapshots: its uid (how a resumed pass finds them), its name, and the
/// cluster's ownership tag the IAM policy asks for in the request (`deploy/iam/snapdrain-policy.json`).
pub fn snapshot_tags(
    plan_name: &str,
    plan_uid: &str,
    cluster_name: Option<&str>,
) -> BTreeMap<String, String> {
    let mut tags = BTreeMap::from([
        (PLAN_UID_TAG.to_string(), plan_uid.to_string()),
        (PLAN_NAME_TAG.to_string(), plan_name.to_string()),
    ]);
    if let Some(c) = cluster_name {
        tags.insert(format!("kubernetes.io/cluster/{c}"), "owned".to_string());
    }
    tags
}

/// Velero's time for these volumes at the configured rate: its overhead plus every byte copied
/// (a file-system backup and the data mover both read the whole volume on a first backup).
pub fn velero_estimate(
    volumes: &[ProtectedVolume],
    mib_per_second: f64,
    overhead: Duration,
) -> Duration {
    let bytes: u64 = volumes.iter().map(|v| v.size_bytes).sum();
    overhead.saturating_add(super::estimate::copy_time(bytes, mib_per_second))
}

fn split(inputs: &EmergencyInputs) -> EmergencyPlan {
    let mut snapshot = BTreeMap::new();
    let mut cannot_save = Vec::new();
    for v in &inputs.volumes {
        match v.ebs_volume_id() {
            Some(id) => {
                snapshot.insert(id.to_string(), v.claim.clone());
            }
            None => {
                let why = match v.class {
                    VolumeClass::NodeLocal | VolumeClass::Unknown => {
                        "a node-local volume dies with the node and EC2 cannot snapshot it; only Velero's file-system backup saves it"
                    }
                    VolumeClass::Network => {
                        "not an EBS CSI volume with a vol- handle, so EC2 CreateSnapshots does not cover it"
                    }
                };
                cannot_save.push((v.claim.clone(), why.to_string()));
            }
        }
    }
    let exclude = inputs
        .attached_ebs_volumes
        .iter()
        .filter(|id| !snapshot.contains_key(*id))
        .cloned()
        .collect();
    EmergencyPlan {
        snapshot,
        exclude,
        cannot_save,
    }
}

/// Decides between Velero and the EC2 snapshots: the snapshots when the plan has a deadline, the node
/// has protected EBS volumes, the policy allows it, and (under the default policy) Velero's estimate plus
/// the drain's reserve does not fit in the time left.
pub fn decide(inputs: &EmergencyInputs) -> EmergencyDecision {
    let estimate = velero_estimate(
        &inputs.volumes,
        inputs.velero_mib_per_second,
        inputs.velero_overhead,
    );
    let velero = |reason: String| EmergencyDecision::Velero { estimate, reason };
    let Some(left) = inputs.time_left else {
        return velero("the plan has no deadline".into());
    };
    if inputs.policy == EmergencyPolicy::Never {
        return velero("the policy never takes EC2 snapshots".into());
    }
    let plan = split(inputs);
    if plan.snapshot.is_empty() {
        return velero("no protected EBS volume on the node".into());
    }
    let needed = estimate + inputs.drain_reserve;
    let reason = match inputs.policy {
        EmergencyPolicy::Always => "the policy asks for EC2 snapshots under a deadline".to_string(),
        _ if needed > left => format!(
            "Velero needs about {}s for {} protected volume(s) plus {}s to drain, but the deadline is {}s away",
            estimate.as_secs(),
            inputs.volumes.len(),
            inputs.drain_reserve.as_secs(),
            left.as_secs()
        ),
        _ => {
            return velero(format!(
                "Velero's estimate ({}s) and the drain ({}s) fit in the {}s left",
                estimate.as_secs(),
                inputs.drain_reserve.as_secs(),
                left.as_secs()
            ));
        }
    };
    EmergencyDecision::EbsSnapshots {
        plan,
        estimate,
        reason,
    }
}

/// Whether `record`'s Backup can leave the EBS claims out by driver: under `backup.scope: Pods` the
/// Backup selects exactly the recorded pods, and Velero sees exactly their claims (the pod action adds
/// them), so a `skip` policy on the EBS CSI driver skips only those; every claim must have a known
/// source, or one could be an EBS volume no snapshot holds.
fn skip_is_exact(record: &BackupRecord, scope: BackupScope) -> bool {
    scope == BackupScope::Pods
        && record.pvcs.iter().all(|c| {
            record
                .volumes
                .iter()
                .any(|v| &v.pvc == c && v.source.is_some())
        })
}

fn is_ebs(record: &BackupRecord, claim: &str) -> bool {
    record
        .volumes
        .iter()
        .any(|v| v.pvc == claim && v.source.as_deref() == Some(EBS_CSI_DRIVER))
}

/// What becomes of a namespace's latest Backup attempt when emergency snapshots are decided after it
/// was created (a deadline that came later in the plan's life: a spot notice for a node already
/// draining).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Supersede {
    /// Velero is copying it already (it cannot be stopped), or no claim of it is in a set: it stays.
    Keep,
    /// Every claim of it is in a set: it is abandoned, and no Velero copy is needed.
    Abandon,
    /// Some claims are in a set: a next attempt without them may replace it (when it can skip them
    /// exactly: [`leave_to_snapshots`] on that attempt decides).
    Replace,
}

/// Whether `record`, created but not yet started by Velero (`New` or `Queued`: it copies nothing yet
/// and holds Velero's queue, `--concurrent-backups`), gives way to the claims the plan's snapshots hold
/// (`saved`: `namespace/claim`). Once `InProgress` a Velero Backup cannot be cancelled, so it is kept.
pub fn supersede(record: &BackupRecord, saved: &BTreeSet<String>) -> Supersede {
    let created = record.uid.is_some() || record.phase.is_some();
    let waiting = matches!(record.phase.as_deref(), None | Some("New") | Some("Queued"));
    if !created || !waiting || record.reused || record.verified || record.abandoned.is_some() {
        return Supersede::Keep;
    }
    let ns = &record.namespace;
    let held = record
        .pvcs
        .iter()
        .filter(|c| saved.contains(&format!("{ns}/{c}")))
        .count();
    match held {
        0 => Supersede::Keep,
        n if n == record.pvcs.len() => Supersede::Abandon,
        _ => Supersede::Replace,
    }
}

/// Takes the claims the plan's EC2 snapshots hold (`saved`: `namespace/claim`) out of `record`, a
/// namespace's Backup not created yet, when its Backup can skip them exactly (only EBS CSI volumes are
/// in a set, and every EBS claim of the record is saved): Velero then copies only what no snapshot holds,
/// which is what may still fit before the deadline, and verification does not ask Velero for them.
/// Returns the claims taken out; none when the Backup exists or a skip by driver would not be exact
/// (Velero then copies them too, as before). A namespace whose every claim is saved gets no Backup at all
/// ([`crate::planning::phase::velero_namespaces`]), so it is left as it is.
pub fn leave_to_snapshots(
    record: &mut BackupRecord,
    saved: &BTreeSet<String>,
    scope: BackupScope,
) -> Vec<String> {
    let created = record.uid.is_some() || record.phase.is_some();
    if created || record.reused || record.verified || !skip_is_exact(record, scope) {
        return Vec::new();
    }
    let ns = record.namespace.clone();
    let held = |c: &String| saved.contains(&format!("{ns}/{c}"));
    let left: Vec<String> = record.pvcs.iter().filter(|c| held(c)).cloned().collect();
    let every_ebs_held = record.pvcs.iter().filter(|c| is_ebs(record, c)).all(held);
    if left.is_empty() || left.len() == record.pvcs.len() || !every_ebs_held {
        return Vec::new();
    }
    if left.iter().any(|c| !is_ebs(record, c)) {
        return Vec::new();
    }
    record.pvcs.retain(|c| !left.contains(c));
    record.volumes.retain(|v| !left.contains(&v.pvc));
    left
}

/// The CSI drivers `record`'s Backup skips: the EBS driver when [`leave_to_snapshots`] took claims of
/// the namespace out of it (a claim the sets hold is not in the record) and the skip is still exact.
pub fn skip_drivers(
    record: &BackupRecord,
    saved: &BTreeSet<String>,
    scope: BackupScope,
) -> Vec<String> {
    let prefix = format!("{}/", record.namespace);
    let taken_out = saved
        .iter()
        .filter_map(|c| c.strip_prefix(&prefix))
        .any(|c| !record.pvcs.iter().any(|p| p == c));
    let ebs_left = record.pvcs.iter().any(|c| is_ebs(record, c));
    if taken_out && !ebs_left && skip_is_exact(record, scope) {
        vec![EBS_CSI_DRIVER.to_string()]
    } else {
        Vec::new()
    }
}

/// A snapshot's state as EC2 reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotState {
    Pending,
    Completed,
    Error(String),
    /// `recoverable`, `recovering` (in aws-sdk-ec2's `SnapshotState`, not described by the EC2 API
    /// reference's "Snapshot" page, which lists `pending | completed | error`) and states this build does
    /// not know: neither saved nor failed, so the plan waits.
    Other(String),
}

/// One snapshot EC2 reported for the plan (CreateSnapshots' answer or DescribeSnapshots by tag).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundSnapshot {
    pub snapshot_id: String,
    pub volume_id: String,
    pub state: SnapshotState,
    /// `NN%`, as EC2 reports it.
    pub progress: Option<String>,
}

/// Where the plan's snapshots are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotProgress {
    /// None of the wanted volumes has a snapshot: cut them (one CreateSnapshots call).
    Create,
    /// Some volumes have none (a call that never answered cut others? EC2 cuts the set at once, so only a
    /// volume attached after the cut): named, to report, never to cut again under the same plan.
    Missing(Vec<String>),
    /// Every volume has a snapshot, some still pending.
    Pending { done: usize, total: usize },
    /// Every volume has a completed snapshot.
    Completed,
    /// A snapshot ended in `error`: (volume, snapshot, message).
    Failed(Vec<(String, String, String)>),
}

/// Judges the snapshots found against the volumes wanted. With more than one snapshot of a volume (a
/// retried call), the completed one counts.
pub fn progress(wanted: &[String], found: &[FoundSnapshot]) -> SnapshotProgress {
    let of = |vol: &str| -> Vec<&FoundSnapshot> {
        found.iter().filter(|s| s.volume_id == vol).collect()
    };
    if wanted.iter().all(|v| of(v).is_empty()) {
        return SnapshotProgress::Create;
    }
    let missing: Vec<String> = wanted
        .iter()
        .filter(|v| of(v).is_empty())
        .cloned()
        .collect();
    if !missing.is_empty() {
        return SnapshotProgress::Missing(missing);
    }
    let mut failed = Vec::new();
    let mut done = 0;
    for v in wanted {
        let snaps = of(v);
        if snaps.iter().any(|s| s.state == SnapshotState::Completed) {
            done += 1;
        } else if snaps
            .iter()
            .all(|s| matches!(s.state, SnapshotState::Error(_)))
        {
            for s in snaps {
                if let SnapshotState::Error(m) = &s.state {
                    failed.push((v.clone(), s.snapshot_id.clone(), m.clone()));
                }
            }
        }
    }
    if !failed.is_empty() {
        return SnapshotProgress::Failed(failed);
    }
    if done == wanted.len() {
        SnapshotProgress::Completed
    } else {
        SnapshotProgress::Pending {
            done,
            total: wanted.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn ebs(claim: &str, vol: &str, gib: u64) -> ProtectedVolume {
        ProtectedVolume {
            claim: claim.into(),
            class: VolumeClass::Network,
            source: Some(EBS_CSI_DRIVER.into()),
            volume_handle: Some(vol.into()),
            size_bytes: gib * GIB,
        }
    }

    fn local(claim: &str) -> ProtectedVolume {
        ProtectedVolume {
            claim: claim.into(),
            class: VolumeClass::NodeLocal,
            source: Some("local".into()),
            volume_handle: None,
            size_bytes: 10 * GIB,
        }
    }

    /// A spot interruption (two minutes) over 500 GiB at 100 MiB/s.
    fn spot(volumes: Vec<ProtectedVolume>) -> EmergencyInputs {
        EmergencyInputs {
            policy: EmergencyPolicy::WhenVeleroCannotFinish,
            time_left: Some(Duration::from_secs(120)),
            velero_mib_per_second: 100.0,
            velero_overhead: Duration::from_secs(5),
            drain_reserve: Duration::from_secs(30),
            volumes,
            attached_ebs_volumes: vec!["vol-a".into(), "vol-b".into(), "vol-other".into()],
        }
    }

    #[test]
    fn the_estimate_is_overhead_plus_bytes_at_the_rate() {
        let v = [ebs("ns/a", "vol-a", 1)];
        assert_eq!(
            velero_estimate(&v, 1024.0, Duration::from_secs(2)),
            Duration::from_secs(3)
        );
        assert_eq!(
            velero_estimate(&v, 0.0, Duration::from_secs(2)),
            Duration::from_secs(2),
            "rate 0: only the overhead"
        );
    }

    #[test]
    fn a_spot_notice_over_500_gib_takes_ec2_snapshots_of_the_ebs_volumes_only() {
        let d = decide(&spot(vec![
            ebs("db/data-0", "vol-a", 300),
            ebs("db/data-1", "vol-b", 200),
            local("cache/scratch"),
        ]));
        let EmergencyDecision::EbsSnapshots {
            plan,
            estimate,
            reason,
        } = d
        else {
            panic!("expected EC2 snapshots, got {d:?}");
        };
        // 510 GiB at 100 MiB/s is 5222 s, plus 5 s overhead.
        assert_eq!(estimate.as_secs(), 5227);
        assert!(reason.contains("120s away"), "{reason}");
        assert_eq!(plan.snapshot.keys().collect::<Vec<_>>(), ["vol-a", "vol-b"]);
        assert_eq!(plan.exclude, ["vol-other"]);
        assert_eq!(plan.cannot_save.len(), 1);
        assert_eq!(plan.cannot_save[0].0, "cache/scratch");
        assert!(plan.cannot_save[0].1.contains("node-local"));
    }

    #[test]
    fn velero_keeps_what_fits_and_plans_without_deadlines_or_ebs() {
        // 1 GiB at 100 MiB/s: 10 s + 5 s + 30 s < 120 s.
        let small = spot(vec![ebs("db/data-0", "vol-a", 1)]);
        assert!(matches!(decide(&small), EmergencyDecision::Velero { .. }));
        // At the edge: needed == left fits.
        let mut edge = spot(vec![ebs("db/data-0", "vol-a", 85)]);
        edge.velero_mib_per_second = 1024.0;
        let EmergencyDecision::Velero { estimate, .. } = decide(&edge) else {
            panic!("85 s + 5 s + 30 s fits in 120 s");
        };
        assert_eq!(estimate, Duration::from_secs(90));
        edge.time_left = Some(Duration::from_secs(119));
        assert!(matches!(
            decide(&edge),
            EmergencyDecision::EbsSnapshots { .. }
        ));

        let mut no_deadline = spot(vec![ebs("db/data-0", "vol-a", 500)]);
        no_deadline.time_left = None;
        assert!(matches!(
            decide(&no_deadline),
            EmergencyDecision::Velero { reason, .. } if reason.contains("no deadline")
        ));
        let only_local = spot(vec![local("cache/scratch")]);
        assert!(matches!(
            decide(&only_local),
            EmergencyDecision::Velero { reason, .. } if reason.contains("no protected EBS")
        ));
        let mut efs = ebs("share/files", "fs-123::fsap-1", 500);
        efs.source = Some("efs.csi.aws.com".into());
        assert!(matches!(
            decide(&spot(vec![efs])),
            EmergencyDecision::Velero { .. }
        ));
    }

    #[test]
    fn the_policy_can_force_or_forbid_the_path() {
        let mut never = spot(vec![ebs("db/data-0", "vol-a", 500)]);
        never.policy = EmergencyPolicy::Never;
        assert!(matches!(decide(&never), EmergencyDecision::Velero { .. }));
        let mut always = spot(vec![ebs("db/data-0", "vol-a", 1)]);
        always.policy = EmergencyPolicy::Always;
        assert!(matches!(
            decide(&always),
            EmergencyDecision::EbsSnapshots { .. }
        ));
        always.time_left = None;
        assert!(
            matches!(decide(&always), EmergencyDecision::Velero { .. }),
            "only plans with a deadline"
        );
    }

    fn volume(pvc: &str, source: Option<&str>) -> crate::api::volume::VolumeRecord {
        crate::api::volume::VolumeRecord {
            pvc: pvc.into(),
            pv: None,
            class: VolumeClass::Network,
            source: source.map(str::to_owned),
            reason: String::new(),
            method: crate::api::volume::VolumeMethod::FileSystem,
            snapshot_class: None,
            release_at: crate::api::plan::ReleasePoint::Verified,
            snapshot: None,
            size_bytes: None,
            expected_seconds: None,
        }
    }

    fn shop() -> BackupRecord {
        BackupRecord {
            name: "b-shop-1".into(),
            namespace: "shop".into(),
            pvcs: vec!["data-ledger-0".into(), "scratch-ledger-0".into()],
            volumes: vec![
                volume("data-ledger-0", Some(EBS_CSI_DRIVER)),
                volume("scratch-ledger-0", Some("local")),
            ],
            attempt: 1,
            ..BackupRecord::default()
        }
    }

    #[test]
    fn a_mixed_namespace_leaves_its_snapshotted_ebs_claims_to_ec2() {
        let saved = BTreeSet::from(["shop/data-ledger-0".to_string(), "db/data-0".to_string()]);
        let mut r = shop();
        assert_eq!(
            leave_to_snapshots(&mut r, &saved, BackupScope::Pods),
            ["data-ledger-0"]
        );
        assert_eq!(r.pvcs, ["scratch-ledger-0"]);
        assert_eq!(r.volumes.len(), 1);
        assert_eq!(
            skip_drivers(&r, &saved, BackupScope::Pods),
            [EBS_CSI_DRIVER]
        );
        // A retry (the record copied) keeps the skip; untouched records skip nothing.
        assert!(skip_drivers(&shop(), &saved, BackupScope::Pods).is_empty());
        assert!(skip_drivers(&r, &BTreeSet::new(), BackupScope::Pods).is_empty());
    }

    #[test]
    fn velero_keeps_ebs_claims_a_skip_by_driver_would_not_fit() {
        let saved = BTreeSet::from(["shop/data-ledger-0".to_string()]);
        // The Backup exists already: it was built without the skip.
        let mut created = shop();
        created.uid = Some("u".into());
        // StatefulSet scope: other replicas' EBS volumes would be skipped too.
        let mut sts = shop();
        // An EBS claim the sets do not hold.
        let mut other_ebs = shop();
        other_ebs.pvcs.push("data-ledger-1".into());
        other_ebs
            .volumes
            .push(volume("data-ledger-1", Some(EBS_CSI_DRIVER)));
        // A claim of unknown kind might be EBS.
        let mut unknown = shop();
        unknown.pvcs.push("odd".into());
        unknown.volumes.push(volume("odd", None));
        for (r, scope) in [
            (&mut created, BackupScope::Pods),
            (&mut sts, BackupScope::StatefulSet),
            (&mut other_ebs, BackupScope::Pods),
            (&mut unknown, BackupScope::Pods),
        ] {
            let before = r.clone();
            assert!(leave_to_snapshots(r, &saved, scope).is_empty(), "{r:?}");
            assert_eq!(*r, before);
            assert!(skip_drivers(r, &saved, scope).is_empty(), "{r:?}");
        }
        // Every claim saved: no Backup at all, the record stays whole.
        let all = BTreeSet::from([
            "shop/data-ledger-0".to_string(),
            "shop/scratch-ledger-0".to_string(),
        ]);
        let mut r = shop();
        assert!(leave_to_snapshots(&mut r, &all, BackupScope::Pods).is_empty());
        assert_eq!(r, shop());
    }

    /// A Backup Velero has not started gives way to the sets decided after it; one Velero copies
    /// already, one not created, reused or verified, or one no set touches, stays.
    #[test]
    fn a_backup_velero_has_not_started_gives_way_to_later_snapshots() {
        let ebs_only = BTreeSet::from(["shop/data-ledger-0".to_string()]);
        let both = BTreeSet::from([
            "shop/data-ledger-0".to_string(),
            "shop/scratch-ledger-0".to_string(),
        ]);
        let created = |phase: Option<&str>| BackupRecord {
            uid: Some("u".into()),
            phase: phase.map(str::to_string),
            ..shop()
        };
        for phase in [None, Some("New"), Some("Queued")] {
            assert_eq!(
                supersede(&created(phase), &both),
                Supersede::Abandon,
                "{phase:?}"
            );
            assert_eq!(
                supersede(&created(phase), &ebs_only),
                Supersede::Replace,
                "{phase:?}"
            );
            assert_eq!(
                supersede(&created(phase), &BTreeSet::new()),
                Supersede::Keep
            );
        }
        for phase in [
            "InProgress",
            "WaitingForPluginOperations",
            "Finalizing",
            "Completed",
            "Failed",
        ] {
            assert_eq!(
                supersede(&created(Some(phase)), &both),
                Supersede::Keep,
                "{phase}"
            );
        }
        let reused = BackupRecord {
            reused: true,
            ..created(Some("Queued"))
        };
        let verified = BackupRecord {
            verified: true,
            ..created(Some("Queued"))
        };
        let abandoned = BackupRecord {
            abandoned: Some(crate::api::status::AbandonedBackup::DeletePending),
            ..created(Some("Queued"))
        };
        for r in [shop(), reused, verified, abandoned] {
            assert_eq!(supersede(&r, &both), Supersede::Keep, "{r:?}");
        }
    }

    #[test]
    fn snapshots_carry_the_plan_and_the_cluster_tag() {
        let t = snapshot_tags("drain-a", "uid-1", Some("prod"));
        assert_eq!(t[PLAN_UID_TAG], "uid-1");
        assert_eq!(t[PLAN_NAME_TAG], "drain-a");
        assert_eq!(t["kubernetes.io/cluster/prod"], "owned");
        assert_eq!(snapshot_tags("drain-a", "uid-1", None).len(), 2);
    }

    fn snap(id: &str, vol: &str, state: SnapshotState) -> FoundSnapshot {
        FoundSnapshot {
            snapshot_id: id.into(),
            volume_id: vol.into(),
            state,
            progress: None,
        }
    }

    #[test]
    fn progress_creates_once_then_waits_for_every_volume() {
        let wanted = vec!["vol-a".to_string(), "vol-b".to_string()];
        assert_eq!(progress(&wanted, &[]), SnapshotProgress::Create);
        let unrelated = [snap("snap-x", "vol-z", SnapshotState::Completed)];
        assert_eq!(progress(&wanted, &unrelated), SnapshotProgress::Create);
        let half = [
            snap("snap-1", "vol-a", SnapshotState::Completed),
            snap("snap-2", "vol-b", SnapshotState::Pending),
        ];
        assert_eq!(
            progress(&wanted, &half),
            SnapshotProgress::Pending { done: 1, total: 2 }
        );
        let all = [
            snap("snap-1", "vol-a", SnapshotState::Completed),
            snap("snap-2", "vol-b", SnapshotState::Completed),
        ];
        assert_eq!(progress(&wanted, &all), SnapshotProgress::Completed);
        let one = [snap("snap-1", "vol-a", SnapshotState::Pending)];
        assert_eq!(
            progress(&wanted, &one),
            SnapshotProgress::Missing(vec!["vol-b".into()])
        );
    }

    #[test]
    fn an_errored_snapshot_fails_unless_another_of_its_volume_completed() {
        let wanted = vec!["vol-a".to_string()];
        let failed = [snap(
            "snap-1",
            "vol-a",
            SnapshotState::Error("broken".into()),
        )];
        assert_eq!(
            progress(&wanted, &failed),
            SnapshotProgress::Failed(vec![("vol-a".into(), "snap-1".into(), "broken".into())])
        );
        let recovered = [
            snap("snap-1", "vol-a", SnapshotState::Error("broken".into())),
            snap("snap-2", "vol-a", SnapshotState::Completed),
        ];
        assert_eq!(progress(&wanted, &recovered), SnapshotProgress::Completed);
        let recovering = [snap(
            "snap-1",
            "vol-a",
            SnapshotState::Other("recovering".into()),
        )];
        assert_eq!(
            progress(&wanted, &recovering),
            SnapshotProgress::Pending { done: 0, total: 1 }
        );
    }
}
