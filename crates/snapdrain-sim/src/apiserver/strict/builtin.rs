//! Unknown fields of built-in kinds: what the Go types (decoded by apimachinery's strict JSON
//! serializer, `pkg/runtime/serializer/json`) do not have. The types come from k8s-openapi's schemas,
//! the same ones `/openapi/v3` serves.

use serde_json::{Map, Value};

const MAX_REF_DEPTH: usize = 16;

/// Paths of fields in `obj` that the built-in kind's schema does not declare; empty for kinds without
/// a schema here.
pub fn unknown_fields(group: &str, kind: &str, obj: &Value) -> Vec<String> {
    let Some((schemas, root)) = crate::apiserver::openapi::builtin_root(group, kind) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    walk(schemas, root, obj, "", &mut out);
    out
}

/// Follows `$ref` (directly or as the single `allOf` entry schemars writes beside a description).
fn resolve<'a>(schemas: &'a Map<String, Value>, mut s: &'a Value) -> &'a Value {
    for _ in 0..MAX_REF_DEPTH {
        let reference = s
            .get("$ref")
            .or_else(|| s.pointer("/allOf/0/$ref"))
            .and_then(Value::as_str);
        let Some(target) = reference
            .and_then(|r| r.rsplit('/').next())
            .and_then(|name| schemas.get(name))
        else {
            return s;
        };
        s = target;
    }
    s
}

fn walk(schemas: &Map<String, Value>, s: &Value, v: &Value, path: &str, out: &mut Vec<String>) {
    let s = resolve(schemas, s);
    match v {
        Value::Object(map) => {
            let extra = s.get("additionalProperties").filter(|a| a.is_object());
            let Some(props) = s.get("properties").and_then(Value::as_object) else {
                // A map (`additionalProperties`) or a free-form object (RawExtension, FieldsV1).
                if let Some(extra) = extra {
                    for (k, child) in map {
                        walk(schemas, extra, child, &join(path, k), out);
                    }
                }
                return;
            };
            for (k, child) in map {
                match props.get(k).or(extra) {
                    Some(p) => walk(schemas, p, child, &join(path, k), out),
                    None => out.push(join(path, k)),
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = s.get("items") {
                for (i, item) in items.iter().enumerate() {
                    walk(schemas, item_schema, item, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn follows_the_go_types_of_a_pod() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"a": "b"}, "bogus": 1},
            "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolicy": "Always", "typo": true,
                "resources": {"limits": {"cpu": "1"}}}], "nodeSelector": {"x": "y"}, "extra": {}}});
        assert_eq!(
            unknown_fields("", "Pod", &pod),
            vec!["metadata.bogus", "spec.containers[0].typo", "spec.extra"]
        );
        assert!(unknown_fields("nope.io", "Thing", &pod).is_empty());
    }
}
