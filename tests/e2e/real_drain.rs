//! The drain as it behaves on real clusters (issue 9; real-cluster-review #7, #8, #11, #13, #22): pods
//! that come back onto a cordoned node, bare and do-not-disrupt pods, multi-PDB refusals in both of
//! kube-apiserver's shapes, refused evictions, and the cordon and taint placed before the backup.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use snapdrain::api::DisruptionPlan;
use snapdrain::api::status::PlanPhase;
use snapdrain_sim::apiserver::faults::FaultRule;
use snapdrain_sim::apiserver::{MultiPdbReply, Settings};
use snapdrain_sim::world::velero::VeleroFault;
use snapdrain_testkit::eventually_within;
use snapdrain_testkit::harness::{Harness, TIMEOUT, fast_timings};

const DRAIN_TAINT: &str = "snapdrain.io/draining";

/// A pod template pinned to `node` (by hostname), with extra pod spec and metadata fields.
fn template(app: &str, node: &str, spec: Value, metadata: Value) -> Value {
    let mut meta = json!({"labels": {"app": app}});
    if let (Some(m), Some(extra)) = (meta.as_object_mut(), metadata.as_object()) {
        m.extend(extra.clone());
    }
    let mut pod_spec = json!({
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [{"name": "main", "image": "busybox:1.36",
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]
    });
    if let (Some(s), Some(extra)) = (pod_spec.as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    json!({"metadata": meta, "spec": pod_spec})
}

async fn deployment(h: &Harness, name: &str, node: &str, spec: Value, metadata: Value) {
    let api: Api<Deployment> = Api::namespaced(h.client.clone(), "shop");
    let d = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": template(name, node, spec, metadata)}
    }))
    .expect("deployment JSON");
    api.create(&PostParams::default(), &d)
        .await
        .expect("deployment created");
}

/// A DaemonSet as most are written: no toleration of its own (the controller adds the standard ones).
async fn daemonset(h: &Harness, name: &str) {
    let api: Api<DaemonSet> = Api::namespaced(h.client.clone(), "shop");
    let d = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "main", "image": "fluent-bit:3.1",
                                  "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}
    }))
    .expect("daemonset JSON");
    api.create(&PostParams::default(), &d)
        .await
        .expect("daemonset created");
}

/// Running pods of `app` on `node`.
async fn running_on(h: &Harness, app: &str, node: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    let lp = ListParams::default()
        .labels(&format!("app={app}"))
        .fields(&format!("spec.nodeName={node}"));
    pods.list(&lp)
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .collect()
}

async fn wait_running(h: &Harness, app: &str, node: &str) -> Pod {
    eventually_within(&format!("{app} running on {node}"), TIMEOUT, || async {
        running_on(h, app, node).await.into_iter().next()
    })
    .await
}

/// Evictions the API server carried out (the world's record, whatever HTTP code the answer had).
fn carried_out(h: &Harness, pod_prefix: &str) -> usize {
    h.audit()
        .iter()
        .filter(|e| e.source == "world" && e.verb == "evicted")
        .filter(|e| e.name.as_deref().is_some_and(|n| n.starts_with(pod_prefix)))
        .count()
}

/// Eviction requests for pods named `pod_prefix*`, whatever the answer.
fn eviction_requests(h: &Harness, pod_prefix: &str) -> usize {
    h.audit()
        .iter()
        .filter(|e| e.source == "api" && e.resource == "pods/eviction")
        .filter(|e| e.name.as_deref().is_some_and(|n| n.starts_with(pod_prefix)))
        .count()
}

fn has_drain_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| t.key == DRAIN_TAINT && t.effect == "NoSchedule")
        })
}

fn cordoned(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

async fn wait_message(h: &Harness, plan: &str, needle: &str) -> DisruptionPlan {
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    eventually_within(&format!("{plan}: message with {needle:?}"), TIMEOUT, || {
        let plans = plans.clone();
        async move {
            let p = plans.get(plan).await.ok()?;
            let s = p.status.as_ref()?;
            let seen = s.message.as_deref().is_some_and(|m| m.contains(needle))
                || s.nodes
                    .iter()
                    .any(|n| n.blocked_by.as_deref().is_some_and(|b| b.contains(needle)));
            seen.then_some(p)
        }
    })
    .await
}

/// #7: the DaemonSet controller recreates an evicted DaemonSet pod on a cordoned node at once (its pods
/// tolerate `node.kubernetes.io/unschedulable`: kubernetes `pkg/controller/daemon/util/daemonset_util.go`
/// `AddOrUpdateDaemonPodTolerations`), and a ReplicaSet pod tolerating every taint is scheduled back.
/// With a cordon alone the drain evicted them for ever. snapdrain's own NoSchedule taint stops the
/// DaemonSet pod from coming back, the tolerating pod is left alone (kubernetes-sigs/karpenter
/// `pkg/utils/pod/scheduling.go` `IsEvictable`), and the drain ends when its planned pods are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_that_come_back_onto_a_cordoned_node_do_not_stall_the_drain() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    daemonset(&h, "log-agent").await;
    deployment(
        &h,
        "everywhere",
        &node,
        json!({"tolerations": [{"operator": "Exists"}]}),
        json!({}),
    )
    .await;
    wait_running(&h, "log-agent", &node).await;
    let tolerating = wait_running(&h, "everywhere", &node).await;
    let controller = h.controller().await;
    h.create_plan(
        "comes-back",
        json!({"nodes": [node], "drain": {"ignoreDaemonSets": false, "timeout": "2m"},
               "termination": {"terminateInstance": false, "deleteNode": false}}),
    )
    .await;
    let plan = h
        .wait_plan("comes-back", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.clone().expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    assert_eq!(
        carried_out(&h, "log-agent-"),
        1,
        "the DaemonSet pod is evicted once and does not come back"
    );
    assert_eq!(
        eviction_requests(&h, &tolerating.name_any()),
        0,
        "a pod tolerating the drain taint is never evicted"
    );
    assert!(
        running_on(&h, "log-agent", &node).await.is_empty(),
        "no DaemonSet pod on the tainted node"
    );
    let n = h.node(&node).await.expect("node kept (no termination)");
    assert!(cordoned(&n) && has_drain_taint(&n), "{:?}", n.spec);
    let targets = status.nodes[0].eviction_targets.as_ref().expect("targets");
    assert!(
        targets
            .iter()
            .all(|t| Some(&t.uid) != tolerating.metadata.uid.as_ref()),
        "{targets:?}"
    );
    controller.shutdown().await;
}

/// #13: Execute mode cordons and taints before it starts the backup (kubectl and Karpenter cordon or
/// taint first), so nothing new lands on a node about to go; a failed backup rolls both back, and only
/// what snapdrain set: a node someone else cordoned stays cordoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cordon_and_taint_come_before_the_backup_and_roll_back_alone() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    let nodes: Api<Node> = Api::all(h.client.clone());
    // A person cordoned the node already (`kubectl cordon`).
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("cordon");
    h.cluster
        .velero
        .as_ref()
        .expect("the quickstart runs Velero")
        .inject(VeleroFault::FailAllBackups {
            reason: "simulated: repository unreachable".into(),
        });
    let controller = h.controller().await;
    h.create_plan(
        "backup-fails",
        json!({"nodes": [node], "backup": {"maxAttempts": 1}}),
    )
    .await;
    let plan = h
        .wait_plan("backup-fails", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.clone().expect("status");
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    let audit = h.audit();
    let plan_created = audit
        .iter()
        .position(|e| {
            e.source == "api" && e.resource.starts_with("disruptionplans") && e.verb == "create"
        })
        .expect("the plan was created");
    let taint_write = audit
        .iter()
        .enumerate()
        .skip(plan_created)
        .find(|(_, e)| {
            e.source == "api"
                && e.resource == "nodes"
                && e.verb == "patch"
                && e.name.as_deref() == Some(node.as_str())
        })
        .map(|(i, _)| i)
        .expect("snapdrain patched the node");
    let first_backup = audit
        .iter()
        .position(|e| e.source == "api" && e.resource == "backups.velero.io" && e.verb == "create")
        .expect("a backup was created");
    assert!(
        taint_write < first_backup,
        "the node is tainted before the backup starts"
    );
    let n = h.node(&node).await.expect("node kept");
    assert!(
        !has_drain_taint(&n),
        "rollback removed the taint: {:?}",
        n.spec
    );
    assert!(
        cordoned(&n),
        "rollback leaves the cordon it did not set: {:?}",
        n.spec
    );
    assert!(!status.nodes[0].tainted_by_snapdrain && !status.nodes[0].cordoned_by_snapdrain);
    assert!(h.accepted_evictions().is_empty());
    controller.shutdown().await;
}

/// #11: kubectl refuses pods no controller owns ("cannot delete Pods that declare no controller (use
/// --force to override)", kubernetes/kubectl `pkg/drain/filters.go` `unreplicatedFilter`): evicted, they
/// are gone for good. The plan waits in Pending with kubectl's message (and before, it went on past
/// the refusal); `drain.force` overrides, as `--force` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bare_pods_refuse_the_drain_unless_forced() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    let bare = serde_json::from_value(json!({
        "metadata": {"name": "debug", "namespace": "shop", "labels": {"app": "debug"}},
        "spec": template("debug", &node, json!({}), json!({}))["spec"].clone()
    }))
    .expect("pod JSON");
    pods.create(&PostParams::default(), &bare)
        .await
        .expect("bare pod");
    wait_running(&h, "debug", &node).await;
    // The platform team allows force (refused by default, security review C-1).
    h.set_policy(json!({"planSettings": {"allowForce": true}}))
        .await;
    let controller = h.controller().await;
    h.create_plan(
        "bare",
        json!({"nodes": [node], "termination": {"terminateInstance": false, "deleteNode": false}}),
    )
    .await;
    // The plan waits in Pending, saying why, and touches nothing.
    let plan = wait_message(
        &h,
        "bare",
        "cannot delete Pods that declare no controller (use --force to override): shop/debug",
    )
    .await;
    let status = plan.status.clone().expect("status");
    assert_eq!(status.phase, PlanPhase::Pending, "{status:#?}");
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("spec.drain.force")),
        "{:?}",
        status.message
    );
    let n = h.node(&node).await.expect("node");
    assert!(!cordoned(&n) && !has_drain_taint(&n), "{:?}", n.spec);
    assert!(h.accepted_evictions().is_empty(), "nothing evicted");

    // `--force`: the person accepts losing the pod.
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    plans
        .patch(
            "bare",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"drain": {"force": true}}})),
        )
        .await
        .expect("force set");
    let plan = h.wait_plan("bare", TIMEOUT, |p| p.is_terminal()).await;
    assert_eq!(
        plan.status.as_ref().map(|s| s.phase),
        Some(PlanPhase::Completed),
        "{:#?}",
        plan.status
    );
    assert_eq!(carried_out(&h, "debug"), 1);
    controller.shutdown().await;
}

/// #11: Karpenter never evicts a pod with an active `karpenter.sh/do-not-disrupt` (kubernetes-sigs/karpenter
/// `pkg/utils/pod/scheduling.go` `IsEvictable`, `IsDoNotDisruptActive`). The drain says it waits for the
/// annotation, and goes on once it is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn do_not_disrupt_holds_the_drain_until_removed() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    deployment(
        &h,
        "trainer",
        &node,
        json!({}),
        json!({"annotations": {"karpenter.sh/do-not-disrupt": "true"}}),
    )
    .await;
    let pod = wait_running(&h, "trainer", &node).await;
    let controller = h.controller().await;
    h.create_plan(
        "dnd",
        json!({"nodes": [node], "termination": {"terminateInstance": false, "deleteNode": false}}),
    )
    .await;
    let plan = wait_message(&h, "dnd", "karpenter.sh/do-not-disrupt").await;
    assert_eq!(
        plan.status.as_ref().map(|s| s.phase),
        Some(PlanPhase::Draining)
    );
    assert_eq!(eviction_requests(&h, &pod.name_any()), 0);
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    pods.patch(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": null}}})),
    )
    .await
    .expect("annotation removed");
    let plan = h.wait_plan("dnd", TIMEOUT, |p| p.is_terminal()).await;
    assert_eq!(
        plan.status.as_ref().map(|s| s.phase),
        Some(PlanPhase::Completed),
        "{:#?}",
        plan.status
    );
    assert_eq!(carried_out(&h, &pod.name_any()), 1);
    controller.shutdown().await;
}

/// `drain.force` stays editable (it unblocks a drain waiting on a bare pod), so the DisruptionPolicy
/// judges it on every pass, not only while Pending (security review C-1): set on a plan already
/// Draining behind a tenant's do-not-disrupt, under the default policy, it stops the plan with
/// RefusedByPolicy and the tenant's pod is never evicted. Without the check the plan evicts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn force_set_while_draining_is_refused_by_the_default_policy() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    deployment(
        &h,
        "trainer",
        &node,
        json!({}),
        json!({"annotations": {"karpenter.sh/do-not-disrupt": "true"}}),
    )
    .await;
    let pod = wait_running(&h, "trainer", &node).await;
    let controller = h.controller().await;
    h.create_plan(
        "late-force",
        json!({"nodes": [node], "termination": {"terminateInstance": false, "deleteNode": false}}),
    )
    .await;
    let plan = wait_message(&h, "late-force", "karpenter.sh/do-not-disrupt").await;
    assert_eq!(
        plan.status.as_ref().map(|s| s.phase),
        Some(PlanPhase::Draining)
    );
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    plans
        .patch(
            "late-force",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"drain": {"force": true}}})),
        )
        .await
        .expect("force set");
    let plan = h
        .wait_plan("late-force", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.clone().expect("status");
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    let message = status.message.unwrap_or_default();
    for want in [
        "spec.drain.force",
        "spec.planSettings.allowForce",
        "set while the plan was Draining",
        "rolled back",
    ] {
        assert!(message.contains(want), "{want:?} is not in {message:?}");
    }
    assert_eq!(eviction_requests(&h, &pod.name_any()), 0);
    // Failed through the rollback: the node the plan cordoned is schedulable again.
    let n = h.node(&node).await.expect("the node stays");
    assert_ne!(
        n.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "the refused plan left {node} cordoned"
    );
    controller.shutdown().await;
}

/// #8 and #22: a pod covered by two PDBs is refused, whether kube-apiserver answers HTTP 500
/// InternalError (`guardPDB` in kubernetes `pkg/registry/core/pod/storage/eviction.go`) or HTTP 201 with
/// a Failure Status body (older `eviction.go` returning the Status, written by
/// `endpoints/handlers/create.go` with 201). snapdrain must not count it as evicted, must say so, and
/// must go on once the second PDB is gone. A PDB with an empty selector matches nothing
/// (`getPodDisruptionBudgets`), so it is no second PDB.
async fn multi_pdb_refusal_is_reported(reply: MultiPdbReply) {
    let h = Harness::start_with_api(
        fast_timings(),
        Settings {
            multi_pdb_reply: reply,
            ..Settings::default()
        },
    )
    .await;
    let node = h.node_with_statefulset_pods().await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(h.client.clone(), "shop");
    for (name, selector) in [
        ("all-shop", json!({})),
        (
            "postgres-extra",
            json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["postgres"]}]}),
        ),
    ] {
        let pdb = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"maxUnavailable": 1, "selector": selector}
        }))
        .expect("pdb JSON");
        pdbs.create(&PostParams::default(), &pdb)
            .await
            .expect("pdb created");
    }
    let controller = h.controller().await;
    h.create_plan(
        "multi-pdb",
        json!({"nodes": [node], "termination": {"terminateInstance": false, "deleteNode": false}}),
    )
    .await;
    let plan = wait_message(&h, "multi-pdb", "more than one PodDisruptionBudget").await;
    let status = plan.status.expect("status");
    assert_eq!(status.phase, PlanPhase::Draining);
    assert_eq!(
        carried_out(&h, "postgres-"),
        0,
        "the API server evicted nothing it refused"
    );
    pdbs.delete("postgres-extra", &DeleteParams::default())
        .await
        .expect("second PDB deleted");
    let plan = h.wait_plan("multi-pdb", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let planned = status.nodes[0]
        .eviction_targets
        .as_ref()
        .map_or(0, Vec::len) as u32;
    assert!(
        status.nodes[0].pods_evicted <= planned,
        "refusals were counted as evictions: {} evicted of {planned} planned",
        status.nodes[0].pods_evicted
    );
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multi_pdb_refusal_as_201_with_a_failure_body_is_not_an_eviction() {
    multi_pdb_refusal_is_reported(MultiPdbReply::CreatedWithFailureBody).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multi_pdb_refusal_as_500_is_not_an_eviction() {
    multi_pdb_refusal_is_reported(MultiPdbReply::InternalError).await;
}

/// #9/#7: an eviction refused for good (403, as RBAC or a validating webhook answers) is tried again
/// with a growing backoff recorded in the plan's status, not on every pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_evictions_back_off() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    h.cluster.faults.add(FaultRule {
        verb: Some("create".into()),
        resource: Some("pods/eviction".into()),
        error_rate: 1.0,
        error_code: Some(403),
        ..FaultRule::default()
    });
    let controller = h.controller().await;
    h.create_plan(
        "refused",
        json!({"nodes": [node], "drain": {"timeout": "12s"},
               "termination": {"terminateInstance": false, "deleteNode": false}}),
    )
    .await;
    let plan = wait_message(&h, "refused", "next try at").await;
    let targets = plan.status.as_ref().expect("status").nodes[0]
        .eviction_targets
        .clone()
        .expect("targets");
    assert!(
        targets
            .iter()
            .any(|t| t.failures >= 1 && t.retry_at.is_some() && t.last_error.is_some()),
        "{targets:?}"
    );
    let plan = h.wait_plan("refused", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.expect("status");
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("drain.timeout") && m.contains("HTTP 403")),
        "{:?}",
        status.message
    );
    // Backoff 5 s, then 10 s: within the 12 s timeout each pod is asked at most three times (at 0, 5
    // and 15 s, the last only if a pass runs just before the timeout is seen). Retrying every pass
    // (about every 0.5 s) would ask each pod some twenty times.
    // Targets record only the pod's UID: its name comes from the pod (still on the kept node).
    let first = Api::<Pod>::all(h.client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .expect("list the node's pods")
        .items
        .into_iter()
        .find(|p| p.metadata.uid.as_ref() == Some(&targets[0].uid))
        .expect("the first target is still on the node")
        .name_any();
    let asked = eviction_requests(&h, &first);
    assert!((1..=3).contains(&asked), "{first} asked {asked} times");
    let n = h.node(&node).await.expect("node kept");
    assert!(
        !cordoned(&n) && !has_drain_taint(&n),
        "rolled back: {:?}",
        n.spec
    );
    controller.shutdown().await;
}

/// Review #18: a plan's status must stay under etcd's object limit (1.5 MiB by default; the simulated
/// API server refuses larger objects as etcd does, with kube-apiserver's 500 "etcdserver: request is
/// too large"), or every later write fails, the rollback's too, and its nodes stay cordoned. A plan
/// whose status could outgrow the controller's budget fails while planning and touches nothing; here
/// the budget is set low (90 KiB) so that the quickstart's nodes together are too many and one is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_whose_status_could_outgrow_etcds_limit_fails_before_touching_a_node() {
    let h = Harness::start().await;
    let mut settings = h.settings("snapdrain-0");
    settings.status_budget = 90 * 1024;
    let controller = snapdrain::controller::start(
        h.kube_config(),
        settings,
        snapdrain::controller::run::RunOptions {
            lease_namespace: None,
            ..Default::default()
        },
    )
    .await
    .expect("the controller starts");
    let nodes: Vec<Node> = Api::<Node>::all(h.client.clone())
        .list(&ListParams::default())
        .await
        .expect("list nodes")
        .items;
    assert!(nodes.len() >= 3, "the quickstart has more than three nodes");
    let names: Vec<String> = nodes.iter().map(ResourceExt::name_any).collect();
    h.create_plan("too-big", json!({"nodes": names})).await;
    let plan = h.wait_plan("too-big", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.expect("a status");
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    let message = status.message.unwrap_or_default();
    for want in [
        &format!("this plan covers {} node(s)", names.len()),
        "over the 90 KiB a plan may take",
        "split it into plans of fewer nodes",
        "no node was cordoned",
    ] {
        assert!(message.contains(want), "{want:?} is not in {message:?}");
    }
    for n in &nodes {
        let instance = super::replacement_join::instance_of(n);
        super::replacement_join::assert_untouched(&h, "too-big", &n.name_any(), &instance).await;
    }

    // One node fits the same budget: the check refuses sizes, not plans.
    let node = h.node_with_statefulset_pods().await;
    h.create_plan("one-node", json!({"nodes": [node]})).await;
    let plan = h
        .wait_plan("one-node", TIMEOUT, |p| p != PlanPhase::Pending)
        .await;
    let status = plan.status.expect("a status");
    assert_ne!(status.phase, PlanPhase::Failed, "{status:#?}");
    controller.shutdown().await;
}

/// Review #10: a plan backs up what the DisruptionPolicy protects, as the holds and the gate do. Here
/// the policy leaves a Kafka StatefulSet out (a volume the team does not want in Velero), and that
/// volume's file-system backup would fail: the plan still completes, backing up only the protected pods,
/// and Kafka's pod is moved like any other. Before, every plan backed up every StatefulSet pod with a
/// PVC, so each attempt ended PartiallyFailed and the plan failed for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_statefulset_the_policy_leaves_out_is_not_backed_up() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    let sts: k8s_openapi::api::apps::v1::StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "kafka", "namespace": "shop"},
        "spec": {
            "replicas": 1,
            "serviceName": "kafka",
            "selector": {"matchLabels": {"app": "kafka"}},
            "template": template("kafka", &node, json!({}), json!({})),
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "gp3",
                         "resources": {"requests": {"storage": "10Gi"}}}}],
        }
    }))
    .expect("a StatefulSet");
    Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(h.client.clone(), "shop")
        .create(&PostParams::default(), &sts)
        .await
        .expect("create the kafka StatefulSet");
    let kafka = wait_running(&h, "kafka", &node).await;
    h.cluster
        .velero
        .clone()
        .expect("velero")
        .inject(VeleroFault::FailVolume {
            namespace: "shop".into(),
            pvc: "data-kafka-0".into(),
        });
    h.set_policy(json!({"protection": {"podSelector": {"matchExpressions": [
        {"key": "app", "operator": "NotIn", "values": ["kafka"]}]}}}))
        .await;
    let protected: Vec<String> = h
        .protected_pods_on(&node)
        .await
        .into_keys()
        .filter(|p| p != "shop/kafka-0")
        .collect();
    assert!(!protected.is_empty(), "the node runs other protected pods");
    let controller = h.controller().await;
    h.create_plan(
        "policy-protection",
        json!({"nodes": [node], "termination": {"terminateInstance": false, "deleteNode": false}}),
    )
    .await;
    let plan = h
        .wait_plan("policy-protection", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.expect("a status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let backed_up: Vec<String> = status
        .backups
        .iter()
        .flat_map(|b| b.pods.iter().map(move |p| format!("{}/{p}", b.namespace)))
        .collect();
    assert!(
        !backed_up.iter().any(|p| p == "shop/kafka-0"),
        "{backed_up:?}"
    );
    for p in &protected {
        assert!(backed_up.contains(p), "{p} is not in {backed_up:?}");
    }
    assert_eq!(
        carried_out(&h, &kafka.name_any()),
        1,
        "kafka-0 is moved like any other pod"
    );
    controller.shutdown().await;
}

/// Found by the soak (a plan Draining for 79 minutes): a protected pod lands on the node between the
/// plan's inventory and its cordon, so no backup of the plan covers it and the drain refuses to evict
/// it, forever. Here the cordon's patch is slowed and a StatefulSet pod with a local volume is pinned to
/// the node meanwhile. The plan now fails naming the pod, snapdrain's cordon is undone, and the pod stays
/// where it runs, unevicted (the simulator's audit log); running the plan again backs it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_protected_pod_that_arrives_before_the_cordon_fails_the_plan_instead_of_wedging_it() {
    let h = Harness::start().await;
    let _controller = h.controller().await;
    let nodes = Api::<Node>::all(h.client.clone())
        .list(&ListParams::default())
        .await
        .expect("nodes");
    let mut node = None;
    for n in nodes.items {
        let name = n.name_any();
        if h.protected_pods_on(&name).await.is_empty()
            && !n
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false)
        {
            node = Some(name);
            break;
        }
    }
    let node = node.expect("a node without protected pods");
    h.cluster.faults.add(FaultRule {
        verb: Some("patch".into()),
        resource: Some("nodes".into()),
        latency_ms: 4_000,
        times: Some(1),
        ..FaultRule::default()
    });
    h.create_plan("arrival", json!({"nodes": [node]})).await;
    h.wait_plan_until("arrival", TIMEOUT, |p| {
        p.status
            .as_ref()
            .is_some_and(|s| s.phase == PlanPhase::Cordoning)
    })
    .await;
    snapdrain_testkit::volumes::local_workload(
        &h.client,
        &snapdrain_testkit::volumes::LocalWorkload {
            namespace: "shop",
            name: "late",
            node: &node,
            local_size: "1Gi",
            ebs_size: None,
        },
        TIMEOUT,
    )
    .await
    .expect("the late workload runs on the node");
    let plan = h.wait_plan("arrival", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.clone().expect("a status");
    assert_eq!(status.phase, PlanPhase::Failed, "{:?}", status.message);
    let message = status.message.clone().unwrap_or_default();
    for want in [
        "shop/late-0",
        "after the plan was decided",
        "run the plan again",
    ] {
        assert!(message.contains(want), "{want:?} in {message}");
    }
    eventually_within("snapdrain's cordon undone", TIMEOUT, || async {
        let n = Api::<Node>::all(h.client.clone()).get(&node).await.ok()?;
        (!n.spec.and_then(|s| s.unschedulable).unwrap_or(false)).then_some(())
    })
    .await;
    assert!(
        !h.accepted_evictions()
            .iter()
            .any(|(p, _)| p == "shop/late-0"),
        "the uncovered pod was never evicted"
    );
    let pod = Api::<Pod>::namespaced(h.client.clone(), "shop")
        .get("late-0")
        .await
        .expect("the late pod");
    assert_eq!(
        pod.spec.and_then(|s| s.node_name).as_deref(),
        Some(node.as_str())
    );
}
