//! Server-side printing: `meta.k8s.io/v1` Tables, which `kubectl get` asks for and prints as they come.

use serde_json::{Value, json};

use super::resources::{PrinterColumn, ResourceDef};

/// True when the client asked for a Table (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io,...`).
pub fn wants_table(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',')
            .next()
            .is_some_and(|first| first.contains("as=Table"))
    })
}

fn column_definitions(def: &ResourceDef) -> Vec<Value> {
    let mut cols = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    for c in &def.printer_columns {
        cols.push(json!({"name": c.name, "type": if c.type_ == "date" { "string" } else { c.type_.as_str() },
            "format": "", "description": c.description, "priority": c.priority}));
    }
    cols
}

fn row(def: &ResourceDef, obj: &Value) -> Value {
    let mut cells = vec![
        obj.pointer("/metadata/name")
            .cloned()
            .unwrap_or(Value::Null),
    ];
    for c in &def.printer_columns {
        cells.push(cell(c, obj));
    }
    let metadata = obj.get("metadata").cloned().unwrap_or(json!({}));
    json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata}})
}

/// A Table of `objects`; `with_columns` is false for watch events after the first.
pub fn table(
    def: &ResourceDef,
    objects: &[&Value],
    rv: &str,
    cont: Option<&str>,
    with_columns: bool,
) -> Value {
    let rows: Vec<Value> = objects.iter().map(|o| row(def, o)).collect();
    let mut meta = json!({"resourceVersion": rv});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    let mut t =
        json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "rows": rows});
    if with_columns {
        t["columnDefinitions"] = Value::Array(column_definitions(def));
    }
    t
}

fn cell(col: &PrinterColumn, obj: &Value) -> Value {
    if let Some(special) = col.json_path.strip_prefix('@') {
        return json!(computed(special, obj));
    }
    let found = json_path(obj, &col.json_path);
    let value = match found.len() {
        0 => return Value::Null,
        1 => found[0].clone(),
        _ => json!(found.iter().map(|v| plain(v)).collect::<Vec<_>>().join(",")),
    };
    if col.type_ == "date" {
        return value.as_str().map_or(Value::Null, |ts| json!(age(ts)));
    }
    match (&value, col.type_.as_str()) {
        (Value::Array(_) | Value::Object(_), _) => json!(plain(&value)),
        _ => value,
    }
}

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(plain).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// Human age as kubectl prints it ("45s", "12m", "3h", "5d").
pub fn age(ts: &str) -> String {
    let Ok(t) = ts.parse::<jiff::Timestamp>() else {
        return "<unknown>".into();
    };
    let secs = (jiff::Timestamp::now().as_second() - t.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 3600 * 3 => format!("{}m", s / 60),
        s if s < 86400 * 2 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// Columns whose value is computed the way the built-in printers do.
fn computed(name: &str, obj: &Value) -> String {
    let arr = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    match name {
        "podReady" => {
            let total = arr("/spec/containers").len();
            let ready = arr("/status/containerStatuses")
                .iter()
                .filter(|c| c["ready"] == true)
                .count();
            format!("{ready}/{total}")
        }
        "podStatus" => {
            if obj.pointer("/metadata/deletionTimestamp").is_some() {
                return "Terminating".into();
            }
            obj.pointer("/status/reason")
                .or_else(|| obj.pointer("/status/phase"))
                .and_then(Value::as_str)
                .unwrap_or("Pending")
                .to_string()
        }
        "podRestarts" => {
            let n: i64 = arr("/status/containerStatuses")
                .iter()
                .filter_map(|c| c["restartCount"].as_i64())
                .sum();
            n.to_string()
        }
        "nodeStatus" => {
            let ready = arr("/status/conditions")
                .iter()
                .find(|c| c["type"] == "Ready")
                .map(|c| c["status"] == "True")
                .unwrap_or(false);
            let mut s = if ready {
                "Ready".to_string()
            } else {
                "NotReady".to_string()
            };
            if obj.pointer("/spec/unschedulable") == Some(&Value::Bool(true)) {
                s.push_str(",SchedulingDisabled");
            }
            s
        }
        "nodeRoles" => {
            let roles: Vec<String> = obj
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|l| {
                    l.keys()
                        .filter_map(|k| {
                            k.strip_prefix("node-role.kubernetes.io/")
                                .map(str::to_string)
                        })
                        .collect()
                })
                .unwrap_or_default();
            if roles.is_empty() {
                "<none>".into()
            } else {
                roles.join(",")
            }
        }
        "readyOfReplicas" => {
            let ready = obj
                .pointer("/status/readyReplicas")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let want = obj
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            format!("{ready}/{want}")
        }
        "pvClaim" => match (
            obj.pointer("/spec/claimRef/namespace"),
            obj.pointer("/spec/claimRef/name"),
        ) {
            (Some(Value::String(ns)), Some(Value::String(n))) => format!("{ns}/{n}"),
            _ => String::new(),
        },
        "eventObject" => {
            let kind = obj
                .pointer("/involvedObject/kind")
                .or_else(|| obj.pointer("/regarding/kind"));
            let name = obj
                .pointer("/involvedObject/name")
                .or_else(|| obj.pointer("/regarding/name"));
            format!(
                "{}/{}",
                plain(kind.unwrap_or(&Value::Null)).to_lowercase(),
                plain(name.unwrap_or(&Value::Null))
            )
        }
        _ => String::new(),
    }
}

/// The JSONPath subset printer columns use: `.a.b`, `.a[0]`, `.a[*].b`, `.a[?(@.k=="v")].b`.
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Vec<&'a Value> {
    let path = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('$');
    let mut current: Vec<&Value> = vec![obj];
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let (field, end) = field_name(r);
            current = current.into_iter().filter_map(|v| v.get(&field)).collect();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let Some(end) = r.find(']') else {
                return Vec::new();
            };
            let index = &r[..end];
            current = current
                .into_iter()
                .filter_map(Value::as_array)
                .flat_map(|a| select(a, index))
                .collect();
            rest = &r[end + 1..];
        } else {
            return Vec::new();
        }
    }
    current
}

/// The field name at the start of `r` and where it ends: up to an unescaped `.` or `[`, with `\.`
/// standing for a dot inside the name (CRD columns such as `.metadata.labels.karpenter\.sh/nodepool`).
fn field_name(r: &str) -> (String, usize) {
    let mut name = String::new();
    let mut chars = r.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                if let Some((_, escaped)) = chars.next() {
                    name.push(escaped);
                }
            }
            '.' | '[' => return (name, i),
            _ => name.push(c),
        }
    }
    (name, r.len())
}

fn select<'a>(items: &'a [Value], index: &str) -> Vec<&'a Value> {
    if index == "*" {
        return items.iter().collect();
    }
    if let Ok(i) = index.parse::<i64>() {
        let i = if i < 0 { items.len() as i64 + i } else { i };
        return usize::try_from(i)
            .ok()
            .and_then(|i| items.get(i))
            .into_iter()
            .collect();
    }
    // ?(@.field=="value")
    let filter = index.trim_start_matches("?(").trim_end_matches(')');
    let Some((lhs, rhs)) = filter.split_once("==") else {
        return Vec::new();
    };
    let field = lhs.trim().trim_start_matches("@.");
    let want = rhs.trim().trim_matches('"').trim_matches('\'');
    items
        .iter()
        .filter(|item| {
            item.pointer(&format!("/{}", field.replace('.', "/")))
                .map(plain)
                .as_deref()
                == Some(want)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_supports_filters_and_indexes() {
        let obj = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Drifted", "status": "False"}]},
            "spec": {"nodes": ["a", "b"]}});
        assert_eq!(
            json_path(&obj, ".status.conditions[?(@.type==\"Drifted\")].status"),
            vec![&json!("False")]
        );
        assert_eq!(json_path(&obj, ".spec.nodes[1]"), vec![&json!("b")]);
        assert_eq!(json_path(&obj, ".spec.nodes[*]").len(), 2);
        assert!(json_path(&obj, ".missing.x").is_empty());
        let labelled = json!({"metadata": {"labels": {"karpenter.sh/nodepool": "default"}}});
        assert_eq!(
            json_path(&labelled, ".metadata.labels.karpenter\\.sh/nodepool"),
            vec![&json!("default")]
        );
    }

    #[test]
    fn table_has_name_column_and_rows() {
        let reg = super::super::resources::Registry::with_builtins();
        let def = reg
            .get(&super::super::resources::ResKey::core("nodes"))
            .unwrap();
        let node = json!({"metadata": {"name": "n1", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"unschedulable": true}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let t = table(def, &[&node], "5", None, true);
        assert_eq!(t["columnDefinitions"][0]["name"], "Name");
        assert_eq!(t["rows"][0]["cells"][0], "n1");
        assert_eq!(t["rows"][0]["cells"][1], "Ready,SchedulingDisabled");
    }
}
