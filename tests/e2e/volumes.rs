//! Each protected volume's class, from its PV, through real interfaces: a StatefulSet pod on a node mounts
//! an EBS volume (provisioned by the simulated EBS CSI driver, zone affinity) and a `local` PV on the node's
//! NVMe (as sig-storage-local-static-provisioner creates them: `spec.local` with a required
//! `kubernetes.io/hostname` affinity). `snapdrain plan NODE` and the plan's status say which is which and
//! how each is backed up; the plan completes with both verified and the safety oracle holds.

use kube::api::Api;
use serde_json::{Value, json};
use snapdrain::api::status::PlanPhase;
use snapdrain::api::volume::{VolumeClass, VolumeMethod};
use snapdrain_testkit::harness::{Harness, TIMEOUT, assert_no_eviction_before_verified_backup};

const NS: &str = "shop";

/// A local PV on `node`, a claim bound to it, and a one-replica StatefulSet `ledger` mounting it as
/// `scratch` beside an EBS claim `data` (`snapdrain_testkit::volumes::local_workload`).
async fn ledger_on(h: &Harness, node: &str) {
    ledger_with_local_size(h, node, "10Gi").await;
}

/// [`ledger_on`] with a local volume of `size` (a Kubernetes quantity) in namespace `shop`.
pub(crate) async fn ledger_with_local_size(h: &Harness, node: &str, size: &str) {
    let ledger = snapdrain_testkit::volumes::LocalWorkload {
        namespace: NS,
        name: "ledger",
        node,
        local_size: size,
        ebs_size: Some("10Gi"),
    };
    snapdrain_testkit::volumes::local_workload(&h.client, &ledger, TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("the ledger workload: {e}"));
}

/// `snapdrain plan NODE` for `spec`: a lookup of its line for a PVC.
async fn preview_lines(h: &Harness, node: &str, spec: Value) -> impl Fn(&str) -> String {
    let spec: snapdrain::api::DisruptionPlanSpec = serde_json::from_value(spec).expect("spec");
    let text = snapdrain::controller::preview::describe(&h.client, node, &spec)
        .await
        .expect("preview");
    move |pvc: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("PVC {pvc} ")))
            .unwrap_or_else(|| panic!("no line for {pvc}:\n{text}"))
            .to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_with_an_ebs_and_a_local_volume_shows_each_class_and_backs_both_up() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    ledger_on(&h, &node).await;

    let line = preview_lines(&h, &node, json!({"nodes": [node]})).await;
    let data = line("data-ledger-0");
    assert!(
        data.contains(": Network, ebs.csi.aws.com (") && data.contains("method FileSystem"),
        "{data}"
    );
    let scratch = line("scratch-ledger-0");
    assert!(
        scratch.contains(": NodeLocal, local (") && scratch.contains(&format!("on node {node}")),
        "{scratch}"
    );

    let controller = h.controller().await;
    let protected = h.protected_pods_on(&node).await;
    assert!(
        protected.contains_key(&format!("{NS}/ledger-0")),
        "{protected:?}"
    );
    h.create_plan("ebs-and-local", json!({"nodes": [node]}))
        .await;
    let plan = h
        .wait_plan("ebs-and-local", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.clone().expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let shop = status
        .backups
        .iter()
        .rfind(|b| b.namespace == NS)
        .expect("a backup of the shop namespace");
    assert!(shop.verified, "{shop:#?}");
    let volume = |pvc: &str| {
        shop.volumes
            .iter()
            .find(|v| v.pvc == pvc)
            .unwrap_or_else(|| panic!("{pvc} recorded in {:#?}", shop.volumes))
    };
    assert_eq!(volume("data-ledger-0").class, VolumeClass::Network);
    assert_eq!(
        volume("data-ledger-0").source.as_deref(),
        Some("ebs.csi.aws.com")
    );
    assert_eq!(volume("scratch-ledger-0").class, VolumeClass::NodeLocal);
    for v in &shop.volumes {
        assert_eq!(v.method, VolumeMethod::FileSystem, "{v:?}");
    }
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &plan);
    controller.shutdown().await;
}

async fn ebs_snapshot_class(h: &Harness) {
    snapdrain_testkit::volumes::ebs_snapshot_class(&h.client)
        .await
        .expect("create the VolumeSnapshotClass");
}

fn data_uploads(h: &Harness) -> Api<kube::api::DynamicObject> {
    use kube::api::{ApiResource, GroupVersionKind};
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("velero.io", "v2alpha1", "DataUpload"),
        "datauploads",
    );
    Api::namespaced_with(h.client.clone(), "velero", &ar)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn auto_snapshots_the_ebs_volume_and_copies_the_local_one_in_one_verified_backup() {
    let h = Harness::start().await;
    ebs_snapshot_class(&h).await;
    let node = h.node_with_statefulset_pods().await;
    ledger_on(&h, &node).await;
    let controller = h.controller().await;
    let protected = h.protected_pods_on(&node).await;
    h.create_plan("auto", json!({"nodes": [node]})).await;
    let plan = h.wait_plan("auto", TIMEOUT, |p| p.is_terminal()).await;
    let status = plan.status.clone().expect("status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let shop = status
        .backups
        .iter()
        .rfind(|b| b.namespace == NS)
        .expect("a backup of the shop namespace");
    assert!(shop.verified, "{shop:#?}");
    let method = |pvc: &str| {
        shop.volumes
            .iter()
            .find(|v| v.pvc == pvc)
            .unwrap_or_else(|| panic!("{pvc} recorded in {:#?}", shop.volumes))
            .method
    };
    assert_eq!(method("data-ledger-0"), VolumeMethod::CsiDataMover);
    assert_eq!(method("scratch-ledger-0"), VolumeMethod::FileSystem);
    // Velero's data mover moved the EBS snapshot's data: one Completed DataUpload per snapshotted claim of
    // the backup, read from the cluster, not from the product's status.
    let uploads = data_uploads(&h)
        .list(&Default::default())
        .await
        .expect("list DataUploads");
    let of_backup: Vec<_> = uploads
        .items
        .iter()
        .filter(|d| {
            d.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("velero.io/backup-name"))
                == Some(&shop.name)
        })
        .collect();
    let claims: Vec<&str> = of_backup
        .iter()
        .filter_map(|d| d.data.pointer("/spec/sourcePVC").and_then(Value::as_str))
        .collect();
    assert!(claims.contains(&"data-ledger-0"), "{claims:?}");
    assert!(!claims.contains(&"scratch-ledger-0"), "{claims:?}");
    for d in &of_backup {
        assert_eq!(
            d.data.pointer("/status/phase").and_then(Value::as_str),
            Some("Completed"),
            "{d:?}"
        );
    }
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &plan);
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_that_never_becomes_ready_fails_the_plan_and_evicts_nothing() {
    let h = Harness::start().await;
    ebs_snapshot_class(&h).await;
    h.cluster
        .velero
        .as_ref()
        .expect("the quickstart runs Velero")
        .inject(snapdrain_sim::world::velero::VeleroFault::SnapshotsNeverReady);
    let node = h.node_with_statefulset_pods().await;
    let controller = h.controller().await;
    let protected = h.protected_pods_on(&node).await;
    h.create_plan(
        "stuck-snapshot",
        json!({"nodes": [node], "backup": {"timeout": "3s", "maxAttempts": 1}}),
    )
    .await;
    let plan = h
        .wait_plan("stuck-snapshot", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.clone().expect("status");
    assert_eq!(status.phase, PlanPhase::Failed, "{status:#?}");
    let message = status.message.clone().unwrap_or_default();
    assert!(message.contains("node left in service"), "{message}");
    assert!(
        h.accepted_evictions().is_empty(),
        "nothing may be evicted: {:?}",
        h.accepted_evictions()
    );
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &plan);
    controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_data_movement_the_ebs_snapshot_stays_ready_in_the_storage_and_counts() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let h = Harness::start().await;
    ebs_snapshot_class(&h).await;
    let node = h.node_with_statefulset_pods().await;
    let controller = h.controller().await;
    let protected = h.protected_pods_on(&node).await;
    h.create_plan(
        "keep-snapshots",
        json!({"nodes": [node], "mode": "Release", "backup": {"snapshotMoveData": false}}),
    )
    .await;
    let plan = h
        .wait_plan_until("keep-snapshots", TIMEOUT, |p| {
            p.status
                .as_ref()
                .is_some_and(|s| !s.backups.is_empty() && s.backups.iter().all(|b| b.verified))
                || p.status.as_ref().is_some_and(|s| s.phase.is_terminal())
        })
        .await;
    let status = plan.status.clone().expect("status");
    let backup = status.backups.last().expect("a backup");
    assert!(backup.verified, "{status:#?}");
    assert!(
        backup
            .volumes
            .iter()
            .all(|v| v.method == VolumeMethod::CsiSnapshot
                && v.snapshot_class.as_deref() == Some("ebs-csi")),
        "{:#?}",
        backup.volumes
    );
    assert!(
        !backup
            .verified_objects
            .iter()
            .any(|o| o.key.contains("/kopia/")),
        "no data went to a kopia repository: {:#?}",
        backup.verified_objects
    );
    // Each claim's snapshot is in the cluster, cut (a handle) and ready, read straight from the API.
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent"),
        "volumesnapshotcontents",
    );
    let contents = Api::<DynamicObject>::all_with(h.client.clone(), &ar)
        .list(&Default::default())
        .await
        .expect("list VolumeSnapshotContents");
    assert!(contents.items.len() >= backup.pvcs.len(), "{contents:?}");
    for c in &contents.items {
        let handle = c
            .data
            .pointer("/status/snapshotHandle")
            .and_then(Value::as_str);
        assert!(handle.is_some_and(|h| h.starts_with("snap-")), "{c:?}");
        assert_eq!(
            c.data.pointer("/status/readyToUse"),
            Some(&json!(true)),
            "{c:?}"
        );
    }
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &plan);
    controller.shutdown().await;
}

/// The answer to a dry-run eviction of `ns/name` through the API server (and so the gate): its code.
async fn dry_run_eviction(h: &Harness, ns: &str, name: &str) -> u16 {
    match snapdrain_testkit::eviction::evict_with(&h.client, ns, name, json!({}), "?dryRun=All")
        .await
    {
        Ok(_) => 201,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("eviction of {ns}/{name} got no answer: {e}"),
    }
}

/// `releaseNetworkVolumesAt: Snapshot` (allowed by the policy), a Release plan on a node with EBS-only
/// postgres pods and the ledger pod (EBS + a local NVMe PV), all in one namespace and so one Velero
/// Backup, the gate failing closed, Velero moving data at 2 GiB/s. Once Velero's CSI snapshots of an EBS-only pod's claims are cut, the pod is released loudly
/// and the gate lets it go while its backup is still moving to the bucket; the ledger pod stays held and
/// refused until its backup (the local volume's file-system copy) is verified, then goes too. The oracle
/// accepts the early eviction only because the simulated CSI driver
/// itself cut the claim's volume, for this plan's Backup, before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn network_volumes_go_at_their_csi_snapshot_and_a_local_volume_waits_for_the_verified_copy() {
    let mut timings = snapdrain_testkit::harness::fast_timings();
    timings.backup_mib_per_second = 2048.0;
    let h = Harness::start_with(timings).await;
    ebs_snapshot_class(&h).await;
    h.set_policy(json!({"planSettings": {"allowReleaseAtSnapshot": true}}))
        .await;
    let controller = snapdrain_testkit::gate::controller_with_gate(
        &h,
        "Fail",
        snapdrain::webhook::Lifetimes::default(),
        std::time::Duration::from_secs(30),
    )
    .await;
    let node = h.node_with_statefulset_pods().await;
    ledger_on(&h, &node).await;
    let protected = h.protected_pods_on(&node).await;
    let ebs_only: Vec<String> = protected
        .iter()
        .filter(|(_, claims)| !claims.iter().any(|c| c.starts_with("scratch-")))
        .map(|(p, _)| p.clone())
        .collect();
    assert!(!ebs_only.is_empty(), "{protected:?}");
    // `snapdrain plan` says where each volume's pod may go.
    let line = preview_lines(
        &h,
        &node,
        json!({"nodes": [node], "mode": "Release", "backup": {"releaseNetworkVolumesAt": "Snapshot"}}),
    )
    .await;
    let data = line("data-ledger-0");
    assert!(data.contains("may go at the CSI snapshot"), "{data}");
    let scratch = line("scratch-ledger-0");
    assert!(
        scratch.contains("goes once the backup is verified"),
        "{scratch}"
    );
    h.create_plan(
        "at-the-cut",
        json!({"nodes": [node], "mode": "Release",
               "backup": {"releaseNetworkVolumesAt": "Snapshot"}}),
    )
    .await;
    let released = h
        .wait_plan_until("at-the-cut", TIMEOUT, |p| {
            p.status.as_ref().is_some_and(|s| {
                s.phase.is_terminal()
                    || ebs_only.iter().all(|pod| {
                        s.released_pods
                            .iter()
                            .any(|r| &format!("{}/{}", r.namespace, r.name) == pod)
                    })
            })
        })
        .await;
    let status = released.status.clone().expect("status");
    assert!(!status.phase.is_terminal(), "{status:#?}");
    assert!(
        !status
            .released_pods
            .iter()
            .any(|r| r.namespace == NS && r.name == "ledger-0"),
        "the ledger pod's local volume is not released at a snapshot: {status:#?}"
    );
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "ReleasedAtSnapshot")
        .expect("the ReleasedAtSnapshot condition");
    assert!(
        condition.message.contains("NOT at a verified copy")
            && condition.message.contains("CSI snapshot"),
        "{}",
        condition.message
    );
    // Evict the released pods now (as their disruptor would, retrying a 429: the gate decides from its
    // own copy of the plan, which follows the status write); ask the gate about the ledger pod.
    for pod in &ebs_only {
        let (ns, name) = pod.split_once('/').expect("ns/name");
        snapdrain_testkit::eventually_within(
            "the gate lets the pod go at its snapshot",
            TIMEOUT,
            || async {
                snapdrain_testkit::eviction::evict_with(&h.client, ns, name, json!({}), "")
                    .await
                    .ok()
            },
        )
        .await;
    }
    let ledger = dry_run_eviction(&h, NS, "ledger-0").await;
    let after: snapdrain::api::DisruptionPlan = Api::all(h.client.clone())
        .get("at-the-cut")
        .await
        .expect("read the plan");
    let shop_verified = after
        .status
        .as_ref()
        .is_some_and(|s| s.backups.iter().any(|b| b.namespace == NS && b.verified));
    if !shop_verified {
        assert_eq!(ledger, 429, "the ledger pod waits for the verified copy");
    }

    // A Release plan ends when its disruptor takes the node: here, once the backup is verified, the test
    // evicts the ledger pod as that disruptor would, and the gate lets it.
    let plan = h
        .wait_plan_until("at-the-cut", TIMEOUT, |p| {
            p.status.as_ref().is_some_and(|s| {
                s.phase.is_terminal()
                    || (!s.backups.is_empty() && s.backups.iter().all(|b| b.verified))
            })
        })
        .await;
    let status = plan.status.clone().expect("status");
    assert!(!status.phase.is_terminal(), "{status:#?}");
    snapdrain_testkit::eventually_within(
        "the gate lets the ledger pod go once its backup is verified",
        TIMEOUT,
        || async {
            snapdrain_testkit::eviction::evict_with(&h.client, NS, "ledger-0", json!({}), "")
                .await
                .ok()
        },
    )
    .await;
    for b in &status.backups {
        assert!(b.verified, "{b:#?}");
        for v in &b.volumes {
            let network = v.class == VolumeClass::Network;
            assert_eq!(
                v.release_at == snapdrain::api::plan::ReleasePoint::Snapshot,
                network,
                "{v:#?}"
            );
            assert_eq!(v.snapshot.is_some(), network, "{v:#?}");
            if let Some(s) = &v.snapshot {
                assert!(s.handle.starts_with("snap-") && s.cut_at.is_some(), "{s:?}");
            }
        }
    }
    // Each EBS-only pod went before its namespace's backup was verified (the release at the cut), and
    // the judge, reading the simulated CSI driver's own cuts, finds every eviction covered.
    let audit = h.audit();
    for pod in &ebs_only {
        let ns = pod.split_once('/').map(|(ns, _)| ns).unwrap_or_default();
        let evicted = snapdrain_testkit::safety::pods_removed(&audit)
            .into_iter()
            .find(|e| &e.pod == pod)
            .unwrap_or_else(|| panic!("{pod} evicted"));
        let verified = status
            .backups
            .iter()
            .filter(|b| b.namespace == ns)
            .filter_map(|b| b.verified_at.as_ref())
            .map(|t| t.0)
            .min()
            .expect("verified");
        let at: jiff::Timestamp = evicted.time.parse().expect("an audit time");
        assert!(
            at < verified,
            "{pod} evicted at {at}, verified at {verified}"
        );
    }
    h.assert_no_eviction_before_saved(&protected, &plan).await;
    controller.shutdown().await;
}

/// A plan with a deadline two minutes away on a node whose ledger pod has 500 GiB on local NVMe: at the
/// controller's copy rate (100 MiB/s here) Velero needs about 85 minutes, so the plan
/// says when it is made, in a Warning Event, that this volume will not be protected in time and dies with
/// the node; the EBS claims, which EC2 may cut at once, are not named. Each volume's size and expected
/// copy time are in the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_under_a_deadline_names_the_local_volume_it_cannot_protect_in_time() {
    // Velero at 100 MiB/s in the world, and so in the controller's estimate (the harness tells it the
    // world's rate).
    let mut timings = snapdrain_testkit::harness::fast_timings();
    timings.backup_mib_per_second = 100.0;
    let h = Harness::start_with(timings).await;
    let node = h.node_with_statefulset_pods().await;
    ledger_with_local_size(&h, &node, "500Gi").await;
    let controller = h.controller().await;
    let deadline = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(120);
    h.create_plan(
        "deadline",
        json!({"nodes": [node], "mode": "Release", "deadline": deadline.to_string()}),
    )
    .await;
    let plan = h
        .wait_plan_until("deadline", TIMEOUT, |p| {
            p.status.as_ref().is_some_and(|s| !s.backups.is_empty())
        })
        .await;
    let events = snapdrain_testkit::eventually_within("the PlanWarning Event", TIMEOUT, || async {
        let notes: Vec<String> = crate::emergency::warning_events(&h, "deadline", "PlanWarning")
            .await
            .into_iter()
            .filter_map(|e| e.note)
            .collect();
        (!notes.is_empty()).then_some(notes)
    })
    .await;
    let late: Vec<&String> = events
        .iter()
        .filter(|n| n.contains("will not be protected in time"))
        .collect();
    assert_eq!(late.len(), 1, "{events:#?}");
    assert!(
        late[0].contains("shop/scratch-ledger-0") && late[0].contains("dies with the node"),
        "{}",
        late[0]
    );
    let shop = plan
        .status
        .as_ref()
        .and_then(|s| s.backups.iter().find(|b| b.namespace == NS))
        .expect("a backup of the shop namespace");
    let scratch = shop
        .volumes
        .iter()
        .find(|v| v.pvc == "scratch-ledger-0")
        .expect("the local volume");
    assert_eq!(scratch.size_bytes, Some(500 << 30));
    assert_eq!(scratch.expected_seconds, Some(5120), "500 GiB at 100 MiB/s");
    controller.shutdown().await;
}
