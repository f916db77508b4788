//! What the patch engines need to know about a kind's fields: strategic-merge-patch strategies and
//! server-side-apply list/map types. For built-in kinds this is a small table transcribed from the
//! struct tags in k8s.io/api (`patchStrategy`, `patchMergeKey`, `+listType`, `+listMapKey`,
//! `+mapType=atomic`, `+structType=atomic`); for custom resources it comes from the CRD's
//! `x-kubernetes-list-type` / `x-kubernetes-list-map-keys` / `x-kubernetes-map-type` markers.
//!
//! Paths are field names joined by `.`; list items add no segment, so the `env` list inside any
//! container of a Deployment is `spec.template.spec.containers.env`.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::Value;

/// Strategic-merge-patch behaviour of one field (`patchStrategy` / `patchMergeKey` tags).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PatchStrategy {
    /// No tag: maps merge, lists are replaced.
    #[default]
    Default,
    /// `patchStrategy:"merge"`: lists merge by `key`, or as a set of primitives when `key` is None.
    /// `retain_keys` is the additional `retainKeys` strategy (PodSpec.volumes).
    Merge {
        key: Option<&'static str>,
        retain_keys: bool,
    },
    /// `patchStrategy:"replace"`: the value is replaced wholesale, even a map.
    Replace,
}

/// Server-side-apply semantics of a list (`+listType`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ListType {
    /// Replaced wholesale and owned as one field (the default for lists without a marker).
    #[default]
    Atomic,
    /// A set of scalars; each value is owned separately (`v:` in FieldsV1).
    Set,
    /// An associative list keyed by these fields (`k:` in FieldsV1).
    Map(Vec<String>),
}

/// Everything known about one field path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldMeta {
    pub strategy: PatchStrategy,
    pub list: ListType,
    /// `+mapType=atomic` / `+structType=atomic`: apply replaces and owns the map as one field.
    pub atomic_map: bool,
}

/// Field knowledge for one kind.
#[derive(Clone, Debug, Default)]
pub struct Schema {
    fields: HashMap<String, FieldMeta>,
}

const NO_META: FieldMeta = FieldMeta {
    strategy: PatchStrategy::Default,
    list: ListType::Atomic,
    atomic_map: false,
};

/// API groups served by kube-apiserver itself; their kinds accept strategic merge patch.
/// Not a suffix test: CRDs also live in `*.k8s.io` groups (e.g. `snapshot.storage.k8s.io`).
const BUILTIN_GROUPS: &[&str] = &[
    "",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "apiregistration.k8s.io",
    "apps",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "resource.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
    "storagemigration.k8s.io",
];

/// Keyed by `group/kind` (`/Pod` for the core group).
static BUILTIN: LazyLock<HashMap<String, Schema>> = LazyLock::new(build_builtin);
static GENERIC_BUILTIN: LazyLock<Schema> = LazyLock::new(|| {
    let mut s = Schema::default();
    s.add_object_meta();
    s
});

impl Schema {
    /// The schema of a built-in kind, or None when `api_version` is not a built-in group (a custom
    /// resource: strategic merge patch must then be refused with 415). Built-in kinds without
    /// special lists (ConfigMap, Lease, ...) get the ObjectMeta rules only.
    pub fn builtin(api_version: &str, kind: &str) -> Option<&'static Schema> {
        let group = group_of(api_version);
        if !BUILTIN_GROUPS.contains(&group) {
            return None;
        }
        Some(
            BUILTIN
                .get(&format!("{group}/{kind}"))
                .unwrap_or(&GENERIC_BUILTIN),
        )
    }

    /// ObjectMeta rules only: for a custom resource whose CRD schema is not at hand (every list
    /// other than finalizers and ownerReferences is then atomic).
    pub fn generic() -> &'static Schema {
        &GENERIC_BUILTIN
    }

    /// The schema of a custom resource from its CRD version's `schema.openAPIV3Schema`. Lists
    /// without `x-kubernetes-list-type` are atomic, as in the real apiserver. Maps given by
    /// `additionalProperties` are not descended into (their keys are data, not field names).
    pub fn from_openapi(openapi_v3_schema: &Value) -> Schema {
        let mut s = Schema::default();
        s.add_object_meta();
        s.walk_openapi(String::new(), openapi_v3_schema);
        s
    }

    /// Metadata of the field at `path` (see the module doc for the path form).
    pub fn field(&self, path: &str) -> &FieldMeta {
        self.fields.get(path).unwrap_or(&NO_META)
    }

    fn walk_openapi(&mut self, path: String, node: &Value) {
        let mut meta = FieldMeta::default();
        match node.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => meta.list = ListType::Set,
            Some("map") => {
                let keys = node
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|keys| {
                        keys.iter()
                            .filter_map(|k| k.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                meta.list = ListType::Map(keys);
            }
            _ => {}
        }
        meta.atomic_map = matches!(
            node.get("x-kubernetes-map-type").and_then(Value::as_str),
            Some("atomic")
        );
        if !path.is_empty() && meta != NO_META {
            self.fields.insert(path.clone(), meta);
        }
        if let Some(props) = node.get("properties").and_then(Value::as_object) {
            for (name, child) in props {
                self.walk_openapi(join(&path, name), child);
            }
        }
        if let Some(items) = node.get("items") {
            self.walk_openapi(path, items);
        }
    }

    fn set(&mut self, path: &str, strategy: PatchStrategy, list: ListType) {
        self.fields.insert(
            path.to_string(),
            FieldMeta {
                strategy,
                list,
                atomic_map: false,
            },
        );
    }

    /// A list with `patchStrategy:"merge"` + `patchMergeKey` and `+listType=map`.
    fn keyed(&mut self, path: &str, merge_key: &'static str, list_keys: &[&str]) {
        let strategy = PatchStrategy::Merge {
            key: Some(merge_key),
            retain_keys: false,
        };
        let keys = list_keys.iter().map(|k| k.to_string()).collect();
        self.set(path, strategy, ListType::Map(keys));
    }

    fn atomic_map(&mut self, path: &str) {
        self.fields.entry(path.to_string()).or_default().atomic_map = true;
    }

    /// ObjectMeta, meta/v1 types.go.
    fn add_object_meta(&mut self) {
        // Finalizers: `patchStrategy:"merge"`, `+listType=set`.
        self.set(
            "metadata.finalizers",
            PatchStrategy::Merge {
                key: None,
                retain_keys: false,
            },
            ListType::Set,
        );
        // OwnerReferences: `patchStrategy:"merge" patchMergeKey:"uid"`, `+listMapKey=uid`.
        self.keyed("metadata.ownerReferences", "uid", &["uid"]);
    }

    /// PodSpec and Container, core/v1 types.go, rooted at `p` (e.g. `spec.template.spec`).
    fn add_pod_spec(&mut self, p: &str) {
        let at = |s: &str| format!("{p}.{s}");
        // `patchStrategy:"merge,retainKeys" patchMergeKey:"name"`.
        self.set(
            &at("volumes"),
            PatchStrategy::Merge {
                key: Some("name"),
                retain_keys: true,
            },
            ListType::Map(vec!["name".into()]),
        );
        self.set(
            &at("resourceClaims"),
            PatchStrategy::Merge {
                key: Some("name"),
                retain_keys: true,
            },
            ListType::Map(vec!["name".into()]),
        );
        for containers in ["initContainers", "containers", "ephemeralContainers"] {
            let c = at(containers);
            self.keyed(&c, "name", &["name"]);
            // ContainerPort: merge key containerPort; SSA keys containerPort+protocol.
            self.keyed(
                &format!("{c}.ports"),
                "containerPort",
                &["containerPort", "protocol"],
            );
            self.keyed(&format!("{c}.env"), "name", &["name"]);
            self.keyed(&format!("{c}.volumeMounts"), "mountPath", &["mountPath"]);
            self.keyed(&format!("{c}.volumeDevices"), "devicePath", &["devicePath"]);
        }
        self.keyed(&at("imagePullSecrets"), "name", &["name"]);
        self.keyed(&at("hostAliases"), "ip", &["ip"]);
        self.keyed(
            &at("topologySpreadConstraints"),
            "topologyKey",
            &["topologyKey", "whenUnsatisfiable"],
        );
        self.keyed(&at("schedulingGates"), "name", &["name"]);
        // tolerations, readinessGates: no patch strategy, `+listType=atomic` (the default).
        self.atomic_map(&at("nodeSelector"));
    }

    fn add_conditions(&mut self, path: &str) {
        self.keyed(path, "type", &["type"]);
    }

    /// A pod template's spec, as found in workload kinds; `spec.selector` is a LabelSelector,
    /// which is `+structType=atomic`.
    fn workload(mut self, template_spec: &str) -> Self {
        self.add_pod_spec(template_spec);
        self.atomic_map("spec.selector");
        self.add_conditions("status.conditions");
        self
    }
}

fn build_builtin() -> HashMap<String, Schema> {
    let base = || {
        let mut s = Schema::default();
        s.add_object_meta();
        s
    };
    let mut m: HashMap<(&str, &str), Schema> = HashMap::new();

    let mut pod = base();
    pod.add_pod_spec("spec");
    pod.add_conditions("status.conditions");
    pod.keyed("status.podIPs", "ip", &["ip"]);
    pod.keyed("status.hostIPs", "ip", &["ip"]);
    pod.keyed("status.resourceClaimStatuses", "name", &["name"]);
    m.insert(("", "Pod"), pod);

    let mut template = base();
    template.add_pod_spec("template.spec");
    m.insert(("", "PodTemplate"), template);
    m.insert(
        ("", "ReplicationController"),
        base().workload("spec.template.spec"),
    );
    for kind in ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"] {
        m.insert(("apps", kind), base().workload("spec.template.spec"));
    }
    let mut job = base().workload("spec.template.spec");
    // JobStatus.conditions: merge by type for strategic patch, but `+listType=atomic` for apply.
    job.set(
        "status.conditions",
        PatchStrategy::Merge {
            key: Some("type"),
            retain_keys: false,
        },
        ListType::Atomic,
    );
    m.insert(("batch", "Job"), job);
    let mut cronjob = base();
    cronjob.add_pod_spec("spec.jobTemplate.spec.template.spec");
    cronjob.atomic_map("spec.jobTemplate.spec.selector");
    m.insert(("batch", "CronJob"), cronjob);

    let mut node = base();
    // NodeSpec.taints has no patch strategy (`+listType=atomic`): strategic patch replaces it.
    node.set(
        "spec.podCIDRs",
        PatchStrategy::Merge {
            key: None,
            retain_keys: false,
        },
        ListType::Set,
    );
    node.add_conditions("status.conditions");
    node.keyed("status.addresses", "type", &["type"]);
    m.insert(("", "Node"), node);

    let mut service = base();
    service.keyed("spec.ports", "port", &["port", "protocol"]);
    service.atomic_map("spec.selector");
    m.insert(("", "Service"), service);

    let mut pdb = base();
    // PodDisruptionBudgetSpec.selector: `patchStrategy:"replace"`.
    pdb.set("spec.selector", PatchStrategy::Replace, ListType::Atomic);
    pdb.atomic_map("spec.selector");
    pdb.add_conditions("status.conditions");
    m.insert(("policy", "PodDisruptionBudget"), pdb);

    for kind in ["PersistentVolumeClaim", "Namespace"] {
        let mut s = base();
        s.add_conditions("status.conditions");
        m.insert(("", kind), s);
    }
    m.into_iter()
        .map(|((group, kind), schema)| (format!("{group}/{kind}"), schema))
        .collect()
}

/// `apps/v1` → `apps`, `v1` → `` (core).
pub(crate) fn group_of(api_version: &str) -> &str {
    api_version
        .rsplit_once('/')
        .map(|(group, _)| group)
        .unwrap_or("")
}

pub(crate) fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn merge_key(s: &Schema, path: &str) -> Option<&'static str> {
        match s.field(path).strategy {
            PatchStrategy::Merge { key, .. } => key,
            _ => None,
        }
    }

    #[test]
    fn builtin_kinds_know_their_merge_keys() {
        let deploy = Schema::builtin("apps/v1", "Deployment").unwrap();
        assert_eq!(
            merge_key(deploy, "spec.template.spec.containers"),
            Some("name")
        );
        assert_eq!(
            merge_key(deploy, "spec.template.spec.containers.ports"),
            Some("containerPort")
        );
        assert_eq!(
            merge_key(deploy, "spec.template.spec.containers.volumeMounts"),
            Some("mountPath")
        );
        assert_eq!(
            deploy.field("spec.template.spec.tolerations").strategy,
            PatchStrategy::Default
        );
        let pod = Schema::builtin("v1", "Pod").unwrap();
        assert_eq!(merge_key(pod, "spec.initContainers.env"), Some("name"));
        assert_eq!(merge_key(pod, "status.conditions"), Some("type"));
        assert_eq!(pod.field("metadata.finalizers").list, ListType::Set);
        let node = Schema::builtin("v1", "Node").unwrap();
        assert_eq!(node.field("spec.taints").strategy, PatchStrategy::Default);
        assert_eq!(merge_key(node, "status.conditions"), Some("type"));
        let cm = Schema::builtin("v1", "ConfigMap").unwrap();
        assert_eq!(merge_key(cm, "metadata.ownerReferences"), Some("uid"));
    }

    #[test]
    fn custom_resources_are_not_builtin() {
        assert!(Schema::builtin("velero.io/v1", "Backup").is_none());
        assert!(Schema::builtin("snapshot.storage.k8s.io/v1", "VolumeSnapshot").is_none());
        assert!(Schema::builtin("coordination.k8s.io/v1", "Lease").is_some());
    }

    #[test]
    fn crd_schema_markers_are_read() {
        let openapi = json!({"type": "object", "properties": {
        "status": {"type": "object", "properties": {
            "conditions": {"type": "array", "x-kubernetes-list-type": "map",
                           "x-kubernetes-list-map-keys": ["type"],
                           "items": {"type": "object"}},
            "nodes": {"type": "array", "x-kubernetes-list-type": "set"},
            "steps": {"type": "array", "items": {"type": "object", "properties": {
                "pods": {"type": "array", "x-kubernetes-list-type": "set"}}}},
            "selector": {"type": "object", "x-kubernetes-map-type": "atomic"}
        }}}});
        let s = Schema::from_openapi(&openapi);
        assert_eq!(
            s.field("status.conditions").list,
            ListType::Map(vec!["type".into()])
        );
        assert_eq!(s.field("status.nodes").list, ListType::Set);
        assert_eq!(s.field("status.steps.pods").list, ListType::Set);
        assert_eq!(s.field("status.steps").list, ListType::Atomic);
        assert!(s.field("status.selector").atomic_map);
    }
}
