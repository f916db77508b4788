//! The work of each phase. Each step acts idempotently on the cluster, records what it did in the
//! plan's status, and fills in the facts the phase machine decides on. A step returns how long to wait
//! before looking again when the cluster has not caught up (watches usually wake the plan sooner).

pub mod backups;
pub mod cordon;
pub mod drain;
pub mod instance;
pub mod inventory;
pub mod plan;
pub mod release;
pub mod replace;
pub mod rollback;
pub mod terminate;
pub mod verify;

use std::time::Duration;

use crate::api::status::PlanPhase;
use crate::planning::PhaseFacts;

use super::error::ControllerError;
use super::reconcile::PlanRun;

/// Performs `phase`'s work and fills `facts`. Returns the requeue delay when the plan must wait.
pub async fn run_phase(
    run: &mut PlanRun,
    phase: PlanPhase,
    facts: &mut PhaseFacts,
) -> Result<Option<Duration>, ControllerError> {
    match phase {
        PlanPhase::Pending => {
            let wait = plan::run(run, facts).await?;
            // Pending records the nodes only once it could decide the plan; until then (a missing node,
            // a refused pod) the plan must not move on.
            facts.planning_blocked = run.status.nodes.is_empty();
            Ok(wait)
        }
        PlanPhase::BackingUp => backups::run(run, facts).await,
        PlanPhase::Verifying => {
            let wait = backups::run(run, facts).await?;
            let verified = verify::run(run, facts).await?;
            Ok(wait.or(verified))
        }
        PlanPhase::Cordoning => cordon::run(run, facts).await,
        PlanPhase::Draining => drain::run(run, facts).await,
        PlanPhase::Terminating => terminate::run(run, facts).await,
        PlanPhase::Replacing => replace::run(run, facts).await,
        PlanPhase::Completed | PlanPhase::Failed | PlanPhase::Aborted => Ok(None),
    }
}
