//! Velero's CSI snapshots and data mover for the volumes a Backup's volume policy sends to `snapshot`, with
//! the snapshot controller and the EBS CSI driver around them:
//! - the volume policy: a ConfigMap with exactly one data key, `version: v1`, the first policy whose conditions
//!   all match decides (velero `internal/resourcepolicies/resource_policies.go` `getResourcePoliciesFromConfig`,
//!   `Policies.match`; conditions `csi.driver` and `volumeTypes`);
//! - the PVC action makes a VolumeSnapshot with the class Velero picks for the driver (the one labelled
//!   `velero.io/csi-volumesnapshot-class`, else the default-annotated one, else the only one: velero
//!   `pkg/util/csi/volume_snapshot.go` `GetVolumeSnapshotClassForStorageClass`) and waits, within
//!   `csiSnapshotTimeout`, only for the content's snapshot handle (`pkg/backup/actions/csi/pvc_action.go`);
//! - the snapshot controller binds a VolumeSnapshotContent; the EBS CSI driver answers CreateSnapshot at once
//!   with the EC2 snapshot id (kubernetes-sigs/aws-ebs-csi-driver `pkg/driver/controller.go` `CreateSnapshot`
//!   returns `ReadyToUse: false` while EC2 says `pending`), and `readyToUse` turns true once EC2 says
//!   `completed` (here after the backup overhead; [`super::VeleroFault::SnapshotsNeverReady`] keeps it pending);
//! - with `snapshotMoveData`, a DataUpload (velero.io/v2alpha1) per volume: the data mover waits for the
//!   snapshot to be ready (velero `pkg/exposer/csi_snapshot.go` `WaitVolumeSnapshotReady`), then uploads
//!   through kopia into `kopia/<namespace>/`: New → Accepted → Prepared → InProgress → Completed
//!   (`pkg/apis/velero/v2alpha1/data_upload_types.go`).
//!
//! Where this differs from Velero: the backup's bucket files are written once the asynchronous operations are
//! done (Velero writes them at the end of InProgress and the finalizer rewrites them), and the EC2 snapshot is
//! the simulator's own (the EC2 endpoint serves CreateSnapshot, but the CSI driver's snapshots here do not
//! go through it yet).

use std::time::Duration;

use serde_json::{Value, json};

use super::archive::gzip;
use super::bucket::Bucket;
use super::{INTERNAL, VeleroConfig, VeleroFault, VeleroHandle, rfc3339};
use crate::apiserver::meta::meta_str;
use crate::apiserver::resources::ResKey;
use crate::world::WorldContext;

const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";
/// velero `pkg/apis/velero/v1/labels_annotations.go` `VolumeSnapshotClassSelectorLabel`.
const VELERO_CLASS_LABEL: &str = "velero.io/csi-volumesnapshot-class";
const DEFAULT_CLASS_ANNOTATION: &str = "snapshot.storage.kubernetes.io/is-default-class";

fn vs_key() -> ResKey {
    ResKey::new(SNAPSHOT_GROUP, "volumesnapshots")
}

fn vsc_key() -> ResKey {
    ResKey::new(SNAPSHOT_GROUP, "volumesnapshotcontents")
}

fn class_key() -> ResKey {
    ResKey::new(SNAPSHOT_GROUP, "volumesnapshotclasses")
}

fn du_key() -> ResKey {
    ResKey::new("velero.io", "datauploads")
}

/// A Backup's volume policies, in order.
#[derive(Clone, Debug, Default)]
pub struct VolumePolicies(Vec<(Value, String)>);

impl VolumePolicies {
    /// Reads `spec.resourcePolicy` (a ConfigMap in Velero's namespace). None when the Backup names none; an
    /// error in Velero's words when it cannot be used (the Backup then fails validation).
    pub fn load(ctx: &WorldContext, velero_ns: &str, spec: &Value) -> Result<Option<Self>, String> {
        let Some(name) = spec.pointer("/resourcePolicy/name").and_then(Value::as_str) else {
            return Ok(None);
        };
        let Some(cm) = ctx
            .store
            .get(&ResKey::core("configmaps"), Some(velero_ns), name)
        else {
            return Err(format!(
                "fail to get ResourcePolicies {velero_ns}/{name} ConfigMap with error configmaps \"{name}\" not found"
            ));
        };
        let data = cm.get("data").and_then(Value::as_object);
        let Some(text) = data
            .filter(|d| d.len() == 1)
            .and_then(|d| d.values().next())
            .and_then(Value::as_str)
        else {
            return Err(format!(
                "fail to read the ResourcePolicies from ConfigMap {velero_ns}/{name} with error illegal resource policies {velero_ns}/{name} configmap"
            ));
        };
        let doc: Value = serde_saphyr::from_str(text).map_err(|e| {
            format!(
                "fail to read the ResourcePolicies from ConfigMap {velero_ns}/{name} with error {e}"
            )
        })?;
        if doc.get("version").and_then(Value::as_str) != Some("v1") {
            return Err(format!(
                "fail to validate ResourcePolicies in ConfigMap {velero_ns}/{name} with error incompatible version number"
            ));
        }
        let policies = doc
            .get("volumePolicies")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|p| {
                        (
                            p.get("conditions").cloned().unwrap_or(json!({})),
                            p.pointer("/action/type")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Some(Self(policies)))
    }

    /// The action of the first policy whose conditions all match `pv`.
    pub fn action(&self, pv: &Value) -> Option<&str> {
        let driver = pv.pointer("/spec/csi/driver").and_then(Value::as_str);
        let kind = volume_type(pv);
        self.0
            .iter()
            .find(|(c, _)| {
                let csi_ok = c
                    .pointer("/csi/driver")
                    .and_then(Value::as_str)
                    .is_none_or(|d| Some(d) == driver)
                    && (c.get("csi").is_none() || driver.is_some());
                let types_ok = c
                    .get("volumeTypes")
                    .and_then(Value::as_array)
                    .is_none_or(|t| t.iter().any(|t| t.as_str() == Some(kind)));
                csi_ok && types_ok
            })
            .map(|(_, a)| a.as_str())
    }
}

/// The volume type Velero's policies match (`volume_resources.go`): the PV's source field.
fn volume_type(pv: &Value) -> &'static str {
    let spec = pv.get("spec");
    for (field, name) in [
        ("csi", "csi"),
        ("local", "local"),
        ("hostPath", "hostPath"),
        ("nfs", "nfs"),
        ("awsElasticBlockStore", "awsElasticBlockStore"),
    ] {
        if spec.and_then(|s| s.get(field)).is_some() {
            return name;
        }
    }
    ""
}

/// One volume to snapshot.
#[derive(Clone, Debug, Default)]
pub struct CsiWork {
    pub pod_ns: String,
    pub pod_name: String,
    pub volume: String,
    pub pvc: String,
    pub pv: String,
    pub driver: String,
    pub volume_handle: String,
    pub bytes: u64,
    /// The claim's [`super::scope::CHANGED_BYTES`].
    pub changed: Option<u64>,
    pub class: Option<String>,
    pub vs_name: String,
    pub vsc_name: String,
    /// The EC2 snapshot id.
    pub snapshot_handle: String,
    /// The kopia snapshot id of the moved data.
    pub moved_id: String,
    pub data_upload: Option<String>,
    pub error: Option<String>,
    pub started: String,
    pub completed: Option<String>,
}

impl CsiWork {
    pub fn new(pod: &Value, volume: &str, pvc: &Value, pv: &Value) -> Self {
        let s = |v: &Value, p: &str| {
            v.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        Self {
            pod_ns: meta_str(pod, "namespace").unwrap_or("").into(),
            pod_name: meta_str(pod, "name").unwrap_or("").into(),
            volume: volume.into(),
            pvc: meta_str(pvc, "name").unwrap_or("").into(),
            pv: meta_str(pv, "name").unwrap_or("").into(),
            driver: s(pv, "/spec/csi/driver"),
            volume_handle: s(pv, "/spec/csi/volumeHandle"),
            bytes: super::scope::pvc_bytes(pvc),
            changed: super::scope::changed_bytes(pvc),
            ..Self::default()
        }
    }
}

/// The class Velero uses for `driver`.
fn class_for(ctx: &WorldContext, driver: &str) -> Option<String> {
    let page = ctx.store.list(&class_key(), None, &|_| true, None, None);
    let of_driver: Vec<_> = page
        .items
        .iter()
        .filter(|c| c.get("driver").and_then(Value::as_str) == Some(driver))
        .collect();
    let name = |c: &Value| meta_str(c, "name").map(str::to_owned);
    of_driver
        .iter()
        .find(|c| super::scope::labels_of(c).contains_key(VELERO_CLASS_LABEL))
        .or_else(|| {
            of_driver.iter().find(|c| {
                c.pointer("/metadata/annotations")
                    .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                    .and_then(Value::as_str)
                    == Some("true")
            })
        })
        .or_else(|| (of_driver.len() == 1).then(|| &of_driver[0]))
        .and_then(|c| name(c))
}

fn random_hex(n: usize) -> String {
    let mut s = String::new();
    while s.len() < n {
        s.push_str(&uuid::Uuid::new_v4().simple().to_string());
    }
    s.truncate(n);
    s
}

/// The PVC action: a VolumeSnapshot per volume, its content bound with the EBS snapshot id at once.
pub fn take_snapshots(ctx: &WorldContext, backup: &str, backup_uid: &str, work: &mut [CsiWork]) {
    for w in work.iter_mut() {
        w.started = rfc3339(jiff::Timestamp::now());
        let Some(class) = class_for(ctx, &w.driver) else {
            w.error = Some(format!(
                "failed to get VolumeSnapshotClass for provisioner {}, ensure that the desired VolumeSnapshot class has the velero.io/csi-volumesnapshot-class label",
                w.driver
            ));
            continue;
        };
        w.class = Some(class.clone());
        w.vs_name = format!("velero-{}-{}", w.pvc, random_hex(5));
        let labels = json!({"velero.io/backup-name": backup, "velero.io/backup-uid": backup_uid});
        let vs = json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": w.vs_name, "namespace": w.pod_ns, "labels": labels},
            "spec": {"source": {"persistentVolumeClaimName": w.pvc}, "volumeSnapshotClassName": class},
        });
        let Ok(created) = ctx.store.create(&vs_key(), Some(&w.pod_ns), vs, INTERNAL) else {
            w.error = Some(format!("error creating VolumeSnapshot for PVC {}", w.pvc));
            continue;
        };
        let vs_uid = meta_str(&created, "uid").unwrap_or("").to_owned();
        // The EBS CSI driver's CreateSnapshot: EC2 returns the id at once, state pending.
        w.snapshot_handle = format!("snap-{}", random_hex(17));
        w.vsc_name = format!("snapcontent-{vs_uid}");
        let now = jiff::Timestamp::now();
        let vsc = json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
            "metadata": {"name": w.vsc_name},
            "spec": {
                "deletionPolicy": "Delete", "driver": w.driver, "volumeSnapshotClassName": class,
                "source": {"volumeHandle": w.volume_handle},
                "volumeSnapshotRef": {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                                      "name": w.vs_name, "namespace": w.pod_ns, "uid": vs_uid},
            },
            "status": {"snapshotHandle": w.snapshot_handle, "readyToUse": false,
                       "creationTime": now.as_nanosecond() as i64, "restoreSize": w.bytes},
        });
        let _ = ctx.store.create(&vsc_key(), None, vsc, INTERNAL);
        set_vs_status(ctx, w, false);
    }
}

fn set_vs_status(ctx: &WorldContext, w: &CsiWork, ready: bool) {
    let _ = ctx.store.modify(
        &vs_key(),
        Some(&w.pod_ns),
        &w.vs_name,
        None,
        INTERNAL,
        |cur| {
            let mut v = cur.clone();
            v["status"] = json!({"boundVolumeSnapshotContentName": w.vsc_name, "readyToUse": ready,
                                 "restoreSize": format!("{}", w.bytes)});
            Ok(v)
        },
    );
}

fn set_ready(ctx: &WorldContext, w: &CsiWork) {
    let _ = ctx
        .store
        .modify(&vsc_key(), None, &w.vsc_name, None, INTERNAL, |cur| {
            let mut v = cur.clone();
            v["status"]["readyToUse"] = json!(true);
            Ok(v)
        });
    set_vs_status(ctx, w, true);
}

/// The Backup the snapshots belong to and where their data goes.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub backup: &'a str,
    pub backup_uid: &'a str,
    /// The BackupStorageLocation's name.
    pub location: &'a str,
    pub bucket: &'a Bucket,
    /// `spec.snapshotMoveData`.
    pub move_data: bool,
}

/// The asynchronous part: each snapshot becomes ready when EC2 completes it; with `move_data` a DataUpload
/// per volume then moves its data into the bucket's kopia repository.
pub async fn complete(
    ctx: &WorldContext,
    config: &VeleroConfig,
    handle: &VeleroHandle,
    target: &Target<'_>,
    work: &mut [CsiWork],
) {
    let Target {
        backup,
        backup_uid,
        location,
        bucket,
        move_data,
    } = *target;
    if move_data {
        for w in work.iter_mut().filter(|w| w.error.is_none()) {
            w.data_upload = create_data_upload(ctx, config, backup, backup_uid, location, w);
        }
    }
    // EC2 finishes the snapshots (pending → completed) unless the storage is stuck.
    tokio::time::sleep(ctx.timings.backup_overhead).await;
    handle
        .wait_released(|faults| faults.contains(&VeleroFault::SnapshotsNeverReady))
        .await;
    for w in work.iter_mut().filter(|w| w.error.is_none()) {
        set_ready(ctx, w);
    }
    if !move_data {
        for w in work.iter_mut() {
            w.completed = Some(rfc3339(jiff::Timestamp::now()));
        }
        return;
    }
    // Kopia moves a volume's bytes in full the first time, then only what changed.
    let moves: Vec<u64> = work
        .iter()
        .map(|w| handle.to_move(&w.pod_ns, &w.pv, w.bytes, w.changed))
        .collect();
    let total: u64 = work
        .iter()
        .zip(&moves)
        .filter(|(w, _)| w.error.is_none())
        .map(|(_, m)| m)
        .sum();
    for w in work.iter().filter(|w| w.data_upload.is_some()) {
        set_du(
            ctx,
            config,
            w,
            json!({"phase": "InProgress", "progress": {"totalBytes": w.bytes}}),
        );
    }
    let t = &ctx.timings;
    if t.backup_mib_per_second > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(
            total as f64 / (t.backup_mib_per_second * 1024.0 * 1024.0),
        ))
        .await;
    }
    for (w, moved) in work
        .iter_mut()
        .zip(moves)
        .filter(|(w, _)| w.error.is_none())
    {
        let repo = bucket.key(&format!("kopia/{}/kopia.repository", w.pod_ns));
        let result = async {
            if !bucket.exists(&repo).await? {
                let cfg = json!({"uniqueID": random_hex(64), "keyAlgo": "pbkdf2"});
                bucket
                    .put(
                        &repo,
                        serde_json::to_vec(&cfg).unwrap_or_default(),
                        Value::Null,
                    )
                    .await?;
            }
            let pack = bucket.key(&format!("kopia/{}/p{}", w.pod_ns, random_hex(32)));
            let body = gzip(format!("{}/{}:{}", w.pod_ns, w.pvc, w.snapshot_handle).as_bytes());
            bucket.put(&pack, body, json!({"pvc": w.pvc})).await
        }
        .await;
        let done = rfc3339(jiff::Timestamp::now());
        w.completed = Some(done.clone());
        match result {
            Ok(()) => {
                handle.mark_uploaded(&w.pod_ns, &w.pv);
                handle.record_upload(super::Upload {
                    backup: backup.to_owned(),
                    namespace: w.pod_ns.clone(),
                    pvc: w.pvc.clone(),
                    pv: w.pv.clone(),
                    size: w.bytes,
                    moved,
                });
                w.moved_id = random_hex(32);
                set_du(
                    ctx,
                    config,
                    w,
                    json!({"phase": "Completed", "snapshotID": w.moved_id,
                    "completionTimestamp": done, "progress": {"totalBytes": w.bytes, "bytesDone": w.bytes}}),
                );
                // The data mover's snapshot is deleted once its data moved (Velero keeps none locally);
                // with deletionPolicy Delete its content and the EBS snapshot go with it.
                let _ =
                    ctx.store
                        .delete(&vs_key(), Some(&w.pod_ns), &w.vs_name, &Default::default());
                let _ = ctx
                    .store
                    .delete(&vsc_key(), None, &w.vsc_name, &Default::default());
            }
            Err(e) => {
                w.error = Some(format!("data path backup failed: {e}"));
                set_du(
                    ctx,
                    config,
                    w,
                    json!({"phase": "Failed", "message": w.error}),
                );
            }
        }
    }
}

fn create_data_upload(
    ctx: &WorldContext,
    config: &VeleroConfig,
    backup: &str,
    backup_uid: &str,
    location: &str,
    w: &CsiWork,
) -> Option<String> {
    ctx.store.def(&du_key())?;
    let du = json!({
        "apiVersion": "velero.io/v2alpha1", "kind": "DataUpload",
        "metadata": {"generateName": format!("{backup}-"), "namespace": config.namespace,
            "labels": {"velero.io/backup-name": backup, "velero.io/backup-uid": backup_uid},
            "ownerReferences": [{"apiVersion": "velero.io/v1", "kind": "Backup", "name": backup, "uid": backup_uid, "controller": true}]},
        "spec": {"snapshotType": "CSI", "sourceNamespace": w.pod_ns, "sourcePVC": w.pvc,
            "backupStorageLocation": location, "operationTimeout": "10m0s",
            "csiSnapshot": {"volumeSnapshot": w.vs_name, "snapshotClass": w.class, "storageClass": ""}},
        "status": {"phase": "Accepted", "startTimestamp": w.started},
    });
    let created = ctx
        .store
        .create(&du_key(), Some(&config.namespace), du, INTERNAL)
        .ok()?;
    meta_str(&created, "name").map(str::to_owned)
}

fn set_du(ctx: &WorldContext, config: &VeleroConfig, w: &CsiWork, status: Value) {
    let Some(name) = &w.data_upload else { return };
    let _ = ctx.store.modify(
        &du_key(),
        Some(&config.namespace),
        name,
        None,
        INTERNAL,
        |cur| {
            let mut v = cur.clone();
            if let (Some(st), Value::Object(add)) = (
                v.get_mut("status").and_then(Value::as_object_mut),
                status.clone(),
            ) {
                st.extend(add);
            }
            Ok(v)
        },
    );
}

/// The volume info Velero writes for a CSI-snapshotted PVC (`internal/volume/volumes_information.go`).
pub fn volume_info(w: &CsiWork, move_data: bool) -> Value {
    let ok = w.error.is_none();
    let mut info = json!({
        "pvcName": w.pvc, "pvcNamespace": w.pod_ns, "pvName": w.pv,
        "backupMethod": "CSISnapshot", "snapshotDataMoved": move_data,
        "preserveLocalSnapshot": false, "skipped": false,
        "startTimestamp": w.started, "completionTimestamp": w.completed,
        "result": if ok { "succeeded" } else { "failed" },
        "csiSnapshotInfo": {"snapshotHandle": w.snapshot_handle, "size": w.bytes, "driver": w.driver,
                            "vscName": w.vsc_name, "readyToUse": ok},
    });
    if move_data {
        info["snapshotDataMovementInfo"] = json!({"dataMover": "velero", "uploaderType": "kopia",
            "snapshotHandle": w.moved_id, "size": w.bytes, "phase": if ok { "Completed" } else { "Failed" }});
    }
    info
}
