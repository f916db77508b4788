//! What can go wrong turning a disruption signal into a plan.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SignalError {
    #[error(
        "cannot list DisruptionPlans to find one for node {node}: {source} (is the DisruptionPlan CRD installed, and may snapdrain list disruptionplans?)"
    )]
    List {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "cannot create DisruptionPlan {plan} for node {node}: {source} (may snapdrain create disruptionplans?)"
    )]
    Create {
        plan: String,
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot update DisruptionPlan {plan} joined by a signal for node {node}: {source}")]
    Join {
        plan: String,
        node: String,
        #[source]
        source: kube::Error,
    },
}

impl SignalError {
    /// Whether retrying cannot help (RBAC, a missing CRD, an invalid object).
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::List { source, .. } | Self::Create { source, .. } | Self::Join { source, .. } => {
                crate::api_errors::is_permanent(source)
            }
        }
    }
}
