//! How the controller copes with errors and with being told to stop: an error no retry can fix fails
//! the plan with its message, a passing one is shown while it is retried, and a pass blocked mid-drain
//! is cancelled at once by SIGTERM (shutdown) or by losing the Lease.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use snapdrain::api::status::PlanPhase;
use snapdrain::controller::run::RunOptions;
use snapdrain::controller::{ControllerHandle, start};
use snapdrain_sim::apiserver::faults::FaultRule;
use snapdrain_testkit::eventually;
use snapdrain_testkit::harness::{Harness, TIMEOUT};

fn failing(verb: &str, resource: &str, code: u16, times: Option<u32>) -> FaultRule {
    FaultRule {
        verb: Some(verb.into()),
        resource: Some(resource.into()),
        error_rate: 1.0,
        error_code: Some(code),
        times,
        ..FaultRule::default()
    }
}

/// The value of `snapdrain_reconciles_in_flight` in the controller's own metrics.
fn in_flight(c: &ControllerHandle) -> Option<i64> {
    c.metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix("snapdrain_reconciles_in_flight "))
        .and_then(|v| v.trim().parse().ok())
}

/// A controller whose drain passes wait up to five minutes on a blocked eviction before they return:
/// a stop that waited for the pass would take that long.
async fn slow_slice_controller(h: &Harness, identity: &str, opts: RunOptions) -> ControllerHandle {
    let mut settings = h.settings(identity);
    settings.wait_slice = Duration::from_secs(300);
    start(h.kube_config(), settings, opts)
        .await
        .expect("controller starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forbidden_backup_create_fails_the_plan_with_the_reason_instead_of_retrying_forever() {
    let h = Harness::start().await;
    // What kube-apiserver answers when RBAC does not allow the create (403 Forbidden).
    h.cluster
        .faults
        .add(failing("create", "backups.velero.io", 403, None));
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan("forbidden", json!({"nodes": [node]})).await;
    let plan = h.wait_plan("forbidden", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.expect("a terminal plan has a status");
    assert_eq!(status.phase, PlanPhase::Failed);
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("cannot create Velero Backup") && message.contains("403"),
        "{message}"
    );
    let node = h.node(&node).await.expect("the node stays");
    assert_ne!(
        node.spec.and_then(|s| s.unschedulable),
        Some(true),
        "left in service"
    );
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_passing_error_is_shown_in_the_status_while_it_is_retried_and_the_plan_completes() {
    let h = Harness::start().await;
    // Two 500s from the API server while reading the storage location, then it recovers (kube's
    // client retries 503 and 429 itself, so a 500 is what reaches the controller).
    h.cluster.faults.add(failing(
        "get",
        "backupstoragelocations.velero.io",
        500,
        Some(2),
    ));
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan("flaky", json!({"nodes": [node]})).await;
    let retrying = h
        .wait_plan_until("flaky", TIMEOUT, |p| {
            p.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Progressing" && c.status == "False")
            })
        })
        .await;
    let message = retrying.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains("is retrying"), "{message}");
    let plan = h.wait_plan("flaky", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.expect("a terminal plan has a status");
    assert_eq!(status.phase, PlanPhase::Completed, "{:?}", status.message);
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Progressing" && c.status == "True"),
        "{:?}",
        status.conditions
    );
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_cancels_a_pass_that_waits_on_a_blocked_eviction() {
    let h = Harness::start().await;
    h.block_postgres_evictions().await;
    let opts = RunOptions {
        lease_namespace: None,
        ..RunOptions::default()
    };
    let controller = slow_slice_controller(&h, "snapdrain-0", opts).await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan("stopping", json!({"nodes": [node]})).await;
    h.wait_phase("stopping", PlanPhase::Draining).await;
    eventually("a pass waits on the refused eviction", || async {
        (in_flight(&controller) == Some(1)).then_some(())
    })
    .await;
    // SIGTERM in `snapdrain controller` is this call. A stop that waited for the pass would take the
    // five-minute slice.
    tokio::time::timeout(Duration::from_secs(10), controller.shutdown())
        .await
        .expect("shutdown returns without waiting for the drain slice");
    let plan = h.wait_phase("stopping", PlanPhase::Draining).await;
    assert!(!plan.status.expect("status").phase.is_terminal());
}

/// kube-runtime's controller holds its runner until the plans store has its first LIST and does not
/// end a runner so held on shutdown: a SIGTERM while the API server is slow to list (a rollout under
/// load) must still stop the replica, not leave it for the kubelet's SIGKILL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_before_the_first_list_of_plans_returns() {
    let h = Harness::start().await;
    // The plans' LIST does not answer within the test.
    h.cluster.faults.add(FaultRule {
        verb: Some("list".into()),
        resource: Some("disruptionplans.snapdrain.io".into()),
        latency_ms: 600_000,
        ..FaultRule::default()
    });
    let opts = RunOptions {
        lease_namespace: None,
        ..RunOptions::default()
    };
    let controller = h.controller_with(opts, "snapdrain-0").await;
    // The default policy is created by a helper that starts with the plan controller: from here a
    // shutdown meets the controller waiting on its first LIST.
    eventually("the leader's helpers run", || async {
        h.audit()
            .iter()
            .any(|e| e.resource == "disruptionpolicies.snapdrain.io" && e.verb == "create")
            .then_some(())
    })
    .await;
    tokio::time::timeout(TIMEOUT, controller.shutdown())
        .await
        .expect("shutdown returns while the first LIST of plans is unanswered");
}

/// Review finding #17: kube-lease-manager keeps saying "leader" while its renewals fail (it logs and
/// backs off, `manager.rs` `watch`), yet a standby takes the Lease at renewTime + leaseDurationSeconds.
/// With only the Lease writes refused, the replica must stop acting before that, and act again once
/// its renewals land.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_whose_lease_renewals_fail_stops_acting_before_the_lease_runs_out() {
    let h = Harness::start().await;
    let opts = RunOptions {
        lease_namespace: Some("default".into()),
        // Long enough that the one-second margin is not eaten by a loaded machine's scheduling.
        lease_seconds: 6,
        ..RunOptions::default()
    };
    let controller = h.controller_with(opts, "replica-a").await;
    let mut leading = controller.leading.clone();
    tokio::time::timeout(TIMEOUT, leading.wait_for(|l| *l))
        .await
        .expect("the only replica takes the Lease")
        .expect("the controller runs");
    h.cluster
        .faults
        .add(failing("patch", "leases.coordination.k8s.io", 503, None));
    tokio::time::timeout(TIMEOUT, leading.wait_for(|l| !*l))
        .await
        .expect("the replica stops acting while it cannot renew")
        .expect("the controller runs");
    let stopped = jiff::Timestamp::now();
    // It stopped before a standby could take the Lease: the last renewal it wrote is still in force.
    let lease = Api::<Lease>::namespaced(h.client.clone(), "default")
        .get("snapdrain-controller")
        .await
        .expect("the Lease");
    let spec = lease.spec.expect("a Lease spec");
    let renewed = spec.renew_time.expect("a renewal").0;
    let expires = renewed
        + jiff::SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(6)));
    assert!(
        stopped < expires,
        "stopped acting at {stopped}, after the Lease ran out at {expires}"
    );
    h.cluster.faults.set(Vec::new());
    tokio::time::timeout(TIMEOUT, leading.wait_for(|l| *l))
        .await
        .expect("the replica acts again once its renewals land")
        .expect("the controller runs");
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deposed_leader_cancels_its_pass_at_once() {
    let h = Harness::start().await;
    h.block_postgres_evictions().await;
    let opts = RunOptions {
        lease_namespace: Some("default".into()),
        lease_seconds: 2,
        ..RunOptions::default()
    };
    let leader = slow_slice_controller(&h, "replica-a", opts).await;
    let mut leading = leader.leading.clone();
    tokio::time::timeout(TIMEOUT, leading.wait_for(|l| *l))
        .await
        .expect("the only replica takes the Lease")
        .expect("the controller runs");
    let node = h.node_with_statefulset_pods().await;
    h.create_plan("deposed", json!({"nodes": [node]})).await;
    h.wait_phase("deposed", PlanPhase::Draining).await;
    eventually("a pass waits on the refused eviction", || async {
        (in_flight(&leader) == Some(1)).then_some(())
    })
    .await;
    // Another holder takes the Lease, as a replica whose clock ran ahead or an operator would.
    let leases: Api<Lease> = Api::namespaced(h.client.clone(), "default");
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    leases
        .patch(
            "snapdrain-controller",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "holderIdentity": "replica-z",
                "leaseDurationSeconds": 3600,
                "acquireTime": now,
                "renewTime": now,
            }})),
        )
        .await
        .expect("take the Lease");
    tokio::time::timeout(TIMEOUT, leading.wait_for(|l| !*l))
        .await
        .expect("the replica sees it lost the Lease")
        .expect("the controller runs");
    eventually("the deposed replica's pass is cancelled", || async {
        (in_flight(&leader) == Some(0)).then_some(())
    })
    .await;
    leader.shutdown().await;
}

/// Whether `node` is unschedulable or carries snapdrain's drain taint.
fn cordoned_or_tainted(node: &k8s_openapi::api::core::v1::Node) -> (bool, bool) {
    let spec = node.spec.as_ref();
    let cordoned = spec.and_then(|s| s.unschedulable) == Some(true);
    let tainted = spec
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == "snapdrain.io/draining"));
    (cordoned, tainted)
}

/// The cordon's ownership record must be written before the cordon: if it were only carried by the
/// status write after the patch, a refused write would leave the next pass finding the node already
/// cordoned "by someone else", and a rollback would leave it cordoned and tainted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_status_write_after_the_cordon_still_uncordons_on_abort() {
    let h = Harness::start().await;
    // Hold the cordon patch, so the status writes can be refused while it is in flight (the sim
    // sleeps an injected latency before it dispatches the request).
    h.cluster.faults.add(FaultRule {
        verb: Some("patch".into()),
        resource: Some("nodes".into()),
        latency_ms: 1500,
        ..FaultRule::default()
    });
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let before = h.node(&node).await.expect("the node exists");
    assert_eq!(cordoned_or_tainted(&before), (false, false));
    h.create_plan("refused", json!({"nodes": [node]})).await;
    h.wait_phase("refused", PlanPhase::Cordoning).await;
    // Every status write is refused from here on (a 5xx from the API server, as a lost etcd leader
    // gives), until the test clears the faults.
    h.cluster.faults.add(failing(
        "patch",
        "disruptionplans.snapdrain.io/status",
        500,
        None,
    ));
    eventually("a status write of the plan is refused", || async {
        h.audit()
            .iter()
            .any(|e| {
                e.resource == "disruptionplans.snapdrain.io/status"
                    && e.name.as_deref() == Some("refused")
                    && e.code == Some(500)
            })
            .then_some(())
    })
    .await;
    h.cluster.faults.set(Vec::new());
    let plans: Api<snapdrain::api::DisruptionPlan> = Api::all(h.client.clone());
    plans
        .patch(
            "refused",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                snapdrain::api::ABORT_ANNOTATION: "true"}}})),
        )
        .await
        .expect("abort the plan");
    let plan = h.wait_plan("refused", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.expect("a terminal plan has a status");
    assert_eq!(status.phase, PlanPhase::Aborted, "{:?}", status.message);
    let after = h.node(&node).await.expect("an aborted plan keeps the node");
    assert_eq!(
        cordoned_or_tainted(&after),
        (false, false),
        "snapdrain cordoned and tainted the node, so the rollback must undo both: {:?}",
        status.nodes
    );
    controller.shutdown().await;
}

/// A replica starts through transient API errors on the calls it makes before it serves: reading the
/// gate's certificate Secret and reading its Lease. The chaos suite saw a restarted replica stop on one
/// injected 500 reading the Secret; an API server under load or restarting answers such 5xx for a while.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_starts_through_transient_errors_on_its_certificates_and_its_lease() {
    use snapdrain_testkit::gate::{NS, leased_gate_options};
    let h = Harness::start().await;
    snapdrain_testkit::eviction::namespace(&h.client, NS, json!({})).await;
    h.cluster
        .faults
        .add(failing("get", "secrets", 500, Some(2)));
    h.cluster
        .faults
        .add(failing("get", "leases.coordination.k8s.io", 503, Some(2)));
    // Panics ("controller starts") if the replica gives up on the errors.
    let controller = h
        .controller_with(leased_gate_options(), "snapdrain-0")
        .await;
    assert!(controller.webhook_addr.is_some(), "the gate listens");
    assert!(
        controller.webhook_certificate().is_some(),
        "the gate loaded its certificate"
    );
    assert_eq!(
        h.cluster.faults.injected().get("api"),
        Some(&4),
        "both calls failed twice before they succeeded"
    );
    // It goes on to lead: the Lease it read names it.
    let leases: Api<Lease> = Api::namespaced(h.client.clone(), NS);
    eventually("the replica holds the Lease", || async {
        let lease = leases
            .get_opt(snapdrain::controller::leader::LEASE_NAME)
            .await
            .ok()??;
        (lease.spec?.holder_identity.as_deref() == Some("snapdrain-0")).then_some(())
    })
    .await;
    controller.shutdown().await;
}
