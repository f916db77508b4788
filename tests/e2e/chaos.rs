//! The chaos suite's short form (issue 23): plans of every mode (Execute with and without a
//! replacement, a manual make-before-break drain, Release plans from a Karpenter drift and a NodeClaim
//! deletion) while faults come from outside the controller: API errors and latency, dropped watches
//! and 410s on resume, S3 errors, latency and outages, EC2 throttling and capacity shortages, Velero
//! server and node-agent restarts, the eviction gate slow or down under `failurePolicy: Fail`, replicas
//! killed at random moments (one of them a `snapdrain controller` process, SIGKILLed), and a leader
//! losing its Lease; plans from Cluster Autoscaler's scale-down too, its drain held at the gate.
//! Fixed seeds; each run must show 0 safety violations, 100% terminal plans, 0 duplicates and holds
//! where they belong (snapdrain_testkit::chaos). The long form is `chaos_long` (README, "Chaos").

use snapdrain_testkit::chaos::{Options, run};

async fn short(seed: u64) {
    snapdrain_testkit::capture_logs();
    let report = run(&options(seed)).await;
    // Shown with --nocapture (and on failure): the figures of the run.
    println!("{report}");
    assert!(report.clean(), "{report}");
    assert!(
        report.gated(),
        "an eviction got past the gate (or it never allowed one): {report}"
    );
    assert!(
        report.verdict.plans >= 3,
        "too few plans ran to judge: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_seed_11() {
    short(11).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_seed_23() {
    short(23).await;
}

/// The long form: `SNAPDRAIN_CHAOS_SEEDS` (a list `1,2,3` or a range `1..=20`, default 1..=10) and
/// `SNAPDRAIN_CHAOS_PLANS` (per seed, default 8). Prints one report per seed, fails if any is unclean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the long chaos form takes minutes: run it by name (README, \"Chaos\")"]
async fn chaos_long() {
    snapdrain_testkit::capture_logs();
    let seeds = seeds(&std::env::var("SNAPDRAIN_CHAOS_SEEDS").unwrap_or_else(|_| "1..=10".into()));
    let plans: usize = std::env::var("SNAPDRAIN_CHAOS_PLANS")
        .ok()
        .map(|p| p.parse().expect("SNAPDRAIN_CHAOS_PLANS is a number"))
        .unwrap_or(8);
    let mut unclean = Vec::new();
    for seed in seeds {
        let report = run(&Options {
            plans,
            ..options(seed)
        })
        .await;
        println!("{report}");
        if !report.clean() || !report.gated() {
            unclean.push(report.to_string());
        }
    }
    assert!(unclean.is_empty(), "unclean runs:\n{}", unclean.join("\n"));
}

/// The short form's options, one of the two replicas a `snapdrain controller` process (SIGKILLed when it
/// leads at a kill's moment).
fn options(seed: u64) -> Options {
    Options {
        bin: Some(env!("CARGO_BIN_EXE_snapdrain").into()),
        ..Options::short(seed)
    }
}

/// `1,2,3` or `1..=20` or `1..20`.
fn seeds(spec: &str) -> Vec<u64> {
    let num = |s: &str| -> u64 {
        s.trim()
            .parse()
            .unwrap_or_else(|_| panic!("SNAPDRAIN_CHAOS_SEEDS: {s:?} is not a seed"))
    };
    if let Some((a, b)) = spec.split_once("..=") {
        (num(a)..=num(b)).collect()
    } else if let Some((a, b)) = spec.split_once("..") {
        (num(a)..num(b)).collect()
    } else {
        spec.split(',').map(num).collect()
    }
}
