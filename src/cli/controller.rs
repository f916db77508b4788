//! `snapdrain controller`: run the DisruptionPlan controller against a cluster (kubeconfig or in-cluster).

use std::net::SocketAddr;
use std::time::Duration;

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
    /// The leader-election Lease's duration in seconds: how long a standby waits to take over once the
    /// leader stops renewing (a crash, a partition).
    #[arg(long, default_value_t = RunOptions::default().lease_seconds, value_parser = clap::value_parser!(u64).range(2..=3600))]
    pub lease_seconds: u64,
    /// This replica's identity in the Lease (default: $POD_NAME or the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// AWS region (default: the standard AWS environment).
    #[arg(long, env = "AWS_REGION")]
    pub region: Option<String>,
    /// EC2 endpoint override (AWS_ENDPOINT_URL_EC2 also works).
    #[arg(long)]
    pub ec2_endpoint: Option<String>,
    /// Cluster name for Bottlerocket replacements when a plan does not set it, and for the
    /// `kubernetes.io/cluster/<name>` tag on emergency EBS snapshots (the IAM policy asks for it).
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// Velero's copy rate (MiB/s) that a plan with a deadline is estimated at: when the node's
    /// protected data does not fit before the deadline at this rate, EC2 snapshots its EBS volumes
    /// (`spec.backup.emergencySnapshots`). Measure your own (a Backup's bytes over its duration).
    #[arg(long, default_value_t = snapdrain::planning::estimate::DEFAULT_MIB_PER_SECOND)]
    pub velero_mib_per_second: f64,
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
    /// The most bytes of JSON a plan's status may grow to. A plan that could pass it (too many nodes and
    /// pods for one object) fails while planning, before any node is touched. The default, 1 MiB, leaves
    /// room under etcd's default request limit (1.5 MiB); lower it with etcd's `--max-request-bytes`.
    #[arg(long, default_value_t = snapdrain::planning::status_size::DEFAULT_BUDGET as u64, value_parser = clap::value_parser!(u64).range(65_536..))]
    pub plan_status_budget_bytes: u64,
    #[command(flatten)]
    pub webhook: WebhookArgs,
    #[command(flatten)]
    pub waits: WaitArgs,
}

/// Waits cut short for simulated clusters, where minutes of backoff only slow a test down (hidden: on a
/// real cluster the defaults are the ones to keep).
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// The longest one pass waits on a drain or a termination before it looks again, in milliseconds.
    #[arg(long, hide = true)]
    pub wait_slice_ms: Option<u64>,
    /// The longest wait before a failed backup's next attempt, in milliseconds.
    #[arg(long, hide = true)]
    pub backup_retry_cap_ms: Option<u64>,
    /// The first wait after EC2 had no capacity for a replacement, in milliseconds (doubling).
    #[arg(long, hide = true)]
    pub capacity_retry_base_ms: Option<u64>,
}

impl WaitArgs {
    /// `settings` with the waits these flags set.
    fn apply(&self, settings: Settings) -> Settings {
        let ms = |v: Option<u64>, default: Duration| v.map_or(default, Duration::from_millis);
        Settings {
            wait_slice: ms(self.wait_slice_ms, settings.wait_slice),
            backup_retry_cap: ms(self.backup_retry_cap_ms, settings.backup_retry_cap),
            capacity_retry_base: ms(self.capacity_retry_base_ms, settings.capacity_retry_base),
            ..settings
        }
    }
}

/// The eviction gate (a validating webhook on pods/eviction), served by every replica.
#[derive(Debug, Args)]
pub struct WebhookArgs {
    /// Where the gate's HTTPS listens (e.g. 0.0.0.0:8443). Without it the gate is not served.
    #[arg(long)]
    pub webhook_addr: Option<SocketAddr>,
    /// Namespace of the gate's Secret and Service (the controller's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "snapdrain")]
    pub webhook_namespace: String,
    /// The Secret holding the gate's CA and serving certificate (created if absent).
    #[arg(long, default_value = "snapdrain-webhook-tls")]
    pub webhook_secret: String,
    /// The Service in front of the replicas: the certificate is for <service>.<namespace>.svc.
    #[arg(long, default_value = "snapdrain-webhook")]
    pub webhook_service: String,
    /// The ValidatingWebhookConfiguration whose caBundle snapdrain keeps.
    #[arg(long, default_value = "snapdrain")]
    pub webhook_configuration: String,
    /// Lifetime of the gate's CA (renewed with a third left): a number with s, m, h or d.
    #[arg(long, default_value = "1825d", value_parser = parse_duration)]
    pub webhook_ca_lifetime: Duration,
    /// Lifetime of the serving certificate (renewed with a third left): a number with s, m, h or d.
    #[arg(long, default_value = "90d", value_parser = parse_duration)]
    pub webhook_cert_lifetime: Duration,
}

impl WebhookArgs {
    fn config(&self) -> Option<snapdrain::webhook::WebhookConfig> {
        Some(snapdrain::webhook::WebhookConfig {
            addr: self.webhook_addr?,
            namespace: self.webhook_namespace.clone(),
            secret: self.webhook_secret.clone(),
            service: self.webhook_service.clone(),
            configuration: self.webhook_configuration.clone(),
            lifetimes: snapdrain::webhook::Lifetimes {
                ca: self.webhook_ca_lifetime,
                serving: self.webhook_cert_lifetime,
            },
            ..snapdrain::webhook::WebhookConfig::default()
        })
    }
}

/// `90d`, `2160h`, `30m`, `45s`: a whole number and one unit.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a duration: expected a number then s, m, h or d"))?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?} has no unit: use s, m, h or d (e.g. 90d)")),
    };
    n.checked_mul(secs)
        .filter(|t| *t > 0)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{s:?} is not a usable lifetime (zero or too long)"))
}

impl ControllerArgs {
    /// How the controller runs with these flags (tests start it in-process with a Deployment's args).
    pub fn run_options(&self) -> RunOptions {
        RunOptions {
            metrics_addr: Some(self.metrics_addr),
            lease_namespace: (!self.no_leader_election).then(|| self.lease_namespace.clone()),
            lease_seconds: self.lease_seconds,
            webhook: self.webhook.config(),
            ..RunOptions::default()
        }
    }
}

pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    // A panic in any task ends the process, so the kubelet restarts it and a standby takes the Lease.
    snapdrain::controller::health::exit_on_panic();
    let opts = args.run_options();
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
    let settings = args.waits.apply(Settings {
        identity,
        velero_credentials_secret,
        ec2_endpoint: args.ec2_endpoint,
        region: args.region,
        cluster_name: args.cluster_name,
        api_server: args.api_server,
        cluster_certificate: args.cluster_certificate,
        namespace: args.webhook.webhook_namespace.clone(),
        status_budget: usize::try_from(args.plan_status_budget_bytes).unwrap_or(usize::MAX),
        velero_mib_per_second: args.velero_mib_per_second,
        ..Settings::default()
    });
    let handle = start(config, settings, opts).await?;
    tracing::info!(metrics = ?handle.metrics_addr, "snapdrain controller started");
    super::signal::shutdown_signal().await;
    tracing::info!("shutting down: finishing in-flight reconciles");
    handle.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_flags_replace_only_the_waits_they_name() {
        let defaults = Settings::default();
        let none = WaitArgs {
            wait_slice_ms: None,
            backup_retry_cap_ms: None,
            capacity_retry_base_ms: None,
        }
        .apply(Settings::default());
        assert_eq!(
            (
                none.wait_slice,
                none.backup_retry_cap,
                none.capacity_retry_base
            ),
            (
                defaults.wait_slice,
                defaults.backup_retry_cap,
                defaults.capacity_retry_base
            )
        );
        let some = WaitArgs {
            wait_slice_ms: Some(5000),
            backup_retry_cap_ms: Some(300),
            capacity_retry_base_ms: None,
        }
        .apply(Settings::default());
        assert_eq!(some.wait_slice, Duration::from_secs(5));
        assert_eq!(some.backup_retry_cap, Duration::from_millis(300));
        assert_eq!(some.capacity_retry_base, defaults.capacity_retry_base);
    }

    #[test]
    fn lifetimes_parse_with_a_unit() {
        assert_eq!(parse_duration("90d"), Ok(Duration::from_secs(90 * 86_400)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("45s"), Ok(Duration::from_secs(45)));
        assert!(parse_duration("90").is_err());
        assert!(parse_duration("0d").is_err());
        assert!(parse_duration("d").is_err());
        assert!(parse_duration("5w").is_err());
    }
}
