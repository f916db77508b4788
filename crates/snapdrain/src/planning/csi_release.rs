//! The release point at the CSI snapshot (`spec.backup.releaseNetworkVolumesAt: Snapshot`): a pod whose
//! every volume is a network volume that Velero snapshots through CSI may go once each snapshot is cut,
//! before the copy in the bucket is verified. Pure; the step that reads the cluster is
//! `controller::steps::csi_release`.
//!
//! "Cut" is what Velero itself waits for before it moves on from a claim: the CSI plugin's PVC action
//! creates the VolumeSnapshot and waits, within `csiSnapshotTimeout`, only until the bound
//! VolumeSnapshotContent has `status.snapshotHandle` (vmware-tanzu/velero
//! `pkg/backup/actions/csi/pvc_action.go` calls `csi.WaitUntilVSCHandleIsReady` in
//! `pkg/util/csi/volume_snapshot.go`), and runs the pod's post-backup hooks after that. The EBS CSI driver
//! answers CreateSnapshot with the EC2 snapshot id as soon as EC2 accepts it, with `ReadyToUse` false while
//! EC2 says `pending` (kubernetes-sigs/aws-ebs-csi-driver `pkg/driver/controller.go` `CreateSnapshot`,
//! `newCreateSnapshotResponse`), and EBS fixes the data at the request: "The snapshot is created
//! immediately, but it remains in the `pending` state until all of data has been transferred to Amazon S3"
//! (EBS user guide, "Create Amazon EBS snapshots"). So the handle and the content's `creationTime` mark the
//! data's point in time; `readyToUse` comes later (EC2 `completed`) and, with the data mover, the upload
//! after it. The plan completes only once the backup is verified in the bucket, as always.
//!
//! Only network volumes qualify: they outlive the node, so a pod that goes at the snapshot leaves its data
//! on a volume that reattaches to the pod's next node. A node-local volume dies with the node; its pod
//! waits for the verified copy whatever the policy says.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::plan::ReleasePoint;
use crate::api::status::BackupRecord;
use crate::api::volume::{CsiSnapshot, VolumeClass, VolumeMethod, VolumeRecord};

/// The label Velero's CSI plugin puts on each VolumeSnapshot it creates for a Backup
/// (velero `pkg/apis/velero/v1/labels_annotations.go` `BackupNameLabel`, set in `createVolumeSnapshot`).
pub const BACKUP_NAME_LABEL: &str = "velero.io/backup-name";

/// Where a volume's pod may go as far as this volume is concerned.
pub fn release_point(asked: ReleasePoint, v: &VolumeRecord) -> ReleasePoint {
    let snapshotted = v.method != VolumeMethod::FileSystem;
    if asked == ReleasePoint::Snapshot && v.class == VolumeClass::Network && snapshotted {
        ReleasePoint::Snapshot
    } else {
        ReleasePoint::Verified
    }
}

/// One VolumeSnapshot as read from the cluster, with its bound content when there is one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenSnapshot {
    pub namespace: String,
    pub name: String,
    /// `metadata.labels["velero.io/backup-name"]`.
    pub backup: Option<String>,
    /// `spec.source.persistentVolumeClaimName`.
    pub pvc: Option<String>,
    /// `status.error.message` of the VolumeSnapshot.
    pub error: Option<String>,
    pub content: Option<SeenContent>,
}

/// The VolumeSnapshotContent a VolumeSnapshot is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenContent {
    pub name: String,
    /// `spec.volumeSnapshotRef` (namespace, name): the content must point back at the snapshot.
    pub bound_to: (String, String),
    pub handle: Option<String>,
    pub creation_time: Option<Time>,
    pub ready: bool,
    pub error: Option<String>,
}

/// Why a seen snapshot does not count as cut for `claim` of `record`; None when it does.
fn not_cut(record: &BackupRecord, claim: &str, s: &SeenSnapshot) -> Option<&'static str> {
    if s.namespace != record.namespace || s.backup.as_deref() != Some(record.name.as_str()) {
        return Some("another backup's snapshot");
    }
    if s.pvc.as_deref() != Some(claim) {
        return Some("another claim's snapshot");
    }
    if s.error.is_some() {
        return Some("the snapshot failed");
    }
    let Some(c) = &s.content else {
        return Some("no content bound yet");
    };
    if c.bound_to != (s.namespace.clone(), s.name.clone()) {
        return Some("the content points at another snapshot");
    }
    if c.error.is_some() {
        return Some("the content failed");
    }
    if c.handle.as_deref().is_none_or(str::is_empty) || c.creation_time.is_none() {
        return Some("not cut yet");
    }
    None
}

/// Writes the cut snapshots among `seen` onto `record`'s volumes that are released at the snapshot and
/// have none recorded yet; a recorded snapshot's readiness follows what is seen. Returns true when the
/// record changed.
pub fn record_cuts(record: &mut BackupRecord, seen: &[SeenSnapshot]) -> bool {
    let before = record.volumes.clone();
    let probe = record.clone();
    for v in record
        .volumes
        .iter_mut()
        .filter(|v| v.release_at == ReleasePoint::Snapshot)
    {
        if let Some(rec) = v.snapshot.as_mut() {
            if let Some(c) = seen
                .iter()
                .filter_map(|s| s.content.as_ref())
                .find(|c| c.name == rec.content)
            {
                rec.ready |= c.ready;
            }
            continue;
        }
        let cut = seen
            .iter()
            .filter(|s| not_cut(&probe, &v.pvc, s).is_none())
            .find_map(|s| Some((s, s.content.as_ref()?)));
        if let Some((s, c)) = cut {
            v.snapshot = Some(CsiSnapshot {
                volume_snapshot: s.name.clone(),
                content: c.name.clone(),
                handle: c.handle.clone().unwrap_or_default(),
                cut_at: c.creation_time.clone(),
                ready: c.ready,
            });
        }
    }
    record.volumes != before
}

/// True when `record` still has a volume to be released at the snapshot that is not cut yet.
pub fn awaiting_cut(record: &BackupRecord) -> bool {
    record
        .volumes
        .iter()
        .any(|v| v.release_at == ReleasePoint::Snapshot && v.snapshot.is_none())
}

/// The claims of `record` saved at their CSI snapshot: released at the snapshot, and cut.
pub fn cut_claims(record: &BackupRecord) -> impl Iterator<Item = &str> {
    record
        .volumes
        .iter()
        .filter(|v| v.release_at == ReleasePoint::Snapshot && v.snapshot.is_some())
        .map(|v| v.pvc.as_str())
}

/// A pod on one of the plan's nodes: namespace, name and its claims.
pub struct PodClaims<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub claims: Vec<&'a str>,
}

/// The pods that may go now: planned in a live attempt (the latest of its namespace, not abandoned), with
/// at least one claim, every claim either cut under a snapshot release or in a verified backup of the
/// namespace, and at least one claim cut (a pod whose claims are all verified is the drain's to release).
pub fn releasable(records: &[BackupRecord], pods: &[PodClaims<'_>]) -> BTreeSet<(String, String)> {
    let latest = |r: &&BackupRecord| {
        !records
            .iter()
            .any(|o| o.namespace == r.namespace && o.attempt > r.attempt)
    };
    let live: Vec<&BackupRecord> = records
        .iter()
        .filter(latest)
        .filter(|r| r.abandoned.is_none())
        .collect();
    let mut out = BTreeSet::new();
    for pod in pods {
        let Some(record) = live
            .iter()
            .find(|r| r.namespace == pod.namespace && r.pods.iter().any(|p| p == pod.name))
        else {
            continue;
        };
        let cut: BTreeSet<&str> = cut_claims(record).collect();
        let verified = |c: &str| {
            records.iter().any(|b| {
                b.verified && b.namespace == pod.namespace && b.pvcs.iter().any(|p| p == c)
            })
        };
        let saved = pod.claims.iter().all(|c| cut.contains(c) || verified(c));
        let any_cut = pod.claims.iter().any(|c| cut.contains(c));
        if !pod.claims.is_empty() && saved && any_cut {
            out.insert((pod.namespace.to_owned(), pod.name.to_owned()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(pvc: &str, class: VolumeClass, method: VolumeMethod) -> VolumeRecord {
        VolumeRecord {
            pvc: pvc.into(),
            pv: Some(format!("pv-{pvc}")),
            class,
            source: Some("ebs.csi.aws.com".into()),
            reason: String::new(),
            method,
            snapshot_class: None,
            release_at: ReleasePoint::Verified,
            snapshot: None,
            size_bytes: None,
            expected_seconds: None,
        }
    }

    fn record(volumes: Vec<VolumeRecord>) -> BackupRecord {
        BackupRecord {
            name: "b-1".into(),
            namespace: "db".into(),
            pvcs: volumes.iter().map(|v| v.pvc.clone()).collect(),
            pods: vec!["pg-0".into(), "pg-1".into()],
            volumes: volumes
                .into_iter()
                .map(|mut v| {
                    v.release_at = release_point(ReleasePoint::Snapshot, &v);
                    v
                })
                .collect(),
            attempt: 1,
            ..BackupRecord::default()
        }
    }

    fn seen(pvc: &str, handle: Option<&str>) -> SeenSnapshot {
        SeenSnapshot {
            namespace: "db".into(),
            name: format!("velero-{pvc}-abcde"),
            backup: Some("b-1".into()),
            pvc: Some(pvc.into()),
            error: None,
            content: Some(SeenContent {
                name: format!("snapcontent-{pvc}"),
                bound_to: ("db".into(), format!("velero-{pvc}-abcde")),
                handle: handle.map(str::to_owned),
                creation_time: handle.map(|_| Time(jiff::Timestamp::UNIX_EPOCH)),
                ready: false,
                error: None,
            }),
        }
    }

    #[test]
    fn only_network_volumes_snapshotted_by_csi_are_released_at_the_snapshot() {
        use ReleasePoint::*;
        let ebs = vol("a", VolumeClass::Network, VolumeMethod::CsiDataMover);
        let local = vol("b", VolumeClass::NodeLocal, VolumeMethod::FileSystem);
        let network_fs = vol("c", VolumeClass::Network, VolumeMethod::FileSystem);
        let unknown = vol("d", VolumeClass::Unknown, VolumeMethod::CsiSnapshot);
        assert_eq!(release_point(Snapshot, &ebs), Snapshot);
        assert_eq!(release_point(Verified, &ebs), Verified);
        for v in [&local, &network_fs, &unknown] {
            assert_eq!(release_point(Snapshot, v), Verified, "{}", v.pvc);
        }
    }

    #[test]
    fn a_snapshot_counts_once_its_content_has_a_handle_and_a_creation_time() {
        let mut r = record(vec![vol(
            "a",
            VolumeClass::Network,
            VolumeMethod::CsiDataMover,
        )]);
        assert!(!record_cuts(&mut r, &[seen("a", None)]), "no handle yet");
        assert!(awaiting_cut(&r));
        assert!(record_cuts(&mut r, &[seen("a", Some("snap-1"))]));
        let s = r.volumes[0].snapshot.as_ref().expect("recorded");
        assert_eq!((s.handle.as_str(), s.ready), ("snap-1", false));
        assert!(!awaiting_cut(&r));
        // Readiness follows; the recorded cut stays once the data mover deletes the snapshot.
        let mut ready = seen("a", Some("snap-1"));
        ready.content.as_mut().unwrap().ready = true;
        assert!(record_cuts(&mut r, &[ready]));
        assert!(r.volumes[0].snapshot.as_ref().unwrap().ready);
        assert!(!record_cuts(&mut r, &[]));
        assert_eq!(cut_claims(&r).collect::<Vec<_>>(), ["a"]);
    }

    #[test]
    fn snapshots_of_other_backups_claims_or_contents_and_failed_ones_do_not_count() {
        let base = || {
            record(vec![vol(
                "a",
                VolumeClass::Network,
                VolumeMethod::CsiDataMover,
            )])
        };
        let mut other_backup = seen("a", Some("snap-1"));
        other_backup.backup = Some("b-2".into());
        let mut other_claim = seen("a", Some("snap-1"));
        other_claim.pvc = Some("z".into());
        let mut other_ns = seen("a", Some("snap-1"));
        other_ns.namespace = "web".into();
        let mut failed = seen("a", Some("snap-1"));
        failed.error = Some("boom".into());
        let mut content_failed = seen("a", Some("snap-1"));
        content_failed.content.as_mut().unwrap().error = Some("boom".into());
        let mut misbound = seen("a", Some("snap-1"));
        misbound.content.as_mut().unwrap().bound_to.1 = "other".into();
        let mut no_time = seen("a", Some("snap-1"));
        no_time.content.as_mut().unwrap().creation_time = None;
        let mut unbound = seen("a", Some("snap-1"));
        unbound.content = None;
        for (why, s) in [
            ("other backup", other_backup),
            ("other claim", other_claim),
            ("other namespace", other_ns),
            ("failed", failed),
            ("content failed", content_failed),
            ("content bound elsewhere", misbound),
            ("no creation time", no_time),
            ("unbound", unbound),
        ] {
            let mut r = base();
            assert!(!record_cuts(&mut r, &[s]), "{why}");
            assert!(r.volumes[0].snapshot.is_none(), "{why}");
        }
    }

    #[test]
    fn a_pod_goes_when_every_claim_is_cut_or_verified_and_never_for_a_node_local_claim() {
        let mut r = record(vec![
            vol("a", VolumeClass::Network, VolumeMethod::CsiDataMover),
            vol("b", VolumeClass::NodeLocal, VolumeMethod::FileSystem),
            vol("c", VolumeClass::Network, VolumeMethod::CsiDataMover),
        ]);
        record_cuts(
            &mut r,
            &[seen("a", Some("snap-1")), seen("b", Some("snap-2"))],
        );
        assert!(
            r.volumes[1].snapshot.is_none(),
            "a node-local claim is never released at a snapshot"
        );
        let pods = [
            PodClaims {
                namespace: "db",
                name: "pg-0",
                claims: vec!["a"],
            },
            PodClaims {
                namespace: "db",
                name: "pg-1",
                claims: vec!["a", "b"],
            },
            PodClaims {
                namespace: "db",
                name: "other",
                claims: vec!["a"],
            },
            PodClaims {
                namespace: "db",
                name: "pg-1",
                claims: vec![],
            },
        ];
        let got = releasable(std::slice::from_ref(&r), &pods);
        assert_eq!(got, BTreeSet::from([("db".into(), "pg-0".into())]));
        // Once the backup is verified, pg-1's node-local claim is saved too.
        let mut done = r.clone();
        done.verified = true;
        let got = releasable(&[done], &pods[..2]);
        assert_eq!(got.len(), 2);
        // An abandoned or superseded attempt's cuts do not count.
        let mut abandoned = r.clone();
        abandoned.abandoned = Some(crate::api::status::AbandonedBackup::DeletePending);
        assert!(releasable(&[abandoned], &pods).is_empty());
        let mut next = r.clone();
        next.attempt = 2;
        next.name = "b-2".into();
        next.volumes.iter_mut().for_each(|v| v.snapshot = None);
        assert!(releasable(&[r, next], &pods).is_empty());
    }

    /// One claim's state for the exhaustive test, as the judge reads it.
    #[derive(Clone, Copy, Debug)]
    struct Claim {
        class: VolumeClass,
        method: VolumeMethod,
        cut: bool,
        verified: bool,
    }

    /// The rule per volume kind, for every mix of two claims: their kind and method, whether each is cut
    /// and verified, what the plan asks, and whether the attempt is live. The judge states DESIGN.md's
    /// rule directly from the descriptors, not through the product's functions: a pod may go at a
    /// snapshot only when each claim is verified, or is a network volume snapshotted through CSI, cut, in
    /// the live attempt of a plan that asked for the release at the snapshot.
    #[test]
    fn the_release_point_holds_per_volume_kind_for_every_mix_of_two_claims() {
        use ReleasePoint::*;
        let classes = [
            VolumeClass::Network,
            VolumeClass::NodeLocal,
            VolumeClass::Unknown,
        ];
        let methods = [
            VolumeMethod::FileSystem,
            VolumeMethod::CsiSnapshot,
            VolumeMethod::CsiDataMover,
        ];
        let mut states = Vec::new();
        for class in classes {
            for method in methods {
                for cut in [false, true] {
                    for verified in [false, true] {
                        states.push(Claim {
                            class,
                            method,
                            cut,
                            verified,
                        });
                    }
                }
            }
        }
        // A pod goes here when every claim is saved and at least one is saved by its cut (a pod whose
        // claims are all verified is released by the drain step, not here).
        let judge = |asked: ReleasePoint, live: bool, claims: &[Claim]| {
            let at_cut = |c: &Claim| {
                asked == Snapshot
                    && live
                    && c.class == VolumeClass::Network
                    && c.method != VolumeMethod::FileSystem
                    && c.cut
            };
            claims.iter().all(|c| c.verified || at_cut(c)) && claims.iter().any(at_cut)
        };
        let mut checked = 0;
        for a in &states {
            for b in &states {
                for asked in [Verified, Snapshot] {
                    for live in [true, false] {
                        let claims = [*a, *b];
                        // Claims "x" and "y" in one attempt; verified claims sit in an earlier verified
                        // backup of the namespace as well (the judge only reads the descriptors).
                        let volumes: Vec<VolumeRecord> = ["x", "y"]
                            .iter()
                            .zip(&claims)
                            .map(|(pvc, c)| {
                                let mut v = vol(pvc, c.class, c.method);
                                v.release_at = release_point(asked, &v);
                                if c.cut {
                                    v.snapshot = Some(CsiSnapshot {
                                        volume_snapshot: format!("vs-{pvc}"),
                                        content: format!("vsc-{pvc}"),
                                        handle: "snap-1".into(),
                                        cut_at: Some(Time(jiff::Timestamp::UNIX_EPOCH)),
                                        ready: false,
                                    });
                                }
                                v
                            })
                            .collect();
                        let mut attempt = BackupRecord {
                            name: "b-2".into(),
                            namespace: "db".into(),
                            pvcs: vec!["x".into(), "y".into()],
                            pods: vec!["pg-0".into()],
                            volumes,
                            attempt: 2,
                            ..BackupRecord::default()
                        };
                        if !live {
                            attempt.abandoned =
                                Some(crate::api::status::AbandonedBackup::DeletePending);
                        }
                        let verified_pvcs: Vec<String> = ["x", "y"]
                            .iter()
                            .zip(&claims)
                            .filter(|(_, c)| c.verified)
                            .map(|(p, _)| p.to_string())
                            .collect();
                        let earlier = BackupRecord {
                            name: "b-1".into(),
                            namespace: "db".into(),
                            pvcs: verified_pvcs,
                            attempt: 1,
                            verified: true,
                            ..BackupRecord::default()
                        };
                        let pod = PodClaims {
                            namespace: "db",
                            name: "pg-0",
                            claims: vec!["x", "y"],
                        };
                        let got = !releasable(&[earlier, attempt], &[pod]).is_empty();
                        let want = judge(asked, live, &claims);
                        assert_eq!(got, want, "asked {asked:?}, live {live}: {claims:?}");
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 36 * 36 * 4);
    }
}
