//! What a DisruptionPlan for a node would do, computed from the cluster without changing anything
//! (`snapdrain plan NODE`): the same inventory and pure planning the controller runs at the Pending step,
//! after the same DisruptionPolicy check (node cap and launch rules, `planning::launch_policy`), so a
//! plan the policy would refuse shows the refusal it would get instead of a plan that cannot run.

use std::fmt::Write as _;

use kube::api::Api;

use super::error::ControllerError;
use super::steps::inventory::listed_inventory;
use crate::api::{
    DEFAULT_POLICY, DisruptionPlanSpec, DisruptionPolicy, DisruptionPolicySpec, problems_message,
    validate,
};
use crate::planning::launch_policy;
use crate::planning::{Clock, SkipReason, plan_node};

/// The policy a plan created now would be judged by: the cluster's `default`, else (none stored) the
/// built-in defaults the controller creates it with.
async fn policy_in_force(client: &kube::Client) -> Result<DisruptionPolicySpec, ControllerError> {
    let api: Api<DisruptionPolicy> = Api::all(client.clone());
    match api.get_opt(DEFAULT_POLICY).await {
        Ok(Some(p)) => Ok(p.spec),
        Ok(None) => Ok(DisruptionPolicySpec::defaults()),
        Err(e) => Err(ControllerError::Config(format!(
            "cannot read DisruptionPolicy {DEFAULT_POLICY}, which decides whether such a plan may run: {e} (you need get on disruptionpolicies.snapdrain.io)"
        ))),
    }
}

/// A human-readable preview of a plan for `node` with `spec` (its `nodes` are ignored).
pub async fn describe(
    client: &kube::Client,
    node: &str,
    spec: &DisruptionPlanSpec,
) -> Result<String, ControllerError> {
    let valid = validate(spec).map_err(|p| {
        ControllerError::Config(format!("invalid plan spec: {}", problems_message(&p)))
    })?;
    let policy = policy_in_force(client).await?;
    // The preview is of one node (the spec's `nodes` are ignored).
    let problems = launch_policy::check_plan(spec, &policy, 1);
    if !problems.is_empty() {
        return Ok(format!(
            "Refused: a DisruptionPlan with this spec would be marked invalid (reason RefusedByPolicy) before any node is touched: {}\n",
            launch_policy::refusal_message(&problems)
        ));
    }
    let mut inv = listed_inventory(client, node).await?.ok_or_else(|| {
        ControllerError::Config(format!(
            "node {node} does not exist; list nodes with `kubectl get nodes`"
        ))
    })?;
    inv.read_volumes(client).await?;
    inv.read_snapshot_classes(client).await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    // The namespaces' labels for the policy's namespaceSelector; without them (no list permission) the
    // preview protects more, as the gate does.
    let labels: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>> =
        kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .list(&Default::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .map(|n| {
                        let name = n.metadata.name.unwrap_or_default();
                        (name, n.metadata.labels.unwrap_or_default())
                    })
                    .collect()
            })
            .unwrap_or_default();
    let protects = |pod: &k8s_openapi::api::core::v1::Pod| {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        crate::planning::protection::protects_or_more(&policy.protection, pod, labels.get(ns))
    };
    let inputs = inv.inputs(&[], &protects);
    let plan = plan_node(
        &inputs,
        spec,
        &valid,
        Clock {
            decided_at: now,
            now,
        },
    );
    let mut plan = plan;
    let rate = crate::planning::estimate::Rate {
        mib_per_second: crate::planning::estimate::DEFAULT_MIB_PER_SECOND,
        overhead: crate::planning::estimate::DEFAULT_OVERHEAD,
    };
    for b in &mut plan.backups {
        crate::planning::estimate::annotate(
            b.volumes.iter_mut().map(|v| &mut v.record),
            inputs.pvs,
            rate,
        );
    }
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "Node {node} (instance {})",
        plan.instance_id
            .as_deref()
            .unwrap_or("unknown: no aws:/// providerID")
    );
    let _ = writeln!(
        out,
        "Backups first (Velero, location {} in namespace {}, method {:?}):",
        spec.backup
            .storage_location
            .as_deref()
            .unwrap_or("(Velero's default)"),
        spec.backup.velero_namespace,
        spec.backup.method
    );
    if plan.backups.is_empty() {
        let _ = writeln!(
            out,
            "  none needed: no protected pods (StatefulSet pods with PVCs) on this node"
        );
    }
    let warm = scheduled_backups(client, &spec.backup.velero_namespace).await;
    for b in &plan.backups {
        let _ = writeln!(
            out,
            "  namespace {}: StatefulSets {}; PVCs {}; pods {}",
            b.namespace,
            b.stateful_sets.join(", "),
            b.pvcs.join(", "),
            b.pods.join(", ")
        );
        for v in &b.volumes {
            let _ = writeln!(out, "    {}", volume_line(v));
        }
        if let Some(w) = crate::planning::warm::latest_warm(&b.namespace, &warm, now) {
            let _ = writeln!(
                out,
                "    warm backup {} Completed {} ago: the namespace's volumes are already in Velero's repository, so this copy moves only what changed since (nothing in the cluster says how much: the times above stay upper bounds)",
                w.name,
                crate::planning::warm::age(w.completed_at, now)
            );
        }
        let hooks =
            crate::planning::backup_hooks::hooks_for_namespace(&policy.backup_hooks, &b.namespace);
        if !hooks.is_empty() {
            let _ = writeln!(
                out,
                "    policy backup hooks (Velero runs them; a pod's own hook annotations run instead): {}",
                crate::planning::backup_hooks::describe(&hooks).join(", ")
            );
        }
    }
    let order = if spec.mode == crate::api::plan::PlanMode::Execute {
        "Evict in this order (the node is cordoned and tainted snapdrain.io/draining:NoSchedule before the \
         backup; evictions start once every backup is verified in the bucket):"
    } else {
        "Release mode: the drainer the plan releases to evicts, in Karpenter's order:"
    };
    let _ = writeln!(out, "{order}");
    for (i, e) in plan.evictions.iter().enumerate() {
        let mut line = format!("  {:>3}. {}/{}  {:?}", i + 1, e.namespace, e.name, e.tier);
        if e.do_not_disrupt {
            line.push_str("  held: karpenter.sh/do-not-disrupt");
        }
        if e.protected {
            line.push_str("  protected");
        }
        if !e.pdbs.is_empty() {
            line.push_str(&format!("  PDB {}", e.pdbs.join(", ")));
        }
        let _ = writeln!(out, "{line}");
    }
    if !plan.skipped.is_empty() {
        let _ = writeln!(out, "Left alone:");
        for s in &plan.skipped {
            let why = match s.reason {
                SkipReason::Terminal => "finished",
                SkipReason::Mirror => "static pod mirror",
                SkipReason::DaemonSet => "DaemonSet (ignoreDaemonSets)",
                SkipReason::NotSelected => "not selected by drain.podSelector",
                SkipReason::ToleratesDrainTaint => {
                    "tolerates the snapdrain.io/draining taint (would come straight back)"
                }
            };
            let _ = writeln!(out, "  {}/{}  {why}", s.namespace, s.name);
        }
    }
    if let Some(refusal) = plan.refusal_message() {
        let _ = writeln!(out, "Refused: {refusal}");
    }
    for w in &plan.warnings {
        let _ = writeln!(out, "Warning: {w}");
    }
    Ok(out)
}

/// The Backups Velero Schedules made in `velero_namespace` (labelled `velero.io/schedule-name`), for
/// the warm-backup line; none when they cannot be read (the preview runs with its user's rights).
async fn scheduled_backups(
    client: &kube::Client,
    velero_namespace: &str,
) -> Vec<crate::api::velero::Backup> {
    let api: Api<crate::api::velero::Backup> = Api::namespaced(client.clone(), velero_namespace);
    let lp = kube::api::ListParams::default().labels(crate::planning::warm::SCHEDULE_NAME_LABEL);
    match api.list(&lp).await {
        Ok(l) => l.items,
        Err(e) => {
            tracing::debug!(error = %e, "preview: cannot list scheduled Backups");
            Vec::new()
        }
    }
}

/// One volume of a backup: `PVC data-0 (PV pv-1): NodeLocal, local: a local PersistentVolume ...; method
/// FileSystem`, and what the per-volume `Auto` choice would take when it differs.
fn volume_line(v: &crate::planning::backups::PlannedVolume) -> String {
    let r = &v.record;
    let pv =
        r.pv.as_deref()
            .map(|p| format!(" (PV {p})"))
            .unwrap_or_default();
    let source = r
        .source
        .as_deref()
        .map(|s| format!(", {s}"))
        .unwrap_or_default();
    let class = r
        .snapshot_class
        .as_deref()
        .map(|c| format!(" with VolumeSnapshotClass {c}"))
        .unwrap_or_default();
    let mut line = format!(
        "PVC {}{pv}: {:?}{source} ({}); method {:?}{class}",
        r.pvc, r.class, r.reason, r.method
    );
    if v.auto_method != r.method {
        line.push_str(&format!(
            " (the fastest safe method for it would be {:?})",
            v.auto_method
        ));
    }
    if let (Some(bytes), Some(secs)) = (r.size_bytes, r.expected_seconds) {
        line.push_str(&format!(
            "; {:.1} GiB, about {secs}s to copy at {} MiB/s (the controller's default rate; a later backup moves only what changed)",
            bytes as f64 / (1u64 << 30) as f64,
            crate::planning::estimate::DEFAULT_MIB_PER_SECOND
        ));
    }
    line.push_str(match r.release_at {
        crate::api::plan::ReleasePoint::Snapshot => "; its pod may go at the CSI snapshot",
        crate::api::plan::ReleasePoint::Verified => "; its pod goes once the backup is verified",
    });
    line
}
