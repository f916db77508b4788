//! `snapdrain bench`: measures the DESIGN performance targets on this machine and prints the figures.

use clap::{Args, ValueEnum};

use crate::bench::{self, Only};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Which measurements: the simulated API server at scale-5k, the controller's overhead, drain speed
    /// and a plan against its physical limit, the eviction gate, planning cost, drift rollouts of 20 and 200 nodes, signal to backup latency, the controller process at scale-5k, the fastest safe backup per volume kind, or all of them.
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
    /// Chaos runs (`--only chaos`): the seeds, a list `1,2,3` or a range `1..=20`.
    #[arg(long, default_value = "11")]
    pub seed: String,
    /// Plans per chaos run (`--only chaos`; default one per mode), or disruptions in the soak
    /// (`--only soak`; default 2,000).
    #[arg(long)]
    pub plans: Option<usize>,
    /// The soak's cluster (`--only soak`): a built-in scenario or a scenario file (`quickstart` is grown
    /// to twelve nodes).
    #[arg(long, default_value = "quickstart")]
    pub scenario: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Section {
    Api,
    /// Chaos runs (only when asked for): plans under injected faults, judged by the safety oracle.
    Chaos,
    Controller,
    /// The eviction gate alone (also part of `controller`).
    Gate,
    Planning,
    Rollout,
    Scale,
    /// A NodeClaim deleted -> its plan and Velero Backup (also part of `controller`).
    Signals,
    /// Weeks of plan churn compressed (only when asked for): memory, API traffic, gate latency, judged.
    Soak,
    /// The fastest safe backup per volume kind: 500 GiB on EBS released at the CSI snapshot, 500 GiB on
    /// local NVMe against its limit, a node with both, a spot interruption with 500 GiB on EBS.
    Volumes,
    All,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let only = match args.only {
        Section::Api => Only::Api,
        Section::Chaos => Only::Chaos,
        Section::Controller => Only::Controller,
        Section::Gate => Only::Gate,
        Section::Planning => Only::Planning,
        Section::Rollout => Only::Rollout,
        Section::Scale => Only::Scale,
        Section::Signals => Only::Signals,
        Section::Soak => Only::Soak,
        Section::Volumes => Only::Volumes,
        Section::All => Only::All,
    };
    let report = bench::run(&bench::Options {
        only,
        runs: args.runs,
        pods: args.pods,
        watchers: args.watchers,
        seeds: seeds(&args.seed)?,
        plans: args.plans,
        scenario: args.scenario,
    })
    .await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_table());
    }
    Ok(())
}

/// `1,2,3`, `1..=20` or `1..20`.
fn seeds(spec: &str) -> anyhow::Result<Vec<u64>> {
    let num = |s: &str| -> anyhow::Result<u64> {
        s.trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("--seed: {s:?} is not a seed (write 7, 1,2,3 or 1..=20)"))
    };
    Ok(if let Some((a, b)) = spec.split_once("..=") {
        (num(a)?..=num(b)?).collect()
    } else if let Some((a, b)) = spec.split_once("..") {
        (num(a)?..num(b)?).collect()
    } else {
        spec.split(',').map(num).collect::<anyhow::Result<_>>()?
    })
}

#[cfg(test)]
mod tests {
    use super::seeds;

    #[test]
    fn seeds_are_a_list_or_a_range() {
        assert_eq!(seeds("7").unwrap(), [7]);
        assert_eq!(seeds("1,3").unwrap(), [1, 3]);
        assert_eq!(seeds("2..=4").unwrap(), [2, 3, 4]);
        assert_eq!(seeds("2..4").unwrap(), [2, 3]);
        assert!(seeds("x").is_err());
    }
}
