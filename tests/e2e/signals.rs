//! Alongside the autoscaler: holds on protected pods, Karpenter's signals turned into Release plans, the
//! release window, and the DisruptionPolicy. The simulated Karpenter disrupts as Karpenter v1 does
//! (research/karpenter.md: graceful methods skip nodes with an active `karpenter.sh/do-not-disrupt` pod,
//! kubernetes-sigs/karpenter `pkg/controllers/disruption/types.go` `NewCandidate`; forceful termination
//! waits for such pods until terminationGracePeriod, `pkg/controllers/node/termination`).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};
use snapdrain::api::status::PlanPhase;
use snapdrain::api::{DisruptionPlan, DisruptionPolicy};
use snapdrain_testkit::harness::{Harness, TIMEOUT, assert_no_eviction_before_verified_backup};

const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
const HELD: &str = "snapdrain.io/held";

fn annotation<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.annotations().get(key).map(String::as_str)
}

/// The oracle's own idea of a protected pod: a running StatefulSet pod with a PVC (DESIGN.md, the promise).
fn protected(p: &Pod) -> bool {
    let sts = p
        .owner_references()
        .iter()
        .any(|o| o.kind == "StatefulSet" && o.controller == Some(true));
    let pvc = p
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.persistent_volume_claim.is_some()));
    let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    sts && pvc && running && p.metadata.deletion_timestamp.is_none()
}

/// Held as the default policy holds (`holds.clusterAutoscaler: Gate`): Karpenter's hold, snapdrain's own,
/// and no Cluster Autoscaler hold (CA may pick the node; the eviction gate holds its drain).
fn held(p: &Pod) -> bool {
    annotation(p, DO_NOT_DISRUPT) == Some("true")
        && annotation(p, HELD) == Some("do-not-disrupt")
        && annotation(p, SAFE_TO_EVICT).is_none()
}

fn nodeclaims(h: &Harness) -> Api<DynamicObject> {
    snapdrain_testkit::karpenter::nodeclaims(&h.client)
}

fn nodepools(h: &Harness) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool");
    Api::all_with(
        h.client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "nodepools"),
    )
}

async fn drift(h: &Harness, node: &str) {
    let claim = h.nodeclaim_of(node).await;
    snapdrain_testkit::karpenter::mark_drifted(&h.client, &claim)
        .await
        .expect("mark the NodeClaim drifted");
}

/// Karpenter's forceful path: the node's NodeClaim, given a terminationGracePeriod (so Karpenter
/// writes the termination timestamp), is deleted. Returns the NodeClaims API and the claim's name.
async fn delete_nodeclaim_with_grace(
    h: &Harness,
    node: &str,
    period: &str,
) -> (Api<DynamicObject>, String) {
    let api = nodeclaims(h);
    let claim = h.nodeclaim_of(node).await;
    snapdrain_testkit::karpenter::set_termination_grace_period(&h.cluster, &claim, period)
        .expect("set terminationGracePeriod");
    api.delete(&claim, &Default::default())
        .await
        .expect("delete the NodeClaim");
    (api, claim)
}

/// The controller with its eviction gate, as the chart installs it. Karpenter's forceful termination
/// evicts Velero 1.17+'s hosting pods on its first pass over the node: the hold keeper's
/// `do-not-disrupt` on them lands a moment after they appear, and the gate covers that moment.
async fn gated_controller(h: &Harness) -> snapdrain::controller::ControllerHandle {
    snapdrain_testkit::gate::controller_with_gate(
        h,
        "Ignore",
        snapdrain::webhook::Lifetimes::default(),
        Duration::from_secs(30),
    )
    .await
}

async fn wait_signal_plan(h: &Harness, node: &str) -> DisruptionPlan {
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    let found = h
        .wait_all(plans, &format!("a signal plan for {node}"), |ps| {
            ps.iter().any(|p| p.spec.nodes.iter().any(|n| n == node))
        })
        .await;
    found
        .into_iter()
        .find(|p| p.spec.nodes.iter().any(|n| n == node))
        .expect("the wait returned it")
}

async fn wait_all_protected_held(h: &Harness) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    h.wait_all(pods, "every protected pod held", |ps| {
        let protected: Vec<&Pod> = ps.iter().filter(|p| protected(p)).collect();
        protected.len() == 5 && protected.iter().all(|p| held(p))
    })
    .await
}

#[tokio::test]
async fn protected_pods_are_held_and_a_users_own_annotation_is_left_alone() {
    let h = Harness::start().await;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    // A user lets Cluster Autoscaler evict redis-0 (its own annotation), before snapdrain starts.
    pods.patch(
        "redis-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {SAFE_TO_EVICT: "true"}}})),
    )
    .await
    .expect("annotate redis-0");
    let _controller = h.controller().await;
    let all = h
        .wait_all(pods.clone(), "protected pods held", |ps| {
            ps.iter().filter(|p| protected(p)).all(|p| {
                annotation(p, DO_NOT_DISRUPT) == Some("true") && annotation(p, HELD).is_some()
            }) && ps.iter().filter(|p| protected(p)).count() == 5
        })
        .await;
    let redis0 = all
        .iter()
        .find(|p| p.name_any() == "redis-0")
        .expect("redis-0");
    assert_eq!(
        annotation(redis0, SAFE_TO_EVICT),
        Some("true"),
        "the user's value stays"
    );
    assert_eq!(
        annotation(redis0, HELD),
        Some("do-not-disrupt"),
        "only what snapdrain set is marked"
    );
    for p in all.iter().filter(|p| !protected(p)) {
        assert_eq!(
            annotation(p, HELD),
            None,
            "{} is not protected",
            p.name_any()
        );
        assert_eq!(annotation(p, DO_NOT_DISRUPT), None, "{}", p.name_any());
    }
    // A new pod (postgres-1 deleted and re-created by its StatefulSet) is held as soon as it appears.
    let before = pods.get("postgres-1").await.expect("postgres-1").uid();
    pods.delete("postgres-1", &Default::default())
        .await
        .expect("delete postgres-1");
    h.wait_all(pods.clone(), "the new postgres-1 held", |ps| {
        ps.iter()
            .any(|p| p.name_any() == "postgres-1" && p.uid() != before && protected(p) && held(p))
    })
    .await;
    // The default DisruptionPolicy was created.
    let policies: Api<DisruptionPolicy> = Api::all(h.client.clone());
    h.wait_all(policies, "the default policy", |ps| {
        ps.iter().any(|p| p.name_any() == "default")
    })
    .await;
}

#[tokio::test]
async fn a_drifted_node_is_released_to_karpenter_only_after_its_backup_is_verified() {
    let h = Harness::start().await;
    let _controller = h.controller().await;
    wait_all_protected_held(&h).await;
    let node = h.node_with_statefulset_pods().await;
    let protected_on_node = h.protected_pods_on(&node).await;
    drift(&h, &node).await;
    let plan = wait_signal_plan(&h, &node).await;
    assert_eq!(plan.spec.mode, snapdrain::api::PlanMode::Release);
    assert_eq!(plan.spec.source, snapdrain::api::PlanSource::Karpenter);
    assert_eq!(plan.spec.reason.as_deref(), Some("Drifted"));
    let done = h
        .wait_plan(
            &plan.name_any(),
            Duration::from_secs(120),
            PlanPhase::is_terminal,
        )
        .await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{:?}", status.message);
    assert!(!status.released_pods.is_empty(), "the plan released holds");
    let released: Vec<String> = status
        .released_pods
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    let mut expected: Vec<String> = protected_on_node.keys().cloned().collect();
    expected.sort();
    let mut got = released.clone();
    got.sort();
    assert_eq!(
        got, expected,
        "exactly the node's protected pods were released"
    );
    assert!(h.node(&node).await.is_none(), "Karpenter replaced the node");
    assert_no_eviction_before_verified_backup(&h.audit(), &protected_on_node, &done);
    // Every pod that is back (on another node) is held again.
    wait_all_protected_held(&h).await;
}

/// Review finding #5: a Release plan evicts nothing, so kubectl drain's refusals (emptyDir, no
/// controller) are the drainer's to make. Karpenter evicts such pods (`pkg/utils/pod/scheduling.go`
/// `IsEvictable` has no emptyDir or owner test); a Release plan that refused them sat in Pending for good
/// and the node was never replaced.
#[tokio::test]
async fn a_drifted_node_with_an_empty_dir_pod_and_a_bare_pod_is_still_released() {
    let h = Harness::start().await;
    let _controller = h.controller().await;
    wait_all_protected_held(&h).await;
    let node = h.node_with_statefulset_pods().await;
    let protected_on_node = h.protected_pods_on(&node).await;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    for (name, volumes) in [
        ("scratch", json!([{"name": "cache", "emptyDir": {}}])),
        ("runner", json!([])),
    ] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}],
                     "volumes": volumes}
        }))
        .expect("a pod");
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create a bare pod on the node");
    }
    drift(&h, &node).await;
    let plan = wait_signal_plan(&h, &node).await;
    let done = h
        .wait_plan(
            &plan.name_any(),
            Duration::from_secs(120),
            PlanPhase::is_terminal,
        )
        .await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{:?}", status.message);
    assert!(h.node(&node).await.is_none(), "Karpenter replaced the node");
    assert_no_eviction_before_verified_backup(&h.audit(), &protected_on_node, &done);
}

#[tokio::test]
async fn the_release_window_restores_the_holds_and_the_next_run_reuses_the_backup() {
    let h = Harness::start().await;
    // Karpenter may disrupt nothing (budget 0), so a released node is never taken.
    nodepools(&h)
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"disruption": {"budgets": [{"nodes": "0"}]}}})),
        )
        .await
        .expect("set the budget to 0");
    let policies: Api<DisruptionPolicy> = Api::all(h.client.clone());
    let policy: DisruptionPolicy = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": "default"}, "spec": {"releaseWindow": "2s"}
    }))
    .expect("a policy");
    policies
        .create(&PostParams::default(), &policy)
        .await
        .expect("create the policy");
    let _controller = h.controller().await;
    wait_all_protected_held(&h).await;
    let node = h.node_with_statefulset_pods().await;
    drift(&h, &node).await;
    let first = wait_signal_plan(&h, &node).await;
    let done = h
        .wait_plan(&first.name_any(), TIMEOUT, PlanPhase::is_terminal)
        .await;
    let status = done.status.expect("status");
    assert_eq!(status.phase, PlanPhase::Completed);
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("release window"),
        "{:?}",
        status.message
    );
    assert!(
        h.node(&node).await.is_some(),
        "Karpenter could not take the node"
    );
    // The signal is still there: the next run reuses the verified backup instead of a second one.
    let second = h
        .wait_all(
            Api::<DisruptionPlan>::all(h.client.clone()),
            "a second run for the drifted node",
            |ps| {
                ps.iter().any(|p| {
                    p.name_any() != first.name_any()
                        && p.spec.nodes.iter().any(|n| n == &node)
                        && p.status.as_ref().is_some_and(|s| !s.backups.is_empty())
                })
            },
        )
        .await
        .into_iter()
        .find(|p| p.name_any() != first.name_any() && p.spec.nodes.iter().any(|n| n == &node))
        .expect("the second run");
    let backups = second.status.expect("status").backups;
    assert!(backups.iter().all(|b| b.reused), "{backups:#?}");
    // Between runs the holds came back; every protected pod on the node is held or released by a run.
    let pods: Api<Pod> = Api::all(h.client.clone());
    let on_node: Vec<Pod> = pods
        .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(protected)
        .collect();
    assert!(!on_node.is_empty());
    for p in on_node {
        let released_by = annotation(&p, "snapdrain.io/released-by");
        assert!(
            held(&p) || released_by.is_some_and(|r| r != first.name_any()),
            "{} is neither held nor released by the current run: {:?}",
            p.name_any(),
            p.annotations()
        );
    }
}

#[tokio::test]
async fn a_deleted_nodeclaim_makes_a_plan_with_karpenters_deadline() {
    let h = Harness::start().await;
    let _controller = gated_controller(&h).await;
    wait_all_protected_held(&h).await;
    let node = h.node_with_statefulset_pods().await;
    let protected_on_node = h.protected_pods_on(&node).await;
    let (api, claim) = delete_nodeclaim_with_grace(&h, &node, "10m").await;
    let plan = wait_signal_plan(&h, &node).await;
    assert_eq!(plan.spec.reason.as_deref(), Some("NodeClaimDeleted"));
    // Karpenter writes the termination timestamp right after the deletion; the plan may have been made
    // just before it, and then takes the deadline when the signal comes again.
    let plan = h
        .wait_plan_until(&plan.name_any(), TIMEOUT, |p| p.spec.deadline.is_some())
        .await;
    let claim_now: Value = serde_json::to_value(api.get(&claim).await.expect("still terminating"))
        .expect("serializes");
    let stamp =
        claim_now["metadata"]["annotations"]["karpenter.sh/nodeclaim-termination-timestamp"]
            .as_str()
            .expect("Karpenter wrote the termination timestamp");
    // Karpenter DELETEs each pod at terminationTime − its grace (terminator/eviction.go
    // needsForceDelete): the deadline is before the longest-grace protected pod goes, with 10 s to spare.
    let longest = Api::<Pod>::all(h.client.clone())
        .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .expect("list pods")
        .items
        .iter()
        .filter(|p| {
            protected_on_node.contains_key(&format!(
                "{}/{}",
                p.namespace().unwrap_or_default(),
                p.name_any()
            ))
        })
        .filter_map(|p| p.spec.as_ref()?.termination_grace_period_seconds)
        .max()
        .expect("the protected pods have a grace (the API server defaults it)");
    let deadline = plan.spec.deadline.as_ref().expect("waited for it").0;
    assert_eq!(
        deadline,
        stamp.parse::<jiff::Timestamp>().expect("RFC 3339")
            - jiff::SignedDuration::from_secs(longest + 10)
    );
    let done = h
        .wait_plan(
            &plan.name_any(),
            Duration::from_secs(120),
            PlanPhase::is_terminal,
        )
        .await;
    assert_eq!(
        done.status.as_ref().map(|s| s.phase),
        Some(PlanPhase::Completed),
        "{:#?}",
        done.status
    );
    assert!(h.node(&node).await.is_none());
    assert_no_eviction_before_verified_backup(&h.audit(), &protected_on_node, &done);
}

#[tokio::test]
async fn an_nth_spot_notice_and_a_cluster_autoscaler_taint_become_plans() {
    let h = Harness::start().await;
    let _controller = h.controller().await;
    wait_all_protected_held(&h).await;
    let nodes: Api<Node> = Api::all(h.client.clone());
    let node = h.node_with_statefulset_pods().await;
    let taints = |key: &str, value: &str| json!({"spec": {"taints": [{"key": key, "value": value, "effect": "NoSchedule"}]}});
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(taints("aws-node-termination-handler/spot-itn", "ev-1")),
        )
        .await
        .expect("taint the node as NTH does");
    let plan = wait_signal_plan(&h, &node).await;
    assert_eq!(
        plan.spec.source,
        snapdrain::api::PlanSource::NodeTerminationHandler
    );
    assert_eq!(plan.spec.reason.as_deref(), Some("SpotInterruption"));
    let deadline = plan
        .spec
        .deadline
        .as_ref()
        .expect("a spot notice has a deadline")
        .0;
    let left = deadline.duration_since(jiff::Timestamp::now());
    assert!(
        left.as_secs() > 0 && left.as_secs() <= 120,
        "two minutes from the notice, got {left:?}"
    );
    // The backup is verified and the holds released, for NTH's drain to go ahead.
    let released = h
        .wait_plan_until(&plan.name_any(), Duration::from_secs(90), |p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.released_at.is_some() || s.phase.is_terminal())
        })
        .await;
    assert!(
        released
            .status
            .as_ref()
            .is_some_and(|s| !s.released_pods.is_empty())
    );

    // Cluster Autoscaler: another node with protected pods, its scale-down taint.
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    let other = pods
        .list(&Default::default())
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(protected)
        .filter_map(|p| p.spec.and_then(|s| s.node_name))
        .find(|n| n != &node)
        .expect("another node runs a protected pod");
    nodes
        .patch(
            &other,
            &PatchParams::default(),
            &Patch::Merge(taints("ToBeDeletedByClusterAutoscaler", "1764590000")),
        )
        .await
        .expect("taint the node as Cluster Autoscaler does");
    let plan = wait_signal_plan(&h, &other).await;
    assert_eq!(
        plan.spec.source,
        snapdrain::api::PlanSource::ClusterAutoscaler
    );
    assert_eq!(plan.spec.deadline, None);
}

#[tokio::test]
async fn an_invalid_policy_is_refused_and_protection_stays() {
    let h = Harness::start().await;
    let _controller = h.controller().await;
    wait_all_protected_held(&h).await;
    let policies: Api<DisruptionPolicy> = Api::all(h.client.clone());
    h.wait_all(policies.clone(), "the default policy", |ps| !ps.is_empty())
        .await;
    // A selector no API server would accept in a pod list: the controller names it and keeps the rules.
    policies
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"protection": {"podSelector": {"matchExpressions": [
                {"key": "tier", "operator": "Sometimes", "values": ["db"]}]}}}}),
            ),
        )
        .await
        .expect("the schema lets the operator through");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(h.client.clone());
    let found = h
        .wait_all(events, "an InvalidPolicy event", |es| {
            es.iter()
                .any(|e| e.reason.as_deref() == Some("InvalidPolicy"))
        })
        .await;
    let note = found
        .iter()
        .find(|e| e.reason.as_deref() == Some("InvalidPolicy"))
        .and_then(|e| e.note.clone())
        .unwrap_or_default();
    assert!(note.contains("spec.protection.podSelector"), "{note}");
    // Still every protected pod held (an invalid selector did not switch protection off).
    wait_all_protected_held(&h).await;
}

/// Review finding #6: a NodeClaim deleted with no terminationGracePeriod (expiry, a spot interruption
/// through Karpenter's queue, `kubectl delete nodeclaim`) carries no termination timestamp, yet the node
/// goes: Karpenter's terminator waits on the holds for good. Such a signal must not wait for a
/// maintenance window (here closed for the next two hours).
#[tokio::test]
async fn a_nodeclaim_deleted_without_a_grace_period_never_waits_for_a_window() {
    let h = Harness::start().await;
    let closed = (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(2))
        .to_zoned(jiff::tz::TimeZone::UTC);
    let schedule = format!("{} {} * * *", closed.minute(), closed.hour());
    let policy: DisruptionPolicy = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": "default"},
        "spec": {"maintenanceWindows": [{"schedule": schedule, "duration": "1m", "timeZone": "UTC"}]}
    }))
    .expect("a policy");
    Api::<DisruptionPolicy>::all(h.client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("create the policy");
    let _controller = gated_controller(&h).await;
    wait_all_protected_held(&h).await;
    let node = h.node_with_statefulset_pods().await;
    let protected_on_node = h.protected_pods_on(&node).await;
    let claim = h.nodeclaim_of(&node).await;
    nodeclaims(&h)
        .delete(&claim, &Default::default())
        .await
        .expect("delete the NodeClaim");
    let plan = wait_signal_plan(&h, &node).await;
    assert_eq!(plan.spec.reason.as_deref(), Some("NodeClaimDeleted"));
    assert!(plan.spec.deadline.is_none(), "no terminationGracePeriod");
    let done = h
        .wait_plan(
            &plan.name_any(),
            Duration::from_secs(120),
            PlanPhase::is_terminal,
        )
        .await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{:?}", status.message);
    assert!(h.node(&node).await.is_none(), "Karpenter took the node");
    assert_no_eviction_before_verified_backup(&h.audit(), &protected_on_node, &done);
}

#[tokio::test]
async fn graceful_signals_wait_for_a_maintenance_window_and_a_free_slot() {
    let h = Harness::start().await;
    // A window that opened a minute ago would be open; this one is never open now (it opens at a minute
    // two hours from now and lasts one minute).
    let closed = (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(2))
        .to_zoned(jiff::tz::TimeZone::UTC);
    let schedule = format!("{} {} * * *", closed.minute(), closed.hour());
    let policies: Api<DisruptionPolicy> = Api::all(h.client.clone());
    let policy: DisruptionPolicy = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": "default"},
        "spec": {"maintenanceWindows": [{"schedule": schedule, "duration": "1m", "timeZone": "UTC"}],
                 "concurrency": {"maxPlans": 1}}
    }))
    .expect("a policy");
    policies
        .create(&PostParams::default(), &policy)
        .await
        .expect("create the policy");
    let _controller = h.controller().await;
    wait_all_protected_held(&h).await;
    let first = h.node_with_statefulset_pods().await;
    drift(&h, &first).await;
    // The controller saw the signal and says on the Node why it waits; no plan is made.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(h.client.clone());
    let found = h
        .wait_all(
            events,
            "a DisruptionWaiting event on the drifted node",
            |es| {
                es.iter().any(|e| {
                    e.reason.as_deref() == Some("DisruptionWaiting")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some(first.as_str())
                })
            },
        )
        .await;
    let note = found
        .iter()
        .find(|e| e.reason.as_deref() == Some("DisruptionWaiting"))
        .and_then(|e| e.note.clone())
        .unwrap_or_default();
    assert!(note.contains("maintenance window"), "{note}");
    assert!(
        h.plans_for(&first).await.is_empty(),
        "no plan outside the window"
    );
    // Karpenter may now disrupt nothing in the pool: a released node is never taken, so the first plan
    // stays running after its backups are verified. Karpenter v1 paces graceful disruption by the
    // NodePool's `spec.disruption.budgets` (kubernetes-sigs/karpenter `pkg/controllers/disruption/
    // helpers.go` `BuildDisruptionBudgetMapping`, `pkg/apis/v1/nodepool.go` `GetAllowedDisruptionsByReason`;
    // research/karpenter.md §2). Without this, a fast Karpenter ends the first plan before the second
    // signal is looked at, and a rule that holds the slot to the end would pass too.
    nodepools(&h)
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"disruption": {"budgets": [{"nodes": "0"}]}}})),
        )
        .await
        .expect("set the budget to 0");
    // Open every hour's minute: now the drift gets its plan, and a second drifted node waits for the
    // one slot (maxPlans 1) until the first plan's backups are verified (a Release plan then only waits
    // for Karpenter and frees its slot, so Velero can start on the second node).
    policies
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maintenanceWindows": [
                {"schedule": "* * * * *", "duration": "1m", "timeZone": "UTC"}]}})),
        )
        .await
        .expect("open the window");
    let plan = wait_signal_plan(&h, &first).await;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    let second = pods
        .list(&Default::default())
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(protected)
        .filter_map(|p| p.spec.and_then(|s| s.node_name))
        .find(|n| n != &first)
        .expect("another node runs a protected pod");
    drift(&h, &second).await;
    let next = wait_signal_plan(&h, &second).await;
    // The second plan gets its backups while the first still waits for Karpenter: a verified Release
    // plan holds no slot (a plan holding it to its end would keep the second from ever starting here).
    let started = h
        .wait_plan_until(&next.name_any(), TIMEOUT, |p| {
            p.status.as_ref().is_some_and(|s| !s.backups.is_empty())
        })
        .await;
    assert_ne!(
        started.status.as_ref().map(|s| s.phase),
        Some(PlanPhase::Pending)
    );
    let first_then = Api::<DisruptionPlan>::all(h.client.clone())
        .get(&plan.name_any())
        .await
        .expect("the first plan");
    let first_phase = first_then
        .status
        .as_ref()
        .map(|s| s.phase)
        .unwrap_or_default();
    assert!(
        !first_phase.is_terminal(),
        "the first plan ended ({first_phase:?}) although Karpenter may take no node"
    );
    assert!(
        h.node(&first).await.is_some(),
        "Karpenter took the first node despite its budget of 0"
    );
    let first_now = h
        .wait_plan_until(&plan.name_any(), Duration::from_secs(120), |p| {
            p.status
                .as_ref()
                .is_some_and(|s| !s.backups.is_empty() && s.backups.iter().all(|b| b.verified))
        })
        .await;
    let verified = first_now
        .status
        .as_ref()
        .and_then(|s| {
            s.backups
                .iter()
                .filter_map(|b| b.verified_at.as_ref())
                .max()
        })
        .map(|t| t.0)
        .expect("a verified backup records when");
    let created = next
        .metadata
        .creation_timestamp
        .as_ref()
        .expect("created")
        .0;
    // creationTimestamp has whole seconds.
    assert!(
        created >= verified - jiff::SignedDuration::from_secs(1),
        "the second plan started at {created}, before the first plan's backups were verified at {verified}"
    );
}

/// Under `holds.clusterAutoscaler: SafeToEvictFalse` Cluster Autoscaler refuses to scale down a node with
/// a `safe-to-evict: "false"` pod (kubernetes/autoscaler
/// `cluster-autoscaler/simulator/drainability/rules/notsafetoevict/rule.go`), so the CA signal never
/// fires. Under the default (`Gate`) snapdrain takes its own `safe-to-evict` off, CA does take the node,
/// and its drain waits at the eviction gate until the backup is verified (`core/scaledown/actuation/drain.go`
/// `evictPod` retries refusals until `--max-pod-eviction-time`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_autoscaler_skips_held_nodes_only_under_safe_to_evict_false() {
    let h = Harness::start_scenario("quickstart", |s| {
        // Retries every second, so the verified backup's allowance is taken at once.
        s.cluster_autoscaler = Some(snapdrain_sim::world::autoscaler::AutoscalerSettings {
            eviction_retry_time: Duration::from_secs(1),
            max_pod_eviction_time: Duration::from_secs(90),
            pod_eviction_headroom: Duration::from_secs(2),
            pod_gone_poll: Duration::from_millis(200),
            ..Default::default()
        });
    })
    .await;
    h.set_policy(json!({"holds": {"clusterAutoscaler": "SafeToEvictFalse"}}))
        .await;
    let _controller = gated_controller(&h).await;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    h.wait_all(pods.clone(), "every protected pod held against CA", |ps| {
        let protected: Vec<&Pod> = ps.iter().filter(|p| protected(p)).collect();
        protected.len() == 5
            && protected.iter().all(|p| {
                annotation(p, DO_NOT_DISRUPT) == Some("true")
                    && annotation(p, SAFE_TO_EVICT) == Some("false")
            })
    })
    .await;
    let node = h.node_with_statefulset_pods().await;
    let protected_on_node = h.protected_pods_on(&node).await;
    let ca = h
        .cluster
        .autoscaler
        .as_ref()
        .expect("every simulated world runs Cluster Autoscaler");
    assert!(ca.scale_down(&node));
    let skipped = snapdrain_testkit::eventually("Cluster Autoscaler's verdict", || async {
        h.audit()
            .into_iter()
            .find(|e| e.verb == "scale-down-skipped" && e.name.as_deref() == Some(node.as_str()))
    })
    .await;
    assert_eq!(skipped.detail["reason"], "NotSafeToEvictAnnotation");
    let n = h.node(&node).await.expect("the node stays");
    let tainted = n
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == "ToBeDeletedByClusterAutoscaler");
    assert!(!tainted, "Cluster Autoscaler did not start on it");
    assert!(h.accepted_evictions().is_empty(), "nothing was evicted");

    // The default: snapdrain's own CA hold comes off, and CA takes the node.
    h.set_policy(json!({})).await;
    wait_all_protected_held(&h).await;
    assert!(ca.scale_down(&node));
    snapdrain_testkit::eventually_within(
        "Cluster Autoscaler scaled the node down",
        Duration::from_secs(120),
        || async {
            h.audit()
                .into_iter()
                .find(|e| {
                    e.verb == "scale-down-deleted" && e.name.as_deref() == Some(node.as_str())
                })
                .map(|_| ())
        },
    )
    .await;
    let plans = h.plans_for(&node).await;
    assert_eq!(plans.len(), 1, "one plan for the node: {plans:#?}");
    let done = h
        .wait_plan(
            &plans[0].name_any(),
            Duration::from_secs(60),
            PlanPhase::is_terminal,
        )
        .await;
    assert_eq!(
        done.status.as_ref().map(|s| s.phase),
        Some(PlanPhase::Completed)
    );
    assert_no_eviction_before_verified_backup(&h.audit(), &protected_on_node, &done);
}

/// quickstart with consolidation off (`consolidateAfter: Never`) until [`start_consolidating`]. Started
/// with 1 s, Karpenter consolidated a node with protected pods before the controller's first hold
/// whenever the machine was busy (the product cannot hold what it has not seen yet; the test must not
/// race it).
async fn consolidating_quickstart() -> Harness {
    Harness::start_scenario("quickstart", |s| {
        for pool in &mut s.node_pools {
            pool.consolidate_after = "Never".into();
        }
    })
    .await
}

/// Every NodePool consolidates after 1 s, so the simulated Karpenter finds underutilized nodes at once
/// (kubernetes-sigs/karpenter `pkg/controllers/nodeclaim/disruption/consolidation.go` sets
/// Consolidatable once `consolidateAfter` has passed since the last pod event;
/// `pkg/controllers/disruption/singlenodeconsolidation.go` picks from those).
async fn start_consolidating(h: &Harness) {
    let pools = nodepools(h);
    let names: Vec<String> = pools
        .list(&Default::default())
        .await
        .expect("list NodePools")
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert!(!names.is_empty(), "quickstart has NodePools");
    for name in names {
        pools
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"disruption": {"consolidateAfter": "1s"}}})),
            )
            .await
            .expect("turn consolidation on");
    }
}

/// Nodes running protected pods, by the oracle's own rule.
async fn protected_nodes(h: &Harness) -> BTreeSet<String> {
    Api::<Pod>::namespaced(h.client.clone(), "shop")
        .list(&Default::default())
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(protected)
        .filter_map(|p| p.spec.and_then(|s| s.node_name))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consolidation_of_a_node_with_protected_pods_is_held_by_default() {
    let h = consolidating_quickstart().await;
    let _controller = h.controller().await;
    wait_all_protected_held(&h).await;
    start_consolidating(&h).await;
    let held_nodes = protected_nodes(&h).await;
    // Karpenter judges the held nodes and refuses them (do-not-disrupt), while it may take others.
    let blocked = snapdrain_testkit::eventually("Karpenter refusing a held node", || async {
        h.audit().into_iter().find(|e| {
            e.verb == "disruption-blocked" && e.detail.to_string().contains("do-not-disrupt")
        })
    })
    .await;
    assert!(
        blocked.detail.to_string().contains("do-not-disrupt"),
        "{blocked:?}"
    );
    for node in &held_nodes {
        assert!(
            h.node(node).await.is_some(),
            "{node} runs protected pods and stays"
        );
    }
    let protected_evicted: Vec<(String, String)> = h
        .accepted_evictions()
        .into_iter()
        .filter(|(pod, _)| pod.starts_with("shop/postgres-") || pod.starts_with("shop/redis-"))
        .collect();
    assert!(protected_evicted.is_empty(), "{protected_evicted:?}");
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    assert!(
        plans
            .list(&Default::default())
            .await
            .expect("list plans")
            .items
            .is_empty(),
        "policy consolidation: Hold makes no plan"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consolidation_allowed_by_the_policy_backs_up_then_releases_the_node() {
    let h = consolidating_quickstart().await;
    let policies: Api<DisruptionPolicy> = Api::all(h.client.clone());
    let policy: DisruptionPolicy = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": "default"}, "spec": {"signals": {"consolidation": "Release"}}
    }))
    .expect("a policy");
    policies
        .create(&PostParams::default(), &policy)
        .await
        .expect("create the policy");
    let protected_before: std::collections::BTreeMap<String, BTreeSet<String>> = {
        let pods: Vec<Value> = Api::<Pod>::all(h.client.clone())
            .list(&Default::default())
            .await
            .expect("list pods")
            .items
            .iter()
            .map(|p| serde_json::to_value(p).expect("serializes"))
            .collect();
        snapdrain_testkit::safety::protected_pods(&pods)
    };
    let _controller = h.controller().await;
    wait_all_protected_held(&h).await;
    start_consolidating(&h).await;
    // A Consolidatable node with protected pods gets a Release plan; Karpenter then consolidates it.
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    let done = h
        .wait_all_within(
            plans,
            "a consolidation plan completed",
            Duration::from_secs(120),
            |ps| {
                ps.iter().any(|p| {
                    p.spec.reason.as_deref() == Some("Consolidatable")
                        && p.status.as_ref().map(|s| s.phase) == Some(PlanPhase::Completed)
                        && p.status
                            .as_ref()
                            .is_some_and(|s| !s.released_pods.is_empty())
                })
            },
        )
        .await;
    let plan = done
        .into_iter()
        .find(|p| p.spec.reason.as_deref() == Some("Consolidatable"))
        .expect("found above");
    assert_eq!(plan.spec.source, snapdrain::api::PlanSource::Karpenter);
    assert_eq!(plan.spec.mode, snapdrain::api::PlanMode::Release);
    // The released pods left the node (Karpenter's consolidation evicted them) only after the backup.
    let backups: Vec<snapdrain_testkit::safety::RecordedBackup> =
        Api::<DisruptionPlan>::all(h.client.clone())
            .list(&Default::default())
            .await
            .expect("list plans")
            .items
            .iter()
            .flat_map(|p| {
                snapdrain_testkit::safety::recorded_backups(
                    &serde_json::to_value(p).expect("serializes"),
                )
            })
            .collect();
    let violations = snapdrain_testkit::safety::eviction_violations(
        &snapdrain_testkit::safety::accepted_evictions(&h.audit()),
        &protected_before,
        &backups,
    );
    assert!(violations.is_empty(), "{violations:?}");
}

/// The holds live on the pods, not in the controller: a stopped controller leaves every one in place, and
/// the next one holds what was made while none ran.
#[tokio::test]
async fn holds_stay_through_a_controller_restart_and_pods_made_meanwhile_are_held() {
    let h = Harness::start().await;
    let first = h.controller().await;
    wait_all_protected_held(&h).await;
    first.shutdown().await;
    // While no controller runs, redis grows by one replica.
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> =
        Api::namespaced(h.client.clone(), "shop");
    sets.patch(
        "redis",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 3}})),
    )
    .await
    .expect("scale redis");
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    let meanwhile = h
        .wait_all(pods.clone(), "redis-2 running", |ps| {
            ps.iter().any(|p| p.name_any() == "redis-2" && protected(p))
        })
        .await;
    let unheld: Vec<String> = meanwhile
        .iter()
        .filter(|p| protected(p) && !held(p))
        .map(|p| p.name_any())
        .collect();
    assert_eq!(
        unheld,
        vec!["redis-2".to_string()],
        "the stopped controller removed no hold, and nothing held the new pod"
    );
    let _second = h.controller().await;
    h.wait_all(pods, "all six protected pods held", |ps| {
        let protected: Vec<&Pod> = ps.iter().filter(|p| protected(p)).collect();
        protected.len() == 6 && protected.iter().all(|p| held(p))
    })
    .await;
}

/// A Release plan that is aborted after it released its pods rolls back: every hold comes back.
#[tokio::test]
async fn aborting_a_release_plan_restores_the_holds_it_released() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    wait_all_protected_held(&h).await;
    let node = h.node_with_statefulset_pods().await;
    // No autoscaler signal: the released node is not taken, so the rollback is what the test sees.
    h.create_plan(
        "release-then-abort",
        json!({"nodes": [node], "mode": "Release", "releaseWindow": "10m"}),
    )
    .await;
    let released = h
        .wait_plan_until("release-then-abort", TIMEOUT, |p| {
            p.status.as_ref().is_some_and(|s| s.released_at.is_some())
        })
        .await;
    let names: BTreeSet<String> = released
        .status
        .as_ref()
        .map(|s| s.released_pods.iter().map(|p| p.name.clone()).collect())
        .unwrap_or_default();
    assert!(!names.is_empty(), "the plan released the node's pods");
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    let now = pods
        .list(&Default::default())
        .await
        .expect("list pods")
        .items;
    for p in now.iter().filter(|p| names.contains(&p.name_any())) {
        assert!(
            !held(p),
            "{} is released: {:?}",
            p.name_any(),
            p.annotations()
        );
    }
    Api::<DisruptionPlan>::all(h.client.clone())
        .patch(
            "release-then-abort",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                snapdrain::api::ABORT_ANNOTATION: "true"}}})),
        )
        .await
        .expect("abort the plan");
    let done = h
        .wait_plan("release-then-abort", TIMEOUT, PlanPhase::is_terminal)
        .await;
    assert_eq!(
        done.status.as_ref().map(|s| s.phase),
        Some(PlanPhase::Aborted)
    );
    // Stopped on purpose is not a failure: counted apart from plans_failed (which nothing here fails).
    // Counted once the Aborted phase is written, so it may follow the phase by a moment.
    let text = snapdrain_testkit::eventually("the aborted plan counted", || async {
        let text = controller.metrics.render();
        text.contains("snapdrain_plans_aborted_total{")
            .then_some(text)
    })
    .await;
    let samples = |name: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .map(str::to_owned)
            .collect()
    };
    assert!(
        samples("snapdrain_plans_failed_total").is_empty(),
        "an aborted plan counted as failed: {:?}",
        samples("snapdrain_plans_failed_total")
    );
    assert_eq!(
        samples("snapdrain_plans_aborted_total").len(),
        1,
        "one aborted plan, counted by the phase it left:\n{text}"
    );
    let after = pods
        .list(&Default::default())
        .await
        .expect("list pods")
        .items;
    for p in after.iter().filter(|p| names.contains(&p.name_any())) {
        assert!(
            held(p) && annotation(p, "snapdrain.io/released-by").is_none(),
            "{} is held again after the rollback: {:?}",
            p.name_any(),
            p.annotations()
        );
    }
}

/// A forceful disruption whose deadline comes before the backup can finish: the plan does not pretend.
/// Karpenter deletes pods at terminationTime minus their own grace period, skipping do-not-disrupt
/// (kubernetes-sigs/karpenter `pkg/controllers/node/termination/terminator/terminator.go`); with a 3 s
/// terminationGracePeriod and 30 s pod grace that is at once. Whichever comes first — the pods gone before
/// the plan's first look, or the deadline during the backup — the plan fails, naming it, with a Warning
/// Event and a metric, and snapdrain releases nothing to an eviction.
#[tokio::test]
async fn a_deadline_too_short_for_the_backup_fails_the_plan_loudly() {
    // Velero needs 30 s per backup; Karpenter grants 3 s. A database takes seconds to stop on SIGTERM
    // (5 s here, within its 30 s grace): with the fast timings' 50 ms the pods could be gone before the
    // watcher's first look, and a node without protected pods gets no plan at all.
    let h = Harness::start_with(snapdrain_sim::world::Timings {
        backup_overhead: Duration::from_secs(30),
        pod_stop: Duration::from_secs(5),
        ..snapdrain_testkit::harness::fast_timings()
    })
    .await;
    let controller = h.controller().await;
    wait_all_protected_held(&h).await;
    let node = h.node_with_statefulset_pods().await;
    let protected_on_node = h.protected_pods_on(&node).await;
    delete_nodeclaim_with_grace(&h, &node, "3s").await;
    let plan = wait_signal_plan(&h, &node).await;
    let done = h
        .wait_plan(&plan.name_any(), TIMEOUT, PlanPhase::is_terminal)
        .await;
    let status = done.status.as_ref().expect("status");
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    let message = status.message.as_deref().unwrap_or_default();
    let (reason, counted) = if message.contains("left the node before snapdrain could back them up")
    {
        (
            "ProtectedPodsLeft",
            controller.metrics.pods_left_unbacked.get(),
        )
    } else {
        assert!(
            message.contains("deadline passed before the backup was verified"),
            "{message}"
        );
        ("DeadlineMissed", controller.metrics.deadlines_missed.get())
    };
    assert!(counted >= 1, "{reason} is counted");
    assert!(status.backups.iter().all(|b| !b.verified));
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(h.client.clone());
    let found = h
        .wait_all(events, "the Warning event", |es| {
            es.iter().any(|e| e.reason.as_deref() == Some(reason))
        })
        .await;
    let warned = found
        .iter()
        .find(|e| e.reason.as_deref() == Some(reason))
        .expect("waited for it");
    assert_eq!(warned.type_.as_deref(), Some("Warning"));
    assert_eq!(
        warned.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some(plan.name_any().as_str())
    );
    // Nothing released the protected pods to an eviction: no drain of them was started.
    let protected_here: BTreeSet<&String> = protected_on_node.keys().collect();
    let evicted: Vec<(String, String)> = h
        .accepted_evictions()
        .into_iter()
        .filter(|(pod, _)| protected_here.contains(pod))
        .collect();
    assert!(evicted.is_empty(), "{evicted:?}");
}

/// The node-level hold (drift under a NodePool terminationGracePeriod honours only the Node's own
/// `karpenter.sh/do-not-disrupt`, kubernetes-sigs/karpenter `pkg/controllers/state/statenode.go`
/// `ValidateNodeDisruptable`): placed on a node under held pods, taken off by the Release plan with the
/// pod holds; a user's own Node annotation is neither claimed nor removed.
#[tokio::test]
async fn a_release_plan_takes_off_the_node_hold_and_a_users_own_node_annotation_stays() {
    let h = Harness::start().await;
    // Karpenter may disrupt nothing (budget 0): the released nodes stay to be looked at.
    nodepools(&h)
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"disruption": {"budgets": [{"nodes": "0"}]}}})),
        )
        .await
        .expect("set the budget to 0");
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    let under: BTreeSet<String> = pods
        .list(&Default::default())
        .await
        .expect("list pods")
        .items
        .iter()
        .filter(|p| protected(p))
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    let mut under = under.into_iter();
    let (ours, users) = (
        under.next().expect("a node with protected pods"),
        under.next().expect("a second node with protected pods"),
    );
    let nodes: Api<Node> = Api::all(h.client.clone());
    nodes
        .patch(
            &users,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {DO_NOT_DISRUPT: "true"}}})),
        )
        .await
        .expect("the user's own node annotation");
    let _controller = h.controller().await;
    wait_all_protected_held(&h).await;
    let node_annotation = |n: &Node, key: &str| n.annotations().get(key).cloned();
    h.wait_all(nodes.clone(), "the node under held pods held", |ns| {
        ns.iter().any(|n| {
            n.name_any() == ours
                && node_annotation(n, DO_NOT_DISRUPT).as_deref() == Some("true")
                && node_annotation(n, HELD).as_deref() == Some("do-not-disrupt")
        })
    })
    .await;
    let user_node = h.node(&users).await.expect("the user's node");
    assert_eq!(
        node_annotation(&user_node, DO_NOT_DISRUPT).as_deref(),
        Some("true")
    );
    assert_eq!(
        node_annotation(&user_node, HELD),
        None,
        "the user's annotation is not claimed"
    );

    drift(&h, &ours).await;
    drift(&h, &users).await;
    for node in [&ours, &users] {
        let plan = wait_signal_plan(&h, node).await;
        h.wait_plan_until(&plan.name_any(), Duration::from_secs(120), |p| {
            p.status
                .as_ref()
                .is_some_and(|s| !s.released_pods.is_empty())
        })
        .await;
    }
    // The plan released the pods and, with them, snapdrain's hold on the node.
    h.wait_all(nodes.clone(), "the node hold released", |ns| {
        ns.iter().any(|n| {
            n.name_any() == ours
                && node_annotation(n, DO_NOT_DISRUPT).is_none()
                && node_annotation(n, HELD).is_none()
        })
    })
    .await;
    let user_node = h.node(&users).await.expect("the user's node");
    assert_eq!(
        node_annotation(&user_node, DO_NOT_DISRUPT).as_deref(),
        Some("true"),
        "the user's own Node annotation stays"
    );
    assert_eq!(node_annotation(&user_node, HELD), None);
}

/// A signal plan whose node went before its first look (a forceful disruptor, a fast scale-down; the
/// soak found one such plan Pending for an hour, "waiting" for a node that would never come back) ends:
/// with no protected pod recorded at the signal it completes; with protected pods recorded, which left
/// unbacked, it fails loudly naming them. A hand-written plan naming a missing node still waits, as a
/// typo should.
#[tokio::test]
async fn a_signal_plan_for_a_node_already_gone_ends_and_a_hand_written_one_waits() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    let signal = |name: &str, protected: &str| {
        let mut plan: DisruptionPlan = serde_json::from_value(json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": name, "annotations": {"snapdrain.io/protected-pods": protected}},
            "spec": {"nodes": ["ip-10-0-99-9.us-east-1.compute.internal"], "mode": "Release",
                     "source": "karpenter", "reason": "Disrupting", "releaseWindow": "10s"}
        }))
        .expect("a plan");
        plan.metadata.namespace = None;
        plan
    };
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    for (name, protected) in [
        ("gone-empty", "[]"),
        ("gone-held", r#"["shop/postgres-0"]"#),
    ] {
        plans
            .create(&PostParams::default(), &signal(name, protected))
            .await
            .expect("create the plan");
    }
    h.create_plan(
        "typo",
        json!({"nodes": ["ip-10-0-99-9.us-east-1.compute.internal"]}),
    )
    .await;
    let empty = h
        .wait_plan("gone-empty", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = empty.status.expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let held = h.wait_plan("gone-held", TIMEOUT, |p| p.is_terminal()).await;
    let status = held.status.expect("status");
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    let message = status.message.unwrap_or_default();
    assert!(message.contains("shop/postgres-0"), "{message}");
    let typo = h
        .wait_plan_until("typo", TIMEOUT, |p| {
            p.status
                .as_ref()
                .and_then(|s| s.message.as_deref())
                .is_some_and(|m| m.contains("do not exist"))
        })
        .await;
    let status = typo.status.expect("status");
    assert_eq!(
        status.phase,
        PlanPhase::Pending,
        "it waits for the node: {status:#?}"
    );
    controller.shutdown().await;
}
