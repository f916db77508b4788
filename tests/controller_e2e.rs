//! End to end: the snapdrain controller drives DisruptionPlans against the simulated cluster over HTTP,
//! with Velero writing to the S3 endpoint and EC2 reached through aws-sdk-ec2.

mod e2e {
    pub mod harness;
}

use e2e::harness::{Harness, TIMEOUT, assert_no_eviction_before_verified_backup};
use kube::ResourceExt;
use serde_json::json;
use snapdrain::api::status::PlanPhase;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plan_backs_up_verifies_drains_terminates_and_replaces() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    assert!(!protected.is_empty());
    let ec2 = h.cluster.ec2.as_ref().unwrap();
    let subnet = ec2.config().subnets[0].id.clone();
    h.create_plan(
        "replace-one",
        json!({
            "nodes": [node],
            "replacement": {
                "when": "after-drain",
                "instanceTypes": ["m6i.xlarge"],
                "imageId": "ami-0bottlerocket1350",
                "subnets": [subnet],
                "bottlerocket": {
                    "nodeLabels": {"example.com/pool": "stateful"},
                    "nodeTaints": {"example.com/dedicated": ["db:NoSchedule"]},
                    "sysctls": {"fs.inotify.max_user_instances": "8192", "fs.inotify.max_user_watches": "524288"}
                }
            }
        }),
    )
    .await;
    let plan = h
        .wait_plan("replace-one", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.clone().unwrap();
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    assert!(
        !status.backups.is_empty() && status.backups.iter().all(|b| b.verified),
        "{:#?}",
        status.backups
    );
    assert_no_eviction_before_verified_backup(&h.accepted_evictions(), &protected, &plan);
    for pod in &protected {
        assert!(
            h.accepted_evictions().iter().any(|(p, _)| p == pod),
            "protected pod {pod} was never evicted"
        );
    }
    assert!(h.node(&node).await.is_none(), "the drained node is gone");
    let replacement = status.nodes[0]
        .replacement
        .clone()
        .expect("replacement recorded");
    assert!(replacement.ready);
    let new_node = h
        .node(replacement.node_name.as_deref().unwrap())
        .await
        .expect("replacement node exists");
    let labels = new_node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("example.com/pool").map(String::as_str),
        Some("stateful")
    );
    let taints = new_node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    assert!(taints.iter().any(|t| t.key == "example.com/dedicated"
        && t.value.as_deref() == Some("db")
        && t.effect == "NoSchedule"));
    let sysctls = new_node
        .annotations()
        .get("sim.snapdrain.io/sysctls")
        .cloned()
        .unwrap_or_default();
    assert!(
        sysctls.contains("fs.inotify.max_user_instances") && sysctls.contains("8192"),
        "{sysctls}"
    );
    controller.shutdown().await;
}
