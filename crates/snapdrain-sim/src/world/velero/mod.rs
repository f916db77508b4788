//! Simulated Velero 1.18 server: runs `velero.io/v1` Backups through the 1.18 phase machine
//! (Queued → ReadyToStart → InProgress → Finalizing → Completed, or PartiallyFailed / Failed /
//! FailedValidation), backs up pod volumes through a simulated node-agent (since 1.17 in a hosting pod
//! per PodVolumeBackup: [`hosting`]; the ≤ 1.16 in-agent path is [`DataPath::NodeAgent`]), writes the
//! real bucket layout through aws-sdk-s3, keeps BackupStorageLocation phases current, and restarts when
//! its server pod goes ([`queue`]).
//!
//! Anchored in `research/velero.md`; where this differs from real Velero, the report on the branch says so.

pub mod archive;
pub mod bucket;
pub mod csi;
mod deletion;
mod gc;
pub mod hooks;
pub mod hosting;
mod queue;
mod run;
pub mod schedule;
pub mod scope;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use thiserror::Error;

use super::WorldContext;
use crate::apiserver::errors::ApiError;
use crate::apiserver::resources::ResKey;
use crate::apiserver::store::WriteOptions;

pub use queue::run;

/// `failureReason` Velero writes on backups it finds InProgress when its server starts
/// (`pkg/cmd/server/server.go`, `markInProgressBackupsFailed`).
pub const RESTART_FAILURE: &str =
    "found a backup with status \"InProgress\" during the server starting, mark it as \"Failed\"";

#[derive(Debug, Error)]
pub enum VeleroError {
    #[error("writing {what} through the store failed: {source}")]
    Api {
        what: String,
        #[source]
        source: Box<ApiError>,
    },
    #[error("backup storage location {name:?} is unusable: {message}")]
    Location { name: String, message: String },
    #[error(
        "cannot read the object-store credentials ({0}); the BSL's spec.credential, or the Secret the Velero Deployment mounts at AWS_SHARED_CREDENTIALS_FILE, must hold an AWS INI file with aws_access_key_id and aws_secret_access_key, or the Velero pod needs an IAM role (IRSA)"
    )]
    Credentials(String),
    #[error("error uploading {key} to bucket {bucket}: {message}")]
    Upload {
        bucket: String,
        key: String,
        message: String,
    },
}

/// Where a file-system backup's data moves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DataPath {
    /// Velero 1.17+ (the VGDP micro-service, velero `changelogs/CHANGELOG-1.17.md`): the node-agent
    /// creates one hosting pod per PodVolumeBackup on the source pod's node and the data moves in it
    /// (velero `pkg/exposer/pod_volume.go` `createHostingPod`).
    #[default]
    HostingPod,
    /// Velero ≤ 1.16: the data moves inside the node-agent pod itself.
    NodeAgent,
}

/// How the simulated Velero server is set up (what `velero install` flags would decide).
#[derive(Clone, Debug)]
pub struct VeleroConfig {
    /// Where Velero runs and where Backups, BSLs and PodVolumeBackups live.
    pub namespace: String,
    /// `--concurrent-backups` (Velero's default is 1).
    pub concurrent_backups: usize,
    /// Labels of the node-agent DaemonSet's pods (the install uses `name: node-agent`).
    pub node_agent_labels: BTreeMap<String, String>,
    /// Labels of the Velero server Deployment's pods (`velero install`: `deploy: velero`, velero
    /// `pkg/install/deployment.go`; the Helm chart: `name: velero`). When such a pod ran and goes, the
    /// server stops; the next one to run starts it again ([`RESTART_FAILURE`]). With none ever seen (a
    /// world without the Deployment) the server simply runs.
    pub server_labels: BTreeMap<String, String>,
    /// Where file-system backups move their data.
    pub data_path: DataPath,
    /// `--data-mover-prepare-timeout` of the node-agent (velero `pkg/cmd/cli/nodeagent/server.go`
    /// `defaultDataMoverPrepareTimeout`, 30 min): a hosting pod not running by then fails its PVB.
    pub prepare_timeout: Duration,
    /// How often BSLs are validated (Velero's default is 1m; the sim is faster).
    pub bsl_validation_period: Duration,
    /// `--default-backup-storage-location`: the location of a Backup without `spec.storageLocation`
    /// when no BSL is marked `spec.default: true` (Velero's flag default is `default`).
    pub default_backup_location: String,
    /// `--garbage-collection-frequency`: how often expired Backups are collected (Velero's default is
    /// 1h, velero pkg/controller/gc_controller.go `defaultGCFrequency`; the sim is faster).
    pub gc_frequency: Duration,
}

impl Default for VeleroConfig {
    fn default() -> Self {
        Self {
            namespace: "velero".into(),
            concurrent_backups: 1,
            node_agent_labels: BTreeMap::from([("name".into(), "node-agent".into())]),
            server_labels: BTreeMap::from([("deploy".into(), "velero".into())]),
            data_path: DataPath::default(),
            prepare_timeout: Duration::from_secs(30 * 60),
            bsl_validation_period: Duration::from_secs(1),
            default_backup_location: "default".into(),
            gc_frequency: Duration::from_secs(1),
        }
    }
}

/// Failures a test or scenario can inject; each makes backups fail the way Velero reports it.
#[derive(Clone, Debug, PartialEq)]
pub enum VeleroFault {
    /// The next backup to start fails (phase Failed, `failureReason` = reason).
    FailNextBackup { reason: String },
    /// Every backup fails until the faults are cleared.
    FailAllBackups { reason: String },
    /// The file-system backup of this PVC fails (the backup ends PartiallyFailed).
    FailVolume { namespace: String, pvc: String },
    /// Backup `backup` stays InProgress (its data still moving) until the faults are cleared: a long
    /// backup holding Velero's queue.
    HoldInProgress { backup: String },
    /// Every backup stays in Finalizing / FinalizingPartiallyFailed (slow plugin operations) until the
    /// faults are cleared.
    HoldFinalizing,
    /// The storage never finishes a CSI snapshot (an EBS snapshot stuck in `pending`): its content keeps
    /// `readyToUse: false`, so the data mover waits and the Backup stays in WaitingForPluginOperations.
    SnapshotsNeverReady,
}

/// A CSI snapshot the simulated EBS CSI driver cut for a Velero Backup: the world's own record, for
/// oracles that must not read a plan's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsiCut {
    pub backup: String,
    pub namespace: String,
    pub pvc: String,
    /// The PV's `spec.csi.volumeHandle` (the EBS volume id).
    pub volume_handle: String,
    /// The EBS snapshot id in the content's `status.snapshotHandle`.
    pub snapshot_handle: String,
    /// When the content got its handle: the data's point in time.
    pub cut_at: jiff::Timestamp,
}

/// A volume's data moved into a kopia repository by a Backup (file-system uploader or data mover): the
/// world's own record of what each upload cost, for oracles that must not read a plan's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upload {
    pub backup: String,
    /// The workload namespace (its kopia repository).
    pub namespace: String,
    pub pvc: String,
    pub pv: String,
    /// The volume's size.
    pub size: u64,
    /// What the upload moved: `size` the first time, then the claim's changed bytes.
    pub moved: u64,
}

struct Shared {
    faults: Mutex<Vec<VeleroFault>>,
    cuts: Mutex<Vec<CsiCut>>,
    uploads: Mutex<Vec<Upload>>,
    /// (kopia repository namespace, PV) of every volume whose data was uploaded once.
    uploaded: Mutex<std::collections::HashSet<(String, String)>>,
    restarts: Mutex<Option<tokio::sync::watch::Sender<u64>>>,
    /// Bumped on every fault change, so held backups notice a release.
    fault_changes: tokio::sync::watch::Sender<u64>,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            faults: Mutex::default(),
            cuts: Mutex::default(),
            uploads: Mutex::default(),
            uploaded: Mutex::default(),
            restarts: Mutex::default(),
            fault_changes: tokio::sync::watch::channel(0).0,
        }
    }
}

/// Controls of a running simulated Velero: faults and server restarts.
#[derive(Clone, Default)]
pub struct VeleroHandle {
    shared: Arc<Shared>,
}

impl VeleroHandle {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn inject(&self, fault: VeleroFault) {
        self.faults().push(fault);
        self.shared.fault_changes.send_modify(|n| *n += 1);
    }

    pub fn clear_faults(&self) {
        self.faults().clear();
        self.shared.fault_changes.send_modify(|n| *n += 1);
    }

    /// Waits while `held` says a fault holds the backup.
    async fn wait_released(&self, held: impl Fn(&[VeleroFault]) -> bool) {
        let mut changes = self.shared.fault_changes.subscribe();
        while held(&self.faults()) {
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// Simulates the Velero pod restarting: running backups stop, and the new server marks every
    /// InProgress backup Failed with [`RESTART_FAILURE`].
    pub fn restart(&self) {
        let guard = self
            .shared
            .restarts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = guard.as_ref() {
            tx.send_modify(|n| *n += 1);
        }
    }

    /// Every CSI snapshot cut so far, oldest first.
    pub fn csi_cuts(&self) -> Vec<CsiCut> {
        self.cuts().clone()
    }

    fn record_cuts(&self, backup: &str, work: &[csi::CsiWork], cut_at: jiff::Timestamp) {
        let cut = work.iter().filter(|w| w.error.is_none()).map(|w| CsiCut {
            backup: backup.to_owned(),
            namespace: w.pod_ns.clone(),
            pvc: w.pvc.clone(),
            volume_handle: w.volume_handle.clone(),
            snapshot_handle: w.snapshot_handle.clone(),
            cut_at,
        });
        self.cuts().extend(cut);
    }

    /// The bytes an upload of volume `pv` (of `size` bytes, `changed` of them since the last backup)
    /// into namespace `ns`'s kopia repository moves: all of them the first time, then only what changed
    /// ([`scope::CHANGED_BYTES`]).
    fn to_move(&self, ns: &str, pv: &str, size: u64, changed: Option<u64>) -> u64 {
        let seen = self.uploaded().contains(&(ns.to_owned(), pv.to_owned()));
        if seen && !pv.is_empty() {
            changed.unwrap_or(size).min(size)
        } else {
            size
        }
    }

    fn mark_uploaded(&self, ns: &str, pv: &str) {
        if !pv.is_empty() {
            self.uploaded().insert((ns.to_owned(), pv.to_owned()));
        }
    }

    /// Every volume upload that completed so far, oldest first.
    pub fn uploads(&self) -> Vec<Upload> {
        self.uploads_mut().clone()
    }

    fn record_upload(&self, upload: Upload) {
        self.uploads_mut().push(upload);
    }

    fn uploads_mut(&self) -> std::sync::MutexGuard<'_, Vec<Upload>> {
        // Plain data; a panic elsewhere cannot leave it inconsistent.
        self.shared
            .uploads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn uploaded(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<(String, String)>> {
        // Plain data; a panic elsewhere cannot leave it inconsistent.
        self.shared
            .uploaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn cuts(&self) -> std::sync::MutexGuard<'_, Vec<CsiCut>> {
        // Plain data; a panic elsewhere cannot leave it inconsistent.
        self.shared.cuts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, Vec<VeleroFault>> {
        // The list is plain data; a panic elsewhere cannot leave it inconsistent.
        self.shared.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn restart_signal(&self) -> tokio::sync::watch::Receiver<u64> {
        let mut guard = self
            .shared
            .restarts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        guard
            .get_or_insert_with(|| tokio::sync::watch::channel(0).0)
            .subscribe()
    }

    /// The reason the backup about to start must fail, consuming a one-shot fault.
    fn take_backup_failure(&self) -> Option<String> {
        let mut faults = self.faults();
        if let Some(i) = faults
            .iter()
            .position(|f| matches!(f, VeleroFault::FailNextBackup { .. }))
            && let VeleroFault::FailNextBackup { reason } = faults.remove(i)
        {
            return Some(reason);
        }
        faults.iter().find_map(|f| match f {
            VeleroFault::FailAllBackups { reason } => Some(reason.clone()),
            _ => None,
        })
    }

    fn volume_fails(&self, namespace: &str, pvc: &str) -> bool {
        self.faults().iter().any(|f| {
            matches!(f, VeleroFault::FailVolume { namespace: n, pvc: p } if n == namespace && p == pvc)
        })
    }
}

pub(crate) fn backups_key() -> ResKey {
    ResKey::new("velero.io", "backups")
}

pub(crate) fn bsl_key() -> ResKey {
    ResKey::new("velero.io", "backupstoragelocations")
}

pub(crate) fn dbr_key() -> ResKey {
    ResKey::new("velero.io", "deletebackuprequests")
}

pub(crate) fn schedules_key() -> ResKey {
    ResKey::new("velero.io", "schedules")
}

pub(crate) fn pvb_key() -> ResKey {
    ResKey::new("velero.io", "podvolumebackups")
}

const INTERNAL: WriteOptions = WriteOptions {
    dry_run: false,
    internal: true,
};

/// RFC 3339 in whole seconds, as metav1.Time serializes.
pub(crate) fn rfc3339(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Go `time.Duration` strings as Velero's `ttl` uses them (`720h0m0s`, `30m`, `1h30m`, `90s`).
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut num = String::new();
    let mut chars = s.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            continue;
        }
        let mut unit = c.to_string();
        if c == 'm' && chars.peek() == Some(&'s') {
            unit.push('s');
            chars.next();
        }
        let n: f64 = num.parse().ok()?;
        num.clear();
        total += n * match unit.as_str() {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return None,
        };
        any = true;
    }
    (any && num.is_empty()).then(|| Duration::from_secs_f64(total))
}

/// Edits a Backup's status (and anything else) as the Velero server does: a whole-object write, since
/// the backups CRD has no status subresource.
pub(crate) fn write_backup(
    ctx: &WorldContext,
    ns: &str,
    name: &str,
    f: impl FnOnce(&mut Value),
) -> Result<Arc<Value>, VeleroError> {
    ctx.store
        .modify(&backups_key(), Some(ns), name, None, INTERNAL, |cur| {
            let mut v = cur.clone();
            if !v.get("status").is_some_and(Value::is_object) {
                v["status"] = json!({});
            }
            f(&mut v);
            Ok(v)
        })
        .map_err(|source| VeleroError::Api {
            what: format!("backup {ns}/{name}"),
            source: Box::new(source),
        })
}

/// Records a phase change with what the backup covers.
pub(crate) fn audit_phase(
    ctx: &WorldContext,
    ns: &str,
    name: &str,
    phase: &str,
    pvcs: &[String],
    pods: &[String],
    extra: Value,
) {
    let mut detail = json!({"phase": phase, "pvcs": pvcs, "pods": pods});
    if let (Some(d), Value::Object(extra)) = (detail.as_object_mut(), extra) {
        d.extend(extra);
    }
    ctx.audit
        .world("phase", "backups.velero.io", Some(ns), Some(name), detail);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse() {
        assert_eq!(
            parse_go_duration("720h0m0s"),
            Some(Duration::from_secs(720 * 3600))
        );
        assert_eq!(parse_go_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("10"), None);
        assert_eq!(parse_go_duration("5d"), None);
    }

    #[test]
    fn one_shot_faults_are_consumed_and_standing_ones_stay() {
        let h = VeleroHandle::new();
        h.inject(VeleroFault::FailNextBackup {
            reason: "boom".into(),
        });
        assert_eq!(h.take_backup_failure().as_deref(), Some("boom"));
        assert_eq!(h.take_backup_failure(), None);
        h.inject(VeleroFault::FailAllBackups {
            reason: "down".into(),
        });
        assert_eq!(h.take_backup_failure().as_deref(), Some("down"));
        assert_eq!(h.take_backup_failure().as_deref(), Some("down"));
        h.inject(VeleroFault::FailVolume {
            namespace: "db".into(),
            pvc: "data-pg-0".into(),
        });
        assert!(h.volume_fails("db", "data-pg-0"));
        h.clear_faults();
        assert!(!h.volume_fails("db", "data-pg-0"));
    }

    #[test]
    fn a_volume_moves_in_full_once_then_only_its_changed_bytes_per_repository() {
        let h = VeleroHandle::new();
        let gib = 1u64 << 30;
        assert_eq!(h.to_move("db", "pv-1", 500 * gib, Some(5 * gib)), 500 * gib);
        h.mark_uploaded("db", "pv-1");
        assert_eq!(h.to_move("db", "pv-1", 500 * gib, Some(5 * gib)), 5 * gib);
        // Unknown change: all of it; never more than the volume.
        assert_eq!(h.to_move("db", "pv-1", 500 * gib, None), 500 * gib);
        assert_eq!(h.to_move("db", "pv-1", gib, Some(5 * gib)), gib);
        // Another namespace's repository holds none of it.
        assert_eq!(
            h.to_move("web", "pv-1", 500 * gib, Some(5 * gib)),
            500 * gib
        );
    }
}
