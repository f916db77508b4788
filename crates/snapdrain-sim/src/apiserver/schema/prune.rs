//! Pruning of fields a structural schema does not declare, as apiextensions-apiserver
//! `pkg/apiserver/schema/pruning/algorithm.go` (`PruneWithOptions`, `prune`, `skipPrune`) does while
//! decoding a custom resource. The paths it drops are what `fieldValidation=Strict` reports and `Warn`
//! warns about.

use serde_json::Value;

use super::{additional, child, flag, index, properties};

/// TypeMeta and ObjectMeta: kept at the root and in embedded resources whatever the schema says.
const META_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// ObjectMeta's JSON fields (apimachinery `pkg/apis/meta/v1/types.go`); others are dropped on decode
/// (`schema/objectmeta/coerce.go` decodes metadata into ObjectMeta).
const OBJECT_META_FIELDS: [&str; 15] = [
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Removes undeclared fields from a whole custom resource (the root counts as an embedded resource)
/// and returns their paths, sorted as the real server sorts them.
pub fn prune(obj: &mut Value, schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    prune_node(obj, Some(schema), "", true, &mut out);
    out.sort();
    out
}

/// Removes ObjectMeta fields that do not exist; returns their paths (`metadata.foo`).
pub fn prune_object_meta(meta: &mut Value, path: &str, out: &mut Vec<String>) {
    if let Value::Object(map) = meta {
        map.retain(|k, _| {
            let known = OBJECT_META_FIELDS.contains(&k.as_str());
            if !known {
                out.push(child(path, k));
            }
            known
        });
    }
}

fn prune_node(x: &mut Value, s: Option<&Value>, path: &str, embedded: bool, out: &mut Vec<String>) {
    if let Some(s) = s
        && flag(s, "x-kubernetes-preserve-unknown-fields")
    {
        skip_prune(x, s, path, out);
        return;
    }
    match x {
        Value::Object(map) => {
            let Some(s) = s else {
                out.extend(map.keys().map(|k| child(path, k)));
                map.clear();
                return;
            };
            let embedded = embedded || flag(s, "x-kubernetes-embedded-resource");
            let props = properties(s);
            let extra = additional(s);
            let extra_allowed = s.get("additionalProperties") == Some(&Value::Bool(true));
            map.retain(|k, v| {
                let p = child(path, k);
                if embedded && META_FIELDS.contains(&k.as_str()) {
                    if k == "metadata" {
                        prune_object_meta(v, &p, out);
                    }
                    return true;
                }
                if let Some(prop) = props.and_then(|m| m.get(k)) {
                    prune_node(v, Some(prop), &p, false, out);
                    true
                } else if let Some(extra) = extra {
                    prune_node(v, Some(extra), &p, false, out);
                    true
                } else if extra_allowed {
                    true
                } else {
                    out.push(p);
                    false
                }
            });
        }
        Value::Array(items) => {
            let item_schema = s.and_then(|s| s.get("items"));
            for (i, v) in items.iter_mut().enumerate() {
                prune_node(v, item_schema, &index(path, i), false, out);
            }
        }
        _ => {}
    }
}

/// Under `x-kubernetes-preserve-unknown-fields` unknown fields stay, but declared ones are still
/// pruned inside.
fn skip_prune(x: &mut Value, s: &Value, path: &str, out: &mut Vec<String>) {
    match x {
        Value::Object(map) => {
            let embedded = flag(s, "x-kubernetes-embedded-resource");
            for (k, v) in map.iter_mut() {
                if embedded && META_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                let p = child(path, k);
                if let Some(prop) = properties(s).and_then(|m| m.get(k)) {
                    prune_node(v, Some(prop), &p, false, out);
                } else if let Some(extra) = additional(s) {
                    prune_node(v, Some(extra), &p, false, out);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = s.get("items") {
                for (i, v) in items.iter_mut().enumerate() {
                    skip_prune(v, item_schema, &index(path, i), out);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn drops_undeclared_fields_and_reports_their_paths() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "items": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                    "properties": {"typed": {"type": "object", "properties": {"x": {"type": "string"}}}}},
                "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                    "properties": {"spec": {"type": "object"}}}}}}});
        let mut obj = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a", "bogus": 1},
            "spec": {"items": [{"a": "x", "b": "y"}], "labels": {"any": "ok"},
            "free": {"whatever": 1, "typed": {"x": "k", "y": "gone"}}, "bogus": true,
            "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"q": 1}}}});
        let unknown = prune(&mut obj, &schema);
        assert_eq!(
            unknown,
            vec![
                "metadata.bogus",
                "spec.bogus",
                "spec.free.typed.y",
                "spec.items[0].b",
                "spec.template.spec.q"
            ]
        );
        assert_eq!(obj["spec"]["items"][0], json!({"a": "x"}));
        assert_eq!(obj["spec"]["free"]["whatever"], 1);
        assert_eq!(obj["spec"]["template"]["kind"], "Pod");
        assert_eq!(obj["metadata"], json!({"name": "a"}));
    }
}
