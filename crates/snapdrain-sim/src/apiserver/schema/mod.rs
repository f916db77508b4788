//! Custom resources as apiextensions-apiserver treats them, against the `openAPIV3Schema` of their CRD
//! version: pruning of undeclared fields, defaulting, then validation. One concern per file.

mod defaults;
pub mod field;
mod prune;
mod validate;

use serde_json::{Map, Value};

use super::errors::Cause;

pub use prune::prune_object_meta;

/// What decoding a custom resource does to it before admission (`customresource_handler.go`,
/// `unstructuredSchemaCoercer.apply`, then the codec's defaulter): prune, drop disallowed nulls, apply
/// defaults. Returns the pruned paths for `fieldValidation`.
pub fn coerce(obj: &mut Value, schema: &Value) -> Vec<String> {
    let unknown = prune::prune(obj, schema);
    defaults::prune_nulls(obj, Some(schema));
    defaults::apply(obj, schema);
    unknown
}

/// The schema's verdict on a coerced custom resource.
pub fn validate(obj: &Value, schema: &Value) -> Vec<Cause> {
    validate::validate(obj, schema)
}

fn properties(s: &Value) -> Option<&Map<String, Value>> {
    s.get("properties").and_then(Value::as_object)
}

/// `additionalProperties` when it is a schema (`true` means "anything", handled by the callers).
fn additional(s: &Value) -> Option<&Value> {
    s.get("additionalProperties").filter(|a| a.is_object())
}

fn flag(s: &Value, name: &str) -> bool {
    s.get(name) == Some(&Value::Bool(true))
}

/// `spec` + `replicas` → `spec.replicas`, as field paths and pruned paths are written.
fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

/// The schema that governs `def`'s stored objects, from its CRD: None for a CRD without one, or with
/// the legacy `spec.preserveUnknownFields: true` (no pruning, no validation then).
pub fn of_crd<'a>(crd: &'a Value, version: &str) -> Option<&'a Value> {
    if crd.pointer("/spec/preserveUnknownFields") == Some(&Value::Bool(true)) {
        return None;
    }
    schema_of(crd, version)
}

/// The `openAPIV3Schema` of one version of a CRD object.
pub fn schema_of<'a>(crd: &'a Value, version: &str) -> Option<&'a Value> {
    crd.pointer("/spec/versions")?
        .as_array()?
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(version))?
        .pointer("/schema/openAPIV3Schema")
}

/// A client's write of a custom resource, as the real server stores it: coerced (pruned, defaulted),
/// then validated; 422 Invalid with one cause per failure.
pub fn admit(
    def: &super::resources::ResourceDef,
    schema: &Value,
    obj: &mut Value,
    old: Option<&Value>,
) -> super::errors::ApiResult<()> {
    coerce(obj, schema);
    let mut causes = validate(obj, schema);
    // CEL rules run unless a type error would make them meaningless (apiextensions-apiserver
    // `pkg/registry/customresource/strategy.go` `hasBlockingErr`).
    if causes.iter().any(|c| c.reason == "FieldValueTypeInvalid") {
        causes.push(field::invalid(
            "<nil>",
            &Value::Null,
            "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
        ));
    } else {
        causes.extend(super::cel::validate(schema, obj, old));
    }
    // Ratcheting (CRDValidationRatcheting, on by default since Kubernetes 1.30,
    // apiextensions-apiserver `pkg/apiserver/validation/ratcheting.go`): on update, a failure at a
    // value that did not change is not an error, so an object stored before a constraint existed can
    // still have its status written.
    if let Some(old) = old {
        causes.retain(|c| at_path(obj, &c.field) != at_path(old, &c.field));
    }
    if causes.is_empty() {
        return Ok(());
    }
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    Err(super::errors::ApiError::invalid(
        &def.kind, &def.group, name, causes,
    ))
}

/// The value at a field path (`spec.list[0].name`); None when absent or the path is not one.
fn at_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    for part in path.split('.') {
        let (key, indexes) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !key.is_empty() {
            cur = cur.get(key)?;
        }
        for idx in indexes.split('[').filter(|s| !s.is_empty()) {
            let i: usize = idx.trim_end_matches(']').parse().ok()?;
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unchanged_invalid_values_ratchet_on_update() {
        let def = crate::apiserver::resources::Registry::with_builtins()
            .all()
            .next()
            .cloned()
            .expect("a definition");
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "n": {"type": "integer", "minimum": 1}}}, "status": {"type": "object",
            "properties": {"phase": {"type": "string"}}}}});
        let old = json!({"metadata": {"name": "a"}, "spec": {"n": 0}});
        let mut status_write =
            json!({"metadata": {"name": "a"}, "spec": {"n": 0}, "status": {"phase": "Failed"}});
        assert!(admit(&def, &schema, &mut status_write, Some(&old)).is_ok());
        let mut changed = json!({"metadata": {"name": "a"}, "spec": {"n": -1}});
        assert!(admit(&def, &schema, &mut changed, Some(&old)).is_err());
        let mut created = old.clone();
        assert!(admit(&def, &schema, &mut created, None).is_err());
        assert_eq!(
            at_path(&json!({"a": [{"b": 1}]}), "a[0].b"),
            Some(&json!(1))
        );
    }
}
