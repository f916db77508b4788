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
    #[error("{0}")]
    Config(String),
}

impl ControllerError {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::WriteStatus { .. } => "write_status",
            Self::Read { .. } => "read",
            Self::Delete { .. } => "delete",
            Self::Velero(_) => "velero",
            Self::Bucket(_) => "bucket",
            Self::Drain(_) => "drain",
            Self::Cloud(_) => "cloud",
            Self::UserData(_) => "user_data",
            Self::Config(_) => "config",
        }
    }
}
