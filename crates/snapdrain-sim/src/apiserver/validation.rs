//! The validation a real API server applies before storing an object, for the fields clients get wrong
//! most: names, and the required parts of the kinds snapdrain and its tests create.

use serde_json::Value;

use super::errors::{ApiError, ApiResult, Cause};
use super::resources::ResourceDef;

const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain as Kubernetes checks it: the whole name up to 253 characters (its dot-separated
/// parts have no length limit of their own there).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

fn invalid(field: &str, value: &str, msg: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid".into(),
        field: field.into(),
        message: format!("Invalid value: \"{value}\": {msg}"),
    }
}

fn required(field: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired".into(),
        field: field.into(),
        message: "Required value".into(),
    }
}

pub fn validate(def: &ResourceDef, obj: &Value) -> ApiResult<()> {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut causes = Vec::new();
    // Namespaces and services must be DNS labels; most other kinds DNS subdomains.
    let label_only =
        def.group.is_empty() && matches!(def.plural.as_str(), "namespaces" | "services");
    if label_only && !is_dns1123_label(name) {
        causes.push(invalid("metadata.name", name, DNS1123_LABEL_MSG));
    } else if !label_only && !is_dns1123_subdomain(name) && def.plural != "events" {
        causes.push(invalid("metadata.name", name, DNS1123_SUBDOMAIN_MSG));
    }
    if let Some(labels) = obj.pointer("/metadata/labels") {
        match labels.as_object() {
            Some(map) => {
                for (k, v) in map {
                    if !v.is_string() {
                        causes.push(invalid(
                            &format!("metadata.labels.{k}"),
                            &v.to_string(),
                            "label values must be strings",
                        ));
                    }
                }
            }
            None if !labels.is_null() => causes.push(invalid(
                "metadata.labels",
                &labels.to_string(),
                "must be a map of strings",
            )),
            None => {}
        }
    }
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "pods") => {
            let containers = obj.pointer("/spec/containers").and_then(Value::as_array);
            match containers {
                None => causes.push(required("spec.containers")),
                Some(c) if c.is_empty() => causes.push(required("spec.containers")),
                Some(c) => {
                    for (i, container) in c.iter().enumerate() {
                        if container
                            .get("name")
                            .and_then(Value::as_str)
                            .is_none_or(str::is_empty)
                        {
                            causes.push(required(&format!("spec.containers[{i}].name")));
                        }
                    }
                }
            }
        }
        ("apps", "statefulsets" | "deployments" | "replicasets" | "daemonsets") => {
            if obj.pointer("/spec/selector").is_none() {
                causes.push(required("spec.selector"));
            }
            if obj.pointer("/spec/template").is_none() {
                causes.push(required("spec.template"));
            }
        }
        _ => {}
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&def.kind, &def.group, name, causes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::{Registry, ResKey};
    use serde_json::json;

    #[test]
    fn rejects_bad_names_and_missing_containers() {
        let reg = Registry::with_builtins();
        let pods = reg.get(&ResKey::core("pods")).unwrap();
        let err =
            validate(pods, &json!({"metadata": {"name": "Bad_Name"}, "spec": {}})).unwrap_err();
        assert_eq!(err.code, 422);
        let fields: Vec<&str> = err.causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, vec!["metadata.name", "spec.containers"]);
        assert!(
            validate(
                pods,
                &json!({"metadata": {"name": "ok"}, "spec": {"containers": [{"name": "c"}]}})
            )
            .is_ok()
        );
        assert!(is_dns1123_subdomain(
            "ip-10-0-1-2.us-west-2.compute.internal"
        ));
        assert!(!is_dns1123_label("a.b"));
    }
}
