//! End to end: the snapdrain controller drives DisruptionPlans against the simulated cluster over HTTP,
//! with Velero writing to the S3 endpoint and EC2 reached through aws-sdk-ec2.

use std::time::Duration;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use snapdrain::api::status::PlanPhase;
use snapdrain::controller::run::RunOptions;
use snapdrain_sim::apiserver::faults::FaultRule;
use snapdrain_sim::world::velero::VeleroFault;
use snapdrain_testkit::harness::{
    Harness, TIMEOUT, assert_no_eviction_before_verified_backup, fast_timings, replacing_spec,
};

fn latency(verb: &str, resource: &str, ms: u64) -> FaultRule {
    FaultRule {
        verb: Some(verb.into()),
        resource: Some(resource.into()),
        latency_ms: ms,
        ..FaultRule::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plan_backs_up_verifies_drains_terminates_and_replaces() {
    let h = Harness::start().await;
    // The platform team lets plans set this label, this taint and the inotify sysctls (FluentBit's).
    h.set_policy(json!({"replacement": {"allowedSettings": [
        "kubernetes.node-labels.example.com/pool",
        "kubernetes.node-taints.example.com/dedicated",
        "kernel.sysctl.fs.inotify"
    ]}}))
    .await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    assert!(!protected.is_empty());
    h.create_plan(
        "replace-one",
        json!({
            "nodes": [node],
            "replacement": {
                "when": "after-drain",
                "instanceTypes": ["m6i.xlarge"],
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
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &plan);
    for pod in protected.keys() {
        assert!(
            h.accepted_evictions().iter().any(|(p, _)| p == pod),
            "protected pod {pod} was never evicted"
        );
    }
    // The API server's audit names snapdrain as the evictor (kube-rs sends no User-Agent of its own).
    let by_snapdrain = snapdrain_testkit::safety::accepted_evictions(&h.audit())
        .into_iter()
        .filter(|e| protected.contains_key(&e.pod))
        .all(|e| e.user_agent.as_deref() == Some(snapdrain::controller::run::USER_AGENT));
    assert!(
        by_snapdrain,
        "every eviction made with snapdrain's User-Agent"
    );
    assert!(h.node(&node).await.is_none(), "the drained node is gone");
    let old_instance = status.nodes[0]
        .instance_id
        .clone()
        .expect("instance id from the providerID");
    let state = h
        .cluster
        .ec2
        .as_ref()
        .unwrap()
        .instance(&old_instance)
        .expect("instance known to EC2")
        .state;
    assert!(
        matches!(
            state,
            snapdrain_sim::ec2::InstanceState::ShuttingDown
                | snapdrain_sim::ec2::InstanceState::Terminated
        ),
        "the node's instance is terminated: {state:?}"
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_backup_fails_the_plan_and_evicts_nothing() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    h.cluster
        .velero
        .as_ref()
        .unwrap()
        .inject(VeleroFault::FailAllBackups {
            reason: "injected: node-agent crashed".into(),
        });
    let node = h.node_with_statefulset_pods().await;
    let mut spec = replacing_spec(&node);
    spec["backup"] = json!({"maxAttempts": 2});
    h.create_plan("backup-fails", spec).await;
    let plan = h
        .wait_plan("backup-fails", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.unwrap();
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("failed after 2 attempts") && message.contains("node left in service"),
        "{message}"
    );
    assert_eq!(
        h.backups_of("backup-fails").await.len(),
        2,
        "one Backup per attempt"
    );
    assert!(
        h.accepted_evictions().is_empty(),
        "nothing may be evicted: {:?}",
        h.accepted_evictions()
    );
    let n = h.node(&node).await.expect("node still there");
    assert_ne!(
        n.spec.and_then(|s| s.unschedulable),
        Some(true),
        "the node is left schedulable"
    );
    assert!(
        h.instances_of("backup-fails").is_empty(),
        "no replacement launched"
    );
    controller.shutdown().await;
}

/// Tampers with the bucket between Velero's completion and snapdrain's verification (the controller's
/// BackupStorageLocation read is slowed so the tampering lands first), and expects the named key.
async fn verification_fails_with(tamper: &str) -> String {
    let h = Harness::start().await;
    h.cluster
        .faults
        .add(latency("get", "backupstoragelocations.velero.io", 1500));
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let mut spec = replacing_spec(&node);
    spec["backup"] = json!({"maxAttempts": 1});
    let plan_name = format!("verify-{tamper}");
    h.create_plan(&plan_name, spec).await;
    let backup = h.wait_backup_phase(&plan_name, "Completed").await;
    let s3 = h.cluster.s3.as_ref().unwrap();
    let dir = format!("cluster-a/backups/{backup}");
    match tamper {
        "missing" => s3
            .delete_object("velero", &format!("{dir}/{backup}.tar.gz"))
            .await
            .unwrap(),
        _ => {
            let client = s3.client();
            let obj = client
                .get_object()
                .bucket("velero")
                .key(format!("{dir}/velero-backup.json"))
                .send()
                .await
                .unwrap();
            let mut json: serde_json::Value =
                serde_json::from_slice(&obj.body.collect().await.unwrap().into_bytes()).unwrap();
            json["metadata"]["uid"] = json!("00000000-0000-0000-0000-000000000000");
            s3.overwrite_object(
                "velero",
                &format!("{dir}/velero-backup.json"),
                serde_json::to_vec(&json).unwrap(),
            )
            .await
            .unwrap();
        }
    }
    let plan = h.wait_plan(&plan_name, TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.unwrap();
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    assert!(
        h.accepted_evictions().is_empty(),
        "nothing may be evicted after a failed verification"
    );
    controller.shutdown().await;
    status.message.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_bucket_object_fails_verification_naming_the_key() {
    let message = verification_fails_with("missing").await;
    assert!(
        message.contains(".tar.gz is missing from the bucket")
            && message.contains("cluster-a/backups/"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uid_mismatch_in_the_bucket_fails_verification_naming_the_key() {
    let message = verification_fails_with("uid").await;
    assert!(
        message.contains("velero-backup.json")
            && message.contains("bucket has uid 00000000-0000-0000-0000-000000000000"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pdb_blocks_eviction_until_it_allows() {
    let h = Harness::start().await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(h.client.clone(), "shop");
    let pdb = pdbs
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| p.name_any().contains("postgres"))
        .expect("postgres PDB");
    let set_max_unavailable = |n: i32| {
        let pdbs = pdbs.clone();
        let name = pdb.name_any();
        async move {
            pdbs.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"maxUnavailable": n}})),
            )
            .await
            .unwrap();
        }
    };
    set_max_unavailable(0).await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan("pdb-blocked", json!({"nodes": [node]})).await;
    let blocked = h
        .wait_plan("pdb-blocked", TIMEOUT, |p| {
            p == PlanPhase::Draining || p.is_terminal()
        })
        .await;
    assert_eq!(blocked.status.as_ref().unwrap().phase, PlanPhase::Draining);
    // Wait until the block is reported, then lift it.
    let plans: Api<snapdrain::api::DisruptionPlan> = Api::all(h.client.clone());
    let cond = |p: Option<&snapdrain::api::DisruptionPlan>| {
        p.and_then(|p| p.status.as_ref()).is_some_and(|s| {
            s.nodes.iter().any(|n| {
                n.blocked_by
                    .as_deref()
                    .is_some_and(|b| b.contains("disruption budget"))
            })
        })
    };
    tokio::time::timeout(
        TIMEOUT,
        kube::runtime::wait::await_condition(plans, "pdb-blocked", cond),
    )
    .await
    .expect("block reported")
    .unwrap();
    set_max_unavailable(1).await;
    let plan = h
        .wait_plan("pdb-blocked", TIMEOUT, |p| p.is_terminal())
        .await;
    assert_eq!(
        plan.status.as_ref().unwrap().phase,
        PlanPhase::Completed,
        "{:#?}",
        plan.status
    );
    let metrics = controller.metrics.render();
    assert!(
        metrics.contains("snapdrain_evictions_total{code=\"429\"}"),
        "429s are counted: {metrics}"
    );
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalid_spec_is_marked_invalid_once_and_never_hot_loops() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    // The CRD schema (`minimum: 1`) makes the API server refuse this plan, as a real one does; the
    // controller still meets such a plan when it was stored before the constraint existed, which is
    // how it is stored here.
    let invalid = json!({"apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
        "metadata": {"name": "invalid"},
        "spec": {"nodes": [node], "drain": {"maxConcurrentEvictions": 0}}});
    let refused = Api::<snapdrain::api::DisruptionPlan>::all(h.client.clone())
        .create(
            &Default::default(),
            &serde_json::from_value(invalid.clone()).expect("plan JSON"),
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422),
        "{refused:?}"
    );
    h.cluster
        .store
        .create(
            &snapdrain_sim::apiserver::resources::ResKey::new("snapdrain.io", "disruptionplans"),
            None,
            invalid,
            snapdrain_sim::apiserver::store::WriteOptions {
                dry_run: false,
                internal: true,
            },
        )
        .expect("store the plan as it was before the schema's minimum");
    let plan = h.wait_plan("invalid", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.unwrap();
    assert_eq!(status.phase, PlanPhase::Failed);
    let valid = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Valid")
        .expect("Valid condition");
    assert_eq!(valid.status, "False");
    assert!(
        valid.message.contains("maxConcurrentEvictions"),
        "{}",
        valid.message
    );
    // The audit entry can trail the watch event that showed the plan Failed: wait for it, then count.
    snapdrain_testkit::eventually(
        "the invalid plan's status write in the audit log",
        || async { (h.status_writes("invalid") >= 1).then_some(()) },
    )
    .await;
    assert_eq!(h.status_writes("invalid"), 1);
    // While another plan runs to completion (plenty of controller activity), the invalid one is left alone.
    h.create_plan("valid", json!({"nodes": [node]})).await;
    h.wait_plan("valid", TIMEOUT, |p| p.is_terminal()).await;
    assert_eq!(
        h.status_writes("invalid"),
        1,
        "an invalid plan is written once, not retried"
    );
    assert!(
        h.backups_of("invalid").await.is_empty(),
        "an invalid plan takes no backup"
    );
    assert!(h.accepted_evictions().iter().all(|(_, t)| !t.is_empty()));
    controller.shutdown().await;
}

/// Kills the controller while `phase` is in progress (that step slowed by an injected API latency or a
/// slow world), starts a new one, and expects completion with no second Backup and no second instance.
async fn crash_during(phase: PlanPhase) {
    let mut timings = fast_timings();
    let h = match phase {
        PlanPhase::BackingUp => {
            timings.backup_overhead = Duration::from_millis(1500);
            Harness::start_with(timings).await
        }
        PlanPhase::Replacing => {
            timings.instance_boot = Duration::from_millis(1500);
            Harness::start_with(timings).await
        }
        _ => Harness::start().await,
    };
    let slow = match phase {
        PlanPhase::Verifying => Some(latency("get", "backupstoragelocations.velero.io", 1500)),
        PlanPhase::Cordoning => Some(latency("patch", "nodes", 1500)),
        PlanPhase::Draining => Some(latency("create", "pods/eviction", 1500)),
        PlanPhase::Terminating => Some(latency("delete", "nodeclaims.karpenter.sh", 1500)),
        _ => None,
    };
    if let Some(rule) = slow {
        h.cluster.faults.add(rule);
    }
    let first = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    let name = format!("crash-{}", phase.as_str().to_lowercase());
    h.create_plan(&name, replacing_spec(&node)).await;
    h.wait_plan(&name, TIMEOUT, |p| p == phase).await;
    // The pass that wrote this phase goes on into the step's slow call: crash it there.
    first.kill();
    // The crash must land inside the step, or this test would prove nothing about resuming it.
    let plans: Api<snapdrain::api::DisruptionPlan> = Api::all(h.client.clone());
    let at_kill = plans.get(&name).await.unwrap().status.unwrap().phase;
    assert_eq!(
        at_kill, phase,
        "the controller was killed while {phase} was in progress"
    );
    h.cluster.faults.set(Vec::new());
    let second = h.controller().await;
    let plan = h.wait_plan(&name, TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.clone().unwrap();
    assert_eq!(
        status.phase,
        PlanPhase::Completed,
        "after a crash in {phase}: {status:#?}"
    );
    assert_eq!(
        h.backups_of(&name).await.len(),
        1,
        "one Backup, not one per controller"
    );
    assert_eq!(
        h.instances_of(&name).len(),
        1,
        "one replacement instance, not one per controller"
    );
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &plan);
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_while_backing_up_resumes_without_a_second_backup() {
    crash_during(PlanPhase::BackingUp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_while_verifying_resumes() {
    crash_during(PlanPhase::Verifying).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_while_cordoning_resumes() {
    crash_during(PlanPhase::Cordoning).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_while_draining_resumes() {
    crash_during(PlanPhase::Draining).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_while_terminating_resumes() {
    crash_during(PlanPhase::Terminating).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_while_replacing_resumes_without_a_second_instance() {
    crash_during(PlanPhase::Replacing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_lease_holder_acts() {
    let h = Harness::start().await;
    let opts = RunOptions {
        lease_namespace: Some("default".into()),
        lease_seconds: 2,
        ..RunOptions::default()
    };
    let a = h.controller_with(opts.clone(), "replica-a").await;
    let b = h.controller_with(opts.clone(), "replica-b").await;
    let (mut la, mut lb) = (a.leading.clone(), b.leading.clone());
    let one_leads = async {
        loop {
            if *la.borrow() != *lb.borrow() {
                return;
            }
            tokio::select! { _ = la.changed() => {}, _ = lb.changed() => {} }
        }
    };
    tokio::time::timeout(TIMEOUT, one_leads)
        .await
        .expect("one replica takes the Lease");
    let (leader, standby) = if *a.leading.borrow() { (a, b) } else { (b, a) };
    let node = h.node_with_statefulset_pods().await;
    h.create_plan("leased", json!({"nodes": [node]})).await;
    let plan = h.wait_plan("leased", TIMEOUT, |p| p.is_terminal()).await;
    assert_eq!(plan.status.unwrap().phase, PlanPhase::Completed);
    assert!(
        leader
            .metrics
            .render()
            .contains("snapdrain_step_duration_seconds_count"),
        "the leader did the work"
    );
    assert!(
        !standby
            .metrics
            .render()
            .contains("snapdrain_step_duration_seconds_count"),
        "the standby did nothing"
    );
    assert!(!*standby.leading.borrow());
    // When the leader dies, the standby takes over once the Lease expires, and acts.
    leader.kill();
    let mut ls = standby.leading.clone();
    tokio::time::timeout(TIMEOUT, ls.wait_for(|l| *l))
        .await
        .expect("standby takes over")
        .unwrap();
    let other = h.node_with_statefulset_pods().await;
    h.create_plan("after-failover", json!({"nodes": [other]}))
        .await;
    let plan = h
        .wait_plan("after-failover", TIMEOUT, |p| p.is_terminal())
        .await;
    assert_eq!(plan.status.unwrap().phase, PlanPhase::Completed);
    standby.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_a_plan_mid_drain_uncordons_the_node_before_it_goes() {
    let h = Harness::start().await;
    h.block_postgres_evictions().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan("deleted-mid-drain", json!({"nodes": [node]}))
        .await;
    let plan = h.wait_phase("deleted-mid-drain", PlanPhase::Draining).await;
    assert!(
        plan.finalizers()
            .iter()
            .any(|f| f == "snapdrain.io/rollback"),
        "{:?}",
        plan.finalizers()
    );
    assert_eq!(
        h.node(&node).await.unwrap().spec.unwrap().unschedulable,
        Some(true),
        "cordoned while draining"
    );
    let plans: Api<snapdrain::api::DisruptionPlan> = Api::all(h.client.clone());
    let uid = plan.uid().unwrap();
    plans
        .delete("deleted-mid-drain", &Default::default())
        .await
        .unwrap();
    tokio::time::timeout(
        TIMEOUT,
        kube::runtime::wait::await_condition(
            plans,
            "deleted-mid-drain",
            kube::runtime::wait::conditions::is_deleted(&uid),
        ),
    )
    .await
    .expect("the plan goes once rolled back")
    .unwrap();
    let n = h.node(&node).await.expect("the node stays");
    assert_ne!(
        n.spec.and_then(|s| s.unschedulable),
        Some(true),
        "the node is uncordoned"
    );
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plan_preview_shows_backups_and_eviction_order_without_changing_anything() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    let spec: snapdrain::api::DisruptionPlanSpec =
        serde_json::from_value(json!({"nodes": [node]})).unwrap();
    let writes_before = h.audit().len();
    let text = snapdrain::controller::preview::describe(&h.client, &node, &spec)
        .await
        .unwrap();
    assert!(text.contains(&format!("Node {node}")), "{text}");
    assert!(text.contains("namespace shop: StatefulSets"), "{text}");
    for pod in protected.keys() {
        assert!(
            text.lines()
                .any(|l| l.contains(pod.as_str()) && l.contains("protected")),
            "{pod} listed as protected:\n{text}"
        );
    }
    assert!(text.contains("DaemonSet (ignoreDaemonSets)"), "{text}");
    assert_eq!(h.audit().len(), writes_before, "a preview writes nothing");
    assert_ne!(
        h.node(&node)
            .await
            .unwrap()
            .spec
            .and_then(|s| s.unschedulable),
        Some(true)
    );
    let missing = snapdrain::controller::preview::describe(&h.client, "no-such-node", &spec)
        .await
        .unwrap_err();
    assert!(
        missing
            .to_string()
            .contains("node no-such-node does not exist"),
        "{missing}"
    );
}
