//! The backup deletion controller: processes `velero.io/v1` DeleteBackupRequests as Velero 1.18 does
//! (velero pkg/controller/backup_deletion_controller.go Reconcile): refuses backups that still run,
//! marks the Backup Deleting, removes its bucket directory, deletes the Backup object, records the
//! request Processed with its errors, and on success removes every request for that backup.

use std::sync::Arc;

use serde_json::{Value, json};

use super::bucket::Bucket;
use super::{INTERNAL, VeleroConfig, audit_phase, backups_key, bsl_key, dbr_key, write_backup};
use crate::apiserver::meta::meta_str;
use crate::apiserver::store::DeleteOptions;
use crate::world::WorldContext;

/// `velero.io/backup-name` (velero pkg/apis/velero/v1/labels.go BackupNameLabel).
pub const BACKUP_NAME_LABEL: &str = "velero.io/backup-name";
/// `velero.io/backup-uid` (BackupUIDLabel).
pub const BACKUP_UID_LABEL: &str = "velero.io/backup-uid";

/// Phases the backupTracker holds (InProgress and post-processing): Velero refuses to delete them.
fn still_running(phase: &str) -> bool {
    matches!(
        phase,
        "InProgress"
            | "WaitingForPluginOperations"
            | "WaitingForPluginOperationsPartiallyFailed"
            | "Finalizing"
            | "FinalizingPartiallyFailed"
    )
}

fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(key))
        .and_then(Value::as_str)
}

/// Processes every new DeleteBackupRequest in Velero's namespace.
pub(super) async fn process(ctx: Arc<WorldContext>, config: Arc<VeleroConfig>) {
    let ns = config.namespace.as_str();
    let page = ctx.store.list(&dbr_key(), Some(ns), &|_| true, None, None);
    for dbr in page.items {
        let phase = dbr
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        if phase == "Processed" || phase == "InProgress" {
            continue;
        }
        let name = meta_str(&dbr, "name").unwrap_or("").to_string();
        let outcome = delete_one(&ctx, ns, &name, &dbr).await;
        let errors = match &outcome {
            Ok(()) => Vec::new(),
            Err(e) => vec![e.clone()],
        };
        let written = modify_dbr(&ctx, ns, &name, |v| {
            v["status"] = json!({"phase": "Processed", "errors": errors});
        });
        ctx.audit.world(
            "phase",
            "deletebackuprequests.velero.io",
            Some(ns),
            Some(&name),
            json!({"phase": "Processed", "errors": errors, "backupName": dbr.pointer("/spec/backupName")}),
        );
        // Everything deleted: every request for this backup goes (DeleteAllOf by name and uid labels).
        if outcome.is_ok()
            && let Some(w) = written
            && let (Some(b), Some(u)) = (label(&w, BACKUP_NAME_LABEL), label(&w, BACKUP_UID_LABEL))
        {
            let all = ctx.store.list(&dbr_key(), Some(ns), &|_| true, None, None);
            for other in all.items.iter().filter(|o| {
                label(o, BACKUP_NAME_LABEL) == Some(b) && label(o, BACKUP_UID_LABEL) == Some(u)
            }) {
                let other_name = meta_str(other, "name").unwrap_or("");
                let _ =
                    ctx.store
                        .delete(&dbr_key(), Some(ns), other_name, &DeleteOptions::default());
            }
        }
    }
}

fn modify_dbr(
    ctx: &WorldContext,
    ns: &str,
    name: &str,
    f: impl FnOnce(&mut Value),
) -> Option<Arc<Value>> {
    ctx.store
        .modify(&dbr_key(), Some(ns), name, None, INTERNAL, |cur| {
            let mut v = cur.clone();
            f(&mut v);
            Ok(v)
        })
        .ok()
}

/// One request; `Err` carries the message Velero records in `status.errors`.
async fn delete_one(ctx: &WorldContext, ns: &str, name: &str, dbr: &Value) -> Result<(), String> {
    let backup_name = dbr
        .pointer("/spec/backupName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if backup_name.is_empty() {
        return Err("spec.backupName is required".into());
    }
    // deleteExistingDeletionRequests: one request per backup at a time.
    let others = ctx.store.list(&dbr_key(), Some(ns), &|_| true, None, None);
    for other in others.items.iter().filter(|o| {
        meta_str(o, "name") != Some(name) && label(o, BACKUP_NAME_LABEL) == Some(backup_name)
    }) {
        let _ = ctx.store.delete(
            &dbr_key(),
            Some(ns),
            meta_str(other, "name").unwrap_or(""),
            &DeleteOptions::default(),
        );
    }
    let Some(backup) = ctx.store.get(&backups_key(), Some(ns), backup_name) else {
        return Err("backup not found".into());
    };
    let phase = backup
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    if still_running(phase) {
        return Err("backup is still in progress".into());
    }
    let location = backup
        .pointer("/spec/storageLocation")
        .and_then(Value::as_str)
        .unwrap_or("");
    let Some(bsl) = ctx.store.get(&bsl_key(), Some(ns), location) else {
        return Err(format!("backup storage location {location} not found"));
    };
    if bsl.pointer("/spec/accessMode").and_then(Value::as_str) == Some("ReadOnly") {
        return Err(format!(
            "cannot delete backup because backup storage location {location} is currently in read-only mode"
        ));
    }
    if bsl.pointer("/status/phase").and_then(Value::as_str) == Some("Unavailable") {
        return Err(format!(
            "cannot delete backup because backup storage location {location} is currently in Unavailable state"
        ));
    }
    let uid = meta_str(&backup, "uid").unwrap_or("").to_string();
    modify_dbr(ctx, ns, name, |v| {
        if !v["metadata"]["labels"].is_object() {
            v["metadata"]["labels"] = json!({});
        }
        let labels = &mut v["metadata"]["labels"];
        if labels.get(BACKUP_NAME_LABEL).is_none() {
            labels[BACKUP_NAME_LABEL] = json!(backup_name);
        }
        if labels.get(BACKUP_UID_LABEL).is_none() {
            labels[BACKUP_UID_LABEL] = json!(uid);
        }
        v["status"] = json!({"phase": "InProgress"});
    });
    write_backup(ctx, ns, backup_name, |v| {
        v["status"]["phase"] = json!("Deleting")
    })
    .map_err(|e| format!("error setting backup phase to deleting: {e}"))?;
    audit_phase(ctx, ns, backup_name, "Deleting", &[], &[], Value::Null);
    let bucket = Bucket::from_bsl(ctx, &bsl, ns)
        .await
        .map_err(|e| format!("error getting the backup store: {e}"))?;
    bucket.delete_backup(backup_name).await?;
    ctx.store
        .delete(
            &backups_key(),
            Some(ns),
            backup_name,
            &DeleteOptions::default(),
        )
        .map_err(|e| format!("error deleting backup {ns}/{backup_name}: {}", e.message))?;
    ctx.audit.world(
        "delete",
        "backups.velero.io",
        Some(ns),
        Some(backup_name),
        json!({"deleteBackupRequest": name}),
    );
    Ok(())
}
