//! `snapdrain demo`: replace a node of a simulated cluster safely, end to end, and tell it. Exits non-zero
//! unless the plan Completed and no protected pod was evicted before its verified backup.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::demo::{DemoOptions, run as run_demo};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The simulated cluster: a built-in scenario (quickstart, batch-burst, drift-rollout) or a scenario file.
    #[arg(long, default_value = "quickstart", value_name = "NAME|FILE")]
    pub scenario: String,
    /// The node to disrupt (default: the node running the most StatefulSet pods with volumes).
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// Do not launch a Bottlerocket replacement.
    #[arg(long)]
    pub no_replacement: bool,
    /// After the summary, write a kubeconfig and keep the cluster running until Ctrl-C (for kubectl).
    #[arg(long)]
    pub keep_running: bool,
    /// Where --keep-running writes the kubeconfig.
    #[arg(long, default_value = "snapdrain-demo.kubeconfig", value_name = "FILE")]
    pub kubeconfig: PathBuf,
    /// Where to write the HTML report of the plan at the end (`snapdrain report`).
    #[arg(
        long,
        default_value = "snapdrain-demo-report.html",
        value_name = "FILE"
    )]
    pub report: PathBuf,
    /// Instead of one plan: a Karpenter drift rollout of the drift-rollout scenario's 20 nodes, guarded by
    /// snapdrain's holds and Release plans, with the same safety check over every plan.
    #[arg(long, conflicts_with_all = ["node", "no_replacement", "keep_running"])]
    pub rollout: bool,
    /// Give up if the plan has not finished after this many seconds.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub timeout: u64,
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    if args.rollout {
        let timeout = Duration::from_secs(args.timeout.max(900));
        let failure = crate::demo::rollout::run(timeout, &mut std::io::stdout()).await?;
        return match failure {
            None => Ok(()),
            Some(why) => anyhow::bail!("the rollout demo failed: {why}"),
        };
    }
    let opts = DemoOptions {
        scenario: args.scenario,
        node: args.node,
        replacement: !args.no_replacement,
        timings: None,
        timeout: Duration::from_secs(args.timeout),
        // The spinner draws on stderr: only when both streams reach a person.
        live: std::io::stdout().is_terminal() && std::io::stderr().is_terminal(),
        report_path: Some(args.report),
    };
    let mut stdout = std::io::stdout();
    let demo = run_demo(&opts, &mut stdout).await?;
    if args.keep_running {
        let path = demo.write_kubeconfig(&args.kubeconfig)?;
        println!();
        println!("The simulated cluster keeps running. In another terminal:");
        println!("  export KUBECONFIG={}", path.display());
        println!("  kubectl get dplan -o wide");
        println!("  kubectl get nodes -L example.com/pool");
        println!("  kubectl get backups.velero.io -n velero");
        println!("  kubectl get pods -n shop -o wide");
        println!("Press Ctrl-C to stop.");
        super::signal::shutdown_signal().await;
    }
    let failure = demo.failure();
    demo.shutdown().await;
    match failure {
        None => Ok(()),
        Some(why) => anyhow::bail!("the demo failed:\n{why}"),
    }
}
