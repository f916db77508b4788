//! Release mode's hold steps: release the holds of exactly the pods a verified backup covers (and the
//! node's own hold once none of its pods is held), tell when those pods have left, and restore the holds
//! when the release window passes or the plan fails.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;

use crate::api::DisruptionPlan;
use crate::api::plan::BackupPolicy;
use crate::api::status::{BackupRecord, DisruptionPlanStatus, ReleasedPod};
use crate::controller::error::ControllerError;
use crate::controller::holds::{apply, ensure_node, holds_its_node};
use crate::controller::step::{Io, PlanView};
use crate::planning::holds;

/// The pods (namespace, name) whose holds may go: those of verified backups (under `best-effort`, of
/// every backup: the person accepted a drain without one).
pub fn covered(status: &DisruptionPlanStatus, policy: BackupPolicy) -> BTreeSet<(String, String)> {
    let best_effort = policy == BackupPolicy::BestEffort;
    status
        .backups
        .iter()
        .filter(|b| b.verified || best_effort)
        .flat_map(|b| b.pods.iter().map(|p| (b.namespace.clone(), p.clone())))
        .collect()
}

async fn get(io: &Io<'_>, namespace: &str, name: &str) -> Result<Option<Pod>, ControllerError> {
    let api: Api<Pod> = Api::namespaced(io.client.clone(), namespace);
    api.get_opt(name)
        .await
        .map_err(|source| ControllerError::Read {
            what: format!("pod {namespace}/{name}"),
            source,
        })
}

/// Releases the holds of the covered pods still on the plan's nodes, then the hold of each node none of
/// whose pods is held any more (Karpenter's drift honours only that one under a NodePool
/// terminationGracePeriod: [`crate::planning::holds`]). Returns the pods released (to record) and how
/// many holds this call changed.
pub async fn release_holds(
    v: &PlanView<'_>,
    io: &Io<'_>,
) -> Result<(Vec<ReleasedPod>, u64), ControllerError> {
    release_pods(v, io, covered(v.status, v.plan.spec.backup.policy)).await
}

/// Releases the holds of `pods` (namespace, name) still on the plan's nodes, then the hold of each node
/// none of whose pods is held any more. Returns the pods released and how many holds changed.
pub async fn release_pods(
    v: &PlanView<'_>,
    io: &Io<'_>,
    pods: BTreeSet<(String, String)>,
) -> Result<(Vec<ReleasedPod>, u64), ControllerError> {
    let nodes: BTreeSet<&str> = v.status.nodes.iter().map(|n| n.name.as_str()).collect();
    let plan = v.name();
    let mut released = Vec::new();
    let mut changed = 0;
    for (ns, name) in pods {
        let Some(pod) = get(io, &ns, &name).await? else {
            continue;
        };
        let on_node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| nodes.contains(n));
        if !on_node {
            continue;
        }
        if let Some(patch) = holds::release(&pod, &plan) {
            let done =
                apply(io.client, &pod, &patch)
                    .await
                    .map_err(|source| ControllerError::Hold {
                        pod: format!("{ns}/{name}"),
                        source,
                    })?;
            if !done {
                // Changed meanwhile (the hold keeper, a person): the next pass tries again.
                return Err(ControllerError::Changed(format!(
                    "pod {ns}/{name} changed while its hold was released; retrying"
                )));
            }
            changed += 1;
        }
        released.push(ReleasedPod {
            namespace: ns,
            name,
            uid: pod.uid().unwrap_or_default(),
        });
    }
    changed += release_nodes(io, &nodes, &released).await;
    Ok((released, changed))
}

/// Takes snapdrain's hold off each of `nodes` none of whose pods is held now, `released` counted as
/// released (the pod cache may not have seen those patches yet). Best effort: the hold keeper does the
/// same on its next look. Returns how many nodes changed.
async fn release_nodes(io: &Io<'_>, nodes: &BTreeSet<&str>, released: &[ReleasedPod]) -> u64 {
    let released: BTreeSet<(&str, &str)> = released
        .iter()
        .map(|p| (p.namespace.as_str(), p.name.as_str()))
        .collect();
    let mut changed = 0;
    for node in nodes {
        let needed = super::inventory::pods_on_node(io.caches, node)
            .iter()
            .filter(|p| {
                let (ns, name) = (p.namespace().unwrap_or_default(), p.name_any());
                !released.contains(&(ns.as_str(), name.as_str()))
            })
            .any(holds_its_node);
        if ensure_node(io.client, &io.caches.nodes, node, needed)
            .await
            .is_some()
        {
            changed += 1;
        }
    }
    changed
}

/// Whether `record` may stand for the data of a pod with `claims` in `namespace`: verified, covering every
/// claim, and started no earlier than `since` (the plan's decision, or its reuse window before now).
pub fn covers(
    record: &BackupRecord,
    namespace: &str,
    claims: &[String],
    since: jiff::Timestamp,
) -> bool {
    record.verified
        && record.namespace == namespace
        && claims.iter().all(|c| record.pvcs.contains(c))
        && record.started_at.as_ref().is_some_and(|t| t.0 >= since)
}

/// The backups a newcomer may be released on: only running plans', as the eviction gate counts them. A
/// pod released on a finished plan's backup was refused by the gate, and the disruptor and this plan
/// waited on each other for good (seen in the soak: a Release plan 90 minutes on "the Node is being
/// deleted").
pub fn newcomer_backups(plans: Vec<DisruptionPlan>) -> Vec<BackupRecord> {
    plans
        .into_iter()
        .filter(crate::webhook::decision::running)
        .filter_map(|p| p.status)
        .flat_map(|s| s.backups)
        .collect()
}

/// Protected pods that arrived on a released node after the plan's backup (a pod evicted from another
/// drained node, rescheduled here) are held by the hold keeper, so the disruptor could never take the node.
/// Each one whose PVCs a verified backup of any plan covers (started after this plan was decided, or
/// within its reuse window) is released too, as the backup a pod left its last node with stands for its
/// data. Returns the pods released now, and the pods still held that no backup covers (the plan then
/// makes way for a new run).
pub async fn release_newcomers(
    v: &PlanView<'_>,
    io: &Io<'_>,
    known: &[ReleasedPod],
) -> Result<(Vec<ReleasedPod>, Vec<String>), ControllerError> {
    let known: BTreeSet<(String, String)> = known
        .iter()
        .map(|p| (p.namespace.clone(), p.name.clone()))
        .collect();
    let mut newcomers = Vec::new();
    for node in &v.status.nodes {
        // From the pod cache's node index. A release patch carries the cached resourceVersion, so a
        // pod that changed since is not written (409) and is looked at again on the next pass.
        let on_node = super::inventory::pods_on_node(io.caches, &node.name);
        newcomers.extend(on_node.into_iter().filter(|p| {
            matches!(holds::state(p), holds::HoldState::Held(_))
                && !known.contains(&(p.namespace().unwrap_or_default(), p.name_any()))
                && !crate::planning::inventory::is_terminating(p)
        }));
    }
    if newcomers.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let decided = v.clock().decided_at;
    let since = match v.valid.reuse_if_newer_than {
        Some(window) => decided.min(v.now - window),
        None => decided,
    };
    // Decoded one by one: a plan snapdrain cannot read offers no backup.
    let plans: Vec<DisruptionPlan> =
        crate::api::lenient::list_decoded(io.client)
            .await
            .map_err(|source| ControllerError::Read {
                what: "DisruptionPlans (for backups of pods new on a released node)".into(),
                source,
            })?;
    let records = newcomer_backups(plans);
    let plan = v.name();
    let (mut released, mut uncovered) = (Vec::new(), Vec::new());
    for pod in newcomers {
        let ns = pod.namespace().unwrap_or_default();
        let claims: Vec<String> = crate::planning::inventory::pvc_claims(&pod)
            .map(str::to_owned)
            .collect();
        if !records.iter().any(|r| covers(r, &ns, &claims, since)) {
            uncovered.push(format!("{ns}/{}", pod.name_any()));
            continue;
        }
        if let Some(patch) = holds::release(&pod, &plan)
            && apply(io.client, &pod, &patch)
                .await
                .map_err(|source| ControllerError::Hold {
                    pod: format!("{ns}/{}", pod.name_any()),
                    source,
                })?
        {
            released.push(ReleasedPod {
                namespace: ns,
                name: pod.name_any(),
                uid: pod.uid().unwrap_or_default(),
            });
        }
    }
    if !released.is_empty() {
        let nodes: BTreeSet<&str> = v.status.nodes.iter().map(|n| n.name.as_str()).collect();
        release_nodes(io, &nodes, &released).await;
    }
    Ok((released, uncovered))
}

/// True when every released pod has left its node: gone, replaced (another uid) or moved. Read from the
/// pod cache (a lagging cache only says "still there" a moment longer), confirmed by the API before it
/// says "all gone", which completes the plan.
pub async fn released_pods_gone(
    released: &[ReleasedPod],
    io: &Io<'_>,
) -> Result<bool, ControllerError> {
    if released.is_empty() {
        return Ok(false);
    }
    let still = |found: Option<String>, uid: &str| found.as_deref() == Some(uid);
    for p in released {
        let cached = io.caches.pods.get(&p.namespace, &p.name);
        if still(
            cached.and_then(|c| c.uid().map(std::borrow::Cow::into_owned)),
            &p.uid,
        ) {
            return Ok(false);
        }
    }
    for p in released {
        if still(
            get(io, &p.namespace, &p.name).await?.and_then(|c| c.uid()),
            &p.uid,
        ) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Puts the holds back on the released pods that are still there (the same uid), and on their nodes.
/// Best effort per pod: the hold keeper restores whatever this misses once the plan is over. Returns how
/// many pods came back.
pub async fn restore_holds(released: &[ReleasedPod], io: &Io<'_>) -> usize {
    // The policy's CA hold; before the policy is read, the default's (the hold keeper corrects it).
    let ca = io
        .policy
        .as_ref()
        .map(|p| p.holds.cluster_autoscaler)
        .unwrap_or_default();
    let mut restored = 0;
    let mut nodes = BTreeSet::new();
    for p in released {
        let pod = match get(io, &p.namespace, &p.name).await {
            Ok(Some(pod)) if pod.uid().as_deref() == Some(p.uid.as_str()) => pod,
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a released pod to restore its hold");
                continue;
            }
        };
        let Some(patch) = holds::restore(&pod, ca) else {
            continue;
        };
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            nodes.insert(node);
        }
        match apply(io.client, &pod, &patch).await {
            Ok(true) => restored += 1,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(pod = %p.name, error = %e, "cannot restore a hold; the hold keeper will")
            }
        }
    }
    // A restored pod is held again, so its node is too.
    for node in &nodes {
        ensure_node(io.client, &io.caches.nodes, node, true).await;
    }
    restored
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn record(verified: bool, started: &str) -> BackupRecord {
        BackupRecord {
            namespace: "apps".into(),
            pvcs: vec!["data-pg-1".into(), "logs-pg-1".into()],
            verified,
            started_at: Some(Time(started.parse().expect("valid"))),
            ..BackupRecord::default()
        }
    }

    fn plan(
        name: &str,
        phase: crate::api::status::PlanPhase,
        backup: BackupRecord,
    ) -> DisruptionPlan {
        let mut p: DisruptionPlan = serde_json::from_value(serde_json::json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": name}, "spec": {"nodes": ["n1"], "mode": "Release"}
        }))
        .expect("a plan");
        p.status = Some(DisruptionPlanStatus {
            phase,
            backups: vec![backup],
            ..Default::default()
        });
        p
    }

    /// fcc0a93: released on a finished plan's backup, a newcomer was refused by the gate (which counts
    /// running plans only) and the disruptor and the plan waited on each other for good.
    #[test]
    fn a_finished_plans_backup_releases_no_newcomer() {
        use crate::api::status::PlanPhase;
        let fresh = "2026-12-01T10:05:00Z";
        let plans = vec![
            plan("done", PlanPhase::Completed, record(true, fresh)),
            plan("failed", PlanPhase::Failed, record(true, fresh)),
            plan("running", PlanPhase::Draining, record(false, fresh)),
        ];
        let records = newcomer_backups(plans);
        assert_eq!(
            records.len(),
            1,
            "only the running plan's record: {records:?}"
        );
        assert!(!records[0].verified);
        let mut leaving = plan("leaving", PlanPhase::Draining, record(true, fresh));
        leaving.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        assert!(
            newcomer_backups(vec![leaving]).is_empty(),
            "a plan being deleted"
        );
    }

    #[test]
    fn a_newcomer_is_covered_only_by_a_verified_fresh_backup_of_all_its_claims() {
        let since: jiff::Timestamp = "2026-12-01T10:00:00Z".parse().expect("valid");
        let claims = vec!["data-pg-1".to_string()];
        assert!(covers(
            &record(true, "2026-12-01T10:05:00Z"),
            "apps",
            &claims,
            since
        ));
        assert!(!covers(
            &record(false, "2026-12-01T10:05:00Z"),
            "apps",
            &claims,
            since
        ));
        assert!(!covers(
            &record(true, "2026-12-01T09:55:00Z"),
            "apps",
            &claims,
            since
        ));
        assert!(!covers(
            &record(true, "2026-12-01T10:05:00Z"),
            "shop",
            &claims,
            since
        ));
        let more = vec!["data-pg-1".to_string(), "wal-pg-1".to_string()];
        assert!(!covers(
            &record(true, "2026-12-01T10:05:00Z"),
            "apps",
            &more,
            since
        ));
    }
}
