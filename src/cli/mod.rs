//! The command line: `snapdrain controller`, `snapdrain plan`, `snapdrain crds`, and with the `sim` feature
//! `snapdrain demo`, `snapdrain sim serve` and `snapdrain bench`.

pub mod abort;
#[cfg(feature = "sim")]
mod bench;
pub mod cluster;
pub mod completion;
pub mod controller;
mod cordons;
#[cfg(feature = "sim")]
mod demo;
pub mod drain;
pub mod follow;
pub mod holds;
pub mod invocation;
mod plan;
pub mod report;
pub mod selector;
mod signal;
#[cfg(feature = "sim")]
mod sim;
pub mod status;
mod terminal;
pub mod uninstall;

use clap::{Parser, Subcommand};

/// `snapdrain --version`: the release and the commit it was built from (build.rs; `unknown` when built
/// without git metadata).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("SNAPDRAIN_REVISION"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "snapdrain",
    version = VERSION,
    about = "Backup-aware node drains for Kubernetes: Velero backup, verified in S3, before any stateful pod is evicted."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// `snapdrain crds`: which CRD to print (default both, as one multi-document YAML for `kubectl apply -f -`).
#[derive(Debug, clap::Args)]
pub struct CrdsArgs {
    /// Print only this CRD (the form committed as crds/disruptionplan.yaml and crds/disruptionpolicy.yaml).
    #[arg(long, value_enum)]
    pub only: Option<CrdKind>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum CrdKind {
    Plan,
    Policy,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Stop a running DisruptionPlan and roll it back (uncordon, restore holds).
    Abort(abort::AbortArgs),
    /// Measure the DESIGN performance targets on this machine (simulated cluster, controller, planning).
    #[cfg(feature = "sim")]
    Bench(bench::BenchArgs),
    /// Run the DisruptionPlan controller.
    Controller(Box<controller::ControllerArgs>),
    /// Print a shell completion script (bash, zsh or fish).
    Completion(completion::CompletionArgs),
    /// Print snapdrain's CustomResourceDefinitions (YAML): DisruptionPlan and DisruptionPolicy.
    Crds(CrdsArgs),
    /// Show snapdrain end to end on a simulated cluster: back up, verify, drain, terminate, replace.
    #[cfg(feature = "sim")]
    Demo(demo::DemoArgs),
    /// Back up and drain nodes now: create a DisruptionPlan and follow it live.
    Drain(Box<drain::DrainArgs>),
    /// Snapdrain's holds on pods: list them, or release them all (before an uninstall).
    Holds {
        #[command(subcommand)]
        command: holds::HoldsCommand,
    },
    /// Print the man page (roff), e.g. `snapdrain man > snapdrain.1`.
    Man,
    /// Show what a DisruptionPlan for a node would back up and evict, without changing anything.
    Plan(plan::PlanArgs),
    /// Write what happened to a plan as one self-contained HTML page (or Markdown).
    Report(report::ReportArgs),
    /// The simulated cluster (Kubernetes API, and the world around it).
    #[cfg(feature = "sim")]
    Sim {
        #[command(subcommand)]
        command: sim::SimCommand,
    },
    /// The DisruptionPlans as a table, or one in detail.
    Status(status::StatusArgs),
}

impl Command {
    /// The log filter when `RUST_LOG` is unset. The demo prints its own story, so only errors are logged,
    /// and not the simulated S3 server's: a failed request already shows in the plan's status.
    pub fn default_log_filter(&self) -> &'static str {
        match self {
            #[cfg(feature = "sim")]
            Self::Demo(_) => "error,s3s=off,s3s_fs=off",
            // The user-facing commands tell their own story on stdout; logs would garble it.
            Self::Drain(_)
            | Self::Status(_)
            | Self::Abort(_)
            | Self::Report(_)
            | Self::Holds { .. } => "error",
            // The bench runs controllers and simulated clusters in process: their logs would bury the
            // report (RUST_LOG shows them).
            #[cfg(feature = "sim")]
            Self::Bench(_) => "warn,s3s=off,s3s_fs=off",
            _ => "info",
        }
    }
}

/// Runs a command; the exit code says how it ended (see [`follow::exit`]; errors are code 1).
pub async fn run(cli: Cli) -> anyhow::Result<u8> {
    let code = |o: follow::exit::Outcome| o.exit_code();
    match cli.command {
        Command::Drain(args) => return drain::run(*args).await.map(code),
        Command::Status(args) => status::run(args).await?,
        Command::Abort(args) => abort::run(args).await?,
        Command::Holds { command } => holds::run(command).await?,
        Command::Report(args) => report::run(args).await?,
        Command::Completion(args) => completion::run_completion(args)?,
        Command::Man => completion::run_man()?,
        other => run_other(other).await?,
    }
    Ok(0)
}

async fn run_other(command: Command) -> anyhow::Result<()> {
    match command {
        #[cfg(feature = "sim")]
        Command::Sim { command } => sim::run(command).await,
        #[cfg(feature = "sim")]
        Command::Bench(args) => bench::run(args).await,
        Command::Controller(args) => controller::run(*args).await,
        #[cfg(feature = "sim")]
        Command::Demo(args) => demo::run(args).await,
        Command::Plan(args) => plan::run(args).await,
        Command::Crds(args) => {
            match args.only {
                Some(CrdKind::Plan) => print!("{}", snapdrain::api::crd_yaml()),
                Some(CrdKind::Policy) => print!("{}", snapdrain::api::policy_crd_yaml()),
                None => print!(
                    "{}---\n{}",
                    snapdrain::api::crd_yaml(),
                    snapdrain::api::policy_crd_yaml()
                ),
            }
            Ok(())
        }
        Command::Drain(_)
        | Command::Status(_)
        | Command::Abort(_)
        | Command::Holds { .. }
        | Command::Report(_)
        | Command::Completion(_)
        | Command::Man => Ok(()),
    }
}
