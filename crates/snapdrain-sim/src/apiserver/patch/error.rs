//! The one error type of the patch module, shaped like the `metav1.Status` the real apiserver returns.

use serde_json::{Value, json};
use thiserror::Error;

/// One entry of `status.details.causes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusCause {
    /// `reason` of the cause, e.g. `FieldManagerConflict`.
    pub reason: &'static str,
    pub message: String,
    pub field: String,
}

/// Why a patch or apply was refused. Each variant is one Kubernetes status code.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PatchError {
    /// 400: the patch body is malformed (bad JSON, wrong directive format, missing merge key...).
    #[error("{0}")]
    BadRequest(String),
    /// 415: the patch type is not accepted for this resource (strategic merge on a custom resource).
    #[error(
        "the body of the request was in an unknown format - accepted media types include: {accepted}"
    )]
    UnsupportedMediaType { accepted: String },
    /// 422: the patch is well-formed but cannot be applied. A failed JSON-patch operation is reported
    /// by kube-apiserver with only the generic message below (the detail is dropped), which kubectl
    /// prints as "The request is invalid: the server rejected our request due to an error in our
    /// request"; `detail` keeps the reason for logs.
    #[error("{message}")]
    Invalid {
        message: String,
        detail: String,
        causes: Vec<StatusCause>,
    },
    /// 409: server-side apply found fields owned by other managers with different values.
    #[error("{message}")]
    Conflict {
        message: String,
        causes: Vec<StatusCause>,
    },
}

/// The message kube-apiserver uses for every 422 built by `NewGenericServerResponse`.
pub(crate) const GENERIC_INVALID: &str =
    "the server rejected our request due to an error in our request";

impl PatchError {
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::BadRequest(message.into())
    }

    /// A 422 whose message is the generic one, as for failed JSON-patch operations.
    pub(crate) fn invalid(detail: impl Into<String>) -> Self {
        Self::Invalid {
            message: GENERIC_INVALID.to_string(),
            detail: detail.into(),
            causes: Vec::new(),
        }
    }

    /// HTTP status code.
    pub fn code(&self) -> u16 {
        match self {
            Self::BadRequest(_) => 400,
            Self::UnsupportedMediaType { .. } => 415,
            Self::Invalid { .. } => 422,
            Self::Conflict { .. } => 409,
        }
    }

    /// `metav1.Status.reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "BadRequest",
            Self::UnsupportedMediaType { .. } => "UnsupportedMediaType",
            Self::Invalid { .. } => "Invalid",
            Self::Conflict { .. } => "Conflict",
        }
    }

    /// `metav1.Status.details.causes`.
    pub fn causes(&self) -> Vec<StatusCause> {
        match self {
            Self::Invalid { causes, .. } | Self::Conflict { causes, .. } => causes.clone(),
            Self::BadRequest(_) | Self::UnsupportedMediaType { .. } => Vec::new(),
        }
    }

    /// A complete `metav1.Status` body. The handler may add `details.name`/`kind`/`group`.
    pub fn status_body(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        let causes = self.causes();
        if !causes.is_empty() {
            let causes: Vec<Value> = causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect();
            status["details"] = json!({ "causes": causes });
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_reasons_match_kubernetes() {
        let cases = [
            (PatchError::bad_request("x"), 400, "BadRequest"),
            (
                PatchError::UnsupportedMediaType {
                    accepted: "a".into(),
                },
                415,
                "UnsupportedMediaType",
            ),
            (PatchError::invalid("x"), 422, "Invalid"),
            (
                PatchError::Conflict {
                    message: "m".into(),
                    causes: vec![],
                },
                409,
                "Conflict",
            ),
        ];
        for (err, code, reason) in cases {
            assert_eq!(err.code(), code);
            assert_eq!(err.reason(), reason);
        }
    }

    #[test]
    fn status_body_carries_causes() {
        let err = PatchError::Conflict {
            message: "Apply failed with 1 conflict: conflict with \"a\": .spec.replicas".into(),
            causes: vec![StatusCause {
                reason: "FieldManagerConflict",
                message: "conflict with \"a\"".into(),
                field: ".spec.replicas".into(),
            }],
        };
        let body = err.status_body();
        assert_eq!(body["code"], 409);
        assert_eq!(body["reason"], "Conflict");
        assert_eq!(body["details"]["causes"][0]["field"], ".spec.replicas");
        assert_eq!(
            body["details"]["causes"][0]["reason"],
            "FieldManagerConflict"
        );
        assert_eq!(
            PatchError::invalid("test failed").to_string(),
            GENERIC_INVALID
        );
    }
}
