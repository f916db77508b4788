//! `snapdrain bench`: measures the DESIGN performance targets on this machine and prints the figures.

use clap::{Args, ValueEnum};

use crate::bench::{self, Only};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Which measurements: the simulated API server at scale-5k, the controller's overhead, drain speed
    /// and a plan against its physical limit, the eviction gate, planning cost, a 20-node drift rollout, the controller process at scale-5k, or all of them.
    #[arg(long, value_enum, default_value_t = Section::All)]
    pub only: Section,
    /// Pod status updates written for the watch fan-out measurement.
    #[arg(long, default_value_t = 5000)]
    pub pods: usize,
    /// Repetitions of each timed measurement (lists, plans, drains); figures report p50/p99/max.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Concurrent pod watchers for the watch fan-out measurement.
    #[arg(long, default_value_t = 20)]
    pub watchers: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Section {
    Api,
    Controller,
    /// The eviction gate alone (also part of `controller`).
    Gate,
    Planning,
    Rollout,
    Scale,
    All,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let only = match args.only {
        Section::Api => Only::Api,
        Section::Controller => Only::Controller,
        Section::Gate => Only::Gate,
        Section::Planning => Only::Planning,
        Section::Rollout => Only::Rollout,
        Section::Scale => Only::Scale,
        Section::All => Only::All,
    };
    let report = bench::run(&bench::Options {
        only,
        runs: args.runs,
        pods: args.pods,
        watchers: args.watchers,
    })
    .await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_table());
    }
    Ok(())
}
