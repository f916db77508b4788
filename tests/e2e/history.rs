//! Finished plans are deleted by the DisruptionPolicy's `history`: past `ttlAfterFinished`, except the
//! newest `keepPerNode` of a node that exists and plans marked `snapdrain.io/keep: "true"`; running plans
//! never. The plans here end for real (an invalid spec fails at once; a plan for a node that does not
//! exist waits in Pending), through the controller.

use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use snapdrain::api::{DisruptionPlan, DisruptionPolicy, PlanPhase};
use snapdrain_testkit::eventually;
use snapdrain_testkit::harness::{Harness, TIMEOUT};

/// Valid in shape, refused by the controller's own checks (`skip` with `reuseIfNewerThan`): the plan is
/// Failed at once, without touching the node.
fn invalid(node: &str) -> Value {
    json!({"nodes": [node], "backup": {"policy": "skip", "reuseIfNewerThan": "1h"}})
}

async fn ended(h: &Harness, name: &str) {
    h.wait_plan(name, TIMEOUT, PlanPhase::is_terminal).await;
}

async fn exists(h: &Harness, name: &str) -> bool {
    Api::<DisruptionPlan>::all(h.client.clone())
        .get_opt(name)
        .await
        .expect("get a plan")
        .is_some()
}

/// The plans whose DELETE the API server accepted, in order.
fn deleted(h: &Harness) -> Vec<String> {
    h.audit()
        .iter()
        .filter(|e| {
            e.verb == "delete"
                && e.resource == "disruptionplans.snapdrain.io"
                && e.code.is_some_and(|c| c < 300)
        })
        .filter_map(|e| e.name.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn finished_plans_past_the_ttl_are_deleted_but_a_nodes_newest_and_kept_ones_stay() {
    let h = Harness::start().await;
    let policy: DisruptionPolicy = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": "default"},
        "spec": {"history": {"ttlAfterFinished": "2s", "keepPerNode": 1}}
    }))
    .expect("a policy");
    Api::<DisruptionPolicy>::all(h.client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("create the policy");
    let node = h.node_with_statefulset_pods().await;
    let _controller = h.controller().await;

    // Two finished runs on a node that exists: the older goes, the newer is the node's last report.
    h.create_plan("older", invalid(&node)).await;
    ended(&h, "older").await;
    h.create_plan("newer", invalid(&node)).await;
    ended(&h, "newer").await;
    // On a node that is gone: nothing is kept for it, unless a person marked it.
    h.create_plan("gone-node", invalid("node-that-is-gone"))
        .await;
    let marked: DisruptionPlan = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
        "metadata": {"name": "marked", "annotations": {"snapdrain.io/keep": "true"}},
        "spec": invalid("node-that-is-gone")
    }))
    .expect("a plan");
    Api::<DisruptionPlan>::all(h.client.clone())
        .create(&PostParams::default(), &marked)
        .await
        .expect("create a plan marked to keep");
    // Running (waits in Pending for its node), however long: never deleted.
    h.create_plan("running", json!({"nodes": ["node-that-is-gone"]}))
        .await;

    eventually("the expired plans are deleted", || async {
        let d = deleted(&h);
        (d.contains(&"older".to_string()) && d.contains(&"gone-node".to_string())).then_some(())
    })
    .await;
    // One more plan to expire, so a later sweep is known to have run and left the rest alone.
    h.create_plan("later", invalid("node-that-is-gone")).await;
    eventually("a later sweep deletes the next expired plan", || async {
        deleted(&h).contains(&"later".to_string()).then_some(())
    })
    .await;
    let mut gone = deleted(&h);
    gone.sort();
    assert_eq!(gone, ["gone-node", "later", "older"]);
    for kept in ["newer", "marked", "running"] {
        assert!(exists(&h, kept).await, "{kept} was deleted");
    }
    let running = Api::<DisruptionPlan>::all(h.client.clone())
        .get("running")
        .await
        .expect("the running plan");
    assert!(
        !running
            .status
            .as_ref()
            .is_some_and(|s| s.phase.is_terminal()),
        "{} ended",
        running.name_any()
    );
    // Velero's Backups keep their own TTL: deleting a plan deletes no Backup.
    assert!(
        !h.audit()
            .iter()
            .any(|e| e.verb == "delete" && e.resource == "backups.velero.io"),
        "a Backup was deleted"
    );
}
