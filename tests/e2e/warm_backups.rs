//! Warm backups (the DisruptionPolicy's `spec.warmBackups`) through real interfaces: the controller keeps
//! a Velero Schedule for the protected namespace and none for a namespace the policy leaves out, the
//! simulated Velero runs it as its schedule controller does (a `<schedule>-<YYYYMMDDhhmmss>` Backup
//! labelled `velero.io/schedule-name`), and a plan's pre-drain backup afterwards moves only the claim's
//! changed bytes: judged by the simulated Velero's own record of each upload (`VeleroHandle::uploads`),
//! not by anything snapdrain writes. Turning the option off deletes the Schedule.

use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use snapdrain::api::status::PlanPhase;
use snapdrain::api::velero::Backup;
use snapdrain::api::velero_schedule::Schedule;
use snapdrain_sim::world::velero::scope::CHANGED_BYTES;
use snapdrain_testkit::eventually_within;
use snapdrain_testkit::harness::{Harness, TIMEOUT};

/// What the test's Schedules are listed by: the label snapdrain's Schedules carry (written here, not
/// read from the product).
const OURS: &str = "snapdrain.io/warm-backup=true";
/// 1% of a quickstart postgres claim (20Gi), rounded down to whole MiB.
const CHANGED: &str = "204Mi";
const CHANGED_BYTES_VALUE: u64 = 204 * 1024 * 1024;
const GIB: u64 = 1 << 30;

fn policy(schedule: Option<&str>) -> serde_json::Value {
    let mut p = json!({"protection": {"namespaceSelector": {"matchExpressions": [
        {"key": "env", "operator": "NotIn", "values": ["scratch"]}]}}});
    if let Some(s) = schedule {
        p["warmBackups"] = json!({"schedule": s, "ttl": "1h"});
    }
    p
}

async fn schedule_names(h: &Harness) -> Vec<String> {
    let mut names: Vec<String> = Api::<Schedule>::all(h.client.clone())
        .list(&ListParams::default().labels(OURS))
        .await
        .expect("list Schedules")
        .items
        .iter()
        .map(|s| format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any()))
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_warm_schedule_fills_the_repository_so_the_pre_drain_backup_moves_only_what_changed() {
    let h = Harness::start().await;
    let velero = h
        .cluster
        .velero
        .clone()
        .expect("the quickstart runs Velero");
    // A namespace the policy leaves out, with a StatefulSet pod on a local volume that the default rule
    // alone would protect.
    let scratch: Namespace = serde_json::from_value(
        json!({"metadata": {"name": "scratch", "labels": {"env": "scratch"}}}),
    )
    .expect("a namespace");
    Api::<Namespace>::all(h.client.clone())
        .create(&PostParams::default(), &scratch)
        .await
        .expect("create the scratch namespace");
    let node = h.node_with_statefulset_pods().await;
    snapdrain_testkit::volumes::local_workload(
        &h.client,
        &snapdrain_testkit::volumes::LocalWorkload {
            namespace: "scratch",
            name: "cache",
            node: &node,
            local_size: "1Gi",
            ebs_size: None,
        },
        TIMEOUT,
    )
    .await
    .unwrap_or_else(|e| panic!("the scratch workload: {e}"));
    // Every postgres claim changes 1% between two backups (the simulated kopia repository then moves
    // only that much of a volume it holds).
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client.clone(), "shop");
    for i in 0..3 {
        claims
            .patch(
                &format!("data-postgres-{i}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {CHANGED_BYTES: CHANGED}}})),
            )
            .await
            .expect("annotate the claim's change");
    }
    h.set_policy(policy(Some("@every 2s"))).await;
    let controller = h.controller().await;

    // One Schedule, for shop; none for scratch (the keeper writes both in one pass, scratch first).
    eventually_within("the shop Schedule", TIMEOUT, || async {
        (!schedule_names(&h).await.is_empty()).then_some(())
    })
    .await;
    assert_eq!(schedule_names(&h).await, ["velero/snapdrain-warm-shop"]);

    // Velero makes a Backup from it, named and labelled as its schedule controller does, and it
    // completes with every postgres volume uploaded in full (the repository was empty).
    let backups: Api<Backup> = Api::namespaced(h.client.clone(), "velero");
    let warm = eventually_within("a scheduled Backup Completed", TIMEOUT, || async {
        backups
            .list(&ListParams::default().labels("velero.io/schedule-name=snapdrain-warm-shop"))
            .await
            .ok()?
            .items
            .into_iter()
            .find(|b| b.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Completed"))
    })
    .await;
    let name = warm.name_any();
    let stamp = name
        .strip_prefix("snapdrain-warm-shop-")
        .unwrap_or_else(|| panic!("{name} is <schedule>-<timestamp>"));
    assert!(
        stamp.len() == 14 && stamp.bytes().all(|b| b.is_ascii_digit()),
        "{name}"
    );
    assert_eq!(warm.spec.included_namespaces, ["shop"]);
    assert!(
        warm.labels().get("snapdrain.io/plan").is_none(),
        "a scheduled Backup is no plan's"
    );
    let first: Vec<_> = velero
        .uploads()
        .into_iter()
        .filter(|u| u.backup == name && u.pvc.starts_with("data-postgres-"))
        .collect();
    assert_eq!(first.len(), 3, "{first:?}");
    assert!(
        first
            .iter()
            .all(|u| u.moved == u.size && u.size == 20 * GIB),
        "the first backup moves everything: {first:?}"
    );

    // The preview says so for the namespace, naming the warm Backup.
    let spec: snapdrain::api::DisruptionPlanSpec =
        serde_json::from_value(json!({"nodes": [node]})).expect("a plan spec");
    let text = snapdrain::controller::preview::describe(&h.client, &node, &spec)
        .await
        .expect("preview");
    assert!(
        text.lines().any(|l| l
            .trim_start()
            .starts_with("warm backup snapdrain-warm-shop-")
            && l.contains("Completed")),
        "{text}"
    );

    // A slower schedule: the keeper brings the Schedule to it (Velero then waits an hour from its last
    // run, so the plan's backup is the next to touch the repository).
    h.set_policy(policy(Some("@every 1h"))).await;
    let schedules: Api<Schedule> = Api::namespaced(h.client.clone(), "velero");
    eventually_within("the Schedule follows the policy", TIMEOUT, || async {
        let s = schedules.get("snapdrain-warm-shop").await.ok()?;
        (s.spec["schedule"] == "@every 1h").then_some(())
    })
    .await;

    // The pre-drain backup of the node's postgres volume moves only what changed.
    let plan = "warm-drain";
    h.create_plan(plan, json!({"nodes": [node]})).await;
    h.wait_phase(plan, PlanPhase::Completed).await;
    let ours = h.backups_of(plan).await;
    let moved: Vec<_> = velero
        .uploads()
        .into_iter()
        .filter(|u| ours.contains(&u.backup) && u.pvc.starts_with("data-postgres-"))
        .collect();
    assert!(!moved.is_empty(), "the plan backed up a postgres volume");
    assert!(
        moved
            .iter()
            .all(|u| u.moved == CHANGED_BYTES_VALUE && u.size == 20 * GIB),
        "only the changed bytes: {moved:?}"
    );

    // The namespace leaves the policy's protection: its Schedule goes; back in, it comes back.
    let namespaces: Api<Namespace> = Api::all(h.client.clone());
    let env = |v: serde_json::Value| Patch::Merge(json!({"metadata": {"labels": {"env": v}}}));
    namespaces
        .patch("shop", &PatchParams::default(), &env(json!("scratch")))
        .await
        .expect("label shop out of protection");
    eventually_within(
        "the Schedule of an unprotected namespace deleted",
        TIMEOUT,
        || async { schedule_names(&h).await.is_empty().then_some(()) },
    )
    .await;
    namespaces
        .patch(
            "shop",
            &PatchParams::default(),
            &env(serde_json::Value::Null),
        )
        .await
        .expect("label shop back");
    eventually_within("the Schedule back", TIMEOUT, || async {
        (schedule_names(&h).await == ["velero/snapdrain-warm-shop"]).then_some(())
    })
    .await;

    // Off: the Schedule goes (its Backups stay, under their TTL).
    h.set_policy(policy(None)).await;
    eventually_within("the Schedule deleted", TIMEOUT, || async {
        schedule_names(&h).await.is_empty().then_some(())
    })
    .await;
    assert!(
        backups
            .get_opt(&name)
            .await
            .expect("read the Backup")
            .is_some(),
        "the warm Backup stays"
    );
    controller.shutdown().await;
}
