//! `snapdrain controller`: run the DisruptionPlan controller against a cluster (kubeconfig or in-cluster).

use std::net::SocketAddr;

use clap::Args;

use snapdrain::controller::run::RunOptions;
use snapdrain::controller::{Settings, start};

#[derive(Debug, Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub cluster: super::cluster::ClusterArgs,
    /// Where /metrics and /healthz listen.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "snapdrain")]
    pub lease_namespace: String,
    /// Run without leader election (a single replica only).
    #[arg(long)]
    pub no_leader_election: bool,
    /// This replica's identity in the Lease (default: $POD_NAME or the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// AWS region (default: the standard AWS environment).
    #[arg(long, env = "AWS_REGION")]
    pub region: Option<String>,
    /// EC2 endpoint override (AWS_ENDPOINT_URL_EC2 also works).
    #[arg(long)]
    pub ec2_endpoint: Option<String>,
    /// Cluster name for Bottlerocket replacements when a plan does not set it.
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// API server URL for Bottlerocket replacements when a plan does not set it.
    #[arg(long)]
    pub api_server: Option<String>,
    /// Base64 cluster CA for Bottlerocket replacements when a plan does not set it.
    #[arg(long)]
    pub cluster_certificate: Option<String>,
    /// The Secret (NAME or NAME/KEY, key `cloud` by default) in the Velero namespace holding Velero's
    /// credentials file, when it is not the one the Velero Deployment mounts. Without it snapdrain uses
    /// the BSL's spec.credential, else the Velero Deployment's Secret, else its own AWS identity.
    #[arg(long)]
    pub velero_credentials_secret: Option<String>,
}

pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let config = args.cluster.config().await?;
    let identity = args
        .identity
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("snapdrain-{}", std::process::id()));
    let velero_credentials_secret = args
        .velero_credentials_secret
        .as_deref()
        .map(snapdrain::backup::credentials::parse_override)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let settings = Settings {
        identity,
        velero_credentials_secret,
        ec2_endpoint: args.ec2_endpoint,
        region: args.region,
        cluster_name: args.cluster_name,
        api_server: args.api_server,
        cluster_certificate: args.cluster_certificate,
        ..Settings::default()
    };
    let opts = RunOptions {
        metrics_addr: Some(args.metrics_addr),
        lease_namespace: (!args.no_leader_election).then_some(args.lease_namespace),
        ..RunOptions::default()
    };
    let handle = start(config, settings, opts).await?;
    tracing::info!(metrics = ?handle.metrics_addr, "snapdrain controller started");
    super::signal::shutdown_signal().await;
    tracing::info!("shutting down: finishing in-flight reconciles");
    handle.shutdown().await;
    Ok(())
}
