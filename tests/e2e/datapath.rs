//! Velero 1.17+'s data path under Karpenter's forceful termination, with the eviction gate installed as
//! the chart installs it. Upstream behaviour the simulator models and these tests rely on:
//! - a file-system backup moves each volume in a hosting pod per PodVolumeBackup, pinned to the source
//!   node, grace 0, tolerating no Karpenter taint and carrying no `do-not-disrupt` (vmware-tanzu/velero
//!   `pkg/exposer/pod_volume.go` `createHostingPod`); the pod going fails the PVB and the backup ends
//!   PartiallyFailed (`pkg/datapath/micro_service_watcher.go` `startWatch`, `pkg/podvolume/backupper.go`);
//! - Karpenter's termination re-lists the node's pods on every pass and evicts, tier by tier, every pod
//!   without an active `do-not-disrupt` that does not tolerate `karpenter.sh/disrupted`
//!   (kubernetes-sigs/karpenter `pkg/controllers/node/termination/terminator/terminator.go` `Drain`,
//!   `pkg/utils/pod/scheduling.go` `IsEvictable`): the hosting pod is in the first tier, next to the held
//!   protected pods;
//! - a restarted Velero server marks every InProgress backup Failed (`pkg/cmd/server/server.go`
//!   `markInProgressBackupsFailed`).
//!
//! The oracle reads the simulator's audit log: which pods Velero created as hosting pods (`hosting-pod`),
//! which evictions and DELETEs the API server accepted, when each Velero Backup reached Completed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::json;
use snapdrain::api::DisruptionPlan;
use snapdrain::api::status::PlanPhase;
use snapdrain_sim::apiserver::audit::AuditEntry;
use snapdrain_sim::world::Timings;
use snapdrain_sim::world::velero::VeleroFault;
use snapdrain_testkit::eviction::evict_with;
use snapdrain_testkit::gate::controller_with_gate;
use snapdrain_testkit::harness::{
    Harness, assert_no_eviction_before_verified_backup, fast_timings,
};
use snapdrain_testkit::safety::{accepted_deletions, accepted_evictions, pods_removed};
use snapdrain_testkit::{eventually_within, karpenter};

const WAIT: Duration = Duration::from_secs(120);

/// The oracle's own rule (DESIGN.md, the promise): a running StatefulSet pod with a PVC.
fn protected(p: &Pod) -> bool {
    let sts = p
        .owner_references()
        .iter()
        .any(|o| o.kind == "StatefulSet" && o.controller == Some(true));
    let pvc = p
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.persistent_volume_claim.is_some()));
    let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    sts && pvc && running
}

/// The quickstart cluster with snapdrain's gate (failurePolicy Ignore, the chart's default) and every
/// protected pod held. A backup takes a second, several of the simulated Karpenter's passes over a
/// draining node (its termination requeues every 200 ms), so a hosting pod left to it is evicted.
async fn gated() -> (Harness, snapdrain::controller::ControllerHandle) {
    let h = Harness::start_with(Timings {
        backup_overhead: Duration::from_secs(1),
        ..fast_timings()
    })
    .await;
    let controller = controller_with_gate(
        &h,
        "Ignore",
        snapdrain::webhook::Lifetimes::default(),
        Duration::from_secs(30),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    h.wait_all(pods, "every protected pod held", |ps| {
        let held: Vec<&Pod> = ps.iter().filter(|p| protected(p)).collect();
        held.len() == 5
            && held.iter().all(|p| {
                p.annotations()
                    .get("karpenter.sh/do-not-disrupt")
                    .map(String::as_str)
                    == Some("true")
            })
    })
    .await;
    (h, controller)
}

/// Hosting pods Velero created on `node` (`velero/<name>`).
fn hosting_pods_on(audit: &[AuditEntry], node: &str) -> BTreeSet<String> {
    audit
        .iter()
        .filter(|e| e.source == "world" && e.verb == "hosting-pod")
        .filter(|e| e.detail["node"] == node)
        .map(|e| {
            format!(
                "{}/{}",
                e.namespace.as_deref().unwrap_or_default(),
                e.name.as_deref().unwrap_or_default()
            )
        })
        .collect()
}

/// When each Velero Backup first reached `phase`, from the audit log.
fn reached(audit: &[AuditEntry], phase: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in audit {
        if e.source == "world"
            && e.verb == "phase"
            && e.resource == "backups.velero.io"
            && e.detail["phase"] == phase
            && let Some(name) = &e.name
        {
            out.entry(name.clone()).or_insert_with(|| e.time.clone());
        }
    }
    out
}

/// Deletes the node's NodeClaim (Karpenter's forceful path: expiry, interruption, a manual delete),
/// with a NodePool terminationGracePeriod first when given, and checks the whole run: the plan completes,
/// its backups are Completed in Velero and verified before any protected pod leaves, they ran in hosting
/// pods on the node, and no eviction or DELETE of a hosting pod was accepted.
async fn forceful_termination(grace: Option<&str>) {
    let (h, _controller) = gated().await;
    let node = h.node_with_statefulset_pods().await;
    let protected_on_node = h.protected_pods_on(&node).await;
    assert!(!protected_on_node.is_empty());
    let claim = h.nodeclaim_of(&node).await;
    if let Some(period) = grace {
        karpenter::set_termination_grace_period(&h.cluster, &claim, period)
            .expect("set terminationGracePeriod");
    }
    karpenter::nodeclaims(&h.client)
        .delete(&claim, &Default::default())
        .await
        .expect("delete the NodeClaim");
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    let plan = h
        .wait_all(plans, &format!("a signal plan for {node}"), |ps| {
            ps.iter().any(|p| p.spec.nodes.contains(&node))
        })
        .await
        .into_iter()
        .find(|p| p.spec.nodes.contains(&node))
        .expect("the wait returned it");
    let done = h
        .wait_plan(&plan.name_any(), WAIT, PlanPhase::is_terminal)
        .await;
    let status = done.status.clone().expect("a status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    eventually_within("Karpenter to take the node", WAIT, || async {
        h.node(&node).await.is_none().then_some(())
    })
    .await;

    let audit = h.audit();
    assert_no_eviction_before_verified_backup(&audit, &protected_on_node, &done);
    // Every backup of the plan reached Completed in Velero before the first protected pod left.
    let completed = reached(&audit, "Completed");
    let first_left = pods_removed(&audit)
        .into_iter()
        .find(|r| protected_on_node.contains_key(&r.pod))
        .map(|r| r.time)
        .expect("Karpenter drained the protected pods");
    assert!(!status.backups.is_empty());
    // One attempt per namespace, none lost to an evicted hosting pod.
    for b in &status.backups {
        assert!(b.verified && b.attempt == 1, "backup {}: {b:#?}", b.name);
        let at = completed
            .get(&b.name)
            .unwrap_or_else(|| panic!("backup {} never Completed in Velero", b.name));
        assert!(
            *at < first_left,
            "backup {} Completed at {at}, after a protected pod left at {first_left}",
            b.name
        );
    }
    // The backup ran through hosting pods on the node Karpenter was draining, and none was taken.
    let hosting = hosting_pods_on(&audit, &node);
    assert!(
        !hosting.is_empty(),
        "the file-system backup ran in hosting pods on {node}"
    );
    let taken: Vec<String> = accepted_evictions(&audit)
        .into_iter()
        .chain(accepted_deletions(&audit))
        .map(|r| r.pod)
        .filter(|p| hosting.contains(p))
        .collect();
    assert!(
        taken.is_empty(),
        "evictions or DELETEs of hosting pods were accepted: {taken:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forceful_termination_with_a_grace_period_keeps_the_hosting_pods_until_the_verified_backup()
 {
    forceful_termination(Some("10m")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forceful_termination_without_a_grace_period_keeps_the_hosting_pods_until_the_verified_backup()
 {
    forceful_termination(None).await;
}

/// The Velero server pod is refused while a plan backs up (a restart would fail the backup), and let go
/// once the plan is past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_velero_server_is_held_while_a_plan_backs_up() {
    let (h, _controller) = gated().await;
    let velero = h.cluster.velero.as_ref().expect("the world runs Velero");
    // Every backup stays in Finalizing until released: the plan stays in BackingUp meanwhile.
    velero.inject(VeleroFault::HoldFinalizing);
    let node = h.node_with_statefulset_pods().await;
    let plan = h
        .create_plan("server-hold", json!({"nodes": [node], "mode": "Release"}))
        .await;
    h.wait_phase(&plan.name_any(), PlanPhase::BackingUp).await;
    let server = Api::<Pod>::namespaced(h.client.clone(), "velero")
        .list(&ListParams::default().labels("deploy=velero"))
        .await
        .expect("list the Velero pods")
        .items
        .into_iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
        .expect("the Velero server pod");
    // The 429 must reach the test, not be retried inside the client.
    let mut config = h.kube_config();
    config.default_retry = false;
    let client = kube::Client::try_from(config).expect("a client");
    let refused = evict_with(&client, "velero", &server.name_any(), json!({}), "")
        .await
        .expect_err("the gate refuses");
    let kube::Error::Api(status) = refused else {
        panic!("an API answer: {refused:?}");
    };
    assert_eq!(status.code, 429, "{status:?}");
    assert!(
        status.message.contains("Velero server pod") && status.message.contains("server-hold"),
        "{}",
        status.message
    );
    velero.clear_faults();
    h.wait_plan(&plan.name_any(), WAIT, |p| {
        !matches!(p, PlanPhase::Pending | PlanPhase::BackingUp)
    })
    .await;
    // The gate decides from its cache of plans, which sees the new phase a moment after the API server
    // does: a 429 until then is retried, as every drainer retries it.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match evict_with(&client, "velero", &server.name_any(), json!({}), "").await {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.code == 429 && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the server pod is evicted once the plan is past its backup: {e}"),
        }
    }
}
