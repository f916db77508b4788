//! Leader election on a coordination.k8s.io Lease (kube-lease-manager): every replica serves metrics and
//! health, only the holder reconciles plans.

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;

use super::error::ControllerError;

pub const LEASE_NAME: &str = "snapdrain-controller";

/// The Lease task: it renews while any receiver lives and releases the Lease when the last one goes.
pub type LeaseTask = tokio::task::JoinHandle<Result<LeaseManager, LeaseManagerError>>;

/// Starts contending for the Lease; the receiver says whether this replica holds it right now.
pub async fn contend(
    client: Client,
    namespace: &str,
    identity: &str,
    duration_secs: u64,
) -> Result<(watch::Receiver<bool>, LeaseTask), ControllerError> {
    let manager = LeaseManagerBuilder::new(client, LEASE_NAME)
        .with_namespace(namespace)
        .with_identity(identity)
        .with_duration(duration_secs)
        .with_grace((duration_secs / 3).max(1))
        .build()
        .await
        .map_err(|e| {
            ControllerError::Config(format!(
                "cannot set up leader election on Lease {namespace}/{LEASE_NAME}: {e}"
            ))
        })?;
    Ok(manager.watch().await)
}
