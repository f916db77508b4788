//! API errors as the real kube-apiserver reports them: a `Status` object with reason, code and details.

use serde_json::{Value, json};

/// One failed field, as in `Status.details.causes`.
#[derive(Clone, Debug, PartialEq)]
pub struct Cause {
    pub reason: String,
    pub message: String,
    pub field: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    /// `details.name` / `details.group` / `details.kind`.
    pub name: Option<String>,
    pub group: Option<String>,
    pub kind: Option<String>,
    pub causes: Vec<Cause>,
    pub retry_after_seconds: Option<u32>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.reason, self.code, self.message)
    }
}

impl std::error::Error for ApiError {}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.to_string(),
            message: message.into(),
            name: None,
            group: None,
            kind: None,
            causes: Vec::new(),
            retry_after_seconds: None,
        }
    }

    fn with_target(mut self, group: &str, plural: &str, name: &str) -> Self {
        self.name = Some(name.to_string());
        self.group = Some(group.to_string());
        self.kind = Some(plural.to_string());
        self
    }

    pub fn with_cause(mut self, reason: &str, field: &str, message: impl Into<String>) -> Self {
        self.causes.push(Cause {
            reason: reason.to_string(),
            field: field.to_string(),
            message: message.into(),
        });
        self
    }

    fn qualified(group: &str, plural: &str) -> String {
        if group.is_empty() {
            plural.to_string()
        } else {
            format!("{plural}.{group}")
        }
    }

    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", Self::qualified(group, plural)),
        )
        .with_target(group, plural, name)
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!(
                "{} \"{name}\" already exists",
                Self::qualified(group, plural)
            ),
        )
        .with_target(group, plural, name)
    }

    pub fn conflict(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                Self::qualified(group, plural)
            ),
        )
        .with_target(group, plural, name)
    }

    pub fn precondition_failed(group: &str, plural: &str, name: &str, detail: String) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {detail}",
                Self::qualified(group, plural)
            ),
        )
        .with_target(group, plural, name)
    }

    /// 422 with field causes, as validation failures are reported.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<Cause>) -> Self {
        let list: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let summary = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{kind}.{group} \"{name}\" is invalid: {summary}"),
        );
        if group.is_empty() {
            e.message = format!("{kind} \"{name}\" is invalid: {summary}");
        }
        e.name = Some(name.to_string());
        e.group = Some(group.to_string());
        e.kind = Some(kind.to_string());
        e.causes = causes;
        e
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json and application/yaml (every kind), application/vnd.kubernetes.protobuf (only {}); got {content_type:?}",
                super::protobuf::kinds::ACCEPTED_KINDS.join(", ")
            ),
        )
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    pub fn too_many_requests(message: impl Into<String>) -> Self {
        Self::new(429, "TooManyRequests", message)
    }

    /// The `Status` object sent to the client.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        // An empty reason is left out, as Go's `omitempty` does (webhook denials may carry none).
        if self.reason.is_empty()
            && let Some(m) = status.as_object_mut()
        {
            m.remove("reason");
        }
        let mut details = serde_json::Map::new();
        if let Some(n) = &self.name {
            details.insert("name".into(), json!(n));
        }
        if let Some(g) = &self.group {
            details.insert("group".into(), json!(g));
        }
        if let Some(k) = &self.kind {
            details.insert("kind".into(), json!(k));
        }
        if !self.causes.is_empty() {
            let causes: Vec<Value> = self
                .causes
                .iter()
                .map(|c| {
                    let mut v = json!({"reason": c.reason, "message": c.message});
                    if c.reason.is_empty()
                        && let Some(m) = v.as_object_mut()
                    {
                        m.remove("reason");
                    }
                    if !c.field.is_empty() {
                        v["field"] = json!(c.field);
                    }
                    v
                })
                .collect();
            details.insert("causes".into(), Value::Array(causes));
        }
        if let Some(r) = self.retry_after_seconds {
            details.insert("retryAfterSeconds".into(), json!(r));
        }
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_reads_like_the_real_server() {
        let s = ApiError::not_found("apps", "statefulsets", "db").to_status();
        assert_eq!(s["message"], "statefulsets.apps \"db\" not found");
        assert_eq!(s["code"], 404);
        assert_eq!(s["details"]["kind"], "statefulsets");
        let core = ApiError::not_found("", "pods", "p").to_status();
        assert_eq!(core["message"], "pods \"p\" not found");
    }

    #[test]
    fn invalid_lists_causes() {
        let e = ApiError::invalid(
            "Pod",
            "",
            "Bad",
            vec![Cause {
                reason: "FieldValueInvalid".into(),
                field: "metadata.name".into(),
                message: "Invalid value: \"Bad\"".into(),
            }],
        );
        let s = e.to_status();
        assert_eq!(s["code"], 422);
        assert_eq!(s["details"]["causes"][0]["field"], "metadata.name");
        assert!(
            s["message"]
                .as_str()
                .unwrap()
                .starts_with("Pod \"Bad\" is invalid: metadata.name")
        );
    }
}
