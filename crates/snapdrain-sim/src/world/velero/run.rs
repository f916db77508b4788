//! One backup from InProgress to its final phase: scope, PodVolumeBackups through the node-agent (in
//! their hosting pods since Velero 1.17: [`super::hosting`]), kopia blobs, `PutBackup`, and the
//! finalizer's last write, in Velero's order.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::archive::{gzip, tar_gz};
use super::bucket::Bucket;
use super::csi::{self, CsiWork, VolumePolicies};
use super::hooks;
use super::hosting::{self, Hosted};
use super::queue::{Location, location_of};
use super::{
    DataPath, INTERNAL, VeleroConfig, VeleroError, VeleroFault, VeleroHandle, audit_phase,
    backups_key, parse_go_duration, pvb_key, rfc3339, scope, write_backup,
};
use crate::apiserver::meta::meta_str;
use crate::apiserver::resources::ResKey;
use crate::world::WorldContext;

/// Namespaced kinds the simulated backup collects (enough for StatefulSet workloads).
const NAMESPACED: &[(&str, &str)] = &[
    ("", "pods"),
    ("", "persistentvolumeclaims"),
    ("", "services"),
    ("", "configmaps"),
    ("", "secrets"),
    ("", "serviceaccounts"),
    ("apps", "statefulsets"),
    ("apps", "deployments"),
    ("apps", "replicasets"),
    ("policy", "poddisruptionbudgets"),
];

/// One pod volume to back up with the file system uploader.
#[derive(Clone, Debug)]
struct VolumeWork {
    pod_ns: String,
    pod_name: String,
    pod_uid: String,
    node: String,
    volume: String,
    pvc: Option<String>,
    pvc_uid: String,
    pv: String,
    bytes: u64,
    /// The claim's [`scope::CHANGED_BYTES`].
    changed: Option<u64>,
    /// What this upload moves: `bytes` the first time, then the changed bytes (kopia dedup).
    moved: u64,
    /// Set when the volume failed, with Velero's message.
    error: Option<String>,
    snapshot_id: String,
    pvb_name: Option<String>,
    pvb_uid: String,
    /// The uid of the PVB's hosting pod (Velero 1.17+ data path), once created.
    hosting: Option<String>,
    /// The PVB ended Canceled rather than Failed (its hosting pod went before the data path started).
    canceled: bool,
    started: String,
    completed: Option<String>,
}

/// Everything a backup covers.
struct Covered {
    /// (group.resource, object)
    items: Vec<(String, Arc<Value>)>,
    pods: Vec<String>,
    pvcs: Vec<String>,
    /// PVC volumes that no method backs up (no snapshot location in the sim).
    skipped: Vec<(String, String, String)>,
    volumes: Vec<VolumeWork>,
    /// PVC volumes the volume policy sends to a CSI snapshot.
    csi: Vec<CsiWork>,
    /// `spec.snapshotMoveData`.
    move_data: bool,
}

fn group_resource(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

fn collect(ctx: &WorldContext, spec: &Value, policies: Option<&VolumePolicies>) -> Covered {
    let store = &ctx.store;
    let mut items = Vec::new();
    let mut pods = Vec::new();
    let mut pvc_names: BTreeSet<(String, String)> = BTreeSet::new();
    let mut volumes = Vec::new();
    let mut fs_claims: BTreeSet<(String, String)> = BTreeSet::new();
    let mut csi = Vec::new();
    let snapshots_allowed = spec.get("snapshotVolumes").and_then(Value::as_bool) != Some(false);
    let in_scope = |o: &Value| {
        meta_str(o, "namespace").is_some_and(|ns| scope::namespace_included(spec, ns))
            && o.pointer("/metadata/deletionTimestamp").is_none()
    };
    for (group, plural) in NAMESPACED {
        let key = ResKey::new(group, plural);
        let page = store.list(&key, None, &|o| in_scope(o), None, None);
        for obj in page.items {
            let selected = scope::selected(spec, &obj);
            if *plural == "persistentvolumeclaims" {
                if selected {
                    pvc_names.insert(ns_name(&obj));
                }
                continue;
            }
            if !selected {
                continue;
            }
            if *plural == "pods" {
                let (ns, name) = ns_name(&obj);
                pods.push(format!("{ns}/{name}"));
                let fs = scope::fs_backup_volumes(spec, &obj);
                for vol in pod_volumes(&obj) {
                    let claim = scope::claim_of(&obj, &vol);
                    if let Some(c) = &claim {
                        pvc_names.insert((ns.clone(), c.clone()));
                    }
                    let running =
                        obj.pointer("/status/phase").and_then(Value::as_str) == Some("Running");
                    // The volume policy decides first (velero pkg/util/volumehelper).
                    let bound = claim.as_ref().and_then(|c| {
                        let pvc =
                            store.get(&ResKey::core("persistentvolumeclaims"), Some(&ns), c)?;
                        let pv_name = pvc.pointer("/spec/volumeName").and_then(Value::as_str)?;
                        let pv = store.get(&ResKey::core("persistentvolumes"), None, pv_name)?;
                        Some((pvc, pv))
                    });
                    let action = match (policies, &bound) {
                        (Some(p), Some((_, pv))) => p.action(pv),
                        _ => None,
                    };
                    if action == Some("snapshot")
                        && snapshots_allowed
                        && let Some((pvc, pv)) = &bound
                    {
                        fs_claims.insert((ns.clone(), claim.clone().unwrap_or_default()));
                        csi.push(CsiWork::new(&obj, &vol, pvc, pv));
                        continue;
                    }
                    let fs_backup = match action {
                        Some("fs-backup") => true,
                        Some(_) => false,
                        None => fs.contains(&vol),
                    };
                    if fs_backup && running {
                        if let Some(c) = &claim {
                            fs_claims.insert((ns.clone(), c.clone()));
                        }
                        volumes.push(VolumeWork {
                            pod_ns: ns.clone(),
                            pod_name: name.clone(),
                            pod_uid: meta_str(&obj, "uid").unwrap_or("").into(),
                            node: obj
                                .pointer("/spec/nodeName")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .into(),
                            volume: vol.clone(),
                            pvc: claim.clone(),
                            pvc_uid: String::new(),
                            pv: String::new(),
                            bytes: 0,
                            changed: None,
                            moved: 0,
                            error: None,
                            snapshot_id: String::new(),
                            pvb_name: None,
                            pvb_uid: String::new(),
                            hosting: None,
                            canceled: false,
                            started: String::new(),
                            completed: None,
                        });
                    }
                }
            }
            items.push((group_resource(group, plural), obj));
        }
    }
    let mut pvcs = Vec::new();
    let mut skipped = Vec::new();
    let mut pv_names = BTreeSet::new();
    for (ns, name) in &pvc_names {
        let Some(pvc) = store.get(&ResKey::core("persistentvolumeclaims"), Some(ns), name) else {
            continue;
        };
        pvcs.push(format!("{ns}/{name}"));
        let pv = pvc
            .pointer("/spec/volumeName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        for w in volumes
            .iter_mut()
            .filter(|w| &w.pod_ns == ns && w.pvc.as_deref() == Some(name))
        {
            w.pvc_uid = meta_str(&pvc, "uid").unwrap_or("").into();
            w.pv = pv.clone();
            w.bytes = scope::pvc_bytes(&pvc);
            w.changed = scope::changed_bytes(&pvc);
        }
        if !fs_claims.contains(&(ns.clone(), name.clone())) {
            skipped.push((ns.clone(), name.clone(), pv.clone()));
        }
        if !pv.is_empty() {
            pv_names.insert(pv);
        }
        items.push(("persistentvolumeclaims".into(), pvc));
    }
    for pv in pv_names {
        if let Some(obj) = store.get(&ResKey::core("persistentvolumes"), None, &pv) {
            items.push(("persistentvolumes".into(), obj));
        }
    }
    Covered {
        items,
        pods,
        pvcs,
        skipped,
        volumes,
        csi,
        move_data: spec.get("snapshotMoveData").and_then(Value::as_bool) == Some(true),
    }
}

fn ns_name(o: &Value) -> (String, String) {
    (
        meta_str(o, "namespace").unwrap_or("").to_string(),
        meta_str(o, "name").unwrap_or("").to_string(),
    )
}

fn pod_volumes(pod: &Value) -> Vec<String> {
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.get("name")?.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn random_hex(n: usize) -> String {
    let mut s = String::new();
    while s.len() < n {
        s.push_str(&uuid::Uuid::new_v4().simple().to_string());
    }
    s.truncate(n);
    s
}

/// Runs one backup; errors that stop it are recorded on the Backup as Failed.
pub(super) async fn execute(
    ctx: Arc<WorldContext>,
    config: Arc<VeleroConfig>,
    handle: VeleroHandle,
    name: String,
) {
    if let Err(e) = execute_inner(&ctx, &config, &handle, &name).await {
        tracing::warn!(backup = %name, error = %e, "velero sim: backup could not be processed");
    }
}

async fn execute_inner(
    ctx: &Arc<WorldContext>,
    config: &VeleroConfig,
    handle: &VeleroHandle,
    name: &str,
) -> Result<(), VeleroError> {
    let ns = config.namespace.as_str();
    let Some(backup) = ctx.store.get(&backups_key(), Some(ns), name) else {
        return Ok(());
    };
    let Location {
        name: location,
        bsl,
        server_specified,
    } = location_of(ctx, config, &backup);
    let spec = backup.get("spec").cloned().unwrap_or(json!({}));
    // ReadyToStart: prepareBackupRequest resolves and validates, and the patch stores the resolved
    // spec.storageLocation and its label whether the backup runs or fails validation
    // (velero pkg/controller/backup_controller.go Reconcile).
    let mut errors = scope::validate(&spec, &location, bsl.as_deref(), server_specified);
    let policies = match VolumePolicies::load(ctx, ns, &spec) {
        Ok(p) => p,
        Err(e) => {
            errors.push(e);
            None
        }
    };
    if !errors.is_empty() {
        write_backup(ctx, ns, name, |v| {
            v["spec"]["storageLocation"] = json!(location);
            if !v["metadata"]["labels"].is_object() {
                v["metadata"]["labels"] = json!({});
            }
            v["metadata"]["labels"]["velero.io/storage-location"] = json!(location);
            v["status"]["phase"] = json!("FailedValidation");
            v["status"]["validationErrors"] = json!(errors);
        })?;
        audit_phase(
            ctx,
            ns,
            name,
            "FailedValidation",
            &[],
            &[],
            json!({"validationErrors": errors}),
        );
        return Ok(());
    }
    let mut covered = collect(ctx, &spec, policies.as_ref());
    let start = jiff::Timestamp::now();
    let ttl = spec
        .get("ttl")
        .and_then(Value::as_str)
        .and_then(parse_go_duration)
        .unwrap_or(Duration::from_secs(720 * 3600));
    let expiration = start + jiff::SignedDuration::try_from(ttl).unwrap_or_default();
    let total_items = covered.items.len();
    // prepareBackupRequest: server defaults go into the spec, labels and annotations.
    let backup = write_backup(ctx, ns, name, |v| {
        let s = &mut v["spec"];
        if !s.is_object() {
            *s = json!({});
        }
        for (k, d) in [
            ("ttl", "720h0m0s"),
            ("csiSnapshotTimeout", "10m0s"),
            ("itemOperationTimeout", "4h0m0s"),
            ("volumeGroupSnapshotLabelKey", "velero.io/volume-group"),
        ] {
            if s.get(k).and_then(Value::as_str).is_none_or(str::is_empty) {
                s[k] = json!(d);
            }
        }
        s["storageLocation"] = json!(location);
        if !v["metadata"]["labels"].is_object() {
            v["metadata"]["labels"] = json!({});
        }
        v["metadata"]["labels"]["velero.io/storage-location"] = json!(location);
        let st = &mut v["status"];
        st["phase"] = json!("InProgress");
        st["version"] = json!(1);
        st["formatVersion"] = json!("1.1.0");
        st["startTimestamp"] = json!(rfc3339(start));
        st["expiration"] = json!(rfc3339(expiration));
        st["progress"] = json!({"totalItems": total_items, "itemsBackedUp": 0});
        if let Some(s) = st.as_object_mut() {
            s.remove("queuePosition");
        }
    })?;
    audit_phase(
        ctx,
        ns,
        name,
        "InProgress",
        &covered.pvcs,
        &covered.pods,
        Value::Null,
    );

    let resolved = match bsl.as_deref() {
        Some(b) => Some(Bucket::from_bsl(ctx, b, ns).await),
        None => None,
    };
    let bucket = match resolved {
        Some(Ok(b)) => Some(b),
        Some(Err(e)) => return fail(ctx, ns, name, &covered, None, &e.to_string()).await,
        None => {
            let msg = format!("backup storage location {location:?} disappeared");
            return fail(ctx, ns, name, &covered, None, &msg).await;
        }
    };
    if let Some(reason) = handle.take_backup_failure() {
        return fail(ctx, ns, name, &covered, bucket.as_ref(), &reason).await;
    }
    let Some(bucket) = bucket else { return Ok(()) };

    let uid = meta_str(&backup, "uid").unwrap_or("").to_string();
    let mut volumes = covered.volumes.clone();
    for w in &mut volumes {
        w.started = rfc3339(jiff::Timestamp::now());
        w.moved = handle.to_move(&w.pod_ns, &w.pv, w.bytes, w.changed);
        if !node_agent_running(ctx, config, &w.node) {
            w.error = Some(format!(
                "daemonset pod not found in running state in node {}",
                w.node
            ));
        } else if w
            .pvc
            .as_deref()
            .is_some_and(|p| handle.volume_fails(&w.pod_ns, p))
        {
            w.error = Some(format!(
                "error to run kopia backup: failed to upload {}: simulated volume failure",
                w.volume
            ));
        }
        if let Some((pvb, pvb_uid)) = create_pvb(ctx, config, name, &uid, &location, w) {
            w.pvb_name = Some(pvb);
            w.pvb_uid = pvb_uid;
        }
    }
    let pods: Vec<Arc<Value>> = covered
        .items
        .iter()
        .filter(|(r, _)| r == "pods")
        .map(|(_, o)| o.clone())
        .collect();
    let spec_hooks = backup
        .pointer("/spec/hooks/resources")
        .cloned()
        .unwrap_or(Value::Null);
    let mut hook_runs = hooks::run(ctx, &pods, &spec_hooks, "pre");
    if config.data_path == DataPath::HostingPod {
        expose(ctx, config, &mut volumes).await;
    }
    transfer(ctx, config, &mut volumes).await;
    handle
        .wait_released(|faults| {
            faults
                .iter()
                .any(|f| matches!(f, VeleroFault::HoldInProgress { backup } if backup == name))
        })
        .await;
    kopia_upload(&bucket, &mut volumes).await;
    for w in volumes.iter().filter(|w| w.error.is_none()) {
        handle.mark_uploaded(&w.pod_ns, &w.pv);
        handle.record_upload(super::Upload {
            backup: name.to_owned(),
            namespace: w.pod_ns.clone(),
            pvc: w.pvc.clone().unwrap_or_default(),
            pv: w.pv.clone(),
            size: w.bytes,
            moved: w.moved,
        });
    }
    let mut snapshots = std::mem::take(&mut covered.csi);
    let move_data = covered.move_data;
    if snapshots.is_empty() {
        hook_runs.add(hooks::run(ctx, &pods, &spec_hooks, "post"));
    } else {
        csi::take_snapshots(ctx, name, &uid, &mut snapshots);
        // Velero runs a pod's post hooks once its claims' snapshots have their handles.
        hook_runs.add(hooks::run(ctx, &pods, &spec_hooks, "post"));
        // Timed once every content exists: never earlier than a content's creationTime, so an oracle
        // comparing it with an eviction errs against the product, never for it.
        handle.record_cuts(name, &snapshots, jiff::Timestamp::now());
        write_backup(ctx, ns, name, |v| {
            v["status"]["phase"] = json!("WaitingForPluginOperations");
            v["status"]["csiVolumeSnapshotsAttempted"] = json!(snapshots.len());
        })?;
        audit_phase(
            ctx,
            ns,
            name,
            "WaitingForPluginOperations",
            &covered.pvcs,
            &covered.pods,
            Value::Null,
        );
        let target = csi::Target {
            backup: name,
            backup_uid: &uid,
            location: &location,
            bucket: &bucket,
            move_data,
        };
        csi::complete(ctx, config, handle, &target, &mut snapshots).await;
    }
    let now = rfc3339(jiff::Timestamp::now());
    covered.csi = snapshots.clone();
    for w in &mut volumes {
        w.completed = Some(now.clone());
        if w.error.is_none() {
            w.snapshot_id = random_hex(32);
        }
        // OnDataPathCompleted / OnDataPathFailed: the exposed pod goes first, then the PVB's status.
        if let (Some(pvb), Some(pod_uid)) = (&w.pvb_name, &w.hosting) {
            hosting::clean_up(ctx, config, pvb, pod_uid);
        }
        finish_pvb(ctx, config, w);
    }
    // pkg/podvolume/backupper.go WaitAllPodVolumesProcessed logs each one as an error of the backup.
    let errors: Vec<String> = volumes
        .iter()
        .filter_map(|w| {
            w.error.as_ref().map(|e| {
                let how = if w.canceled { "canceled" } else { "failed" };
                format!(
                    "pod volume backup {how}: {e} (pod {}/{} volume {})",
                    w.pod_ns, w.pod_name, w.volume
                )
            })
        })
        .chain(snapshots.iter().filter_map(|w| {
            w.error
                .as_ref()
                .map(|e| format!("CSI snapshot of PVC {}/{} failed: {e}", w.pod_ns, w.pvc))
        }))
        .chain(hook_runs.errors.iter().cloned())
        .collect();
    let hook_status =
        json!({"hooksAttempted": hook_runs.attempted, "hooksFailed": hook_runs.failed});
    let finalizing = if errors.is_empty() {
        "Finalizing"
    } else {
        "FinalizingPartiallyFailed"
    };

    // PutBackup: log, velero-backup.json, tarball, then the rest; if a later file fails, the
    // metadata and tarball are removed and the backup is Failed.
    let mut persisted = (*backup).clone();
    persisted["status"]["phase"] = json!(finalizing);
    persisted["status"]["progress"] =
        json!({"totalItems": total_items, "itemsBackedUp": total_items});
    persisted["status"]["hookStatus"] = hook_status.clone();
    if !errors.is_empty() {
        persisted["status"]["errors"] = json!(errors.len());
    }
    if let Err(e) = put_backup(&bucket, name, &persisted, &covered, &volumes, &errors).await {
        let reason = format!("error uploading backup: {e}");
        return fail(ctx, ns, name, &covered, None, &reason).await;
    }
    write_backup(ctx, ns, name, |v| {
        v["status"]["phase"] = json!(finalizing);
        v["status"]["progress"] = persisted["status"]["progress"].clone();
        v["status"]["hookStatus"] = hook_status.clone();
        if !errors.is_empty() {
            v["status"]["errors"] = json!(errors.len());
        }
    })?;
    audit_phase(
        ctx,
        ns,
        name,
        finalizing,
        &covered.pvcs,
        &covered.pods,
        json!({"errors": errors}),
    );
    handle
        .wait_released(|faults| faults.contains(&VeleroFault::HoldFinalizing))
        .await;
    finalize(ctx, ns, name, &bucket, &covered.pvcs, &covered.pods).await
}

fn node_agent_running(ctx: &WorldContext, config: &VeleroConfig, node: &str) -> bool {
    let page = ctx.store.list(
        &ResKey::core("pods"),
        Some(&config.namespace),
        &|p| {
            let labels = scope::labels_of(p);
            config
                .node_agent_labels
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v))
                && p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node)
                && p.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
                && p.pointer("/metadata/deletionTimestamp").is_none()
        },
        Some(1),
        None,
    );
    !page.items.is_empty()
}

/// Why a running volume upload was cut short, if it was: its pod or the node-agent went away.
fn disrupted(ctx: &WorldContext, config: &VeleroConfig, w: &VolumeWork) -> Option<String> {
    let pod = ctx
        .store
        .get(&ResKey::core("pods"), Some(&w.pod_ns), &w.pod_name);
    let pod_alive = pod.as_ref().is_some_and(|p| {
        meta_str(p, "uid") == Some(w.pod_uid.as_str())
            && p.pointer("/metadata/deletionTimestamp").is_none()
    });
    if !pod_alive {
        return Some(format!(
            "error to run kopia backup: pod {}/{} went away while volume {} was being uploaded: failed to read /host_pods/{}/volumes: no such file or directory",
            w.pod_ns, w.pod_name, w.volume, w.pod_uid
        ));
    }
    if let (Some(pvb), Some(uid)) = (&w.pvb_name, &w.hosting) {
        // The data moves in the hosting pod; a node-agent restarting meanwhile resumes watching it
        // (velero pkg/controller/pod_volume_backup_controller.go AttemptPVBResume).
        return match hosting::state(ctx, config, pvb, uid) {
            Hosted::Running | Hosted::Starting => None,
            Hosted::Ended(how) => Some(format!(
                "data path backup failed: hosting pod {}/{pvb} ended ({how}) while volume {} of pod {}/{} was being uploaded",
                config.namespace, w.volume, w.pod_ns, w.pod_name
            )),
        };
    }
    if !node_agent_running(ctx, config, &w.node) {
        return Some(format!(
            "node-agent on node {} stopped: found a podvolumebackup with status \"InProgress\" during the server starting, mark it as \"Failed\"",
            w.node
        ));
    }
    None
}

/// The 1.17+ expose step: a hosting pod per PVB on the source node, then each PVB Prepared and
/// InProgress once its pod runs; Canceled when the pod ends first, Failed when it is not running within
/// the prepare timeout.
async fn expose(ctx: &WorldContext, config: &VeleroConfig, volumes: &mut [VolumeWork]) {
    for w in volumes.iter_mut().filter(|w| w.error.is_none()) {
        let Some(pvb) = w.pvb_name.clone() else {
            continue;
        };
        let source = hosting::Source {
            pvb_name: &pvb,
            pvb_uid: &w.pvb_uid,
            node: &w.node,
            pod_uid: &w.pod_uid,
            pv: &w.pv,
        };
        match hosting::create(ctx, config, &source) {
            Some(uid) => w.hosting = Some(uid),
            None => {
                w.error = Some(format!(
                    "error exposing host path for pod volume: error to create hosting pod {}/{pvb}",
                    config.namespace
                ))
            }
        }
    }
    let deadline = tokio::time::Instant::now() + config.prepare_timeout;
    let (_, mut pods) = ctx.store.subscribe(&ResKey::core("pods"));
    loop {
        let mut waiting = false;
        for w in volumes.iter_mut().filter(|w| w.error.is_none()) {
            let (Some(pvb), Some(uid)) = (w.pvb_name.clone(), w.hosting.clone()) else {
                continue;
            };
            let prepared = ctx
                .store
                .get(&pvb_key(), Some(&config.namespace), &pvb)
                .is_some_and(|p| {
                    p.pointer("/status/phase").and_then(Value::as_str) != Some("Accepted")
                });
            if prepared {
                continue;
            }
            match hosting::state(ctx, config, &pvb, &uid) {
                Hosted::Running => {
                    hosting::set_phase(ctx, config, &pvb, "Prepared");
                    hosting::set_phase(ctx, config, &pvb, "InProgress");
                }
                Hosted::Starting => waiting = true,
                Hosted::Ended(how) => {
                    w.canceled = true;
                    w.error = Some(format!(
                        "Cancel PVB because the exposing pod {}/{pvb} is in abnormal status for reason Pod is in abnormal state [{how}]",
                        config.namespace
                    ));
                }
            }
        }
        if !waiting {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {
                for w in volumes.iter_mut().filter(|w| w.error.is_none() && w.hosting.is_some()) {
                    let running = matches!(
                        (&w.pvb_name, &w.hosting),
                        (Some(p), Some(u)) if hosting::state(ctx, config, p, u) == Hosted::Running
                    );
                    if !running {
                        w.error = Some("timeout on preparing PVB".into());
                    }
                }
                return;
            }
            ev = pods.recv() => if let Err(RecvError::Closed) = ev { return },
        }
    }
}

/// Waits for the data to move (overhead + moved bytes / throughput), failing volumes whose pod or
/// node-agent disappears meanwhile.
async fn transfer(ctx: &WorldContext, config: &VeleroConfig, volumes: &mut [VolumeWork]) {
    let t = &ctx.timings;
    let total: u64 = volumes
        .iter()
        .filter(|w| w.error.is_none())
        .map(|w| w.moved)
        .sum();
    let data = if t.backup_mib_per_second > 0.0 {
        Duration::from_secs_f64(total as f64 / (t.backup_mib_per_second * 1024.0 * 1024.0))
    } else {
        Duration::ZERO
    };
    let deadline = tokio::time::Instant::now() + t.backup_overhead + data;
    let (_, mut pods) = ctx.store.subscribe(&ResKey::core("pods"));
    loop {
        for w in volumes.iter_mut().filter(|w| w.error.is_none()) {
            w.error = disrupted(ctx, config, w);
        }
        // Every PVB has ended: nothing moves any more, and the backup goes on to PutBackup.
        if !volumes.is_empty() && volumes.iter().all(|w| w.error.is_some()) {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => break,
            ev = pods.recv() => if let Err(RecvError::Closed) = ev { break },
        }
    }
}

/// Kopia writes: the repository config once per namespace, then a data pack per volume.
async fn kopia_upload(bucket: &Bucket, volumes: &mut [VolumeWork]) {
    for w in volumes.iter_mut().filter(|w| w.error.is_none()) {
        let repo = bucket.key(&format!("kopia/{}/kopia.repository", w.pod_ns));
        let result = async {
            if !bucket.exists(&repo).await? {
                let cfg = json!({"uniqueID": random_hex(64), "keyAlgo": "pbkdf2", "encryption": "AES256-GCM-HMAC-SHA256"});
                bucket.put(&repo, serde_json::to_vec(&cfg).unwrap_or_default(), Value::Null).await?;
            }
            let pack = bucket.key(&format!("kopia/{}/p{}", w.pod_ns, random_hex(32)));
            // Stand-in content: kopia packs are encrypted; only their presence and time matter here.
            let body = gzip(format!("{}/{}:{}", w.pod_ns, w.pod_name, w.volume).as_bytes());
            bucket.put(&pack, body, json!({"pvc": w.pvc})).await
        }
        .await;
        if let Err(e) = result {
            w.error = Some(format!("error to run kopia backup: {e}"));
        }
    }
}

fn create_pvb(
    ctx: &WorldContext,
    config: &VeleroConfig,
    backup: &str,
    backup_uid: &str,
    location: &str,
    w: &VolumeWork,
) -> Option<(String, String)> {
    // PodVolumeBackups only exist when their CRD is installed.
    ctx.store.def(&pvb_key())?;
    // In 1.17+ the node-agent accepts the PVB and exposes it in a hosting pod before the data path
    // runs (velero pkg/controller/pod_volume_backup_controller.go acceptPodVolumeBackup); before,
    // it ran at once in the agent.
    let phase = match config.data_path {
        DataPath::HostingPod => "Accepted",
        DataPath::NodeAgent => "InProgress",
    };
    let mut labels = json!({"velero.io/backup-name": backup, "velero.io/backup-uid": backup_uid});
    if !w.pvc_uid.is_empty() {
        labels["velero.io/pvc-uid"] = json!(w.pvc_uid);
    }
    let obj = json!({
        "apiVersion": "velero.io/v1",
        "kind": "PodVolumeBackup",
        "metadata": {
            "generateName": format!("{backup}-"),
            "namespace": config.namespace,
            "labels": labels,
            "ownerReferences": [{"apiVersion": "velero.io/v1", "kind": "Backup", "name": backup, "uid": backup_uid, "controller": true}],
        },
        "spec": {
            "node": w.node,
            "pod": {"kind": "Pod", "namespace": w.pod_ns, "name": w.pod_name, "uid": w.pod_uid},
            "volume": w.volume,
            "backupStorageLocation": location,
            "repoIdentifier": "",
            "uploaderType": "kopia",
            "tags": {"backup": backup, "backup-uid": backup_uid, "ns": w.pod_ns, "pod": w.pod_name, "pod-uid": w.pod_uid, "pvc-uid": w.pvc_uid, "volume": w.volume},
        },
        "status": {"phase": phase, "startTimestamp": w.started, "progress": {"totalBytes": w.bytes}},
    });
    let created = ctx
        .store
        .create(&pvb_key(), Some(&config.namespace), obj, INTERNAL)
        .ok()?;
    Some((
        meta_str(&created, "name")?.to_string(),
        meta_str(&created, "uid").unwrap_or("").to_string(),
    ))
}

fn pvb_status(w: &VolumeWork) -> Value {
    let phase = match (&w.error, w.canceled) {
        (None, _) => "Completed",
        (Some(_), true) => "Canceled",
        (Some(_), false) => "Failed",
    };
    let mut st = json!({
        "phase": phase,
        "startTimestamp": w.started,
        "completionTimestamp": w.completed,
        "progress": {"totalBytes": w.bytes, "bytesDone": if w.error.is_some() { 0 } else { w.bytes }},
    });
    match &w.error {
        Some(e) => st["message"] = json!(e),
        None => {
            st["snapshotID"] = json!(w.snapshot_id);
            st["path"] = json!(format!(
                "/host_pods/{}/volumes/kubernetes.io~csi/{}/mount",
                w.pod_uid, w.pv
            ));
        }
    }
    st
}

fn finish_pvb(ctx: &WorldContext, config: &VeleroConfig, w: &VolumeWork) {
    let Some(name) = &w.pvb_name else { return };
    let _ = ctx.store.modify(
        &pvb_key(),
        Some(&config.namespace),
        name,
        None,
        INTERNAL,
        |cur| {
            let mut v = cur.clone();
            v["status"] = pvb_status(w);
            Ok(v)
        },
    );
}

fn pvb_objects(ctx: &WorldContext, ns: &str, volumes: &[VolumeWork]) -> Vec<Value> {
    volumes
        .iter()
        .filter_map(|w| {
            let name = w.pvb_name.as_ref()?;
            ctx.store
                .get(&pvb_key(), Some(ns), name)
                .map(|o| (*o).clone())
        })
        .collect()
}

fn volume_infos(covered: &Covered, volumes: &[VolumeWork]) -> Value {
    let mut out = Vec::new();
    for (ns, pvc, pv) in &covered.skipped {
        out.push(json!({
            "pvcName": pvc, "pvcNamespace": ns, "pvName": pv,
            "snapshotDataMoved": false, "preserveLocalSnapshot": false,
            "skipped": true,
            "skippedReason": "no applicable volume backup method: file-system backup not selected and no VolumeSnapshotLocation",
        }));
    }
    for w in &covered.csi {
        out.push(csi::volume_info(w, covered.move_data));
    }
    for w in volumes {
        let ok = w.error.is_none();
        out.push(json!({
            "pvcName": w.pvc, "pvcNamespace": w.pod_ns, "pvName": w.pv,
            "backupMethod": "PodVolumeBackup",
            "snapshotDataMoved": false, "preserveLocalSnapshot": false, "skipped": false,
            "startTimestamp": w.started, "completionTimestamp": w.completed,
            "result": if ok { "succeeded" } else { "failed" },
            "pvbInfo": {
                "snapshotHandle": w.snapshot_id, "size": w.bytes, "uploaderType": "kopia",
                "volumeName": w.volume, "podName": w.pod_name, "podNamespace": w.pod_ns,
                "nodeName": w.node,
                // Velero's PodVolumeInfo.Phase has no json tag, so it serializes capitalized.
                "Phase": if ok { "Completed" } else { "Failed" },
            },
        }));
    }
    Value::Array(out)
}

fn resource_list(items: &[(String, Arc<Value>)]) -> Value {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, obj) in items {
        let gvk = format!(
            "{}/{}",
            obj.get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or("v1"),
            obj.get("kind").and_then(Value::as_str).unwrap_or("")
        );
        let (ns, name) = ns_name(obj);
        let id = if ns.is_empty() {
            name
        } else {
            format!("{ns}/{name}")
        };
        map.entry(gvk).or_default().push(id);
    }
    json!(map)
}

fn tarball(items: &[(String, Arc<Value>)]) -> Vec<u8> {
    let mut entries = vec![("metadata/version".to_string(), b"1.1.0".to_vec())];
    for (gr, obj) in items {
        let (ns, name) = ns_name(obj);
        let version = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .and_then(|a| a.rsplit('/').next())
            .unwrap_or("v1");
        let place = if ns.is_empty() {
            "cluster".to_string()
        } else {
            format!("namespaces/{ns}")
        };
        let body = serde_json::to_vec(&**obj).unwrap_or_default();
        entries.push((format!("resources/{gr}/{place}/{name}.json"), body.clone()));
        entries.push((
            format!("resources/{gr}/{version}-preferredversion/{place}/{name}.json"),
            body,
        ));
    }
    tar_gz(&entries)
}

fn log_text(name: &str, lines: &[String]) -> Vec<u8> {
    let now = rfc3339(jiff::Timestamp::now());
    lines
        .iter()
        .map(|l| format!("time=\"{now}\" level=info msg=\"{l}\" backup=velero/{name}\n"))
        .collect::<String>()
        .into_bytes()
}

fn json_bytes(v: &Value) -> Vec<u8> {
    // Serializing a Value cannot fail.
    serde_json::to_vec_pretty(v).unwrap_or_default()
}

async fn put_backup(
    bucket: &Bucket,
    name: &str,
    persisted: &Value,
    covered: &Covered,
    volumes: &[VolumeWork],
    errors: &[String],
) -> Result<(), VeleroError> {
    let phase = persisted
        .pointer("/status/phase")
        .cloned()
        .unwrap_or(Value::Null);
    let mut log = vec![
        format!("Setting up backup log"),
        format!("Backed up a total of {} items", covered.items.len()),
    ];
    log.extend(errors.iter().cloned());
    // The log upload is best effort in Velero.
    let _ = bucket
        .put(
            &bucket.backup_key(name, &format!("{name}-logs.gz")),
            gzip(&log_text(name, &log)),
            Value::Null,
        )
        .await;
    let meta_key = bucket.backup_key(name, "velero-backup.json");
    bucket
        .put(&meta_key, json_bytes(persisted), json!({"phase": phase}))
        .await?;
    let tar_key = bucket.backup_key(name, &format!("{name}.tar.gz"));
    if let Err(e) = bucket
        .put(&tar_key, tarball(&covered.items), Value::Null)
        .await
    {
        bucket.delete(&meta_key).await;
        return Err(e);
    }
    let pvbs: Vec<Value> = volumes
        .iter()
        .map(|w| json!({"metadata": {"name": w.pvb_name}, "spec": {"pod": {"namespace": w.pod_ns, "name": w.pod_name}, "volume": w.volume}, "status": pvb_status(w)}))
        .collect();
    let mut ns_errors: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (w, e) in volumes
        .iter()
        .filter_map(|w| w.error.as_ref().map(|e| (w, e)))
    {
        ns_errors
            .entry(w.pod_ns.clone())
            .or_default()
            .push(e.clone());
    }
    let results = if ns_errors.is_empty() {
        json!({"warnings": {}, "errors": {}})
    } else {
        json!({"warnings": {}, "errors": {"namespaces": ns_errors}})
    };
    let rest = [
        (format!("{name}-podvolumebackups.json.gz"), json!(pvbs)),
        (
            format!("{name}-resource-list.json.gz"),
            resource_list(&covered.items),
        ),
        (format!("{name}-results.gz"), results),
        (
            format!("{name}-volumeinfo.json.gz"),
            volume_infos(covered, volumes),
        ),
    ];
    for (file, v) in rest {
        if let Err(e) = bucket
            .put(
                &bucket.backup_key(name, &file),
                gzip(&json_bytes(&v)),
                Value::Null,
            )
            .await
        {
            bucket.delete(&meta_key).await;
            bucket.delete(&tar_key).await;
            return Err(e);
        }
    }
    let _ = pvb_objects; // PVB CRs are read back by the finalizer only when their CRD exists.
    Ok(())
}

/// The finalizer: final phase and completionTimestamp go to the bucket first, then to the CR.
async fn finalize(
    ctx: &WorldContext,
    ns: &str,
    name: &str,
    bucket: &Bucket,
    pvcs: &[String],
    pods: &[String],
) -> Result<(), VeleroError> {
    let Some(current) = ctx.store.get(&backups_key(), Some(ns), name) else {
        return Ok(());
    };
    let final_phase = match current.pointer("/status/phase").and_then(Value::as_str) {
        Some("FinalizingPartiallyFailed") => "PartiallyFailed",
        Some("Finalizing") => "Completed",
        _ => return Ok(()),
    };
    let done = rfc3339(jiff::Timestamp::now());
    let mut persisted = (*current).clone();
    persisted["status"]["phase"] = json!(final_phase);
    persisted["status"]["completionTimestamp"] = json!(done);
    let key = bucket.backup_key(name, "velero-backup.json");
    if let Err(e) = bucket
        .put(&key, json_bytes(&persisted), json!({"phase": final_phase}))
        .await
    {
        // The finalizer fails the backup when it cannot persist the final state.
        let reason = format!("error uploading backup: {e}");
        write_backup(ctx, ns, name, |v| {
            v["status"]["phase"] = json!("Failed");
            v["status"]["failureReason"] = json!(reason);
            v["status"]["completionTimestamp"] = json!(done);
        })?;
        audit_phase(
            ctx,
            ns,
            name,
            "Failed",
            pvcs,
            pods,
            json!({"failureReason": reason}),
        );
        return Ok(());
    }
    write_backup(ctx, ns, name, |v| {
        v["status"]["phase"] = json!(final_phase);
        v["status"]["completionTimestamp"] = json!(done);
    })?;
    audit_phase(ctx, ns, name, final_phase, pvcs, pods, Value::Null);
    Ok(())
}

/// A new server's finalizer picks up backups left in Finalizing.
pub(super) async fn finalize_after_restart(
    ctx: Arc<WorldContext>,
    config: Arc<VeleroConfig>,
    name: String,
) {
    let ns = config.namespace.as_str();
    let Some(backup) = ctx.store.get(&backups_key(), Some(ns), &name) else {
        return;
    };
    let bsl = location_of(&ctx, &config, &backup).bsl;
    let Some(bsl) = bsl else { return };
    match Bucket::from_bsl(&ctx, &bsl, ns).await {
        Ok(bucket) => {
            if let Err(e) = finalize(&ctx, ns, &name, &bucket, &[], &[]).await {
                tracing::warn!(backup = %name, error = %e, "velero sim: finalizer failed");
            }
        }
        Err(e) => {
            tracing::warn!(backup = %name, error = %e, "velero sim: finalizer cannot reach the bucket")
        }
    }
}

/// Marks the backup Failed. As Velero does, a failed backup is still persisted (phase Failed) when the
/// bucket is reachable, so files in the bucket never prove success.
async fn fail(
    ctx: &WorldContext,
    ns: &str,
    name: &str,
    covered: &Covered,
    bucket: Option<&Bucket>,
    reason: &str,
) -> Result<(), VeleroError> {
    let done = rfc3339(jiff::Timestamp::now());
    if let (Some(bucket), Some(current)) = (bucket, ctx.store.get(&backups_key(), Some(ns), name)) {
        let mut persisted = (*current).clone();
        persisted["status"]["phase"] = json!("Failed");
        persisted["status"]["failureReason"] = json!(reason);
        persisted["status"]["completionTimestamp"] = json!(done);
        let _ = put_backup(bucket, name, &persisted, covered, &[], &[]).await;
    }
    write_backup(ctx, ns, name, |v| {
        v["status"]["phase"] = json!("Failed");
        v["status"]["failureReason"] = json!(reason);
        v["status"]["completionTimestamp"] = json!(done);
    })?;
    audit_phase(
        ctx,
        ns,
        name,
        "Failed",
        &covered.pvcs,
        &covered.pods,
        json!({"failureReason": reason}),
    );
    Ok(())
}
