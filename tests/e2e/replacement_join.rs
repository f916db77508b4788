//! Fail before harm (issue 21 item 8): what a replacement joins with is resolved while planning, from the
//! plan, the controller's flags or the replaced instance itself, so `snapdrain controller` on EKS needs
//! no join flags, and a plan whose replacement could never be built fails with its node untouched.
//!
//! The replaced instances carry the user data Karpenter writes for Bottlerocket nodes (cluster name, API
//! server and CA under `settings.kubernetes`: karpenter-provider-aws
//! pkg/providers/amifamily/bootstrap/bottlerocket.go), which snapdrain reads with
//! DescribeInstanceAttribute `userData` through the real aws-sdk-ec2.

use k8s_openapi::api::core::v1::Node;
use serde_json::json;
use snapdrain::api::status::PlanPhase;
use snapdrain::controller::ControllerHandle;
use snapdrain::controller::run::RunOptions;
use snapdrain_sim::ec2::{CLUSTER_SECURITY_GROUP, InstanceState, NODE_INSTANCE_PROFILE};
use snapdrain_sim::scenario::format::InstanceLaunch;
use snapdrain_testkit::harness::{Harness, TIMEOUT};

const AMI: &str = "ami-0bottlerocket1350";

pub(super) fn instance_of(node: &Node) -> String {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(|p| p.rsplit('/').next())
        .expect("a providerID")
        .to_string()
}

/// Nothing was done to the node (not cordoned, not tainted), to its pods (no eviction), to its data (no
/// Backup) or to its instance (still running, never terminated), and nothing was launched: from the
/// audit log of every mutating request and world event. (The node is patched: the hold keeper places
/// the node-level `karpenter.sh/do-not-disrupt` on every node with held pods, plan or no plan.)
pub(super) async fn assert_untouched(h: &Harness, plan: &str, node: &str, instance: &str) {
    let audit = h.audit();
    let touched: Vec<_> = audit
        .iter()
        .filter(|e| {
            e.resource == "pods/eviction"
                || (e.resource == "backups" && e.verb == "create")
                || (e.verb == "instance-terminated" && e.name.as_deref() == Some(instance))
        })
        .collect();
    assert!(
        touched.is_empty(),
        "plan {plan} touched something: {touched:#?}"
    );
    assert!(h.backups_of(plan).await.is_empty());
    let still = h.node(node).await.expect("the node stays");
    let spec = still.spec.unwrap_or_default();
    assert_ne!(spec.unschedulable, Some(true), "not cordoned");
    assert!(
        !spec
            .taints
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "snapdrain.io/draining"),
        "not tainted"
    );
    let ec2 = h.cluster.ec2.as_ref().expect("ec2");
    assert_eq!(
        ec2.instance(instance).expect("known").state,
        InstanceState::Running
    );
    assert!(h.instances_of(plan).is_empty(), "nothing launched");
}

/// The controller as the chart runs it on EKS with `cluster.*` left empty: no `--cluster-name`,
/// `--api-server` or `--cluster-certificate`.
async fn controller_without_join_flags(h: &Harness) -> ControllerHandle {
    let mut settings = h.settings("snapdrain-0");
    settings.cluster_name = None;
    settings.api_server = None;
    settings.cluster_certificate = None;
    snapdrain::controller::start(
        h.kube_config(),
        settings,
        RunOptions {
            lease_namespace: None,
            ..RunOptions::default()
        },
    )
    .await
    .expect("controller starts")
}

/// No join flags and a plan naming only the instance type and image: the cluster settings come from the
/// replaced instance's user data, the profile, security group and subnet from DescribeInstances; both
/// are recorded in the status, and the replacement boots with user data naming the cluster and joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replacement_joins_with_the_cluster_named_in_the_replaced_instances_user_data() {
    let h = Harness::start().await;
    let controller = controller_without_join_flags(&h).await;
    let node = h.node_with_statefulset_pods().await;
    let old = instance_of(&h.node(&node).await.expect("the node"));
    h.create_plan(
        "from-user-data",
        json!({"nodes": [node], "replacement": {"when": "after-drain", "instanceTypes": ["m6i.xlarge"]}}),
    )
    .await;
    let plan = h
        .wait_plan("from-user-data", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.expect("a status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");

    let want = snapdrain_sim::cluster::cluster_join(&h.cluster.url(), h.cluster.ca_pem());
    let cluster = status.join.clone().expect("the cluster was recorded");
    assert_eq!(
        (
            cluster.cluster_name.as_str(),
            cluster.api_server.as_deref(),
            cluster.cluster_certificate.as_deref()
        ),
        (
            want.cluster_name.as_str(),
            Some(want.api_server.as_str()),
            Some(want.cluster_certificate.as_str())
        )
    );
    let source = format!("user data of instance {old} (node {node})");
    assert!(
        cluster.from.len() == 3 && cluster.from.iter().all(|f| f.ends_with(&source)),
        "{:?}",
        cluster.from
    );
    let ec2 = h.cluster.ec2.as_ref().expect("ec2");
    let profile = ec2.config().instance_profile_arn(NODE_INSTANCE_PROFILE);
    let joined = status.nodes[0]
        .join
        .clone()
        .expect("the node's join settings");
    assert_eq!(joined.instance_profile.as_deref(), Some(profile.as_str()));
    assert_eq!(joined.security_group_ids, [CLUSTER_SECURITY_GROUP]);

    let launched = h.instances_of("from-user-data");
    assert_eq!(launched.len(), 1, "{launched:?}");
    let new = ec2.instance(&launched[0]).expect("launched").info;
    let host = new
        .user_data
        .expect("booted with valid Bottlerocket user data");
    assert_eq!(
        (host.cluster_name.as_str(), host.api_server.as_str()),
        (want.cluster_name.as_str(), want.api_server.as_str())
    );
    assert_eq!(new.kubelet_error, None);
    assert!(
        status.nodes[0]
            .replacement
            .as_ref()
            .is_some_and(|r| r.ready && r.node_name.is_some()),
        "{status:#?}"
    );
    controller.shutdown().await;
}

/// Nodes launched by hand, without an instance profile or user data, no join flags and a plan naming
/// neither: the plan fails in Pending saying what is missing and where to set it, and the audit log
/// shows nothing was done to the node (no patch, so no cordon), to its pods (no eviction), to its data
/// (no Backup) or to its instance (still running, never terminated).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replacement_that_cannot_be_built_fails_before_the_node_is_touched() {
    let h = Harness::start_scenario("quickstart", |s| {
        for g in &mut s.nodes {
            g.karpenter = None;
            g.launch = Some(InstanceLaunch {
                instance_profile: false,
                user_data: false,
            });
        }
    })
    .await;
    let controller = controller_without_join_flags(&h).await;
    let node = h.node_with_statefulset_pods().await;
    let old = instance_of(&h.node(&node).await.expect("the node"));
    h.create_plan(
        "cannot-join",
        json!({"nodes": [node], "replacement": {"when": "after-drain", "instanceTypes": ["m6i.xlarge"]}}),
    )
    .await;
    let plan = h
        .wait_plan("cannot-join", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.expect("a status");
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    assert_untouched(&h, "cannot-join", &node, &old).await;
    let message = status.message.unwrap_or_default();
    for want in [
        "spec.replacement.iamInstanceProfile",
        &format!("the replaced instance {old} has none to copy"),
        "settings.kubernetes.{cluster-name, api-server, cluster-certificate}",
        &format!("the user data of instance {old} (node {node}) is empty"),
        "--cluster-name",
        "no node was cordoned",
    ] {
        assert!(message.contains(want), "{want:?} is not in {message:?}");
    }
    assert!(
        status.step_timings.keys().all(|p| p == "Pending"),
        "the plan never left Pending: {:?}",
        status.step_timings
    );

    controller.shutdown().await;
}

/// A subnet or launch template the plan names that EC2 does not have would only be refused by the
/// launch (`InvalidSubnetID.NotFound`, `InvalidLaunchTemplateName.NotFoundException`: EC2 API error
/// codes), after the drain; planning asks DescribeSubnets and DescribeLaunchTemplateVersions and fails first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_subnet_or_launch_template_ec2_does_not_have_fails_the_plan_while_planning() {
    let h = Harness::start().await;
    // Free-form launch settings are the platform team's to allow (the default policy refuses them).
    h.set_policy(json!({"replacement": {"allowFreeForm": true}}))
        .await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let old = instance_of(&h.node(&node).await.expect("the node"));
    let cases = [
        (
            "no-such-subnet",
            json!({"subnets": ["subnet-0123456789abcdef0"]}),
            "spec.replacement.subnets cannot be used: EC2 DescribeSubnets failed with InvalidSubnetID.NotFound: The subnet ID 'subnet-0123456789abcdef0' does not exist",
        ),
        (
            "no-such-template",
            json!({"launchTemplate": {"name": "no-such-template"}}),
            "spec.replacement.launchTemplate no-such-template does not exist",
        ),
    ];
    // One after the other: a node has one running plan at a time.
    for (name, extra, want) in cases {
        let mut replacement =
            json!({"when": "after-drain", "instanceTypes": ["m6i.xlarge"], "imageId": AMI});
        for (k, v) in extra.as_object().expect("an object") {
            replacement[k] = v.clone();
        }
        h.create_plan(name, json!({"nodes": [node], "replacement": replacement}))
            .await;
        let plan = h.wait_plan(name, TIMEOUT, |p| p.is_terminal()).await;
        let status = plan.status.expect("a status");
        assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
        let message = status.message.unwrap_or_default();
        assert!(message.contains(want), "{want:?} is not in {message:?}");
        assert_untouched(&h, name, &node, &old).await;
    }
    controller.shutdown().await;
}
