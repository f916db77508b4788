//! Which of the DisruptionPolicy's default backup hooks (`spec.backupHooks`) a Velero Backup carries,
//! as Velero's `spec.hooks.resources[]` entries.
//!
//! A Backup names one namespace, so it carries every policy entry that lists that namespace, in the
//! policy's order, each narrowed to `includedNamespaces: [namespace]` and with its exec hooks copied as
//! written: the admission policy `snapdrain-velero-backup-hooks` admits a Backup's hooks only when each
//! is exactly an entry of the policy for that namespace, so nothing may be added or dropped here.

use crate::api::backup_hooks::{PolicyBackupHook, PolicyHookEntry};
use crate::api::velero::{BackupResourceHook, BackupResourceHookSpec, ExecHook};

/// The policy's hooks for a Backup of `namespace`.
pub fn hooks_for_namespace(
    policy: &[PolicyBackupHook],
    namespace: &str,
) -> Vec<BackupResourceHookSpec> {
    policy
        .iter()
        .filter(|h| h.namespaces.iter().any(|n| n == namespace))
        .map(|h| BackupResourceHookSpec {
            name: h.name.clone(),
            included_namespaces: vec![namespace.to_owned()],
            label_selector: h.pod_selector.clone(),
            pre: h.pre.iter().map(velero_hook).collect(),
            post: h.post.iter().map(velero_hook).collect(),
            ..BackupResourceHookSpec::default()
        })
        .collect()
}

fn velero_hook(entry: &PolicyHookEntry) -> BackupResourceHook {
    let e = &entry.exec;
    BackupResourceHook {
        exec: ExecHook {
            container: e.container.clone(),
            command: e.command.clone(),
            on_error: e.on_error.map(|m| m.as_str().to_owned()),
            timeout: e.timeout.clone(),
        },
    }
}

/// How many entries the status names one by one; the rest are counted (the plan's status has a size
/// budget, `status_size`).
pub const SHOWN: usize = 4;

/// `name (pre N, post M)` for each entry (the first [`SHOWN`], then `and K more`), for `snapdrain plan`
/// and the status.
pub fn describe(hooks: &[BackupResourceHookSpec]) -> Vec<String> {
    let mut lines: Vec<String> = hooks
        .iter()
        .take(SHOWN)
        .map(|h| format!("{} (pre {}, post {})", h.name, h.pre.len(), h.post.len()))
        .collect();
    if hooks.len() > SHOWN {
        lines.push(format!("and {} more", hooks.len() - SHOWN));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy() -> Vec<PolicyBackupHook> {
        serde_json::from_value(json!([
            {"name": "pg-freeze", "namespaces": ["db", "db-staging"],
             "podSelector": {"matchLabels": {"app": "postgres"}},
             "pre": [{"exec": {"container": "postgres", "command": ["/sbin/fsfreeze", "--freeze", "/var/lib/postgresql"],
                               "onError": "Fail", "timeout": "30s"}}],
             "post": [{"exec": {"container": "postgres", "command": ["/sbin/fsfreeze", "--unfreeze", "/var/lib/postgresql"]}}]},
            {"name": "shop-sync", "namespaces": ["shop"], "pre": [{"exec": {"command": ["/bin/sync"]}}]},
            {"name": "db-checkpoint", "namespaces": ["db"], "pre": [{"exec": {"command": ["psql", "-c", "CHECKPOINT"]}}]}
        ]))
        .expect("a valid policy")
    }

    #[test]
    fn a_backup_carries_the_entries_naming_its_namespace_in_policy_order() {
        let names = |ns: &str| -> Vec<String> {
            hooks_for_namespace(&policy(), ns)
                .into_iter()
                .map(|h| h.name)
                .collect()
        };
        assert_eq!(names("db"), ["pg-freeze", "db-checkpoint"]);
        assert_eq!(names("shop"), ["shop-sync"]);
        assert_eq!(names("other"), Vec::<String>::new());
        // A namespace is matched whole, never as a prefix.
        assert_eq!(names("db-stag"), Vec::<String>::new());
    }

    #[test]
    fn each_entry_is_narrowed_to_the_backups_namespace_and_copied_as_written() {
        let hooks = hooks_for_namespace(&policy(), "db-staging");
        // Written out by hand (not through this module): what the admission policy compares.
        assert_eq!(
            serde_json::to_value(&hooks).expect("plain data"),
            json!([{"name": "pg-freeze", "includedNamespaces": ["db-staging"],
                    "labelSelector": {"matchLabels": {"app": "postgres"}},
                    "pre": [{"exec": {"container": "postgres",
                                      "command": ["/sbin/fsfreeze", "--freeze", "/var/lib/postgresql"],
                                      "onError": "Fail", "timeout": "30s"}}],
                    "post": [{"exec": {"container": "postgres",
                                       "command": ["/sbin/fsfreeze", "--unfreeze", "/var/lib/postgresql"]}}]}])
        );
        assert_eq!(describe(&hooks), ["pg-freeze (pre 1, post 1)"]);
    }

    #[test]
    fn the_description_names_four_and_counts_the_rest() {
        let many: Vec<BackupResourceHookSpec> = (0..6)
            .map(|i| BackupResourceHookSpec {
                name: format!("h{i}"),
                ..BackupResourceHookSpec::default()
            })
            .collect();
        let lines = describe(&many);
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[3], "h3 (pre 0, post 0)");
        assert_eq!(lines[4], "and 2 more");
    }
}
