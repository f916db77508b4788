//! Garbage collection of expired Backups as Velero's gc controller does it (velero
//! pkg/controller/gc_controller.go Reconcile): every `gc_frequency`, a Backup whose `status.expiration`
//! has passed gets a DeleteBackupRequest (labelled with its name and uid) unless one is pending; its BSL
//! must exist, be available and writable. The deletion controller then removes it and its bucket data.

use serde_json::{Value, json};

use super::deletion::{BACKUP_NAME_LABEL, BACKUP_UID_LABEL};
use super::{INTERNAL, VeleroConfig, backups_key, bsl_key, dbr_key, write_backup};
use crate::apiserver::meta::meta_str;
use crate::world::WorldContext;

/// Label GC puts on a Backup it cannot collect (`garbageCollectionFailure`).
const GC_FAILURE_LABEL: &str = "velero.io/gc-failure";

pub(super) fn collect_expired(ctx: &WorldContext, config: &VeleroConfig) {
    let ns = config.namespace.as_str();
    let now = jiff::Timestamp::now();
    let page = ctx
        .store
        .list(&backups_key(), Some(ns), &|_| true, None, None);
    for backup in page.items {
        let expired = backup
            .pointer("/status/expiration")
            .and_then(Value::as_str)
            .and_then(|e| e.parse::<jiff::Timestamp>().ok())
            .is_some_and(|e| e <= now);
        if !expired {
            continue;
        }
        let name = meta_str(&backup, "name").unwrap_or("").to_string();
        let uid = meta_str(&backup, "uid").unwrap_or("").to_string();
        let location = backup
            .pointer("/spec/storageLocation")
            .and_then(Value::as_str)
            .unwrap_or("");
        let bsl = ctx.store.get(&bsl_key(), Some(ns), location);
        let failure = match &bsl {
            None => Some("BSLNotFound"),
            Some(b) if b.pointer("/status/phase").and_then(Value::as_str) != Some("Available") => {
                // Unavailable: retried on the next pass, no label.
                continue;
            }
            Some(b)
                if b.pointer("/spec/accessMode").and_then(Value::as_str) == Some("ReadOnly") =>
            {
                Some("BSLReadOnly")
            }
            Some(_) => None,
        };
        if let Some(reason) = failure {
            let _ = write_backup(ctx, ns, &name, |v| {
                if !v["metadata"]["labels"].is_object() {
                    v["metadata"]["labels"] = json!({});
                }
                v["metadata"]["labels"][GC_FAILURE_LABEL] = json!(reason);
            });
            continue;
        }
        let pending = ctx
            .store
            .list(&dbr_key(), Some(ns), &|_| true, None, None)
            .items
            .iter()
            .any(|d| {
                let labels = d.pointer("/metadata/labels");
                labels
                    .and_then(|l| l.get(BACKUP_NAME_LABEL))
                    .and_then(Value::as_str)
                    == Some(name.as_str())
                    && labels
                        .and_then(|l| l.get(BACKUP_UID_LABEL))
                        .and_then(Value::as_str)
                        == Some(uid.as_str())
                    && matches!(
                        d.pointer("/status/phase")
                            .and_then(Value::as_str)
                            .unwrap_or(""),
                        "" | "New" | "InProgress"
                    )
            });
        if pending {
            continue;
        }
        // NewDeleteBackupRequest: generateName `<backup>-`.
        let suffix: String = uuid::Uuid::new_v4().simple().to_string()[..5].to_string();
        let request = json!({
            "apiVersion": "velero.io/v1", "kind": "DeleteBackupRequest",
            "metadata": {"name": format!("{name}-{suffix}"), "namespace": ns,
                         "labels": {BACKUP_NAME_LABEL: name, BACKUP_UID_LABEL: uid}},
            "spec": {"backupName": name},
        });
        if ctx
            .store
            .create(&dbr_key(), Some(ns), request, INTERNAL)
            .is_ok()
        {
            ctx.audit.world(
                "gc",
                "backups.velero.io",
                Some(ns),
                Some(&name),
                json!({"expired": true}),
            );
        }
    }
}
