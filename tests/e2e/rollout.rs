//! A Karpenter drift rollout of 20 nodes (`drift-rollout`), without and with snapdrain. Without it, the
//! simulated Karpenter evicts StatefulSet pods with no backup (the scenario is meaningful); with it, every
//! drifted node is still replaced and no protected pod is evicted before a verified backup covering its
//! PVCs. Karpenter's own rules: research/karpenter.md (drift is graceful: nodes with a
//! `karpenter.sh/do-not-disrupt` pod are skipped, kubernetes-sigs/karpenter
//! `pkg/controllers/disruption/types.go`; budgets `pkg/apis/v1/nodepool.go`). With a NodePool
//! terminationGracePeriod drift is eventual: pod holds and PDBs do not stop it (`NewCandidate`), only the
//! Node's own do-not-disrupt does (`pkg/controllers/state/statenode.go` `ValidateNodeDisruptable`), and
//! the drained pods are DELETEd at `terminationTime − grace` (`terminator/eviction.go` `forceDelete`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use snapdrain::api::DisruptionPlan;
use snapdrain_testkit::harness::Harness;
use snapdrain_testkit::safety;

const ROLLOUT: Duration = Duration::from_secs(300);

/// The drift-rollout scenario without its timeline: the test marks the nodes drifted itself, once
/// snapdrain (if any) is holding the pods.
async fn start() -> Harness {
    Harness::start_scenario("drift-rollout", |s| s.timeline.clear()).await
}

/// Marks every NodeClaim drifted (a new AMI); returns the nodes there were before.
async fn drift_all(h: &Harness) -> BTreeSet<String> {
    let nodes: BTreeSet<String> = Api::<Node>::all(h.client.clone())
        .list(&Default::default())
        .await
        .expect("list nodes")
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    snapdrain_testkit::karpenter::mark_all_drifted(&h.client)
        .await
        .expect("mark the NodeClaims drifted");
    nodes
}

async fn protected_pods(h: &Harness) -> BTreeMap<String, BTreeSet<String>> {
    let pods: Vec<Value> = Api::<Pod>::all(h.client.clone())
        .list(&Default::default())
        .await
        .expect("list pods")
        .items
        .iter()
        .map(|p| serde_json::to_value(p).expect("a pod serializes"))
        .collect();
    safety::protected_pods(&pods)
}

/// Waits until snapdrain holds every protected pod, and the Node under each.
async fn wait_held(h: &Harness, protected: &BTreeMap<String, BTreeSet<String>>) {
    let pods: Api<Pod> = Api::all(h.client.clone());
    let held = h
        .wait_all(pods, "every protected pod held", |ps| {
            let held: Vec<&Pod> = ps
                .iter()
                .filter(|p| {
                    let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
                    protected.contains_key(&key)
                })
                .collect();
            held.len() == protected.len()
                && held.iter().all(|p| {
                    p.annotations()
                        .get("karpenter.sh/do-not-disrupt")
                        .map(String::as_str)
                        == Some("true")
                })
        })
        .await;
    let under: BTreeSet<String> = held
        .iter()
        .filter(|p| {
            protected.contains_key(&format!(
                "{}/{}",
                p.namespace().unwrap_or_default(),
                p.name_any()
            ))
        })
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    h.wait_all(
        Api::<Node>::all(h.client.clone()),
        "every node under a protected pod held",
        |ns| {
            ns.iter()
                .filter(|n| under.contains(&n.name_any()))
                .all(|n| {
                    n.annotations().get("snapdrain.io/held").map(String::as_str)
                        == Some("do-not-disrupt")
                })
        },
    )
    .await;
}

async fn wait_replaced(h: &Harness, old: &BTreeSet<String>) {
    h.wait_all_within(
        Api::<Node>::all(h.client.clone()),
        "every drifted node replaced",
        ROLLOUT,
        |ns| !ns.iter().any(|n| old.contains(&n.name_any())),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drift_rollout_without_snapdrain_evicts_stateful_pods_without_a_backup() {
    let h = start().await;
    let protected = protected_pods(&h).await;
    assert_eq!(
        protected.len(),
        9,
        "postgres, mongodb and elasticsearch pods with volumes: {protected:?}"
    );
    let started = Instant::now();
    let old = drift_all(&h).await;
    wait_replaced(&h, &old).await;
    tracing::info!(
        seconds = started.elapsed().as_secs_f64(),
        "drift rollout, Karpenter alone"
    );
    let violations =
        safety::eviction_violations(&safety::accepted_evictions(&h.audit()), &protected, &[]);
    assert!(
        !violations.is_empty(),
        "Karpenter alone evicted no protected pod: the scenario would prove nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drift_rollout_guarded_by_snapdrain_backs_up_before_every_eviction() {
    let h = start().await;
    let protected = protected_pods(&h).await;
    let _controller = h.controller().await;
    wait_held(&h, &protected).await;
    let started = Instant::now();
    let old = drift_all(&h).await;
    wait_replaced(&h, &old).await;
    tracing::info!(
        seconds = started.elapsed().as_secs_f64(),
        "drift rollout guarded by snapdrain"
    );
    let plans: Vec<DisruptionPlan> = Api::<DisruptionPlan>::all(h.client.clone())
        .list(&Default::default())
        .await
        .expect("list plans")
        .items;
    assert!(
        !plans.is_empty(),
        "drifted nodes with protected pods got plans"
    );
    let evictions = safety::accepted_evictions(&h.audit());
    let protected_evicted = evictions
        .iter()
        .filter(|e| protected.contains_key(&e.pod))
        .count();
    assert!(
        protected_evicted > 0,
        "Karpenter did move the stateful pods"
    );
    assert_promise_kept(&h, &protected).await;
}

/// Production NodePools set a terminationGracePeriod; then drift ignores the pods' holds and PDBs, and
/// Karpenter DELETEs the drained pods at once (30 s pod grace, 30 s TGP). Only the node-level hold keeps
/// each node until its Release plan has a verified backup.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drift_rollout_with_a_termination_grace_period_moves_no_protected_pod_before_its_backup()
{
    let h = Harness::start_scenario("drift-rollout", |s| {
        s.timeline.clear();
        for pool in &mut s.node_pools {
            pool.termination_grace_period = Some("30s".into());
        }
        // Velero runs one backup at a time (`--concurrent-backups` 1); at 3 s each the last of the
        // nine is verified long after Karpenter could have replaced every node (2 s boots, 4 at once).
        if let Some(t) = s.timings.as_mut() {
            t.backup_overhead = Duration::from_secs(3);
        }
    })
    .await;
    let protected = protected_pods(&h).await;
    assert_eq!(protected.len(), 9, "{protected:?}");
    let _controller = h.controller().await;
    wait_held(&h, &protected).await;
    let started = Instant::now();
    let old = drift_all(&h).await;
    wait_replaced(&h, &old).await;
    tracing::info!(
        seconds = started.elapsed().as_secs_f64(),
        "drift rollout with a terminationGracePeriod, guarded by snapdrain"
    );
    // Karpenter force-deleted the protected pods (their grace reaches back to the NodeClaim's deletion).
    let deleted = safety::accepted_deletions(&h.audit())
        .iter()
        .filter(|e| protected.contains_key(&e.pod))
        .count();
    assert!(deleted > 0, "Karpenter did DELETE protected pods");
    assert_promise_kept(&h, &protected).await;
}

/// A new Bottlerocket release behind the pool's `bottlerocket@latest` alias: Karpenter resolves the
/// EC2NodeClass's `status.amis` to the new AMI (here written as its nodeclass controller would), its
/// drift controller marks every NodeClaim on the old AMI `Drifted` (reason `AMIDrift`:
/// karpenter-provider-aws `pkg/cloudprovider/drift.go` `isAMIDrifted`, core
/// `pkg/controllers/nodeclaim/disruption/drift.go`), and its disruption controller replaces them with
/// NodeClaims launched on the new AMI (`pkg/providers/amifamily/ami.go` `MapToInstanceTypes`). No test
/// marks anything drifted: snapdrain sees the drift as Karpenter shows it and backs up every protected
/// pod before Karpenter evicts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_ami_drifts_every_node_and_snapdrain_backs_up_before_karpenter_drains_them() {
    const NEW_AMI: &str = "ami-0bottlerocket1351";
    let h = start().await;
    let protected = protected_pods(&h).await;
    let _controller = h.controller().await;
    wait_held(&h, &protected).await;
    let old: BTreeSet<String> = Api::<Node>::all(h.client.clone())
        .list(&Default::default())
        .await
        .expect("list nodes")
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    let ec2 = h.cluster.ec2.as_ref().expect("ec2");
    ec2.register_image(snapdrain_sim::ec2::ImageConfig::bottlerocket(
        NEW_AMI, "1.35", "x86_64", "1.43.0",
    ));
    let classes: Api<DynamicObject> = Api::all_with(
        h.client.clone(),
        &snapdrain::api::karpenter::ec2nodeclass_resource(),
    );
    let before = classes.get("default").await.expect("the class").data;
    let old_ami = before["status"]["amis"][0]["id"]
        .as_str()
        .expect("a resolved AMI")
        .to_string();
    classes
        .patch_status(
            "default",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"amis": [{
                "id": NEW_AMI, "name": "bottlerocket-aws-k8s-1.35-x86_64-v1.43.0",
                "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]
            }]}})),
        )
        .await
        .expect("Karpenter resolves the new release");
    wait_replaced(&h, &old).await;

    let audit = h.audit();
    let drifted: BTreeSet<&str> = audit
        .iter()
        .filter(|e| e.verb == "nodeclaim-drifted")
        .filter_map(|e| e.name.as_deref())
        .collect();
    assert_eq!(
        drifted.len(),
        old.len(),
        "every old NodeClaim drifted: {drifted:?}"
    );
    let claims = snapdrain_testkit::karpenter::nodeclaims(&h.client)
        .list(&Default::default())
        .await
        .expect("list NodeClaims")
        .items;
    assert!(!claims.is_empty());
    for c in &claims {
        assert_eq!(
            c.data["status"]["imageID"].as_str(),
            Some(NEW_AMI),
            "NodeClaim {} runs the new AMI",
            c.name_any()
        );
        let id = c.data["status"]["providerID"]
            .as_str()
            .and_then(|p| p.rsplit('/').next())
            .expect("a providerID");
        assert_eq!(ec2.instance(id).expect("launched").info.image_id, NEW_AMI);
        assert_ne!(old_ami, NEW_AMI);
    }

    assert!(
        safety::accepted_evictions(&audit)
            .iter()
            .any(|e| protected.contains_key(&e.pod)),
        "Karpenter did move the stateful pods"
    );
    assert_promise_kept(&h, &protected).await;
}

/// The promise, judged from the outside by the safety oracle: every eviction or DELETE of a protected
/// pod the API server accepted came after a verified backup that one of the cluster's plans records.
async fn assert_promise_kept(h: &Harness, protected: &BTreeMap<String, BTreeSet<String>>) {
    let plans: Vec<DisruptionPlan> = Api::<DisruptionPlan>::all(h.client.clone())
        .list(&Default::default())
        .await
        .expect("list plans")
        .items;
    let backups: Vec<safety::RecordedBackup> = plans
        .iter()
        .flat_map(|p| safety::recorded_backups(&serde_json::to_value(p).expect("serializes")))
        .collect();
    let violations =
        safety::eviction_violations(&safety::pods_removed(&h.audit()), protected, &backups);
    assert!(
        violations.is_empty(),
        "the promise was broken:\n{}",
        violations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
}
