//! Pure patch logic for the simulated apiserver: JSON patch, JSON merge patch, strategic merge
//! patch and server-side apply with `metadata.managedFields`. Everything works on
//! `serde_json::Value`; the HTTP handlers own storage, admission and validation.

mod apply;
mod error;
mod fields;
mod json;
mod schema;
mod strategic;

pub use apply::{ApplyRequest, Scope, apply, record_update};
pub use error::{PatchError, StatusCause};
pub use fields::FieldSet;
pub use json::{json_patch, merge_patch};
pub use schema::{FieldMeta, ListType, PatchStrategy, Schema};
pub use strategic::strategic_merge;

use serde_json::Value;

/// The four patch content types kube-apiserver accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// RFC 6902, `application/json-patch+json`.
    Json,
    /// RFC 7386, `application/merge-patch+json`.
    Merge,
    /// `application/strategic-merge-patch+json`, built-in kinds only.
    Strategic,
    /// Server-side apply, `application/apply-patch+yaml` (the body may be JSON, which is YAML).
    Apply,
}

impl PatchType {
    /// Parses a `Content-Type` header value; parameters such as `; charset=utf-8` are ignored.
    /// `application/apply-patch+cbor` is not accepted: neither kubectl nor kube-rs send it.
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        let media = content_type.split(';').next().unwrap_or_default().trim();
        match media.to_ascii_lowercase().as_str() {
            "application/json-patch+json" => Some(Self::Json),
            "application/merge-patch+json" => Some(Self::Merge),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" => Some(Self::Apply),
            _ => None,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::Json => "application/json-patch+json",
            Self::Merge => "application/merge-patch+json",
            Self::Strategic => "application/strategic-merge-patch+json",
            Self::Apply => "application/apply-patch+yaml",
        }
    }

    /// The 415 the real apiserver returns when this type is not allowed for a resource;
    /// custom resources accept every type but strategic merge.
    pub fn unsupported(for_custom_resource: bool) -> PatchError {
        let accepted: Vec<&str> = [Self::Json, Self::Merge, Self::Strategic, Self::Apply]
            .into_iter()
            .filter(|t| !(for_custom_resource && *t == Self::Strategic))
            .map(Self::content_type)
            .collect();
        PatchError::UnsupportedMediaType {
            accepted: accepted.join(", "),
        }
    }
}

/// Decodes a request body for `patch_type`: JSON for the three patch types, YAML (of which JSON is
/// a subset) for apply. Malformed bodies are 400 BadRequest, as in kube-apiserver.
pub fn decode_body(patch_type: PatchType, body: &[u8]) -> Result<Value, PatchError> {
    match patch_type {
        PatchType::Apply => {
            // kube-rs and kubectl send JSON; reading it as JSON first avoids YAML's looser
            // scalar typing for the common case.
            if let Ok(value) = serde_json::from_slice(body) {
                return Ok(value);
            }
            let text = std::str::from_utf8(body)
                .map_err(|e| PatchError::bad_request(format!("error decoding YAML: {e}")))?;
            serde_saphyr::from_str::<Value>(text)
                .map_err(|e| PatchError::bad_request(format!("error decoding YAML: {e}")))
        }
        _ => serde_json::from_slice(body).map_err(|e| PatchError::bad_request(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_types() {
        assert_eq!(
            PatchType::from_content_type("application/strategic-merge-patch+json"),
            Some(PatchType::Strategic)
        );
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json; charset=utf-8"),
            Some(PatchType::Merge)
        );
        assert_eq!(
            PatchType::from_content_type("application/json-patch+json"),
            Some(PatchType::Json)
        );
        assert_eq!(
            PatchType::from_content_type("application/apply-patch+yaml"),
            Some(PatchType::Apply)
        );
        assert_eq!(
            PatchType::from_content_type("application/apply-patch+cbor"),
            None
        );
        assert_eq!(PatchType::from_content_type("application/json"), None);
    }

    #[test]
    fn custom_resources_refuse_strategic_with_415() {
        let err = PatchType::unsupported(true);
        assert_eq!(err.code(), 415);
        assert_eq!(
            err.to_string(),
            "the body of the request was in an unknown format - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        );
    }

    #[test]
    fn apply_bodies_may_be_yaml_or_json() {
        let yaml = b"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 3\n";
        let v = decode_body(PatchType::Apply, yaml).unwrap();
        assert_eq!(v["spec"]["replicas"], json!(3));
        let v = decode_body(PatchType::Apply, br#"{"kind":"Pod","spec":{"a":1}}"#).unwrap();
        assert_eq!(v["spec"]["a"], json!(1));
        let err = decode_body(PatchType::Merge, b"{not json").unwrap_err();
        assert_eq!(err.code(), 400);
    }
}
