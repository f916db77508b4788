//! Volume fixtures through the API: the EBS CSI driver's VolumeSnapshotClass, and a StatefulSet pod on a
//! node's local NVMe (a `local` PV in the shape sig-storage-local-static-provisioner gives its PVs: `spec.local`
//! with a required `kubernetes.io/hostname` affinity), optionally beside an EBS claim that the simulated
//! EBS CSI driver provisions. Shared by the e2e tests and `snapdrain bench --only volumes`.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

/// The EBS CSI driver's VolumeSnapshotClass, labelled for Velero (velero `pkg/util/csi/volume_snapshot.go`
/// picks the class of a driver by the `velero.io/csi-volumesnapshot-class` label).
pub async fn ebs_snapshot_class(client: &Client) -> kube::Result<()> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshotClass"),
        "volumesnapshotclasses",
    );
    let class: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
        "metadata": {"name": "ebs-csi", "labels": {"velero.io/csi-volumesnapshot-class": "true"}},
        "driver": "ebs.csi.aws.com",
        "deletionPolicy": "Delete",
    }))
    .expect("a VolumeSnapshotClass from JSON");
    Api::<DynamicObject>::all_with(client.clone(), &ar)
        .create(&PostParams::default(), &class)
        .await
        .map(|_| ())
}

/// What [`local_workload`] makes.
#[derive(Clone, Debug)]
pub struct LocalWorkload<'a> {
    pub namespace: &'a str,
    /// The StatefulSet; its one pod is `<name>-0`.
    pub name: &'a str,
    pub node: &'a str,
    /// The local PV's size (a Kubernetes quantity); its claim is `scratch-<name>-0`.
    pub local_size: &'a str,
    /// An EBS claim `data-<name>-0` of this size (storage class gp3) beside it, or none.
    pub ebs_size: Option<&'a str>,
}

/// A local PV on the workload's node, the claim bound to it, and a one-replica StatefulSet mounting it as
/// `scratch` (and the EBS claim as `data`); returns once the pod runs on the node (within `within`).
pub async fn local_workload(
    client: &Client,
    w: &LocalWorkload<'_>,
    within: Duration,
) -> Result<(), String> {
    let LocalWorkload {
        namespace: ns,
        name,
        node,
        local_size,
        ebs_size,
    } = *w;
    let claim = format!("scratch-{name}-0");
    let pv_name = format!("local-pv-{name}-{}", &node[node.len().saturating_sub(8)..]);
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": local_size},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "local-nvme",
            "volumeMode": "Filesystem",
            "local": {"path": "/mnt/disks/nvme1n1"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": ns, "name": claim},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
        },
    }))
    .map_err(|e| e.to_string())?;
    let made = |what: &str, e: kube::Error| format!("create {what}: {e}");
    Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .map_err(|e| made("the local PV", e))?;
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": ns, "labels": {"app": name}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-nvme", "volumeName": pv_name,
                 "resources": {"requests": {"storage": local_size}}},
    }))
    .map_err(|e| e.to_string())?;
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pvc)
        .await
        .map_err(|e| made("the local claim", e))?;
    let template = |claim: &str, class: &str, size: &str| {
        json!({"metadata": {"name": claim, "labels": {"app": name}},
               "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                        "resources": {"requests": {"storage": size}}}})
    };
    let mut templates = vec![template("scratch", "local-nvme", local_size)];
    let mut mounts = vec![json!({"name": "scratch", "mountPath": "/scratch"})];
    if let Some(size) = ebs_size {
        templates.insert(0, template("data", "gp3", size));
        mounts.insert(0, json!({"name": "data", "mountPath": "/data"}));
    }
    let sts: Value = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": name, "image": format!("{name}:1"),
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                    "volumeMounts": mounts}]},
            },
            "volumeClaimTemplates": templates,
        },
    });
    let sts: StatefulSet = serde_json::from_value(sts).map_err(|e| e.to_string())?;
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sts)
        .await
        .map_err(|e| made("the StatefulSet", e))?;
    let pod = format!("{name}-0");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let running = || async {
        let p = pods.get_opt(&pod).await.ok()??;
        let on_node = p.spec.as_ref()?.node_name.as_deref() == Some(node);
        let phase = p.status.as_ref()?.phase.as_deref() == Some("Running");
        (on_node && phase).then_some(())
    };
    tokio::time::timeout(within, async {
        while running().await.is_none() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .map_err(|_| format!("{ns}/{pod} was not running on {node} within {within:?}"))
}
