//! Defaulting of custom resources, as apiextensions-apiserver `pkg/apiserver/schema/defaulting`
//! does after pruning: `prunenulls.go` (`PruneNonNullableNullsWithoutDefaults`) drops a `null` the
//! schema neither allows nor defaults, then `algorithm.go` (`Default`) fills absent fields, and
//! non-nullable nulls, with a copy of the schema's `default`.

use serde_json::Value;

use super::{additional, flag, properties};

fn schema_for<'a>(s: Option<&'a Value>, key: &str) -> Option<&'a Value> {
    let s = s?;
    properties(s)
        .and_then(|p| p.get(key))
        .or_else(|| additional(s))
}

fn non_nullable_null(x: &Value, s: Option<&Value>) -> bool {
    x.is_null() && s.is_some_and(|s| !flag(s, "nullable"))
}

/// Drops non-nullable nulls that have no default (those with one are defaulted next).
pub fn prune_nulls(x: &mut Value, s: Option<&Value>) {
    match x {
        Value::Object(map) => map.retain(|k, v| {
            let schema = schema_for(s, k);
            if non_nullable_null(v, schema) && schema.and_then(|s| s.get("default")).is_none() {
                return false;
            }
            prune_nulls(v, schema);
            true
        }),
        Value::Array(items) => {
            let schema = s.and_then(|s| s.get("items"));
            for v in items {
                prune_nulls(v, schema);
            }
        }
        _ => {}
    }
}

/// Fills in defaults, depth first.
pub fn apply(x: &mut Value, s: &Value) {
    match x {
        Value::Object(map) => {
            if let Some(props) = properties(s) {
                for (k, prop) in props {
                    let Some(default) = prop.get("default") else {
                        continue;
                    };
                    let missing = map.get(k).is_none_or(|v| non_nullable_null(v, Some(prop)));
                    if missing {
                        map.insert(k.clone(), default.clone());
                    }
                }
            }
            for (k, v) in map.iter_mut() {
                if let Some(prop) = properties(s).and_then(|p| p.get(k)) {
                    apply(v, prop);
                } else if let Some(extra) = additional(s) {
                    if non_nullable_null(v, Some(extra))
                        && let Some(d) = extra.get("default")
                    {
                        *v = d.clone();
                    }
                    apply(v, extra);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = s.get("items") {
                for v in items {
                    if non_nullable_null(v, Some(item_schema))
                        && let Some(d) = item_schema.get("default")
                    {
                        *v = d.clone();
                    }
                    apply(v, item_schema);
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
    fn defaults_absent_and_null_fields_and_drops_other_nulls() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "default": {},
            "properties": {
                "mode": {"type": "string", "default": "Auto"},
                "ttl": {"type": "string", "default": "720h"},
                "note": {"type": "string"},
                "opt": {"type": "string", "nullable": true},
                "list": {"type": "array", "items": {"type": "object",
                    "properties": {"w": {"type": "integer", "default": 1}}}}}}}});
        let mut obj =
            json!({"spec": {"ttl": null, "note": null, "opt": null, "list": [{}, {"w": 5}]}});
        prune_nulls(&mut obj, Some(&schema));
        apply(&mut obj, &schema);
        assert_eq!(
            obj,
            json!({"spec": {"mode": "Auto", "ttl": "720h", "opt": null, "list": [{"w": 1}, {"w": 5}]}})
        );
        let mut empty = json!({});
        apply(&mut empty, &schema);
        assert_eq!(empty, json!({"spec": {"mode": "Auto", "ttl": "720h"}}));
    }
}
