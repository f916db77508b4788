//! Pods as the cache keeps them. At 150,000 pods the cache is most of the controller's memory, and a
//! `k8s_openapi` Pod is large even when trimmed: its structs lay out every optional field inline (a
//! Container, a Volume or a PodSpec is kilobytes with all of them `None`). [`CachedPod`] holds only the
//! fields snapdrain's decisions read (the list in [`super::trim`]) and is decoded straight from the API
//! server's JSON, so the rest of each pod is skipped by the parser and never allocated. Readers get a
//! `Pod` back with [`CachedPod::to_pod`], for the few pods they look at (one node's).

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, PersistentVolumeClaimVolumeSource, Pod, PodSpec, PodStatus, Toleration,
    Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};

use super::trim::LAST_APPLIED;

/// A pod, reduced to what snapdrain reads. Decodes from a Pod's JSON (a list item or a watch event).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CachedPod {
    #[serde(default, deserialize_with = "lean_meta")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<Spec>,
    #[serde(default)]
    status: Option<Status>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    node_name: Option<String>,
    volumes: Option<Vec<CachedVolume>>,
    #[serde(default, deserialize_with = "drain_tolerations")]
    tolerations: Option<Vec<Toleration>>,
    priority_class_name: Option<String>,
    priority: Option<i32>,
    // No containers: no decision reads them (`to_pod` gives an empty list).
}

/// A volume's name and the two sources planning reads; others (configMap, projected...) keep the name.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CachedVolume {
    name: String,
    persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    empty_dir: Option<EmptyDirVolumeSource>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    phase: Option<String>,
    start_time: Option<Time>,
}

/// Only the tolerations that tolerate snapdrain's drain taint: that is all a decision asks of them
/// ([`crate::planning::taint::tolerates_drain_taint`]), and every pod carries two that never do (the
/// `not-ready`/`unreachable` NoExecute ones the DefaultTolerationSeconds admission plugin adds).
fn drain_tolerations<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Toleration>>, D::Error> {
    let taint = crate::planning::taint::drain_taint();
    Ok(Option::<Vec<Toleration>>::deserialize(d)?.map(|ts| {
        ts.into_iter()
            .filter(|t| crate::planning::taint::toleration_tolerates(t, &taint))
            .collect()
    }))
}

/// ObjectMeta without managedFields (skipped by the parser) and without kubectl's last-applied copy.
fn lean_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Lean {
        annotations: Option<BTreeMap<String, String>>,
        creation_timestamp: Option<Time>,
        deletion_grace_period_seconds: Option<i64>,
        deletion_timestamp: Option<Time>,
        finalizers: Option<Vec<String>>,
        generation: Option<i64>,
        labels: Option<BTreeMap<String, String>>,
        name: Option<String>,
        namespace: Option<String>,
        owner_references: Option<Vec<OwnerReference>>,
        resource_version: Option<String>,
        uid: Option<String>,
    }
    let Some(m) = Option::<Lean>::deserialize(d)? else {
        return Ok(ObjectMeta::default());
    };
    let annotations = m.annotations.map(|mut a| {
        a.remove(LAST_APPLIED);
        a
    });
    Ok(ObjectMeta {
        annotations,
        creation_timestamp: m.creation_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: m.deletion_timestamp,
        finalizers: m.finalizers,
        generation: m.generation,
        labels: m.labels,
        name: m.name,
        namespace: m.namespace,
        owner_references: m.owner_references,
        resource_version: m.resource_version,
        uid: m.uid,
        ..ObjectMeta::default()
    })
}

impl CachedPod {
    /// The pod as a `k8s_openapi` Pod with the cached fields set (the others `None`).
    pub fn to_pod(&self) -> Pod {
        Pod {
            metadata: self.metadata.clone(),
            spec: self.spec.as_ref().map(|s| PodSpec {
                node_name: s.node_name.clone(),
                tolerations: s.tolerations.clone(),
                priority_class_name: s.priority_class_name.clone(),
                priority: s.priority,
                volumes: s.volumes.as_ref().map(|vs| {
                    vs.iter()
                        .map(|v| Volume {
                            name: v.name.clone(),
                            persistent_volume_claim: v.persistent_volume_claim.clone(),
                            empty_dir: v.empty_dir.clone(),
                            ..Volume::default()
                        })
                        .collect()
                }),
                ..PodSpec::default()
            }),
            status: self.status.as_ref().map(|s| PodStatus {
                phase: s.phase.clone(),
                start_time: s.start_time.clone(),
                ..PodStatus::default()
            }),
        }
    }

    /// The node the pod is bound to, if any.
    pub fn node_name(&self) -> Option<&str> {
        self.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|n| !n.is_empty())
    }
}

/// The API coordinates are Pod's: `Api<CachedPod>` lists and watches `/api/v1/pods`.
impl kube::Resource for CachedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        <Pod as k8s_openapi::Resource>::KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        <Pod as k8s_openapi::Resource>::GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        <Pod as k8s_openapi::Resource>::VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode(v: serde_json::Value) -> CachedPod {
        serde_json::from_value(v).expect("a pod's JSON decodes as a CachedPod")
    }

    #[test]
    fn a_pod_keeps_what_decisions_read_and_nothing_else() {
        let p = decode(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "pg-0", "namespace": "db", "uid": "u1", "resourceVersion": "7",
                "labels": {"app": "pg"},
                "annotations": {LAST_APPLIED: "{\"big\": true}", "karpenter.sh/do-not-disrupt": "true"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "pg",
                                     "uid": "s1", "controller": true}],
                "managedFields": [{"manager": "kubelet", "operation": "Update"}],
                "deletionTimestamp": "2026-05-20T10:00:00Z"
            },
            "spec": {
                "nodeName": "n1", "priority": 5, "priorityClassName": "db",
                "tolerations": [{"operator": "Exists"},
                                {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                 "effect": "NoExecute", "tolerationSeconds": 300}],
                "containers": [{"name": "main", "image": "postgres:17", "env": [{"name": "A", "value": "b"}]}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-pg-0"}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
                    {"name": "token", "projected": {"sources": []}}
                ]
            },
            "status": {"phase": "Running", "startTime": "2026-05-20T09:00:00Z", "podIP": "10.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }));
        assert_eq!(p.node_name(), Some("n1"));
        let pod = p.to_pod();
        let m = &pod.metadata;
        assert_eq!(m.name.as_deref(), Some("pg-0"));
        assert_eq!(m.uid.as_deref(), Some("u1"));
        assert_eq!(m.resource_version.as_deref(), Some("7"));
        assert!(m.deletion_timestamp.is_some());
        assert!(m.managed_fields.is_none());
        let annotations = m.annotations.clone().unwrap_or_default();
        assert!(!annotations.contains_key(LAST_APPLIED));
        assert!(annotations.contains_key("karpenter.sh/do-not-disrupt"));
        assert_eq!(m.owner_references.as_ref().map(Vec::len), Some(1));
        let spec = pod.spec.as_ref().expect("the spec stays");
        assert_eq!(spec.priority, Some(5));
        assert_eq!(spec.priority_class_name.as_deref(), Some("db"));
        assert_eq!(
            spec.tolerations.as_ref().map(Vec::len),
            Some(1),
            "only the Exists one"
        );
        assert!(spec.containers.is_empty());
        let volumes = spec.volumes.as_ref().expect("volumes stay");
        assert_eq!(volumes.len(), 3);
        assert_eq!(
            volumes[0]
                .persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.as_str()),
            Some("data-pg-0")
        );
        assert!(volumes[1].empty_dir.is_some());
        assert!(volumes[2].projected.is_none());
        let status = pod.status.as_ref().expect("the status stays");
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert!(status.start_time.is_some());
        assert!(status.conditions.is_none() && status.pod_ip.is_none());
    }

    #[test]
    fn a_sparse_pod_decodes_with_nothing_invented() {
        // A watch's final state of a deleted pod, or a test's minimal pod: absent and null fields.
        let p = decode(
            json!({"metadata": {"name": "a", "namespace": "x", "annotations": null},
                              "spec": {"volumes": null, "nodeName": ""}}),
        );
        assert_eq!(p.node_name(), None);
        let pod = p.to_pod();
        assert!(pod.metadata.annotations.is_none());
        assert!(pod.spec.as_ref().is_some_and(|s| s.volumes.is_none()));
        assert!(pod.status.is_none());
        let bare = decode(json!({}));
        assert!(bare.to_pod().spec.is_none());
    }
}
