//! Checks of a Velero backup's objects in the bucket. Pure: the caller GETs/HEADs the keys from
//! [`super::location::backup_keys`] and passes bytes and sizes in; a key that is not there becomes
//! [`VerifyError::Missing`].
//!
//! What passes: `velero-backup.json` has the cluster Backup's uid and phase Completed (the finalizer writes
//! it before patching the CR, so a Completed CR has a Completed copy); the tarball is non-empty; every
//! expected PVC has a `succeeded`, not skipped entry with a snapshot handle in `<name>-volumeinfo.json.gz`;
//! for kopia-based methods the namespace's repository exists. Presence alone proves nothing: a Failed backup
//! can have every file.

use std::io::Read;

use flate2::read::GzDecoder;
use serde::Deserialize;
use thiserror::Error;

use crate::api::plan::BackupMethod;
use crate::api::volume::{VolumeMethod, VolumeRecord};

use super::location::{S3Target, backup_keys, kopia_repository_key};

/// Something wrong with a backup in the bucket. Every variant names the key.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum VerifyError {
    #[error("{key} is missing from the bucket")]
    Missing { key: String },
    #[error("{key} could not be read: {reason}")]
    Unreadable { key: String, reason: String },
    #[error(
        "{key}: bucket has uid {bucket_uid}, cluster Backup has uid {cluster_uid} (a different backup with the same name?)"
    )]
    UidMismatch {
        key: String,
        bucket_uid: String,
        cluster_uid: String,
    },
    #[error("{key}: phase is {phase}, not Completed")]
    WrongPhase { key: String, phase: String },
    #[error("{key} is empty: the backup holds no resources")]
    EmptyTarball { key: String },
    #[error("{key}: {}", join_problems(problems))]
    Volumes {
        key: String,
        problems: Vec<VolumeProblem>,
    },
    #[error(
        "{key} is missing: no kopia repository for this namespace, so the volume data is not in the bucket"
    )]
    KopiaRepositoryMissing { key: String },
}

/// The most snapdrain reads of a JSON object (`velero-backup.json`) or of a compressed object. Velero
/// writes these at a few KiB per resource or volume; anything past the cap is not one of its objects,
/// and reading it whole could exhaust the controller's memory.
pub const MAX_OBJECT_BYTES: u64 = 16 << 20;
/// The most `<backup>-volumeinfo.json.gz` may decompress to.
pub const MAX_VOLUME_INFO_BYTES: u64 = 64 << 20;

impl VerifyError {
    /// For a GET/HEAD that answered 404.
    pub fn missing(key: impl Into<String>) -> Self {
        Self::Missing { key: key.into() }
    }
}

/// One PVC that is not properly backed up.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum VolumeProblem {
    #[error("PVC {namespace}/{pvc} is missing from the volume info")]
    Missing { namespace: String, pvc: String },
    #[error("PVC {namespace}/{pvc} result is {result:?} ({method}), not \"succeeded\"")]
    Failed {
        namespace: String,
        pvc: String,
        result: String,
        method: String,
    },
    #[error("PVC {namespace}/{pvc} was skipped: {reason}")]
    Skipped {
        namespace: String,
        pvc: String,
        reason: String,
    },
    #[error("PVC {namespace}/{pvc} has no snapshot handle ({method})")]
    NoSnapshotHandle {
        namespace: String,
        pvc: String,
        method: String,
    },
    #[error(
        "PVC {namespace}/{pvc} was backed up as {got}, but the plan chose {want}: Velero did not follow the backup's volume policy (Velero 1.14+ reads its snapshot and fs-backup actions)"
    )]
    WrongMethod {
        namespace: String,
        pvc: String,
        want: String,
        got: String,
    },
}

fn join_problems(problems: &[VolumeProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A PVC found backed up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeResult {
    pub namespace: String,
    pub pvc: String,
    pub pv: Option<String>,
    /// `PodVolumeBackup`, `CSISnapshot` or `NativeSnapshot`.
    pub method: String,
    pub snapshot_data_moved: bool,
    pub snapshot_handle: String,
}

/// What the verifier has to fetch for one backup, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectCheck {
    /// GET, then [`check_backup_json`].
    BackupJson(String),
    /// HEAD, then [`check_tarball_size`].
    Tarball(String),
    /// GET, then [`check_volume_info`].
    VolumeInfo(String),
    /// HEAD, then [`check_kopia_repository`].
    KopiaRepository(String),
}

/// The checks for backup `backup_name` covering `namespaces`; `kopia`: whether volume data lands in the
/// namespace's kopia repository ([`kopia_expected`]).
pub fn verification_plan(
    target: &S3Target,
    backup_name: &str,
    kopia: bool,
    namespaces: &[String],
) -> Vec<ObjectCheck> {
    let keys = backup_keys(target, backup_name);
    let mut checks = vec![
        ObjectCheck::BackupJson(keys.metadata),
        ObjectCheck::Tarball(keys.tarball),
        ObjectCheck::VolumeInfo(keys.volume_info),
    ];
    if kopia {
        checks.extend(
            namespaces
                .iter()
                .map(|ns| ObjectCheck::KopiaRepository(kopia_repository_key(target, ns))),
        );
    }
    checks
}

/// File-system backups and the CSI data mover store volume data in a kopia repository per namespace;
/// snapshots stay in the storage system. Under `Auto` it depends on the volumes' methods (a record
/// without volumes, from before they were recorded, was a file-system backup).
pub fn kopia_expected(method: BackupMethod, volumes: &[VolumeRecord]) -> bool {
    match method {
        BackupMethod::FileSystem | BackupMethod::CsiDataMover => true,
        BackupMethod::Snapshot => false,
        BackupMethod::Auto => {
            volumes.is_empty()
                || volumes
                    .iter()
                    .any(|v| v.method != VolumeMethod::CsiSnapshot)
        }
    }
}

#[derive(Deserialize)]
struct BackupJson {
    #[serde(default)]
    metadata: JsonMeta,
    #[serde(default)]
    status: JsonStatus,
}

#[derive(Deserialize, Default)]
struct JsonMeta {
    #[serde(default)]
    uid: Option<String>,
}

#[derive(Deserialize, Default)]
struct JsonStatus {
    #[serde(default)]
    phase: Option<String>,
}

/// `velero-backup.json`: uid equals the cluster Backup's, phase is Completed.
pub fn check_backup_json(key: &str, bytes: &[u8], expected_uid: &str) -> Result<(), VerifyError> {
    let doc: BackupJson = serde_json::from_slice(bytes).map_err(|e| VerifyError::Unreadable {
        key: key.to_owned(),
        reason: format!("not a Backup JSON document: {e}"),
    })?;
    let uid = doc.metadata.uid.unwrap_or_default();
    if uid != expected_uid {
        return Err(VerifyError::UidMismatch {
            key: key.to_owned(),
            bucket_uid: if uid.is_empty() {
                "<none>".to_owned()
            } else {
                uid
            },
            cluster_uid: expected_uid.to_owned(),
        });
    }
    match doc.status.phase.as_deref() {
        Some("Completed") => Ok(()),
        other => Err(VerifyError::WrongPhase {
            key: key.to_owned(),
            phase: other.unwrap_or("<none>").to_owned(),
        }),
    }
}

/// The resource tarball must not be empty.
pub fn check_tarball_size(key: &str, size: u64) -> Result<(), VerifyError> {
    if size == 0 {
        Err(VerifyError::EmptyTarball {
            key: key.to_owned(),
        })
    } else {
        Ok(())
    }
}

/// The namespace's `kopia.repository` blob: `size` from a HEAD, None when it answered 404.
pub fn check_kopia_repository(key: &str, size: Option<u64>) -> Result<(), VerifyError> {
    match size {
        Some(_) => Ok(()),
        None => Err(VerifyError::KopiaRepositoryMissing {
            key: key.to_owned(),
        }),
    }
}

/// One `BackupVolumeInfo` (velero `internal/volume/volumes_information.go`), the fields checked.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct BackupVolumeInfo {
    pvc_name: String,
    pvc_namespace: String,
    pv_name: String,
    backup_method: String,
    snapshot_data_moved: bool,
    skipped: bool,
    skipped_reason: String,
    result: String,
    csi_snapshot_info: Option<Handle>,
    snapshot_data_movement_info: Option<Handle>,
    native_snapshot_info: Option<Handle>,
    pvb_info: Option<Handle>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct Handle {
    snapshot_handle: String,
}

impl BackupVolumeInfo {
    /// The handle that proves data was captured, by method: the kopia snapshot of a PodVolumeBackup or a
    /// data-mover upload, else the storage snapshot.
    fn snapshot_handle(&self) -> &str {
        fn pick(h: &Option<Handle>) -> Option<&str> {
            h.as_ref()
                .map(|h| h.snapshot_handle.as_str())
                .filter(|s| !s.is_empty())
        }
        match self.backup_method.as_str() {
            "PodVolumeBackup" => pick(&self.pvb_info),
            "CSISnapshot" if self.snapshot_data_moved => pick(&self.snapshot_data_movement_info),
            "CSISnapshot" => pick(&self.csi_snapshot_info),
            "NativeSnapshot" => pick(&self.native_snapshot_info),
            _ => None,
        }
        .unwrap_or_default()
    }

    fn problem(&self) -> Option<VolumeProblem> {
        let (namespace, pvc) = (self.pvc_namespace.clone(), self.pvc_name.clone());
        let method = if self.backup_method.is_empty() {
            "no method".to_owned()
        } else {
            self.backup_method.clone()
        };
        if self.skipped {
            let reason = if self.skipped_reason.is_empty() {
                "no reason given".to_owned()
            } else {
                self.skipped_reason.clone()
            };
            return Some(VolumeProblem::Skipped {
                namespace,
                pvc,
                reason,
            });
        }
        if self.result != "succeeded" {
            return Some(VolumeProblem::Failed {
                namespace,
                pvc,
                result: self.result.clone(),
                method,
            });
        }
        if self.snapshot_handle().is_empty() {
            return Some(VolumeProblem::NoSnapshotHandle {
                namespace,
                pvc,
                method,
            });
        }
        None
    }
}

/// Each volume went the way the plan chose (`volumes`, from the plan's status), by the volume info Velero
/// wrote (`results`, from [`check_volume_info`]): a file-system backup as a PodVolumeBackup, a CSI snapshot
/// as `CSISnapshot` (or Velero's native snapshot), and a data-mover volume as a `CSISnapshot` with
/// `snapshotDataMoved`, whose handle is the kopia snapshot of the uploaded data: a snapshot whose data stayed
/// in the storage system is not in the bucket, which the default release point requires.
pub fn check_volume_methods(
    key: &str,
    results: &[VolumeResult],
    volumes: &[VolumeRecord],
) -> Result<(), VerifyError> {
    let problems: Vec<VolumeProblem> = results
        .iter()
        .filter_map(|r| {
            let v = volumes.iter().find(|v| v.pvc == r.pvc)?;
            let ok = match v.method {
                VolumeMethod::FileSystem => r.method == "PodVolumeBackup",
                VolumeMethod::CsiSnapshot => {
                    matches!(r.method.as_str(), "CSISnapshot" | "NativeSnapshot")
                }
                VolumeMethod::CsiDataMover => r.method == "CSISnapshot" && r.snapshot_data_moved,
            };
            let got = if r.snapshot_data_moved {
                format!("{} with its data moved", r.method)
            } else {
                r.method.clone()
            };
            (!ok).then(|| VolumeProblem::WrongMethod {
                namespace: r.namespace.clone(),
                pvc: r.pvc.clone(),
                want: format!("{:?}", v.method),
                got,
            })
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(VerifyError::Volumes {
            key: key.to_owned(),
            problems,
        })
    }
}

/// An object past its cap, as [`VerifyError::Unreadable`] (the verify step counts it as unreadable).
pub fn too_large(key: &str, cap: u64, what: &str) -> VerifyError {
    VerifyError::Unreadable {
        key: key.to_owned(),
        reason: format!(
            "larger than {} MiB{what}, far more than Velero writes; not read further (check who can write to the bucket)",
            cap >> 20
        ),
    }
}

/// `<name>-volumeinfo.json.gz`: every `(namespace, pvc)` in `expected` has a succeeded, not skipped entry
/// with a snapshot handle. Returns the matching entries in `expected` order, or every problem found.
pub fn check_volume_info(
    key: &str,
    gz_bytes: &[u8],
    expected: &[(String, String)],
) -> Result<Vec<VolumeResult>, VerifyError> {
    let unreadable = |reason: String| VerifyError::Unreadable {
        key: key.to_owned(),
        reason,
    };
    let mut json = Vec::new();
    // One more byte than allowed tells a full object from one cut off at the cap (a gzip bomb).
    GzDecoder::new(gz_bytes)
        .take(MAX_VOLUME_INFO_BYTES + 1)
        .read_to_end(&mut json)
        .map_err(|e| unreadable(format!("not gzip: {e}")))?;
    if json.len() as u64 > MAX_VOLUME_INFO_BYTES {
        return Err(too_large(key, MAX_VOLUME_INFO_BYTES, " once decompressed"));
    }
    // Go writes an empty list as `null`.
    let infos: Vec<BackupVolumeInfo> =
        serde_json::from_slice::<Option<Vec<BackupVolumeInfo>>>(&json)
            .map_err(|e| unreadable(format!("not a JSON array of volume infos: {e}")))?
            .unwrap_or_default();

    let mut results = Vec::with_capacity(expected.len());
    let mut problems = Vec::new();
    for (ns, pvc) in expected {
        let entries: Vec<&BackupVolumeInfo> = infos
            .iter()
            .filter(|i| &i.pvc_namespace == ns && &i.pvc_name == pvc)
            .collect();
        // Several entries for one PVC are possible (e.g. a skip record and a PVB); one good one suffices.
        match entries.iter().find(|i| i.problem().is_none()) {
            Some(good) => results.push(VolumeResult {
                namespace: ns.clone(),
                pvc: pvc.clone(),
                pv: Some(good.pv_name.clone()).filter(|p| !p.is_empty()),
                method: good.backup_method.clone(),
                snapshot_data_moved: good.snapshot_data_moved,
                snapshot_handle: good.snapshot_handle().to_owned(),
            }),
            None => problems.push(
                entries
                    .first()
                    .and_then(|e| e.problem())
                    .unwrap_or_else(|| VolumeProblem::Missing {
                        namespace: ns.clone(),
                        pvc: pvc.clone(),
                    }),
            ),
        }
    }
    if problems.is_empty() {
        Ok(results)
    } else {
        Err(VerifyError::Volumes {
            key: key.to_owned(),
            problems,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use serde_json::json;
    use std::io::Write;

    const UID: &str = "5b0f2c9e-7d41-4a8e-9c1b-2f6d3e8a7b10";

    fn gz(v: &serde_json::Value) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), Compression::default());
        enc.write_all(v.to_string().as_bytes()).expect("gzip write");
        enc.finish().expect("gzip finish")
    }

    fn pvb(ns: &str, pvc: &str, result: &str, handle: &str) -> serde_json::Value {
        json!({"pvcName": pvc, "pvcNamespace": ns, "pvName": format!("pv-{pvc}"), "backupMethod": "PodVolumeBackup",
               "snapshotDataMoved": false, "preserveLocalSnapshot": false, "skipped": false, "result": result,
               "pvbInfo": {"snapshotHandle": handle, "size": 1024, "uploaderType": "kopia", "volumeName": "data",
                           "podName": "pg-0", "podNamespace": ns, "nodeName": "n1", "Phase": "Completed"}})
    }

    fn expected(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    #[test]
    fn backup_json_ok_uid_mismatch_and_phase() {
        let doc = json!({"kind": "Backup", "metadata": {"name": "b", "uid": UID}, "status": {"phase": "Completed"}});
        assert_eq!(
            check_backup_json("k", doc.to_string().as_bytes(), UID),
            Ok(())
        );
        let e = check_backup_json(
            "p/backups/b/velero-backup.json",
            doc.to_string().as_bytes(),
            "other-uid",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "p/backups/b/velero-backup.json: bucket has uid {UID}, cluster Backup has uid other-uid (a different backup with the same name?)"
            )
        );
        let fin =
            json!({"metadata": {"uid": UID}, "status": {"phase": "FinalizingPartiallyFailed"}});
        assert!(
            matches!(check_backup_json("k", fin.to_string().as_bytes(), UID), Err(VerifyError::WrongPhase { phase, .. }) if phase == "FinalizingPartiallyFailed")
        );
        assert!(matches!(
            check_backup_json("k", b"<html>", UID),
            Err(VerifyError::Unreadable { .. })
        ));
    }

    #[test]
    fn tarball_and_kopia() {
        assert!(check_tarball_size("k.tar.gz", 4096).is_ok());
        assert_eq!(
            check_tarball_size("k.tar.gz", 0),
            Err(VerifyError::EmptyTarball {
                key: "k.tar.gz".into()
            })
        );
        assert!(check_kopia_repository("kopia/db/kopia.repository", Some(1100)).is_ok());
        let e = check_kopia_repository("kopia/db/kopia.repository", None).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("kopia/db/kopia.repository is missing")
        );
        assert_eq!(
            VerifyError::missing("x").to_string(),
            "x is missing from the bucket"
        );
    }

    #[test]
    fn volume_info_all_succeeded() {
        let data = gz(&json!([
            pvb("db", "data-pg-0", "succeeded", "a1b2c3"),
            pvb("db", "unrelated", "failed", "")
        ]));
        let r = check_volume_info("vi", &data, &expected(&[("db", "data-pg-0")])).expect("ok");
        assert_eq!(r[0].snapshot_handle, "a1b2c3");
        assert_eq!(r[0].method, "PodVolumeBackup");
        assert_eq!(r[0].pv.as_deref(), Some("pv-data-pg-0"));
    }

    #[test]
    fn volume_info_reports_every_problem() {
        let skipped = json!({"pvcName": "data-pg-2", "pvcNamespace": "db", "pvName": "pv2", "snapshotDataMoved": false,
                             "preserveLocalSnapshot": false, "skipped": true, "skippedReason": "opted out by backup.velero.io/backup-volumes-excludes"});
        let data = gz(&json!([
            pvb("db", "data-pg-0", "failed", ""),
            pvb("db", "data-pg-1", "succeeded", ""),
            skipped
        ]));
        let e = check_volume_info(
            "b-volumeinfo.json.gz",
            &data,
            &expected(&[
                ("db", "data-pg-0"),
                ("db", "data-pg-1"),
                ("db", "data-pg-2"),
                ("db", "data-pg-3"),
            ]),
        )
        .unwrap_err();
        let VerifyError::Volumes { key, problems } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(key, "b-volumeinfo.json.gz");
        assert!(
            matches!(&problems[0], VolumeProblem::Failed { pvc, result, .. } if pvc == "data-pg-0" && result == "failed")
        );
        assert!(
            matches!(&problems[1], VolumeProblem::NoSnapshotHandle { pvc, .. } if pvc == "data-pg-1")
        );
        assert!(
            matches!(&problems[2], VolumeProblem::Skipped { reason, .. } if reason.contains("excludes"))
        );
        assert_eq!(
            problems[3],
            VolumeProblem::Missing {
                namespace: "db".into(),
                pvc: "data-pg-3".into()
            }
        );
        assert!(
            e.to_string()
                .contains("PVC db/data-pg-3 is missing from the volume info"),
            "{e}"
        );
    }

    #[test]
    fn each_volume_went_the_way_the_plan_chose() {
        use crate::api::volume::{VolumeClass, VolumeRecord};
        let info = json!([
            {"pvcName": "a", "pvcNamespace": "db", "backupMethod": "CSISnapshot", "snapshotDataMoved": true,
             "result": "succeeded", "snapshotDataMovementInfo": {"snapshotHandle": "k1"}},
            {"pvcName": "b", "pvcNamespace": "db", "backupMethod": "PodVolumeBackup", "result": "succeeded",
             "pvbInfo": {"snapshotHandle": "k2"}},
            {"pvcName": "c", "pvcNamespace": "db", "backupMethod": "CSISnapshot", "snapshotDataMoved": false,
             "result": "succeeded", "csiSnapshotInfo": {"snapshotHandle": "snap-1"}},
        ]);
        let results = check_volume_info(
            "vi",
            &gz(&info),
            &expected(&[("db", "a"), ("db", "b"), ("db", "c")]),
        )
        .expect("all succeeded");
        let rec = |pvc: &str, method| VolumeRecord {
            pvc: pvc.into(),
            pv: None,
            class: VolumeClass::Network,
            source: None,
            reason: String::new(),
            method,
            snapshot_class: None,
            release_at: crate::api::plan::ReleasePoint::Verified,
            snapshot: None,
            size_bytes: None,
            expected_seconds: None,
        };
        let planned = [
            rec("a", VolumeMethod::CsiDataMover),
            rec("b", VolumeMethod::FileSystem),
            rec("c", VolumeMethod::CsiSnapshot),
        ];
        assert_eq!(check_volume_methods("vi", &results, &planned), Ok(()));
        // A data-mover volume whose data stayed in EBS, and a copy that came back as a snapshot: both named.
        let wrong = [
            rec("a", VolumeMethod::FileSystem),
            rec("b", VolumeMethod::CsiSnapshot),
            rec("c", VolumeMethod::CsiDataMover),
        ];
        match check_volume_methods("vi", &results, &wrong) {
            Err(VerifyError::Volumes { problems, .. }) => {
                assert_eq!(problems.len(), 3, "{problems:?}");
                let text = problems[2].to_string();
                assert!(
                    text.contains("db/c") && text.contains("CsiDataMover"),
                    "{text}"
                );
            }
            other => panic!("{other:?}"),
        }
        // Records from before volumes were recorded check nothing more.
        assert_eq!(check_volume_methods("vi", &results, &[]), Ok(()));
    }

    #[test]
    fn handles_by_method() {
        let moved = json!({"pvcName": "a", "pvcNamespace": "db", "backupMethod": "CSISnapshot", "snapshotDataMoved": true,
                           "skipped": false, "result": "succeeded",
                           "csiSnapshotInfo": {"snapshotHandle": "snap-local", "size": 1, "driver": "ebs.csi.aws.com", "vscName": "x", "ReadyToUse": true},
                           "snapshotDataMovementInfo": {"dataMover": "velero", "uploaderType": "kopia", "snapshotHandle": "kopia-snap", "operationID": "op", "size": 1, "Phase": "Completed"}});
        let native = json!({"pvcName": "b", "pvcNamespace": "db", "backupMethod": "NativeSnapshot", "snapshotDataMoved": false,
                            "skipped": false, "result": "succeeded",
                            "nativeSnapshotInfo": {"snapshotHandle": "snap-0123", "volumeType": "gp3", "volumeAZ": "eu-west-1a", "iops": "3000", "Phase": "Completed"}});
        let csi = json!({"pvcName": "c", "pvcNamespace": "db", "backupMethod": "CSISnapshot", "snapshotDataMoved": false,
                         "skipped": false, "result": "succeeded", "csiSnapshotInfo": {"snapshotHandle": "snap-csi"}});
        let r = check_volume_info(
            "vi",
            &gz(&json!([moved, native, csi])),
            &expected(&[("db", "a"), ("db", "b"), ("db", "c")]),
        )
        .expect("ok");
        let handles: Vec<_> = r.iter().map(|v| v.snapshot_handle.as_str()).collect();
        assert_eq!(handles, ["kopia-snap", "snap-0123", "snap-csi"]);
        assert!(r[0].snapshot_data_moved);
    }

    #[test]
    fn a_gzip_bomb_stops_at_the_cap() {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..=(MAX_VOLUME_INFO_BYTES >> 20) {
            enc.write_all(&zeros).expect("compress");
        }
        let bomb = enc.finish().expect("gzip");
        assert!(
            (bomb.len() as u64) < MAX_VOLUME_INFO_BYTES / 100,
            "{}",
            bomb.len()
        );
        let e = check_volume_info("b-volumeinfo.json.gz", &bomb, &expected(&[("db", "data")]))
            .expect_err("too large");
        assert!(
            e.to_string()
                .contains("larger than 64 MiB once decompressed"),
            "{e}"
        );
    }

    #[test]
    fn unreadable_volume_info() {
        assert!(
            matches!(check_volume_info("vi", b"plain", &[]), Err(VerifyError::Unreadable { reason, .. }) if reason.starts_with("not gzip"))
        );
        assert!(matches!(
            check_volume_info("vi", &gz(&json!({"a": 1})), &[]),
            Err(VerifyError::Unreadable { .. })
        ));
        let none =
            check_volume_info("vi", &gz(&json!(null)), &expected(&[("db", "x")])).unwrap_err();
        assert!(
            matches!(none, VerifyError::Volumes { .. }),
            "null list means nothing was backed up"
        );
    }

    #[test]
    fn plan_of_checks() {
        let t = S3Target {
            endpoint: None,
            bucket: "velero".into(),
            prefix: "c".into(),
            region: Some("us-east-1".into()),
            path_style: false,
            ca_cert: None,
            insecure_skip_tls_verify: false,
            credentials: crate::backup::location::TargetCredentials::Ambient,
            sse_customer_key: None,
        };
        let ns = vec!["db".to_owned()];
        let fs = verification_plan(&t, "b1", kopia_expected(BackupMethod::FileSystem, &[]), &ns);
        assert_eq!(fs.len(), 4);
        assert_eq!(
            fs[3],
            ObjectCheck::KopiaRepository("c/kopia/db/kopia.repository".into())
        );
        assert_eq!(
            fs[0],
            ObjectCheck::BackupJson("c/backups/b1/velero-backup.json".into())
        );
        assert_eq!(
            verification_plan(&t, "b1", kopia_expected(BackupMethod::Snapshot, &[]), &ns).len(),
            3
        );
        assert!(kopia_expected(BackupMethod::CsiDataMover, &[]));
        assert!(kopia_expected(BackupMethod::Auto, &[]));
    }
}
