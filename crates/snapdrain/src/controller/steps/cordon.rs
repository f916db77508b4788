//! Cordoning (Execute mode, right after Pending, before any backup): mark every node unschedulable and
//! taint it with `snapdrain.io/draining:NoSchedule`, remembering what snapdrain set itself. The drain step
//! does the same again before it evicts (a no-op when nothing changed), for plans persisted by an older
//! controller that cordoned only after the backup.
//!
//! Intent before act: what the cordon will change (read from the node) is added to the record and
//! written *before* the patch, so a status write refused after the patch (a 409, a 5xx, a crash, a lost
//! Lease) cannot leave the next pass finding the node already cordoned and taking the cordon for someone
//! else's, which a rollback would then leave in place. A crash between the write and the patch leaves a
//! record of a cordon not yet made; the rollback then uncordons a schedulable node, which changes nothing.

use crate::api::status::{DisruptionPlanStatus, NodePhase};
use crate::controller::error::ControllerError;
use crate::controller::step::{Io, Next, Outcome, PlanView};
use crate::drain::DrainError;
use crate::drain::cordon::{Marked, cordon_and_taint, pending_marks};

pub async fn run(v: &PlanView<'_>, io: &Io<'_>) -> Result<Outcome, ControllerError> {
    let mut status = match mark_nodes(v.status, io, false).await? {
        Marks::Intent(status) => return Ok(Outcome::decide(status).then(Next::Checkpoint)),
        Marks::Done(status) => status,
    };
    for node in status.nodes.iter_mut() {
        node.phase = NodePhase::Cordoned;
    }
    Ok(Outcome::decide(status))
}

/// Where [`mark_nodes`] got to.
pub enum Marks {
    /// New ownership intents are in this status: write it before any patch.
    Intent(DisruptionPlanStatus),
    /// Every node is cordoned and tainted, and the record says what snapdrain set.
    Done(DisruptionPlanStatus),
}

/// Cordons and taints the plan's nodes that are not yet, once the intent is written. With `missing_ok`
/// (while draining) a node that is gone needs nothing; before the backup it is an error naming the node.
pub async fn mark_nodes(
    written: &DisruptionPlanStatus,
    io: &Io<'_>,
    missing_ok: bool,
) -> Result<Marks, ControllerError> {
    let mut pending = Vec::new();
    for (i, node) in written.nodes.iter().enumerate() {
        if node.phase == NodePhase::Gone {
            continue;
        }
        match pending_marks(io.client, &node.name).await? {
            Some(p) => pending.push((i, p)),
            None if missing_ok => {}
            None => {
                return Err(DrainError::NodeMissing {
                    node: node.name.clone(),
                }
                .into());
            }
        }
    }
    let mut status = written.clone();
    if record_marks(&mut status, &pending) {
        return Ok(Marks::Intent(status));
    }
    for (i, p) in pending {
        if !p.cordoned && !p.tainted {
            continue;
        }
        let marked = match cordon_and_taint(io.client, &status.nodes[i].name).await {
            Ok(m) => m,
            Err(DrainError::NodeMissing { .. }) if missing_ok => continue,
            Err(e) => return Err(e.into()),
        };
        // Someone may have uncordoned the node since it was read: the patch then made a cordon the
        // intent did not name, and it is ours too.
        record_marks(&mut status, &[(i, marked)]);
    }
    Ok(Marks::Done(status))
}

/// Adds what snapdrain sets (or will set) on node `i` to its record; what snapdrain changed is only
/// ever added. True when the record changed.
pub fn record_marks(status: &mut DisruptionPlanStatus, marks: &[(usize, Marked)]) -> bool {
    let mut changed = false;
    for (i, m) in marks {
        let Some(node) = status.nodes.get_mut(*i) else {
            continue;
        };
        changed |= (m.cordoned && !node.cordoned_by_snapdrain)
            || (m.tainted && !node.tainted_by_snapdrain);
        node.cordoned_by_snapdrain |= m.cordoned;
        node.tainted_by_snapdrain |= m.tainted;
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::status::NodeProgress;

    fn status(cordoned: bool, tainted: bool) -> DisruptionPlanStatus {
        DisruptionPlanStatus {
            nodes: vec![NodeProgress {
                name: "n1".into(),
                cordoned_by_snapdrain: cordoned,
                tainted_by_snapdrain: tainted,
                ..NodeProgress::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_cordon_still_to_make_is_an_intent_to_write_first() {
        let mut s = status(false, false);
        let both = Marked {
            cordoned: true,
            tainted: true,
        };
        assert!(record_marks(&mut s, &[(0, both)]));
        assert!(s.nodes[0].cordoned_by_snapdrain && s.nodes[0].tainted_by_snapdrain);
        // Written already: acting on it changes nothing more in the record.
        assert!(!record_marks(&mut s, &[(0, both)]));
    }

    #[test]
    fn ownership_is_only_ever_added() {
        let mut s = status(true, true);
        assert!(!record_marks(&mut s, &[(0, Marked::default())]));
        assert!(s.nodes[0].cordoned_by_snapdrain && s.nodes[0].tainted_by_snapdrain);
        // Someone else's cordon is not recorded as ours.
        let mut other = status(false, false);
        let taint_only = Marked {
            cordoned: false,
            tainted: true,
        };
        assert!(record_marks(&mut other, &[(0, taint_only)]));
        assert!(!other.nodes[0].cordoned_by_snapdrain && other.nodes[0].tainted_by_snapdrain);
    }
}
