//! Rules checked when a CRD is written, as apiextensions-apiserver compiles them then
//! (`pkg/apiserver/schema/cel/compilation.go`; a rule that does not compile makes the CRD invalid).
//! The simulator refuses, with the same kind of error, a rule calling a function it does not
//! implement (`library::SUPPORTED`): such a CRD would otherwise pass writes the real server refuses.

use serde_json::Value;

use super::library;
use crate::apiserver::errors::Cause;
use crate::apiserver::schema::field;

/// Causes for every rule of every version's schema that does not compile here.
pub fn check(crd: &Value) -> Vec<Cause> {
    let mut errs = Vec::new();
    let versions = crd.pointer("/spec/versions").and_then(Value::as_array);
    for (i, version) in versions.into_iter().flatten().enumerate() {
        if let Some(schema) = version.pointer("/schema/openAPIV3Schema") {
            let path = format!("spec.versions[{i}].schema.openAPIV3Schema");
            walk(schema, &path, &mut errs);
        }
    }
    errs
}

fn walk(s: &Value, path: &str, errs: &mut Vec<Cause>) {
    let rules = s.get("x-kubernetes-validations").and_then(Value::as_array);
    for (j, rule) in rules.into_iter().flatten().enumerate() {
        let Some(source) = rule.get("rule").and_then(Value::as_str) else {
            continue;
        };
        let at = format!("{path}.x-kubernetes-validations[{j}].rule");
        if let Err(detail) = compiles(source) {
            errs.push(field::invalid(&at, &Value::String(source.into()), &detail));
        }
    }
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        for (k, p) in props {
            walk(p, &format!("{path}.properties[{k}]"), errs);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(sub) = s.get(key).filter(|v| v.is_object()) {
            walk(sub, &format!("{path}.{key}"), errs);
        }
    }
}

/// Operators and comprehension internals are written `_+_`, `@in`, `!_`, `-_`.
fn is_operator(name: &str) -> bool {
    name.starts_with(['_', '@', '!', '-'])
}

fn compiles(source: &str) -> Result<(), String> {
    let program = library::compile(source).map_err(|e| format!("compilation failed: {e}"))?;
    let references = program.references();
    let mut missing: Vec<&str> = references
        .functions()
        .into_iter()
        .filter(|f| !is_operator(f) && !library::SUPPORTED.contains(f))
        .collect();
    missing.sort_unstable();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "compilation failed: the simulated API server does not implement CEL function(s) {}; implement them in snapdrain-sim apiserver/cel/library.rs or drop the rule",
        missing.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn refuses_rules_that_do_not_compile_or_call_unknown_functions() {
        let crd = json!({"spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": {
            "type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-validations": [
                {"rule": "self.all(x, x.find('^a').endsWith('b'))"},
                {"rule": "self.a.isSemver()"},
                {"rule": "self.(("}]}}}}}]}});
        let errs = check(&crd);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert_eq!(
            errs[0].field,
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[1].rule"
        );
        assert!(errs[0].message.contains("isSemver"), "{}", errs[0].message);
        assert!(
            errs[1].message.contains("compilation failed"),
            "{}",
            errs[1].message
        );
    }
}
