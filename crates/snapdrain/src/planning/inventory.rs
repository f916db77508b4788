//! What a pod is, for drain purposes: protected or not, DaemonSet, mirror, terminal, critical, local storage,
//! and which PodDisruptionBudgets cover it. Pure functions over `k8s_openapi` objects.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::core::{Selector, SelectorExt};

/// Static pods show up in the API as mirror pods carrying this annotation; they cannot be evicted.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Priority classes Karpenter treats as critical (evicted after everything else).
pub const CRITICAL_PRIORITY_CLASSES: [&str; 2] =
    ["system-cluster-critical", "system-node-critical"];

/// Which pods snapdrain protects (backs up before their node goes away). One rule today; an enum so a
/// DisruptionPolicy can add others later without changing callers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProtectionRule {
    /// A non-terminal pod controlled by a StatefulSet that mounts at least one PersistentVolumeClaim.
    #[default]
    StatefulSetWithPvc,
}

impl ProtectionRule {
    pub fn protects(self, pod: &Pod) -> bool {
        match self {
            Self::StatefulSetWithPvc => {
                !is_terminal(pod)
                    && statefulset_owner(pod).is_some()
                    && pvc_claims(pod).next().is_some()
            }
        }
    }
}

/// The controlling owner reference (`controller: true`), if any.
pub fn controller_of(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata
        .owner_references
        .as_deref()?
        .iter()
        .find(|o| o.controller == Some(true))
}

/// Name of the StatefulSet controlling the pod.
pub fn statefulset_owner(pod: &Pod) -> Option<&str> {
    controller_of(pod)
        .filter(|o| o.kind == "StatefulSet" && o.api_version.starts_with("apps/"))
        .map(|o| o.name.as_str())
}

/// True when a DaemonSet controls the pod.
pub fn is_daemonset_pod(pod: &Pod) -> bool {
    controller_of(pod).is_some_and(|o| o.kind == "DaemonSet" && o.api_version.starts_with("apps/"))
}

/// True for mirror (static) pods.
pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
}

/// True for pods that finished (Succeeded or Failed): nothing left to evict.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Karpenter's pod annotation that blocks voluntary disruption of the pod's node.
pub const DO_NOT_DISRUPT_ANNOTATION: &str = "karpenter.sh/do-not-disrupt";

/// True when the pod carries an active `karpenter.sh/do-not-disrupt` (kubernetes-sigs/karpenter
/// `pkg/utils/pod/scheduling.go` `IsDoNotDisruptActive`): `"true"`, or a positive Go duration the pod
/// has not yet been running for (counted from `status.startTime`; unknown start counts as active).
/// Values Go's `time.ParseDuration` refuses (including out-of-range ones such as `9999999999999999h`)
/// and non-positive ones are ignored, as Karpenter ignores them; finished or terminating pods disrupt
/// nothing.
pub fn do_not_disrupt_active(pod: &Pod, now: jiff::Timestamp) -> bool {
    if is_terminal(pod) || is_terminating(pod) {
        return false;
    }
    let Some(value) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DO_NOT_DISRUPT_ANNOTATION))
    else {
        return false;
    };
    if value == "true" {
        return true;
    }
    let Ok(duration) = crate::api::duration::parse_go_duration(value) else {
        return false;
    };
    if duration.is_zero() {
        return false;
    }
    let Some(started) = pod.status.as_ref().and_then(|s| s.start_time.as_ref()) else {
        return true;
    };
    now.duration_since(started.0).as_secs_f64() < duration.as_secs_f64()
}

/// True for a pod no controller owns (kubectl's "unreplicated" pods): evicted, it is never recreated.
/// Mirror pods are handled separately (the kubelet owns them).
pub fn is_unreplicated(pod: &Pod) -> bool {
    controller_of(pod).is_none()
}

/// True for pods already being deleted.
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// True for pods in a critical priority class.
pub fn is_critical(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.priority_class_name.as_deref())
        .is_some_and(|p| CRITICAL_PRIORITY_CLASSES.contains(&p))
}

/// Names of the PVCs the pod mounts (`spec.volumes[].persistentVolumeClaim.claimName`).
pub fn pvc_claims(pod: &Pod) -> impl Iterator<Item = &str> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            v.persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.as_str())
        })
}

/// True when the pod has an emptyDir volume (kubectl's "local storage"; hostPath is not counted, as in
/// kubectl).
pub fn has_empty_dir(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(|v| v.empty_dir.is_some())
}

/// `namespace/name` of the pod.
pub fn pod_key(pod: &Pod) -> String {
    format!("{}/{}", namespace_of(pod), name_of(pod))
}

pub(crate) fn namespace_of(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or_default()
}

pub(crate) fn name_of(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

/// PodDisruptionBudgets with their selectors converted once, for matching many pods.
pub struct PdbIndex<'a> {
    entries: Vec<(&'a str, &'a str, Selector)>,
}

impl<'a> PdbIndex<'a> {
    /// For eviction, a PDB with a missing or empty selector matches nothing (kubernetes
    /// `pkg/registry/core/pod/storage/eviction.go` `getPodDisruptionBudgets`: "If a PDB with a nil or empty
    /// selector creeps in, it should match nothing, not everything"), although policy/v1 documents an empty
    /// selector as every pod of the namespace. A selector the API server would have refused (unknown
    /// operator) matches nothing.
    pub fn new(pdbs: &'a [PodDisruptionBudget]) -> Self {
        let entries = pdbs
            .iter()
            .filter_map(|pdb| {
                let selector = pdb.spec.as_ref()?.selector.clone()?;
                let empty = selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
                    && selector
                        .match_expressions
                        .as_ref()
                        .is_none_or(|e| e.is_empty());
                if empty {
                    return None;
                }
                let selector = Selector::try_from(selector).ok()?;
                Some((
                    pdb.metadata.namespace.as_deref().unwrap_or_default(),
                    pdb.metadata.name.as_deref().unwrap_or_default(),
                    selector,
                ))
            })
            .collect();
        Self { entries }
    }

    /// Names of the PDBs covering `pod`. More than one means the eviction API answers 500.
    pub fn matching(&self, pod: &Pod) -> Vec<String> {
        let ns = namespace_of(pod);
        let empty = Default::default();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        let mut names: Vec<String> = self
            .entries
            .iter()
            .filter(|(pns, _, sel)| *pns == ns && sel.matches(labels))
            .map(|(_, name, _)| (*name).to_owned())
            .collect();
        names.sort();
        names
    }
}

#[cfg(any(test, feature = "test-fixtures"))]
pub mod fixtures {
    //! Small realistic objects built from JSON, shared by the planning tests (and, with the
    //! `test-fixtures` feature, by the tests of crates built on this one).
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use serde_json::json;

    pub fn sts_pod(ns: &str, sts: &str, ordinal: u32, claims: &[&str]) -> Pod {
        let volumes: Vec<_> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": format!("{c}-{sts}-{ordinal}")}}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {
                "name": format!("{sts}-{ordinal}"), "namespace": ns, "uid": format!("uid-{sts}-{ordinal}"),
                "labels": {"app": sts, "statefulset.kubernetes.io/pod-name": format!("{sts}-{ordinal}")},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts,
                                     "uid": format!("sts-uid-{sts}"), "controller": true}]
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "postgres:17"}], "volumes": volumes},
            "status": {"phase": "Running"}
        }))
        .expect("pod fixture")
    }

    pub fn deploy_pod(ns: &str, name: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "labels": {"app": name},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{name}-rs"),
                                              "uid": "rs-uid", "controller": true}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "nginx"}]},
            "status": {"phase": "Running"}
        }))
        .expect("pod fixture")
    }

    pub fn ds_pod(ns: &str, name: &str, priority_class: Option<&str>) -> Pod {
        let mut v = json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "labels": {"app": name},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name,
                                              "uid": "ds-uid", "controller": true}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "agent"}]},
            "status": {"phase": "Running"}
        });
        if let Some(pc) = priority_class {
            v["spec"]["priorityClassName"] = json!(pc);
        }
        serde_json::from_value(v).expect("pod fixture")
    }

    pub fn with(pod: Pod, patch: serde_json::Value) -> Pod {
        let mut v = serde_json::to_value(pod).expect("pod to json");
        merge(&mut v, patch);
        serde_json::from_value(v).expect("patched pod")
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    pub fn statefulset(ns: &str, name: &str) -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("sts-uid-{name}")},
            "spec": {"serviceName": name, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "main", "image": "postgres:17"}]}}}
        }))
        .expect("sts fixture")
    }

    pub fn pvc(ns: &str, name: &str, pv: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "volumeName": pv},
            "status": {"phase": "Bound"}
        }))
        .expect("pvc fixture")
    }

    pub fn pdb(ns: &str, name: &str, selector: serde_json::Value) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"maxUnavailable": 1, "selector": selector}
        }))
        .expect("pdb fixture")
    }

    pub fn node(name: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("node-uid-{name}")},
            "spec": {"providerID": "aws:///eu-west-1a/i-0abc123def4567890"}
        }))
        .expect("node fixture")
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn statefulset_pod_with_pvc_is_protected() {
        let pod = sts_pod("db", "pg", 0, &["data"]);
        assert!(ProtectionRule::default().protects(&pod));
        assert_eq!(statefulset_owner(&pod), Some("pg"));
        assert_eq!(pvc_claims(&pod).collect::<Vec<_>>(), ["data-pg-0"]);
    }

    #[test]
    fn statefulset_pod_without_pvc_is_not_protected() {
        assert!(!ProtectionRule::default().protects(&sts_pod("db", "pg", 0, &[])));
    }

    #[test]
    fn terminal_statefulset_pod_is_not_protected() {
        let pod = with(
            sts_pod("db", "pg", 0, &["data"]),
            json!({"status": {"phase": "Failed"}}),
        );
        assert!(!ProtectionRule::default().protects(&pod));
    }

    #[test]
    fn non_controller_statefulset_owner_does_not_count() {
        let pod = with(
            sts_pod("db", "pg", 0, &["data"]),
            json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                  "name": "pg", "uid": "x", "controller": false}]}}),
        );
        assert!(!ProtectionRule::default().protects(&pod));
    }

    #[test]
    fn deployment_pod_with_pvc_is_not_protected() {
        let pod = with(
            deploy_pod("web", "api"),
            json!({"spec": {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "shared"}}]}}),
        );
        assert!(!ProtectionRule::default().protects(&pod));
    }

    #[test]
    fn classifies_daemonset_mirror_critical_emptydir() {
        assert!(is_daemonset_pod(&ds_pod("kube-system", "node-agent", None)));
        assert!(!is_daemonset_pod(&deploy_pod("web", "api")));
        let mirror = with(
            deploy_pod("kube-system", "kube-proxy-n1"),
            json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "abc"}}}),
        );
        assert!(is_mirror(&mirror));
        assert!(is_critical(&ds_pod(
            "kube-system",
            "cni",
            Some("system-node-critical")
        )));
        assert!(!is_critical(&ds_pod("kube-system", "cni", Some("high"))));
        let scratch = with(
            deploy_pod("web", "api"),
            json!({"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}),
        );
        assert!(has_empty_dir(&scratch));
        assert!(!has_empty_dir(&deploy_pod("web", "api")));
    }

    #[test]
    fn do_not_disrupt_true_or_an_unexpired_duration_is_active() {
        let now: jiff::Timestamp = "2026-05-20T10:00:00Z".parse().expect("ts");
        let annotated = |v: &str| {
            with(
                deploy_pod("web", "api"),
                json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": v}},
                       "status": {"startTime": "2026-05-20T09:30:00Z"}}),
            )
        };
        assert!(do_not_disrupt_active(&annotated("true"), now));
        assert!(!do_not_disrupt_active(&annotated("false"), now));
        assert!(!do_not_disrupt_active(&annotated("yes"), now));
        assert!(do_not_disrupt_active(&annotated("1h"), now));
        assert!(!do_not_disrupt_active(&annotated("10m"), now));
        assert!(!do_not_disrupt_active(&deploy_pod("web", "api"), now));
        let done = with(annotated("true"), json!({"status": {"phase": "Succeeded"}}));
        assert!(!do_not_disrupt_active(&done, now));
    }

    #[test]
    fn pods_without_a_controller_are_unreplicated() {
        assert!(!is_unreplicated(&deploy_pod("web", "api")));
        let bare = with(
            deploy_pod("web", "api"),
            json!({"metadata": {"ownerReferences": []}}),
        );
        assert!(is_unreplicated(&bare));
        let not_controller = with(
            deploy_pod("web", "api"),
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                  "name": "x", "uid": "u"}]}}),
        );
        assert!(is_unreplicated(&not_controller));
    }

    #[test]
    fn pdb_matching_follows_policy_v1() {
        let pdbs = vec![
            pdb("db", "pg", json!({"matchLabels": {"app": "pg"}})),
            pdb("db", "everything", json!({})),
            pdb("other", "pg", json!({"matchLabels": {"app": "pg"}})),
            pdb(
                "db",
                "expr",
                json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["pg", "x"]}]}),
            ),
            pdb(
                "db",
                "notpg",
                json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["pg"]}]}),
            ),
        ];
        let mut no_selector = pdb("db", "none", json!({}));
        if let Some(spec) = no_selector.spec.as_mut() {
            spec.selector = None;
        }
        let mut all = pdbs.clone();
        all.push(no_selector);
        let index = PdbIndex::new(&all);
        assert_eq!(
            index.matching(&sts_pod("db", "pg", 0, &["data"])),
            ["expr", "pg"],
            "the empty and the missing selector match nothing (eviction.go getPodDisruptionBudgets)"
        );
        assert_eq!(index.matching(&deploy_pod("db", "api")), ["notpg"]);
        assert!(index.matching(&deploy_pod("web", "api")).is_empty());
    }
}
