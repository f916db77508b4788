//! Small, pure helpers over Kubernetes objects as JSON: metadata, conditions, selectors, taints,
//! quantities and owner references, shared by the world controllers and the scenario loader.

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use std::sync::Arc;

use crate::apiserver::errors::ApiError;
use crate::apiserver::meta::{meta_str, now_rfc3339};
use crate::apiserver::resources::ResKey;
use crate::apiserver::store::{DeleteOptions, Store, WriteOptions};

pub fn pods() -> ResKey {
    ResKey::core("pods")
}
pub fn nodes() -> ResKey {
    ResKey::core("nodes")
}
pub fn pvcs() -> ResKey {
    ResKey::core("persistentvolumeclaims")
}
pub fn pvs() -> ResKey {
    ResKey::core("persistentvolumes")
}
pub fn statefulsets() -> ResKey {
    ResKey::new("apps", "statefulsets")
}
pub fn deployments() -> ResKey {
    ResKey::new("apps", "deployments")
}
pub fn replicasets() -> ResKey {
    ResKey::new("apps", "replicasets")
}
pub fn daemonsets() -> ResKey {
    ResKey::new("apps", "daemonsets")
}
pub fn jobs() -> ResKey {
    ResKey::new("batch", "jobs")
}
pub fn volumeattachments() -> ResKey {
    ResKey::new("storage.k8s.io", "volumeattachments")
}
pub fn nodeclaims() -> ResKey {
    ResKey::new("karpenter.sh", "nodeclaims")
}
pub fn nodepools() -> ResKey {
    ResKey::new("karpenter.sh", "nodepools")
}

/// Writes of the simulated controllers: they may set status like the real controllers do.
pub fn internal() -> WriteOptions {
    WriteOptions {
        internal: true,
        ..Default::default()
    }
}

/// Deletes exactly this object (not a newer one with the same name).
pub fn delete_uid(uid: &str, grace: Option<i64>) -> DeleteOptions {
    DeleteOptions {
        grace_period_seconds: grace,
        precondition_uid: Some(uid.to_string()),
        ..Default::default()
    }
}

pub fn modify_uid(
    store: &Store,
    res: &ResKey,
    ns: Option<&str>,
    name: &str,
    uid_want: &str,
    f: impl FnOnce(&mut Value) -> bool,
) -> Option<Arc<Value>> {
    store
        .modify(res, ns, name, None, internal(), |current| {
            if uid(current) != uid_want {
                return Err(ApiError::new(409, "Conflict", "replaced by a newer object"));
            }
            let mut next = current.clone();
            if f(&mut next) {
                Ok(next)
            } else {
                Err(ApiError::new(409, "Conflict", "nothing to change"))
            }
        })
        .ok()
}

/// `Some(ns)` for namespaced objects, `None` for cluster-scoped ones (empty namespace).
pub fn ns_opt(ns: &str) -> Option<&str> {
    (!ns.is_empty()).then_some(ns)
}

pub fn now() -> String {
    now_rfc3339()
}

pub fn name(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or("")
}
pub fn namespace(obj: &Value) -> &str {
    meta_str(obj, "namespace").unwrap_or("")
}
pub fn uid(obj: &Value) -> &str {
    meta_str(obj, "uid").unwrap_or("")
}
pub fn generation(obj: &Value) -> i64 {
    obj.pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0)
}
pub fn labels(obj: &Value) -> Option<&Map<String, Value>> {
    obj.pointer("/metadata/labels").and_then(Value::as_object)
}
pub fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    labels(obj).and_then(|l| l.get(key)).and_then(Value::as_str)
}
pub fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}
pub fn is_terminating(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp").is_some()
}
pub fn str_at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a str> {
    obj.pointer(pointer).and_then(Value::as_str)
}
pub fn i64_at(obj: &Value, pointer: &str) -> Option<i64> {
    obj.pointer(pointer).and_then(Value::as_i64)
}

pub fn phase(pod: &Value) -> &str {
    str_at(pod, "/status/phase").unwrap_or("Pending")
}
pub fn is_terminal(pod: &Value) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}
pub fn node_name(pod: &Value) -> Option<&str> {
    str_at(pod, "/spec/nodeName").filter(|n| !n.is_empty())
}

/// The status of condition `type_` ("True", "False", "Unknown"), if present.
pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a str> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
        .and_then(|c| c.get("status"))
        .and_then(Value::as_str)
}
pub fn pod_ready(pod: &Value) -> bool {
    phase(pod) == "Running" && condition(pod, "Ready") == Some("True") && !is_terminating(pod)
}
/// A node counts as Ready unless it says otherwise (nodes created without status are made Ready by the
/// kubelet right after).
pub fn node_ready(node: &Value) -> bool {
    condition(node, "Ready") != Some("False") && condition(node, "Ready") != Some("Unknown")
}

/// Sets a condition in `obj.status.conditions`, keeping `lastTransitionTime` when the status is unchanged.
pub fn set_condition(obj: &mut Value, type_: &str, status: &str, reason: &str, message: &str) {
    if !obj.get("status").is_some_and(Value::is_object) {
        obj["status"] = json!({});
    }
    if !obj["status"].get("conditions").is_some_and(Value::is_array) {
        obj["status"]["conditions"] = json!([]);
    }
    let now = now();
    let Some(conds) = obj["status"]["conditions"].as_array_mut() else {
        return;
    };
    match conds
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
    {
        Some(c) => {
            if c.get("status").and_then(Value::as_str) != Some(status) {
                c["lastTransitionTime"] = json!(now);
            }
            c["status"] = json!(status);
            set_or_remove(c, "reason", reason);
            set_or_remove(c, "message", message);
        }
        None => {
            let mut c = json!({"type": type_, "status": status, "lastTransitionTime": now});
            set_or_remove(&mut c, "reason", reason);
            set_or_remove(&mut c, "message", message);
            conds.push(c);
        }
    }
}

fn set_or_remove(obj: &mut Value, field: &str, value: &str) {
    if value.is_empty() {
        if let Some(m) = obj.as_object_mut() {
            m.remove(field);
        }
    } else {
        obj[field] = json!(value);
    }
}

/// The owner reference marked `controller: true`: (kind, name, uid).
pub fn controller_of(obj: &Value) -> Option<(&str, &str, &str)> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
        .map(|r| {
            (
                r.get("kind").and_then(Value::as_str).unwrap_or(""),
                r.get("name").and_then(Value::as_str).unwrap_or(""),
                r.get("uid").and_then(Value::as_str).unwrap_or(""),
            )
        })
}

/// The uid of the controlling owner when it is of `kind`.
pub fn controller_uid<'a>(obj: &'a Value, kind: &str) -> Option<&'a str> {
    controller_of(obj)
        .filter(|(k, _, _)| *k == kind)
        .map(|(_, _, u)| u)
}

pub fn controller_ref(owner: &Value) -> Value {
    json!({
        "apiVersion": owner.get("apiVersion").cloned().unwrap_or(Value::Null),
        "kind": owner.get("kind").cloned().unwrap_or(Value::Null),
        "name": name(owner),
        "uid": uid(owner),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// A metav1.LabelSelector (matchLabels and matchExpressions) against a label map. An empty selector
/// matches everything, as for workloads; a missing one matches nothing.
pub fn selector_matches(selector: Option<&Value>, labels: Option<&Map<String, Value>>) -> bool {
    let empty = Map::new();
    crate::apiserver::selectors::LabelSelector::metav1_matches(selector, labels.unwrap_or(&empty))
}

/// One `matchExpressions` entry (label or node selector requirement) against the value of its key.
pub fn expression_matches(expr: &Value, actual: Option<&str>) -> bool {
    let values: Vec<&str> = expr
        .get("values")
        .and_then(Value::as_array)
        .map(|v| v.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let num = |s: &str| s.parse::<i64>().ok();
    match expr.get("operator").and_then(Value::as_str).unwrap_or("") {
        "In" => actual.is_some_and(|a| values.contains(&a)),
        "NotIn" => actual.is_none_or(|a| !values.contains(&a)),
        "Exists" => actual.is_some(),
        "DoesNotExist" => actual.is_none(),
        "Gt" => {
            matches!((actual.and_then(num), values.first().and_then(|v| num(v))), (Some(a), Some(b)) if a > b)
        }
        "Lt" => {
            matches!((actual.and_then(num), values.first().and_then(|v| num(v))), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

/// A NodeSelectorTerm: every matchExpressions (on labels) and matchFields (metadata.name) entry holds.
pub fn node_term_matches(term: &Value, node: &Value) -> bool {
    let exprs_ok = term
        .get("matchExpressions")
        .and_then(Value::as_array)
        .is_none_or(|es| {
            es.iter().all(|e| {
                let key = e.get("key").and_then(Value::as_str).unwrap_or("");
                expression_matches(e, label(node, key))
            })
        });
    let fields_ok = term
        .get("matchFields")
        .and_then(Value::as_array)
        .is_none_or(|es| {
            es.iter().all(|e| {
                let actual = match e.get("key").and_then(Value::as_str) {
                    Some("metadata.name") => Some(name(node)),
                    _ => None,
                };
                expression_matches(e, actual)
            })
        });
    exprs_ok && fields_ok
}

/// Whether the pod may run on the node by nodeSelector and required node affinity.
pub fn node_affinity_allows(pod: &Value, node: &Value) -> bool {
    if let Some(sel) = pod.pointer("/spec/nodeSelector").and_then(Value::as_object) {
        for (k, v) in sel {
            if label(node, k) != v.as_str() {
                return false;
            }
        }
    }
    match pod
        .pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array)
    {
        // Terms are ORed.
        Some(terms) if !terms.is_empty() => terms.iter().any(|t| node_term_matches(t, node)),
        _ => true,
    }
}

/// Whether `tolerations` tolerate `taint` (key, value, effect), with the real operator semantics.
pub fn tolerates(tolerations: Option<&Value>, taint: &Value) -> bool {
    let Some(tols) = tolerations.and_then(Value::as_array) else {
        return false;
    };
    let t_key = taint.get("key").and_then(Value::as_str).unwrap_or("");
    let t_value = taint.get("value").and_then(Value::as_str).unwrap_or("");
    let t_effect = taint.get("effect").and_then(Value::as_str).unwrap_or("");
    tols.iter().any(|tol| {
        let effect = tol.get("effect").and_then(Value::as_str).unwrap_or("");
        if !effect.is_empty() && effect != t_effect {
            return false;
        }
        let key = tol.get("key").and_then(Value::as_str).unwrap_or("");
        let op = tol
            .get("operator")
            .and_then(Value::as_str)
            .unwrap_or("Equal");
        if key.is_empty() {
            // An empty key with Exists tolerates everything.
            return op == "Exists";
        }
        key == t_key
            && match op {
                "Exists" => true,
                _ => tol.get("value").and_then(Value::as_str).unwrap_or("") == t_value,
            }
    })
}

/// Taints with effect NoSchedule or NoExecute that the pod does not tolerate.
pub fn untolerated_taint<'a>(pod: &Value, node: &'a Value) -> Option<&'a Value> {
    let tolerations = pod.pointer("/spec/tolerations");
    node.pointer("/spec/taints")
        .and_then(Value::as_array)?
        .iter()
        .filter(|t| {
            matches!(
                t.get("effect").and_then(Value::as_str),
                Some("NoSchedule" | "NoExecute")
            )
        })
        .find(|t| !tolerates(tolerations, t))
}

/// CPU quantity in millicores ("250m", "2", "0.5").
pub fn cpu_millis(q: &Value) -> i64 {
    let s = match q {
        Value::String(s) => s.as_str(),
        Value::Number(n) => return (n.as_f64().unwrap_or(0.0) * 1000.0) as i64,
        _ => return 0,
    };
    match s.strip_suffix('m') {
        Some(m) => m.parse().unwrap_or(0),
        None => (s.parse::<f64>().unwrap_or(0.0) * 1000.0) as i64,
    }
}

/// Byte quantity ("512Mi", "16Gi", "1G", "1000").
pub fn bytes(q: &Value) -> i64 {
    let s = match q {
        Value::String(s) => s.as_str(),
        Value::Number(n) => return n.as_f64().unwrap_or(0.0) as i64,
        _ => return 0,
    };
    const SUFFIXES: &[(&str, f64)] = &[
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("k", 1e3),
        ("K", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    for (suffix, mult) in SUFFIXES {
        if let Some(n) = s.strip_suffix(suffix) {
            return (n.parse::<f64>().unwrap_or(0.0) * mult) as i64;
        }
    }
    s.parse::<f64>().unwrap_or(0.0) as i64
}

/// Summed container requests: (millicores, bytes).
pub fn pod_requests(pod: &Value) -> (i64, i64) {
    let mut cpu = 0;
    let mut mem = 0;
    for c in pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(r) = c.pointer("/resources/requests") {
            cpu += r.get("cpu").map_or(0, cpu_millis);
            mem += r.get("memory").map_or(0, bytes);
        }
    }
    (cpu, mem)
}

/// Names of the PVCs a pod mounts.
pub fn pod_claims(pod: &Value) -> Vec<&str> {
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| {
            v.pointer("/persistentVolumeClaim/claimName")
                .and_then(Value::as_str)
        })
        .collect()
}

/// A short stable hash of a pod template, in the alphabet Kubernetes uses for name suffixes.
pub fn template_hash(template: &Value) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let digest = Sha256::digest(template.to_string().as_bytes());
    digest
        .iter()
        .take(10)
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

pub fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_and_tolerations() {
        assert_eq!(cpu_millis(&json!("250m")), 250);
        assert_eq!(cpu_millis(&json!("2")), 2000);
        assert_eq!(bytes(&json!("1Gi")), 1 << 30);
        let taint = json!({"key": "dedicated", "value": "db", "effect": "NoSchedule"});
        assert!(tolerates(Some(&json!([{"operator": "Exists"}])), &taint));
        assert!(tolerates(
            Some(&json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}])),
            &taint
        ));
        assert!(!tolerates(
            Some(&json!([{"key": "dedicated", "value": "web"}])),
            &taint
        ));
        assert!(!tolerates(None, &taint));
    }

    #[test]
    fn selectors_and_affinity() {
        let labels = json!({"app": "db", "tier": "x"});
        let l = labels.as_object();
        assert!(selector_matches(
            Some(&json!({"matchLabels": {"app": "db"}})),
            l
        ));
        assert!(!selector_matches(
            Some(
                &json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["x"]}]})
            ),
            l
        ));
        let node =
            json!({"metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "a"}}});
        let pod = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}]},
                                   {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}});
        assert!(node_affinity_allows(&pod, &node));
        let pod2 = json!({"spec": {"nodeSelector": {"topology.kubernetes.io/zone": "b"}}});
        assert!(!node_affinity_allows(&pod2, &node));
    }
}
