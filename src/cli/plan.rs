//! `snapdrain plan NODE`: a dry run. Shows which backups a DisruptionPlan for NODE would take and which
//! pods it would evict, in which order, without changing anything in the cluster.

use clap::Args;

use snapdrain::api::DisruptionPlanSpec;
use snapdrain::controller::preview::describe;

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The node to plan for.
    pub node: String,
    #[command(flatten)]
    pub cluster: super::cluster::ClusterArgs,
}

pub async fn run(args: PlanArgs) -> anyhow::Result<()> {
    let client = args.cluster.client().await?;
    // The defaults a plan naming only this node gets from the API (serde defaults, not `Default`).
    let spec: DisruptionPlanSpec =
        serde_json::from_value(serde_json::json!({"nodes": [args.node]}))?;
    print!("{}", describe(&client, &args.node, &spec).await?);
    Ok(())
}
