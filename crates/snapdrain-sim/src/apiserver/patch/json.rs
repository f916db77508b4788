//! RFC 6902 JSON patch and RFC 7386 JSON merge patch, with kube-apiserver's error mapping
//! (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go `applyJSPatch`).

use serde_json::Value;

use super::error::PatchError;

/// Applies a JSON patch. A body that is not a list of operations is 400 BadRequest; an operation
/// that fails (a `test` mismatch, a missing path) is 422 Invalid with the generic message, which is
/// what kube-apiserver returns (`NewGenericServerResponse(422, ...)`).
pub fn json_patch(original: &Value, patch: &Value) -> Result<Value, PatchError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| PatchError::bad_request(format!("invalid JSON patch: {e}")))?;
    let mut doc = original.clone();
    json_patch::patch(&mut doc, &ops).map_err(|e| PatchError::invalid(e.to_string()))?;
    Ok(doc)
}

/// Applies a JSON merge patch. Only an object is accepted: kube-apiserver's merge of a non-object
/// patch replaces the whole object, which then fails to decode, so the outcome is a 400 either way.
pub fn merge_patch(original: &Value, patch: &Value) -> Result<Value, PatchError> {
    if !patch.is_object() {
        return Err(PatchError::bad_request("Invalid JSON Patch"));
    }
    let mut doc = original.clone();
    json_patch::merge(&mut doc, patch);
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node() -> Value {
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "n1", "labels": {"a": "1", "b": "2"}},
               "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}})
    }

    #[test]
    fn json_patch_adds_and_removes() {
        let patch = json!([
            {"op": "add", "path": "/spec/unschedulable", "value": true},
            {"op": "remove", "path": "/metadata/labels/a"}
        ]);
        let out = json_patch(&node(), &patch).unwrap();
        assert_eq!(out["spec"]["unschedulable"], json!(true));
        assert_eq!(out["metadata"]["labels"], json!({"b": "2"}));
    }

    #[test]
    fn failed_test_op_is_422_with_generic_message() {
        let patch = json!([{"op": "test", "path": "/metadata/name", "value": "other"}]);
        let err = json_patch(&node(), &patch).unwrap_err();
        assert_eq!(err.code(), 422);
        assert_eq!(
            err.to_string(),
            "the server rejected our request due to an error in our request"
        );
        let PatchError::Invalid { detail, .. } = err else {
            panic!("expected Invalid")
        };
        assert!(detail.contains("value did not match"), "{detail}");
    }

    #[test]
    fn missing_path_is_422_and_malformed_is_400() {
        let err =
            json_patch(&node(), &json!([{"op": "remove", "path": "/spec/nope"}])).unwrap_err();
        assert_eq!(err.code(), 422);
        let err = json_patch(&node(), &json!({"op": "remove"})).unwrap_err();
        assert_eq!(err.code(), 400);
        let err = json_patch(&node(), &json!([{"op": "frobnicate", "path": "/a"}])).unwrap_err();
        assert_eq!(err.code(), 400);
    }

    #[test]
    fn merge_patch_merges_and_null_deletes() {
        let patch = json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"taints": []}});
        let out = merge_patch(&node(), &patch).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"b": "2", "c": "3"}));
        // Merge patch replaces lists wholesale.
        assert_eq!(out["spec"]["taints"], json!([]));
        assert_eq!(merge_patch(&node(), &json!([1])).unwrap_err().code(), 400);
    }
}
