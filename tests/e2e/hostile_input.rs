//! No input stops the controller (security review C-2, H-1): a tenant's out-of-range annotation, a plan
//! author's out-of-range duration and a plan nested deeper than a Rust client decodes each get a clear
//! answer, and every other plan keeps running.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde::Deserialize;
use serde_json::json;
use snapdrain::api::status::PlanPhase;
use snapdrain::controller::run::RunOptions;
use snapdrain_testkit::eventually;
use snapdrain_testkit::harness::{Harness, TIMEOUT, assert_no_eviction_before_verified_backup};

/// `karpenter.sh/do-not-disrupt` with a Go duration out of int64 nanoseconds: Karpenter's
/// `time.ParseDuration` refuses it and ignores the annotation (kubernetes-sigs/karpenter
/// `pkg/utils/pod/scheduling.go` `IsDoNotDisruptActive`). kube-core's parser panicked on it inside the
/// Plan step, which stopped every plan of the controller for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_out_of_range_do_not_disrupt_annotation_stops_no_plan() {
    let h = Harness::start().await;
    let controller = h
        .controller_with(with_health(Duration::from_secs(600)), "snapdrain-0")
        .await;
    let node = h.node_with_statefulset_pods().await;
    let pods: Api<Pod> = Api::all(h.client.clone());
    let on_node = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .expect("list pods");
    let tenant_pod = on_node
        .items
        .iter()
        .find(|p| p.name_any().starts_with("postgres-"))
        .expect("the node runs a postgres pod");
    Api::<Pod>::namespaced(
        h.client.clone(),
        &tenant_pod.namespace().unwrap_or_default(),
    )
    .patch(
        &tenant_pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {
            "karpenter.sh/do-not-disrupt": "9999999999999999h"
        }}})),
    )
    .await
    .expect("a tenant annotates its own pod");
    let protected = h.protected_pods_on(&node).await;
    h.create_plan("tenant-annotated", json!({"nodes": [node]}))
        .await;
    let plan = h
        .wait_plan("tenant-annotated", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.clone().expect("a terminal plan has a status");
    assert_eq!(status.phase, PlanPhase::Completed, "{:?}", status.message);
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &plan);
    let health = reqwest_health(&controller).await;
    assert_eq!(health, (200, "ok".to_string()));
    controller.shutdown().await;
}

/// A duration past Go's range in a plan is refused by validation with the field and the reason, and
/// the plan ends Failed (invalid spec) instead of panicking the reconcile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_with_an_out_of_range_duration_is_marked_invalid_with_the_field() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan(
        "forever",
        json!({"nodes": [node], "drain": {"timeout": "9999999999999999h"}, "releaseWindow": "87601h"}),
    )
    .await;
    let plan = h.wait_plan("forever", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.expect("a terminal plan has a status");
    assert_eq!(status.phase, PlanPhase::Failed);
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("spec.drain.timeout") && message.contains("out of range"),
        "{message}"
    );
    assert!(
        message.contains("spec.releaseWindow") && message.contains("87600h"),
        "{message}"
    );
    let node = h.node(&node).await.expect("the node stays");
    assert_ne!(
        node.spec.and_then(|s| s.unschedulable),
        Some(true),
        "an invalid plan touches no node"
    );
    controller.shutdown().await;
}

/// What the test reads of a plan it cannot decode as a `DisruptionPlan`: serde skips every other field
/// without descending into it.
#[derive(Deserialize)]
struct Peek {
    #[serde(default)]
    status: Option<PeekStatus>,
}

#[derive(Deserialize)]
struct PeekStatus {
    #[serde(default)]
    message: Option<String>,
}

/// A plan whose Bottlerocket `settings` nest 200 levels: kube-apiserver stores it (its JSON decoder
/// takes up to 10,000 levels), a Rust client's serde_json stops at 128. Decoded as a whole list, it
/// kept the controller's plan watch from ever syncing, so no plan at all was reconciled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_nested_past_the_decoders_limit_is_reported_and_every_other_plan_still_runs() {
    let h = Harness::start().await;
    let nested = "[".repeat(200) + &"]".repeat(200);
    let body = format!(
        r#"{{"apiVersion":"snapdrain.io/v1alpha1","kind":"DisruptionPlan","metadata":{{"name":"deep"}},"spec":{{"nodes":["no-such-node"],"mode":"Execute","replacement":{{"when":"none","bottlerocket":{{"settings":{{"deep":{nested}}}}}}}}}}}"#
    );
    let request = http::Request::post("/apis/snapdrain.io/v1alpha1/disruptionplans")
        .header("content-type", "application/json")
        .body(body.into_bytes())
        .expect("a request");
    h.client
        .request_text(request)
        .await
        .expect("the API server stores the deep plan");

    let controller = h.controller_with(RunOptions::default(), "deep-test").await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan("alongside", json!({"nodes": [node]})).await;
    let plan = h.wait_plan("alongside", TIMEOUT, |p| p.is_terminal()).await;
    assert_eq!(
        plan.status.as_ref().map(|s| s.phase),
        Some(PlanPhase::Completed)
    );

    let message = eventually("the deep plan says it cannot be read", || async {
        let request = http::Request::get("/apis/snapdrain.io/v1alpha1/disruptionplans/deep")
            .body(Vec::new())
            .expect("a request");
        let text = h.client.request_text(request).await.ok()?;
        let peek: Peek = serde_json::from_str(&text).ok()?;
        peek.status?
            .message
            .filter(|m| m.contains("cannot read this plan"))
    })
    .await;
    assert!(message.contains("recursion limit"), "{message}");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(h.client.clone());
    let reported = events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("Undecodable")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("deep")
        })
        .count();
    assert_eq!(reported, 1, "one Warning Event for the undecodable plan");
    controller.shutdown().await;
}

/// `/healthz` of a controller started with a metrics address: (status, body).
async fn reqwest_health(c: &snapdrain::controller::ControllerHandle) -> (u16, String) {
    let addr = c.metrics_addr.expect("the harness serves /metrics");
    let r = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a client")
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .expect("/healthz answers");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

fn with_health(stuck_after: Duration) -> RunOptions {
    RunOptions {
        lease_namespace: None,
        metrics_addr: Some(([127, 0, 0, 1], 0).into()),
        stuck_reconcile_after: stuck_after,
        ..RunOptions::default()
    }
}

/// Liveness follows the work: a reconcile waiting on a request that does not come back (here the
/// cordon's node patch, held by the API server) fails `/healthz` with the plan's name, so the kubelet
/// restarts the replica and a standby takes over; once the request returns, `/healthz` is ok again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn healthz_fails_while_a_reconcile_is_stuck_on_a_request_and_recovers() {
    let h = Harness::start().await;
    h.cluster
        .faults
        .add(snapdrain_sim::apiserver::faults::FaultRule {
            verb: Some("patch".into()),
            resource: Some("nodes".into()),
            latency_ms: 4_000,
            ..Default::default()
        });
    let controller = h
        .controller_with(with_health(Duration::from_secs(1)), "snapdrain-0")
        .await;
    assert_eq!(reqwest_health(&controller).await.0, 200);
    let node = h.node_with_statefulset_pods().await;
    h.create_plan("held-patch", json!({"nodes": [node]})).await;
    let (code, body) = eventually("/healthz reports the stuck reconcile", || async {
        let (code, body) = reqwest_health(&controller).await;
        (code == 503).then_some((code, body))
    })
    .await;
    assert_eq!(code, 503);
    assert!(body.contains("held-patch"), "{body}");
    h.cluster.faults.set(Vec::new());
    let plan = h
        .wait_plan("held-patch", TIMEOUT, |p| p.is_terminal())
        .await;
    assert_eq!(
        plan.status.as_ref().map(|s| s.phase),
        Some(PlanPhase::Completed)
    );
    eventually("/healthz is ok again", || async {
        (reqwest_health(&controller).await == (200, "ok".to_string())).then_some(())
    })
    .await;
    controller.shutdown().await;
}

/// A replica whose plan loop is gone (a panic in it, or here an abort, which ends the task the same
/// way) fails `/healthz` although `/metrics` still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn healthz_fails_once_the_plan_loop_is_gone() {
    let h = Harness::start().await;
    let controller = h
        .controller_with(with_health(Duration::from_secs(600)), "snapdrain-0")
        .await;
    let addr = controller.metrics_addr.expect("served");
    assert_eq!(reqwest_health(&controller).await, (200, "ok".to_string()));
    // kill() aborts the lead loop but leaves the metrics server of the process running.
    controller.kill();
    let body = eventually("/healthz fails", || async {
        let r = reqwest::get(format!("http://{addr}/healthz")).await.ok()?;
        if r.status().as_u16() != 503 {
            return None;
        }
        Some(r.text().await.unwrap_or_default())
    })
    .await;
    assert!(body.contains("plan loop has stopped"), "{body}");
    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("/metrics still answers");
    assert_eq!(metrics.status().as_u16(), 200);
}
