//! Undo on failure or abort: uncordon the nodes snapdrain cordoned (never one someone else cordoned).

use kube::runtime::events::EventType;

use crate::controller::reconcile::PlanRun;
use crate::drain::cordon::uncordon;

pub async fn run(run: &mut PlanRun) {
    let nodes: Vec<String> = run
        .status
        .nodes
        .iter()
        .filter(|n| n.cordoned_by_snapdrain)
        .map(|n| n.name.clone())
        .collect();
    for name in nodes {
        match uncordon(&run.ctx.client, &name).await {
            Ok(()) => {
                if let Some(n) = run.status.nodes.iter_mut().find(|n| n.name == name) {
                    n.cordoned_by_snapdrain = false;
                }
                run.event(
                    EventType::Normal,
                    "Uncordoned",
                    "Rollback",
                    format!("node {name} uncordoned: the plan did not complete"),
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
