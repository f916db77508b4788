//! The command line: `snapdrain controller`, `snapdrain plan`, `snapdrain crds`, and with the `sim` feature
//! `snapdrain demo`, `snapdrain sim serve` and `snapdrain bench`.

#[cfg(feature = "sim")]
mod bench;
mod controller;
#[cfg(feature = "sim")]
mod demo;
mod plan;
mod signal;
#[cfg(feature = "sim")]
mod sim;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "snapdrain",
    version,
    about = "Backup-aware node drains for Kubernetes: Velero backup, verified in S3, before any stateful pod is evicted."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Measure the DESIGN performance targets on this machine (simulated cluster, controller, planning).
    #[cfg(feature = "sim")]
    Bench(bench::BenchArgs),
    /// Run the DisruptionPlan controller.
    Controller(controller::ControllerArgs),
    /// Print the DisruptionPlan CustomResourceDefinition (YAML).
    Crds,
    /// Show snapdrain end to end on a simulated cluster: back up, verify, drain, terminate, replace.
    #[cfg(feature = "sim")]
    Demo(demo::DemoArgs),
    /// Show what a DisruptionPlan for a node would back up and evict, without changing anything.
    Plan(plan::PlanArgs),
    /// The simulated cluster (Kubernetes API, and the world around it).
    #[cfg(feature = "sim")]
    Sim {
        #[command(subcommand)]
        command: sim::SimCommand,
    },
}

impl Command {
    /// The log filter when `RUST_LOG` is unset. The demo prints its own story, so only errors are logged,
    /// and not the simulated S3 server's: a failed request already shows in the plan's status.
    pub fn default_log_filter(&self) -> &'static str {
        match self {
            #[cfg(feature = "sim")]
            Self::Demo(_) => "error,s3s=off,s3s_fs=off",
            _ => "info",
        }
    }
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        #[cfg(feature = "sim")]
        Command::Sim { command } => sim::run(command).await,
        #[cfg(feature = "sim")]
        Command::Bench(args) => bench::run(args).await,
        Command::Controller(args) => controller::run(args).await,
        #[cfg(feature = "sim")]
        Command::Demo(args) => demo::run(args).await,
        Command::Plan(args) => plan::run(args).await,
        Command::Crds => {
            print!("{}", snapdrain::api::crd_yaml());
            Ok(())
        }
    }
}
