//! What can go wrong turning a protobuf request body into JSON, and the API status each gives.

use super::super::errors::ApiError;

#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    #[error(
        "provided data does not appear to be a protobuf message, expected prefix [107 56 115 0] (\"k8s\\x00\"); send a Kubernetes protobuf envelope, or the object as JSON or YAML"
    )]
    MissingMagic,
    #[error("empty body: the protobuf envelope holds no object after the \"k8s\\x00\" prefix")]
    Empty,
    #[error("the protobuf envelope (runtime.Unknown) could not be decoded: {0}")]
    Envelope(prost::DecodeError),
    #[error("Object 'Kind' is missing in the protobuf envelope's typeMeta; set typeMeta.kind")]
    MissingKind,
    #[error(
        "Object 'apiVersion' is missing in the protobuf envelope's typeMeta; set typeMeta.apiVersion"
    )]
    MissingVersion,
    #[error(
        "the protobuf envelope says contentEncoding {0:?}; only unencoded bodies are accepted (leave contentEncoding empty)"
    )]
    ContentEncoding(String),
    #[error("{kind} ({api_version}) could not be decoded from protobuf: {source}")]
    Decode {
        api_version: String,
        kind: String,
        source: prost::DecodeError,
    },
    #[error(
        "the simulated API server decodes protobuf bodies only for {accepted} (got {api_version}/{kind}); JSON and YAML bodies are accepted for every kind: send this one as application/json (for example `kubectl create ... --dry-run=client -o yaml | kubectl create -f -`)",
        accepted = super::kinds::ACCEPTED_KINDS.join(", ")
    )]
    UnsupportedKind { api_version: String, kind: String },
    #[error(
        "field {path} of the protobuf {kind} body is not decoded by the simulated API server, so it would be lost; send this object as JSON or YAML instead (for example `kubectl create ... --dry-run=client -o yaml | kubectl create -f -`)"
    )]
    Unmapped { kind: String, path: String },
    #[error("field {path} of the protobuf {kind} body is invalid: {problem}")]
    Invalid {
        kind: String,
        path: String,
        problem: String,
    },
}

impl ProtobufError {
    /// A field-level error found below the envelope, before the kind is known to the converter.
    pub fn unmapped(path: &str) -> Self {
        Self::Unmapped {
            kind: String::new(),
            path: path.to_string(),
        }
    }

    pub fn invalid(path: &str, problem: impl Into<String>) -> Self {
        Self::Invalid {
            kind: String::new(),
            path: path.to_string(),
            problem: problem.into(),
        }
    }

    /// Names the kind in a field-level error.
    pub fn in_kind(self, name: &str) -> Self {
        match self {
            Self::Unmapped { path, .. } => Self::Unmapped {
                kind: name.to_string(),
                path,
            },
            Self::Invalid { path, problem, .. } => Self::Invalid {
                kind: name.to_string(),
                path,
                problem,
            },
            other => other,
        }
    }
}

impl From<ProtobufError> for ApiError {
    /// A kind or field this simulator cannot take as protobuf is a media-type problem (415: the same
    /// object as JSON is accepted); a malformed body is a 400, as the real server's decoder gives it.
    fn from(e: ProtobufError) -> Self {
        match e {
            ProtobufError::UnsupportedKind { .. } | ProtobufError::Unmapped { .. } => {
                ApiError::new(415, "UnsupportedMediaType", e.to_string())
            }
            _ => ApiError::bad_request(e.to_string()),
        }
    }
}
