//! The resource registry: which kinds the simulated API server serves, and the discovery documents that
//! describe them. Built-in kinds are a fixed table; CustomResourceDefinitions add entries at runtime.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

/// Identifies a resource independent of version, as storage does (`group` is "" for the core group).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct ResKey {
    pub group: String,
    pub plural: String,
}

impl ResKey {
    pub fn new(group: &str, plural: &str) -> Self {
        Self {
            group: group.to_string(),
            plural: plural.to_string(),
        }
    }
    pub fn core(plural: &str) -> Self {
        Self::new("", plural)
    }
}

/// A printer column as in a CRD's `additionalPrinterColumns`; built-ins use the same shape.
#[derive(Clone, Debug, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub json_path: String,
    pub priority: i64,
    pub description: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ResourceDef {
    pub group: String,
    /// Served versions, the storage version first.
    pub versions: Vec<String>,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub namespaced: bool,
    pub status_subresource: bool,
    /// Subresources beyond `status` (e.g. `eviction`, `binding`, `scale`).
    pub extra_subresources: Vec<String>,
    pub printer_columns: Vec<PrinterColumn>,
    /// True for kinds that come from a CRD (strategic merge patch is refused for them).
    pub custom: bool,
}

impl ResourceDef {
    pub fn key(&self) -> ResKey {
        ResKey::new(&self.group, &self.plural)
    }

    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{}", self.group, version)
        }
    }

    pub fn storage_version(&self) -> &str {
        self.versions.first().map(String::as_str).unwrap_or("v1")
    }

    pub fn serves(&self, version: &str) -> bool {
        self.versions.iter().any(|v| v == version)
    }

    /// The `status` part of an object is owned by the status subresource only when one is declared.
    pub fn has_subresource(&self, sub: &str) -> bool {
        (sub == "status" && self.status_subresource)
            || self.extra_subresources.iter().any(|s| s == sub)
    }

    fn discovery_entries(&self) -> Vec<Value> {
        let verbs = [
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ];
        let mut out = vec![json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": verbs,
            "shortNames": self.short_names,
            "categories": self.categories,
            "storageVersionHash": "",
        })];
        if self.status_subresource {
            out.push(json!({"name": format!("{}/status", self.plural), "singularName": "", "namespaced": self.namespaced,
                "kind": self.kind, "verbs": ["get", "patch", "update"]}));
        }
        for sub in &self.extra_subresources {
            let (kind, group, version, verbs): (&str, &str, &str, Vec<&str>) = match sub.as_str() {
                "eviction" => ("Eviction", "policy", "v1", vec!["create"]),
                "binding" => ("Binding", "", "v1", vec!["create"]),
                "scale" => ("Scale", "autoscaling", "v1", vec!["get", "patch", "update"]),
                "token" => (
                    "TokenRequest",
                    "authentication.k8s.io",
                    "v1",
                    vec!["create"],
                ),
                _ => (self.kind.as_str(), "", "", vec!["get"]),
            };
            let mut entry = json!({"name": format!("{}/{}", self.plural, sub), "singularName": "",
                "namespaced": self.namespaced, "kind": kind, "verbs": verbs});
            if !group.is_empty() || !version.is_empty() {
                entry["group"] = json!(group);
                entry["version"] = json!(version);
            }
            out.push(entry);
        }
        out
    }
}

/// All kinds currently served.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    /// Shared definitions: the registry is copied for discovery and every write reads a definition,
    /// so a copy is of pointers (cloning ~70 definitions' strings showed in profiles).
    defs: BTreeMap<ResKey, Arc<ResourceDef>>,
}

fn col(name: &str, type_: &str, json_path: &str, priority: i64) -> PrinterColumn {
    PrinterColumn {
        name: name.to_string(),
        type_: type_.to_string(),
        json_path: json_path.to_string(),
        priority,
        description: String::new(),
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    short: &'static [&'static str],
    namespaced: bool,
    status: bool,
    extra: &'static [&'static str],
}

const BUILTINS: &[Builtin] = &[
    Builtin {
        group: "",
        version: "v1",
        kind: "Namespace",
        plural: "namespaces",
        short: &["ns"],
        namespaced: false,
        status: true,
        extra: &["finalize"],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Node",
        plural: "nodes",
        short: &["no"],
        namespaced: false,
        status: true,
        extra: &[],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Pod",
        plural: "pods",
        short: &["po"],
        namespaced: true,
        status: true,
        extra: &["eviction", "binding"],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "PersistentVolumeClaim",
        plural: "persistentvolumeclaims",
        short: &["pvc"],
        namespaced: true,
        status: true,
        extra: &[],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "PersistentVolume",
        plural: "persistentvolumes",
        short: &["pv"],
        namespaced: false,
        status: true,
        extra: &[],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Secret",
        plural: "secrets",
        short: &[],
        namespaced: true,
        status: false,
        extra: &[],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "ConfigMap",
        plural: "configmaps",
        short: &["cm"],
        namespaced: true,
        status: false,
        extra: &[],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Service",
        plural: "services",
        short: &["svc"],
        namespaced: true,
        status: true,
        extra: &[],
    },
    // Served so that installs which ship one (snapdrain's kustomize base: a quota admitting
    // system-cluster-critical pods) apply; quotas are stored, not enforced.
    Builtin {
        group: "",
        version: "v1",
        kind: "ResourceQuota",
        plural: "resourcequotas",
        short: &["quota"],
        namespaced: true,
        status: true,
        extra: &[],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "ServiceAccount",
        plural: "serviceaccounts",
        short: &["sa"],
        namespaced: true,
        status: false,
        extra: &["token"],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Event",
        plural: "events",
        short: &["ev"],
        namespaced: true,
        status: false,
        extra: &[],
    },
    Builtin {
        group: "apps",
        version: "v1",
        kind: "StatefulSet",
        plural: "statefulsets",
        short: &["sts"],
        namespaced: true,
        status: true,
        extra: &["scale"],
    },
    Builtin {
        group: "apps",
        version: "v1",
        kind: "Deployment",
        plural: "deployments",
        short: &["deploy"],
        namespaced: true,
        status: true,
        extra: &["scale"],
    },
    Builtin {
        group: "apps",
        version: "v1",
        kind: "ReplicaSet",
        plural: "replicasets",
        short: &["rs"],
        namespaced: true,
        status: true,
        extra: &["scale"],
    },
    Builtin {
        group: "apps",
        version: "v1",
        kind: "DaemonSet",
        plural: "daemonsets",
        short: &["ds"],
        namespaced: true,
        status: true,
        extra: &[],
    },
    Builtin {
        group: "batch",
        version: "v1",
        kind: "Job",
        plural: "jobs",
        short: &[],
        namespaced: true,
        status: true,
        extra: &[],
    },
    Builtin {
        group: "policy",
        version: "v1",
        kind: "PodDisruptionBudget",
        plural: "poddisruptionbudgets",
        short: &["pdb"],
        namespaced: true,
        status: true,
        extra: &[],
    },
    // Stored only: the simulator runs no network, so nothing enforces a NetworkPolicy (the chart's
    // optional one must still install).
    Builtin {
        group: "networking.k8s.io",
        version: "v1",
        kind: "NetworkPolicy",
        plural: "networkpolicies",
        short: &["netpol"],
        namespaced: true,
        status: false,
        extra: &[],
    },
    Builtin {
        group: "coordination.k8s.io",
        version: "v1",
        kind: "Lease",
        plural: "leases",
        short: &[],
        namespaced: true,
        status: false,
        extra: &[],
    },
    Builtin {
        group: "events.k8s.io",
        version: "v1",
        kind: "Event",
        plural: "events",
        short: &["ev"],
        namespaced: true,
        status: false,
        extra: &[],
    },
    Builtin {
        group: "storage.k8s.io",
        version: "v1",
        kind: "VolumeAttachment",
        plural: "volumeattachments",
        short: &[],
        namespaced: false,
        status: true,
        extra: &[],
    },
    Builtin {
        group: "storage.k8s.io",
        version: "v1",
        kind: "StorageClass",
        plural: "storageclasses",
        short: &["sc"],
        namespaced: false,
        status: false,
        extra: &[],
    },
    Builtin {
        group: "admissionregistration.k8s.io",
        version: "v1",
        kind: "ValidatingWebhookConfiguration",
        plural: "validatingwebhookconfigurations",
        short: &[],
        namespaced: false,
        status: false,
        extra: &[],
    },
    // Stored and enforced by admission/policy.rs.
    Builtin {
        group: "admissionregistration.k8s.io",
        version: "v1",
        kind: "ValidatingAdmissionPolicy",
        plural: "validatingadmissionpolicies",
        short: &[],
        namespaced: false,
        status: true,
        extra: &[],
    },
    Builtin {
        group: "admissionregistration.k8s.io",
        version: "v1",
        kind: "ValidatingAdmissionPolicyBinding",
        plural: "validatingadmissionpolicybindings",
        short: &[],
        namespaced: false,
        status: false,
        extra: &[],
    },
    Builtin {
        group: "apiextensions.k8s.io",
        version: "v1",
        kind: "CustomResourceDefinition",
        plural: "customresourcedefinitions",
        short: &["crd", "crds"],
        namespaced: false,
        status: true,
        extra: &[],
    },
    Builtin {
        group: "authorization.k8s.io",
        version: "v1",
        kind: "SelfSubjectAccessReview",
        plural: "selfsubjectaccessreviews",
        short: &[],
        namespaced: false,
        status: false,
        extra: &[],
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "ClusterRole",
        plural: "clusterroles",
        short: &[],
        namespaced: false,
        status: false,
        extra: &[],
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "ClusterRoleBinding",
        plural: "clusterrolebindings",
        short: &[],
        namespaced: false,
        status: false,
        extra: &[],
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "Role",
        plural: "roles",
        short: &[],
        namespaced: true,
        status: false,
        extra: &[],
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "RoleBinding",
        plural: "rolebindings",
        short: &[],
        namespaced: true,
        status: false,
        extra: &[],
    },
];

/// Columns `kubectl get` shows for built-in kinds, close to the real server-side printers.
fn builtin_columns(kind: &str) -> Vec<PrinterColumn> {
    let age = col("Age", "date", ".metadata.creationTimestamp", 0);
    let mut cols = match kind {
        "Pod" => vec![
            col("Ready", "string", "@podReady", 0),
            col("Status", "string", "@podStatus", 0),
            col("Restarts", "string", "@podRestarts", 0),
            age.clone(),
            col("IP", "string", ".status.podIP", 1),
            col("Node", "string", ".spec.nodeName", 1),
        ],
        "Node" => vec![
            col("Status", "string", "@nodeStatus", 0),
            col("Roles", "string", "@nodeRoles", 0),
            age.clone(),
            col("Version", "string", ".status.nodeInfo.kubeletVersion", 0),
            col(
                "Internal-IP",
                "string",
                ".status.addresses[?(@.type==\"InternalIP\")].address",
                1,
            ),
            col("OS-Image", "string", ".status.nodeInfo.osImage", 1),
        ],
        "StatefulSet" => vec![col("Ready", "string", "@readyOfReplicas", 0), age.clone()],
        "Deployment" => vec![
            col("Ready", "string", "@readyOfReplicas", 0),
            col("Up-to-date", "integer", ".status.updatedReplicas", 0),
            col("Available", "integer", ".status.availableReplicas", 0),
            age.clone(),
        ],
        "ReplicaSet" => vec![
            col("Desired", "integer", ".spec.replicas", 0),
            col("Current", "integer", ".status.replicas", 0),
            col("Ready", "integer", ".status.readyReplicas", 0),
            age.clone(),
        ],
        "DaemonSet" => vec![
            col("Desired", "integer", ".status.desiredNumberScheduled", 0),
            col("Current", "integer", ".status.currentNumberScheduled", 0),
            col("Ready", "integer", ".status.numberReady", 0),
            age.clone(),
        ],
        "PodDisruptionBudget" => vec![
            col("Min Available", "string", ".spec.minAvailable", 0),
            col("Max Unavailable", "string", ".spec.maxUnavailable", 0),
            col(
                "Allowed Disruptions",
                "integer",
                ".status.disruptionsAllowed",
                0,
            ),
            age.clone(),
        ],
        "PersistentVolumeClaim" => vec![
            col("Status", "string", ".status.phase", 0),
            col("Volume", "string", ".spec.volumeName", 0),
            col("Capacity", "string", ".status.capacity.storage", 0),
            col("Access Modes", "string", ".spec.accessModes", 0),
            col("StorageClass", "string", ".spec.storageClassName", 0),
            age.clone(),
        ],
        "PersistentVolume" => vec![
            col("Capacity", "string", ".spec.capacity.storage", 0),
            col("Status", "string", ".status.phase", 0),
            col("Claim", "string", "@pvClaim", 0),
            age.clone(),
        ],
        "Namespace" => vec![col("Status", "string", ".status.phase", 0), age.clone()],
        "VolumeAttachment" => vec![
            col("Attacher", "string", ".spec.attacher", 0),
            col("PV", "string", ".spec.source.persistentVolumeName", 0),
            col("Node", "string", ".spec.nodeName", 0),
            col("Attached", "boolean", ".status.attached", 0),
            age.clone(),
        ],
        "Lease" => vec![
            col("Holder", "string", ".spec.holderIdentity", 0),
            age.clone(),
        ],
        "Service" => vec![
            col("Type", "string", ".spec.type", 0),
            col("Cluster-IP", "string", ".spec.clusterIP", 0),
            age.clone(),
        ],
        "CustomResourceDefinition" => {
            vec![col("Created At", "date", ".metadata.creationTimestamp", 0)]
        }
        _ => vec![age.clone()],
    };
    if kind == "Event" {
        cols = vec![
            col("Last Seen", "date", ".lastTimestamp", 0),
            col("Type", "string", ".type", 0),
            col("Reason", "string", ".reason", 0),
            col("Object", "string", "@eventObject", 0),
            col("Message", "string", ".message", 0),
        ];
    }
    cols
}

impl Registry {
    pub fn with_builtins() -> Self {
        let mut reg = Registry::default();
        for b in BUILTINS {
            let def = ResourceDef {
                group: b.group.to_string(),
                versions: vec![b.version.to_string()],
                kind: b.kind.to_string(),
                plural: b.plural.to_string(),
                singular: b.kind.to_lowercase(),
                short_names: b.short.iter().map(|s| s.to_string()).collect(),
                categories: if matches!(
                    b.plural,
                    "pods"
                        | "services"
                        | "statefulsets"
                        | "deployments"
                        | "replicasets"
                        | "daemonsets"
                        | "jobs"
                ) {
                    vec!["all".to_string()]
                } else {
                    vec![]
                },
                namespaced: b.namespaced,
                status_subresource: b.status,
                extra_subresources: b.extra.iter().map(|s| s.to_string()).collect(),
                printer_columns: builtin_columns(b.kind),
                custom: false,
            };
            reg.defs.insert(def.key(), Arc::new(def));
        }
        reg
    }

    pub fn get(&self, key: &ResKey) -> Option<&ResourceDef> {
        self.defs.get(key).map(Arc::as_ref)
    }

    /// The shared definition of `key`.
    pub fn get_shared(&self, key: &ResKey) -> Option<Arc<ResourceDef>> {
        self.defs.get(key).cloned()
    }

    /// Finds the definition serving `plural` in `group/version`.
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceDef> {
        self.defs
            .get(&ResKey::new(group, plural))
            .map(Arc::as_ref)
            .filter(|d| d.serves(version))
    }

    /// Finds a definition by kind within a group, for objects whose apiVersion/kind is all we know.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<&ResourceDef> {
        let (group, version) = split_api_version(api_version);
        self.defs
            .values()
            .map(Arc::as_ref)
            .find(|d| d.group == group && d.kind == kind && d.serves(version))
    }

    pub fn insert(&mut self, def: ResourceDef) {
        self.defs.insert(def.key(), Arc::new(def));
    }

    pub fn remove(&mut self, key: &ResKey) -> Option<ResourceDef> {
        self.defs.remove(key).map(Arc::unwrap_or_clone)
    }

    pub fn all(&self) -> impl Iterator<Item = &ResourceDef> {
        self.defs.values().map(Arc::as_ref)
    }

    /// `/api` (core group versions).
    pub fn core_versions(&self, server_address: &str) -> Value {
        json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]})
    }

    /// Groups and their versions, preferred version first (the storage version of the first kind seen).
    fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for d in self.defs.values().filter(|d| !d.group.is_empty()) {
            let entry = groups.entry(d.group.clone()).or_default();
            for v in &d.versions {
                if !entry.contains(v) {
                    entry.push(v.clone());
                }
            }
        }
        groups
    }

    fn group_json(group: &str, versions: &[String]) -> Value {
        let vs: Vec<Value> = versions
            .iter()
            .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
            .collect();
        json!({"name": group, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
    }

    /// `/apis`.
    pub fn group_list(&self) -> Value {
        let groups: Vec<Value> = self
            .groups()
            .iter()
            .map(|(g, vs)| Self::group_json(g, vs))
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    /// `/apis/{group}`.
    pub fn group(&self, group: &str) -> Option<Value> {
        self.groups().get(group).map(|vs| {
            let mut g = Self::group_json(group, vs);
            g["kind"] = json!("APIGroup");
            g["apiVersion"] = json!("v1");
            g
        })
    }

    /// `/api/v1` or `/apis/{group}/{version}`; None when nothing is served there.
    pub fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let resources: Vec<Value> = self
            .defs
            .values()
            .filter(|d| d.group == group && d.serves(version))
            .flat_map(|d| d.discovery_entries())
            .collect();
        if resources.is_empty() {
            return None;
        }
        let gv = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        Some(
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
        )
    }
}

pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    }
}

/// Turns a CustomResourceDefinition object into the definition it serves, or says what is wrong with it.
pub fn def_from_crd(crd: &Value) -> Result<ResourceDef, String> {
    let spec = crd.get("spec").ok_or("spec is required")?;
    let group = spec
        .get("group")
        .and_then(Value::as_str)
        .ok_or("spec.group is required")?;
    let names = spec.get("names").ok_or("spec.names is required")?;
    let plural = names
        .get("plural")
        .and_then(Value::as_str)
        .ok_or("spec.names.plural is required")?;
    let kind = names
        .get("kind")
        .and_then(Value::as_str)
        .ok_or("spec.names.kind is required")?;
    let scope = spec
        .get("scope")
        .and_then(Value::as_str)
        .unwrap_or("Namespaced");
    let expected_name = format!("{plural}.{group}");
    let name = crd
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if name != expected_name {
        return Err(format!(
            "metadata.name: Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group (\"{expected_name}\")"
        ));
    }
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .ok_or("spec.versions is required")?;
    let mut served: Vec<(bool, &Value)> = Vec::new();
    for v in versions {
        if v.get("served").and_then(Value::as_bool).unwrap_or(false) {
            served.push((
                v.get("storage").and_then(Value::as_bool).unwrap_or(false),
                v,
            ));
        }
    }
    if served.is_empty() {
        return Err(
            "spec.versions: Invalid value: must have at least one served version".to_string(),
        );
    }
    // Storage version first: it is the preferred version in discovery and the one columns come from.
    served.sort_by_key(|(storage, _)| !*storage);
    let primary = served[0].1;
    let status_subresource = primary.pointer("/subresources/status").is_some();
    let mut extra = Vec::new();
    if primary.pointer("/subresources/scale").is_some() {
        extra.push("scale".to_string());
    }
    let mut printer_columns = Vec::new();
    if let Some(cols) = primary
        .get("additionalPrinterColumns")
        .and_then(Value::as_array)
    {
        for c in cols {
            printer_columns.push(PrinterColumn {
                name: c
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                type_: c
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("string")
                    .to_string(),
                json_path: c
                    .get("jsonPath")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                description: c
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            });
        }
    }
    if printer_columns.is_empty() {
        printer_columns.push(col("Age", "date", ".metadata.creationTimestamp", 0));
    }
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    Ok(ResourceDef {
        group: group.to_string(),
        versions: served
            .iter()
            .filter_map(|(_, v)| v.get("name").and_then(Value::as_str).map(str::to_string))
            .collect(),
        kind: kind.to_string(),
        plural: plural.to_string(),
        singular: names
            .get("singular")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| kind.to_lowercase()),
        short_names: strings(names.get("shortNames")),
        categories: strings(names.get("categories")),
        namespaced: scope == "Namespaced",
        status_subresource,
        extra_subresources: extra,
        printer_columns,
        custom: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_discoverable_with_short_names() {
        let reg = Registry::with_builtins();
        let core = reg.resource_list("", "v1").expect("core group is served");
        let pods = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods")
            .unwrap();
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert!(
            core["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["name"] == "pods/eviction" && r["kind"] == "Eviction")
        );
        let apps = reg.resource_list("apps", "v1").unwrap();
        assert!(
            apps["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["name"] == "statefulsets" && r["shortNames"] == json!(["sts"]))
        );
        assert!(reg.group("policy").is_some());
        assert!(reg.resource_list("apps", "v2").is_none());
    }

    #[test]
    fn crd_becomes_a_definition_with_storage_version_first() {
        let crd = json!({"metadata": {"name": "widgets.example.com"}, "spec": {"group": "example.com", "scope": "Cluster",
            "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [{"name": "v1beta1", "served": true, "storage": false},
                         {"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                          "additionalPrinterColumns": [{"name": "Phase", "type": "string", "jsonPath": ".status.phase"}]}]}});
        let def = def_from_crd(&crd).unwrap();
        assert_eq!(def.versions, vec!["v1", "v1beta1"]);
        assert!(!def.namespaced);
        assert!(def.status_subresource);
        assert_eq!(def.printer_columns[0].json_path, ".status.phase");
        let bad = json!({"metadata": {"name": "wrong"}, "spec": crd["spec"].clone()});
        assert!(
            def_from_crd(&bad)
                .unwrap_err()
                .contains("widgets.example.com")
        );
    }
}
