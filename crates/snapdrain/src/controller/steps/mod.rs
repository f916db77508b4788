//! The work of each phase, in the shape of [`super::step`]: each step reads the plan as last written and
//! one clock reading, acts idempotently on the cluster, and returns the new status, what comes next and
//! what to announce. The phase machine then decides from the written status
//! ([`crate::planning::PhaseFacts::of`]).

pub mod architecture;
pub mod backups;
pub mod cordon;
pub mod csi_release;
pub mod drain;
pub mod emergency;
pub mod instance;
pub mod inventory;
pub mod join;
pub mod plan;
pub mod release;
pub mod replace;
pub mod rollback;
pub mod terminate;
pub mod verify;

use crate::api::plan::PlanMode;
use crate::api::status::PlanPhase;

use super::error::ControllerError;
use super::step::{Io, Next, Outcome, PlanView};

/// Performs `phase`'s work.
pub async fn run(
    phase: PlanPhase,
    v: &PlanView<'_>,
    io: &Io<'_>,
) -> Result<Outcome, ControllerError> {
    match phase {
        PlanPhase::Pending => plan::run(v, io).await,
        PlanPhase::BackingUp => backups::run(v, io).await,
        PlanPhase::Verifying => verifying(v, io).await,
        PlanPhase::Cordoning => cordon::run(v, io).await,
        PlanPhase::Draining if v.plan.spec.mode == PlanMode::Release => drain::release(v, io).await,
        PlanPhase::Draining => drain::run(v, io).await,
        PlanPhase::Terminating => terminate::run(v, io).await,
        PlanPhase::Replacing => replace::run(v, io).await,
        PlanPhase::Completed | PlanPhase::Failed | PlanPhase::Aborted => Ok(v.outcome()),
    }
}

/// Verifying follows the backups (a retry after a failed verification starts here) and verifies each
/// Completed one in its bucket. Verification only reads, so it may work from the backups' unwritten
/// outcome; an intent the backups step needs written first ends the call.
async fn verifying(v: &PlanView<'_>, io: &Io<'_>) -> Result<Outcome, ControllerError> {
    let backed = backups::run(v, io).await?;
    if !matches!(backed.next, Next::Decide | Next::Wait { .. }) {
        return Ok(backed);
    }
    let view = PlanView {
        plan: v.plan,
        valid: v.valid,
        status: &backed.status,
        now: v.now,
    };
    let mut verified = verify::run(&view, io).await?;
    let mut notes = backed.notes;
    notes.append(&mut verified.notes);
    verified.notes = notes;
    if matches!(verified.next, Next::Decide) {
        verified.next = backed.next;
    }
    Ok(verified)
}
