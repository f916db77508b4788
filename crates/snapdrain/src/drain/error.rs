//! Errors of the drain steps, naming the node or pod and what to do.

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("cannot read node {node}: {source}")]
    ReadNode { node: String, source: kube::Error },
    #[error("node {node} does not exist")]
    NodeMissing { node: String },
    #[error("cannot cordon node {node}: {source}; check that snapdrain may patch nodes")]
    Cordon { node: String, source: kube::Error },
    #[error(
        "cannot uncordon node {node}: {source}; uncordon it by hand with `kubectl uncordon {node}`"
    )]
    Uncordon { node: String, source: kube::Error },
    #[error("cannot list pods on node {node}: {source}")]
    ListPods { node: String, source: kube::Error },
    #[error("cannot list VolumeAttachments: {source}")]
    ListAttachments { source: kube::Error },
    #[error("watch of {what} failed: {message}")]
    Watch { what: String, message: String },
}

impl DrainError {
    /// True when retrying cannot help (RBAC, a refused request, a node that is gone).
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::ReadNode { source, .. }
            | Self::Cordon { source, .. }
            | Self::Uncordon { source, .. }
            | Self::ListPods { source, .. }
            | Self::ListAttachments { source } => crate::api_errors::is_permanent(source),
            Self::NodeMissing { .. } => true,
            Self::Watch { .. } => false,
        }
    }
}
