//! Review finding #6: a node Karpenter terminates forcefully goes whatever snapdrain does. Without a
//! NodeClaim terminationGracePeriod, Karpenter's terminator neither evicts a `do-not-disrupt` pod nor
//! force-deletes it (kubernetes-sigs/karpenter `pkg/controllers/node/termination/terminator/eviction.go`
//! `needsForceDelete` is false without a termination time), so a hold that stays when snapdrain will not
//! back the node up (the policy ignores the signal, or its plan ended without a backup) leaves the node
//! half-drained for good. snapdrain lets such a node go, and says so on the Node. And a released node
//! a disruptor has started to take keeps its holds released past the release window (review #13).

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::json;
use snapdrain::api::status::PlanPhase;
use snapdrain::api::{DisruptionPlan, DisruptionPolicy};
use snapdrain_sim::apiserver::faults::FaultRule;
use snapdrain_testkit::harness::{Harness, TIMEOUT};

/// Long enough for the simulated Karpenter's terminator to evict the node's pods and delete it.
const NODE_GONE: Duration = Duration::from_secs(90);

fn nodeclaims(h: &Harness) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim");
    Api::all_with(
        h.client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "nodeclaims"),
    )
}

/// The controller with its gate under `failurePolicy: Fail`: an eviction that goes was allowed by the
/// gate, not let through by a failing call.
async fn gated_controller(h: &Harness) -> snapdrain::controller::ControllerHandle {
    snapdrain_testkit::gate::controller_with_gate(
        h,
        "Fail",
        snapdrain::webhook::Lifetimes::default(),
        Duration::from_secs(30),
    )
    .await
}

async fn wait_node_gone(h: &Harness, node: &str) {
    h.wait_all_within(
        Api::<Node>::all(h.client.clone()),
        &format!("Karpenter to take node {node}"),
        NODE_GONE,
        |ns| !ns.iter().any(|n| n.name_any() == node),
    )
    .await;
}

/// The note of the `ProtectedPodsLetGo` Event on `node`.
async fn let_go_note(h: &Harness, node: &str) -> String {
    let is_it = |e: &Event| {
        e.reason.as_deref() == Some("ProtectedPodsLetGo")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
    };
    h.wait_all(
        Api::<Event>::all(h.client.clone()),
        "a ProtectedPodsLetGo event on the node",
        |es| es.iter().any(is_it),
    )
    .await
    .iter()
    .find(|e| is_it(e))
    .and_then(|e| e.note.clone())
    .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forceful_termination_the_policy_ignores_takes_the_node_and_says_so() {
    let h = Harness::start().await;
    let policy: DisruptionPolicy = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": "default"},
        "spec": {"signals": {"termination": "Ignore"}}
    }))
    .expect("a policy");
    Api::<DisruptionPolicy>::all(h.client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("create the policy");
    let _controller = gated_controller(&h).await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    assert!(!protected.is_empty());
    // Held first, as every protected pod is while nothing happens.
    h.wait_all(Api::<Node>::all(h.client.clone()), "the node held", |ns| {
        ns.iter().any(|n| {
            n.name_any() == node
                && n.annotations()
                    .get("karpenter.sh/do-not-disrupt")
                    .map(String::as_str)
                    == Some("true")
        })
    })
    .await;
    let claim = h.nodeclaim_of(&node).await;
    nodeclaims(&h)
        .delete(&claim, &Default::default())
        .await
        .expect("delete the NodeClaim, as expiry or `kubectl delete nodeclaim` does");

    wait_node_gone(&h, &node).await;
    let note = let_go_note(&h, &node).await;
    assert!(
        note.contains("ignores this signal") && note.contains("WITHOUT a backup"),
        "{note}"
    );
    for pod in protected.keys() {
        assert!(note.contains(pod.as_str()), "{pod} named in: {note}");
    }
    // No plan took the deletion. (The gate may have started one for Karpenter's first eviction if that
    // came before its NodeClaim cache showed the deletion; such a plan then never holds the node.)
    let took: Vec<String> = h
        .plans_for(&node)
        .await
        .iter()
        .filter(|p| {
            p.annotations()
                .get("snapdrain.io/signals")
                .is_some_and(|s| s.contains("NodeClaimDeleted"))
        })
        .map(|p| p.name_any())
        .collect();
    assert!(took.is_empty(), "the policy ignores the deletion: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forceful_plan_that_ends_without_a_backup_lets_karpenter_take_the_node() {
    let h = Harness::start().await;
    // Velero refuses every Backup: the plan stays in BackingUp until a person aborts it.
    h.cluster.faults.add(FaultRule {
        verb: Some("create".into()),
        resource: Some("backups.velero.io".into()),
        error_rate: 1.0,
        error_code: Some(500),
        ..FaultRule::default()
    });
    let _controller = gated_controller(&h).await;
    let node = h.node_with_statefulset_pods().await;
    let claim = h.nodeclaim_of(&node).await;
    nodeclaims(&h)
        .delete(&claim, &Default::default())
        .await
        .expect("delete the NodeClaim");
    // The plan that took the NodeClaim deletion: the signal watcher's own, or the one the gate started
    // for Karpenter's first eviction, which the watcher then joins (it records the signal on the plan).
    let took_the_deletion = |p: &DisruptionPlan| {
        p.spec.nodes.contains(&node)
            && p.annotations()
                .get("snapdrain.io/signals")
                .is_some_and(|s| s.contains("NodeClaimDeleted"))
    };
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    let plan = h
        .wait_all(
            plans.clone(),
            "the plan that took the NodeClaim deletion",
            |ps| ps.iter().any(took_the_deletion),
        )
        .await
        .into_iter()
        .find(took_the_deletion)
        .expect("found")
        .name_any();
    h.wait_phase(&plan, PlanPhase::BackingUp).await;
    // While the plan runs the node is kept: the holds stay until a verified backup or the plan's end.
    assert!(h.node(&node).await.is_some());
    plans
        .patch(
            &plan,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                snapdrain::api::ABORT_ANNOTATION: "true"}}})),
        )
        .await
        .expect("abort the plan");
    let done = h.wait_plan(&plan, TIMEOUT, PlanPhase::is_terminal).await;
    assert_eq!(done.status.map(|s| s.phase), Some(PlanPhase::Aborted));

    wait_node_gone(&h, &node).await;
    let note = let_go_note(&h, &node).await;
    assert!(
        note.contains(&plan) && note.contains("Aborted") && note.contains("WITHOUT a backup"),
        "{note}"
    );
}

/// Review #13: a released node a disruptor has started to take is mid-drain. The release window ending
/// then must not restore the holds (Karpenter's terminator would skip the pods and the drain stall) nor
/// end the run (the next one would back the node up again): the plan waits for the node to go.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_window_that_passes_mid_drain_keeps_the_holds_released_until_the_node_goes() {
    let h = Harness::start().await;
    let _controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    h.create_plan(
        "taken-late",
        json!({"nodes": [node], "mode": "Release", "releaseWindow": "2s"}),
    )
    .await;
    h.wait_plan_until("taken-late", TIMEOUT, |p| {
        p.status.as_ref().is_some_and(|s| s.released_at.is_some())
    })
    .await;
    // Cluster Autoscaler commits to the node (its drain would follow; none runs here).
    Api::<Node>::all(h.client.clone())
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [{
                "key": "ToBeDeletedByClusterAutoscaler", "value": "1764590000", "effect": "NoSchedule"}]}})),
        )
        .await
        .expect("taint the node as Cluster Autoscaler does");
    let waiting = h
        .wait_plan_until("taken-late", TIMEOUT, |p| {
            p.status
                .as_ref()
                .and_then(|s| s.message.as_deref())
                .is_some_and(|m| m.contains("release window has passed"))
        })
        .await;
    let status = waiting.status.expect("status");
    assert!(!status.phase.is_terminal(), "{:?}", status.message);
    assert!(status.release.is_none(), "{:?}", status.release);
    for pod in protected.keys() {
        let (ns, name) = pod.split_once('/').expect("ns/name");
        let p = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(h.client.clone(), ns)
            .get(name)
            .await
            .expect("the pod is still there");
        assert_eq!(
            p.annotations()
                .get("snapdrain.io/released-by")
                .map(String::as_str),
            Some("taken-late"),
            "{pod} stays released: {:?}",
            p.annotations()
        );
    }
    // The node goes (here through Karpenter's own termination, which drains the released pods at once),
    // and the run ends with it.
    let claim = h.nodeclaim_of(&node).await;
    nodeclaims(&h)
        .delete(&claim, &Default::default())
        .await
        .expect("delete the NodeClaim");
    let done = h
        .wait_plan("taken-late", NODE_GONE, PlanPhase::is_terminal)
        .await;
    let status = done.status.expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{:?}", status.message);
    assert!(
        !status
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("within the release window"),
        "{:?}",
        status.message
    );
}
