//! Fail before harm (issue 21 item 8, issue 22 C-1): a replacement whose instance types cannot run its
//! AMI would be refused by EC2 only at launch (RunInstances `InvalidParameterValue`: "The architecture
//! 'arm64' of the specified instance type does not match the architecture 'x86_64' of the specified
//! AMI...", as skypilot-org/skypilot issue 6315 quotes EC2; CreateFleet: per override), after the node
//! was drained. Planning asks DescribeImages and DescribeInstanceTypes through the real aws-sdk-ec2 and
//! drops the types that cannot run the AMI, or fails the plan with its node untouched.
//!
//! The scenario's nodes are m6i instances running an x86_64 Bottlerocket AMI; the plans name no image,
//! so the replacement gets the replaced instance's (copied from DescribeInstances).

use aws_sdk_ec2::types::{
    InstanceRequirementsRequest, InstanceType,
    LaunchTemplateIamInstanceProfileSpecificationRequest, MemoryMiBRequest,
    RequestLaunchTemplateData, VCpuCountRangeRequest,
};
use serde_json::json;
use snapdrain::api::status::PlanPhase;
use snapdrain::cloud::ec2::Ec2Cloud;
use snapdrain_sim::apiserver::faults::{FaultKind, FaultRule};
use snapdrain_sim::ec2::images::{BOTTLEROCKET_ARM64, BOTTLEROCKET_X86_64};
use snapdrain_sim::ec2::{CLUSTER_SECURITY_GROUP, NODE_INSTANCE_PROFILE};
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

/// The platform team's launch template `workers` in the harness's simulated EC2, through the real
/// aws-sdk-ec2: version 1 (the default) an x86_64 Bottlerocket AMI on m6i.xlarge with what a node needs
/// to join (instance profile, cluster security group; no user data: plans send theirs), version 2 the
/// same with the arm64 AMI (CreateLaunchTemplateVersion from SourceVersion 1 inherits the type).
/// Returns the client, for tests that make more versions.
async fn workers_template(h: &Harness) -> Ec2Cloud {
    let ec2 = h
        .cluster
        .ec2
        .as_ref()
        .expect("the harness runs the EC2 simulator");
    let cloud = Ec2Cloud::with_endpoint(
        &ec2.endpoint(),
        &ec2.config().region,
        Some(("test", "test")),
    )
    .await;
    let sdk = cloud.client();
    let v1 = RequestLaunchTemplateData::builder()
        .image_id(BOTTLEROCKET_X86_64)
        .instance_type(InstanceType::M6iXlarge)
        .iam_instance_profile(
            LaunchTemplateIamInstanceProfileSpecificationRequest::builder()
                .arn(ec2.config().instance_profile_arn(NODE_INSTANCE_PROFILE))
                .build(),
        )
        .security_group_ids(CLUSTER_SECURITY_GROUP)
        .build();
    sdk.create_launch_template()
        .launch_template_name("workers")
        .launch_template_data(v1)
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the simulated EC2 makes the template: {}",
                aws_sdk_ec2::error::DisplayErrorContext(e)
            )
        });
    new_workers_version(&cloud, BOTTLEROCKET_ARM64).await;
    cloud
}

/// A new version of `workers` from version 1 with `image` (the type and the rest inherited).
async fn new_workers_version(cloud: &Ec2Cloud, image: &str) {
    cloud
        .client()
        .create_launch_template_version()
        .launch_template_name("workers")
        .source_version("1")
        .launch_template_data(RequestLaunchTemplateData::builder().image_id(image).build())
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the simulated EC2 makes a version: {}",
                aws_sdk_ec2::error::DisplayErrorContext(e)
            )
        });
}

/// Issue 22: the launch names the template version planning checked. The plan launches `$Latest`,
/// version 3 (x86_64 on m6i.xlarge) when it is checked; version 4, with the arm64 AMI EC2 would refuse
/// on m6i.xlarge, is made after the check and before the launch (the plan launches after the drain,
/// so only once the backup is verified). The replacement runs version 3's AMI: the launch sent `3`,
/// not `$Latest` again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_launch_names_the_template_version_planning_checked_not_a_later_latest() {
    let h = Harness::start().await;
    let cloud = workers_template(&h).await;
    new_workers_version(&cloud, BOTTLEROCKET_X86_64).await;
    h.set_policy(json!({"replacement": {"launchTemplates": ["workers"]}}))
        .await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan(
        "template-pinned",
        json!({"nodes": [node], "replacement": {
            "when": "after-drain", "launchTemplate": {"name": "workers", "version": "$Latest"}, "bottlerocket": {}
        }}),
    )
    .await;
    let checked = |p: &snapdrain::api::DisruptionPlan| {
        p.status.as_ref().and_then(|s| {
            s.nodes
                .first()?
                .join
                .as_ref()?
                .launch_template_version
                .clone()
        })
    };
    let plan = h
        .wait_plan_until("template-pinned", TIMEOUT, |p| {
            checked(p).is_some() || p.status.as_ref().is_some_and(|s| s.phase.is_terminal())
        })
        .await;
    assert_eq!(checked(&plan).as_deref(), Some("3"), "{:#?}", plan.status);
    new_workers_version(&cloud, BOTTLEROCKET_ARM64).await;
    // The new version was made before the launch, or the test proves nothing.
    assert!(
        h.instances_of("template-pinned").is_empty(),
        "the replacement launched before version 4 was made"
    );
    let plan = h
        .wait_plan("template-pinned", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.expect("a terminal plan has a status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let launched = h.instances_of("template-pinned");
    assert_eq!(launched.len(), 1, "{launched:?}");
    let ec2 = h.cluster.ec2.as_ref().expect("ec2");
    let instance = ec2.instance(&launched[0]).expect("launched").info;
    assert_eq!(
        (instance.image_id.as_str(), instance.instance_type.as_str()),
        (BOTTLEROCKET_X86_64, "m6i.xlarge"),
        "version 3 launched"
    );
    controller.shutdown().await;
}

/// Issue 22: the AMI and instance type a launch template carries are checked as the plan's are. The
/// plan names neither: its launch takes both from the template version it names (`$Latest`, version
/// 2: an arm64 AMI with an x86_64 type), which EC2 would refuse only at launch, after the drain.
/// Planning reads that version with DescribeLaunchTemplateVersions and fails the plan with its node
/// untouched; a plan launching version 1 (`$Default`) from the same template completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_arm64_ami_in_the_launch_template_version_fails_the_plan_before_the_node_is_cordoned() {
    let h = Harness::start().await;
    workers_template(&h).await;
    h.set_policy(json!({"replacement": {"launchTemplates": ["workers"]}}))
        .await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let old = instance_of(&h.node(&node).await.expect("the node"));
    h.create_plan(
        "template-arm64",
        json!({"nodes": [node], "replacement": {
            "when": "after-drain", "launchTemplate": {"name": "workers", "version": "$Latest"}, "bottlerocket": {}
        }}),
    )
    .await;
    let plan = h
        .wait_plan("template-arm64", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.expect("a terminal plan has a status");
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    assert_untouched(&h, "template-arm64", &node, &old).await;
    let message = status.message.unwrap_or_default();
    for want in [
        format!("its AMI {BOTTLEROCKET_ARM64}"),
        "from launch template workers version 2 ($Latest)".to_string(),
        "is arm64".to_string(),
        "m6i.xlarge (x86_64)".to_string(),
        "list arm64 instance types in spec.replacement.instanceTypes".to_string(),
        "no node was cordoned".to_string(),
    ] {
        assert!(message.contains(&want), "{want:?} is not in {message:?}");
    }
    assert!(
        status.step_timings.keys().all(|p| p == "Pending"),
        "the plan never left Pending: {:?}",
        status.step_timings
    );

    h.create_plan(
        "template-default",
        json!({"nodes": [node], "replacement": {
            "when": "after-drain", "launchTemplate": {"name": "workers"}, "bottlerocket": {}
        }}),
    )
    .await;
    let plan = h
        .wait_plan("template-default", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.expect("a terminal plan has a status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let join = status.nodes[0]
        .join
        .clone()
        .expect("the node's join record");
    assert_eq!(join.image_architecture.as_deref(), Some("x86_64"));
    assert!(
        join.from.iter().any(|f| f
            == &format!("launchTemplate: launch template workers version 1 ($Default), its AMI {BOTTLEROCKET_X86_64}, its instance type m6i.xlarge")),
        "{:?}",
        join.from
    );
    let launched = h.instances_of("template-default");
    assert_eq!(launched.len(), 1, "{launched:?}");
    let ec2 = h.cluster.ec2.as_ref().expect("ec2");
    let instance = ec2.instance(&launched[0]).expect("launched").info;
    assert_eq!(
        (instance.image_id.as_str(), instance.instance_type.as_str()),
        (BOTTLEROCKET_X86_64, "m6i.xlarge")
    );
    controller.shutdown().await;
}

/// A launch template, or a version of it, that EC2 does not have would be refused only at launch
/// (`InvalidLaunchTemplateName.NotFoundException`, `InvalidLaunchTemplateId.VersionNotFound`), after
/// the drain: planning asks DescribeLaunchTemplateVersions for the version the launch names and fails
/// the plan, naming the template and the fix, with its node untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_launch_template_or_version_ec2_does_not_have_fails_the_plan_before_the_node_is_cordoned()
{
    let h = Harness::start().await;
    workers_template(&h).await;
    h.set_policy(json!({"replacement": {"launchTemplates": ["workers", "no-such-template"]}}))
        .await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let old = instance_of(&h.node(&node).await.expect("the node"));
    let cases = [
        (
            "missing-template",
            json!({"name": "no-such-template"}),
            "spec.replacement.launchTemplate no-such-template does not exist in this region (EC2 DescribeLaunchTemplateVersions failed with InvalidLaunchTemplateName.NotFoundException: The specified launch template, with template name no-such-template, does not exist.); create it, or name another",
        ),
        (
            "missing-version",
            json!({"name": "workers", "version": "7"}),
            "spec.replacement.launchTemplate workers has no version 7 (EC2 DescribeLaunchTemplateVersions failed with InvalidLaunchTemplateId.VersionNotFound: Could not find the specified version 7 for the launch template with ID lt-",
        ),
    ];
    // One after the other: a node has one running plan at a time.
    for (name, template, want) in cases {
        h.create_plan(
            name,
            json!({"nodes": [node], "replacement": {
                "when": "after-drain", "launchTemplate": template, "bottlerocket": {}
            }}),
        )
        .await;
        let plan = h.wait_plan(name, TIMEOUT, |p| p.is_terminal()).await;
        let status = plan.status.expect("a terminal plan has a status");
        assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
        let message = status.message.unwrap_or_default();
        assert!(message.contains(want), "{want:?} is not in {message:?}");
        assert!(message.contains("no node was cordoned"), "{message}");
        assert_untouched(&h, name, &node, &old).await;
    }
    controller.shutdown().await;
}

/// Issue 22 (least privilege): a role whose IAM policy lacks `ec2:DescribeLaunchTemplateVersions` gets
/// `UnauthorizedOperation` (HTTP 403) from EC2 (the simulator has no IAM: a fault rule answers that
/// action as EC2 answers such a role). The template cannot be checked, so the plan fails in Pending with
/// its node untouched, naming the permission and the policy file that grants it, rather than
/// launching an unchecked template after the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_role_that_may_not_read_the_launch_template_fails_the_plan_naming_the_permission() {
    let h = Harness::start().await;
    workers_template(&h).await;
    h.set_policy(json!({"replacement": {"launchTemplates": ["workers"]}}))
        .await;
    h.cluster.faults.add(FaultRule {
        kind: FaultKind::Ec2,
        operation: Some("DescribeLaunchTemplateVersions".into()),
        code: Some("UnauthorizedOperation".into()),
        error_rate: 1.0,
        ..FaultRule::default()
    });
    let controller = h.controller().await;
    fails_before_the_cordon(
        &h,
        "template-unauthorized",
        "workers",
        &[
            "spec.replacement.launchTemplate workers cannot be read",
            "not authorized to perform: ec2:DescribeLaunchTemplateVersions",
            "snapdrain's IAM role needs ec2:DescribeLaunchTemplateVersions, see deploy/iam/snapdrain-policy.json",
        ],
    )
    .await;
    controller.shutdown().await;
}

/// Issue 22 (fail before harm): a launch template version that chooses its instance types by
/// attributes (`InstanceRequirements`) cannot be launched with RunInstances, which is what a launch
/// without types is ("Attribute-based instance type selection is only supported when using Auto
/// Scaling groups, EC2 Fleet, and Spot Fleet": EC2 API reference, `InstanceRequirementsRequest`).
/// A plan naming no types fails in Pending, node untouched, saying to list them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_template_choosing_types_by_attributes_fails_a_plan_naming_no_types_before_the_cordon() {
    let h = Harness::start().await;
    let cloud = workers_template(&h).await;
    let attributes = InstanceRequirementsRequest::builder()
        .v_cpu_count(VCpuCountRangeRequest::builder().min(4).build())
        .memory_mib(MemoryMiBRequest::builder().min(16384).build())
        .build();
    cloud
        .client()
        .create_launch_template()
        .launch_template_name("flexible")
        .launch_template_data(
            RequestLaunchTemplateData::builder()
                .image_id(BOTTLEROCKET_X86_64)
                .instance_requirements(attributes)
                .build(),
        )
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the simulated EC2 makes the template: {}",
                aws_sdk_ec2::error::DisplayErrorContext(e)
            )
        });
    h.set_policy(json!({"replacement": {"launchTemplates": ["workers", "flexible"]}}))
        .await;
    let controller = h.controller().await;
    fails_before_the_cordon(
        &h,
        "template-attributes",
        "flexible",
        &[
            "cannot launch from launch template flexible version 1 ($Default)",
            "chooses its instance types by attributes (InstanceRequirements)",
            "list the instance types to launch there",
            "no node was cordoned",
        ],
    )
    .await;
    controller.shutdown().await;
}

/// Runs plan `plan`, launching from launch template `template` after the drain, on a node with
/// StatefulSet pods: it must fail in Pending, its node untouched, with each of `wants` in its message.
async fn fails_before_the_cordon(h: &Harness, plan: &str, template: &str, wants: &[&str]) {
    let node = h.node_with_statefulset_pods().await;
    let old = instance_of(&h.node(&node).await.expect("the node"));
    h.create_plan(
        plan,
        json!({"nodes": [node], "replacement": {
            "when": "after-drain", "launchTemplate": {"name": template}, "bottlerocket": {}
        }}),
    )
    .await;
    let status = h
        .wait_plan(plan, TIMEOUT, |p| p.is_terminal())
        .await
        .status
        .expect("a terminal plan has a status");
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    assert_untouched(h, plan, &node, &old).await;
    let message = status.message.unwrap_or_default();
    for want in wants {
        assert!(message.contains(want), "{want:?} is not in {message:?}");
    }
}
