//! EBS snapshots of the EC2 simulator through the real aws-sdk-ec2 over HTTP: CreateSnapshots (every
//! volume of an instance at one instant), CreateSnapshot, DescribeSnapshots, and their errors.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    CopyTagsFromSource, Filter, InstanceSpecification, ResourceType, SnapshotState, Tag,
    TagSpecification,
};
use snapdrain::cloud::ec2::Ec2Cloud;
use snapdrain_sim::ec2::{AttachedVolume, Ec2Sim, Ec2SimConfig, InstanceInfo};

const PLAN_TAG: &str = "snapdrain.io/plan-uid";

async fn start(snapshot_mib_per_second: f64) -> (Ec2Sim, Client) {
    let sim = Ec2Sim::start(Ec2SimConfig {
        snapshot_mib_per_second,
        ..Ec2SimConfig::default()
    })
    .await
    .unwrap();
    let cloud = Ec2Cloud::with_endpoint(&sim.endpoint(), "us-west-2", Some(("test", "test"))).await;
    (sim, cloud.client().clone())
}

/// A running instance with data volumes of these sizes (GiB), each tagged `CSIVolumeName=pv-<n>`.
fn instance_with_volumes(sim: &Ec2Sim, id: &str, sizes: &[u64]) -> Vec<String> {
    sim.insert_running(InstanceInfo {
        id: id.into(),
        instance_type: "m5.large".into(),
        image_id: "ami-0abcdef1234567890".into(),
        zone: "us-west-2a".into(),
        subnet_id: sim.config().subnets[0].id.clone(),
        ..InstanceInfo::default()
    })
    .unwrap();
    sizes
        .iter()
        .enumerate()
        .map(|(n, size)| {
            let volume_id = format!("vol-{n:02}{}", &id[2..]);
            sim.attach_volume(
                id,
                AttachedVolume {
                    volume_id: volume_id.clone(),
                    size_gib: *size,
                    device: format!("/dev/xvdb{n}"),
                    boot: false,
                    tags: BTreeMap::from([("CSIVolumeName".into(), format!("pv-{n}"))]),
                },
            )
            .unwrap();
            volume_id
        })
        .collect()
}

fn plan_tags(uid: &str) -> TagSpecification {
    TagSpecification::builder()
        .resource_type(ResourceType::Snapshot)
        .tags(Tag::builder().key(PLAN_TAG).value(uid).build())
        .build()
}

fn by_plan(uid: &str) -> Filter {
    Filter::builder()
        .name(format!("tag:{PLAN_TAG}"))
        .values(uid)
        .build()
}

/// EC2 API reference, CreateSnapshots: one snapshot per attached volume, crash-consistent across the
/// instance (one start time), the root volume left out with `ExcludeBootVolume`, request tags and
/// (`CopyTagsFromSource=volume`) the volume's tags on each, answered `pending`.
#[tokio::test]
async fn create_snapshots_cuts_every_data_volume_of_the_instance_at_once() {
    let (sim, client) = start(1024.0).await;
    let volumes = instance_with_volumes(&sim, "i-0aaaaaaaaaaaaaaa1", &[4, 6]);
    let out = client
        .create_snapshots()
        .instance_specification(
            InstanceSpecification::builder()
                .instance_id("i-0aaaaaaaaaaaaaaa1")
                .exclude_boot_volume(true)
                .build(),
        )
        .tag_specifications(plan_tags("uid-1"))
        .copy_tags_from_source(CopyTagsFromSource::Volume)
        .description("snapdrain emergency snapshot")
        .send()
        .await
        .unwrap();
    let set = out.snapshots();
    let mut got: Vec<&str> = set.iter().filter_map(|s| s.volume_id()).collect();
    got.sort();
    assert_eq!(got, volumes.iter().map(String::as_str).collect::<Vec<_>>());
    for s in set {
        assert_eq!(s.state(), Some(&SnapshotState::Pending));
        assert!(s.snapshot_id().is_some_and(|id| id.starts_with("snap-")));
        assert_eq!(s.owner_id(), Some("123456789012"));
        let tags: BTreeMap<&str, &str> = s
            .tags()
            .iter()
            .filter_map(|t| Some((t.key()?, t.value()?)))
            .collect();
        assert_eq!(tags.get(PLAN_TAG), Some(&"uid-1"));
        assert!(
            tags.get("CSIVolumeName")
                .is_some_and(|v| v.starts_with("pv-"))
        );
        assert!(s.progress().is_some_and(|p| p.ends_with('%')));
    }
    assert_eq!(set[0].start_time(), set[1].start_time(), "one instant");
    assert_eq!(set.iter().filter_map(|s| s.volume_size()).sum::<i32>(), 10);

    // Without ExcludeBootVolume the root volume is in the set too.
    instance_with_volumes(&sim, "i-0bbbbbbbbbbbbbbb2", &[1]);
    let out = client
        .create_snapshots()
        .instance_specification(
            InstanceSpecification::builder()
                .instance_id("i-0bbbbbbbbbbbbbbb2")
                .build(),
        )
        .send()
        .await
        .unwrap();
    let root = &sim.attached_volumes("i-0bbbbbbbbbbbbbbb2").unwrap()[0];
    assert!(root.boot);
    assert_eq!(out.snapshots().len(), 2);
    assert!(
        out.snapshots()
            .iter()
            .any(|s| s.volume_id() == Some(root.volume_id.as_str()))
    );
}

/// DescribeSnapshots by tag filter and owner `self`: `pending` with `NN%` progress, then `completed` at
/// 100% once the volume's size has been copied at the simulator's rate; by SnapshotId; another owner's
/// (`amazon`) are not the account's.
#[tokio::test]
async fn describe_snapshots_follows_pending_to_completed_by_tag() {
    // 4 GiB at 1 GiB/s: four seconds pending, ample for the first look on a loaded machine.
    let (sim, client) = start(1024.0).await;
    instance_with_volumes(&sim, "i-0ccccccccccccccc3", &[4]);
    let made = client
        .create_snapshots()
        .instance_specification(
            InstanceSpecification::builder()
                .instance_id("i-0ccccccccccccccc3")
                .exclude_boot_volume(true)
                .build(),
        )
        .tag_specifications(plan_tags("uid-3"))
        .send()
        .await
        .unwrap();
    let id = made.snapshots()[0].snapshot_id().unwrap().to_string();
    let describe = || {
        client
            .describe_snapshots()
            .owner_ids("self")
            .filters(by_plan("uid-3"))
            .send()
    };
    let first = describe().await.unwrap();
    assert_eq!(first.snapshots().len(), 1);
    let s = &first.snapshots()[0];
    assert_eq!(s.snapshot_id(), Some(id.as_str()));
    assert_eq!(s.state(), Some(&SnapshotState::Pending));
    let pct = s.progress().unwrap();
    assert!(
        regex::Regex::new(r"^\d{1,2}%$").unwrap().is_match(pct),
        "{pct}"
    );
    let done = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let out = describe().await.unwrap();
            let s = out.snapshots()[0].clone();
            if s.state() != Some(&SnapshotState::Pending) {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("completed within 20 s");
    assert_eq!(done.state(), Some(&SnapshotState::Completed));
    assert_eq!(done.progress(), Some("100%"));

    let by_id = client
        .describe_snapshots()
        .snapshot_ids(&id)
        .send()
        .await
        .unwrap();
    assert_eq!(by_id.snapshots().len(), 1);
    let none = client
        .describe_snapshots()
        .filters(by_plan("another-plan"))
        .send()
        .await
        .unwrap();
    assert!(none.snapshots().is_empty());
    let amazon = client
        .describe_snapshots()
        .owner_ids("amazon")
        .send()
        .await
        .unwrap();
    assert!(amazon.snapshots().is_empty());
}

/// EC2 API reference, "Error codes": an unknown instance is `InvalidInstanceID.NotFound`, an unknown
/// snapshot `InvalidSnapshot.NotFound`, an unknown volume `InvalidVolume.NotFound`; a second snapshot of
/// a volume within 15 s is `SnapshotCreationPerVolumeRateExceeded`, and a refused CreateSnapshots starts
/// none of its snapshots.
#[tokio::test]
async fn snapshot_errors_name_what_is_wrong() {
    let (sim, client) = start(0.0).await;
    let volumes = instance_with_volumes(&sim, "i-0ddddddddddddddd4", &[1, 1]);
    let spec = |id: &str| {
        InstanceSpecification::builder()
            .instance_id(id)
            .exclude_boot_volume(true)
            .build()
    };
    let err = client
        .create_snapshots()
        .instance_specification(spec("i-0fffffffffffffff9"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidInstanceID.NotFound"), "{err:?}");
    let err = client
        .describe_snapshots()
        .snapshot_ids("snap-0123456789abcdef0")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidSnapshot.NotFound"), "{err:?}");
    let err = client
        .create_snapshot()
        .volume_id("vol-0123456789abcdef0")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidVolume.NotFound"), "{err:?}");

    // CreateSnapshot of one attached volume answers `status` (the SDK's state) at once.
    let one = client
        .create_snapshot()
        .volume_id(&volumes[0])
        .tag_specifications(plan_tags("uid-4"))
        .send()
        .await
        .unwrap();
    assert_eq!(one.volume_id(), Some(volumes[0].as_str()));
    assert_eq!(
        one.state(),
        Some(&SnapshotState::Completed),
        "rate 0: at once"
    );
    assert_eq!(one.volume_size(), Some(1));

    let err = client
        .create_snapshots()
        .instance_specification(spec("i-0ddddddddddddddd4"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some("SnapshotCreationPerVolumeRateExceeded"),
        "{err:?}"
    );
    assert_eq!(sim.snapshots().len(), 1, "the refused call started nothing");
}

/// A snapshot EC2 cannot finish ends in `error` (EC2 `SnapshotState`), with a status message.
#[tokio::test]
async fn a_failing_volume_ends_its_snapshot_in_error() {
    let (sim, client) = start(0.0).await;
    let volumes = instance_with_volumes(&sim, "i-0eeeeeeeeeeeeeee5", &[1]);
    sim.fail_snapshots_of(&volumes[0]);
    let out = client
        .create_snapshots()
        .instance_specification(
            InstanceSpecification::builder()
                .instance_id("i-0eeeeeeeeeeeeeee5")
                .exclude_boot_volume(true)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let id = out.snapshots()[0].snapshot_id().unwrap();
    let d = client
        .describe_snapshots()
        .snapshot_ids(id)
        .send()
        .await
        .unwrap();
    let s = &d.snapshots()[0];
    assert_eq!(s.state(), Some(&SnapshotState::Error));
    assert!(s.state_message().is_some_and(|m| !m.is_empty()));
}

/// The `ec2` fault rules throttle the snapshot actions like any other (`RequestLimitExceeded`, EC2 API
/// reference "Request throttling"), and nothing is created while they do.
#[tokio::test]
async fn fault_rules_throttle_create_snapshots() {
    use snapdrain_sim::apiserver::faults::{FaultRule, Faults};
    let (sim, client) = start(0.0).await;
    instance_with_volumes(&sim, "i-0fafafafafafafaf6", &[1]);
    let faults = std::sync::Arc::new(Faults::default());
    sim.attach_faults(faults.clone());
    let rule: FaultRule = serde_json::from_value(serde_json::json!({"kind": "ec2",
        "code": "RequestLimitExceeded", "operation": "CreateSnapshots", "errorRate": 1.0, "times": 20}))
    .unwrap();
    rule.validate().unwrap();
    faults.add(rule);
    let err = client
        .create_snapshots()
        .instance_specification(
            InstanceSpecification::builder()
                .instance_id("i-0fafafafafafafaf6")
                .build(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("RequestLimitExceeded"), "{err:?}");
    assert!(sim.snapshots().is_empty());
}

fn emergency_request(instance: &str, uid: &str) -> snapdrain::cloud::ebs::InstanceSnapshotRequest {
    snapdrain::cloud::ebs::InstanceSnapshotRequest {
        instance_id: instance.into(),
        exclude: vec![],
        tags: BTreeMap::from([(PLAN_TAG.to_string(), uid.to_string())]),
        description: "snapdrain emergency snapshot".into(),
    }
}

/// The product's client: a second pass for the same plan (a restart after the call) finds the set by its
/// tag and cuts nothing; `ExcludeDataVolumeId` leaves an unprotected volume out. EC2's 15 s per-volume
/// rate is off here, so only the tag lookup stands between a restart and a second set.
#[tokio::test]
async fn the_client_cuts_a_plans_set_once_and_finds_it_again_by_tag() {
    use snapdrain::cloud::ebs::{EnsuredSnapshots, ensure_instance_snapshots};
    let sim = Ec2Sim::start(Ec2SimConfig {
        snapshot_mib_per_second: 1024.0,
        snapshot_per_volume_interval: Duration::ZERO,
        ..Ec2SimConfig::default()
    })
    .await
    .unwrap();
    let cloud = Ec2Cloud::with_endpoint(&sim.endpoint(), "us-west-2", Some(("test", "test"))).await;
    let volumes = instance_with_volumes(&sim, "i-0abababababababa7", &[2, 3, 1]);
    let mut req = emergency_request("i-0abababababababa7", "uid-7");
    req.exclude = vec![volumes[2].clone()];
    let wanted = vec![volumes[0].clone(), volumes[1].clone()];
    let found = |e| match e {
        EnsuredSnapshots::Found { snapshots, created } => (snapshots, created),
        other => panic!("the set, not {other:?}"),
    };
    let (first, created) = found(
        ensure_instance_snapshots(&cloud, &req, &wanted, PLAN_TAG, "uid-7")
            .await
            .unwrap(),
    );
    assert!(created);
    let mut cut: Vec<&str> = first.iter().map(|s| s.volume_id.as_str()).collect();
    cut.sort();
    assert_eq!(cut, [volumes[0].as_str(), volumes[1].as_str()]);
    let (again, created) = found(
        ensure_instance_snapshots(&cloud, &req, &wanted, PLAN_TAG, "uid-7")
            .await
            .unwrap(),
    );
    assert!(!created);
    let mut ids: Vec<&str> = again.iter().map(|s| s.snapshot_id.as_str()).collect();
    let mut first_ids: Vec<&str> = first.iter().map(|s| s.snapshot_id.as_str()).collect();
    ids.sort();
    first_ids.sort();
    assert_eq!(ids, first_ids);
    assert_eq!(sim.snapshots().len(), 2, "cut once");
}

/// A volume cut moments ago by someone else (no plan tag) is refused by EC2's per-volume rate, and the
/// client says so instead of pretending the plan's set exists: it answers with that volume's newest
/// snapshot and its start, as the simulated EC2 recorded it, so the plan can wait out the window.
#[tokio::test]
async fn the_client_reports_a_refused_cut_with_the_snapshot_that_holds_the_window() {
    use snapdrain::cloud::ebs::{EnsuredSnapshots, ensure_instance_snapshots};
    let (sim, client) = start(0.0).await;
    let cloud = Ec2Cloud::with_endpoint(&sim.endpoint(), "us-west-2", Some(("test", "test"))).await;
    let volumes = instance_with_volumes(&sim, "i-0cdcdcdcdcdcdcd8", &[1]);
    let other = client
        .create_snapshot()
        .volume_id(&volumes[0])
        .send()
        .await
        .unwrap();
    let answer = ensure_instance_snapshots(
        &cloud,
        &emergency_request("i-0cdcdcdcdcdcdcd8", "uid-8"),
        &volumes,
        PLAN_TAG,
        "uid-8",
    )
    .await
    .unwrap();
    let EnsuredSnapshots::TooSoon { newest } = answer else {
        panic!("refused, not {answer:?}");
    };
    let recorded = sim.snapshots();
    let [record] = &recorded[..] else {
        panic!("only the other snapshot: {recorded:#?}");
    };
    let [last] = &newest[..] else {
        panic!("one volume's newest: {newest:#?}");
    };
    assert_eq!(last.volume_id, volumes[0]);
    assert_eq!(Some(last.snapshot_id.as_str()), other.snapshot_id());
    assert_eq!(last.snapshot_id, record.id);
    assert_eq!(last.started, record.start_time);
}

/// In the simulated cluster EC2 sees what the EBS CSI driver attached: a StatefulSet pod's 500 GiB claim on
/// a Node whose `spec.providerID` names an instance is one of that instance's volumes (its VolumeAttachment),
/// sized and tagged as the driver provisions it, and is gone from it once the VolumeAttachment is.
#[tokio::test]
async fn the_cluster_tells_ec2_which_ebs_volumes_each_instance_has() {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
    use snapdrain_sim::world::Timings;
    use snapdrain_sim::{SimCluster, SimConfig};
    use snapdrain_testkit::eventually;

    let cluster = SimCluster::start(SimConfig {
        world: true,
        timings: Some(Timings {
            pod_start: Duration::from_millis(30),
            pod_stop: Duration::from_millis(30),
            volume_detach: Duration::from_millis(30),
            ..Timings::instant()
        }),
        ..Default::default()
    })
    .await
    .expect("cluster starts");
    let kube = kube::Client::try_from(cluster.kube_config()).expect("client");
    let sim = cluster.ec2.clone().expect("the world runs EC2");
    let instance = "i-0123456789abcdef0";
    sim.insert_running(InstanceInfo {
        id: instance.into(),
        instance_type: "m5.large".into(),
        image_id: "ami-0abcdef1234567890".into(),
        zone: "us-west-2a".into(),
        subnet_id: sim.config().subnets[0].id.clone(),
        ..InstanceInfo::default()
    })
    .unwrap();
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "us-west-2a", "kubernetes.io/hostname": "n1"}},
        "spec": {"providerID": format!("aws:///us-west-2a/{instance}")},
    }))
    .unwrap();
    Api::<Node>::all(kube.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let set: StatefulSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pg"},
        "spec": {
            "replicas": 1, "serviceName": "pg",
            "selector": {"matchLabels": {"app": "pg"}},
            "template": {"metadata": {"labels": {"app": "pg"}},
                         "spec": {"containers": [{"name": "db", "image": "postgres:17"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                                      "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "500Gi"}}}}],
        },
    }))
    .unwrap();
    let sets: Api<StatefulSet> = Api::default_namespaced(kube.clone());
    sets.create(&PostParams::default(), &set).await.unwrap();
    let vas: Api<VolumeAttachment> = Api::all(kube.clone());
    eventually("the claim's volume attached to n1", || async {
        vas.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|v| v.spec.node_name == "n1" && v.status.as_ref().is_some_and(|s| s.attached))
    })
    .await;
    let pv_name = Api::<PersistentVolumeClaim>::default_namespaced(kube.clone())
        .get("data-pg-0")
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .unwrap();
    let pv = Api::<PersistentVolume>::all(kube.clone())
        .get(&pv_name)
        .await
        .unwrap();
    let handle = pv.spec.unwrap().csi.unwrap().volume_handle;

    let cloud = Ec2Cloud::with_endpoint(&sim.endpoint(), "us-west-2", Some(("test", "test"))).await;
    let out = cloud
        .client()
        .create_snapshots()
        .instance_specification(
            InstanceSpecification::builder()
                .instance_id(instance)
                .exclude_boot_volume(true)
                .build(),
        )
        .copy_tags_from_source(CopyTagsFromSource::Volume)
        .send()
        .await
        .unwrap();
    assert_eq!(out.snapshots().len(), 1, "{out:?}");
    let s = &out.snapshots()[0];
    assert_eq!(s.volume_id(), Some(handle.as_str()));
    assert_eq!(s.volume_size(), Some(500));
    let tags: BTreeMap<&str, &str> = s
        .tags()
        .iter()
        .filter_map(|t| Some((t.key()?, t.value()?)))
        .collect();
    assert_eq!(tags.get("CSIVolumeName"), Some(&pv_name.as_str()));
    assert_eq!(
        tags.get("kubernetes.io/created-for/pvc/name"),
        Some(&"data-pg-0")
    );
    assert_eq!(tags.get("ebs.csi.aws.com/cluster"), Some(&"true"));

    sets.patch(
        "pg",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(kube.clone());
    eventually("pg-0 gone and its volume detached", || async {
        let gone = pods.get_opt("pg-0").await.unwrap().is_none();
        let detached = vas
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty();
        (gone && detached).then_some(())
    })
    .await;
    let left = sim.attached_volumes(instance).unwrap();
    assert_eq!(left.len(), 1, "only the root volume: {left:?}");
    assert!(left[0].boot);
}
