//! A plan author gains nothing (issue 22 item 2, security review C-1): what a replacement launches comes
//! from what the platform team governs (a Karpenter EC2NodeClass, the replaced instance, or the
//! DisruptionPolicy's allow-lists), and a plan selects at most the policy's `maxNodesPerPlan` nodes. A
//! plan the policy refuses fails while Pending, before any node is cordoned, backed up, drained or
//! terminated and before anything is launched (judged from the audit log of every mutating request).
//!
//! The EC2NodeClass is the scenario's `default` class as the simulated Karpenter resolved it
//! (`status.amis`, `status.subnets`, `status.securityGroups`, `status.instanceProfile`: karpenter-provider-aws
//! `pkg/apis/v1/ec2nodeclass_status.go`, `pkg/controllers/nodeclass/*.go`); the launch is checked through
//! the real aws-sdk-ec2 (DescribeInstances, DescribeInstanceAttribute `userData`).

use base64::Engine as _;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use snapdrain::api::DisruptionPlan;
use snapdrain::api::karpenter::ec2nodeclass_resource;
use snapdrain::api::status::{PlanPhase, condition};
use snapdrain_testkit::harness::{Harness, TIMEOUT};

use super::replacement_join::{assert_untouched, instance_of};

/// The AMI the test makes the class resolve to, unlike the one the replaced instances run.
const CLASS_AMI: &str = "ami-0c1a550000000c1a5";

fn classes(h: &Harness) -> Api<DynamicObject> {
    Api::all_with(h.client.clone(), &ec2nodeclass_resource())
}

/// The plan's `Valid` condition: (status, reason, message).
fn valid_condition(plan: &DisruptionPlan) -> (String, String, String) {
    plan.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == condition::VALID))
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        .expect("a Valid condition")
}

/// Under the default policy, a plan naming its own AMI and a bootstrap container (the review's exploit:
/// root code from any image on an instance holding the node role) is refused while Pending, naming each
/// field and the policy field that would allow it; nothing is touched or launched. Without the policy
/// check the plan backs up, drains and launches `ami-0...` with the container.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn free_form_image_and_bootstrap_container_are_refused_before_any_node_is_touched() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let old = instance_of(&h.node(&node).await.expect("the node"));
    h.create_plan(
        "evil",
        json!({"nodes": [node], "replacement": {
            "when": "before-drain", "instanceTypes": ["m6i.xlarge"], "imageId": "ami-0123456789abcdef0",
            "bottlerocket": {"settings": {"bootstrap-containers": {"x": {
                "source": "registry.example/evil:1", "mode": "once", "essential": true}}}}
        }}),
    )
    .await;
    let plan = h.wait_plan("evil", TIMEOUT, |p| p.is_terminal()).await;
    let (status, reason, message) = valid_condition(&plan);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "RefusedByPolicy")
    );
    assert_eq!(
        plan.status.as_ref().map(|s| s.phase),
        Some(PlanPhase::Failed)
    );
    for want in [
        "refused by DisruptionPolicy default",
        "spec.replacement.imageId: ami-0123456789abcdef0 not allowed",
        "spec.replacement.imageIds",
        "spec.replacement.bottlerocket.settings: settings bootstrap-containers.x.essential, bootstrap-containers.x.mode, bootstrap-containers.x.source",
        "spec.replacement.allowedSettings",
        "no node was cordoned",
    ] {
        assert!(message.contains(want), "{want:?} is not in {message:?}");
    }
    assert_untouched(&h, "evil", &node, &old).await;
    controller.shutdown().await;
}

/// `spec.replacement` cannot be edited once created (a CRD transition rule): the policy judged it then.
#[tokio::test]
async fn the_replacement_of_a_plan_cannot_be_changed_after_it_was_created() {
    let h = Harness::start().await;
    h.create_plan(
        "fixed",
        json!({"nodes": ["no-such-node"], "replacement": {"when": "after-drain", "instanceTypes": ["m6i.xlarge"]}}),
    )
    .await;
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    let e = plans
        .patch(
            "fixed",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replacement": {"imageId": "ami-0123456789abcdef0"}}})),
        )
        .await
        .expect_err("spec.replacement is immutable");
    assert!(
        e.to_string().contains("spec.replacement is immutable"),
        "{e}"
    );
}

/// A plan naming the `default` EC2NodeClass launches with the AMI, subnet, security groups and instance
/// profile Karpenter resolved for it (status), its tags and its user data merged under the cluster's
/// settings, records where each came from, and completes. Without nodeClassRef support the replacement
/// is launched as the replaced instance was (its AMI and profile differ from the class's).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_naming_an_ec2nodeclass_launches_what_karpenter_resolved_for_it() {
    let h = Harness::start().await;
    let api = classes(&h);
    api.patch(
        "default",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {
            "tags": {"team": "storage"},
            "userData": "[settings]\nmotd = \"governed by the platform team\"\n"
        }})),
    )
    .await
    .expect("the platform team edits its class");
    let resolved = api.get("default").await.expect("the class").data;
    // The class's newer AMI drifts every NodeClaim of the pool (karpenter-provider-aws
    // pkg/cloudprovider/drift.go `isAMIDrifted`). This test is about the plan's own launch: the pool's
    // budget allows no drift disruption (kubernetes-sigs/karpenter pkg/apis/v1/nodepool.go `Budget`
    // `reasons`) and snapdrain leaves the drift signals alone, so no other node moves meanwhile.
    let pools: Api<DynamicObject> = Api::all_with(
        h.client.clone(),
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool"),
            "nodepools",
        ),
    );
    for pool in pools
        .list(&Default::default())
        .await
        .expect("NodePools")
        .items
    {
        pools
            .patch(
                &pool.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"disruption": {"budgets": [
                    {"nodes": "0", "reasons": ["Drifted"]}, {"nodes": "10%"}
                ]}}})),
            )
            .await
            .expect("the pool's budget");
    }
    h.set_policy(json!({"signals": {"drift": "Ignore"}})).await;
    let mut amis = resolved["status"]["amis"].clone();
    amis[0]["id"] = json!(CLASS_AMI);
    // The newer release exists in EC2 (DescribeImages answers it; planning checks its architecture).
    h.cluster.ec2.as_ref().expect("ec2").register_image(
        snapdrain_sim::ec2::ImageConfig::bottlerocket(CLASS_AMI, "1.35", "x86_64", "1.43.0"),
    );
    api.patch_status(
        "default",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"amis": amis}})),
    )
    .await
    .expect("Karpenter resolves a newer AMI");
    let status = &resolved["status"];
    let ids = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x["id"].as_str().map(str::to_string))
            .collect()
    };
    let class_subnets = ids(&status["subnets"]);
    let class_groups = ids(&status["securityGroups"]);
    let class_profile = status["instanceProfile"]
        .as_str()
        .expect("a resolved profile")
        .to_string();
    assert!(!class_subnets.is_empty() && !class_groups.is_empty());

    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let old = instance_of(&h.node(&node).await.expect("the node"));
    h.create_plan(
        "by-class",
        json!({"nodes": [node], "replacement": {
            "when": "after-drain", "instanceTypes": ["m6i.xlarge"], "nodeClassRef": {"name": "default"}
        }}),
    )
    .await;
    let plan = h.wait_plan("by-class", TIMEOUT, |p| p.is_terminal()).await;
    let st = plan.status.clone().expect("a status");
    assert_eq!(st.phase, PlanPhase::Completed, "{st:#?}");
    let record = st.node_class.clone().expect("the class is recorded");
    assert_eq!(record.name, "default");
    assert_eq!(record.tags.get("team").map(String::as_str), Some("storage"));
    let join = st.nodes[0]
        .join
        .clone()
        .expect("the node's launch settings");
    assert_eq!(join.image_id.as_deref(), Some(CLASS_AMI));
    assert!(
        join.from
            .iter()
            .any(|f| f.starts_with("imageId: EC2NodeClass default status.amis")),
        "{:?}",
        join.from
    );

    let launched = h.instances_of("by-class");
    assert_eq!(launched.len(), 1, "{launched:?}");
    let sim = h.cluster.ec2.as_ref().expect("ec2");
    let cloud = snapdrain::cloud::ec2::Ec2Cloud::with_endpoint(
        &sim.endpoint(),
        &sim.config().region,
        Some(("test", "test")),
    )
    .await;
    let described = cloud
        .client()
        .describe_instances()
        .instance_ids(&launched[0])
        .send()
        .await
        .expect("DescribeInstances");
    let instance = described
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .next()
        .expect("the replacement");
    assert_eq!(instance.image_id(), Some(CLASS_AMI));
    assert!(
        class_subnets
            .iter()
            .any(|s| Some(s.as_str()) == instance.subnet_id()),
        "{:?} not in {class_subnets:?}",
        instance.subnet_id()
    );
    let groups: Vec<&str> = instance
        .security_groups()
        .iter()
        .filter_map(|g| g.group_id())
        .collect();
    assert_eq!(groups, class_groups);
    let profile = instance
        .iam_instance_profile()
        .and_then(|p| p.arn())
        .unwrap_or_default();
    assert!(
        profile.ends_with(&format!("/{class_profile}")),
        "{profile} is not {class_profile}"
    );
    let tags: Vec<(&str, &str)> = instance
        .tags()
        .iter()
        .filter_map(|t| Some((t.key()?, t.value()?)))
        .collect();
    assert!(tags.contains(&("team", "storage")), "{tags:?}");
    let user_data = cloud
        .client()
        .describe_instance_attribute()
        .instance_id(&launched[0])
        .attribute(aws_sdk_ec2::types::InstanceAttributeName::UserData)
        .send()
        .await
        .expect("DescribeInstanceAttribute userData");
    let text = user_data
        .user_data()
        .and_then(|u| u.value())
        .map(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b)
                .expect("base64")
        })
        .map(|b| String::from_utf8(b).expect("TOML text"))
        .expect("user data");
    // The class's setting, beside the cluster's (which snapdrain resolved and which win).
    assert!(
        text.contains("motd = \"governed by the platform team\""),
        "{text}"
    );
    assert!(text.contains("cluster-name = \"snapdrain-sim\""), "{text}");
    // The replaced instance ran another AMI: the class's was not a copy of it.
    assert_ne!(sim.instance(&old).expect("known").info.image_id, CLASS_AMI);
    controller.shutdown().await;
}

/// A class that does not exist, or that Karpenter could not resolve (Ready False), fails the plan while
/// planning, naming the class and what to do; the node is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_or_unready_ec2nodeclass_fails_the_plan_while_planning() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let old = instance_of(&h.node(&node).await.expect("the node"));
    let spec = |class: &str| {
        json!({"nodes": [node], "replacement": {
            "when": "after-drain", "instanceTypes": ["m6i.xlarge"], "nodeClassRef": {"name": class}
        }})
    };
    h.create_plan("no-class", spec("no-such-class")).await;
    let plan = h.wait_plan("no-class", TIMEOUT, |p| p.is_terminal()).await;
    let st = plan.status.expect("a status");
    assert_eq!(st.phase, PlanPhase::Failed, "{st:#?}");
    let message = st.message.unwrap_or_default();
    assert!(
        message
            .contains("EC2NodeClass no-such-class (spec.replacement.nodeClassRef) does not exist"),
        "{message}"
    );
    assert_untouched(&h, "no-class", &node, &old).await;

    let now = "2026-01-01T00:00:00Z";
    classes(&h)
        .patch_status(
            "default",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [
                {"type": "Ready", "status": "False", "reason": "UnhealthyDependents", "message": "SubnetsReady=False", "lastTransitionTime": now},
                {"type": "SubnetsReady", "status": "False", "reason": "SubnetsNotFound", "message": "SubnetSelector did not match any Subnets", "lastTransitionTime": now}
            ]}})),
        )
        .await
        .expect("Karpenter marks the class not Ready");
    h.create_plan("unready-class", spec("default")).await;
    let plan = h
        .wait_plan("unready-class", TIMEOUT, |p| p.is_terminal())
        .await;
    let st = plan.status.expect("a status");
    assert_eq!(st.phase, PlanPhase::Failed, "{st:#?}");
    let message = st.message.unwrap_or_default();
    for want in [
        "EC2NodeClass default is not Ready",
        "SubnetsReady SubnetsNotFound",
        "no node was cordoned",
    ] {
        assert!(message.contains(want), "{want:?} is not in {message:?}");
    }
    assert_untouched(&h, "unready-class", &node, &old).await;
    controller.shutdown().await;
}

/// A selector plan matching more nodes than the policy's `maxNodesPerPlan` is refused while Pending:
/// no node is cordoned, no pod evicted, no Backup made. Without the cap it drains all six nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_selecting_more_nodes_than_max_nodes_per_plan_is_refused() {
    let h = Harness::start().await;
    h.set_policy(json!({"maxNodesPerPlan": 2})).await;
    let controller = h.controller().await;
    let nodes: Vec<(String, String)> = {
        let all = Api::<k8s_openapi::api::core::v1::Node>::all(h.client.clone())
            .list(&Default::default())
            .await
            .expect("list nodes");
        all.items
            .iter()
            .map(|n| (kube::ResourceExt::name_any(n), instance_of(n)))
            .collect()
    };
    assert!(nodes.len() > 2, "{nodes:?}");
    h.create_plan(
        "too-wide",
        json!({"nodeSelector": {"matchLabels": {"karpenter.sh/nodepool": "default"}}}),
    )
    .await;
    let plan = h.wait_plan("too-wide", TIMEOUT, |p| p.is_terminal()).await;
    let (status, reason, message) = valid_condition(&plan);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "RefusedByPolicy")
    );
    let want = format!(
        "spec.nodeSelector: matches {} nodes; the DisruptionPolicy default allows at most 2 per plan: split the plan, or raise the policy's spec.maxNodesPerPlan",
        nodes.len()
    );
    assert!(message.contains(&want), "{want:?} is not in {message:?}");
    for (node, instance) in &nodes {
        assert_untouched(&h, "too-wide", node, instance).await;
    }
    controller.shutdown().await;
}

/// `snapdrain plan NODE` (the dry run) judges the spec by the DisruptionPolicy as a real plan is judged:
/// a free-form AMI under the default policy shows the refusal, naming the field and the policy field
/// that would allow it, and nothing of the plan; once the policy allows that AMI, the preview shows the
/// backups. Without the check the preview showed backups and evictions for a plan that cannot run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_plan_preview_shows_the_policys_refusal() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    let spec: snapdrain::api::DisruptionPlanSpec = serde_json::from_value(json!({
        "nodes": [node], "replacement": {
            "when": "before-drain", "instanceTypes": ["m6i.xlarge"], "imageId": "ami-0123456789abcdef0"}
    }))
    .expect("a spec");
    let writes_before = h.audit().len();
    let text = snapdrain::controller::preview::describe(&h.client, &node, &spec)
        .await
        .expect("a preview");
    for want in [
        "Refused:",
        "refused by DisruptionPolicy default",
        "spec.replacement.imageId: ami-0123456789abcdef0 not allowed",
        "spec.replacement.imageIds",
    ] {
        assert!(text.contains(want), "{want:?} is not in {text}");
    }
    assert!(!text.contains("Backups first"), "{text}");
    assert_eq!(h.audit().len(), writes_before, "a preview writes nothing");

    h.set_policy(json!({"replacement": {"allowFreeForm": true,
        "imageIds": ["ami-0123456789abcdef0"], "instanceTypes": ["m6i.xlarge"]}}))
        .await;
    let text = snapdrain::controller::preview::describe(&h.client, &node, &spec)
        .await
        .expect("a preview");
    assert!(!text.contains("Refused:"), "{text}");
    assert!(text.contains("namespace shop: StatefulSets"), "{text}");
}

/// The review's second exploit: a plan editor drains without a backup (`backup.policy: skip`), evicts
/// what no controller owns and overrides tenants' do-not-disrupt (`drain.force`) and kills pods without
/// their shutdown (`gracePeriodSeconds: 0`). Under the default policy such a plan is refused while
/// Pending, naming each field and the policy switch that would allow it; nothing is touched. Without
/// the check the plan drains and terminates the node with no Backup.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn skip_force_and_a_zero_grace_period_are_refused_before_any_node_is_touched() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let old = instance_of(&h.node(&node).await.expect("the node"));
    h.create_plan(
        "no-backup",
        json!({"nodes": [node], "backup": {"policy": "skip"},
               "drain": {"force": true, "gracePeriodSeconds": 0}}),
    )
    .await;
    let plan = h.wait_plan("no-backup", TIMEOUT, |p| p.is_terminal()).await;
    let (status, reason, message) = valid_condition(&plan);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "RefusedByPolicy")
    );
    for want in [
        "spec.backup.policy: skip lets protected pods go with no backup",
        "spec.planSettings.allowBackupSkip",
        "spec.drain.force: true evicts pods no controller owns",
        "spec.planSettings.allowForce",
        "spec.drain.gracePeriodSeconds: 0 kills pods without their shutdown",
        "spec.planSettings.allowZeroGracePeriod",
        "no node was cordoned",
    ] {
        assert!(message.contains(want), "{want:?} is not in {message:?}");
    }
    assert_untouched(&h, "no-backup", &node, &old).await;
    controller.shutdown().await;
}

/// An Execute plan selecting the node that runs snapdrain's own controller pod is refused while
/// Pending, naming the pod and how to move it; the node is untouched. Without the check the plan would
/// drain the leader driving it and the eviction gate with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_execute_plan_on_the_controllers_own_node_is_refused_naming_its_pod() {
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use kube::api::PostParams;
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    let old = instance_of(&h.node(&node).await.expect("the node"));
    let namespaces: Api<Namespace> = Api::all(h.client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": "snapdrain"}})).expect("namespace");
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create namespace snapdrain: {e}"),
    }
    // The harness's controller runs as identity snapdrain-0 in namespace snapdrain, as the chart's pod
    // does with POD_NAME and POD_NAMESPACE; a standby replica shares its labels.
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "snapdrain");
    for name in ["snapdrain-0", "snapdrain-1"] {
        let pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "snapdrain",
                         "labels": {"app.kubernetes.io/name": "snapdrain", "app.kubernetes.io/instance": "snapdrain"}},
            "spec": {"nodeName": node, "containers": [{"name": "controller", "image": "snapdrain:test"}]}
        }))
        .expect("pod JSON");
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("the controller's pod");
    }
    // Started after the pods exist: the plan is judged on caches whose first list holds them.
    let controller = h.controller().await;
    h.create_plan("own-node", json!({"nodes": [node]})).await;
    let plan = h.wait_plan("own-node", TIMEOUT, |p| p.is_terminal()).await;
    let (status, reason, message) = valid_condition(&plan);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "RefusedByPolicy")
    );
    for want in [
        format!(
            "spec.nodes: selects the node of snapdrain's own controller pod snapdrain/snapdrain-0 on {node}, snapdrain/snapdrain-1 on {node}"
        ),
        "cordon the node and delete that pod".to_string(),
        "no node was cordoned".to_string(),
    ] {
        assert!(message.contains(&want), "{want:?} is not in {message:?}");
    }
    assert_untouched(&h, "own-node", &node, &old).await;
    controller.shutdown().await;
}
