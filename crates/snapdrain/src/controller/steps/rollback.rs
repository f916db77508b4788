//! Undo on failure or abort: restore released holds; remove snapdrain's drain taint and uncordon, only
//! where snapdrain set them (never a cordon or taint someone else set). Best effort: what fails is said
//! loudly, and the hold keeper restores holds this misses once the plan is over.

use crate::controller::report::What;
use crate::controller::step::{Io, Outcome, PlanView};
use crate::drain::cordon::release;

pub async fn run(v: &PlanView<'_>, io: &Io<'_>) -> Outcome {
    let mut out = v.outcome();
    // Released holds come back at once (the hold keeper would too, once it sees the plan is over).
    let restored = super::release::restore_holds(&v.status.released_pods, io).await;
    if restored > 0 {
        out.note(
            What::HoldsRestored {
                pods: restored as u64,
                event: true,
            },
            format!("restored the holds of {restored} released pod(s): the plan did not complete"),
        );
    }
    for (i, n) in v.status.nodes.iter().enumerate() {
        let (uncordon, untaint) = (n.cordoned_by_snapdrain, n.tainted_by_snapdrain);
        if !uncordon && !untaint {
            continue;
        }
        match release(io.client, &n.name, uncordon, untaint).await {
            Ok(_) => {
                let node = &mut out.status.nodes[i];
                node.cordoned_by_snapdrain = false;
                node.tainted_by_snapdrain = false;
                out.note(
                    What::Uncordoned,
                    format!(
                        "node {} {}: the plan did not complete",
                        n.name,
                        undone(uncordon, untaint)
                    ),
                );
            }
            Err(e) => {
                tracing::error!(node = %n.name, error = %e, "rollback could not uncordon");
                out.note(What::RollbackFailed, e.to_string());
            }
        }
    }
    out
}

/// What the rollback undid on a node, for its Event.
fn undone(uncordon: bool, untaint: bool) -> &'static str {
    match (uncordon, untaint) {
        (true, true) => "uncordoned and its snapdrain.io/draining taint removed",
        (true, false) => "uncordoned",
        _ => "snapdrain.io/draining taint removed (it was cordoned by someone else)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_says_what_was_undone_and_whose_cordon_stays() {
        assert!(undone(true, true).contains("uncordoned and"));
        assert_eq!(undone(true, false), "uncordoned");
        assert!(undone(false, true).contains("cordoned by someone else"));
    }
}
