//! Cordoning: mark every node unschedulable, remembering which ones snapdrain cordoned itself.

use std::time::Duration;

use crate::api::status::NodePhase;
use crate::controller::error::ControllerError;
use crate::controller::reconcile::PlanRun;
use crate::drain::cordon::cordon;
use crate::planning::PhaseFacts;

pub async fn run(
    run: &mut PlanRun,
    facts: &mut PhaseFacts,
) -> Result<Option<Duration>, ControllerError> {
    for node in run.status.nodes.iter_mut() {
        let changed = cordon(&run.ctx.client, &node.name).await?;
        // Only ever set: a second pass sees the node already cordoned (by us) and must not forget that.
        node.cordoned_by_snapdrain |= changed;
        node.phase = NodePhase::Cordoned;
    }
    facts.nodes_cordoned = true;
    Ok(None)
}
