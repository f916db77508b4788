//! Cordoning (Execute mode, right after Pending, before any backup): mark every node unschedulable and
//! taint it with `snapdrain.io/draining:NoSchedule`, remembering what snapdrain set itself. The drain step
//! does the same again before it evicts (a no-op when nothing changed), for plans persisted by an older
//! controller that cordoned only after the backup.

use std::time::Duration;

use crate::api::status::NodePhase;
use crate::controller::error::ControllerError;
use crate::controller::reconcile::PlanRun;
use crate::drain::DrainError;
use crate::drain::cordon::{cordon_and_taint, pending_marks};
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

/// Cordons and taints the plan's nodes that are not yet. Intent before act: what the cordon will
/// change (read from the node) is added to the record and written *before* the patch, so a status write
/// refused after the patch (a 409, a 5xx, a crash, a lost Lease) cannot leave the next pass finding the
/// node already cordoned and taking the cordon for someone else's, which a rollback would then leave in
/// place. A crash between this write and the patch leaves a record of a cordon not yet made; the rollback
/// then uncordons a schedulable node, which changes nothing. What snapdrain changed is only ever added to
/// the record. With `missing_ok` (while draining) a node that is gone already needs nothing; before the
/// backup it is an error that names the node.
pub async fn mark_nodes(run: &mut PlanRun, missing_ok: bool) -> Result<(), ControllerError> {
    let mut targets = Vec::new();
    let mut intent = false;
    for i in 0..run.status.nodes.len() {
        if run.status.nodes[i].phase == NodePhase::Gone {
            continue;
        }
        let name = run.status.nodes[i].name.clone();
        let pending = match pending_marks(&run.ctx.client, &name).await? {
            Some(p) => p,
            None if missing_ok => continue,
            None => return Err(DrainError::NodeMissing { node: name }.into()),
        };
        let node = &mut run.status.nodes[i];
        intent |= (pending.cordoned && !node.cordoned_by_snapdrain)
            || (pending.tainted && !node.tainted_by_snapdrain);
        node.cordoned_by_snapdrain |= pending.cordoned;
        node.tainted_by_snapdrain |= pending.tainted;
        if pending.cordoned || pending.tainted {
            targets.push(i);
        }
    }
    if intent {
        run.save().await?;
    }
    for i in targets {
        let name = run.status.nodes[i].name.clone();
        let marked = match cordon_and_taint(&run.ctx.client, &name).await {
            Ok(m) => m,
            Err(DrainError::NodeMissing { .. }) if missing_ok => continue,
            Err(e) => return Err(e.into()),
        };
        // Someone may have uncordoned the node since it was read: the patch then made a cordon the
        // intent did not name, and it is ours too.
        let node = &mut run.status.nodes[i];
        node.cordoned_by_snapdrain |= marked.cordoned;
        node.tainted_by_snapdrain |= marked.tainted;
    }
    Ok(())
}
