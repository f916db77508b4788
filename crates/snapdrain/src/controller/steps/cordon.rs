//! Cordoning (Execute mode, right after Pending, before any backup): mark every node unschedulable and
//! taint it with `snapdrain.io/draining:NoSchedule`, remembering what snapdrain set itself. The drain step
//! does the same again before it evicts (a no-op when nothing changed), for plans persisted by an older
//! controller that cordoned only after the backup.

use std::time::Duration;

use crate::api::status::NodePhase;
use crate::controller::error::ControllerError;
use crate::controller::reconcile::PlanRun;
use crate::drain::DrainError;
use crate::drain::cordon::cordon_and_taint;
use crate::planning::PhaseFacts;

pub async fn run(
    run: &mut PlanRun,
    facts: &mut PhaseFacts,
) -> Result<Option<Duration>, ControllerError> {
    mark_nodes(run, false).await?;
    for node in run.status.nodes.iter_mut() {
        node.phase = NodePhase::Cordoned;
    }
    facts.nodes_cordoned = true;
    Ok(None)
}

/// Cordons and taints the plan's nodes that are not yet. What snapdrain changed is only ever added to
/// the record: a second pass sees the node already marked (by us) and must not forget that. With
/// `missing_ok` (while draining) a node that is gone already needs nothing; before the backup it is an
/// error that names the node.
pub async fn mark_nodes(run: &mut PlanRun, missing_ok: bool) -> Result<(), ControllerError> {
    for i in 0..run.status.nodes.len() {
        if run.status.nodes[i].phase == NodePhase::Gone {
            continue;
        }
        let name = run.status.nodes[i].name.clone();
        let marked = match cordon_and_taint(&run.ctx.client, &name).await {
            Ok(m) => m,
            Err(DrainError::NodeMissing { .. }) if missing_ok => continue,
            Err(e) => return Err(e.into()),
        };
        let node = &mut run.status.nodes[i];
        node.cordoned_by_snapdrain |= marked.cordoned;
        node.tainted_by_snapdrain |= marked.tainted;
    }
    Ok(())
}
