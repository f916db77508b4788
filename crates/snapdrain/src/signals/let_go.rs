//! When snapdrain stops holding a node it cannot save (review #6). A node whose NodeClaim Karpenter
//! deletes, or that aws-node-termination-handler marks for a spot interruption, an ASG lifecycle
//! termination or scheduled maintenance, goes on a clock snapdrain does not control. If snapdrain will
//! not back it up (the policy ignores that signal, or the signal's plan failed or was aborted), its
//! holds only keep the disruptor waiting:
//! - Karpenter's terminator never evicts a `do-not-disrupt` pod and, without a NodeClaim
//!   terminationGracePeriod, never force-deletes one either (kubernetes-sigs/karpenter
//!   `pkg/controllers/node/termination/terminator/eviction.go` `needsForceDelete` is false without a
//!   termination time), so the node stays half-drained for good, still counted against the NodePool's
//!   budget;
//! - NTH and EC2 take the instance at the end of the notice anyway, and the pods then die with it
//!   instead of stopping in the time the notice gave them.
//!
//! So the hold keeper takes the holds off the node's protected pods and the gate allows their
//! evictions, loudly (an Event on the Node, `snapdrain_protected_pods_left_unbacked_total`). A running
//! plan, or a signal whose plan is still to be made, keeps the holds. Pure.

use std::borrow::Borrow;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use serde_json::Value;

use super::detect::{detect, is_forceful};
use super::plan::{Choice, choose, source_name};
use crate::api::policy::{SignalAction, SignalsSpec};
use crate::api::status::PlanPhase;
use crate::api::{DisruptionPlan, PlanSource};

/// Why the holds on a node's protected pods go without a verified backup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LetGo {
    /// The DisruptionPolicy's action for this forceful signal is `Ignore`.
    Ignored {
        source: &'static str,
        reason: String,
    },
    /// The signal's plan ended without completing; the node goes anyway.
    PlanEnded {
        source: &'static str,
        reason: String,
        plan: String,
        phase: PlanPhase,
    },
}

impl LetGo {
    /// The Node Event's message.
    pub fn message(&self) -> String {
        match self {
            Self::Ignored { source, reason } => format!(
                "{source} {reason}: the node goes whatever snapdrain does and the DisruptionPolicy ignores this signal, so snapdrain takes its holds off the node's protected pods and its eviction gate lets them go WITHOUT a backup"
            ),
            Self::PlanEnded {
                source,
                reason,
                plan,
                phase,
            } => format!(
                "{source} {reason}: plan {plan} ended {phase:?} before a verified backup and the node goes whatever snapdrain does, so snapdrain takes its holds off the node's protected pods and its eviction gate lets them go WITHOUT a backup (holding on would leave the termination waiting for good); see `kubectl describe disruptionplan {plan}`"
            ),
        }
    }
}

/// NTH's taints after which the instance goes on EC2's clock.
const NTH_FORCEFUL: [&str; 3] = [
    "aws-node-termination-handler/spot-itn",
    "aws-node-termination-handler/asg-lifecycle-termination",
    "aws-node-termination-handler/scheduled-maintenance",
];

/// A cheap first look for callers that ask about every protected pod (the hold keeper's sweep): false
/// means [`let_go`] is false, with no NodeClaim to convert and no plans to look through.
pub fn may_let_go(node: &Node, claim_deleting: bool) -> bool {
    claim_deleting
        || node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| NTH_FORCEFUL.contains(&t.key.as_str())))
}

/// Whether `node` (with its NodeClaim `claim`) is being taken on a clock snapdrain cannot stop and
/// snapdrain will not back it up. `plans` holds at least the node's plans.
pub fn let_go<P: Borrow<DisruptionPlan>>(
    node: &Node,
    claim: Option<&Value>,
    policy: &SignalsSpec,
    plans: &[P],
    now: jiff::Timestamp,
) -> Option<LetGo> {
    // Seen whatever the policy's action, to tell "ignored" from "no signal".
    let every_signal = SignalsSpec {
        termination: SignalAction::Release,
        node_termination_handler: SignalAction::Release,
        ..*policy
    };
    let signal = detect(node, claim, &every_signal, now, || Duration::ZERO)?;
    // The `karpenter.sh/disrupted` taint alone is not yet a commitment: Karpenter validates its
    // candidates again before it deletes the NodeClaim, and a held node is given back.
    if !is_forceful(&signal) || signal.reason == "Disrupting" {
        return None;
    }
    let action = match signal.source {
        PlanSource::Karpenter => policy.termination,
        PlanSource::NodeTerminationHandler => policy.node_termination_handler,
        _ => return None,
    };
    let source = source_name(signal.source);
    if action == SignalAction::Ignore {
        return Some(LetGo::Ignored {
            source,
            reason: signal.reason,
        });
    }
    match choose(plans, &signal) {
        Choice::Settled { plan, phase } => Some(LetGo::PlanEnded {
            source,
            reason: signal.reason,
            plan,
            phase,
        }),
        // A plan runs (it releases the holds once the backup is verified, or at its deadline), or the
        // signal watcher is about to make one.
        Choice::Join { .. } | Choice::Create { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(taints: Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "uid": "u1"},
            "spec": {"taints": taints}
        }))
        .expect("a node")
    }

    fn deleting_claim() -> Value {
        json!({"metadata": {"name": "c1", "deletionTimestamp": "2026-12-01T11:59:00Z"}})
    }

    fn now() -> jiff::Timestamp {
        "2026-12-01T12:00:00Z".parse().expect("valid")
    }

    /// The plan the signal watcher names for the node's first run, in `phase`, recording `reason`.
    fn plan(reason: &str, phase: &str) -> DisruptionPlan {
        let name = crate::planning::naming::signal_plan_name("n1", "u1", 1);
        serde_json::from_value(json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": name, "annotations": {
                "snapdrain.io/signals": format!("[{{\"source\":\"karpenter\",\"reason\":\"{reason}\"}}]")}},
            "spec": {"nodes": ["n1"], "mode": "Release"},
            "status": {"phase": phase}
        }))
        .expect("a plan")
    }

    #[test]
    fn a_deleted_nodeclaim_whose_plan_failed_or_was_aborted_is_let_go() {
        for phase in ["Failed", "Aborted"] {
            let plans = [plan("NodeClaimDeleted", phase)];
            let got = let_go(
                &node(json!([])),
                Some(&deleting_claim()),
                &SignalsSpec::default(),
                &plans,
                now(),
            );
            assert!(
                matches!(&got, Some(LetGo::PlanEnded { reason, .. }) if reason == "NodeClaimDeleted"),
                "{phase}: {got:?}"
            );
            assert!(got.expect("let go").message().contains("WITHOUT a backup"));
        }
    }

    #[test]
    fn a_running_plan_or_one_still_to_be_made_keeps_the_holds() {
        let claim = deleting_claim();
        let policy = SignalsSpec::default();
        let none: [DisruptionPlan; 0] = [];
        assert_eq!(
            let_go(&node(json!([])), Some(&claim), &policy, &none, now()),
            None
        );
        let running = [plan("NodeClaimDeleted", "BackingUp")];
        assert_eq!(
            let_go(&node(json!([])), Some(&claim), &policy, &running, now()),
            None
        );
    }

    #[test]
    fn ignored_forceful_signals_are_let_go_and_graceful_ones_never() {
        let ignore = SignalsSpec {
            termination: SignalAction::Ignore,
            node_termination_handler: SignalAction::Ignore,
            drift: SignalAction::Ignore,
            cluster_autoscaler: SignalAction::Ignore,
            ..SignalsSpec::default()
        };
        let none: [DisruptionPlan; 0] = [];
        let claim = deleting_claim();
        assert!(matches!(
            let_go(&node(json!([])), Some(&claim), &ignore, &none, now()),
            Some(LetGo::Ignored {
                source: "karpenter",
                ..
            })
        ));
        let taint = |key: &str| json!([{"key": key, "effect": "NoSchedule"}]);
        assert!(matches!(
            let_go(
                &node(taint("aws-node-termination-handler/spot-itn")),
                None,
                &ignore,
                &none,
                now()
            ),
            Some(LetGo::Ignored {
                source: "node-termination-handler",
                ..
            })
        ));
        for key in [
            "karpenter.sh/disrupted",
            "ToBeDeletedByClusterAutoscaler",
            "aws-node-termination-handler/rebalance-recommendation",
        ] {
            assert_eq!(
                let_go(&node(taint(key)), None, &ignore, &none, now()),
                None,
                "{key}"
            );
        }
        let drifted = json!({"metadata": {"name": "c1"},
            "status": {"conditions": [{"type": "Drifted", "status": "True"}]}});
        assert_eq!(
            let_go(&node(json!([])), Some(&drifted), &ignore, &none, now()),
            None
        );
    }

    #[test]
    fn the_first_look_passes_every_node_that_may_be_let_go() {
        let taint = |key: &str| json!([{"key": key, "effect": "NoSchedule"}]);
        let ignore_all = SignalsSpec {
            termination: SignalAction::Ignore,
            node_termination_handler: SignalAction::Ignore,
            ..SignalsSpec::default()
        };
        let none: [DisruptionPlan; 0] = [];
        for key in NTH_FORCEFUL {
            let n = node(taint(key));
            assert!(
                let_go(&n, None, &ignore_all, &none, now()).is_some(),
                "{key}"
            );
            assert!(may_let_go(&n, false), "{key}");
        }
        assert!(may_let_go(&node(json!([])), true));
        for key in [
            "karpenter.sh/disrupted",
            "ToBeDeletedByClusterAutoscaler",
            "aws-node-termination-handler/rebalance-recommendation",
        ] {
            assert!(!may_let_go(&node(taint(key)), false), "{key}");
        }
    }

    #[test]
    fn a_failed_plan_of_another_signal_does_not_let_go() {
        // A drift plan failed earlier; the NodeClaim deletion is a new signal with a plan to come.
        let plans = [plan("Drifted", "Failed")];
        assert_eq!(
            let_go(
                &node(json!([])),
                Some(&deleting_claim()),
                &SignalsSpec::default(),
                &plans,
                now()
            ),
            None
        );
    }
}
