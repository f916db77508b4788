//! SelfSubjectAccessReview (`authorization.k8s.io/v1`), what `kubectl auth can-i` asks: may the
//! requesting user do this? Answered by the same authorizer as every request (kubernetes
//! `pkg/registry/authorization/selfsubjectaccessreview/rest.go`, validated as
//! `pkg/apis/authorization/validation/validation.go` `ValidateSelfSubjectAccessReviewSpec` does).

use serde_json::{Value, json};

use super::rbac::Attributes;
use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::schema::field;

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

fn optional(v: &Value, key: &str) -> Option<String> {
    Some(text(v, key)).filter(|s| !s.is_empty())
}

/// The attributes a review's spec asks about, or its 422.
pub fn attributes(review: &Value) -> ApiResult<Attributes> {
    let spec = review.get("spec").cloned().unwrap_or(Value::Null);
    let resource = spec.get("resourceAttributes").filter(|v| v.is_object());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| v.is_object());
    let invalid = |field: &str, detail: &str| {
        ApiError::invalid(
            "SelfSubjectAccessReview",
            "authorization.k8s.io",
            "",
            vec![field::invalid(field, &Value::Null, detail)],
        )
    };
    match (resource, non_resource) {
        (Some(r), None) => Ok(Attributes::Resource {
            verb: text(r, "verb"),
            group: text(r, "group"),
            resource: text(r, "resource"),
            subresource: optional(r, "subresource"),
            namespace: optional(r, "namespace"),
            name: optional(r, "name"),
        }),
        (None, Some(n)) => Ok(Attributes::NonResource {
            verb: text(n, "verb"),
            path: text(n, "path"),
        }),
        (Some(_), Some(_)) => Err(invalid(
            "spec.nonResourceAttributes",
            "cannot be specified in combination with resourceAttributes",
        )),
        (None, None) => Err(invalid(
            "spec.resourceAttributes",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
    }
}

/// The review as the server returns it: the request with `status.allowed` (and `denied` when no).
pub fn answer(review: &Value, allowed: bool) -> Value {
    let mut out = json!({
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": review.get("spec").cloned().unwrap_or_else(|| json!({})),
        "status": {"allowed": allowed},
    });
    if !allowed {
        out["status"]["reason"] = json!("");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_resource_and_non_resource_attributes() {
        let r = json!({"spec": {"resourceAttributes": {"verb": "create", "resource": "pods",
            "subresource": "eviction", "namespace": "apps"}}});
        assert_eq!(
            attributes(&r).expect("valid"),
            Attributes::Resource {
                verb: "create".into(),
                group: String::new(),
                resource: "pods".into(),
                subresource: Some("eviction".into()),
                namespace: Some("apps".into()),
                name: None,
            }
        );
        let e = attributes(&json!({"spec": {}})).expect_err("neither");
        assert_eq!(e.code, 422);
        assert!(e.message.contains("exactly one of"), "{}", e.message);
        assert_eq!(answer(&r, true)["status"]["allowed"], true);
    }
}
