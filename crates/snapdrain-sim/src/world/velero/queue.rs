//! The server loop: the 1.18 backup queue (New → Queued with `queuePosition` → ReadyToStart, at most
//! `concurrent_backups` running), validation, server restarts, and periodic BSL validation.
//!
//! The server runs in the pod of its Deployment: when that pod is deleted or evicted (a drain of its
//! node), its running backups stop with it, and the next server pod to run starts the server again,
//! which marks every InProgress backup Failed (velero `pkg/cmd/server/server.go`
//! `markInProgressBackupsFailed`). A drain of the server's node mid-backup thus costs that backup.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;

use super::bucket::Bucket;
use super::hosting;
use super::{
    INTERNAL, RESTART_FAILURE, VeleroConfig, VeleroHandle, audit_phase, backups_key, bsl_key,
    dbr_key, deletion, gc, rfc3339, run as runner, write_backup,
};
use crate::apiserver::faults::{VeleroComponent, VeleroRestart};
use crate::apiserver::meta::meta_str;
use crate::apiserver::resources::ResKey;
use crate::world::WorldContext;

/// Which server pod the simulated server runs in.
#[derive(Debug, Default, PartialEq, Eq)]
struct ServerPod {
    /// The uid of the running server pod it runs in.
    uid: Option<String>,
    /// Its pod went and no other runs yet: nothing is processed.
    down: bool,
}

#[derive(Debug, PartialEq, Eq)]
enum Transition {
    Stopped,
    Started,
}

impl ServerPod {
    /// Follows the server pods: `current_alive` says whether the pod it runs in still runs, `running`
    /// is a running server pod, if any.
    fn step(&mut self, current_alive: bool, running: Option<String>) -> Option<Transition> {
        if self.uid.is_some() && !current_alive {
            self.uid = None;
            self.down = true;
            return Some(Transition::Stopped);
        }
        if self.uid.is_none()
            && let Some(uid) = running
        {
            self.uid = Some(uid);
            if std::mem::take(&mut self.down) {
                return Some(Transition::Started);
            }
        }
        None
    }
}

fn is_server_pod(config: &VeleroConfig, p: &Value) -> bool {
    let labels = super::scope::labels_of(p);
    !config.server_labels.is_empty()
        && config
            .server_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
}

fn running_pod(p: &Value) -> bool {
    p.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
        && p.pointer("/metadata/deletionTimestamp").is_none()
}

/// Looks at the server pods and moves `server` on.
fn follow_server(
    ctx: &WorldContext,
    config: &VeleroConfig,
    server: &mut ServerPod,
) -> Option<Transition> {
    let pods = ctx
        .store
        .list(
            &ResKey::core("pods"),
            Some(&config.namespace),
            &|p| is_server_pod(config, p) && running_pod(p),
            None,
            None,
        )
        .items;
    let uid_of = |p: &Arc<Value>| meta_str(p, "uid").map(str::to_string);
    let current_alive = server
        .uid
        .as_deref()
        .is_some_and(|u| pods.iter().any(|p| meta_str(p, "uid") == Some(u)));
    server.step(current_alive, pods.first().and_then(uid_of))
}

/// Runs the simulated Velero server until the task is dropped.
pub async fn run(ctx: Arc<WorldContext>, config: VeleroConfig, handle: VeleroHandle) {
    let config = Arc::new(config);
    let mut restarts = handle.restart_signal();
    let mut fault_restarts = ctx.faults.subscribe_restarts();
    let (_, mut events) = ctx.store.subscribe(&backups_key());
    let (_, mut dbr_events) = ctx.store.subscribe(&dbr_key());
    let mut deletions: Option<JoinHandle<()>> = None;
    let mut last_gc: Option<Instant> = None;
    let mut running: HashMap<String, JoinHandle<()>> = HashMap::new();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(200));
    let mut last_validation: Option<Instant> = None;
    let mut validation: Option<JoinHandle<()>> = None;
    let (_, mut pod_events) = ctx.store.subscribe(&ResKey::core("pods"));
    let mut server = ServerPod::default();
    loop {
        tokio::select! {
            changed = restarts.changed() => {
                if changed.is_err() {
                    return;
                }
                stop_all(&mut running).await;
                server_start(&ctx, &config, &handle, &mut running);
            }
            restart = fault_restarts.recv() => match restart {
                Ok(VeleroRestart { component: VeleroComponent::Server, .. }) => handle.restart(),
                Ok(VeleroRestart { component: VeleroComponent::NodeAgent, node }) => {
                    restart_node_agent(&ctx, &config, node.as_deref());
                }
                Err(RecvError::Lagged(_)) => {}
                // The context holds the sender: closed only once the cluster is gone.
                Err(RecvError::Closed) => return,
            },
            ev = events.recv() => match ev {
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            },
            ev = dbr_events.recv() => match ev {
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            },
            ev = pod_events.recv() => match ev {
                // Only the server's own namespace matters; other pods wake nothing.
                Ok(e) if meta_str(&e.object, "namespace") != Some(config.namespace.as_str()) => continue,
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            },
            _ = tick.tick() => {}
        }
        match follow_server(&ctx, &config, &mut server) {
            Some(Transition::Stopped) => {
                stop_all(&mut running).await;
                ctx.audit.world(
                    "stop",
                    "deployments.apps",
                    Some(&config.namespace),
                    Some("velero"),
                    json!({"reason": "the server pod went away"}),
                );
            }
            Some(Transition::Started) => server_start(&ctx, &config, &handle, &mut running),
            None => {}
        }
        if server.down {
            continue;
        }
        running.retain(|_, t| !t.is_finished());
        super::schedule::reconcile(&ctx, &config);
        reconcile_queue(&ctx, &config, &handle, &mut running);
        if last_gc.is_none_or(|t| t.elapsed() >= config.gc_frequency) {
            last_gc = Some(Instant::now());
            gc::collect_expired(&ctx, &config);
        }
        if deletions.as_ref().is_none_or(JoinHandle::is_finished) {
            deletions = Some(tokio::spawn(deletion::process(ctx.clone(), config.clone())));
        }
        let due = last_validation.is_none_or(|t| t.elapsed() >= config.bsl_validation_period);
        if due && validation.as_ref().is_none_or(JoinHandle::is_finished) {
            last_validation = Some(Instant::now());
            validation = Some(tokio::spawn(validate_locations(
                ctx.clone(),
                config.clone(),
            )));
        }
    }
}

fn phase(b: &Value) -> &str {
    b.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Where a backup goes, as prepareBackupRequest decides (velero pkg/controller/backup_controller.go): its
/// own `spec.storageLocation`, else the BSL marked `spec.default: true`, else the server's
/// `--default-backup-storage-location` (`server_specified`), with that BSL when it exists.
pub(super) struct Location {
    pub name: String,
    pub bsl: Option<Arc<Value>>,
    pub server_specified: bool,
}

pub(super) fn location_of(ctx: &WorldContext, config: &VeleroConfig, backup: &Value) -> Location {
    let ns = config.namespace.as_str();
    if let Some(name) = backup
        .pointer("/spec/storageLocation")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        return Location {
            name: name.to_string(),
            bsl: ctx.store.get(&bsl_key(), Some(ns), name),
            server_specified: false,
        };
    }
    let (all, _) = ctx.store.snapshot(&bsl_key());
    let default = all.into_iter().find(|b| {
        meta_str(b, "namespace") == Some(ns)
            && b.pointer("/spec/default").and_then(Value::as_bool) == Some(true)
    });
    match default {
        Some(b) => Location {
            name: meta_str(&b, "name").unwrap_or("").to_string(),
            bsl: Some(b),
            server_specified: true,
        },
        None => Location {
            name: config.default_backup_location.clone(),
            bsl: ctx
                .store
                .get(&bsl_key(), Some(ns), &config.default_backup_location),
            server_specified: true,
        },
    }
}

fn reconcile_queue(
    ctx: &Arc<WorldContext>,
    config: &Arc<VeleroConfig>,
    handle: &VeleroHandle,
    running: &mut HashMap<String, JoinHandle<()>>,
) {
    let ns = config.namespace.as_str();
    let page = ctx
        .store
        .list(&backups_key(), Some(ns), &|_| true, None, None);
    let mut queued: Vec<Arc<Value>> = Vec::new();
    // The backupTracker's RunningCount: ReadyToStart and InProgress only. Backups in
    // WaitingForPluginOperations* / Finalizing* no longer take a slot (velero pkg/controller/
    // backup_tracker.go RunningCount, backup_queue_controller.go newQueuedBackupsLister).
    let mut active = page
        .items
        .iter()
        .filter(|b| matches!(phase(b), "ReadyToStart" | "InProgress"))
        .filter(|b| running.contains_key(meta_str(b, "name").unwrap_or("")))
        .count();
    for b in page.items {
        let name = meta_str(&b, "name").unwrap_or("").to_string();
        if b.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        match phase(&b) {
            // The 1.18 queue controller queues every new backup; validation happens when it starts
            // (velero pkg/controller/backup_queue_controller.go, backup_controller.go Reconcile).
            "" | "New" => {
                match write_backup(ctx, ns, &name, |v| v["status"]["phase"] = json!("Queued")) {
                    Ok(b) => {
                        audit_phase(ctx, ns, &name, "Queued", &[], &[], Value::Null);
                        queued.push(b);
                    }
                    Err(e) => {
                        tracing::warn!(backup = %name, error = %e, "velero sim: cannot queue backup")
                    }
                }
            }
            "Queued" => queued.push(b),
            "ReadyToStart" | "InProgress" if !running.contains_key(&name) => {
                // Picked up again after a restart (ReadyToStart) or left behind by an aborted task.
                active += 1;
                start(ctx, config, handle, running, name);
            }
            _ => {}
        }
    }
    queued.sort_by(|a, b| {
        (meta_str(a, "creationTimestamp"), meta_str(a, "name"))
            .cmp(&(meta_str(b, "creationTimestamp"), meta_str(b, "name")))
    });
    let mut position = 0;
    for b in queued {
        let name = meta_str(&b, "name").unwrap_or("").to_string();
        if active < config.concurrent_backups.max(1) {
            active += 1;
            let ok = write_backup(ctx, ns, &name, |v| {
                v["status"]["phase"] = json!("ReadyToStart");
                if let Some(s) = v["status"].as_object_mut() {
                    s.remove("queuePosition");
                }
            });
            if ok.is_ok() {
                audit_phase(ctx, ns, &name, "ReadyToStart", &[], &[], Value::Null);
                start(ctx, config, handle, running, name);
            }
        } else {
            position += 1;
            if b.pointer("/status/queuePosition").and_then(Value::as_i64) != Some(position) {
                let _ = write_backup(ctx, ns, &name, |v| {
                    v["status"]["queuePosition"] = json!(position)
                });
            }
        }
    }
}

fn start(
    ctx: &Arc<WorldContext>,
    config: &Arc<VeleroConfig>,
    handle: &VeleroHandle,
    running: &mut HashMap<String, JoinHandle<()>>,
    name: String,
) {
    let task = tokio::spawn(runner::execute(
        ctx.clone(),
        config.clone(),
        handle.clone(),
        name.clone(),
    ));
    running.insert(name, task);
}

/// What a freshly started Velero server does with backups left mid-flight: InProgress ones are
/// marked Failed; Finalizing ones are finished by the finalizer controller.
/// A node-agent restart: its pods (on `node`, or everywhere) are deleted and their DaemonSet brings
/// them back. A volume upload running there fails: the new node-agent marks its InProgress
/// PodVolumeBackups Failed (velero `pkg/cmd/cli/nodeagent/server.go` `markInProgressPVBsFailed`), which
/// the running backup sees as its node-agent gone (`run::disrupted`).
fn restart_node_agent(ctx: &WorldContext, config: &VeleroConfig, node: Option<&str>) {
    let ns = config.namespace.as_str();
    let page = ctx.store.list(
        &crate::apiserver::resources::ResKey::core("pods"),
        Some(ns),
        &|p| {
            let labels = super::scope::labels_of(p);
            config
                .node_agent_labels
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v))
                && node
                    .is_none_or(|n| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(n))
        },
        None,
        None,
    );
    for p in page.items {
        let name = meta_str(&p, "name").unwrap_or("").to_string();
        ctx.audit.world(
            "restart",
            "pods",
            Some(ns),
            Some(&name),
            json!({"component": "node-agent"}),
        );
        // Already going is as good as deleted.
        let _ = ctx.store.delete(
            &crate::apiserver::resources::ResKey::core("pods"),
            Some(ns),
            &name,
            &crate::apiserver::store::DeleteOptions::default(),
        );
    }
}

fn server_start(
    ctx: &Arc<WorldContext>,
    config: &Arc<VeleroConfig>,
    handle: &VeleroHandle,
    running: &mut HashMap<String, JoinHandle<()>>,
) {
    let ns = config.namespace.as_str();
    ctx.audit.world(
        "restart",
        "deployments.apps",
        Some(ns),
        Some("velero"),
        Value::Null,
    );
    let page = ctx
        .store
        .list(&backups_key(), Some(ns), &|_| true, None, None);
    for b in page.items {
        let name = meta_str(&b, "name").unwrap_or("").to_string();
        match phase(&b) {
            "InProgress" => {
                // markPodVolumeBackupsCancel: its unfinished PVBs are cancelled too.
                if let Some(uid) = meta_str(&b, "uid") {
                    hosting::cancel_for_restart(ctx, config, uid);
                }
                let now = rfc3339(jiff::Timestamp::now());
                let res = write_backup(ctx, ns, &name, |v| {
                    v["status"]["phase"] = json!("Failed");
                    v["status"]["failureReason"] = json!(RESTART_FAILURE);
                    v["status"]["completionTimestamp"] = json!(now);
                });
                if res.is_ok() {
                    audit_phase(
                        ctx,
                        ns,
                        &name,
                        "Failed",
                        &[],
                        &[],
                        json!({"failureReason": RESTART_FAILURE}),
                    );
                }
            }
            "Finalizing" | "FinalizingPartiallyFailed" => {
                let task = tokio::spawn(runner::finalize_after_restart(
                    ctx.clone(),
                    config.clone(),
                    name.clone(),
                ));
                running.insert(name, task);
            }
            _ => {}
        }
    }
    let _ = handle;
}

/// Stops the old server's backup tasks and waits until each has: a task being polled on another worker
/// thread when aborted runs on to its next await, and could create PodVolumeBackups or hosting pods
/// after the new server's start swept the unfinished ones (left running for good, their pods holding
/// their nodes). The real server is gone before its successor starts.
async fn stop_all(running: &mut HashMap<String, JoinHandle<()>>) {
    for (_, task) in running.drain() {
        task.abort();
        // Cancelled (or done first): either way it runs no more.
        let _ = task.await;
    }
}

/// Sets each BSL's phase from a check of its bucket, writing only when something changed.
async fn validate_locations(ctx: Arc<WorldContext>, config: Arc<VeleroConfig>) {
    let ns = config.namespace.as_str();
    let page = ctx.store.list(&bsl_key(), Some(ns), &|_| true, None, None);
    for bsl in page.items {
        let name = meta_str(&bsl, "name").unwrap_or("").to_string();
        let outcome = match Bucket::from_bsl(&ctx, &bsl, ns).await {
            Ok(bucket) => bucket.validate().await,
            Err(e) => Err(e.to_string()),
        };
        let (phase, message) = match &outcome {
            Ok(()) => ("Available", None),
            Err(m) => ("Unavailable", Some(m.clone())),
        };
        let current_phase = bsl.pointer("/status/phase").and_then(Value::as_str);
        let current_msg = bsl.pointer("/status/message").and_then(Value::as_str);
        if current_phase == Some(phase) && current_msg == message.as_deref() {
            continue;
        }
        let now = rfc3339(jiff::Timestamp::now());
        let res = ctx
            .store
            .modify(&bsl_key(), Some(ns), &name, None, INTERNAL, |cur| {
                let mut v = cur.clone();
                let mut status = json!({"phase": phase, "lastValidationTime": now});
                if let Some(m) = &message {
                    status["message"] = json!(m);
                }
                if let Some(synced) = cur.pointer("/status/lastSyncedTime") {
                    status["lastSyncedTime"] = synced.clone();
                }
                v["status"] = status;
                Ok(v)
            });
        if res.is_ok() {
            ctx.audit.world(
                "phase",
                "backupstoragelocations.velero.io",
                Some(ns),
                Some(&name),
                json!({"phase": phase, "message": message}),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_stops_with_its_pod_and_starts_with_the_next() {
        let mut s = ServerPod::default();
        // No server pod yet: the server runs as it is (a world without the Deployment).
        assert_eq!(s.step(false, None), None);
        assert!(!s.down);
        // Its pod runs: adopted without a restart.
        assert_eq!(s.step(false, Some("a".into())), None);
        assert_eq!(s.uid.as_deref(), Some("a"));
        assert_eq!(s.step(true, Some("a".into())), None);
        // The pod goes: stopped, and down until another runs.
        assert_eq!(s.step(false, None), Some(Transition::Stopped));
        assert!(s.down);
        assert_eq!(s.step(false, None), None);
        assert_eq!(s.step(false, Some("b".into())), Some(Transition::Started));
        assert_eq!(
            s,
            ServerPod {
                uid: Some("b".into()),
                down: false
            }
        );
    }
}
