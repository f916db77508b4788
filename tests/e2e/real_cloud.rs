//! Terminating and replacing nodes the way real EC2, Auto Scaling and Karpenter need it (review #6, #10,
//! #16, #17, #23, items 1-3, 6, 9 of issue 9): replacements that carry what a node needs to join, a join
//! timeout with a new ClientToken per attempt, Auto Scaling groups that must not double the capacity,
//! Karpenter nodes kept when asked, Nodes recreated under the same name left alone, and a replacement
//! type without capacity (InsufficientInstanceCapacity) passed over for the next one.

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::json;
use snapdrain::api::DisruptionPlan;
use snapdrain::api::status::PlanPhase;
use snapdrain_sim::ec2::{
    CLUSTER_SECURITY_GROUP, DEFAULT_SECURITY_GROUP, InstanceState, NODE_INSTANCE_PROFILE,
};
use snapdrain_sim::{ScenarioSource, SimCluster, SimConfig};
use snapdrain_testkit::eventually_within;
use snapdrain_testkit::harness::{Harness, TIMEOUT, fast_timings, install_plan_crd};

const AMI: &str = "ami-0bottlerocket1350";

fn nodeclaims(h: &Harness) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim");
    Api::all_with(
        h.client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "nodeclaims"),
    )
}

fn owning_claim(node: &Node) -> String {
    node.owner_references()
        .iter()
        .find(|o| o.kind == "NodeClaim")
        .map(|o| o.name.clone())
        .expect("quickstart nodes are Karpenter's")
}

fn instance_of(node: &Node) -> String {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(|p| p.rsplit('/').next())
        .expect("a providerID")
        .to_string()
}

/// A world from an inline scenario (no Karpenter, no workloads unless the YAML has them).
async fn start_scenario(yaml: &str) -> Harness {
    snapdrain_testkit::capture_logs();
    let scenario =
        snapdrain_sim::scenario::parse(yaml, "real_cloud test").expect("scenario parses");
    let cluster = SimCluster::start(SimConfig {
        scenario: Some(ScenarioSource::Inline {
            scenario: Box::new(scenario),
            label: "real_cloud test".into(),
        }),
        timings: Some(fast_timings()),
        ..Default::default()
    })
    .await
    .expect("the scenario starts");
    let client = snapdrain_testkit::client(&cluster);
    install_plan_crd(&client).await.expect("install the CRD");
    Harness { cluster, client }
}

/// #6: without a launch template the replacement gets the replaced instance's subnet (never an empty
/// SubnetId, which EC2 refuses), instance profile, security groups and IMDSv2 settings, plus the
/// `kubernetes.io/cluster/<name>=owned` tag; the simulated EC2 lets an instance join only with a
/// profile and a control-plane security group (Bottlerocket QUICKSTART-EKS; karpenter-provider-aws
/// pkg/providers/launchtemplate/types.go carries the same). The launch template made for the fleet is
/// deleted once it launched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replacement_without_a_template_joins_with_the_replaced_instances_settings() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let old = instance_of(&h.node(&node).await.unwrap());
    let ec2 = h.cluster.ec2.as_ref().unwrap();
    let old_subnet = ec2.instance(&old).unwrap().info.subnet_id;
    h.create_plan(
        "join-settings",
        json!({"nodes": [node], "replacement": {"when": "after-drain", "instanceTypes": ["m6i.xlarge"]}}),
    )
    .await;
    let plan = h
        .wait_plan("join-settings", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.unwrap();
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let launched = h.instances_of("join-settings");
    assert_eq!(launched.len(), 1);
    let new = ec2.instance(&launched[0]).unwrap().info;
    assert_eq!(new.subnet_id, old_subnet, "the replaced instance's subnet");
    assert_eq!(
        new.iam_instance_profile,
        Some(ec2.config().instance_profile_arn(NODE_INSTANCE_PROFILE))
    );
    assert_eq!(new.security_group_ids, [CLUSTER_SECURITY_GROUP]);
    assert_eq!(new.metadata_options.http_tokens, "required");
    assert_eq!(
        new.tags
            .get("kubernetes.io/cluster/snapdrain-sim")
            .map(String::as_str),
        Some("owned")
    );
    assert!(
        !ec2.launch_template_names()
            .iter()
            .any(|n| n.starts_with("snapdrain-")),
        "the template made for the launch is gone: {:?}",
        ec2.launch_template_names()
    );
    controller.shutdown().await;
}

/// Item 2: a replacement that does not join within `joinTimeout` is terminated and launched again with
/// a new ClientToken (`snapdrain-<uid>-2`); when the last attempt does not join either, the plan fails
/// saying so. Here the plan's security group cannot reach the control plane.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replacement_that_never_joins_is_terminated_retried_and_fails_the_plan() {
    let h = Harness::start().await;
    // A security group of the plan's own: the platform team allowed free-form launch settings.
    h.set_policy(json!({"replacement": {"allowFreeForm": true}}))
        .await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let uid = h.node(&node).await.unwrap().uid().unwrap();
    h.create_plan(
        "never-joins",
        json!({"nodes": [node], "replacement": {
            "when": "after-drain", "instanceTypes": ["m6i.xlarge"],
            "securityGroupIds": [DEFAULT_SECURITY_GROUP], "joinTimeout": "1s", "maxAttempts": 2
        }}),
    )
    .await;
    let plan = h
        .wait_plan("never-joins", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.unwrap();
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    let message = status.message.unwrap_or_default();
    assert!(message.contains("did not join"), "{message}");
    let ec2 = h.cluster.ec2.as_ref().unwrap();
    let launched = h.instances_of("never-joins");
    assert_eq!(launched.len(), 2, "one instance per attempt");
    let mut tokens: Vec<String> = launched
        .iter()
        .map(|id| ec2.instance(id).unwrap().client_token.unwrap())
        .collect();
    tokens.sort();
    assert_eq!(
        tokens,
        [format!("snapdrain-{uid}-1"), format!("snapdrain-{uid}-2")]
    );
    for id in &launched {
        let state = ec2.instance(id).unwrap().state;
        assert!(
            matches!(
                state,
                InstanceState::ShuttingDown | InstanceState::Terminated
            ),
            "stray instance {id} is {state:?}"
        );
    }
    controller.shutdown().await;
}

const NODE_GROUP: &str = r#"
name: node-group
description: Three nodes of an EKS managed node group (an Auto Scaling group), no Karpenter.
nodes:
  - count: 3
    instanceType: m6i.xlarge
    zones: [us-east-1a]
"#;

/// #10: a node in an Auto Scaling group is removed with TerminateInstanceInAutoScalingGroup and, as
/// snapdrain launches the replacement, ShouldDecrementDesiredCapacity: with TerminateInstances the
/// group would launch its own replacement too (Auto Scaling API reference) and the capacity doubles.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_group_member_is_terminated_through_its_group_without_doubling_capacity() {
    let h = start_scenario(NODE_GROUP).await;
    let ec2 = h.cluster.ec2.as_ref().unwrap();
    let instances = h.cluster.scenario.as_ref().unwrap().instances.clone();
    let ids: Vec<String> = instances.iter().map(|i| i.instance_id.clone()).collect();
    ec2.create_auto_scaling_group("eks-ng-1", &ids).unwrap();
    // These nodes run nothing to back up; skip needs the policy's allowance (security review C-1).
    h.set_policy(json!({"planSettings": {"allowBackupSkip": true}}))
        .await;
    let controller = h.controller().await;
    let node = instances[0].node_name.clone();
    h.create_plan(
        "node-group",
        json!({"nodes": [node], "backup": {"policy": "skip"},
               "replacement": {"when": "after-drain", "instanceTypes": ["m6i.xlarge"]}}),
    )
    .await;
    let plan = h
        .wait_plan("node-group", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.unwrap();
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let group = ec2.auto_scaling_group("eks-ng-1").unwrap();
    assert_eq!(
        group.desired, 2,
        "the group shrank by the node snapdrain replaced"
    );
    assert_eq!(
        group.members.len(),
        2,
        "the group launched no instance of its own: {group:?}"
    );
    let running = ec2
        .instances()
        .into_iter()
        .filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running))
        .count();
    assert_eq!(running, 3, "two group members and snapdrain's replacement");
    controller.shutdown().await;
}

/// Item 3: `terminateInstance: false` on a Karpenter node keeps the instance: the NodeClaim (whose
/// deletion makes Karpenter terminate the instance) and the Node (whose deletion starts Karpenter's
/// termination through its finalizer) are both left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminate_instance_false_keeps_a_karpenter_nodes_nodeclaim_and_instance() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let n = h.node(&node).await.unwrap();
    let (claim, instance) = (owning_claim(&n), instance_of(&n));
    h.create_plan(
        "keep-instance",
        json!({"nodes": [node], "termination": {"terminateInstance": false}}),
    )
    .await;
    let plan = h
        .wait_plan("keep-instance", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.unwrap();
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    assert!(
        nodeclaims(&h).get_opt(&claim).await.unwrap().is_some(),
        "NodeClaim {claim} kept"
    );
    assert!(h.node(&node).await.is_some(), "node kept");
    let state = h
        .cluster
        .ec2
        .as_ref()
        .unwrap()
        .instance(&instance)
        .unwrap()
        .state;
    assert_eq!(state, InstanceState::Running);
    controller.shutdown().await;
}

/// Item 9: while Karpenter terminates a node, status.message says what the plan waits for (here the
/// Node is held by a finalizer of the test's own).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminating_says_which_nodeclaim_it_waits_for() {
    const HOLD: &str = "test.snapdrain.io/hold";
    let h = Harness::start().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let claim = owning_claim(&h.node(&node).await.unwrap());
    let nodes: Api<Node> = Api::all(h.client.clone());
    let mut finalizers = h.node(&node).await.unwrap().finalizers().to_vec();
    finalizers.push(HOLD.into());
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
        )
        .await
        .unwrap();
    h.create_plan("says-why", json!({"nodes": [node]})).await;
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    let message = eventually_within("the plan to say what it waits for", TIMEOUT, || {
        let plans = plans.clone();
        async move {
            let s = plans.get("says-why").await.ok()?.status?;
            let m = s.message?;
            (s.phase == PlanPhase::Terminating && m.contains("Karpenter to terminate NodeClaim"))
                .then_some(m)
        }
    })
    .await;
    assert!(
        message.contains(&claim) && message.contains("deleting since"),
        "{message}"
    );
    // Karpenter takes its own finalizer off the deleting Node meanwhile: the list is written back only
    // over the version it was read from (a 409 reads it again), or a stale copy would add that finalizer
    // again, which the API server refuses on an object being deleted.
    eventually_within("the test's finalizer removed", TIMEOUT, || {
        let (h, nodes, node) = (&h, &nodes, &node);
        async move {
            let current = h.node(node).await?;
            let kept: Vec<String> = current
                .finalizers()
                .iter()
                .filter(|f| *f != HOLD)
                .cloned()
                .collect();
            let body = json!({"metadata": {"finalizers": kept, "resourceVersion": current.resource_version()}});
            match nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(body))
                .await
            {
                Ok(_) => Some(()),
                Err(kube::Error::Api(e)) if e.code == 409 => None,
                Err(e) => panic!("remove the test's finalizer: {e}"),
            }
        }
    })
    .await;
    let plan = h.wait_plan("says-why", TIMEOUT, |p| p.is_terminal()).await;
    assert_eq!(plan.status.unwrap().phase, PlanPhase::Completed);
    controller.shutdown().await;
}

/// #23: a Node recreated under the same name (IP-based hostnames are reused) has another uid; a plan
/// resuming in Terminating must not take it for the drained node and delete its NodeClaim. The plan's
/// status is written as a controller that stopped mid-way left it, with the old node's uid.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_recreated_under_the_same_name_is_left_alone() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    let n = h.node(&node).await.unwrap();
    let (claim, instance, uid) = (owning_claim(&n), instance_of(&n), n.uid().unwrap());
    h.create_plan("recreated", json!({"nodes": [node]})).await;
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    plans
        .patch_status(
            "recreated",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Terminating",
                "decidedAt": "2026-01-01T00:00:00Z",
                "nodes": [{"name": node, "uid": "0b6c3d4e-0000-0000-0000-000000000000",
                           "instanceId": instance, "phase": "Drained"}],
            }})),
        )
        .await
        .unwrap();
    let controller = h.controller().await;
    let plan = h.wait_plan("recreated", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.unwrap();
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    assert!(
        nodeclaims(&h).get_opt(&claim).await.unwrap().is_some(),
        "the new node's NodeClaim {claim} is kept"
    );
    let still = h.node(&node).await.expect("the node is still there");
    assert_eq!(still.uid().as_deref(), Some(uid.as_str()));
    assert!(still.metadata.deletion_timestamp.is_none());
    controller.shutdown().await;
}

/// #18: a node label kubelet refuses in `--node-labels` (kubernetes cmd/kubelet/app/options/options.go)
/// makes the replacement's kubelet exit, so it would never join; the plan fails before launching,
/// naming the label.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replacement_with_a_node_label_kubelet_refuses_fails_before_launching() {
    let h = Harness::start().await;
    // Node labels are the platform team's to allow (the default policy refuses them).
    h.set_policy(json!({"replacement": {"allowedSettings": ["kubernetes.node-labels"]}}))
        .await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan(
        "bad-label",
        json!({"nodes": [node], "replacement": {
            "when": "before-drain", "instanceTypes": ["m6i.xlarge"],
            "bottlerocket": {"nodeLabels": {"node-role.kubernetes.io/worker": ""}}
        }}),
    )
    .await;
    let plan = h.wait_plan("bad-label", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.unwrap();
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("node-role.kubernetes.io/worker") && message.contains("kubelet refuses"),
        "{message}"
    );
    assert!(h.instances_of("bad-label").is_empty(), "nothing launched");
    assert!(h.node(&node).await.is_some(), "the node stays");
    controller.shutdown().await;
}

/// No capacity for the first replacement type: EC2 answers `InsufficientInstanceCapacity` ("We currently
/// do not have sufficient m6i.xlarge capacity in the Availability Zone you requested (...)", EC2 API
/// error codes) for it in CreateFleet's errorSet, and the instant fleet made of the plan's instanceTypes
/// launches the next type instead; the plan completes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replacement_without_capacity_for_one_type_launches_the_next() {
    let h = Harness::start().await;
    // Harness::start always runs the EC2 simulator.
    let ec2 = h
        .cluster
        .ec2
        .as_ref()
        .expect("the harness runs the EC2 simulator");
    ec2.inject_capacity_error("m6i.xlarge", None, "InsufficientInstanceCapacity");
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan(
        "no-capacity",
        json!({"nodes": [node], "replacement": {
            "when": "after-drain", "instanceTypes": ["m6i.xlarge", "m5.xlarge"]
        }}),
    )
    .await;
    let plan = h
        .wait_plan("no-capacity", TIMEOUT, |p| p.is_terminal())
        .await;
    // wait_plan returned on a terminal phase, which only a status carries.
    let status = plan.status.expect("a terminal plan has a status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let asked: Vec<Vec<String>> = ec2
        .fleet_requests()
        .iter()
        .map(|r| {
            r.overrides
                .iter()
                .map(|o| o.instance_type.clone())
                .collect()
        })
        .collect();
    assert!(
        asked
            .iter()
            .any(|types| types.first().map(String::as_str) == Some("m6i.xlarge")),
        "the fleet asked for m6i.xlarge first: {asked:?}"
    );
    let launched = h.instances_of("no-capacity");
    assert_eq!(launched.len(), 1, "{launched:?}");
    // instances_of lists the simulator's own instances, which it never forgets.
    let instance = ec2.instance(&launched[0]).expect("a listed instance").info;
    assert_eq!(instance.instance_type, "m5.xlarge");
    controller.shutdown().await;
}

/// No capacity in any pool of the replacement's instant fleet: CreateFleet answers HTTP 200 with one
/// `InsufficientInstanceCapacity` per override in its errorSet (EC2 API reference, CreateFleet), a
/// result EC2 keeps for the ClientToken ("Ensuring idempotency in Amazon EC2 API requests", EC2
/// developer guide; the simulator: `snapdrain_sim::ec2::actions::create_fleet`). The plan waits (its
/// status and a `ReplacementWaitingForCapacity` Event say why), tries again with a new token recorded
/// before each try, and completes with one instance, launched under the token the status names, once
/// capacity is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replacement_fleet_without_any_capacity_waits_and_launches_with_a_new_token() {
    let h = Harness::start().await;
    // Harness::start always runs the EC2 simulator.
    let ec2 = h
        .cluster
        .ec2
        .as_ref()
        .expect("the harness runs the EC2 simulator");
    ec2.inject_capacity_error("m6i.xlarge", None, "InsufficientInstanceCapacity");
    ec2.inject_capacity_error("m5.xlarge", None, "InsufficientInstanceCapacity");
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan(
        "fleet-short",
        json!({"nodes": [node], "replacement": {
            "when": "after-drain", "instanceTypes": ["m6i.xlarge", "m5.xlarge"]
        }}),
    )
    .await;
    let progress = |p: &DisruptionPlan| {
        p.status
            .iter()
            .flat_map(|s| &s.nodes)
            .find_map(|n| n.replacement.clone())
            .unwrap_or_default()
    };
    // Two tries without capacity: the second went out under a token of its own, or it would have
    // been EC2's remembered answer to the first.
    let waiting = h
        .wait_plan_until("fleet-short", TIMEOUT, |p| {
            progress(p).capacity_errors >= 2
                || p.status.as_ref().is_some_and(|s| s.phase.is_terminal())
        })
        .await;
    let r = progress(&waiting);
    let status = waiting.status.clone().unwrap_or_default();
    assert_eq!(status.phase, PlanPhase::Replacing, "{status:#?}");
    assert!(
        r.capacity_error
            .as_deref()
            .is_some_and(|e| e.contains("m5.xlarge") && e.contains("InsufficientInstanceCapacity")),
        "{r:#?}"
    );
    assert!(r.retry_at.is_some(), "{r:#?}");
    let fleet_calls = ec2.fleet_requests().len();
    assert!(fleet_calls >= 2, "{fleet_calls} CreateFleet calls");
    snapdrain_testkit::eventually("a ReplacementWaitingForCapacity Event", || async {
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(h.client.clone());
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("fleet-short")
                    && e.reason.as_deref() == Some("ReplacementWaitingForCapacity")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("trying again"))
            })
            .then_some(())
    })
    .await;
    ec2.clear_faults();
    let plan = h
        .wait_plan("fleet-short", TIMEOUT, |p| p.is_terminal())
        .await;
    let done = progress(&plan);
    // wait_plan returned on a terminal phase, which only a status carries.
    let status = plan.status.expect("a terminal plan has a status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let launched = h.instances_of("fleet-short");
    assert_eq!(launched.len(), 1, "{launched:?}");
    // instances_of lists the simulator's own instances, which it never forgets.
    let instance = ec2.instance(&launched[0]).expect("a listed instance");
    assert_eq!(
        instance.client_token.as_deref(),
        Some(done.client_token.as_str()),
        "launched under the token the status recorded"
    );
    // The node's first token (from its uid, which planning recorded) is the one that never launched.
    let uid = status.nodes[0].uid.clone().unwrap_or_else(|| node.clone());
    let first = snapdrain::planning::client_token(&uid, 1);
    assert_ne!(done.client_token, first, "a retry token, not the first");
    assert_eq!((done.capacity_errors, done.capacity_error), (0, None));
    controller.shutdown().await;
}

/// A launch template with one type launches with RunInstances, which has nothing to fall back to:
/// InsufficientInstanceCapacity (an HTTP 500 API error there) is counted in the replacement's status and
/// the launch retried; once EC2 has capacity again the plan completes with the template's type. The
/// template carries what the node needs to join (instance profile, cluster security group) but no user
/// data: `bottlerocket: {}` makes snapdrain send its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replacement_from_a_template_is_retried_until_capacity_comes_back() {
    let h = Harness::start().await;
    // Harness::start always runs the EC2 simulator.
    let ec2 = h
        .cluster
        .ec2
        .as_ref()
        .expect("the harness runs the EC2 simulator");
    let cloud = snapdrain::cloud::ec2::Ec2Cloud::with_endpoint(
        &ec2.endpoint(),
        &ec2.config().region,
        Some(("test", "test")),
    )
    .await;
    cloud
        .client()
        .create_launch_template()
        .launch_template_name("workers")
        .launch_template_data(
            aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
                .image_id(AMI)
                .instance_type(aws_sdk_ec2::types::InstanceType::M6iXlarge)
                .iam_instance_profile(
                    aws_sdk_ec2::types::LaunchTemplateIamInstanceProfileSpecificationRequest::builder()
                        .arn(ec2.config().instance_profile_arn(NODE_INSTANCE_PROFILE))
                        .build(),
                )
                .security_group_ids(CLUSTER_SECURITY_GROUP)
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
    ec2.inject_capacity_error("m6i.xlarge", None, "InsufficientInstanceCapacity");
    // The platform team allows plans to launch from its template.
    h.set_policy(json!({"replacement": {"launchTemplates": ["workers"]}}))
        .await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan(
        "capacity-back",
        json!({"nodes": [node], "replacement": {
            "when": "after-drain", "launchTemplate": {"name": "workers"}, "bottlerocket": {}
        }}),
    )
    .await;
    let capacity_errors = |p: &DisruptionPlan| {
        p.status
            .iter()
            .flat_map(|s| &s.nodes)
            .filter_map(|n| n.replacement.as_ref())
            .map(|r| r.capacity_errors)
            .max()
            .unwrap_or(0)
    };
    let waiting = h
        .wait_plan_until("capacity-back", TIMEOUT, |p| capacity_errors(p) >= 1)
        .await;
    // The next try waits (persisted, so the status write that records the error cannot skip it).
    let retry_at = waiting
        .status
        .iter()
        .flat_map(|s| &s.nodes)
        .filter_map(|n| n.replacement.as_ref())
        .find_map(|r| r.retry_at.clone());
    assert!(retry_at.is_some(), "{:#?}", waiting.status);
    ec2.clear_faults();
    let plan = h
        .wait_plan("capacity-back", TIMEOUT, |p| p.is_terminal())
        .await;
    assert_eq!(capacity_errors(&plan), 0, "reset once launched");
    // wait_plan returned on a terminal phase, which only a status carries.
    let status = plan.status.expect("a terminal plan has a status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let launched = h.instances_of("capacity-back");
    assert_eq!(launched.len(), 1, "{launched:?}");
    // instances_of lists the simulator's own instances, which it never forgets.
    let instance = ec2.instance(&launched[0]).expect("a listed instance").info;
    assert_eq!(instance.instance_type, "m6i.xlarge");
    controller.shutdown().await;
}
