//! Velero 1.17+ file-system backup data path: for each PodVolumeBackup the node-agent creates a hosting
//! pod on the source pod's node, and the data moves inside it (the VGDP micro-service, velero
//! `changelogs/CHANGELOG-1.17.md`). What the simulation takes from upstream (vmware-tanzu/velero):
//! - the pod (`pkg/exposer/pod_volume.go` `createHostingPod`): named after the PVB, in its namespace,
//!   controlled by it (ownerReference `controller: true`), labelled `velero.io/pod-volume-backup: <pvb>`
//!   (`pkg/controller/pod_volume_backup_controller.go` `setupExposeParam`), `spec.nodeName` set to the
//!   source pod's node (no scheduler, so cordons and NoSchedule taints do not keep it off),
//!   `terminationGracePeriodSeconds: 0`, `restartPolicy: Never`, a hostPath volume of the source volume,
//!   and only the node-agent's tolerations for `kubernetes.azure.com/scalesetpriority` and
//!   `CriticalAddonsOnly` (`pkg/util/third_party.go` `ThirdPartyTolerations`);
//! - the PVB goes Accepted → Prepared when the pod runs (`findPVBForPod`) → InProgress; a pod in an
//!   abnormal state before that cancels it (`kube.IsPodUnrecoverable`, "Cancel PVB because the exposing
//!   pod ... is in abnormal status"); a pod that ends while the data moves fails it (`pkg/datapath/
//!   micro_service_watcher.go` `startWatch` → `OnDataPathFailed`, "data path backup failed"); a pod
//!   not running within the prepare timeout fails it (`onPrepareTimeout`);
//! - when the PVB ends, the pod is deleted (`CleanUp` → `kube.DeletePodIfAny`) before the PVB's final
//!   status is written (`OnDataPathCompleted`);
//! - a restarted server cancels the unfinished PVBs of the backups it marks Failed (`pkg/cmd/server/
//!   server.go` `markPodVolumeBackupsCancel`), and the node-agent cleans their pods up.
//!
//! An evicted pod is set Failed by the kubelet before it is removed (pod disruption conditions), which
//! is what Velero's pod watch sees; the simulation reads "terminating, Failed or gone" as that.

use serde_json::{Value, json};

use super::{INTERNAL, VeleroConfig, pvb_key};
use crate::apiserver::meta::meta_str;
use crate::apiserver::resources::ResKey;
use crate::apiserver::store::DeleteOptions;
use crate::world::WorldContext;

/// The label a hosting pod carries, valued with its PVB's name (velero `pkg/apis/velero/v1/
/// labels_annotations.go` `PVBLabel`).
pub const PVB_LABEL: &str = "velero.io/pod-volume-backup";

/// The node-agent tolerations a hosting pod inherits (velero `pkg/util/third_party.go`).
const THIRD_PARTY_TOLERATIONS: [&str; 2] = [
    "kubernetes.azure.com/scalesetpriority",
    "CriticalAddonsOnly",
];

/// The source of one hosting pod: what the PVB backs up and where.
pub struct Source<'a> {
    pub pvb_name: &'a str,
    pub pvb_uid: &'a str,
    pub node: &'a str,
    pub pod_uid: &'a str,
    pub pv: &'a str,
}

fn pods() -> ResKey {
    ResKey::core("pods")
}

/// The hosting pod as `createHostingPod` builds it, given the node-agent DaemonSet (its image, service
/// account and the tolerations the pod inherits).
pub fn hosting_pod(config: &VeleroConfig, s: &Source<'_>, node_agent: Option<&Value>) -> Value {
    let template = node_agent.and_then(|ds| ds.pointer("/spec/template/spec"));
    let image = template
        .and_then(|t| t.pointer("/containers/0/image"))
        .and_then(Value::as_str)
        .unwrap_or("velero/velero:v1.18.2");
    let account = template
        .and_then(|t| t.get("serviceAccountName"))
        .and_then(Value::as_str)
        .unwrap_or("velero");
    let tolerations: Vec<Value> = template
        .and_then(|t| t.get("tolerations"))
        .and_then(Value::as_array)
        .map(|ts| {
            ts.iter()
                .filter(|t| {
                    t.get("key")
                        .and_then(Value::as_str)
                        .is_some_and(|k| THIRD_PARTY_TOLERATIONS.contains(&k))
                })
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let volume_path = format!("/{}", s.pvb_uid);
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": s.pvb_name,
            "namespace": config.namespace,
            "labels": {PVB_LABEL: s.pvb_name},
            "ownerReferences": [{"apiVersion": "velero.io/v1", "kind": "PodVolumeBackup",
                                 "name": s.pvb_name, "uid": s.pvb_uid, "controller": true}],
        },
        "spec": {
            "nodeName": s.node,
            "os": {"name": "linux"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "NotIn", "values": ["windows"]}]}]}}},
            "containers": [{
                "name": s.pvb_uid,
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["/velero", "pod-volume", "backup"],
                "args": [format!("--volume-path={volume_path}"), "--resource-timeout=10m0s".to_string(),
                         format!("--pod-volume-backup={}", s.pvb_name)],
                "volumeMounts": [{"name": s.pvb_uid, "mountPath": volume_path, "mountPropagation": "HostToContainer"}],
                "securityContext": {"privileged": false},
            }],
            "serviceAccountName": account,
            "terminationGracePeriodSeconds": 0,
            "volumes": [{"name": s.pvb_uid, "hostPath": {"path": format!(
                "/var/lib/kubelet/pods/{}/volumes/kubernetes.io~csi/{}/mount", s.pod_uid, s.pv)}}],
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 0},
            "tolerations": tolerations,
        },
    })
}

/// Creates the hosting pod of `s`; its uid, or None when it could not be created.
pub fn create(ctx: &WorldContext, config: &VeleroConfig, s: &Source<'_>) -> Option<String> {
    let agent = ctx.store.get(
        &ResKey::new("apps", "daemonsets"),
        Some(&config.namespace),
        "node-agent",
    );
    let pod = hosting_pod(config, s, agent.as_deref());
    let created = ctx
        .store
        .create(&pods(), Some(&config.namespace), pod, INTERNAL)
        .ok()?;
    ctx.audit.world(
        "hosting-pod",
        "pods",
        Some(&config.namespace),
        Some(s.pvb_name),
        json!({"pvb": s.pvb_name, "node": s.node}),
    );
    meta_str(&created, "uid").map(str::to_string)
}

/// Where a hosting pod stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Hosted {
    /// Created, not running yet.
    Starting,
    Running,
    /// Terminating, Failed, Succeeded or gone (with the pod's phase, or "deleted").
    Ended(String),
}

pub fn state(ctx: &WorldContext, config: &VeleroConfig, name: &str, uid: &str) -> Hosted {
    let Some(pod) = ctx.store.get(&pods(), Some(&config.namespace), name) else {
        return Hosted::Ended("deleted".into());
    };
    if meta_str(&pod, "uid") != Some(uid) || pod.pointer("/metadata/deletionTimestamp").is_some() {
        return Hosted::Ended("deleted".into());
    }
    match pod.pointer("/status/phase").and_then(Value::as_str) {
        Some("Running") => Hosted::Running,
        Some(p @ ("Failed" | "Succeeded" | "Unknown")) => Hosted::Ended(p.to_string()),
        _ => Hosted::Starting,
    }
}

/// `CleanUp`: deletes the hosting pod if it is still there (this very pod, by uid).
pub fn clean_up(ctx: &WorldContext, config: &VeleroConfig, name: &str, uid: &str) {
    let _ = ctx.store.delete(
        &pods(),
        Some(&config.namespace),
        name,
        &DeleteOptions {
            precondition_uid: Some(uid.to_string()),
            ..DeleteOptions::default()
        },
    );
}

/// Writes a PVB's phase (and message), leaving a final phase alone.
pub fn set_phase(ctx: &WorldContext, config: &VeleroConfig, name: &str, phase: &str) {
    let _ = ctx.store.modify(
        &pvb_key(),
        Some(&config.namespace),
        name,
        None,
        INTERNAL,
        |cur| {
            let mut v = cur.clone();
            if !is_final(&v) {
                v["status"]["phase"] = json!(phase);
            }
            Ok(v)
        },
    );
}

fn is_final(pvb: &Value) -> bool {
    matches!(
        pvb.pointer("/status/phase").and_then(Value::as_str),
        Some("Completed" | "Failed" | "Canceled")
    )
}

/// What a restarted server and the node-agent do to the unfinished PVBs of a backup marked Failed:
/// cancelled, their hosting pods deleted.
pub fn cancel_for_restart(ctx: &WorldContext, config: &VeleroConfig, backup_uid: &str) {
    let page = ctx.store.list(
        &pvb_key(),
        Some(&config.namespace),
        &|p| {
            p.pointer("/metadata/labels/velero.io~1backup-uid")
                .and_then(Value::as_str)
                == Some(backup_uid)
                && !is_final(p)
        },
        None,
        None,
    );
    let now = super::rfc3339(jiff::Timestamp::now());
    for pvb in page.items {
        let Some(name) = meta_str(&pvb, "name").map(str::to_string) else {
            continue;
        };
        let phase = pvb
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if let Some(pod) = ctx.store.get(&pods(), Some(&config.namespace), &name)
            && let Some(uid) = meta_str(&pod, "uid")
        {
            clean_up(ctx, config, &name, uid);
        }
        let _ = ctx.store.modify(
            &pvb_key(),
            Some(&config.namespace),
            &name,
            None,
            INTERNAL,
            |cur| {
                let mut v = cur.clone();
                v["spec"]["cancel"] = json!(true);
                v["status"]["phase"] = json!("Canceled");
                v["status"]["message"] = json!(format!(
                    "PVB is in status {phase:?} during the velero server starting, mark it as cancel"
                ));
                v["status"]["completionTimestamp"] = json!(now);
                Ok(v)
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosting_pod_is_pinned_owned_labelled_and_ungraceful() {
        let config = VeleroConfig::default();
        let agent = json!({"spec": {"template": {"spec": {
            "serviceAccountName": "velero",
            "containers": [{"image": "velero/velero:v1.18.2"}],
            "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                            {"key": "dedicated", "operator": "Exists"}]}}}});
        let s = Source {
            pvb_name: "b1-x7k2q",
            pvb_uid: "pvb-uid",
            node: "n1",
            pod_uid: "pod-uid",
            pv: "pv-1",
        };
        let p = hosting_pod(&config, &s, Some(&agent));
        assert_eq!(p["metadata"]["name"], "b1-x7k2q");
        assert_eq!(p["metadata"]["namespace"], "velero");
        assert_eq!(p["metadata"]["labels"][PVB_LABEL], "b1-x7k2q");
        assert_eq!(
            p["metadata"]["ownerReferences"][0]["kind"],
            "PodVolumeBackup"
        );
        assert_eq!(p["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(p["spec"]["nodeName"], "n1");
        assert_eq!(p["spec"]["terminationGracePeriodSeconds"], 0);
        assert_eq!(p["spec"]["restartPolicy"], "Never");
        // Only the third-party tolerations are inherited: nothing tolerates karpenter.sh/disrupted.
        assert_eq!(
            p["spec"]["tolerations"],
            json!([{"key": "CriticalAddonsOnly", "operator": "Exists"}])
        );
        assert!(p["metadata"].get("annotations").is_none());
    }
}
