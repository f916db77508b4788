//! `x-kubernetes-validations` as apiextensions-apiserver `pkg/apiserver/schema/cel/validation.go`
//! evaluates them: each rule of a schema node with `self` bound to the value there; a rule that uses
//! `oldSelf` (a transition rule) only on update and only where the old value correlates (same object
//! key or map key; list items are not correlated here); a false result is a field error from
//! `fieldErrorForReason` with `message`, `messageExpression` or `failed rule: <rule>`, at the node's
//! path plus `fieldPath`.

use serde_json::Value;

use super::library;
use crate::apiserver::errors::Cause;
use crate::apiserver::schema::field;

/// Causes for every failing rule in `obj` (the whole custom resource).
pub fn validate(schema: &Value, obj: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut errs = Vec::new();
    node(schema, obj, old, "", &mut errs);
    errs
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn node(s: &Value, v: &Value, old: Option<&Value>, path: &str, errs: &mut Vec<Cause>) {
    if v.is_null() {
        return;
    }
    if let Some(rules) = s.get("x-kubernetes-validations").and_then(Value::as_array) {
        for rule in rules {
            if let Some(e) = evaluate(s, rule, v, old, path) {
                errs.push(e);
            }
        }
    }
    match v {
        Value::Object(map) => {
            let props = s.get("properties").and_then(Value::as_object);
            let extra = s.get("additionalProperties").filter(|a| a.is_object());
            for (k, child_value) in map {
                if path.is_empty() && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let Some(cs) = props.and_then(|p| p.get(k)).or(extra) else {
                    continue;
                };
                let child_old = old.and_then(|o| o.get(k));
                node(cs, child_value, child_old, &child(path, k), errs);
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for (i, item) in items.iter().enumerate() {
                    node(is, item, None, &format!("{path}[{i}]"), errs);
                }
            }
        }
        _ => {}
    }
}

fn text<'a>(rule: &'a Value, key: &str) -> Option<&'a str> {
    rule.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// One rule at one node: None when it holds (or, as a transition rule, does not apply).
fn evaluate(s: &Value, rule: &Value, v: &Value, old: Option<&Value>, path: &str) -> Option<Cause> {
    let source = text(rule, "rule")?;
    let type_name = s.get("type").and_then(Value::as_str).unwrap_or("");
    let program = match library::compile(source) {
        Ok(p) => p,
        Err(e) => {
            let detail = format!("rule compile error: {e}");
            return Some(field::invalid(
                path,
                &Value::String(type_name.into()),
                &detail,
            ));
        }
    };
    let uses_old = program.references().has_variable("oldSelf");
    if uses_old && old.is_none() {
        return None;
    }
    let mut ctx = library::context();
    let bind = |ctx: &mut cel::Context, name: &str, value: &Value| {
        cel::to_value(value)
            .map_err(|e| e.to_string())
            .and_then(|val| ctx.add_variable(name, val).map_err(|e| e.to_string()))
    };
    let bound = bind(&mut ctx, "self", v).and_then(|()| match old {
        Some(o) if uses_old => bind(&mut ctx, "oldSelf", o),
        _ => Ok(()),
    });
    let message = message(rule, source);
    let result = bound.and_then(|()| program.execute(&ctx).map_err(|e| e.to_string()));
    let at = match text(rule, "fieldPath") {
        Some(fp) => child(path, fp.trim_start_matches('.')),
        None => path.to_string(),
    };
    match result {
        Ok(cel::Value::Bool(true)) => None,
        Ok(cel::Value::Bool(false)) => {
            let detail = text(rule, "messageExpression")
                .and_then(|expr| message_expression(expr, &ctx))
                .unwrap_or(message);
            Some(for_reason(&at, s, v, &detail, text(rule, "reason")))
        }
        Ok(other) => Some(field::invalid(
            path,
            &Value::String(type_name.into()),
            &format!("rule evaluated to {other:?}, not a bool: {message}"),
        )),
        Err(e) => Some(field::invalid(
            path,
            &Value::String(type_name.into()),
            &format!("{e} evaluating rule: {message}"),
        )),
    }
}

/// `ruleMessageOrDefault`.
fn message(rule: &Value, source: &str) -> String {
    match text(rule, "message") {
        Some(m) => m.trim().to_string(),
        None => format!("failed rule: {}", source.trim()),
    }
}

/// A messageExpression's string, or None (the static message is used then, as upstream does when
/// the expression fails).
fn message_expression(expr: &str, ctx: &cel::Context) -> Option<String> {
    match library::compile(expr).ok()?.execute(ctx).ok()? {
        cel::Value::String(s) if !s.is_empty() && !s.contains('\n') => Some(s.to_string()),
        _ => None,
    }
}

/// `fieldErrorForReason`; objects and arrays leave their value out (`field.OmitValueType`).
fn for_reason(path: &str, s: &Value, v: &Value, detail: &str, reason: Option<&str>) -> Cause {
    let type_name = s.get("type").and_then(Value::as_str).unwrap_or("");
    match reason {
        Some("FieldValueForbidden") => field::forbidden(path, detail),
        Some("FieldValueRequired") => field::required_detail(path, detail),
        Some("FieldValueDuplicate") => field::duplicate(path, v),
        _ if matches!(type_name, "object" | "array") => field::invalid_omitted(path, detail),
        _ => field::invalid(path, v, detail),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_and_transition_rules_like_validation_go() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
            "x-kubernetes-validations": [
                {"rule": "has(self.a) || has(self.b)", "message": "a or b", "fieldPath": ".a"},
                {"rule": "self.group == oldSelf.group", "message": "group is immutable",
                    "reason": "FieldValueForbidden"}],
            "properties": {"a": {"type": "string"}, "b": {"type": "string"}, "group": {"type": "string"},
                "name": {"type": "string", "x-kubernetes-validations": [{"rule": "self != ''"}]},
                "list": {"type": "array", "items": {"type": "string"},
                    "x-kubernetes-validations": [{"rule": "self.size() < 2",
                        "messageExpression": "'has ' + string(self.size()) + ' items'"}]}}}}});
        let msgs = |obj: Value, old: Option<Value>| -> Vec<String> {
            validate(&schema, &obj, old.as_ref())
                .into_iter()
                .map(|c| format!("{}: {}", c.field, c.message))
                .collect()
        };
        assert_eq!(
            msgs(
                json!({"spec": {"group": "x", "name": "", "list": ["1", "2"]}}),
                None
            ),
            vec![
                "spec.a: Invalid value: a or b",
                "spec.name: Invalid value: \"\": failed rule: self != ''",
                "spec.list: Invalid value: has 2 items",
            ]
        );
        assert_eq!(
            msgs(
                json!({"spec": {"a": "1", "group": "y"}}),
                Some(json!({"spec": {"a": "1", "group": "x"}}))
            ),
            vec!["spec: Forbidden: group is immutable"]
        );
        assert!(
            msgs(
                json!({"spec": {"a": "1", "group": "x"}}),
                Some(json!({"spec": {"group": "x"}}))
            )
            .is_empty()
        );
    }
}
