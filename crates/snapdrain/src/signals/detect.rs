//! Which disruption signal a node shows (DESIGN.md, the signal table). Pure: a Node, its Karpenter
//! NodeClaim (as JSON: snapdrain reads a handful of fields and does not depend on Karpenter's Go types)
//! and the policy in; at most one signal out, the most urgent (a deadline first).
//!
//! Sources:
//! - Karpenter v1 (kubernetes-sigs/karpenter `pkg/apis/v1/taints.go`, `pkg/apis/v1/nodeclaim_status.go`,
//!   `pkg/controllers/node/termination/controller.go`; research/karpenter.md): the `karpenter.sh/disrupted`
//!   NoSchedule taint (no value); NodeClaim conditions `Drifted` and `Consolidatable`; NodeClaim deletion,
//!   with the annotation `karpenter.sh/nodeclaim-termination-timestamp` (deletionTimestamp +
//!   terminationGracePeriod, RFC 3339) when a terminationGracePeriod is set.
//! - Cluster Autoscaler (`cluster-autoscaler/utils/taints/taints.go`): `ToBeDeletedByClusterAutoscaler`.
//! - aws-node-termination-handler (`pkg/node/node.go`): `aws-node-termination-handler/spot-itn`,
//!   `.../rebalance-recommendation`, `.../scheduled-maintenance`, `.../asg-lifecycle-termination`. A spot
//!   interruption notice gives two minutes (EC2 docs, "Spot Instance interruption notices").

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;
use serde_json::Value;

use super::plan::NodeSignal;
use crate::api::policy::{ConsolidationAction, SignalAction, SignalsSpec};
use crate::api::{PlanMode, PlanSource};

pub const KARPENTER_DISRUPTED_TAINT: &str = "karpenter.sh/disrupted";
pub const TERMINATION_TIMESTAMP_ANNOTATION: &str = "karpenter.sh/nodeclaim-termination-timestamp";
pub const CLUSTER_AUTOSCALER_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
pub const NTH_TAINT_PREFIX: &str = "aws-node-termination-handler/";
/// What an EC2 spot interruption notice leaves.
pub const SPOT_NOTICE: std::time::Duration = std::time::Duration::from_secs(120);

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

fn condition_true(claim: &Value, kind: &str) -> bool {
    claim["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == kind && c["status"] == "True")
    })
}

fn timestamp(value: &Value) -> Option<jiff::Timestamp> {
    value.as_str()?.parse().ok()
}

/// The signal `node` shows, if any, and what the policy makes of it. `claim` is the node's NodeClaim.
/// `now` dates deadlines that a signal implies but does not carry (a spot notice seen now).
pub fn detect(
    node: &Node,
    claim: Option<&Value>,
    policy: &SignalsSpec,
    now: jiff::Timestamp,
) -> Option<NodeSignal> {
    let signal = |source, reason: &str, action: SignalAction, deadline| match action {
        SignalAction::Ignore => None,
        SignalAction::Release => Some(NodeSignal {
            node: node.name_any(),
            node_uid: node.uid().unwrap_or_default(),
            source,
            reason: reason.to_owned(),
            mode: PlanMode::Release,
            deadline,
        }),
    };
    // Forceful first: they carry the deadline the plan must meet.
    if let Some(claim) = claim
        && claim["metadata"]["deletionTimestamp"].is_string()
    {
        let deadline =
            timestamp(&claim["metadata"]["annotations"][TERMINATION_TIMESTAMP_ANNOTATION]);
        return signal(
            PlanSource::Karpenter,
            "NodeClaimDeleted",
            policy.termination,
            deadline,
        );
    }
    for t in taints(node) {
        if let Some(kind) = t.key.strip_prefix(NTH_TAINT_PREFIX) {
            let (reason, deadline) = match kind {
                "spot-itn" => ("SpotInterruption", Some(now + SPOT_NOTICE)),
                "rebalance-recommendation" => ("RebalanceRecommendation", None),
                "scheduled-maintenance" => ("ScheduledMaintenance", None),
                "asg-lifecycle-termination" => ("AutoScalingLifecycleTermination", None),
                _ => ("NodeTerminationHandler", None),
            };
            return signal(
                PlanSource::NodeTerminationHandler,
                reason,
                policy.node_termination_handler,
                deadline,
            );
        }
    }
    if taints(node)
        .iter()
        .any(|t| t.key == KARPENTER_DISRUPTED_TAINT)
    {
        return signal(
            PlanSource::Karpenter,
            "Disrupting",
            policy.termination,
            None,
        );
    }
    if taints(node)
        .iter()
        .any(|t| t.key == CLUSTER_AUTOSCALER_TAINT)
    {
        return signal(
            PlanSource::ClusterAutoscaler,
            "ScaleDown",
            policy.cluster_autoscaler,
            None,
        );
    }
    let claim = claim?;
    if condition_true(claim, "Drifted") {
        return signal(PlanSource::Karpenter, "Drifted", policy.drift, None);
    }
    if condition_true(claim, "Consolidatable")
        && policy.consolidation == ConsolidationAction::Release
    {
        return signal(
            PlanSource::Karpenter,
            "Consolidatable",
            SignalAction::Release,
            None,
        );
    }
    None
}

/// The NodeClaim of a Karpenter node, from the Node's owner reference (Karpenter v1 makes the NodeClaim
/// the Node's owner).
pub fn nodeclaim_of(node: &Node) -> Option<&str> {
    node.metadata
        .owner_references
        .as_deref()?
        .iter()
        .find(|o| o.kind == "NodeClaim" && o.api_version.starts_with("karpenter.sh/"))
        .map(|o| o.name.as_str())
}

/// Karpenter v1's NodeClaim resource (`karpenter.sh/v1`, plural `nodeclaims`), read as dynamic objects.
pub fn nodeclaim_resource() -> kube::api::ApiResource {
    let gvk = kube::api::GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim");
    kube::api::ApiResource::from_gvk_with_plural(&gvk, "nodeclaims")
}

/// The NodeClaims API (cluster-scoped).
pub fn nodeclaims(client: &kube::Client) -> kube::Api<kube::api::DynamicObject> {
    kube::Api::all_with(client.clone(), &nodeclaim_resource())
}

/// The node's Karpenter NodePool (label `karpenter.sh/nodepool`), for per-pool limits.
pub fn node_pool_of(node: &Node) -> Option<&str> {
    node.labels()
        .get("karpenter.sh/nodepool")
        .map(String::as_str)
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
        .expect("a test node")
    }

    fn now() -> jiff::Timestamp {
        "2026-12-01T12:00:00Z".parse().expect("valid")
    }

    fn claim(conditions: Value, deleting: bool, annotations: Value) -> Value {
        let mut c = json!({"metadata": {"name": "c1", "annotations": annotations},
                           "status": {"conditions": conditions}});
        if deleting {
            c["metadata"]["deletionTimestamp"] = json!("2026-12-01T11:59:00Z");
        }
        c
    }

    #[test]
    fn a_drifted_nodeclaim_is_a_graceful_release() {
        let c = claim(
            json!([{"type": "Drifted", "status": "True"}]),
            false,
            json!({}),
        );
        let s = detect(&node(json!([])), Some(&c), &SignalsSpec::default(), now())
            .expect("drift is a signal");
        assert_eq!(
            (s.source, s.reason.as_str(), s.mode),
            (PlanSource::Karpenter, "Drifted", PlanMode::Release)
        );
        assert_eq!(s.deadline, None);
        assert_eq!(s.node_uid, "u1");
        let c = claim(
            json!([{"type": "Drifted", "status": "False"}]),
            false,
            json!({}),
        );
        assert_eq!(
            detect(&node(json!([])), Some(&c), &SignalsSpec::default(), now()),
            None
        );
    }

    #[test]
    fn a_deleted_nodeclaim_carries_its_termination_timestamp() {
        let c = claim(
            json!([{"type": "Drifted", "status": "True"}]),
            true,
            json!({TERMINATION_TIMESTAMP_ANNOTATION: "2026-12-01T12:30:00Z"}),
        );
        let s = detect(&node(json!([])), Some(&c), &SignalsSpec::default(), now()).expect("signal");
        assert_eq!(s.reason, "NodeClaimDeleted");
        assert_eq!(
            s.deadline,
            Some("2026-12-01T12:30:00Z".parse().expect("valid"))
        );
    }

    #[test]
    fn consolidation_is_held_unless_the_policy_releases_it() {
        let c = claim(
            json!([{"type": "Consolidatable", "status": "True"}]),
            false,
            json!({}),
        );
        assert_eq!(
            detect(&node(json!([])), Some(&c), &SignalsSpec::default(), now()),
            None
        );
        let releasing = SignalsSpec {
            consolidation: ConsolidationAction::Release,
            ..SignalsSpec::default()
        };
        let s = detect(&node(json!([])), Some(&c), &releasing, now()).expect("released");
        assert_eq!(s.reason, "Consolidatable");
    }

    #[test]
    fn taints_of_other_disruptors_are_signals() {
        let ca = node(
            json!([{"key": CLUSTER_AUTOSCALER_TAINT, "value": "1764590000", "effect": "NoSchedule"}]),
        );
        let s = detect(&ca, None, &SignalsSpec::default(), now()).expect("CA");
        assert_eq!(s.source, PlanSource::ClusterAutoscaler);
        let spot = node(
            json!([{"key": "aws-node-termination-handler/spot-itn", "value": "ev-1", "effect": "NoSchedule"}]),
        );
        let s = detect(&spot, None, &SignalsSpec::default(), now()).expect("NTH");
        assert_eq!(s.source, PlanSource::NodeTerminationHandler);
        assert_eq!(s.deadline, Some(now() + SPOT_NOTICE));
        let karpenter = node(json!([{"key": KARPENTER_DISRUPTED_TAINT, "effect": "NoSchedule"}]));
        assert_eq!(
            detect(&karpenter, None, &SignalsSpec::default(), now()).map(|s| s.reason),
            Some("Disrupting".into())
        );
        assert_eq!(
            detect(&node(json!([])), None, &SignalsSpec::default(), now()),
            None
        );
    }

    #[test]
    fn ignored_signals_make_no_plan() {
        let ignore = SignalsSpec {
            drift: SignalAction::Ignore,
            cluster_autoscaler: SignalAction::Ignore,
            ..SignalsSpec::default()
        };
        let c = claim(
            json!([{"type": "Drifted", "status": "True"}]),
            false,
            json!({}),
        );
        assert_eq!(detect(&node(json!([])), Some(&c), &ignore, now()), None);
        let ca = node(json!([{"key": CLUSTER_AUTOSCALER_TAINT, "effect": "NoSchedule"}]));
        assert_eq!(detect(&ca, None, &ignore, now()), None);
    }
}
