//! Backup exec hooks, as Velero reads and runs them (velero `internal/hook/item_hook_handler.go`
//! `DefaultItemHookHandler.HandleHooks`, once per pod and phase):
//! - from pod annotations: `pre.hook.backup.velero.io/{command,container,on-error,timeout}` before the
//!   pod's volumes are copied or snapshotted, `post.hook.backup.velero.io/...` after; the unprefixed
//!   `hook.backup.velero.io/...` keys count as pre hooks when no pre hook is set
//!   (`getPodExecHookFromAnnotations`); the command is a JSON array, or one string taken as a one-word
//!   command (`parseStringToCommand`);
//! - a pod with an annotation hook for the phase runs that hook INSTEAD of the Backup's
//!   `spec.hooks.resources` ("If the pod has the hook specified via annotations, that takes priority":
//!   `HandleHooks` returns right after it). The choice is per phase: a pod annotated with a pre hook
//!   only still runs the spec's post hooks;
//! - otherwise every `spec.hooks.resources[]` entry that applies to the pod (`ResourceHookSelector.
//!   applicableTo`: `includedNamespaces`/`excludedNamespaces`, empty meaning all; the resources, of
//!   which only pods run hooks; `labelSelector` against the pod's labels), in order, runs its `pre` or
//!   `post` exec hooks in order. A failed hook whose `onError` is `Fail` stops the pod's later spec
//!   hooks of that phase: they are still counted as attempted (`hookTracker.Add`) but not run
//!   (`modeFailError`), and the pod's item fails;
//! - the container defaults to the pod's first; a container the pod does not have is an error, and a pod
//!   that already ended runs nothing (`pkg/podexec/pod_command_executor.go` `ExecutePodCommand`);
//! - a failed hook fails the pod's item (the Backup ends PartiallyFailed) only when its on-error is
//!   `Fail` as written (annotation or spec): an absent one continues;
//! - `status.hookStatus.hooksAttempted` counts every hook added to the tracker and `hooksFailed` every
//!   one that ran and failed (`internal/hook/hook_tracker.go` `Add`, `Record`, `Stat`;
//!   `pkg/backup/backup.go`).
//!
//! The simulator execs nothing: a command whose program is `false` (`/bin/false`) exits 1, every other
//! one succeeds. Each run is recorded in the audit log (`hook-exec`, with its `source`: `annotation` or
//! `spec` and the spec entry's `hook` name).

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

/// Runs the `phase` (`pre` or `post`) hooks of `pods` for a Backup whose `spec.hooks.resources` is
/// `spec_hooks` (`Value::Null` when it has none).
pub fn run(
    ctx: &WorldContext,
    pods: &[Arc<Value>],
    spec_hooks: &Value,
    phase: &str,
) -> HookOutcome {
    let resources: &[Value] = spec_hooks.as_array().map_or(&[], Vec::as_slice);
    let mut out = HookOutcome::default();
    for pod in pods {
        if matches!(
            pod.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        ) {
            continue;
        }
        if let Some((key_phase, value)) = hook_command(pod, phase) {
            let hook = Exec {
                container: annotation(pod, key_phase, "container"),
                argv: command(value),
                fail_on_error: annotation(pod, key_phase, "on-error") == Some("Fail"),
                source: "annotation",
                name: "",
            };
            out.attempted += 1;
            if let Some(e) = exec(ctx, pod, &hook, phase) {
                out.failed += 1;
                if hook.fail_on_error {
                    out.errors.push(e);
                }
            }
            continue;
        }
        let mut stopped = false;
        for resource in resources.iter().filter(|r| applies_to(r, pod)) {
            let name = resource.get("name").and_then(Value::as_str).unwrap_or("");
            let hooks = resource
                .get(phase)
                .and_then(Value::as_array)
                .map_or(&[][..], Vec::as_slice);
            for exec_hook in hooks.iter().filter_map(|h| h.get("exec")) {
                out.attempted += 1;
                if stopped {
                    continue;
                }
                let hook = Exec {
                    container: exec_hook
                        .get("container")
                        .and_then(Value::as_str)
                        .filter(|c| !c.is_empty()),
                    argv: exec_hook
                        .get("command")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_owned)
                                .collect()
                        })
                        .unwrap_or_default(),
                    fail_on_error: exec_hook.get("onError").and_then(Value::as_str) == Some("Fail"),
                    source: "spec",
                    name,
                };
                if let Some(e) = exec(ctx, pod, &hook, phase) {
                    out.failed += 1;
                    if hook.fail_on_error {
                        out.errors.push(e);
                        stopped = true;
                    }
                }
            }
        }
    }
    out
}

/// One exec hook to run in a pod.
struct Exec<'a> {
    container: Option<&'a str>,
    argv: Vec<String>,
    fail_on_error: bool,
    /// `annotation` or `spec`.
    source: &'a str,
    /// The spec entry's name ("" for an annotation hook).
    name: &'a str,
}

/// Runs `hook` in `pod` (recorded in the audit log); the error, worded as the Backup reports it.
fn exec(ctx: &WorldContext, pod: &Value, hook: &Exec<'_>, phase: &str) -> Option<String> {
    let ns = meta_str(pod, "namespace").unwrap_or("");
    let name = meta_str(pod, "name").unwrap_or("");
    let containers: Vec<&str> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect();
    let container = hook.container.or(containers.first().copied()).unwrap_or("");
    let error = if !containers.contains(&container) {
        Some(format!("no such container: {container:?}"))
    } else if pod.pointer("/status/phase").and_then(Value::as_str) != Some("Running") {
        Some(format!("pod {ns}/{name} is not running"))
    } else if hook.argv.is_empty() {
        Some("empty command".to_owned())
    } else if hook
        .argv
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
        json!({"phase": phase, "container": container, "command": hook.argv, "error": error,
               "source": hook.source, "hook": hook.name}),
    );
    error.map(|e| {
        format!("{phase} backup hook in pod {ns}/{name} container {container} failed: {e}")
    })
}

/// `ResourceHookSelector.applicableTo` for a pod: the entry's namespaces (`IncludesExcludes`: empty or
/// `*` includes all, an exclusion wins), its resources (Velero resolves names through discovery; pods
/// are `pods`, `pod` or `po`) and its label selector (an invalid one selects nothing: Velero fails the
/// whole Backup on it in `getResourceHook`, which the simulator does not model).
fn applies_to(resource: &Value, pod: &Value) -> bool {
    let list = |key: &str| -> Vec<&str> {
        resource
            .get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    };
    let ns = meta_str(pod, "namespace").unwrap_or("");
    let included = list("includedNamespaces");
    if !(included.is_empty() || included.contains(&"*") || included.contains(&ns))
        || list("excludedNamespaces").contains(&ns)
    {
        return false;
    }
    let is_pods = |r: &&str| matches!(*r, "pods" | "pod" | "po" | "*");
    let resources = list("includedResources");
    if !(resources.is_empty() || resources.iter().any(is_pods))
        || list("excludedResources").iter().any(is_pods)
    {
        return false;
    }
    match resource.get("labelSelector").filter(|s| !s.is_null()) {
        None => true,
        Some(sel) => {
            crate::apiserver::label_selector::matches(sel, pod.pointer("/metadata/labels"))
                .unwrap_or(false)
        }
    }
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

    fn test_context() -> WorldContext {
        WorldContext::new(
            crate::apiserver::store::Store::new(),
            Arc::new(crate::apiserver::audit::Audit::default()),
            Arc::new(crate::apiserver::faults::Faults::default()),
            crate::world::Timings::default(),
        )
    }

    fn pod(ns: &str, labels: Value, annotations: Value) -> Arc<Value> {
        Arc::new(
            json!({"metadata": {"namespace": ns, "name": "pg-0", "labels": labels,
                                     "annotations": annotations},
                        "spec": {"containers": [{"name": "postgres"}, {"name": "exporter"}]},
                        "status": {"phase": "Running"}}),
        )
    }

    fn freeze() -> Value {
        json!([{"name": "pg-freeze", "includedNamespaces": ["db"],
                "labelSelector": {"matchLabels": {"app": "postgres"}},
                "pre": [{"exec": {"container": "postgres", "command": ["/sbin/fsfreeze", "--freeze", "/data"]}}],
                "post": [{"exec": {"container": "postgres", "command": ["/sbin/fsfreeze", "--unfreeze", "/data"]}}]}])
    }

    /// `ResourceHookSelector.applicableTo` (velero `internal/hook/item_hook_handler.go`): namespaces,
    /// resources and the label selector all narrow.
    #[test]
    fn a_spec_hook_applies_to_pods_of_its_namespaces_and_labels() {
        let entry = &freeze()[0];
        let pg = pod("db", json!({"app": "postgres"}), json!({}));
        assert!(applies_to(entry, &pg));
        assert!(!applies_to(
            entry,
            &pod("shop", json!({"app": "postgres"}), json!({}))
        ));
        assert!(!applies_to(
            entry,
            &pod("db", json!({"app": "redis"}), json!({}))
        ));
        let everywhere = json!({"name": "all"});
        assert!(applies_to(&everywhere, &pg), "empty lists include all");
        assert!(!applies_to(&json!({"excludedNamespaces": ["db"]}), &pg));
        assert!(!applies_to(
            &json!({"includedResources": ["deployments"]}),
            &pg
        ));
        assert!(applies_to(&json!({"includedResources": ["pods"]}), &pg));
    }

    /// "If the pod has the hook specified via annotations, that takes priority" (`HandleHooks`): per
    /// phase, so a pod annotated with a pre hook only still runs the spec's post hook.
    #[test]
    fn a_pods_own_annotation_replaces_the_spec_hooks_of_that_phase_only() {
        let ctx = test_context();
        let own = pod(
            "db",
            json!({"app": "postgres"}),
            json!({"pre.hook.backup.velero.io/command": "/bin/sync"}),
        );
        let pre = run(&ctx, std::slice::from_ref(&own), &freeze(), "pre");
        assert_eq!((pre.attempted, pre.failed), (1, 0));
        let post = run(&ctx, std::slice::from_ref(&own), &freeze(), "post");
        assert_eq!((post.attempted, post.failed), (1, 0));
        let ran: Vec<(String, String)> = ctx
            .audit
            .since(0)
            .iter()
            .filter(|e| e.verb == "hook-exec")
            .map(|e| {
                (
                    e.detail["source"].as_str().unwrap_or("").to_owned(),
                    e.detail["command"][0].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect();
        assert_eq!(
            ran,
            [
                ("annotation".to_owned(), "/bin/sync".to_owned()),
                ("spec".to_owned(), "/sbin/fsfreeze".to_owned())
            ]
        );
    }

    /// `modeFailError`: after a spec hook with `onError: Fail` fails, the pod's later spec hooks of the
    /// phase are counted (`hookTracker.Add`) but not run; a failing `Continue` hook only counts.
    #[test]
    fn a_failing_spec_hook_with_on_error_fail_stops_the_pods_later_hooks() {
        let ctx = test_context();
        let hooks = json!([
            {"name": "a", "pre": [{"exec": {"command": ["/bin/false"]}},
                                  {"exec": {"command": ["/bin/false"], "onError": "Fail"}},
                                  {"exec": {"command": ["/bin/sync"]}}]},
            {"name": "b", "pre": [{"exec": {"command": ["/bin/sync"]}}]}
        ]);
        let pg = pod("db", json!({}), json!({}));
        let out = run(&ctx, std::slice::from_ref(&pg), &hooks, "pre");
        assert_eq!((out.attempted, out.failed), (4, 2));
        assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
        assert!(out.errors[0].contains("pre backup hook in pod db/pg-0 container postgres failed"));
        let executed = ctx
            .audit
            .since(0)
            .iter()
            .filter(|e| e.verb == "hook-exec")
            .count();
        assert_eq!(executed, 2, "the hooks after the Fail are not run");
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
