//! EC2's side of a spot interruption: the two-minute notice (instance metadata `spot/instance-action`,
//! which the timeline's `spotInterruption` stands for) and, at its deadline, the instance reclaimed
//! whatever any drainer managed (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
//! Its Node and pods go with it: `ec2_nodes` removes the Node of a terminated instance and the pod
//! garbage collector the pods bound to a Node that is gone.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::WorldContext;
use super::karpenter::Cloud;

/// How long before reclaiming a spot instance EC2 warns.
pub const NOTICE: Duration = Duration::from_secs(120);

/// Terminates `instance` at `deadline`.
pub async fn reclaim_at(
    ctx: Arc<WorldContext>,
    cloud: Arc<dyn Cloud>,
    instance: String,
    node: String,
    deadline: jiff::Timestamp,
) {
    if let Ok(wait) = Duration::try_from(deadline.duration_since(jiff::Timestamp::now())) {
        tokio::time::sleep(wait).await;
    }
    let result = cloud.terminate(&instance).await;
    ctx.audit.world(
        "spot-instance-reclaimed",
        "instances",
        None,
        Some(&instance),
        match result {
            Ok(()) => json!({"node": node}),
            Err(e) => json!({"node": node, "error": e}),
        },
    );
}
