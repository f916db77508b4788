//! Fail before harm (issue 21 item 8, issue 22 C-1): a replacement whose instance types cannot run its
//! AMI would be refused by EC2 only at launch (RunInstances `InvalidParameterValue`: "The architecture
//! 'arm64' of the specified instance type does not match the architecture 'x86_64' of the specified
//! AMI...", as skypilot-org/skypilot issue 6315 quotes EC2; CreateFleet: per override), after the node
//! was drained. Planning asks DescribeImages and DescribeInstanceTypes through the real aws-sdk-ec2 and
//! drops the types that cannot run the AMI, or fails the plan with its node untouched.
//!
//! The scenario's nodes are m6i instances running an x86_64 Bottlerocket AMI; the plans name no image,
//! so the replacement gets the replaced instance's (copied from DescribeInstances).

use serde_json::json;
use snapdrain::api::status::PlanPhase;
use snapdrain_testkit::harness::{Harness, TIMEOUT};

use super::replacement_join::{assert_untouched, instance_of};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn arm64_instance_types_for_the_replaced_x86_64_ami_fail_the_plan_before_the_node_is_cordoned()
 {
    let h = Harness::start().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let old = instance_of(&h.node(&node).await.expect("the node"));
    let ec2 = h.cluster.ec2.as_ref().expect("ec2");
    let ami = ec2.instance(&old).expect("known").info.image_id;
    h.create_plan(
        "arm64-types",
        json!({"nodes": [node], "replacement": {"when": "after-drain", "instanceTypes": ["m6g.xlarge", "m7g.xlarge"]}}),
    )
    .await;
    let plan = h
        .wait_plan("arm64-types", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.expect("a status");
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    assert_untouched(&h, "arm64-types", &node, &old).await;
    let message = status.message.unwrap_or_default();
    for want in [
        format!("its AMI {ami}"),
        format!("from instance {old}"),
        "is x86_64".to_string(),
        "m6g.xlarge (arm64), m7g.xlarge (arm64)".to_string(),
        "list x86_64 instance types in spec.replacement.instanceTypes".to_string(),
        "no node was cordoned".to_string(),
    ] {
        assert!(message.contains(&want), "{want:?} is not in {message:?}");
    }
    assert!(
        status.step_timings.keys().all(|p| p == "Pending"),
        "the plan never left Pending: {:?}",
        status.step_timings
    );
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mixed_list_launches_only_the_instance_types_that_run_the_ami() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let ec2 = h.cluster.ec2.as_ref().expect("ec2");
    h.create_plan(
        "mixed-types",
        json!({"nodes": [node], "replacement": {"when": "after-drain", "instanceTypes": ["m7g.xlarge", "m6i.xlarge", "c7g.xlarge"]}}),
    )
    .await;
    let plan = h
        .wait_plan("mixed-types", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.expect("a status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let join = status.nodes[0]
        .join
        .clone()
        .expect("the node's join record");
    assert_eq!(join.image_architecture.as_deref(), Some("x86_64"));
    assert_eq!(join.instance_types, ["m6i.xlarge"]);
    assert!(
        join.from
            .iter()
            .any(|f| f.contains("dropped m7g.xlarge (arm64), c7g.xlarge (arm64)")),
        "{:?}",
        join.from
    );
    // EC2 was asked for the fitting type only: no override for it to refuse.
    let asked: Vec<String> = ec2
        .fleet_requests()
        .iter()
        .flat_map(|r| r.overrides.iter().map(|o| o.instance_type.clone()))
        .collect();
    assert!(
        !asked.is_empty() && asked.iter().all(|t| t == "m6i.xlarge"),
        "{asked:?}"
    );
    let launched = h.instances_of("mixed-types");
    assert_eq!(launched.len(), 1, "{launched:?}");
    assert_eq!(
        ec2.instance(&launched[0])
            .expect("launched")
            .info
            .instance_type,
        "m6i.xlarge"
    );
    controller.shutdown().await;
}
