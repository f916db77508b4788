//! Pods as the cache keeps them. At 150,000 pods the cache is most of the controller's memory, and a
//! `k8s_openapi` Pod is large even when trimmed: its structs lay out every optional field inline (an
//! ObjectMeta is hundreds of bytes with all of them `None`, a label map a B-tree node of eleven slots).
//!
//! - [`WirePod`] is what the watch decodes: only the fields snapdrain's decisions read (the list in
//!   [`super::trim`]), straight from the API server's JSON, so the rest of each pod is skipped by the
//!   parser and never allocated. It has an ObjectMeta because kube-runtime's watcher needs one.
//! - [`CachedPod`] is what the cache holds: the same fields in boxed slices, with what pods repeat
//!   interned ([`super::intern`]: strings, whole label sets, owner lists) and uids and resourceVersions
//!   inline ([`super::token`]).
//!
//! Readers get a `Pod` back with [`CachedPod::to_pod`], for the few pods they look at (one node's).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, PersistentVolumeClaimVolumeSource, Pod, PodSpec, PodStatus, Toleration,
    Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};

use super::intern::{Pool, intern};
use super::token::Token;
use crate::planning::inventory::MIRROR_ANNOTATION;

/// A pod as the watch decodes it (a list item or a watch event), reduced to what snapdrain reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct WirePod {
    #[serde(default, deserialize_with = "lean_meta")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<Spec>,
    #[serde(default)]
    status: Option<Status>,
}

/// A pod as the cache holds it. Decodes from a Pod's JSON too (through [`WirePod`]).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(from = "WirePod")]
pub struct CachedPod {
    meta: Meta,
    spec: Option<Spec>,
    status: Option<Status>,
}

/// Key/value pairs in key order, as the map they came from.
type Pairs<K> = [(K, Box<str>)];

/// The metadata decisions read. `None` and empty stay apart where the API keeps them apart.
#[derive(Clone, Debug, Default)]
struct Meta {
    /// Not interned: a pod's name is its own (the cache's key shares this copy).
    name: Option<Arc<str>>,
    namespace: Option<Arc<str>>,
    uid: Option<Token>,
    resource_version: Option<Token>,
    /// Shared by every pod with the same labels ([`LABEL_SETS`]).
    labels: Option<Arc<Pairs<Arc<str>>>>,
    annotations: Option<Box<Pairs<Box<str>>>>,
    /// Shared by every pod of the same owner ([`OWNER_LISTS`]).
    owner_references: Option<Arc<[Owner]>>,
    deletion_timestamp: Option<Time>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Owner {
    api_version: Arc<str>,
    kind: Arc<str>,
    name: Arc<str>,
    uid: Token,
    controller: Option<bool>,
    block_owner_deletion: Option<bool>,
}

/// The pods of one ReplicaSet or DaemonSet carry the same labels, and a StatefulSet's differ in a few.
static LABEL_SETS: LazyLock<Pool<Pairs<Arc<str>>>> = LazyLock::new(Pool::new);
/// The pods of one owner carry the same owner list.
static OWNER_LISTS: LazyLock<Pool<[Owner]>> = LazyLock::new(Pool::new);

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default, deserialize_with = "interned")]
    node_name: Option<Arc<str>>,
    #[serde(default, deserialize_with = "claim_volumes")]
    volumes: Option<Box<[CachedVolume]>>,
    #[serde(default, deserialize_with = "drain_tolerations")]
    tolerations: Option<Box<[Toleration]>>,
    #[serde(default, deserialize_with = "interned")]
    priority_class_name: Option<Arc<str>>,
    priority: Option<i32>,
    /// The signal watcher's deadline for a Karpenter termination (`signals::detect`).
    termination_grace_period_seconds: Option<i64>,
    // No containers: no decision reads them (`to_pod` gives an empty list).
}

/// A volume with one of the two sources planning reads (others, configMap or projected, are not kept).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CachedVolume {
    name: Box<str>,
    persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    empty_dir: Option<EmptyDirVolumeSource>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    #[serde(default, deserialize_with = "interned")]
    phase: Option<Arc<str>>,
    start_time: Option<Time>,
}

fn interned<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Arc<str>>, D::Error> {
    Ok(Option::<Cow<'de, str>>::deserialize(d)?.map(|s| intern(&s)))
}

/// Only the PVC and emptyDir volumes: the other sources (the service-account token, configMaps,
/// secrets) are what a pod mostly mounts, and no decision reads them.
fn claim_volumes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<[CachedVolume]>>, D::Error> {
    Ok(Option::<Vec<CachedVolume>>::deserialize(d)?.map(|vs| {
        vs.into_iter()
            .filter(|v| v.persistent_volume_claim.is_some() || v.empty_dir.is_some())
            .collect()
    }))
}

/// Only the tolerations that tolerate snapdrain's drain taint: that is all a decision asks of them
/// ([`crate::planning::taint::tolerates_drain_taint`]), and every pod carries two that never do (the
/// `not-ready`/`unreachable` NoExecute ones the DefaultTolerationSeconds admission plugin adds).
fn drain_tolerations<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Box<[Toleration]>>, D::Error> {
    let taint = crate::planning::taint::drain_taint();
    Ok(Option::<Vec<Toleration>>::deserialize(d)?.map(|ts| {
        ts.into_iter()
            .filter(|t| crate::planning::taint::toleration_tolerates(t, &taint))
            .collect()
    }))
}

/// The pod annotations some decision reads: snapdrain's own, Karpenter's (`karpenter.sh/do-not-disrupt`),
/// Cluster Autoscaler's (`safe-to-evict`, which the holds place and restore) and the static-pod mirror
/// marker. Real pods carry many others (CNI and service-mesh state, config checksums, scrape hints,
/// kubectl's last-applied copy), often the bulk of their metadata: at 150,000 pods they are not kept.
pub(super) fn read_annotation(key: &str) -> bool {
    const DOMAINS: [&str; 3] = [
        "snapdrain.io/",
        "karpenter.sh/",
        "cluster-autoscaler.kubernetes.io/",
    ];
    DOMAINS.iter().any(|d| key.starts_with(d)) || key == MIRROR_ANNOTATION
}

/// ObjectMeta with what [`Meta`] keeps: no managedFields (skipped by the parser), only the annotations
/// decisions read, and nothing of creation, generation or finalizers (no decision reads them of a pod).
fn lean_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Lean {
        annotations: Option<BTreeMap<String, String>>,
        deletion_timestamp: Option<Time>,
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
    // Collected anew: a map whose entries all go allocates nothing (`retain` would keep its node).
    let annotations = m
        .annotations
        .map(|a| {
            a.into_iter()
                .filter(|(k, _)| read_annotation(k))
                .collect::<BTreeMap<_, _>>()
        })
        .filter(|a| !a.is_empty());
    Ok(ObjectMeta {
        annotations,
        deletion_timestamp: m.deletion_timestamp,
        labels: m.labels,
        name: m.name,
        namespace: m.namespace,
        owner_references: m.owner_references,
        resource_version: m.resource_version,
        uid: m.uid,
        ..ObjectMeta::default()
    })
}

fn boxed(s: String) -> Box<str> {
    s.into_boxed_str()
}

impl From<WirePod> for CachedPod {
    fn from(w: WirePod) -> Self {
        let m = w.metadata;
        let meta = Meta {
            name: m.name.as_deref().map(Arc::from),
            namespace: m.namespace.as_deref().map(intern),
            uid: m.uid.as_deref().map(Token::new),
            resource_version: m.resource_version.as_deref().map(Token::new),
            labels: m.labels.map(|ls| {
                let set: Vec<_> = ls
                    .into_iter()
                    .map(|(k, v)| (intern(&k), boxed(v)))
                    .collect();
                LABEL_SETS.get(&set, |s| Arc::from(s))
            }),
            annotations: m
                .annotations
                .map(|a| a.into_iter().map(|(k, v)| (boxed(k), boxed(v))).collect()),
            owner_references: m.owner_references.map(|os| {
                let owners: Vec<_> = os
                    .into_iter()
                    .map(|o| Owner {
                        api_version: intern(&o.api_version),
                        kind: intern(&o.kind),
                        name: intern(&o.name),
                        uid: Token::new(&o.uid),
                        controller: o.controller,
                        block_owner_deletion: o.block_owner_deletion,
                    })
                    .collect();
                OWNER_LISTS.get(&owners, |o| Arc::from(o))
            }),
            deletion_timestamp: m.deletion_timestamp,
        };
        Self {
            meta,
            spec: w.spec,
            status: w.status,
        }
    }
}

fn string(s: &str) -> String {
    s.to_owned()
}

impl CachedPod {
    /// The pod as a `k8s_openapi` Pod with the cached fields set (the others `None`).
    pub fn to_pod(&self) -> Pod {
        let m = &self.meta;
        let metadata = ObjectMeta {
            name: m.name.as_deref().map(string),
            namespace: m.namespace.as_deref().map(string),
            uid: m.uid.as_ref().map(|u| u.as_str().into_owned()),
            resource_version: m.resource_version.as_ref().map(|v| v.as_str().into_owned()),
            labels: m
                .labels
                .as_ref()
                .map(|ls| ls.iter().map(|(k, v)| (string(k), string(v))).collect()),
            annotations: m
                .annotations
                .as_ref()
                .map(|a| a.iter().map(|(k, v)| (string(k), string(v))).collect()),
            owner_references: m.owner_references.as_ref().map(|os| {
                os.iter()
                    .map(|o| OwnerReference {
                        api_version: string(&o.api_version),
                        kind: string(&o.kind),
                        name: string(&o.name),
                        uid: o.uid.as_str().into_owned(),
                        controller: o.controller,
                        block_owner_deletion: o.block_owner_deletion,
                    })
                    .collect()
            }),
            deletion_timestamp: m.deletion_timestamp.clone(),
            ..ObjectMeta::default()
        };
        Pod {
            metadata,
            spec: self.spec.as_ref().map(|s| PodSpec {
                node_name: s.node_name.as_deref().map(string),
                tolerations: s.tolerations.as_ref().map(|ts| ts.to_vec()),
                priority_class_name: s.priority_class_name.as_deref().map(string),
                priority: s.priority,
                termination_grace_period_seconds: s.termination_grace_period_seconds,
                volumes: s.volumes.as_ref().map(|vs| {
                    vs.iter()
                        .map(|v| Volume {
                            name: string(&v.name),
                            persistent_volume_claim: v.persistent_volume_claim.clone(),
                            empty_dir: v.empty_dir.clone(),
                            ..Volume::default()
                        })
                        .collect()
                }),
                ..PodSpec::default()
            }),
            status: self.status.as_ref().map(|s| PodStatus {
                phase: s.phase.as_deref().map(string),
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

    pub fn uid(&self) -> Option<Cow<'_, str>> {
        self.meta.uid.as_ref().map(Token::as_str)
    }

    /// Whether the pod's uid is `uid` (without rendering it).
    pub fn has_uid(&self, uid: &str) -> bool {
        self.meta.uid.as_ref().is_some_and(|u| u.is(uid))
    }

    /// Whether the hold keeper may have anything to do with this pod: it mounts a PVC (only such pods
    /// are protected, `planning::ProtectionRule`), carries one of snapdrain's annotations (marks to
    /// remove) or a Velero data-path label (`planning::velero_pods`). Most pods do none of these, and
    /// the keeper's sweep skips them without converting them.
    pub fn may_be_held(&self) -> bool {
        let claims = self
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .is_some_and(|vs| vs.iter().any(|v| v.persistent_volume_claim.is_some()));
        let marked = self
            .meta
            .annotations
            .iter()
            .flatten()
            .any(|(k, _)| k.starts_with("snapdrain.io/"));
        let data_path = crate::planning::velero_pods::has_data_path_label(
            self.meta
                .labels
                .iter()
                .flat_map(|l| l.iter())
                .map(|(k, _)| &**k),
        );
        claims || marked || data_path
    }
}

/// Its namespace and name key the cache.
impl super::store::Stored for CachedPod {
    fn namespace_name(&self) -> (&str, &str) {
        (
            self.meta.namespace.as_deref().unwrap_or(""),
            self.meta.name.as_deref().unwrap_or(""),
        )
    }

    fn key(&self) -> (Arc<str>, Arc<str>) {
        // The pod's own copies, shared: no allocation per pod for the cache's key.
        (
            self.meta.namespace.clone().unwrap_or_else(|| intern("")),
            self.meta.name.clone().unwrap_or_else(|| Arc::from("")),
        )
    }
}

/// The API coordinates are Pod's: `Api<WirePod>` lists and watches `/api/v1/pods`.
impl kube::Resource for WirePod {
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
    use super::super::trim::LAST_APPLIED;
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
                "annotations": {LAST_APPLIED: "{\"big\": true}", "karpenter.sh/do-not-disrupt": "true",
                                "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                                "snapdrain.io/held": "do-not-disrupt",
                                "kubernetes.io/config.mirror": "abc",
                                "prometheus.io/scrape": "true",
                                "checksum/config": "0f3a9c"},
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
        let keys: Vec<&str> = annotations.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "cluster-autoscaler.kubernetes.io/safe-to-evict",
                "karpenter.sh/do-not-disrupt",
                "kubernetes.io/config.mirror",
                "snapdrain.io/held"
            ],
            "the annotations decisions read, and no others"
        );
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
        assert_eq!(volumes.len(), 2, "the projected token volume goes");
        assert_eq!(
            volumes[0]
                .persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.as_str()),
            Some("data-pg-0")
        );
        assert!(volumes[1].empty_dir.is_some());
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
        let unread = decode(json!({"metadata": {"annotations": {"prometheus.io/port": "9090"}}}));
        assert!(
            unread.to_pod().metadata.annotations.is_none(),
            "no empty map is kept"
        );
        assert!(pod.spec.as_ref().is_some_and(|s| s.volumes.is_none()));
        assert!(pod.status.is_none());
        let bare = decode(json!({}));
        assert!(bare.to_pod().spec.is_none());
    }

    #[test]
    fn pods_share_the_strings_they_repeat_and_give_them_back_whole() {
        let pod = |name: &str| {
            decode(json!({
                "metadata": {"name": name, "namespace": "tenant-07", "uid": format!("uid-{name}"),
                             "labels": {"app": "web", "pod-template-hash": "5d8f"},
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                                  "name": "web-5d8f", "uid": "rs1", "controller": true}]},
                "spec": {"nodeName": "ip-10-0-1-7.ec2.internal", "priorityClassName": "tier-2"},
                "status": {"phase": "Running"}
            }))
        };
        let (a, b) = (pod("web-1"), pod("web-2"));
        let shared = |x: &Option<Arc<str>>, y: &Option<Arc<str>>| match (x, y) {
            (Some(x), Some(y)) => Arc::ptr_eq(x, y),
            _ => false,
        };
        assert!(shared(&a.meta.namespace, &b.meta.namespace));
        let (sa, sb) = (a.spec.as_ref(), b.spec.as_ref());
        assert!(shared(
            &sa.and_then(|s| s.node_name.clone()),
            &sb.and_then(|s| s.node_name.clone())
        ));
        let owner = |p: &CachedPod| p.meta.owner_references.as_ref().map(|o| o[0].name.clone());
        assert!(shared(&owner(&a), &owner(&b)));
        let label_key = |p: &CachedPod| p.meta.labels.as_ref().map(|l| l[0].0.clone());
        assert!(shared(&label_key(&a), &label_key(&b)));

        // Back as a Pod, nothing is lost or reordered.
        let back = a.to_pod();
        assert_eq!(back.metadata.name.as_deref(), Some("web-1"));
        assert_eq!(back.metadata.namespace.as_deref(), Some("tenant-07"));
        let labels = back.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels.get("pod-template-hash").map(String::as_str),
            Some("5d8f")
        );
        let owners = back.metadata.owner_references.unwrap_or_default();
        assert_eq!(owners[0].kind, "ReplicaSet");
        assert_eq!(owners[0].controller, Some(true));
        assert_eq!(a.uid().as_deref(), Some("uid-web-1"));
        assert!(a.has_uid("uid-web-1") && !a.has_uid("uid-web-2"));
        let owners = |p: &CachedPod| p.meta.owner_references.clone();
        assert!(
            matches!((owners(&a), owners(&b)), (Some(x), Some(y)) if Arc::ptr_eq(&x, &y)),
            "the pods of one owner share its owner list"
        );
        let labels = |p: &CachedPod| p.meta.labels.clone();
        assert!(
            matches!((labels(&a), labels(&b)), (Some(x), Some(y)) if Arc::ptr_eq(&x, &y)),
            "pods with the same labels share one set"
        );
        assert_eq!(
            super::super::Stored::namespace_name(&b),
            ("tenant-07", "web-2")
        );
    }
}
