//! Errors of a reconcile pass. Each says what failed and what a person can do; none loses the plan's
//! progress, which lives in its status.

use crate::backup::bucket::BucketError;
use crate::backup::velero::VeleroError;
use crate::cloud::bottlerocket::UserDataError;
use crate::cloud::ec2::CloudError;
use crate::drain::DrainError;

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("cannot write the status of DisruptionPlan {plan}: {source}")]
    WriteStatus { plan: String, source: kube::Error },
    #[error("cannot read {what}: {source}")]
    Read { what: String, source: kube::Error },
    #[error("cannot delete {what}: {source}")]
    Delete { what: String, source: kube::Error },
    #[error(transparent)]
    Velero(#[from] VeleroError),
    #[error(transparent)]
    Bucket(#[from] BucketError),
    #[error(transparent)]
    Drain(#[from] DrainError),
    #[error(transparent)]
    Cloud(#[from] CloudError),
    #[error("replacement user data is invalid: {0}")]
    UserData(#[from] UserDataError),
    #[error(
        "cannot change snapdrain's hold annotations on pod {pod}: {source} (may snapdrain patch pods?)"
    )]
    Hold { pod: String, source: kube::Error },
    #[error("{0}")]
    Config(String),
    /// An object changed between snapdrain's read and its guarded write (a 409 on resourceVersion):
    /// the next pass reads it again.
    #[error("{0}")]
    Changed(String),
    /// The Lease was lost or the controller is stopping: the pass was cancelled before its next
    /// request. Steps are idempotent and progress is in the status, so the next leader resumes.
    /// A shared cache has not finished its first list: retried (the plan waits, it does not act blind).
    #[error(transparent)]
    CacheNotSynced(#[from] super::cache::NotSynced),
    #[error("this replica no longer leads (Lease lost or shutting down); the pass was cancelled")]
    NotLeading,
}

impl ControllerError {
    /// True when retrying the pass cannot help: the plan fails with this error's message, which
    /// names the object and what to do, instead of retrying forever.
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::WriteStatus { .. } => false,
            Self::Read { source, .. } | Self::Delete { source, .. } | Self::Hold { source, .. } => {
                crate::api_errors::is_permanent(source)
            }
            Self::Velero(e) => e.is_permanent(),
            Self::Bucket(e) => e.is_permanent(),
            Self::Drain(e) => e.is_permanent(),
            Self::Cloud(e) => e.is_permanent(),
            Self::UserData(_) | Self::Config(_) => true,
            Self::NotLeading | Self::Changed(_) | Self::CacheNotSynced(_) => false,
        }
    }

    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::WriteStatus { .. } => "write_status",
            Self::Read { .. } => "read",
            Self::Delete { .. } => "delete",
            Self::Hold { .. } => "hold",
            Self::Velero(_) => "velero",
            Self::Bucket(_) => "bucket",
            Self::Drain(_) => "drain",
            Self::Cloud(_) => "cloud",
            Self::UserData(_) => "user_data",
            Self::Config(_) => "config",
            Self::NotLeading => "not_leading",
            Self::Changed(_) => "changed",
            Self::CacheNotSynced(_) => "cache_not_synced",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conflicting_write_is_retried_and_a_configuration_problem_is_not() {
        assert!(!ControllerError::Changed("pod shop/db-0 changed".into()).is_permanent());
        assert!(ControllerError::Config("no cluster name".into()).is_permanent());
        assert!(!ControllerError::NotLeading.is_permanent());
    }
}
