//! Velero's file-system backup data path on the whole simulated world (kubelet, Deployment controller),
//! driven through kube-rs. What is modelled and where it comes from (vmware-tanzu/velero):
//! - 1.17+: a hosting pod per PodVolumeBackup (`pkg/exposer/pod_volume.go` `createHostingPod`): named
//!   after the PVB, controlled by it, labelled `velero.io/pod-volume-backup`, `spec.nodeName` = the
//!   source pod's node, `terminationGracePeriodSeconds: 0`, no toleration of Karpenter's
//!   `karpenter.sh/disrupted` taint (`pkg/util/third_party.go` `ThirdPartyTolerations`); deleted when
//!   its PVB ends (`pkg/controller/pod_volume_backup_controller.go` `OnDataPathCompleted` → `CleanUp`);
//! - a hosting pod that ends while the data moves fails its PVB (`pkg/datapath/micro_service_watcher.go`
//!   `startWatch` → `OnDataPathFailed`) and the backup ends PartiallyFailed (`pkg/podvolume/backupper.go`
//!   `WaitAllPodVolumesProcessed` logs it as an error);
//! - the server's pod going away stops the server; the next one marks InProgress backups Failed and
//!   cancels their PVBs (`pkg/cmd/server/server.go` `markInProgressBackupsFailed`,
//!   `markPodVolumeBackupsCancel`);
//! - ≤ 1.16 (`dataPath: nodeAgent`): the data moves inside the node-agent pod, no hosting pod.

use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::GroupVersionKind;
use kube::{Client, ResourceExt};
use serde_json::json;
use snapdrain_sim::world::Timings;
use snapdrain_sim::world::velero::hosting::PVB_LABEL;
use snapdrain_sim::world::velero::{DataPath, RESTART_FAILURE};
use snapdrain_sim::{ScenarioSource, SimCluster, SimConfig};
use snapdrain_testkit::eventually_within;

const LIMIT: Duration = Duration::from_secs(30);

/// Fast pods; `backup` long enough that a test acts while the data moves (it never waits it out).
fn timings(backup: Duration) -> Timings {
    Timings {
        pod_start: Duration::from_millis(20),
        pod_stop: Duration::from_millis(20),
        volume_detach: Duration::from_millis(20),
        instance_boot: Duration::from_millis(200),
        backup_overhead: backup,
        backup_mib_per_second: 0.0,
        ebs_snapshot_mib_per_second: 0.0,
        ebs_snapshot_per_volume_interval: snapdrain_sim::ec2::PER_VOLUME_INTERVAL,
    }
}

async fn start(timings: Timings, data_path: DataPath) -> (SimCluster, Client) {
    let (mut scenario, label) =
        snapdrain_sim::scenario::resolve("quickstart").expect("the quickstart scenario");
    scenario
        .velero
        .as_mut()
        .expect("quickstart installs Velero")
        .data_path = data_path;
    let cluster = SimCluster::start(SimConfig {
        scenario: Some(ScenarioSource::Inline {
            scenario: Box::new(scenario),
            label,
        }),
        timings: Some(timings),
        ..Default::default()
    })
    .await
    .expect("the scenario starts");
    let client = snapdrain_testkit::client(&cluster);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    eventually_within("postgres-0 running", LIMIT, || async {
        let p = pods.get_opt("postgres-0").await.ok()??;
        (phase(&p) == Some("Running")).then_some(())
    })
    .await;
    eventually_within("the Velero server running", LIMIT, || async {
        server_pod(&client)
            .await
            .filter(|p| phase(p) == Some("Running"))
    })
    .await;
    snapdrain_testkit::node_agents_running(&client).await;
    (cluster, client)
}

fn phase(p: &Pod) -> Option<&str> {
    p.status.as_ref()?.phase.as_deref()
}

fn velero(client: &Client, kind: &str, version: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("velero.io", version, kind);
    Api::namespaced_with(
        client.clone(),
        "velero",
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

fn backups(client: &Client) -> Api<DynamicObject> {
    velero(client, "Backup", "v1", "backups")
}

fn pvbs(client: &Client) -> Api<DynamicObject> {
    velero(client, "PodVolumeBackup", "v1", "podvolumebackups")
}

/// The pod of the Velero Deployment (`velero install` labels it `deploy: velero`).
async fn server_pod(client: &Client) -> Option<Pod> {
    Api::<Pod>::namespaced(client.clone(), "velero")
        .list(&ListParams::default().labels("deploy=velero"))
        .await
        .ok()?
        .items
        .into_iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
}

/// A file-system backup of postgres-0's volume alone.
async fn back_up_postgres_0(client: &Client, name: &str) {
    let backup: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "velero.io/v1", "kind": "Backup",
        "metadata": {"name": name, "namespace": "velero"},
        "spec": {"includedNamespaces": ["shop"], "defaultVolumesToFsBackup": true,
                 "labelSelector": {"matchLabels": {"statefulset.kubernetes.io/pod-name": "postgres-0"}}}
    }))
    .expect("a Backup");
    backups(client)
        .create(&PostParams::default(), &backup)
        .await
        .expect("create the Backup");
}

fn status<'a>(o: &'a DynamicObject, field: &str) -> Option<&'a str> {
    o.data.get("status")?.get(field)?.as_str()
}

async fn wait_backup(client: &Client, name: &str, phases: &[&str]) -> DynamicObject {
    let api = backups(client);
    eventually_within(&format!("backup {name} in {phases:?}"), LIMIT, || async {
        let b = api.get(name).await.ok()?;
        status(&b, "phase")
            .is_some_and(|p| phases.contains(&p))
            .then_some(b)
    })
    .await
}

/// The backup's one PVB once its hosting pod runs the data path (phase InProgress).
async fn pvb_in_progress(client: &Client) -> DynamicObject {
    let api = pvbs(client);
    eventually_within("a PVB InProgress", LIMIT, || async {
        let list = api.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|p| status(p, "phase") == Some("InProgress"))
    })
    .await
}

async fn pvb_named(client: &Client, name: &str) -> DynamicObject {
    pvbs(client).get(name).await.expect("the PVB stays")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_moves_each_volume_in_a_hosting_pod_on_the_source_node() {
    let (_cluster, client) = start(timings(Duration::from_millis(200)), DataPath::HostingPod).await;
    let source_node = Api::<Pod>::namespaced(client.clone(), "shop")
        .get("postgres-0")
        .await
        .expect("postgres-0")
        .spec
        .and_then(|s| s.node_name)
        .expect("scheduled");
    // Every change of a hosting pod, from before the backup: it comes and goes within the backup.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "velero");
    let rv = pods
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("a list has a resourceVersion");
    let stream = pods
        .watch(&WatchParams::default().labels(PVB_LABEL), &rv)
        .await
        .expect("watch the hosting pods");
    back_up_postgres_0(&client, "one").await;
    let mut stream = std::pin::pin!(stream);
    let mut seen: Option<Pod> = None;
    let deleted = tokio::time::timeout(LIMIT, async {
        while let Some(ev) = stream.try_next().await.expect("the watch runs") {
            match ev {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => seen = Some(p),
                WatchEvent::Deleted(p) => return p,
                _ => {}
            }
        }
        panic!("the watch ended before the hosting pod was deleted");
    })
    .await
    .expect("the hosting pod comes and goes within the backup");
    let pod = seen.expect("the hosting pod was seen before its deletion");
    let pvb = pod
        .labels()
        .get(PVB_LABEL)
        .cloned()
        .expect("labelled with its PVB");
    assert_eq!(pod.name_any(), pvb, "named after its PVB");
    assert_eq!(deleted.name_any(), pvb);
    let owner = pod.owner_references().first().cloned().expect("an owner");
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("PodVolumeBackup", pvb.as_str(), Some(true))
    );
    let spec = pod.spec.clone().expect("a spec");
    assert_eq!(spec.node_name.as_deref(), Some(source_node.as_str()));
    assert_eq!(spec.termination_grace_period_seconds, Some(0));
    assert!(
        !spec
            .tolerations
            .iter()
            .flatten()
            .any(|t| t.key.as_deref() == Some("karpenter.sh/disrupted")
                || t.operator.as_deref() == Some("Exists") && t.key.is_none()),
        "a hosting pod tolerates no Karpenter disruption taint: {:?}",
        spec.tolerations
    );
    let done = wait_backup(&client, "one", &["Completed", "PartiallyFailed", "Failed"]).await;
    assert_eq!(status(&done, "phase"), Some("Completed"));
    let p = pvb_named(&client, &pvb).await;
    assert_eq!(status(&p, "phase"), Some("Completed"));
    assert!(status(&p, "snapshotID").is_some_and(|s| !s.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_hosting_pod_fails_its_pvb_and_the_backup_ends_partially_failed() {
    let (_cluster, client) = start(timings(Duration::from_secs(300)), DataPath::HostingPod).await;
    back_up_postgres_0(&client, "cut").await;
    let pvb = pvb_in_progress(&client).await.name_any();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "velero");
    // What an eviction does to it (grace 0): as Karpenter's drain would.
    pods.delete(&pvb, &DeleteParams::default())
        .await
        .expect("delete the hosting pod");
    let done = wait_backup(&client, "cut", &["Completed", "PartiallyFailed", "Failed"]).await;
    assert_eq!(status(&done, "phase"), Some("PartiallyFailed"));
    let p = pvb_named(&client, &pvb).await;
    assert_eq!(status(&p, "phase"), Some("Failed"));
    let message = status(&p, "message").unwrap_or_default();
    assert!(message.starts_with("data path backup failed"), "{message}");
    eventually_within("the hosting pod gone", LIMIT, || async {
        pods.get_opt(&pvb).await.ok()?.is_none().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn losing_the_server_pod_mid_backup_fails_the_backup_and_cancels_its_pvbs() {
    let (_cluster, client) = start(timings(Duration::from_secs(300)), DataPath::HostingPod).await;
    back_up_postgres_0(&client, "restarted").await;
    let pvb = pvb_in_progress(&client).await.name_any();
    let server = server_pod(&client).await.expect("the server pod");
    Api::<Pod>::namespaced(client.clone(), "velero")
        .delete(&server.name_any(), &DeleteParams::default())
        .await
        .expect("delete the server pod");
    let done = wait_backup(
        &client,
        "restarted",
        &["Completed", "PartiallyFailed", "Failed"],
    )
    .await;
    assert_eq!(status(&done, "phase"), Some("Failed"));
    assert_eq!(status(&done, "failureReason"), Some(RESTART_FAILURE));
    let p = pvb_named(&client, &pvb).await;
    assert_eq!(status(&p, "phase"), Some("Canceled"));
    let next = server_pod(&client)
        .await
        .expect("the Deployment made another");
    assert_ne!(next.uid(), server.uid());
    eventually_within("the hosting pod gone", LIMIT, || async {
        Api::<Pod>::namespaced(client.clone(), "velero")
            .get_opt(&pvb)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_1_16_data_path_moves_data_in_the_node_agent_without_a_hosting_pod() {
    let (cluster, client) = start(timings(Duration::from_millis(200)), DataPath::NodeAgent).await;
    back_up_postgres_0(&client, "old").await;
    let done = wait_backup(&client, "old", &["Completed", "PartiallyFailed", "Failed"]).await;
    assert_eq!(status(&done, "phase"), Some("Completed"));
    let list = pvbs(&client)
        .list(&ListParams::default())
        .await
        .expect("PVBs");
    assert_eq!(list.items.len(), 1);
    assert_eq!(status(&list.items[0], "phase"), Some("Completed"));
    assert!(
        !cluster
            .audit
            .since(0)
            .iter()
            .any(|e| e.verb == "hosting-pod"),
        "no hosting pod in the 1.16 data path"
    );
}
