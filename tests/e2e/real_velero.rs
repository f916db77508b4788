//! The Velero Backup lifecycle as real Velero 1.18 runs it (review defects #2, #14, #19, #20, #21): the
//! default BSL is whichever has `spec.default: true`; backups expire and are deleted; phases that can
//! only end PartiallyFailed; one backup at a time in Velero's queue, and DeleteBackupRequests.

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use snapdrain::api::status::{AbandonedBackup, BackupRecord, PlanPhase};
use snapdrain::api::velero::{Backup, BackupStorageLocation};
use snapdrain_sim::world::velero::VeleroFault;
use snapdrain_testkit::eventually;
use snapdrain_testkit::harness::{Harness, TIMEOUT};

fn records(plan: &snapdrain::api::DisruptionPlan) -> Vec<BackupRecord> {
    plan.status
        .as_ref()
        .map(|s| s.backups.clone())
        .unwrap_or_default()
}

async fn create_object(h: &Harness, plural: &str, kind: &str, body: serde_json::Value) {
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        h.client.clone(),
        "velero",
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("velero.io", "v1", kind),
            plural,
        ),
    );
    let obj: kube::api::DynamicObject = serde_json::from_value(body).expect("object");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create Velero object");
}

pub(crate) async fn backup_exists(h: &Harness, name: &str) -> bool {
    Api::<Backup>::namespaced(h.client.clone(), "velero")
        .get_opt(name)
        .await
        .expect("read backup")
        .is_some()
}

/// Phases the simulated Velero recorded for Backup `name` (its audit log).
pub(crate) fn velero_phases(h: &Harness, name: &str) -> Vec<String> {
    h.audit()
        .into_iter()
        .filter(|e| e.resource == "backups.velero.io" && e.name.as_deref() == Some(name))
        .filter_map(|e| e.detail["phase"].as_str().map(str::to_string))
        .collect()
}

/// The `status.errors` Velero's deletion controller recorded for requests about Backup `backup`.
fn deletion_results(h: &Harness, backup: &str) -> Vec<serde_json::Value> {
    h.audit()
        .into_iter()
        .filter(|e| {
            e.resource == "deletebackuprequests.velero.io"
                && e.detail["phase"] == "Processed"
                && e.detail["backupName"] == backup
        })
        .map(|e| e.detail["errors"].clone())
        .collect()
}

/// A node other than `not`, running protected pods of namespace shop.
async fn other_node_with_shop_pods(h: &Harness, not: &str) -> String {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(h.client.clone());
    for n in nodes.list(&Default::default()).await.expect("nodes").items {
        let name = n.name_any();
        let protected = h.protected_pods_on(&name).await;
        if name != not && protected.keys().any(|k| k.starts_with("shop/")) {
            return name;
        }
    }
    panic!("no second node with shop StatefulSet pods");
}

/// Waits until the plan's records of namespace shop are all verified (Release plans then wait for the
/// autoscaler in Draining).
async fn wait_verified(h: &Harness, plan: &str) -> Vec<BackupRecord> {
    let p = h
        .wait_plan(plan, TIMEOUT, |p| {
            p == PlanPhase::Draining || p == PlanPhase::Completed || p.is_terminal()
        })
        .await;
    let rs = records(&p);
    assert!(
        p.status.as_ref().map(|s| s.phase) != Some(PlanPhase::Failed),
        "{:#?}",
        p.status
    );
    assert!(rs.iter().any(|r| r.verified), "{rs:#?}");
    rs
}

/// #14, velero pkg/controller/backup_controller.go prepareBackupRequest: with no storageLocation in the
/// plan, the Backup leaves it unset, Velero uses the BSL marked `default: true` (here `aws`) and writes
/// its name into the Backup; verification reads that BSL's bucket. Before the fix the Backup named
/// `default`, which does not exist here: FailedValidation on every attempt, a failed plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_completes_when_the_default_bsl_is_not_named_default() {
    let h = Harness::start().await;
    let bsls: Api<BackupStorageLocation> = Api::namespaced(h.client.clone(), "velero");
    let mut aws = bsls.get("default").await.expect("the install's BSL");
    aws.metadata = kube::api::ObjectMeta {
        name: Some("aws".into()),
        namespace: Some("velero".into()),
        ..Default::default()
    };
    aws.spec.default = Some(true);
    bsls.create(&PostParams::default(), &aws)
        .await
        .expect("create BSL aws");
    bsls.delete("default", &DeleteParams::default())
        .await
        .expect("delete BSL default");

    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan(
        "aws-default",
        json!({"nodes": [node], "backup": {"maxAttempts": 1}}),
    )
    .await;
    let plan = h
        .wait_plan("aws-default", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.clone().expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let backups = h.backups_of("aws-default").await;
    assert_eq!(backups.len(), 1, "{backups:?}");
    let b = Api::<Backup>::namespaced(h.client.clone(), "velero")
        .get(&backups[0])
        .await
        .expect("backup");
    assert_eq!(b.spec.storage_location.as_deref(), Some("aws"));
    assert!(
        status
            .backups
            .iter()
            .all(|r| r.verified && r.storage_location.as_deref() == Some("aws")),
        "{:#?}",
        status.backups
    );
    controller.shutdown().await;
}

/// #2, velero pkg/controller/gc_controller.go: an expired Backup is deleted with its bucket data, and
/// `velero backup delete` (a DeleteBackupRequest) does the same. A reused backup is read again first:
/// one that expires within a day, or is gone, is not trusted and the plan makes its own. Before the fix
/// the other plan's verified record was copied as it was and no Backup of this plan was made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expiring_or_deleted_reused_backup_is_not_trusted() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;

    // A verified backup that Velero deletes within the hour (ttl 1h < the 24h reuse margin).
    h.create_plan(
        "short-lived",
        json!({"nodes": [node], "mode": "Release", "backup": {"ttl": "1h"}}),
    )
    .await;
    let short = wait_verified(&h, "short-lived").await;
    // Its own backup expires soon too, so that only the next one can stand in later.
    h.create_plan(
        "reuse-short",
        json!({"nodes": [node], "mode": "Release", "backup": {"reuseIfNewerThan": "1h", "ttl": "1h"}}),
    )
    .await;
    let rs = wait_verified(&h, "reuse-short").await;
    assert!(
        rs.iter().all(|r| !r.reused),
        "the expiring backup was reused: {rs:#?}"
    );
    assert_eq!(h.backups_of("reuse-short").await.len(), 1);

    // A verified backup (ttl 720h) deleted through Velero before it is reused.
    h.create_plan("deleted-later", json!({"nodes": [node], "mode": "Release"}))
        .await;
    let deleted = wait_verified(&h, "deleted-later").await;
    let name = deleted[0].name.clone();
    assert_ne!(name, short[0].name);
    create_object(
        &h,
        "deletebackuprequests",
        "DeleteBackupRequest",
        json!({"apiVersion": "velero.io/v1", "kind": "DeleteBackupRequest",
               "metadata": {"name": format!("{name}-by-hand"), "namespace": "velero",
                            "labels": {"velero.io/backup-name": name}},
               "spec": {"backupName": name}}),
    )
    .await;
    eventually("the deleted backup to be gone", || async {
        (!backup_exists(&h, &name).await).then_some(())
    })
    .await;
    // Also the plan whose backup this was still lists it as verified: only the Backup itself tells.
    h.create_plan(
        "reuse-deleted",
        json!({"nodes": [node], "mode": "Release", "backup": {"reuseIfNewerThan": "1h"}}),
    )
    .await;
    let rs = wait_verified(&h, "reuse-deleted").await;
    assert!(
        rs.iter().all(|r| !r.reused && r.name != name),
        "the deleted backup was reused: {rs:#?}"
    );
    assert_eq!(h.backups_of("reuse-deleted").await.len(), 1);
    controller.shutdown().await;
}

/// #19: reuse is decided on the PVCs of every node of the plan. A backup of one node's PVCs is reused by
/// a plan of that node alone (after reading the Backup and verifying the bucket again), but not by a plan
/// of two nodes. Before the fix the two-node plan kept the first node's reuse and its record lacked the
/// second node's PVCs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_multi_node_plan_reuses_only_a_backup_covering_every_node() {
    let h = Harness::start().await;
    let controller = h.controller().await;
    let first = h.node_with_statefulset_pods().await;
    let second = other_node_with_shop_pods(&h, &first).await;
    h.create_plan("one-node", json!({"nodes": [first], "mode": "Release"}))
        .await;
    let base = wait_verified(&h, "one-node").await;

    h.create_plan(
        "same-node",
        json!({"nodes": [first], "mode": "Release", "backup": {"reuseIfNewerThan": "1h"}}),
    )
    .await;
    let same = wait_verified(&h, "same-node").await;
    assert!(
        same.iter()
            .all(|r| r.reused && r.verified && r.name == base[0].name),
        "a covering backup is reused, verified again: {same:#?}"
    );
    assert!(h.backups_of("same-node").await.is_empty());

    h.create_plan(
        "two-nodes",
        json!({"nodes": [first, second], "mode": "Release", "backup": {"reuseIfNewerThan": "1h"}}),
    )
    .await;
    let both = wait_verified(&h, "two-nodes").await;
    let shop = both
        .iter()
        .find(|r| r.namespace == "shop")
        .expect("shop record");
    assert!(!shop.reused, "{shop:#?}");
    assert!(
        base[0].pvcs.iter().all(|p| shop.pvcs.contains(p)) && shop.pvcs.len() > base[0].pvcs.len(),
        "the own backup covers both nodes' PVCs: {shop:#?} vs {:?}",
        base[0].pvcs
    );
    assert_eq!(h.backups_of("two-nodes").await.len(), 1);
    controller.shutdown().await;
}

/// #20, velero backup_finalizer_controller.go: FinalizingPartiallyFailed only ever ends PartiallyFailed,
/// so the attempt fails at once and the next starts while Velero still finalizes (slow plugin
/// operations are held here). Before the fix the plan waited for the first attempt to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partially_failed_bound_phase_fails_the_attempt_at_once() {
    let h = Harness::start().await;
    let velero = h.cluster.velero.clone().expect("velero");
    let node = h.node_with_statefulset_pods().await;
    // Every volume of the node's protected pods fails its file-system backup (keys are namespace/pod).
    for (pod, claims) in h.protected_pods_on(&node).await {
        let namespace = pod.split('/').next().unwrap_or_default().to_string();
        for pvc in claims {
            velero.inject(VeleroFault::FailVolume {
                namespace: namespace.clone(),
                pvc,
            });
        }
    }
    velero.inject(VeleroFault::HoldFinalizing);
    let controller = h.controller().await;
    h.create_plan(
        "partial",
        json!({"nodes": [node], "backup": {"maxAttempts": 3}}),
    )
    .await;
    let first = h
        .wait_backup_phase("partial", "FinalizingPartiallyFailed")
        .await;
    eventually(
        "a second attempt while the first still finalizes",
        || async { (h.backups_of("partial").await.len() >= 2).then_some(()) },
    )
    .await;
    assert!(
        !velero_phases(&h, &first).contains(&"PartiallyFailed".to_string()),
        "the first attempt was still held"
    );
    velero.clear_faults();
    let plan = h.wait_plan("partial", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    // The abandoned attempt is deleted once Velero lets it go.
    let r = status
        .backups
        .iter()
        .find(|r| r.name == first)
        .expect("first record");
    // DeleteRequested, or Gone when the status write after the request was lost and a later pass
    // found the Backup already deleted by Velero.
    assert!(
        matches!(
            r.abandoned,
            Some(AbandonedBackup::DeleteRequested | AbandonedBackup::Gone)
        ),
        "{r:#?}"
    );
    controller.shutdown().await;
}

/// A Backup `nightly` of kube-system held InProgress (a long backup holding Velero's queue); returns
/// Velero's controls, to release it with `clear_faults`.
pub(crate) async fn nightly_holding_the_queue(
    h: &Harness,
) -> snapdrain_sim::world::velero::VeleroHandle {
    let velero = h.cluster.velero.clone().expect("velero");
    velero.inject(VeleroFault::HoldInProgress {
        backup: "nightly".into(),
    });
    create_object(
        h,
        "backups",
        "Backup",
        json!({"apiVersion": "velero.io/v1", "kind": "Backup",
               "metadata": {"name": "nightly", "namespace": "velero"},
               "spec": {"includedNamespaces": ["kube-system"]}}),
    )
    .await;
    eventually("the nightly backup to hold Velero's queue", || async {
        velero_phases(h, "nightly")
            .contains(&"InProgress".to_string())
            .then_some(())
    })
    .await;
    velero
}

/// #21, velero backup_queue_controller.go (--concurrent-backups 1) and backup_deletion_controller.go: an
/// attempt that times out while Queued behind another backup is removed, so it never runs and the retry
/// is next in the queue. With a named location that is a DeleteBackupRequest; without one (Velero resolves
/// the default only when the backup starts) the deletion controller cannot find its BSL, so snapdrain
/// deletes the never-started Backup object itself. Before the fix it stayed Queued and ran first.
async fn abandoned_attempt(location: Option<&str>) {
    let h = Harness::start().await;
    let velero = nightly_holding_the_queue(&h).await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    let mut backup = json!({"timeout": "2s", "maxAttempts": 3});
    if let Some(l) = location {
        backup["storageLocation"] = json!(l);
    }
    h.create_plan("queued", json!({"nodes": [node], "backup": backup}))
        .await;
    let first = h.wait_backup_phase("queued", "Queued").await;
    eventually("the timed-out attempt removed", || async {
        (!backup_exists(&h, &first).await).then_some(())
    })
    .await;
    eventually("a retry", || async {
        (!h.backups_of("queued").await.is_empty()).then_some(())
    })
    .await;
    velero.clear_faults();
    let plan = h.wait_plan("queued", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    assert!(
        !velero_phases(&h, &first).contains(&"InProgress".to_string()),
        "the abandoned attempt never ran: {:?}",
        velero_phases(&h, &first)
    );
    let r = status
        .backups
        .iter()
        .find(|r| r.name == first)
        .expect("first record");
    if location.is_some() {
        assert!(
            matches!(
                r.abandoned,
                Some(AbandonedBackup::DeleteRequested | AbandonedBackup::Gone)
            ),
            "{r:#?}"
        );
        assert_eq!(deletion_results(&h, &first), vec![json!([])]);
    } else {
        // Deleted, or Gone when the pass that deleted it lost its status write and the next pass found
        // the object already gone (the decision to abandon is written before acting, so never None).
        assert!(
            matches!(
                r.abandoned,
                Some(AbandonedBackup::Deleted | AbandonedBackup::Gone)
            ),
            "{r:#?}"
        );
    }
    controller.shutdown().await;
}

/// Velero 1.18's queue (velero `pkg/controller/backup_queue_controller.go`): a plan's Backup waiting
/// behind a running one is `Queued` with `status.queuePosition`; the plan's status says where it waits,
/// and says nothing of a queue once the Backup runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_status_says_where_a_backup_waits_in_veleros_queue() {
    let h = Harness::start().await;
    let velero = nightly_holding_the_queue(&h).await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan("behind", json!({"nodes": [node]})).await;
    let queued = h
        .wait_plan_until("behind", TIMEOUT, |p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.backups.iter().any(|b| b.queue_position.is_some()))
        })
        .await;
    let record = &queued.status.as_ref().expect("status").backups[0];
    assert_eq!(record.phase.as_deref(), Some("Queued"), "{record:#?}");
    assert_eq!(record.queue_position, Some(1), "{record:#?}");
    velero.clear_faults();
    let plan = h.wait_plan("behind", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    assert!(
        status.backups.iter().all(|b| b.queue_position.is_none()),
        "{:#?}",
        status.backups
    );
    controller.shutdown().await;
}

/// Velero renumbers every queued Backup each time one starts (velero
/// `pkg/controller/backup_queue_controller.go`, "Updating queuePosition for remaining queued backups"). A
/// plan waiting behind twelve others records its place as it halves and for the last three places, not
/// at each renumbering (which made a status write per plan per start: the scale-5k soak's status writes
/// per plan grew with the queue). Every write the plan makes is seen through a watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_records_its_place_in_veleros_queue_as_it_halves_not_at_every_renumbering() {
    let h = Harness::start().await;
    let velero = nightly_holding_the_queue(&h).await;
    const AHEAD: usize = 12;
    for i in 0..AHEAD {
        create_object(
            &h,
            "backups",
            "Backup",
            json!({"apiVersion": "velero.io/v1", "kind": "Backup",
                   "metadata": {"name": format!("ahead-{i}"), "namespace": "velero"},
                   "spec": {"includedNamespaces": ["kube-system"]}}),
        )
        .await;
    }
    eventually(
        "the twelve Backups queued behind the nightly one",
        || async {
            (0..AHEAD)
                .all(|i| velero_phases(&h, &format!("ahead-{i}")).contains(&"Queued".to_string()))
                .then_some(())
        },
    )
    .await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan("behind-many", json!({"nodes": [node]})).await;
    h.wait_plan_until("behind-many", TIMEOUT, |p| {
        p.status
            .as_ref()
            .is_some_and(|s| s.backups.iter().any(|b| b.queue_position.is_some()))
    })
    .await;
    velero.clear_faults();
    let seen = std::sync::Mutex::new(Vec::<Option<i64>>::new());
    let plan = h
        .wait_plan_until("behind-many", TIMEOUT, |p| {
            let record = p.status.as_ref().and_then(|s| s.backups.first());
            let position = record.and_then(|b| b.queue_position);
            let mut seen = seen.lock().expect("one test thread writes it");
            if seen.last() != Some(&position) {
                seen.push(position);
            }
            record.is_some_and(|b| b.phase.as_deref() != Some("Queued"))
        })
        .await;
    let seen = seen.into_inner().expect("not poisoned");
    let places: Vec<i64> = seen.iter().flatten().copied().collect();
    assert_eq!(places.first(), Some(&(AHEAD as i64 + 1)), "{seen:?}");
    // Each place recorded after the first is at most half the one before, or one of the last three.
    for w in places.windows(2) {
        assert!(
            w[1] <= 3 || w[1] <= w[0] / 2,
            "the record followed a renumbering from {} to {}: {seen:?}",
            w[0],
            w[1]
        );
    }
    assert!(places.len() <= 6, "{seen:?}");
    let status = plan.status.expect("status");
    assert!(
        status.backups.iter().all(|b| b.queue_position.is_none()),
        "{:#?}",
        status.backups
    );
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_abandoned_attempt_is_deleted_via_delete_backup_request_and_the_retry_completes() {
    abandoned_attempt(Some("default")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_abandoned_attempt_that_never_started_is_deleted_and_the_retry_completes() {
    abandoned_attempt(None).await;
}

/// Annotates every protected pod on `node` with Velero backup hooks (`annotations`).
async fn annotate_protected(
    h: &Harness,
    node: &str,
    annotations: serde_json::Value,
) -> Vec<String> {
    let protected = h.protected_pods_on(node).await;
    for pod in protected.keys() {
        let (ns, name) = pod.split_once('/').expect("ns/name");
        kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(h.client.clone(), ns)
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&json!({"metadata": {"annotations": annotations}})),
            )
            .await
            .expect("annotate the pod with backup hooks");
    }
    protected.keys().cloned().collect()
}

/// Velero's backup hooks, as the workloads declare them on their pods (velero
/// `internal/hook/item_hook_handler.go`): a file-system freeze before the copy and the thaw after it run
/// for each protected pod, before any eviction; the plan's status records what Velero counted
/// (`status.hookStatus`), and the report shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_workloads_backup_hooks_run_before_the_drain_and_the_report_shows_them() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    let pods = annotate_protected(
        &h,
        &node,
        json!({"pre.hook.backup.velero.io/command": r#"["/sbin/fsfreeze","--freeze","/data"]"#,
               "post.hook.backup.velero.io/command": r#"["/sbin/fsfreeze","--unfreeze","/data"]"#}),
    )
    .await;
    let controller = h.controller().await;
    h.create_plan("hooked", json!({"nodes": [node]})).await;
    let plan = h.wait_plan("hooked", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.clone().expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let hooks = status
        .backups
        .iter()
        .filter_map(|b| b.hooks)
        .fold((0, 0), |a, h| {
            (a.0 + h.hooks_attempted, a.1 + h.hooks_failed)
        });
    assert_eq!(hooks, (2 * pods.len() as u64, 0), "{:#?}", status.backups);
    // Every hook ran (the simulated Velero's exec record) before the pod's eviction.
    let audit = h.audit();
    let evicted = snapdrain_testkit::safety::pods_removed(&audit);
    for pod in &pods {
        let ran: Vec<&snapdrain_sim::apiserver::audit::AuditEntry> = audit
            .iter()
            .filter(|e| {
                e.verb == "hook-exec"
                    && format!(
                        "{}/{}",
                        e.namespace.as_deref().unwrap_or(""),
                        e.name.as_deref().unwrap_or("")
                    ) == *pod
            })
            .collect();
        assert_eq!(ran.len(), 2, "{pod}: {ran:#?}");
        let out = evicted.iter().find(|e| &e.pod == pod).expect("evicted");
        assert!(
            ran.iter().all(|e| e.time < out.time),
            "{pod}: hooks before the eviction"
        );
    }
    let data = snapdrain_cli::report::gather(&h.client, "hooked")
        .await
        .expect("gather the report");
    let md = snapdrain_cli::report::render_markdown(&data);
    for b in &status.backups {
        let h = b.hooks.expect("hook counts");
        assert!(
            md.contains(&format!("backup hooks {} run, 0 failed", h.hooks_attempted)),
            "{md}"
        );
    }
    controller.shutdown().await;
}

/// The DisruptionPolicy's default backup hooks (`spec.backupHooks`) for the postgres workload: the
/// plan's Velero Backup carries the freeze/thaw pair as `spec.hooks.resources`, and the simulated Velero
/// runs it (velero `internal/hook/item_hook_handler.go` `HandleHooks`) in every postgres pod the Backup
/// covers (`backup.scope: StatefulSet`: all replicas) except one annotated with hooks of its own, which
/// runs its own instead; both ran in the drained pod before its eviction, and Velero's `hookStatus`
/// counts all of them, as the plan's status and report show. The judge is the simulator's record: its
/// Backup object and its exec log, never the controller's status alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_policys_backup_hooks_run_before_the_drain_and_a_pods_own_hooks_win() {
    let h = Harness::start().await;
    let freeze = json!(["/sbin/fsfreeze", "--freeze", "/var/lib/postgresql"]);
    let thaw = json!(["/sbin/fsfreeze", "--unfreeze", "/var/lib/postgresql"]);
    h.set_policy(json!({"backupHooks": [{"name": "pg-freeze", "namespaces": ["shop"],
        "podSelector": {"matchLabels": {"app": "postgres"}},
        "pre": [{"exec": {"container": "main", "command": freeze, "onError": "Fail", "timeout": "30s"}}],
        "post": [{"exec": {"container": "main", "command": thaw}}]}]}))
    .await;
    let node = h.node_with_statefulset_pods().await;
    let all_postgres: Vec<k8s_openapi::api::core::v1::Pod> =
        Api::<k8s_openapi::api::core::v1::Pod>::namespaced(h.client.clone(), "shop")
            .list(&kube::api::ListParams::default().labels("app=postgres"))
            .await
            .expect("list postgres pods")
            .items;
    assert_eq!(all_postgres.len(), 3, "the quickstart runs three");
    let on_node = |p: &k8s_openapi::api::core::v1::Pod| {
        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str())
    };
    let drained = all_postgres
        .iter()
        .find(|p| on_node(p))
        .expect("a postgres pod on the node")
        .name_any();
    // A replica elsewhere declares hooks of its own (its own container and commands).
    let own = all_postgres
        .iter()
        .find(|p| !on_node(p))
        .expect("a postgres pod on another node")
        .name_any();
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(h.client.clone(), "shop")
        .patch(
            &own,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&json!({"metadata": {"annotations": {
                "pre.hook.backup.velero.io/command": r#"["/usr/bin/psql","-c","CHECKPOINT"]"#,
                "post.hook.backup.velero.io/command": r#"["/bin/true"]"#}}})),
        )
        .await
        .expect("annotate a pod with its own backup hooks");
    // `snapdrain plan` says which policy hooks the Backup would carry.
    let spec = json!({"nodes": [node], "backup": {"scope": "StatefulSet"}});
    let preview = snapdrain::controller::preview::describe(
        &h.client,
        &node,
        &serde_json::from_value(spec.clone()).expect("a plan spec"),
    )
    .await
    .expect("a preview");
    assert!(
        preview.contains("policy backup hooks (Velero runs them; a pod's own hook annotations run instead): pg-freeze (pre 1, post 1)"),
        "{preview}"
    );
    let controller = h.controller().await;
    h.create_plan("policy-hooked", spec).await;
    let plan = h
        .wait_plan("policy-hooked", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.clone().expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");

    // The Velero Backup the plan made carries the policy's entry, narrowed to its namespace.
    let shop = status
        .backups
        .iter()
        .find(|b| b.namespace == "shop")
        .expect("a backup of shop");
    let backup = Api::<Backup>::namespaced(h.client.clone(), "velero")
        .get(&shop.name)
        .await
        .expect("the plan's Velero Backup");
    let carried = serde_json::to_value(&backup.spec.hooks).expect("json");
    assert_eq!(carried["resources"][0]["name"], "pg-freeze", "{carried}");
    assert_eq!(
        carried["resources"][0]["includedNamespaces"],
        json!(["shop"])
    );
    assert_eq!(carried["resources"][0]["pre"][0]["exec"]["command"], freeze);
    assert_eq!(carried["resources"][0]["post"][0]["exec"]["command"], thaw);

    // What the simulated Velero ran, per pod: the policy's pair in the two unannotated replicas, the
    // annotated replica's own pair and nothing of the policy's there.
    let audit = h.audit();
    let ran = |pod: &str| -> Vec<(String, serde_json::Value)> {
        audit
            .iter()
            .filter(|e| {
                e.verb == "hook-exec"
                    && e.namespace.as_deref() == Some("shop")
                    && e.name.as_deref() == Some(pod)
            })
            .map(|e| {
                (
                    e.detail["source"].as_str().unwrap_or("").to_owned(),
                    e.detail["command"].clone(),
                )
            })
            .collect()
    };
    for pod in all_postgres.iter().map(|p| p.name_any()) {
        let expected = if pod == own {
            vec![
                (
                    "annotation".to_owned(),
                    json!(["/usr/bin/psql", "-c", "CHECKPOINT"]),
                ),
                ("annotation".to_owned(), json!(["/bin/true"])),
            ]
        } else {
            vec![
                ("spec".to_owned(), freeze.clone()),
                ("spec".to_owned(), thaw.clone()),
            ]
        };
        assert_eq!(ran(&pod), expected, "{pod}");
    }
    // Both of the policy's hooks ran in the drained pod before its eviction.
    let evicted = snapdrain_testkit::safety::pods_removed(&audit);
    let out = evicted
        .iter()
        .find(|e| e.pod == format!("shop/{drained}"))
        .expect("the drained pod was evicted");
    let hook_times: Vec<&str> = audit
        .iter()
        .filter(|e| e.verb == "hook-exec" && e.name.as_deref() == Some(drained.as_str()))
        .map(|e| e.time.as_str())
        .collect();
    assert_eq!(hook_times.len(), 2, "{hook_times:?}");
    assert!(
        hook_times.iter().all(|t| *t < out.time.as_str()),
        "hooks {hook_times:?} before the eviction at {}",
        out.time
    );

    // Velero's own count (2 hooks in each of the 3 replicas), and the plan's status and report.
    let counted = backup
        .status
        .as_ref()
        .and_then(|s| s.hook_status)
        .expect("Velero's hookStatus");
    assert_eq!((counted.hooks_attempted, counted.hooks_failed), (6, 0));
    assert_eq!(shop.hooks, Some(counted), "{shop:#?}");
    assert_eq!(
        shop.policy_hooks,
        ["pg-freeze (pre 1, post 1)"],
        "{shop:#?}"
    );
    let detail = snapdrain_cli::cli::status::detail(&plan);
    assert!(
        detail.contains("backup hooks: 6 run, 0 failed")
            && detail.contains("policy backup hooks: pg-freeze (pre 1, post 1)"),
        "{detail}"
    );
    let data = snapdrain_cli::report::gather(&h.client, "policy-hooked")
        .await
        .expect("gather the report");
    let md = snapdrain_cli::report::render_markdown(&data);
    assert!(
        md.contains("backup hooks 6 run, 0 failed; policy hooks pg-freeze (pre 1, post 1)"),
        "{md}"
    );
    controller.shutdown().await;
}

/// A pre hook that fails with `on-error: Fail` fails the pod's item, so Velero's Backup can only end
/// PartiallyFailed; the plan, allowed one attempt, fails, and nothing is evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_backup_hook_with_on_error_fail_fails_the_plan_and_evicts_nothing() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    annotate_protected(
        &h,
        &node,
        json!({"pre.hook.backup.velero.io/command": "/bin/false",
               "pre.hook.backup.velero.io/on-error": "Fail"}),
    )
    .await;
    let controller = h.controller().await;
    h.create_plan(
        "bad-hook",
        json!({"nodes": [node], "backup": {"maxAttempts": 1}}),
    )
    .await;
    let plan = h.wait_plan("bad-hook", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.clone().expect("status");
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    let record = &status.backups[0];
    // PartiallyFailed, or the FinalizingPartiallyFailed the controller saw first: a phase that can only
    // end PartiallyFailed fails the attempt at once (`planning::backups::classify_backup_phase`).
    assert!(
        record
            .phase
            .as_deref()
            .is_some_and(|p| p.ends_with("PartiallyFailed")),
        "{record:#?}"
    );
    assert!(
        record.hooks.is_some_and(|h| h.hooks_failed >= 1),
        "{record:#?}"
    );
    assert!(
        h.accepted_evictions().is_empty(),
        "{:?}",
        h.accepted_evictions()
    );
    controller.shutdown().await;
}
