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
    #[error(
        "cannot taint node {node} with snapdrain.io/draining:NoSchedule: {source}; check that snapdrain may patch nodes"
    )]
    Taint { node: String, source: kube::Error },
    #[error(
        "node {node} kept changing while snapdrain set its cordon and taint ({attempts} conflicting writes); will try again"
    )]
    NodeConflict { node: String, attempts: u32 },
    #[error(
        "cannot remove the snapdrain.io/draining taint from node {node}: {source}; remove it by hand with \
         `kubectl taint node {node} snapdrain.io/draining:NoSchedule-`"
    )]
    Untaint { node: String, source: kube::Error },
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
            | Self::Taint { source, .. }
            | Self::Untaint { source, .. }
            | Self::ListPods { source, .. }
            | Self::ListAttachments { source } => crate::api_errors::is_permanent(source),
            Self::NodeMissing { .. } => true,
            // Someone else writes the node meanwhile (the node lifecycle controller, a kubelet heartbeat
            // patch): the next pass reads it again.
            Self::Watch { .. } | Self::NodeConflict { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("x", "Forbidden")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn taint_errors_are_permanent_only_when_retrying_cannot_help() {
        let taint = |code| DrainError::Taint {
            node: "n1".into(),
            source: api(code),
        };
        assert!(taint(403).is_permanent());
        assert!(!taint(503).is_permanent());
        assert!(
            !DrainError::NodeConflict {
                node: "n1".into(),
                attempts: 5
            }
            .is_permanent()
        );
        let untaint = DrainError::Untaint {
            node: "n1".into(),
            source: api(403),
        };
        assert!(
            untaint
                .to_string()
                .contains("kubectl taint node n1 snapdrain.io/draining:NoSchedule-")
        );
    }
}
