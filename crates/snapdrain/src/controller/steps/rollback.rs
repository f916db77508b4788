//! Undo on failure or abort: restore released holds; remove snapdrain's drain taint and uncordon, only
//! where snapdrain set them (never a cordon or taint someone else set).

use kube::runtime::events::EventType;

use crate::controller::reconcile::PlanRun;
use crate::drain::cordon::release;

pub async fn run(run: &mut PlanRun) {
    // Released holds come back at once (the hold keeper would too, once it sees the plan is over).
    let restored = super::release::restore_holds(run).await;
    if restored > 0 {
        run.event(
            EventType::Normal,
            "HoldsRestored",
            "Rollback",
            format!("restored the holds of {restored} released pod(s): the plan did not complete"),
        )
        .await;
    }
    let nodes: Vec<(String, bool, bool)> = run
        .status
        .nodes
        .iter()
        .filter(|n| n.cordoned_by_snapdrain || n.tainted_by_snapdrain)
        .map(|n| {
            (
                n.name.clone(),
                n.cordoned_by_snapdrain,
                n.tainted_by_snapdrain,
            )
        })
        .collect();
    for (name, uncordon, untaint) in nodes {
        match release(&run.ctx.client, &name, uncordon, untaint).await {
            Ok(()) => {
                if let Some(n) = run.status.nodes.iter_mut().find(|n| n.name == name) {
                    n.cordoned_by_snapdrain = false;
                    n.tainted_by_snapdrain = false;
                }
                let what = match (uncordon, untaint) {
                    (true, true) => "uncordoned and its snapdrain.io/draining taint removed",
                    (true, false) => "uncordoned",
                    _ => "snapdrain.io/draining taint removed (it was cordoned by someone else)",
                };
                run.event(
                    EventType::Normal,
                    "Uncordoned",
                    "Rollback",
                    format!("node {name} {what}: the plan did not complete"),
                )
                .await;
            }
            Err(e) => {
                tracing::error!(plan = %run.name(), node = %name, error = %e, "rollback could not uncordon");
                run.event(
                    EventType::Warning,
                    "RollbackFailed",
                    "Rollback",
                    e.to_string(),
                )
                .await;
            }
        }
    }
}
