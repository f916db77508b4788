//! Release mode's hold steps: release the holds of exactly the pods a verified backup covers, tell when
//! those pods have left, and restore the holds when the release window passes or the plan fails.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;

use crate::api::plan::BackupPolicy;
use crate::api::status::ReleasedPod;
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
                return Err(ControllerError::Config(format!(
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

/// True when every released pod has left its node: gone, replaced (another uid) or moved.
pub async fn released_pods_gone(run: &PlanRun) -> Result<bool, ControllerError> {
    if run.status.released_pods.is_empty() {
        return Ok(false);
    }
    for p in &run.status.released_pods {
        if let Some(pod) = get(run, &p.namespace, &p.name).await?
            && pod.uid().as_deref() == Some(p.uid.as_str())
        {
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
