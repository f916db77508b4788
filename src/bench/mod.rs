//! `snapdrain bench`: measurements against the DESIGN performance targets, on this machine. It reports
//! figures and never passes or fails; a section that cannot run says why in the report and the others
//! still run.
//!
//! - [`api`]: the simulated API server at `scale-5k` (load, lists, watch fan-out, memory).
//! - [`controller`]: orchestration overhead of one plan, and drain speed against `kubectl drain`.
//! - [`planning`]: `plan_node` on one node of the 150,000-pod inventory.
//! - [`gate`]: what the eviction gate adds to each eviction, also with 1,000 finished plans stored
//!   (`--only gate`, and with the controller section).
//! - [`holds`]: how soon a new protected pod is held (run with the controller section).
//! - [`limit`]: one plan against its physical limit (run with the controller section).
//! - [`signals`]: a NodeClaim deleted -> its plan and Velero Backup (run with the controller section).
//! - [`rollout`]: a 20-node Karpenter drift rollout, alone and guarded by snapdrain.
//! - [`scale`]: the controller process at `scale-5k`: cache sync, memory, a plan's drain.
//! - [`chaos`]: the chaos suite's runs for the seeds asked, judged (`--only chaos` alone).
//! - [`soak`]: weeks of plan churn compressed: the controller's memory, API traffic and gate latency
//!   through thousands of plans, judged (`--only soak` alone).

pub mod api;
pub mod chaos;
pub mod controller;
pub mod gate;
pub mod holds;
pub mod limit;
pub mod planning;
pub mod report;
pub mod rollout;
pub mod scale;
pub mod scenarios;
pub mod signals;
pub mod sim;
pub mod soak;
pub mod stats;
pub mod volumes;

pub use report::{Figure, Report};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Only {
    Api,
    /// Only when asked for: its runs take minutes and are judged, not timed.
    Chaos,
    Controller,
    Gate,
    Planning,
    Rollout,
    Scale,
    Signals,
    /// Only when asked for: thousands of plans take minutes.
    Soak,
    Volumes,
    All,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub only: Only,
    pub runs: usize,
    /// Pod updates in the watch fan-out.
    pub pods: usize,
    pub watchers: usize,
    /// Chaos runs: one per seed.
    pub seeds: Vec<u64>,
    /// Plans per chaos run (default: the short form's, one per mode), or the soak's disruptions.
    pub plans: Option<usize>,
    /// The soak's scenario.
    pub scenario: String,
}

pub async fn run(opts: &Options) -> Report {
    let mut report = Report::new();
    let runs = opts.runs.max(1);
    let wants = |s: Only| opts.only == Only::All || opts.only == s;
    let mut scale_store = None;
    if wants(Only::Api) {
        let api_opts = api::ApiOptions {
            runs,
            updates: opts.pods,
            watchers: opts.watchers,
        };
        match api::run(&api_opts, &mut report).await {
            Ok(store) => scale_store = Some(store),
            Err(e) => report.skipped("api", "api section", format!("failed: {e:#}")),
        }
    }
    if wants(Only::Planning) {
        let store = match scale_store {
            Some(s) => Ok(s),
            None => api::load_scale_store(),
        };
        if let Err(e) = store.and_then(|s| planning::run(&s, &mut report)) {
            report.skipped("planning", "plan_node", format!("failed: {e:#}"));
        }
    }
    // The 150,000-pod store is freed before the controller runs start their small clusters.
    if wants(Only::Controller) {
        if let Err(e) = controller::overhead(runs, &mut report).await {
            report.skipped(
                "controller",
                "orchestration overhead",
                format!("failed: {e:#}"),
            );
        }
        if let Err(e) = controller::drain_speed(runs, &mut report).await {
            report.skipped("controller", "drain speed", format!("failed: {e:#}"));
        }
        if let Err(e) = limit::physical_limit(runs.min(3), &mut report).await {
            report.skipped("controller", "physical limit", format!("failed: {e:#}"));
        }
        if let Err(e) = holds::latency(runs, &mut report).await {
            report.skipped("holds", "hold latency", format!("failed: {e:#}"));
        }
    }
    if (wants(Only::Controller) || opts.only == Only::Signals)
        && let Err(e) = signals::latency(&mut report).await
    {
        report.skipped("signals", "signal to Backup", format!("failed: {e:#}"));
    }
    if (wants(Only::Controller) || opts.only == Only::Gate)
        && let Err(e) = gate::latency(runs, &mut report).await
    {
        report.skipped("gate", "eviction gate latency", format!("failed: {e:#}"));
    }
    if (wants(Only::Controller) || opts.only == Only::Gate)
        && let Err(e) = gate::rate(&mut report).await
    {
        report.skipped("gate", "eviction gate at 1,000/s", format!("failed: {e:#}"));
    }
    if wants(Only::Scale)
        && let Err(e) = scale::controller(&mut report).await
    {
        report.skipped("scale", "controller at scale-5k", format!("failed: {e:#}"));
    }
    if wants(Only::Rollout)
        && let Err(e) = rollout::drift(&mut report).await
    {
        report.skipped("rollout", "drift rollout", format!("failed: {e:#}"));
    }
    if wants(Only::Volumes) {
        volumes::run(&mut report).await;
    }
    if opts.only == Only::Chaos {
        chaos::run(&opts.seeds, opts.plans, &mut report).await;
    }
    if opts.only == Only::Soak {
        let soak_opts = soak::Options {
            plans: opts.plans.unwrap_or(soak::DEFAULT_PLANS),
            seed: opts.seeds.first().copied().unwrap_or(1),
            scenario: opts.scenario.clone(),
        };
        if let Err(e) = soak::run(&soak_opts, &mut report).await {
            report.skipped("soak", "plan churn", format!("failed: {e:#}"));
        }
    }
    report
}
