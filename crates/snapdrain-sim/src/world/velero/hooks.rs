//! Backup exec hooks from pod annotations, as Velero reads and runs them:
//! - `pre.hook.backup.velero.io/{command,container,on-error,timeout}` before the pod's volumes are copied or
//!   snapshotted, `post.hook.backup.velero.io/...` after; the unprefixed `hook.backup.velero.io/...` keys
//!   count as pre hooks when no pre hook is set (velero `internal/hook/item_hook_handler.go`
//!   `HandleHooks`, `getPodExecHookFromAnnotations`);
//! - the command is a JSON array, or one string taken as a one-word command (`parseStringToCommand`);
//! - the container defaults to the pod's first; a container the pod does not have is an error, and a pod
//!   that already ended runs nothing (`pkg/podexec/pod_command_executor.go` `ExecutePodCommand`);
//! - a failed hook fails the pod's item (the Backup ends PartiallyFailed) only when its on-error is
//!   `Fail` as written on the annotation: the handler compares the annotation's own value, so an absent
//!   one continues;
//! - `status.hookStatus.{hooksAttempted,hooksFailed}` count them (`pkg/backup/backup.go`).
//!
//! The simulator execs nothing: a command whose program is `false` (`/bin/false`) exits 1, every other
//! one succeeds. Each run is recorded in the audit log (`hook-exec`).

use std::sync::Arc;

use serde_json::{Value, json};

use crate::apiserver::meta::meta_str;
use crate::world::WorldContext;

/// What one phase's hooks did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HookOutcome {
    pub attempted: u64,
    pub failed: u64,
    /// Errors of hooks whose on-error is `Fail`: errors of the backup.
    pub errors: Vec<String>,
}

impl HookOutcome {
    pub fn add(&mut self, other: HookOutcome) {
        self.attempted += other.attempted;
        self.failed += other.failed;
        self.errors.extend(other.errors);
    }
}

fn annotation<'a>(pod: &'a Value, phase: &str, key: &str) -> Option<&'a str> {
    let name = if phase.is_empty() {
        format!("hook.backup.velero.io/{key}")
    } else {
        format!("{phase}.hook.backup.velero.io/{key}")
    };
    pod.pointer("/metadata/annotations")
        .and_then(|a| a.get(&name))
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())
}

fn command(value: &str) -> Vec<String> {
    if value.starts_with('[')
        && let Ok(parts) = serde_json::from_str::<Vec<String>>(value)
    {
        return parts;
    }
    vec![value.to_owned()]
}

/// The key prefix and command of `pod`'s `phase` hook: its own phase's keys, or for `pre` the unprefixed
/// ones when it has no pre hook (`HandleHooks`). None when it has none.
fn hook_command<'a>(pod: &'a Value, phase: &'a str) -> Option<(&'a str, &'a str)> {
    match annotation(pod, phase, "command") {
        Some(c) => Some((phase, c)),
        None if phase == "pre" => annotation(pod, "", "command").map(|c| ("", c)),
        None => None,
    }
}

/// Runs the `phase` (`pre` or `post`) hooks of `pods`.
pub fn run(ctx: &WorldContext, pods: &[Arc<Value>], phase: &str) -> HookOutcome {
    let mut out = HookOutcome::default();
    for pod in pods {
        let Some((key_phase, value)) = hook_command(pod, phase) else {
            continue;
        };
        let ns = meta_str(pod, "namespace").unwrap_or("");
        let name = meta_str(pod, "name").unwrap_or("");
        let pod_phase = pod.pointer("/status/phase").and_then(Value::as_str);
        if matches!(pod_phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let argv = command(value);
        let containers: Vec<&str> = pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("name").and_then(Value::as_str))
            .collect();
        let container = annotation(pod, key_phase, "container")
            .or(containers.first().copied())
            .unwrap_or("");
        out.attempted += 1;
        let error = if !containers.contains(&container) {
            Some(format!("no such container: {container:?}"))
        } else if pod_phase != Some("Running") {
            Some(format!("pod {ns}/{name} is not running"))
        } else if argv
            .first()
            .is_some_and(|p| p.rsplit('/').next() == Some("false"))
        {
            Some("command terminated with exit code 1".to_owned())
        } else {
            None
        };
        ctx.audit.world(
            "hook-exec",
            "pods",
            Some(ns),
            Some(name),
            json!({"phase": phase, "container": container, "command": argv, "error": error}),
        );
        if let Some(e) = error {
            out.failed += 1;
            if annotation(pod, key_phase, "on-error") == Some("Fail") {
                out.errors.push(format!(
                    "{phase} backup hook in pod {ns}/{name} container {container} failed: {e}"
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_array_is_the_argv_and_anything_else_one_word() {
        assert_eq!(
            command(r#"["/sbin/fsfreeze","--freeze","/data"]"#),
            ["/sbin/fsfreeze", "--freeze", "/data"]
        );
        assert_eq!(command("/bin/sync"), ["/bin/sync"]);
        assert_eq!(command("[broken"), ["[broken"]);
    }

    #[test]
    fn the_unprefixed_keys_are_pre_hooks_only() {
        let pod =
            json!({"metadata": {"annotations": {"hook.backup.velero.io/command": "/bin/sync"}}});
        assert_eq!(annotation(&pod, "", "command"), Some("/bin/sync"));
        assert_eq!(annotation(&pod, "post", "command"), None);
        assert_eq!(hook_command(&pod, "pre"), Some(("", "/bin/sync")));
        assert_eq!(hook_command(&pod, "post"), None);
        // A pre hook of its own wins over the unprefixed keys.
        let both = json!({"metadata": {"annotations": {"hook.backup.velero.io/command": "/bin/sync",
            "pre.hook.backup.velero.io/command": "/bin/true"}}});
        assert_eq!(hook_command(&both, "pre"), Some(("pre", "/bin/true")));
    }
}
