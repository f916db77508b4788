//! `fieldValidation` as kube-apiserver applies it (k8s.io/apiserver `pkg/endpoints/handlers/create.go`,
//! `update.go`, `patch.go`; CRs in apiextensions-apiserver `customresource_handler.go`): the strict
//! decoder's findings, unknown and duplicate fields, are a 400 under `Strict`, a `Warning: 299` header
//! each under `Warn` (the default when the parameter is absent), and nothing under `Ignore`.
//! apiVersion, kind and metadata are always known.

mod builtin;
mod duplicates;

pub use builtin::unknown_fields as builtin_unknown_fields;
pub use duplicates::duplicate_fields;

use super::errors::{ApiError, ApiResult};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Directive {
    Ignore,
    Warn,
    Strict,
}

impl Directive {
    /// `?fieldValidation=`; absent means Warn (k8s.io/apiserver `fieldValidation()`).
    pub fn from_query(value: Option<&str>) -> ApiResult<Self> {
        match value {
            None | Some("") | Some("Warn") => Ok(Self::Warn),
            Some("Strict") => Ok(Self::Strict),
            Some("Ignore") => Ok(Self::Ignore),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation parameter unsupported: {other:?}: use \"Ignore\", \"Warn\" or \"Strict\""
            ))),
        }
    }
}

/// What the strict decoder found, in the order its errors are joined.
#[derive(Debug, Default)]
pub struct Findings {
    pub errors: Vec<String>,
}

impl Findings {
    /// Duplicates come from the JSON decoder, unknown fields after them (a CR's pruning, or the Go
    /// types of a built-in kind).
    pub fn new(duplicates: &[String], unknown: &[String]) -> Self {
        let mut errors: Vec<String> = duplicates
            .iter()
            .map(|d| format!("duplicate field \"{d}\""))
            .collect();
        errors.extend(unknown.iter().map(|u| format!("unknown field \"{u}\"")));
        Self { errors }
    }

    /// Under Strict: the 400 `transformDecodeError` sends; otherwise the warnings to send (none for
    /// Ignore).
    pub fn apply(self, directive: Directive, kind: &str, version: &str) -> ApiResult<Vec<String>> {
        if self.errors.is_empty() {
            return Ok(Vec::new());
        }
        match directive {
            Directive::Ignore => Ok(Vec::new()),
            Directive::Warn => Ok(self.errors),
            Directive::Strict => Err(ApiError::bad_request(format!(
                "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
                self.errors.join(", ")
            ))),
        }
    }
}

/// A `Warning` header value: code 299, agent `-`, the text quoted (k8s.io/apiserver
/// `pkg/endpoints/filters/warning.go`).
pub fn warning_header(text: &str) -> String {
    format!(
        "299 - {}",
        serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_refuses_warn_warns_ignore_drops() {
        let f = || Findings::new(&["spec.bar".into()], &["spec.foo".into()]);
        let err = f().apply(Directive::Strict, "Backup", "v1").unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(
            err.message,
            "Backup in version \"v1\" cannot be handled as a Backup: strict decoding error: duplicate field \"spec.bar\", unknown field \"spec.foo\""
        );
        assert_eq!(
            f().apply(Directive::Warn, "Backup", "v1").unwrap(),
            vec!["duplicate field \"spec.bar\"", "unknown field \"spec.foo\""]
        );
        assert!(
            f().apply(Directive::Ignore, "Backup", "v1")
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            warning_header("unknown field \"spec.foo\""),
            "299 - \"unknown field \\\"spec.foo\\\"\""
        );
        assert!(Directive::from_query(Some("strict")).is_err());
    }
}
