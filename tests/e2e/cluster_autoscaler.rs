//! Cluster Autoscaler choosing on its own to remove an underutilised node that runs protected pods
//! (review 3, #11). The simulated CA scans as CA does (kubernetes/autoscaler
//! `cluster-autoscaler/core/scaledown/eligibility/eligibility.go` utilisation threshold,
//! `simulator/drainability/rules/rules.go` drainability, `core/scaledown/unneeded/nodes.go` unneeded time,
//! `core/scaledown/actuation/softtaint.go` the `DeletionCandidateOfClusterAutoscaler` soft taint,
//! `actuation/drain.go` evictions retried until `--max-pod-eviction-time`); nothing here taints a node by
//! hand. Under the default policy snapdrain places no `safe-to-evict: "false"` (which would keep CA off
//! the node for good, `rules/notsafetoevict/rule.go`): the soft taint starts the backup, and the eviction
//! gate holds CA's drain until it is verified.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::Api;
use snapdrain::api::status::PlanPhase;
use snapdrain::api::{DisruptionPlan, PlanSource};
use snapdrain_sim::scenario::format::NodeGroup;
use snapdrain_sim::world::autoscaler::{AutoscalerSettings, NODE_GROUP_LABEL, USER_AGENT};
use snapdrain_testkit::harness::{Harness, assert_no_eviction_before_verified_backup};

/// The node of the CA-managed node group (the quickstart's six nodes are Karpenter's, which CA does not
/// manage). Twice the size of the others, so the scheduler, which prefers the node with the most free CPU
/// among those with the fewest pods of the same owner, puts the first pod of each workload there.
const CA_NODE: &str = "ca-workers-1";

/// The quickstart scenario plus one node of an EKS managed node group that CA scales down by itself,
/// its scans and retries cut to seconds; `unneeded_time` is `--scale-down-unneeded-time`.
async fn ca_cluster(unneeded_time: Duration) -> Harness {
    Harness::start_scenario("quickstart", |s| {
        for pool in &mut s.node_pools {
            // Karpenter's consolidation is not what these tests are about.
            pool.consolidate_after = "Never".into();
        }
        s.nodes.push(NodeGroup {
            name: Some(CA_NODE.into()),
            zone: Some("us-east-1a".into()),
            instance_type: "m6i.2xlarge".into(),
            os_version: snapdrain_sim::scenario::format::default_os_version(),
            labels: BTreeMap::from([(NODE_GROUP_LABEL.to_string(), "workers".to_string())]),
            ..NodeGroup::default()
        });
        s.cluster_autoscaler = Some(AutoscalerSettings {
            scale_down_enabled: true,
            scan_interval: Duration::from_millis(500),
            scale_down_unneeded_time: unneeded_time,
            scale_down_delay_after_failure: Duration::from_secs(2),
            eviction_retry_time: Duration::from_secs(1),
            max_pod_eviction_time: Duration::from_secs(90),
            pod_eviction_headroom: Duration::from_secs(2),
            pod_gone_poll: Duration::from_millis(200),
            ..AutoscalerSettings::default()
        });
    })
    .await
}

async fn gated_controller(h: &Harness) -> snapdrain::controller::ControllerHandle {
    snapdrain_testkit::gate::controller_with_gate(
        h,
        "Ignore",
        snapdrain::webhook::Lifetimes::default(),
        Duration::from_secs(30),
    )
    .await
}

fn has_taint(n: &Node, key: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

/// The protected pods CA's node runs at the start, by the oracle's rule; the test needs some.
async fn protected_on_ca_node(h: &Harness) -> BTreeMap<String, std::collections::BTreeSet<String>> {
    let protected = h.protected_pods_on(CA_NODE).await;
    assert!(
        !protected.is_empty(),
        "the scheduler put no protected pod on {CA_NODE}: {:?}",
        Api::<Pod>::namespaced(h.client.clone(), "shop")
            .list(&Default::default())
            .await
            .map(|l| l
                .items
                .iter()
                .map(|p| (
                    p.name_any(),
                    p.spec.as_ref().and_then(|s| s.node_name.clone())
                ))
                .collect::<Vec<_>>())
    );
    protected
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_autoscaler_removes_an_underutilised_node_with_protected_pods_after_a_verified_backup()
 {
    let h = ca_cluster(Duration::from_secs(3)).await;
    let protected = protected_on_ca_node(&h).await;
    let _controller = gated_controller(&h).await;
    snapdrain_testkit::eventually_within(
        "Cluster Autoscaler removed its underutilised node",
        Duration::from_secs(180),
        || async { h.node(CA_NODE).await.is_none().then_some(()) },
    )
    .await;
    let audit = h.audit();
    let at = |verb: &str| {
        audit
            .iter()
            .position(|e| e.verb == verb && e.name.as_deref() == Some(CA_NODE))
            .unwrap_or_else(|| panic!("no {verb} for {CA_NODE} in the audit log"))
    };
    assert!(
        at("scale-down-unneeded") < at("scale-down-tainted")
            && at("scale-down-tainted") < at("scale-down-deleted"),
        "CA found the node unneeded, then drained and deleted it"
    );
    let refused = audit
        .iter()
        .filter(|e| {
            e.resource == "pods/eviction"
                && e.code == Some(429)
                && e.user_agent.as_deref() == Some(USER_AGENT)
        })
        .count();
    let plans = h.plans_for(CA_NODE).await;
    assert_eq!(plans.len(), 1, "one plan for the node: {plans:#?}");
    let done = h
        .wait_plan(
            &plans[0].name_any(),
            Duration::from_secs(60),
            PlanPhase::is_terminal,
        )
        .await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{:?}", status.message);
    assert!(
        !status.backups.is_empty() && status.backups.iter().all(|b| b.verified),
        "a verified backup: {:#?} (CA was refused {refused} times)",
        status.backups
    );
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_autoscalers_unneeded_mark_starts_the_backup_before_its_drain() {
    // CA drains only after ten minutes of the node being unneeded: the backup must not wait for that.
    let h = ca_cluster(Duration::from_secs(600)).await;
    let protected = protected_on_ca_node(&h).await;
    let _controller = gated_controller(&h).await;
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    let found = h
        .wait_all(plans, "a plan for CA's unneeded node", |ps| {
            ps.iter().any(|p| p.spec.nodes.iter().any(|n| n == CA_NODE))
        })
        .await;
    let plan = found
        .into_iter()
        .find(|p| p.spec.nodes.iter().any(|n| n == CA_NODE))
        .expect("the wait returned it");
    assert_eq!(plan.spec.source, PlanSource::ClusterAutoscaler);
    assert_eq!(plan.spec.reason.as_deref(), Some("ScaleDownCandidate"));
    let verified = h
        .wait_plan_until(&plan.name_any(), Duration::from_secs(90), |p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.released_at.is_some() || s.phase.is_terminal())
        })
        .await;
    let status = verified.status.expect("status");
    let mut released: Vec<String> = status
        .released_pods
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    released.sort();
    assert_eq!(
        released,
        protected.keys().cloned().collect::<Vec<_>>(),
        "the node's protected pods were backed up and released: {:?}",
        status.message
    );
    let n = h.node(CA_NODE).await.expect("the node is still there");
    // The soft taint came first. It may be off now: while Velero's hosting pod (owned by its
    // PodVolumeBackup, a custom controller) runs there, CA's `replicated` rule keeps the node needed.
    assert!(
        h.audit()
            .iter()
            .any(|e| e.verb == "scale-down-unneeded" && e.name.as_deref() == Some(CA_NODE)),
        "CA marked the node unneeded"
    );
    assert!(
        !has_taint(&n, "ToBeDeletedByClusterAutoscaler"),
        "CA has not started draining"
    );
    assert!(
        h.accepted_evictions().is_empty(),
        "nothing was evicted while CA only marked the node"
    );
}
