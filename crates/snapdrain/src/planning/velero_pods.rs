//! Velero's own pods that a backup needs while it runs, told apart from their labels and controller
//! (pure). The gate keeps them ([`crate::webhook::decision`]), the hold keeper holds the data-path ones
//! ([`crate::controller::holds`]).
//!
//! - The **data path** of Velero 1.17+ (vmware-tanzu/velero): a file-system backup moves its data in a
//!   hosting pod per PodVolumeBackup, created by the node-agent in the Velero namespace, named after the
//!   PVB, controlled by it and labelled `velero.io/pod-volume-backup: <pvb>`, with `spec.nodeName` the
//!   source pod's node (`pkg/exposer/pod_volume.go` `createHostingPod`,
//!   `pkg/controller/pod_volume_backup_controller.go` `setupExposeParam`); a CSI data-mover backup in a
//!   pod per DataUpload, labelled `velero.io/data-upload: <du>` and controlled by it, on any node
//!   (`pkg/exposer/csi_snapshot.go`, `pkg/controller/data_upload_controller.go`). Both carry no
//!   toleration of `karpenter.sh/disrupted` and no `do-not-disrupt` (unless the node-agent ConfigMap's
//!   `podAnnotations` says so), so Karpenter's termination evicts them in its first tier, next to the
//!   held protected pods; a hosting pod that goes fails its PVB and the backup ends PartiallyFailed.
//! - The **server**: the Velero Deployment's pod, labelled `deploy: velero` by `velero install`
//!   (`pkg/install/deployment.go`) and `name: velero` by the Helm chart
//!   (vmware-tanzu/helm-charts `charts/velero/templates/deployment.yaml`). When it restarts, every
//!   InProgress backup is marked Failed (`pkg/cmd/server/server.go` `markInProgressBackupsFailed`).
//!
//! A data-path pod runs exactly while its PVB or DataUpload is not final: Velero deletes it when the
//! PVB ends, before writing the final phase (`OnDataPathCompleted`/`OnDataPathFailed`/
//! `OnDataPathCancelled` → `CleanUp`), and its container exits when the data path does. So "not
//! finished and not terminating" on the pod itself is "its backup has not ended", read from the pod
//! cache alone (no PVB or DataUpload cache is needed).

use std::borrow::Borrow;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::inventory::{controller_of, is_terminal, is_terminating};
use crate::api::DisruptionPlan;

/// The namespaces Velero runs in as snapdrain knows them: the policy's (`default`) and those of the plans
/// that have not ended, each once.
pub fn velero_namespaces<'a, P: Borrow<DisruptionPlan>>(
    default: &'a str,
    plans: &'a [P],
) -> Vec<&'a str> {
    let mut out = vec![default];
    for p in plans.iter().map(Borrow::borrow) {
        let over = p.status.as_ref().is_some_and(|s| s.phase.is_terminal());
        let ns = p.spec.backup.velero_namespace.as_str();
        if !over && !out.contains(&ns) {
            out.push(ns);
        }
    }
    out
}

/// The label of a PodVolumeBackup's hosting pod (velero `pkg/apis/velero/v1/labels_annotations.go`
/// `PVBLabel`).
pub const PVB_LABEL: &str = "velero.io/pod-volume-backup";
/// The label of a DataUpload's data-mover pod (`DataUploadLabel`).
pub const DATA_UPLOAD_LABEL: &str = "velero.io/data-upload";

/// What a data-path pod moves the data of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataPathOwner {
    PodVolumeBackup(String),
    DataUpload(String),
}

impl DataPathOwner {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::PodVolumeBackup(_) => "PodVolumeBackup",
            Self::DataUpload(_) => "DataUpload",
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Self::PodVolumeBackup(n) | Self::DataUpload(n) => n,
        }
    }
}

/// The PVB or DataUpload whose data `pod` moves: labelled with its name and controlled by it (a label
/// alone, which anyone may set, is not enough).
pub fn data_path_owner(pod: &Pod) -> Option<DataPathOwner> {
    let owner = controller_of(pod)?;
    if !owner.api_version.starts_with("velero.io/") {
        return None;
    }
    let labelled = |label: &str| pod.labels().get(label).is_some_and(|v| *v == owner.name);
    match owner.kind.as_str() {
        "PodVolumeBackup" if labelled(PVB_LABEL) => {
            Some(DataPathOwner::PodVolumeBackup(owner.name.clone()))
        }
        "DataUpload" if labelled(DATA_UPLOAD_LABEL) => {
            Some(DataPathOwner::DataUpload(owner.name.clone()))
        }
        _ => None,
    }
}

/// True when a label says the pod may be a data-path pod (the cheap check before [`data_path_owner`]).
pub fn has_data_path_label<'a>(mut keys: impl Iterator<Item = &'a str>) -> bool {
    keys.any(|k| k == PVB_LABEL || k == DATA_UPLOAD_LABEL)
}

/// The data-path pod `pod` is moving the data of a backup that has not ended, in one of the Velero
/// namespaces `velero_namespaces`: what it moves, or None.
pub fn active_data_path(pod: &Pod, velero_namespaces: &[&str]) -> Option<DataPathOwner> {
    let ns = pod.metadata.namespace.as_deref()?;
    if !velero_namespaces.contains(&ns) || is_terminal(pod) || is_terminating(pod) {
        return None;
    }
    data_path_owner(pod)
}

/// True for the Velero server's pod: labelled as `velero install` or the Helm chart label it, and
/// controlled by a ReplicaSet (of the Deployment), in one of `velero_namespaces`.
pub fn is_velero_server(pod: &Pod, velero_namespaces: &[&str]) -> bool {
    let in_ns = pod
        .metadata
        .namespace
        .as_deref()
        .is_some_and(|ns| velero_namespaces.contains(&ns));
    let labels = pod.labels();
    let labelled = labels.get("deploy").is_some_and(|v| v == "velero")
        || labels.get("name").is_some_and(|v| v == "velero");
    let replicated = controller_of(pod).is_some_and(|o| o.kind == "ReplicaSet");
    in_ns && labelled && replicated
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, labels: serde_json::Value, owner: serde_json::Value, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "x", "namespace": ns, "labels": labels, "ownerReferences": [owner]},
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"phase": phase}
        }))
        .expect("a pod")
    }

    fn pvb_owner(name: &str) -> serde_json::Value {
        json!({"apiVersion": "velero.io/v1", "kind": "PodVolumeBackup", "name": name, "uid": "u", "controller": true})
    }

    #[test]
    fn a_hosting_pod_is_its_pvbs_data_path_while_it_runs() {
        let p = pod(
            "velero",
            json!({PVB_LABEL: "b-1"}),
            pvb_owner("b-1"),
            "Running",
        );
        let owner = Some(DataPathOwner::PodVolumeBackup("b-1".into()));
        assert_eq!(active_data_path(&p, &["velero"]), owner);
        // Not yet running (the image starting) counts: its PVB waits for it.
        let starting = pod(
            "velero",
            json!({PVB_LABEL: "b-1"}),
            pvb_owner("b-1"),
            "Pending",
        );
        assert_eq!(active_data_path(&starting, &["velero"]), owner);
        // Finished, or on its way out: its PVB has ended.
        for phase in ["Succeeded", "Failed"] {
            let done = pod("velero", json!({PVB_LABEL: "b-1"}), pvb_owner("b-1"), phase);
            assert_eq!(active_data_path(&done, &["velero"]), None, "{phase}");
        }
        let mut leaving = p.clone();
        leaving.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().expect("a time"),
            ));
        assert_eq!(active_data_path(&leaving, &["velero"]), None);
        // Outside the Velero namespace it is someone else's pod.
        assert_eq!(active_data_path(&p, &["backup"]), None);
    }

    #[test]
    fn a_label_without_the_controller_is_not_a_data_path_pod() {
        let sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "b-1", "uid": "u", "controller": true});
        assert_eq!(
            data_path_owner(&pod("velero", json!({PVB_LABEL: "b-1"}), sts, "Running")),
            None
        );
        // The label must name the controller.
        assert_eq!(
            data_path_owner(&pod(
                "velero",
                json!({PVB_LABEL: "b-2"}),
                pvb_owner("b-1"),
                "Running"
            )),
            None
        );
        let du = json!({"apiVersion": "velero.io/v2alpha1", "kind": "DataUpload", "name": "d-1", "uid": "u", "controller": true});
        assert_eq!(
            data_path_owner(&pod(
                "velero",
                json!({DATA_UPLOAD_LABEL: "d-1"}),
                du,
                "Running"
            )),
            Some(DataPathOwner::DataUpload("d-1".into()))
        );
    }

    #[test]
    fn the_server_pod_is_known_by_either_installers_labels() {
        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "velero-5d8f", "uid": "u", "controller": true});
        let cli = pod(
            "velero",
            json!({"component": "velero", "deploy": "velero"}),
            rs.clone(),
            "Running",
        );
        let helm = pod(
            "velero",
            json!({"name": "velero", "app.kubernetes.io/name": "velero"}),
            rs.clone(),
            "Running",
        );
        assert!(is_velero_server(&cli, &["velero"]));
        assert!(is_velero_server(&helm, &["velero"]));
        assert!(!is_velero_server(&cli, &["other"]));
        // The node-agent shares `component: velero` but is a DaemonSet's `name: node-agent`.
        let ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "node-agent", "uid": "u", "controller": true});
        let agent = pod(
            "velero",
            json!({"component": "velero", "name": "node-agent"}),
            ds,
            "Running",
        );
        assert!(!is_velero_server(&agent, &["velero"]));
    }
}
