//! The DisruptionPolicy's default backup hooks (`spec.backupHooks`): exec hooks a cluster admin writes
//! per workload (a file-system freeze, a database checkpoint) that snapdrain puts into the Velero Backups
//! it creates as Velero's own `spec.hooks.resources[]`, so Velero runs them without any tenant's pod
//! being annotated.
//!
//! The exec hooks are shaped exactly as Velero's `ExecHook` (velero `pkg/apis/velero/v1/backup_types.go`:
//! `container`, `command`, `onError`, `timeout`), and a Backup carries each one as written: the admission
//! policy `snapdrain-velero-backup-hooks` compares a Backup's hooks with this list field by field, so only
//! hooks the admin wrote for that namespace can reach Velero (README, "Security decisions").

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::plan::{DURATION_MAX_LENGTH, DURATION_PATTERN};

/// One named set of backup hooks for the pods of some namespaces.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyBackupHook {
    /// Unique within `spec.backupHooks`; the name of the Backup's `spec.hooks.resources[]` entry.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// The workload namespaces whose Backups carry these hooks (each Backup names its own namespace).
    #[schemars(length(min = 1, max = 100))]
    pub namespaces: Vec<String>,
    /// Only pods with these labels run the hooks (absent: every pod the Backup selects). Velero's
    /// `labelSelector` of the hook entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Run in each selected pod before its volumes are copied or snapshotted (e.g. `fsfreeze --freeze`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub pre: Vec<PolicyHookEntry>,
    /// Run after (e.g. `fsfreeze --unfreeze`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub post: Vec<PolicyHookEntry>,
}

/// Velero's `BackupResourceHook`: `{exec: {...}}`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyHookEntry {
    pub exec: PolicyExecHook,
}

/// Velero's `ExecHook`: a command run in a container of the pod, without a shell.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyExecHook {
    /// The container (absent: the pod's first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub container: Option<String>,
    /// The program and its arguments, e.g. `[/sbin/fsfreeze, --freeze, /var/lib/postgresql]`.
    #[schemars(length(min = 1, max = 64))]
    pub command: Vec<String>,
    /// `Fail`: a failed hook fails the pod's backup item (the Backup ends PartiallyFailed) and Velero
    /// runs none of the pod's later spec hooks of that phase. `Continue`, or absent: it is only counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_error: Option<HookErrorMode>,
    /// How long Velero waits for the command (Go duration; Velero's default is 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = DURATION_MAX_LENGTH))]
    pub timeout: Option<String>,
}

/// Velero's `HookErrorMode`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookErrorMode {
    Continue,
    Fail,
}

impl HookErrorMode {
    pub fn as_str(self) -> &'static str {
        match self {
            HookErrorMode::Continue => "Continue",
            HookErrorMode::Fail => "Fail",
        }
    }
}

/// The checks the schema cannot make, as `field: what is wrong, and the fix`.
pub fn validate(hooks: &[PolicyBackupHook]) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, hook) in hooks.iter().enumerate() {
        let at = format!("spec.backupHooks[{i}]");
        if hook.name.trim().is_empty() {
            problems.push(format!("{at}.name: empty; give each hook set a name"));
        } else if let Some(first) = hooks[..i].iter().position(|h| h.name == hook.name) {
            problems.push(format!(
                "{at}.name: {:?} is also the name of spec.backupHooks[{first}]; names must be unique (rename one)",
                hook.name
            ));
        }
        if hook.namespaces.is_empty() {
            problems.push(format!(
                "{at}.namespaces: empty; list the workload namespaces whose Backups carry these hooks"
            ));
        }
        for (j, ns) in hook.namespaces.iter().enumerate() {
            if !super::validate::is_dns_label(ns) {
                problems.push(format!(
                    "{at}.namespaces[{j}]: {ns:?} is not a namespace name; write a namespace (no wildcards)"
                ));
            }
        }
        if let Some(sel) = &hook.pod_selector
            && let Err(e) = kube::core::Selector::try_from(sel.clone())
        {
            problems.push(format!("{at}.podSelector: {e}"));
        }
        if hook.pre.is_empty() && hook.post.is_empty() {
            problems.push(format!(
                "{at}: no pre or post hooks; add at least one, or remove the entry"
            ));
        }
        for (phase, list) in [("pre", &hook.pre), ("post", &hook.post)] {
            for (j, entry) in list.iter().enumerate() {
                let at = format!("{at}.{phase}[{j}].exec");
                let exec = &entry.exec;
                if exec.command.first().is_none_or(|p| p.trim().is_empty()) {
                    problems.push(format!(
                        "{at}.command: no program; write the program and its arguments, e.g. [/sbin/fsfreeze, --freeze, /data]"
                    ));
                }
                if exec
                    .container
                    .as_deref()
                    .is_some_and(|c| !super::validate::is_dns_label(c))
                {
                    problems.push(format!(
                        "{at}.container: {:?} is not a container name; name one of the pod's containers, or leave it out for the first",
                        exec.container.as_deref().unwrap_or_default()
                    ));
                }
                if let Some(t) = &exec.timeout
                    && let Err(e) = super::validate::spec_duration(t)
                {
                    problems.push(format!("{at}.timeout: {e}"));
                }
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hooks(v: serde_json::Value) -> Vec<PolicyBackupHook> {
        serde_json::from_value(v).expect("the shape is valid")
    }

    #[test]
    fn a_freeze_and_thaw_pair_is_valid_and_round_trips_as_written() {
        let written = serde_json::json!([{"name": "pg-freeze", "namespaces": ["db"],
            "podSelector": {"matchLabels": {"app": "postgres"}},
            "pre": [{"exec": {"container": "postgres", "command": ["/sbin/fsfreeze", "--freeze", "/var/lib/postgresql"],
                              "onError": "Fail", "timeout": "30s"}}],
            "post": [{"exec": {"command": ["/sbin/fsfreeze", "--unfreeze", "/var/lib/postgresql"]}}]}]);
        let h = hooks(written.clone());
        assert_eq!(validate(&h), Vec::<String>::new());
        // The admission policy compares what the Backup carries with what the admin wrote: nothing
        // may be added (no defaults) or dropped on the way through.
        assert_eq!(serde_json::to_value(&h).expect("plain data"), written);
    }

    #[test]
    fn each_problem_names_its_field_and_the_fix() {
        let h = hooks(serde_json::json!([
            {"name": "a", "namespaces": ["db"], "pre": [{"exec": {"command": []}}]},
            {"name": "a", "namespaces": ["*"], "post": [{"exec": {"command": [" "], "timeout": "soon"}}]},
            {"name": "b", "namespaces": [], "podSelector": {"matchExpressions": [{"key": "a", "operator": "Maybe"}]}}
        ]));
        let problems = validate(&h).join("\n");
        for needle in [
            "spec.backupHooks[0].pre[0].exec.command: no program",
            "spec.backupHooks[1].name: \"a\" is also the name of spec.backupHooks[0]; names must be unique",
            "spec.backupHooks[1].namespaces[0]: \"*\" is not a namespace name",
            "spec.backupHooks[1].post[0].exec.command: no program",
            "spec.backupHooks[1].post[0].exec.timeout: \"soon\" is not a duration",
            "spec.backupHooks[2].namespaces: empty",
            "spec.backupHooks[2].podSelector:",
            "spec.backupHooks[2]: no pre or post hooks",
        ] {
            assert!(
                problems.contains(needle),
                "{needle:?} missing from:\n{problems}"
            );
        }
    }

    #[test]
    fn on_error_is_continue_or_fail_only() {
        let e = serde_json::from_value::<Vec<PolicyBackupHook>>(serde_json::json!([
            {"name": "a", "namespaces": ["db"], "pre": [{"exec": {"command": ["sync"], "onError": "Stop"}}]}
        ]))
        .expect_err("Stop is not a mode");
        assert!(e.to_string().contains("Continue"), "{e}");
        let schema = serde_json::to_value(schemars::schema_for!(HookErrorMode)).expect("schema");
        assert_eq!(schema["enum"], serde_json::json!(["Continue", "Fail"]));
    }
}
