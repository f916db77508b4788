//! Release mode's hold steps: release the holds of exactly the pods a verified backup covers, tell when
//! those pods have left, and restore the holds when the release window passes or the plan fails.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;

use crate::api::DisruptionPlan;
use crate::api::plan::BackupPolicy;
use crate::api::status::{BackupRecord, ReleasedPod};
use crate::controller::error::ControllerError;
use crate::controller::holds::apply;
use crate::controller::reconcile::PlanRun;
use crate::planning::holds;

/// The pods (namespace, name) whose holds may go: those of verified backups (under `best-effort`, of
/// every backup: the person accepted a drain without one).
fn covered(run: &PlanRun) -> BTreeSet<(String, String)> {
    let best_effort = run.plan.spec.backup.policy == BackupPolicy::BestEffort;
    run.status
        .backups
        .iter()
        .filter(|b| b.verified || best_effort)
        .flat_map(|b| b.pods.iter().map(|p| (b.namespace.clone(), p.clone())))
        .collect()
}

async fn get(run: &PlanRun, namespace: &str, name: &str) -> Result<Option<Pod>, ControllerError> {
    let api: Api<Pod> = Api::namespaced(run.ctx.client.clone(), namespace);
    api.get_opt(name)
        .await
        .map_err(|source| ControllerError::Read {
            what: format!("pod {namespace}/{name}"),
            source,
        })
}

/// Releases the holds of the covered pods still on the plan's nodes, once; records them and the time.
pub async fn release_holds(run: &mut PlanRun) -> Result<(), ControllerError> {
    if run.status.released_at.is_some() {
        return Ok(());
    }
    let nodes: BTreeSet<String> = run.status.nodes.iter().map(|n| n.name.clone()).collect();
    let plan = run.name();
    let mut released = Vec::new();
    for (ns, name) in covered(run) {
        let Some(pod) = get(run, &ns, &name).await? else {
            continue;
        };
        let on_node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some_and(|n| nodes.contains(n));
        if !on_node {
            continue;
        }
        if let Some(patch) = holds::release(&pod, &plan) {
            let done = apply(&run.ctx.client, &pod, &patch)
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
            run.ctx.metrics.hold_change("released");
        }
        released.push(ReleasedPod {
            namespace: ns,
            name,
            uid: pod.uid().unwrap_or_default(),
        });
    }
    let count = released.len();
    run.status.released_pods = released;
    run.status.released_at = Some(Time(PlanRun::now()));
    run.event(
        EventType::Normal,
        "HoldsReleased",
        "Release",
        format!(
            "released the holds of {count} pod(s) whose backups are verified; the disruptor may now drain {}",
            nodes.into_iter().collect::<Vec<_>>().join(", ")
        ),
    )
    .await;
    Ok(())
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

/// Protected pods that arrived on a released node after the plan's backup (a pod evicted from another
/// drained node, rescheduled here) are held by the hold keeper, so the disruptor could never take the node.
/// Each one whose PVCs a verified backup of any plan covers (started after this plan was decided, or
/// within its reuse window) is released too, as the backup a pod left its last node with stands for its
/// data. Returns the pods still held that no backup covers: the plan then makes way for a new run.
pub async fn release_newcomers(run: &mut PlanRun) -> Result<Vec<String>, ControllerError> {
    let nodes: BTreeSet<String> = run.status.nodes.iter().map(|n| n.name.clone()).collect();
    let known: BTreeSet<(String, String)> = run
        .status
        .released_pods
        .iter()
        .map(|p| (p.namespace.clone(), p.name.clone()))
        .collect();
    let caches = run.ctx.synced_caches().await?.clone();
    let mut newcomers = Vec::new();
    for node in &nodes {
        // From the pod cache's node index. A release patch carries the cached resourceVersion, so a
        // pod that changed since is not written (409) and is looked at again on the next pass.
        let on_node = super::inventory::pods_on_node(&caches, node);
        newcomers.extend(on_node.into_iter().filter(|p| {
            matches!(holds::state(p), holds::HoldState::Held(_))
                && !known.contains(&(p.namespace().unwrap_or_default(), p.name_any()))
                && !crate::planning::inventory::is_terminating(p)
        }));
    }
    if newcomers.is_empty() {
        return Ok(Vec::new());
    }
    let now = PlanRun::now();
    let decided = run.status.decided_at.as_ref().map_or(now, |t| t.0);
    let since = match run.valid.reuse_if_newer_than {
        Some(window) => decided.min(now - window),
        None => decided,
    };
    // Decoded one by one: a plan snapdrain cannot read offers no backup.
    let plans: Vec<DisruptionPlan> = crate::api::lenient::list_decoded(&run.ctx.client)
        .await
        .map_err(|source| ControllerError::Read {
            what: "DisruptionPlans (for backups of pods new on a released node)".into(),
            source,
        })?;
    let records: Vec<BackupRecord> = plans
        .into_iter()
        .filter_map(|p| p.status)
        .flat_map(|s| s.backups)
        .collect();
    let plan = run.name();
    let mut uncovered = Vec::new();
    for pod in newcomers {
        let ns = pod.namespace().unwrap_or_default();
        let claims: Vec<String> = crate::planning::inventory::pvc_claims(&pod)
            .map(str::to_owned)
            .collect();
        let covered = records.iter().any(|r| covers(r, &ns, &claims, since));
        if !covered {
            uncovered.push(format!("{ns}/{}", pod.name_any()));
            continue;
        }
        if let Some(patch) = holds::release(&pod, &plan)
            && apply(&run.ctx.client, &pod, &patch)
                .await
                .map_err(|source| ControllerError::Hold {
                    pod: format!("{ns}/{}", pod.name_any()),
                    source,
                })?
        {
            run.ctx.metrics.hold_change("released");
            run.status.released_pods.push(ReleasedPod {
                namespace: ns,
                name: pod.name_any(),
                uid: pod.uid().unwrap_or_default(),
            });
        }
    }
    Ok(uncovered)
}

/// True when every released pod has left its node: gone, replaced (another uid) or moved. Read from the
/// pod cache (a lagging cache only says "still there" a moment longer), confirmed by the API before it
/// says "all gone", which completes the plan.
pub async fn released_pods_gone(run: &PlanRun) -> Result<bool, ControllerError> {
    if run.status.released_pods.is_empty() {
        return Ok(false);
    }
    let caches = run.ctx.synced_caches().await?;
    let still = |found: Option<String>, uid: &str| found.as_deref() == Some(uid);
    for p in &run.status.released_pods {
        let cached = caches.pods.get(&p.namespace, &p.name);
        if still(cached.and_then(|c| c.uid().map(str::to_owned)), &p.uid) {
            return Ok(false);
        }
    }
    for p in &run.status.released_pods {
        if still(
            get(run, &p.namespace, &p.name).await?.and_then(|c| c.uid()),
            &p.uid,
        ) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Puts the holds back on the released pods that are still there (the same uid). Best effort per pod:
/// the hold keeper restores whatever this misses once the plan is over.
pub async fn restore_holds(run: &mut PlanRun) -> usize {
    let mut restored = 0;
    for p in run.status.released_pods.clone() {
        let pod = match get(run, &p.namespace, &p.name).await {
            Ok(Some(pod)) if pod.uid().as_deref() == Some(p.uid.as_str()) => pod,
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!(plan = %run.name(), error = %e, "cannot read a released pod to restore its hold");
                continue;
            }
        };
        let Some(patch) = holds::restore(&pod) else {
            continue;
        };
        match apply(&run.ctx.client, &pod, &patch).await {
            Ok(true) => {
                restored += 1;
                run.ctx.metrics.hold_change("restored");
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(plan = %run.name(), pod = %p.name, error = %e, "cannot restore a hold; the hold keeper will")
            }
        }
    }
    restored
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(verified: bool, started: &str) -> BackupRecord {
        BackupRecord {
            namespace: "apps".into(),
            pvcs: vec!["data-pg-1".into(), "logs-pg-1".into()],
            verified,
            started_at: Some(Time(started.parse().expect("valid"))),
            ..BackupRecord::default()
        }
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
