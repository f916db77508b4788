//! Strategic merge patch for built-in kinds, following k8s.io/apimachinery
//! pkg/util/strategicpatch/patch.go (`mergeMap`, `mergeSlice`, `normalizeElementOrder`) with the
//! options the apiserver uses (`MergeParallelList`, `IgnoreUnmatchedNulls`). Error codes follow
//! `interpretStrategicMergePatchError` in the apiserver's patch handler.

use serde_json::{Map, Value};

use super::error::PatchError;
use super::schema::{PatchStrategy, Schema, join};

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";

/// Applies a strategic merge patch to `original`. The caller must have refused custom resources
/// (415, see `PatchType::unsupported`) and passes the kind's schema, e.g. from `Schema::builtin`.
pub fn strategic_merge(
    original: &Value,
    patch: &Value,
    schema: &Schema,
) -> Result<Value, PatchError> {
    let (Value::Object(original), Value::Object(patch)) = (original, patch) else {
        return Err(PatchError::bad_request("invalid JSON document"));
    };
    merge_map(original.clone(), patch.clone(), schema, "").map(Value::Object)
}

fn merge_map(
    mut original: Map<String, Value>,
    mut patch: Map<String, Value>,
    schema: &Schema,
    path: &str,
) -> Result<Map<String, Value>, PatchError> {
    if let Some(directive) = patch.shift_remove(DIRECTIVE) {
        match directive.as_str() {
            // The map in the patch replaces the original; cleaning strips nested directives/nulls.
            Some("replace") => return merge_map(Map::new(), patch, schema, path),
            Some("delete") => return Ok(Map::new()),
            // Upstream rejects `merge` inside a map; it means the default, so we accept it.
            Some("merge") => {}
            _ => return Err(bad_patch_type(&directive, &patch)),
        }
    }

    if let Some(retain) = patch.shift_remove(RETAIN_KEYS) {
        let keys = string_list(&retain)
            .ok_or_else(|| PatchError::bad_request("invalid patch format of retainKeys"))?;
        let outside = patch
            .iter()
            .any(|(k, v)| !k.starts_with('$') && !v.is_null() && !keys.contains(&k.as_str()));
        if outside {
            return Err(PatchError::invalid(
                "patch content doesn't match retainKeys list",
            ));
        }
        original.retain(|k, _| keys.contains(&k.as_str()));
    }

    // Directives that travel beside a list field, split out before the ordinary keys.
    let mut orders: Vec<(String, Vec<Value>, Option<Value>)> = Vec::new();
    let mut fields: Vec<(String, Value)> = Vec::new();
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix(SET_ELEMENT_ORDER) {
            let Value::Array(order) = value else {
                return Err(PatchError::bad_request(
                    "invalid patch format of setElementOrder list",
                ));
            };
            orders.push((field.to_string(), order, original.get(field).cloned()));
        } else if let Some(field) = key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
            let bad = || PatchError::bad_request("invalid patch format of primitive list");
            let Value::Array(remove) = value else {
                return Err(bad());
            };
            if remove.iter().any(|v| v.is_object() || v.is_array()) {
                return Err(bad());
            }
            if let Some(Value::Array(list)) = original.get_mut(field) {
                list.retain(|v| !remove.contains(v));
            }
        } else if !key.starts_with('$') {
            fields.push((key, value));
        }
    }

    for (key, patch_value) in fields {
        let field_path = join(path, &key);
        if patch_value.is_null() {
            original.shift_remove(&key);
            continue;
        }
        let strategy = &schema.field(&field_path).strategy;
        // Taking the value in place (not removing it) keeps the key's position in the object.
        let existing = original.get_mut(&key).map(std::mem::take);
        let merged = match (existing, patch_value) {
            (Some(Value::Object(o)), Value::Object(p)) if *strategy != PatchStrategy::Replace => {
                Value::Object(merge_map(o, p, schema, &field_path)?)
            }
            (Some(Value::Array(o)), Value::Array(p)) => {
                Value::Array(merge_list(o, p, strategy, schema, &field_path)?)
            }
            // Absent, of another type, or replaced: take the patch value, minus directives/nulls.
            (_, p) => clean(p, strategy, schema, &field_path)?,
        };
        original.insert(key, merged);
    }

    for (field, order, server) in orders {
        let key = match &schema.field(&join(path, &field)).strategy {
            PatchStrategy::Merge { key, .. } => *key,
            _ => None,
        };
        if let Some(Value::Array(list)) = original.get_mut(&field) {
            let server = match server {
                Some(Value::Array(server)) => server,
                _ => Vec::new(),
            };
            let merged = std::mem::take(list);
            *list = enforce_order(merged, &order, &server, key)?;
        }
    }
    Ok(original)
}

/// A patch value placed where the original has nothing mergeable: directives are applied against
/// an empty original, so they never leak into the stored object.
fn clean(
    value: Value,
    strategy: &PatchStrategy,
    schema: &Schema,
    path: &str,
) -> Result<Value, PatchError> {
    Ok(match value {
        Value::Object(p) => Value::Object(merge_map(Map::new(), p, schema, path)?),
        Value::Array(p) => Value::Array(merge_list(Vec::new(), p, strategy, schema, path)?),
        other => other,
    })
}

fn merge_list(
    original: Vec<Value>,
    patch: Vec<Value>,
    strategy: &PatchStrategy,
    schema: &Schema,
    path: &str,
) -> Result<Vec<Value>, PatchError> {
    let PatchStrategy::Merge { key, .. } = strategy else {
        // Lists without a merge strategy are replaced; only directive-only items are dropped.
        return patch
            .into_iter()
            .filter(|item| !is_directive_only(item))
            .map(|item| clean(item, &PatchStrategy::Default, schema, path))
            .collect();
    };
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    let all_maps = check_element_types(&original, &patch)?;
    if !all_maps {
        let mut merged = original.clone();
        for v in &patch {
            if !merged.contains(v) {
                merged.push(v.clone());
            }
        }
        return enforce_order(merged, &patch, &original, None);
    }
    let Some(key) = key else {
        return Err(PatchError::bad_request(format!(
            "cannot merge lists without merge key for {path}"
        )));
    };

    let mut original = original;
    let mut items = Vec::new();
    let mut replace = false;
    for item in patch {
        match item.get(DIRECTIVE) {
            None => items.push(item),
            Some(d) => match d.as_str() {
                Some("delete") => {
                    let Some(value) = item.get(*key) else {
                        return Err(no_merge_key(&item, key));
                    };
                    original.retain(|o| o.get(*key) != Some(value));
                }
                // Keep scanning so other `$patch` items are dropped too.
                Some("replace") => replace = true,
                Some("merge") => {
                    return Err(PatchError::bad_request(
                        "merging lists cannot yet be specified in the patch",
                    ));
                }
                _ => return Err(bad_patch_type(d, item.as_object().unwrap_or(&Map::new()))),
            },
        }
    }
    if replace {
        return items
            .into_iter()
            .map(|item| clean(item, &PatchStrategy::Default, schema, path))
            .collect();
    }

    let server = original.clone();
    for item in &items {
        let Some(value) = item.get(*key) else {
            return Err(no_merge_key(item, key));
        };
        let found = original.iter().position(|o| o.get(*key) == Some(value));
        let patch_map = item.as_object().cloned().unwrap_or_default();
        match found {
            Some(i) => {
                let base = match std::mem::take(&mut original[i]) {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                original[i] = Value::Object(merge_map(base, patch_map, schema, path)?);
            }
            None => original.push(Value::Object(merge_map(
                Map::new(),
                patch_map,
                schema,
                path,
            )?)),
        }
    }
    enforce_order(original, &items, &server, Some(key))
}

/// Checks list elements are all maps or all scalars, and returns whether they are maps.
fn check_element_types(original: &[Value], patch: &[Value]) -> Result<bool, PatchError> {
    let mut maps = None;
    for v in original.iter().chain(patch) {
        if v.is_array() {
            return Err(PatchError::invalid("lists of lists are not supported"));
        }
        let is_map = v.is_object();
        if *maps.get_or_insert(is_map) != is_map {
            return Err(PatchError::bad_request(
                "the list contains elements of different types",
            ));
        }
    }
    Ok(maps.unwrap_or(false))
}

/// `normalizeElementOrder`: items named in `order` come in that order, the others keep their
/// server order, and the two runs are interleaved by their positions in the server list.
fn enforce_order(
    merged: Vec<Value>,
    order: &[Value],
    server: &[Value],
    key: Option<&str>,
) -> Result<Vec<Value>, PatchError> {
    if let Some(key) = key
        && let Some(item) = order.iter().find(|o| o.get(key).is_none())
    {
        return Err(no_merge_key(item, key));
    }
    let index = |list: &[Value], item: &Value| -> Option<usize> {
        match key {
            Some(key) => {
                let wanted = item.get(key)?;
                list.iter().position(|o| o.get(key) == Some(wanted))
            }
            None => list.iter().position(|o| o == item),
        }
    };
    let (mut in_patch, mut server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|item| index(order, item).is_some());
    in_patch.sort_by_key(|item| index(order, item).unwrap_or(usize::MAX));
    server_only.sort_by_key(|item| index(server, item).unwrap_or(usize::MAX));

    let mut out = Vec::with_capacity(in_patch.len() + server_only.len());
    let mut left = server_only.into_iter().peekable();
    let mut right = in_patch.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => match (index(server, l), index(server, r)) {
                (Some(li), Some(ri)) => li < ri,
                _ => false,
            },
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    Ok(out)
}

fn is_directive_only(item: &Value) -> bool {
    item.as_object()
        .is_some_and(|m| !m.is_empty() && m.keys().all(|k| k.starts_with('$')))
}

fn string_list(value: &Value) -> Option<Vec<&str>> {
    value.as_array()?.iter().map(Value::as_str).collect()
}

fn bad_patch_type(directive: &Value, map: &Map<String, Value>) -> PatchError {
    let name = directive
        .as_str()
        .map_or_else(|| directive.to_string(), str::to_string);
    PatchError::bad_request(format!(
        "unknown patch type: {name} in map: {}",
        Value::Object(map.clone())
    ))
}

fn no_merge_key(item: &Value, key: &str) -> PatchError {
    PatchError::bad_request(format!(
        "map: {item} does not contain declared merge key: {key}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smp(kind: (&str, &str), original: Value, patch: Value) -> Result<Value, PatchError> {
        let schema = Schema::builtin(kind.0, kind.1).expect("built-in kind");
        strategic_merge(&original, &patch, schema)
    }

    fn node() -> Value {
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "ip-10-0-1-5", "labels": {"kubernetes.io/os": "linux"}},
               "spec": {"providerID": "aws:///eu-west-1a/i-0abc",
                        "taints": [{"key": "a", "effect": "NoSchedule"}]},
               "status": {"conditions": [
                   {"type": "MemoryPressure", "status": "False"},
                   {"type": "Ready", "status": "True", "reason": "KubeletReady"}]}})
    }

    fn deployment() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "namespace": "default"},
               "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                   "containers": [
                     {"name": "app", "image": "nginx:1.25",
                      "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                      "ports": [{"containerPort": 80, "protocol": "TCP"}]},
                     {"name": "sidecar", "image": "envoy:1"}],
                   "volumes": [{"name": "data", "emptyDir": {}}],
                   "tolerations": [{"key": "x", "operator": "Exists"}]}}}})
    }

    #[test]
    fn kubectl_cordon_patch() {
        let out = smp(
            ("v1", "Node"),
            node(),
            json!({"spec": {"unschedulable": true}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["unschedulable"], json!(true));
        assert_eq!(out["spec"]["providerID"], node()["spec"]["providerID"]);
        assert_eq!(out["spec"]["taints"], node()["spec"]["taints"]);
        // kubectl uncordon sends `null`, which deletes.
        let out = smp(
            ("v1", "Node"),
            out,
            json!({"spec": {"unschedulable": null}}),
        )
        .unwrap();
        assert!(out["spec"].get("unschedulable").is_none());
    }

    #[test]
    fn kubectl_label_and_unlabel() {
        let out = smp(
            ("v1", "Node"),
            node(),
            json!({"metadata": {"labels": {"a": "b"}}}),
        )
        .unwrap();
        assert_eq!(
            out["metadata"]["labels"],
            json!({"kubernetes.io/os": "linux", "a": "b"})
        );
        let out = smp(
            ("v1", "Node"),
            out,
            json!({"metadata": {"labels": {"kubernetes.io/os": null}}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"a": "b"}));
    }

    #[test]
    fn node_taints_are_replaced_not_merged() {
        let patch = json!({"spec": {"taints": [{"key": "b", "effect": "NoExecute"}]}});
        let out = smp(("v1", "Node"), node(), patch).unwrap();
        assert_eq!(
            out["spec"]["taints"],
            json!([{"key": "b", "effect": "NoExecute"}])
        );
    }

    #[test]
    fn node_conditions_merge_by_type() {
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        let out = smp(("v1", "Node"), node(), patch).unwrap();
        let conds = out["status"]["conditions"].as_array().unwrap();
        assert_eq!(conds.len(), 2);
        assert_eq!(conds[0]["type"], "MemoryPressure");
        assert_eq!(
            conds[1],
            json!({"type": "Ready", "status": "False", "reason": "KubeletReady"})
        );
    }

    #[test]
    fn client_side_apply_patch_with_set_element_order() {
        // What `kubectl apply` (client side) sends after changing the app image, adding an env
        // var, dropping the sidecar from the manifest and adding a new container first.
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "init-like"}, {"name": "app"}],
            "containers": [
                {"name": "init-like", "image": "busybox"},
                {"$setElementOrder/env": [{"name": "A"}, {"name": "C"}, {"name": "B"}],
                 "name": "app", "image": "nginx:1.27",
                 "env": [{"name": "C", "value": "3"}]},
                {"name": "sidecar", "$patch": "delete"}]}}}});
        let out = smp(("apps/v1", "Deployment"), deployment(), patch).unwrap();
        let containers = &out["spec"]["template"]["spec"]["containers"];
        assert_eq!(containers.as_array().unwrap().len(), 2);
        assert_eq!(
            containers[0],
            json!({"name": "init-like", "image": "busybox"})
        );
        assert_eq!(containers[1]["image"], "nginx:1.27");
        assert_eq!(
            containers[1]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "C", "value": "3"},
                   {"name": "B", "value": "2"}])
        );
        // Untouched parts of the merged container survive.
        assert_eq!(
            containers[1]["ports"],
            json!([{"containerPort": 80, "protocol": "TCP"}])
        );
        // No directive leaks into the stored object.
        assert!(!out.to_string().contains('$'), "{out}");
    }

    #[test]
    fn server_only_items_keep_their_place() {
        // env B exists only on the server; the patch reorders A and C. As upstream's
        // mergeSortedSlice does, B goes before C because it precedes C on the server.
        let original = json!({"spec": {"containers": [{"name": "c", "env": [
            {"name": "A"}, {"name": "B"}, {"name": "C"}]}]}});
        let patch = json!({"spec": {"containers": [{"name": "c",
            "$setElementOrder/env": [{"name": "C"}, {"name": "A"}]}]}});
        let out = smp(("v1", "Pod"), original, patch).unwrap();
        let names: Vec<&str> = out["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["B", "C", "A"]);
    }

    #[test]
    fn finalizer_removal_and_addition() {
        let original = json!({"metadata": {"name": "p",
            "finalizers": ["snapdrain.io/backup", "kubernetes.io/pvc-protection"]}});
        let patch = json!({"metadata": {
            "$deleteFromPrimitiveList/finalizers": ["snapdrain.io/backup"]}});
        let out = smp(("v1", "PersistentVolumeClaim"), original.clone(), patch).unwrap();
        assert_eq!(
            out["metadata"]["finalizers"],
            json!(["kubernetes.io/pvc-protection"])
        );
        // A plain list adds to the set (patchStrategy merge on finalizers), without duplicates.
        let patch = json!({"metadata": {"finalizers": ["a", "snapdrain.io/backup"]}});
        let out = smp(("v1", "PersistentVolumeClaim"), original, patch).unwrap();
        assert_eq!(
            out["metadata"]["finalizers"],
            json!(["a", "snapdrain.io/backup", "kubernetes.io/pvc-protection"])
        );
    }

    #[test]
    fn tolerations_replace_and_volumes_retain_keys() {
        let patch = json!({"spec": {"template": {"spec": {
            "tolerations": [{"key": "y", "operator": "Exists"}],
            "volumes": [{"$retainKeys": ["hostPath", "name"], "name": "data",
                         "hostPath": {"path": "/data"}}]}}}});
        let out = smp(("apps/v1", "Deployment"), deployment(), patch).unwrap();
        let spec = &out["spec"]["template"]["spec"];
        assert_eq!(
            spec["tolerations"],
            json!([{"key": "y", "operator": "Exists"}])
        );
        assert_eq!(
            spec["volumes"],
            json!([{"name": "data", "hostPath": {"path": "/data"}}])
        );
        let bad = json!({"spec": {"template": {"spec": {"volumes": [
            {"$retainKeys": ["name"], "name": "data", "hostPath": {"path": "/d"}}]}}}});
        assert_eq!(
            smp(("apps/v1", "Deployment"), deployment(), bad)
                .unwrap_err()
                .code(),
            422
        );
    }

    #[test]
    fn patch_directives_replace_and_delete() {
        let patch = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "only", "image": "x"}, {"$patch": "replace"}]}}}});
        let out = smp(("apps/v1", "Deployment"), deployment(), patch).unwrap();
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"],
            json!([{"name": "only", "image": "x"}])
        );
        let patch = json!({"spec": {"template": {"metadata": {"$patch": "replace",
                                                              "labels": {"v": "2"}}}}});
        let out = smp(("apps/v1", "Deployment"), deployment(), patch).unwrap();
        assert_eq!(
            out["spec"]["template"]["metadata"],
            json!({"labels": {"v": "2"}})
        );
        let patch = json!({"spec": {"selector": {"$patch": "delete"}}});
        let out = smp(("apps/v1", "Deployment"), deployment(), patch).unwrap();
        assert_eq!(out["spec"]["selector"], json!({}));
    }

    #[test]
    fn owner_references_merge_by_uid() {
        let original = json!({"metadata": {"ownerReferences": [
            {"uid": "1", "kind": "ReplicaSet", "name": "a"}]}});
        let patch = json!({"metadata": {"ownerReferences": [
            {"uid": "2", "kind": "StatefulSet", "name": "b"}]}});
        let out = smp(("v1", "Pod"), original, patch).unwrap();
        assert_eq!(
            out["metadata"]["ownerReferences"].as_array().unwrap().len(),
            2
        );
    }

    #[test]
    fn service_ports_merge_by_port() {
        let original = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}]}});
        let patch = json!({"spec": {"ports": [{"port": 80, "targetPort": 9090},
                                              {"port": 443}]}});
        let out = smp(("v1", "Service"), original, patch).unwrap();
        assert_eq!(
            out["spec"]["ports"],
            json!([{"port": 80, "targetPort": 9090}, {"port": 443}])
        );
    }

    #[test]
    fn malformed_patches_are_rejected() {
        let bad_directive = json!({"metadata": {"$patch": "frob"}});
        assert_eq!(
            smp(("v1", "Pod"), node(), bad_directive)
                .unwrap_err()
                .code(),
            400
        );
        let missing_key = json!({"spec": {"containers": [{"image": "x"}]}});
        let err = smp(("v1", "Pod"), json!({}), missing_key).unwrap_err();
        assert_eq!(err.code(), 400);
        assert!(
            err.to_string()
                .contains("does not contain declared merge key: name")
        );
        let bad_order = json!({"spec": {"$setElementOrder/containers": "x"}});
        assert_eq!(
            smp(("v1", "Pod"), json!({}), bad_order).unwrap_err().code(),
            400
        );
        let bad_delete = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "x"}});
        assert_eq!(
            smp(("v1", "Pod"), json!({}), bad_delete)
                .unwrap_err()
                .code(),
            400
        );
        let list_of_lists = json!({"metadata": {"finalizers": [["a"]]}});
        assert_eq!(
            smp(("v1", "Pod"), json!({}), list_of_lists)
                .unwrap_err()
                .code(),
            422
        );
        assert_eq!(
            smp(("v1", "Pod"), json!({}), json!([1]))
                .unwrap_err()
                .code(),
            400
        );
    }
}
