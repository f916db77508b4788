//! Errors for Bottlerocket user data.

use thiserror::Error;

/// Why a piece of Bottlerocket user data cannot be used.
///
/// Every variant names the setting path (as written in the TOML, e.g.
/// `settings.kubernetes.node-labels."example.com/pool"`) and what to change.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UserDataError {
    #[error(
        "user data is {size} bytes, over EC2's {limit}-byte limit; drop settings or gzip-compress it"
    )]
    TooLarge { size: usize, limit: usize },
    #[error("user data is gzip-compressed but does not decompress: {0}; re-compress it with gzip")]
    Gzip(String),
    #[error("user data is not UTF-8 text; Bottlerocket user data must be TOML")]
    NotUtf8,
    #[error("user data is not valid TOML: {0}")]
    Toml(String),
    #[error("user data has no top-level [settings] table; put every setting under [settings.*]")]
    MissingSettings,
    #[error("{path} is required to join an EKS cluster; set it")]
    Missing { path: String },
    #[error("{path}: {problem}; {fix}")]
    Invalid {
        path: String,
        problem: String,
        fix: String,
    },
    #[error("could not render user data: {0}")]
    Render(String),
}

impl UserDataError {
    pub(crate) fn invalid(
        path: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        UserDataError::Invalid {
            path: path.into(),
            problem: problem.into(),
            fix: fix.into(),
        }
    }

    /// The setting path the error is about, when there is one.
    pub fn path(&self) -> Option<&str> {
        match self {
            UserDataError::Missing { path } | UserDataError::Invalid { path, .. } => Some(path),
            _ => None,
        }
    }
}
