//! OpenAPI v3 value validation of a custom resource, as apiextensions-apiserver
//! `pkg/apiserver/validation/validation.go` runs kube-openapi's `pkg/validation/validate` and turns its
//! results into field errors (`kubeOpenAPIResultToFieldErrors`). The detail texts are kube-openapi's
//! (`pkg/validation/errors/schema.go`, with `in` = "body").
//!
//! Covered: type (with `nullable` and `x-kubernetes-int-or-string`), enum, required, pattern,
//! minimum/maximum with exclusive bounds, multipleOf, min/maxLength, min/maxItems, min/maxProperties,
//! integer format ranges (int32) and the string formats date-time, date, byte. Not covered: allOf /
//! anyOf / oneOf / not beyond the int-or-string form, and the other string formats. List types `set`
//! and `map` are checked for repeats.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use base64::Engine;
use regex::Regex;
use serde_json::Value;

use super::field;
use super::{additional, child, flag, index, properties};
use crate::apiserver::errors::Cause;

/// Validates a whole custom resource; TypeMeta and ObjectMeta are the server's (checked elsewhere).
pub fn validate(obj: &Value, schema: &Value) -> Vec<Cause> {
    let mut errs = Vec::new();
    let Some(map) = obj.as_object() else {
        return errs;
    };
    for k in required(schema) {
        if !map.contains_key(k) {
            errs.push(field::required(k));
        }
    }
    for (k, v) in map {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if let Some(prop) = properties(schema).and_then(|p| p.get(k)) {
            node(prop, v, k, &mut errs);
        }
    }
    errs
}

fn required(s: &Value) -> impl Iterator<Item = &str> {
    s.get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// kube-openapi's type name of a decoded JSON value.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_integer(v: &Value) -> bool {
    match v {
        Value::Number(n) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

fn type_matches(want: &str, v: &Value) -> bool {
    match want {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => is_integer(v),
        "number" => v.is_number(),
        _ => true,
    }
}

fn type_error(path: &str, want: &str, actual: &str) -> Cause {
    field::type_invalid(
        path,
        &Value::String(actual.into()),
        &format!("{path} in body must be of type {want}: \"{actual}\""),
    )
}

fn node(s: &Value, v: &Value, path: &str, errs: &mut Vec<Cause>) {
    let want = s.get("type").and_then(Value::as_str);
    if v.is_null() {
        if !flag(s, "nullable")
            && let Some(want) = want
        {
            errs.push(type_error(path, want, "null"));
        }
        return;
    }
    if flag(s, "x-kubernetes-int-or-string") {
        if !(v.is_string() || is_integer(v)) {
            errs.push(type_error(path, "integer,string", type_name(v)));
            return;
        }
    } else if let Some(want) = want
        && !type_matches(want, v)
    {
        errs.push(type_error(path, want, type_name(v)));
        return;
    }
    match v {
        Value::String(text) => string(s, text, v, path, errs),
        Value::Number(_) => number(s, v, path, errs),
        Value::Array(items) => array(s, items, path, errs),
        Value::Object(map) => object(s, map, path, errs),
        Value::Bool(_) | Value::Null => {}
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        errs.push(field::not_supported(path, v, allowed));
    }
}

fn u64_of(s: &Value, key: &str) -> Option<u64> {
    s.get(key).and_then(Value::as_u64)
}

fn string(s: &Value, text: &str, v: &Value, path: &str, errs: &mut Vec<Cause>) {
    let len = text.chars().count() as u64;
    if let Some(max) = u64_of(s, "maxLength")
        && len > max
    {
        errs.push(field::too_long(path, max));
    }
    if let Some(min) = u64_of(s, "minLength")
        && len < min
    {
        errs.push(field::invalid(
            path,
            v,
            &format!("{path} in body should be at least {min} chars long"),
        ));
    }
    if let Some(pattern) = s.get("pattern").and_then(Value::as_str)
        && let Some(re) = regex(pattern)
        && !re.is_match(text)
    {
        errs.push(field::invalid(
            path,
            v,
            &format!("{path} in body should match '{pattern}'"),
        ));
    }
    if let Some(format) = s.get("format").and_then(Value::as_str)
        && !format_ok(format, text)
    {
        errs.push(field::type_invalid(
            path,
            v,
            &format!("{path} in body must be of type {format}: \"{text}\""),
        ));
    }
}

/// The string formats kube-openapi's `strfmt.Default` checks that are cheap here; others pass.
fn format_ok(format: &str, text: &str) -> bool {
    match format {
        "date-time" => text.parse::<jiff::Timestamp>().is_ok(),
        "date" => text.parse::<jiff::civil::Date>().is_ok(),
        "byte" => base64::engine::general_purpose::STANDARD
            .decode(text)
            .is_ok(),
        _ => true,
    }
}

/// Go's `regexp` is RE2, which the regex crate follows; compiled once per pattern.
fn regex(pattern: &str) -> Option<Regex> {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<Regex>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
    map.entry(pattern.to_string())
        .or_insert_with(|| Regex::new(pattern).ok())
        .clone()
}

/// Go's `%v` of a float64 bound: integral values print without a fraction.
fn bound(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e21 {
        format!("{}", f as i64)
    } else {
        format!("{f}")
    }
}

fn number(s: &Value, v: &Value, path: &str, errs: &mut Vec<Cause>) {
    let Some(x) = v.as_f64() else {
        return;
    };
    let want = s.get("type").and_then(Value::as_str).unwrap_or("");
    if want == "integer"
        && s.get("format").and_then(Value::as_str) == Some("int32")
        && (x < f64::from(i32::MIN) || x > f64::from(i32::MAX))
    {
        errs.push(field::invalid(
            path,
            &Value::String(String::new()),
            &format!("Checked value must be of type integer with format int32 in {path}"),
        ));
    }
    if let Some(max) = s.get("maximum").and_then(Value::as_f64) {
        let exclusive = flag(s, "exclusiveMaximum");
        if (exclusive && x >= max) || x > max {
            let rel = if exclusive {
                "less than"
            } else {
                "less than or equal to"
            };
            errs.push(field::invalid(
                path,
                v,
                &format!("{path} in body should be {rel} {}", bound(max)),
            ));
        }
    }
    if let Some(min) = s.get("minimum").and_then(Value::as_f64) {
        let exclusive = flag(s, "exclusiveMinimum");
        if (exclusive && x <= min) || x < min {
            let rel = if exclusive {
                "greater than"
            } else {
                "greater than or equal to"
            };
            errs.push(field::invalid(
                path,
                v,
                &format!("{path} in body should be {rel} {}", bound(min)),
            ));
        }
    }
    if let Some(m) = s.get("multipleOf").and_then(Value::as_f64)
        && m > 0.0
        && (x / m).fract() != 0.0
    {
        errs.push(field::invalid(
            path,
            v,
            &format!("{path} in body should be a multiple of {}", bound(m)),
        ));
    }
}

fn array(s: &Value, items: &[Value], path: &str, errs: &mut Vec<Cause>) {
    if let Some(max) = u64_of(s, "maxItems")
        && items.len() as u64 > max
    {
        errs.push(field::too_many(path, items.len(), max));
    }
    if let Some(min) = u64_of(s, "minItems")
        && (items.len() as u64) < min
    {
        errs.push(field::invalid(
            path,
            &Value::from(items.len()),
            &format!("{path} in body should have at least {min} items"),
        ));
    }
    if let Some(item_schema) = s.get("items") {
        for (i, item) in items.iter().enumerate() {
            node(item_schema, item, &index(path, i), errs);
        }
    }
    list_type(s, items, path, errs);
}

/// `x-kubernetes-list-type: set` items and `map` keys are unique (apiextensions-apiserver
/// `pkg/apiserver/schema/listtype/validation.go`): each repeat is a Duplicate at its index.
fn list_type(s: &Value, items: &[Value], path: &str, errs: &mut Vec<Cause>) {
    let key_of = |item: &Value| -> Option<Value> {
        match s.get("x-kubernetes-list-type").and_then(Value::as_str)? {
            "set" => Some(item.clone()),
            "map" => {
                let keys = s.get("x-kubernetes-list-map-keys")?.as_array()?;
                let mut out = serde_json::Map::new();
                for k in keys.iter().filter_map(Value::as_str) {
                    if let Some(v) = item.get(k) {
                        out.insert(k.to_string(), v.clone());
                    }
                }
                Some(Value::Object(out))
            }
            _ => None,
        }
    };
    let mut seen: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let Some(key) = key_of(item) else {
            return;
        };
        if seen.contains(&key) {
            errs.push(field::duplicate(&index(path, i), &key));
        } else {
            seen.push(key);
        }
    }
}

fn object(s: &Value, map: &serde_json::Map<String, Value>, path: &str, errs: &mut Vec<Cause>) {
    if let Some(max) = u64_of(s, "maxProperties")
        && map.len() as u64 > max
    {
        errs.push(field::too_many(path, map.len(), max));
    }
    if let Some(min) = u64_of(s, "minProperties")
        && (map.len() as u64) < min
    {
        errs.push(field::invalid(
            path,
            &Value::from(map.len()),
            &format!("{path} in body should have at least {min} properties"),
        ));
    }
    for k in required(s) {
        if !map.contains_key(k) {
            errs.push(field::required(&child(path, k)));
        }
    }
    // An embedded resource must say what it is (`schema/objectmeta/validation.go` and the structural
    // schema rules for `x-kubernetes-embedded-resource`).
    if flag(s, "x-kubernetes-embedded-resource") {
        for k in ["apiVersion", "kind"] {
            if map.get(k).and_then(Value::as_str).is_none_or(str::is_empty) {
                errs.push(field::required(&child(path, k)));
            }
        }
    }
    for (k, v) in map {
        if let Some(prop) = properties(s).and_then(|p| p.get(k)) {
            node(prop, v, &child(path, k), errs);
        } else if let Some(extra) = additional(s) {
            node(extra, v, &child(path, k), errs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(obj: Value, schema: Value) -> Vec<String> {
        validate(&obj, &schema)
            .into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn reports_each_failure_like_kube_openapi() {
        let schema = json!({"type": "object", "required": ["spec"], "properties": {"spec": {
            "type": "object", "required": ["mode"], "properties": {
                "mode": {"type": "string", "enum": ["a", "b"]},
                "n": {"type": "integer", "minimum": 1, "maximum": 10, "format": "int32"},
                "name": {"type": "string", "maxLength": 3, "pattern": "^[a-z]+$"},
                "when": {"type": "string", "format": "date-time"},
                "list": {"type": "array", "maxItems": 1, "items": {"type": "string"}},
                "q": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                "opt": {"type": "string", "nullable": true}}}}});
        assert_eq!(
            messages(
                json!({"spec": {"mode": "c", "n": 0, "name": "ABCD", "when": "yesterday",
                    "list": ["x", 2], "q": true, "opt": null}}),
                schema.clone()
            ),
            vec![
                "spec.mode: Unsupported value: \"c\": supported values: \"a\", \"b\"",
                "spec.n: Invalid value: 0: spec.n in body should be greater than or equal to 1",
                "spec.name: Too long: may not be more than 3 bytes",
                "spec.name: Invalid value: \"ABCD\": spec.name in body should match '^[a-z]+$'",
                "spec.when: Invalid value: \"yesterday\": spec.when in body must be of type date-time: \"yesterday\"",
                "spec.list: Too many: 2: must have at most 1 item",
                "spec.list[1]: Invalid value: \"integer\": spec.list[1] in body must be of type string: \"integer\"",
                "spec.q: Invalid value: \"boolean\": spec.q in body must be of type integer,string: \"boolean\"",
            ]
        );
        assert_eq!(
            messages(json!({"spec": {"n": "x"}}), schema.clone()),
            vec![
                "spec.mode: Required value",
                "spec.n: Invalid value: \"string\": spec.n in body must be of type integer: \"string\"",
            ]
        );
        assert_eq!(
            messages(json!({}), schema.clone()),
            vec!["spec: Required value"]
        );
        let lists = json!({"type": "object", "properties": {
            "set": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "map": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object"}}}});
        assert_eq!(
            messages(
                json!({"set": ["a", "b", "a"], "map": [{"name": "x", "v": 1}, {"name": "x", "v": 2}]}),
                lists
            ),
            vec![
                "set[2]: Duplicate value: \"a\"",
                "map[1]: Duplicate value: {\"name\":\"x\"}",
            ]
        );
        assert!(messages(json!({"spec": {"mode": "a", "q": "10%", "n": 10}}), schema).is_empty());
    }
}
