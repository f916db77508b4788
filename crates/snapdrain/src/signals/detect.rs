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
//!   The plan's deadline is earlier than that timestamp: Karpenter DELETEs each pod (no eviction, so no
//!   PDB and no gate) once `now > terminationTime − pod terminationGracePeriodSeconds`
//!   (`pkg/controllers/node/termination/terminator/eviction.go` `needsForceDelete`, `forceDelete`), so
//!   the backup must be verified before the first protected pod goes ([`termination_deadline`]).
//! - Cluster Autoscaler (`cluster-autoscaler/utils/taints/taints.go`): `ToBeDeletedByClusterAutoscaler`
//!   (NoSchedule, set by `MarkToBeDeleted` right before CA drains the node), and the early signal
//!   `DeletionCandidateOfClusterAutoscaler` (PreferNoSchedule, set by `MarkDeletionCandidate` on every
//!   node CA finds unneeded, `core/scaledown/actuation/softtaint.go` `UpdateSoftDeletionTaints`; CA
//!   drains it once it stayed unneeded for `--scale-down-unneeded-time`, 10 min by default, and removes
//!   the taint when the node is needed again). A backup started at the soft taint is verified by the
//!   time CA's drain reaches the eviction gate. Neither taint is a commitment: CA's drain gives up after
//!   `--max-pod-eviction-time` and removes its taint, so both are graceful signals.
//! - aws-node-termination-handler (`pkg/node/node.go`): `aws-node-termination-handler/spot-itn`,
//!   `.../rebalance-recommendation`, `.../scheduled-maintenance`, `.../asg-lifecycle-termination`. A spot
//!   interruption notice gives two minutes (EC2 docs, "Spot Instance interruption notices").

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::ResourceExt;
use serde_json::Value;

use super::plan::NodeSignal;
use crate::api::policy::{ConsolidationAction, SignalAction, SignalsSpec};
use crate::api::{PlanMode, PlanSource};

pub const KARPENTER_DISRUPTED_TAINT: &str = "karpenter.sh/disrupted";
pub const TERMINATION_TIMESTAMP_ANNOTATION: &str = "karpenter.sh/nodeclaim-termination-timestamp";
pub const CLUSTER_AUTOSCALER_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
/// Cluster Autoscaler's soft taint on unneeded nodes (`utils/taints/taints.go` `DeletionCandidateTaint`).
pub const CLUSTER_AUTOSCALER_CANDIDATE_TAINT: &str = "DeletionCandidateOfClusterAutoscaler";
pub const NTH_TAINT_PREFIX: &str = "aws-node-termination-handler/";
/// What an EC2 spot interruption notice leaves.
pub const SPOT_NOTICE: Duration = Duration::from_secs(120);
/// How long before Karpenter's first pod deletion a plan's backup must be verified: the plan's last
/// step (releasing the holds) and the signal watcher's look (every 2 s, then a cache's lag) take a few
/// seconds, and a backup verified as Karpenter deletes the pod is no use.
pub const FORCE_DELETE_MARGIN: Duration = Duration::from_secs(10);
/// A pod's grace when its spec has none: what the API server defaults it to
/// (`k8s.io/api/core/v1` `DefaultTerminationGracePeriodSeconds`). Pods read from the API always have it.
const DEFAULT_POD_GRACE: Duration = Duration::from_secs(30);

/// Whether the node goes whatever snapdrain does: such a signal never waits for a maintenance window or
/// a concurrency slot. By kind, not by whether a deadline is known (review #6): Karpenter deletes the
/// NodeClaim of an expired or spot-interrupted node with no termination timestamp when the NodePool sets
/// no terminationGracePeriod (`pkg/controllers/nodeclaim/lifecycle/controller.go` writes it only then;
/// karpenter-provider-aws `pkg/controllers/interruption` deletes the claim outright), and a node
/// Karpenter has tainted `karpenter.sh/disrupted` is committed to its disruption. NTH's spot
/// interruption, ASG lifecycle termination and scheduled maintenance end the instance on EC2's clock.
/// Drift, consolidation, a rebalance recommendation and Cluster Autoscaler's scale-down (it gives up
/// after its eviction timeout and tries again later) are graceful.
pub fn is_forceful(signal: &NodeSignal) -> bool {
    signal.deadline.is_some()
        || matches!(
            (signal.source, signal.reason.as_str()),
            (PlanSource::Karpenter, "NodeClaimDeleted" | "Disrupting")
                | (
                    PlanSource::NodeTerminationHandler,
                    "SpotInterruption" | "AutoScalingLifecycleTermination" | "ScheduledMaintenance"
                )
        )
}

/// The pod's `terminationGracePeriodSeconds` (negative counts as 0).
pub fn pod_grace(pod: &Pod) -> Duration {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .map_or(DEFAULT_POD_GRACE, |s| {
            Duration::from_secs(u64::try_from(s).unwrap_or(0))
        })
}

/// The deadline of a plan for a node whose spot interruption notice came at `notice`: EC2 takes the
/// instance [`SPOT_NOTICE`] later (EC2 docs, "Spot Instance interruption notices"), and the protected
/// pods need their grace period to stop before that, as with Karpenter's termination time (review #12).
pub fn spot_deadline(notice: jiff::Timestamp, longest_grace: Duration) -> jiff::Timestamp {
    termination_deadline(notice + SPOT_NOTICE, longest_grace)
}

/// The deadline of a plan for a NodeClaim Karpenter terminates at `termination`: Karpenter DELETEs each
/// pod at `termination − its grace`, so the one with the longest grace (`longest_grace`, among the
/// node's protected pods) goes first; the backup must be verified [`FORCE_DELETE_MARGIN`] before that.
pub fn termination_deadline(
    termination: jiff::Timestamp,
    longest_grace: Duration,
) -> jiff::Timestamp {
    let before = jiff::SignedDuration::try_from(longest_grace.saturating_add(FORCE_DELETE_MARGIN))
        .unwrap_or(jiff::SignedDuration::MAX);
    termination
        .checked_sub(before)
        .unwrap_or(jiff::Timestamp::MIN)
}

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
/// `longest_grace` gives the longest terminationGracePeriodSeconds of the node's protected pods; it is
/// asked only for a signal with a deadline (a NodeClaim Karpenter terminates at a set time, NTH's spot
/// notice).
pub fn detect(
    node: &Node,
    claim: Option<&Value>,
    policy: &SignalsSpec,
    now: jiff::Timestamp,
    longest_grace: impl FnOnce() -> Duration,
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
            timestamp(&claim["metadata"]["annotations"][TERMINATION_TIMESTAMP_ANNOTATION])
                .map(|t| termination_deadline(t, longest_grace()));
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
                "spot-itn" => (
                    "SpotInterruption",
                    Some(spot_deadline(now, longest_grace())),
                ),
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
    if taints(node)
        .iter()
        .any(|t| t.key == CLUSTER_AUTOSCALER_CANDIDATE_TAINT)
    {
        return signal(
            PlanSource::ClusterAutoscaler,
            "ScaleDownCandidate",
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

/// Whether a disruptor has started taking `node` (review #13): Karpenter tainted it
/// `karpenter.sh/disrupted` or deleted its NodeClaim, Cluster Autoscaler tainted it
/// `ToBeDeletedByClusterAutoscaler`, or the Node itself is being deleted. A released node in this
/// state is mid-drain: restoring its holds at the end of a release window would stall that drain
/// (Karpenter's terminator skips held pods) and start the backup over. `claim` is its NodeClaim.
pub fn taking(node: &Node, claim: Option<&Value>) -> Option<&'static str> {
    if node.metadata.deletion_timestamp.is_some() {
        return Some("the Node is being deleted");
    }
    if claim.is_some_and(|c| c["metadata"]["deletionTimestamp"].is_string()) {
        return Some("Karpenter is terminating its NodeClaim");
    }
    let taints = taints(node);
    if taints.iter().any(|t| t.key == KARPENTER_DISRUPTED_TAINT) {
        return Some("Karpenter tainted it karpenter.sh/disrupted");
    }
    if taints.iter().any(|t| t.key == CLUSTER_AUTOSCALER_TAINT) {
        return Some("Cluster Autoscaler tainted it ToBeDeletedByClusterAutoscaler");
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

    fn grace() -> Duration {
        Duration::from_secs(30)
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
    fn forcefulness_is_by_kind_not_by_a_known_deadline() {
        let look = |n: Node, c: Option<Value>| {
            detect(&n, c.as_ref(), &SignalsSpec::default(), now(), grace).expect("a signal")
        };
        let no_tgp_deletion = look(node(json!([])), Some(claim(json!([]), true, json!({}))));
        assert_eq!(no_tgp_deletion.deadline, None);
        assert!(
            is_forceful(&no_tgp_deletion),
            "a NodeClaim deletion without TGP"
        );
        let taint = |key: &str| json!([{"key": key, "effect": "NoSchedule"}]);
        for key in [
            KARPENTER_DISRUPTED_TAINT,
            "aws-node-termination-handler/spot-itn",
            "aws-node-termination-handler/asg-lifecycle-termination",
            "aws-node-termination-handler/scheduled-maintenance",
        ] {
            assert!(is_forceful(&look(node(taint(key)), None)), "{key}");
        }
        for key in [
            CLUSTER_AUTOSCALER_TAINT,
            CLUSTER_AUTOSCALER_CANDIDATE_TAINT,
            "aws-node-termination-handler/rebalance-recommendation",
        ] {
            assert!(!is_forceful(&look(node(taint(key)), None)), "{key}");
        }
        let drift = look(
            node(json!([])),
            Some(claim(
                json!([{"type": "Drifted", "status": "True"}]),
                false,
                json!({}),
            )),
        );
        assert!(!is_forceful(&drift));
    }

    #[test]
    fn a_drifted_nodeclaim_is_a_graceful_release() {
        let c = claim(
            json!([{"type": "Drifted", "status": "True"}]),
            false,
            json!({}),
        );
        let s = detect(
            &node(json!([])),
            Some(&c),
            &SignalsSpec::default(),
            now(),
            grace,
        )
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
            detect(
                &node(json!([])),
                Some(&c),
                &SignalsSpec::default(),
                now(),
                grace
            ),
            None
        );
    }

    #[test]
    fn a_deleted_nodeclaims_deadline_comes_before_karpenter_deletes_the_first_protected_pod() {
        let c = claim(
            json!([{"type": "Drifted", "status": "True"}]),
            true,
            json!({TERMINATION_TIMESTAMP_ANNOTATION: "2026-12-01T12:30:00Z"}),
        );
        // Karpenter deletes a pod with 120 s grace at 12:28:00; the backup must be verified 10 s before.
        let s = detect(
            &node(json!([])),
            Some(&c),
            &SignalsSpec::default(),
            now(),
            || Duration::from_secs(120),
        )
        .expect("signal");
        assert_eq!(s.reason, "NodeClaimDeleted");
        assert_eq!(
            s.deadline,
            Some("2026-12-01T12:27:50Z".parse().expect("valid"))
        );
        // Pods with no grace: Karpenter deletes them at the termination time itself.
        let s = detect(
            &node(json!([])),
            Some(&c),
            &SignalsSpec::default(),
            now(),
            || Duration::ZERO,
        )
        .expect("signal");
        assert_eq!(
            s.deadline,
            Some("2026-12-01T12:29:50Z".parse().expect("valid"))
        );
        // No termination timestamp (no terminationGracePeriod): no deadline, and no pods are asked about.
        let c = claim(json!([]), true, json!({}));
        let s = detect(
            &node(json!([])),
            Some(&c),
            &SignalsSpec::default(),
            now(),
            || panic!("the grace is asked only for a termination time"),
        )
        .expect("signal");
        assert_eq!(s.deadline, None);
    }

    #[test]
    fn the_longest_grace_counts_and_an_unset_grace_is_the_api_servers_default() {
        let pod = |grace: Value| -> Pod {
            serde_json::from_value(
                json!({"spec": {"containers": [], "terminationGracePeriodSeconds": grace}}),
            )
            .expect("a pod")
        };
        assert_eq!(pod_grace(&pod(json!(45))), Duration::from_secs(45));
        assert_eq!(pod_grace(&pod(json!(null))), Duration::from_secs(30));
        assert_eq!(pod_grace(&pod(json!(-5))), Duration::ZERO);
        let t: jiff::Timestamp = "2026-12-01T12:30:00Z".parse().expect("valid");
        assert_eq!(
            termination_deadline(t, Duration::from_secs(30)),
            "2026-12-01T12:29:20Z"
                .parse::<jiff::Timestamp>()
                .expect("valid")
        );
        // A grace beyond any date does not overflow: the deadline is as early as can be.
        assert_eq!(
            termination_deadline(t, Duration::from_secs(u64::MAX)),
            jiff::Timestamp::MIN
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
            detect(
                &node(json!([])),
                Some(&c),
                &SignalsSpec::default(),
                now(),
                grace
            ),
            None
        );
        let releasing = SignalsSpec {
            consolidation: ConsolidationAction::Release,
            ..SignalsSpec::default()
        };
        let s = detect(&node(json!([])), Some(&c), &releasing, now(), grace).expect("released");
        assert_eq!(s.reason, "Consolidatable");
    }

    #[test]
    fn a_node_is_being_taken_once_a_disruptor_has_committed_to_it() {
        let taint = |key: &str| json!([{"key": key, "effect": "NoSchedule"}]);
        assert!(taking(&node(taint(KARPENTER_DISRUPTED_TAINT)), None).is_some());
        assert!(taking(&node(taint(CLUSTER_AUTOSCALER_TAINT)), None).is_some());
        assert!(taking(&node(json!([])), Some(&claim(json!([]), true, json!({})))).is_some());
        let mut deleting = node(json!([]));
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
        assert!(taking(&deleting, None).is_some());
        // Drift, consolidation and NTH's rebalance recommendation are reasons, not a drain under way.
        let drifted = claim(
            json!([{"type": "Drifted", "status": "True"}]),
            false,
            json!({}),
        );
        assert_eq!(taking(&node(json!([])), Some(&drifted)), None);
        assert_eq!(
            taking(
                &node(taint(
                    "aws-node-termination-handler/rebalance-recommendation"
                )),
                None
            ),
            None
        );
    }

    #[test]
    fn taints_of_other_disruptors_are_signals() {
        let ca = node(
            json!([{"key": CLUSTER_AUTOSCALER_TAINT, "value": "1764590000", "effect": "NoSchedule"}]),
        );
        let s = detect(&ca, None, &SignalsSpec::default(), now(), grace).expect("CA");
        assert_eq!(s.source, PlanSource::ClusterAutoscaler);
        let spot = node(
            json!([{"key": "aws-node-termination-handler/spot-itn", "value": "ev-1", "effect": "NoSchedule"}]),
        );
        let s = detect(&spot, None, &SignalsSpec::default(), now(), grace).expect("NTH");
        assert_eq!(s.source, PlanSource::NodeTerminationHandler);
        // Two minutes from the notice, less the pods' 30 s grace and the 10 s margin.
        assert_eq!(
            s.deadline,
            Some(now() + jiff::SignedDuration::from_secs(80))
        );
        let karpenter = node(json!([{"key": KARPENTER_DISRUPTED_TAINT, "effect": "NoSchedule"}]));
        assert_eq!(
            detect(&karpenter, None, &SignalsSpec::default(), now(), grace).map(|s| s.reason),
            Some("Disrupting".into())
        );
        assert_eq!(
            detect(
                &node(json!([])),
                None,
                &SignalsSpec::default(),
                now(),
                grace
            ),
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
        assert_eq!(
            detect(&node(json!([])), Some(&c), &ignore, now(), grace),
            None
        );
        let ca = node(json!([{"key": CLUSTER_AUTOSCALER_TAINT, "effect": "NoSchedule"}]));
        assert_eq!(detect(&ca, None, &ignore, now(), grace), None);
        let unneeded = node(
            json!([{"key": CLUSTER_AUTOSCALER_CANDIDATE_TAINT, "effect": "PreferNoSchedule"}]),
        );
        assert_eq!(detect(&unneeded, None, &ignore, now(), grace), None);
    }

    #[test]
    fn cluster_autoscalers_unneeded_mark_starts_a_plan_before_its_drain_and_is_no_drain_under_way()
    {
        let unneeded = node(
            json!([{"key": CLUSTER_AUTOSCALER_CANDIDATE_TAINT, "value": "1764590000", "effect": "PreferNoSchedule"}]),
        );
        let s = detect(&unneeded, None, &SignalsSpec::default(), now(), grace).expect("CA");
        assert_eq!(
            (s.source, s.reason.as_str(), s.mode, s.deadline),
            (
                PlanSource::ClusterAutoscaler,
                "ScaleDownCandidate",
                PlanMode::Release,
                None
            )
        );
        // CA may drop the candidate: a released node with only the soft taint is not being taken, so
        // the release window still brings the holds back.
        assert_eq!(taking(&unneeded, None), None);
        // Both taints: the drain itself is the signal.
        let draining = node(json!([
            {"key": CLUSTER_AUTOSCALER_CANDIDATE_TAINT, "value": "1764590000", "effect": "PreferNoSchedule"},
            {"key": CLUSTER_AUTOSCALER_TAINT, "value": "1764590600", "effect": "NoSchedule"}
        ]));
        let s = detect(&draining, None, &SignalsSpec::default(), now(), grace).expect("CA");
        assert_eq!(s.reason, "ScaleDown");
    }
}
