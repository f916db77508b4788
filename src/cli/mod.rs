//! The command line: `snapdrain sim serve`, `snapdrain bench`, `snapdrain demo`, `snapdrain controller`, `snapdrain crds`, ...

mod bench;
mod controller;
mod demo;
mod plan;
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
    Bench(bench::BenchArgs),
    /// Run the DisruptionPlan controller.
    Controller(controller::ControllerArgs),
    /// Print the DisruptionPlan CustomResourceDefinition (YAML).
    Crds,
    /// Show snapdrain end to end on a simulated cluster: back up, verify, drain, terminate, replace.
    Demo(demo::DemoArgs),
    /// Show what a DisruptionPlan for a node would back up and evict, without changing anything.
    Plan(plan::PlanArgs),
    /// The simulated cluster (Kubernetes API, and the world around it).
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
            Self::Demo(_) => "error,s3s=off,s3s_fs=off",
            _ => "info",
        }
    }
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Sim { command } => sim::run(command).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Controller(args) => controller::run(args).await,
        Command::Demo(args) => demo::run(args).await,
        Command::Plan(args) => plan::run(args).await,
        Command::Crds => {
            print!("{}", crate::api::crd_yaml());
            Ok(())
        }
    }
}
