//! `snapdrain bench --only chaos`: one chaos run per seed (the suite of `tests/e2e/chaos.rs`, shaped by
//! `--seed` and `--plans`), its figures as bench figures: plans run, terminal %, safety violations,
//! duplicate backups and instances, holds lost or orphaned, controller kills, the eviction gate's
//! calls by how they ended (allowed, denied, failed and so refused under `failurePolicy: Fail`) and the
//! faults the simulator injected, by kind. The judge is the suite's (`snapdrain_testkit::chaos::judge`), which
//! reads the simulator's evidence, never the controller's word.

use snapdrain_testkit::chaos::{self, RunReport};

use super::Report;

const SECTION: &str = "chaos";

/// Runs the schedule of each seed with `plans` plans, one after another.
pub async fn run(seeds: &[u64], plans: Option<usize>, report: &mut Report) {
    for &seed in seeds {
        let base = chaos::Options::short(seed);
        let opts = chaos::Options {
            plans: plans.unwrap_or(base.plans),
            // One replica is this binary run as `snapdrain controller`, SIGKILLed when it leads.
            bin: std::env::current_exe().ok(),
            ..base
        };
        let run = chaos::run(&opts).await;
        figures(&run, report);
    }
}

/// The figures of one run, each named with its seed.
pub fn figures(run: &RunReport, report: &mut Report) {
    let v = &run.verdict;
    let seed = run.seed;
    let outcome = run.outcomes.join("; ");
    report
        .add(
            SECTION,
            format!("seed {seed}: plans run"),
            v.plans as f64,
            "plans",
        )
        .note = Some(format!(
        "{} scheduled, {} completed{}; {outcome}",
        run.scheduled,
        v.completed,
        if run.skipped.is_empty() {
            String::new()
        } else {
            format!(", skipped: {}", run.skipped.join("; "))
        }
    ));
    report
        .add(
            SECTION,
            format!("seed {seed}: terminal plans"),
            v.terminal_percent(),
            "%",
        )
        .target = Some("100".into());
    let listed = |items: &[String]| (!items.is_empty()).then(|| items.join("; "));
    let violations = report.add(
        SECTION,
        format!("seed {seed}: safety violations"),
        v.violations.len() as f64,
        "count",
    );
    violations.target = Some("0".into());
    violations.note = listed(&v.violations);
    report
        .add(
            SECTION,
            format!("seed {seed}: of which protected pods lost with their node"),
            v.lost_with_node as f64,
            "count",
        )
        .target = Some("0".into());
    report
        .add(
            SECTION,
            format!("seed {seed}: protected pods let go (a forceful signal's plan failed)"),
            v.let_go.len() as f64,
            "count",
        )
        .note = listed(&v.let_go);
    let duplicates: Vec<String> = v
        .duplicate_backups
        .iter()
        .chain(&v.duplicate_instances)
        .cloned()
        .collect();
    let dup = report.add(
        SECTION,
        format!("seed {seed}: duplicate backups + instances"),
        duplicates.len() as f64,
        "count",
    );
    dup.target = Some("0".into());
    dup.note = listed(&duplicates);
    let holds: Vec<String> = v
        .holds_lost
        .iter()
        .map(|h| format!("lost {h}"))
        .chain(v.holds_orphaned.iter().map(|h| format!("orphaned {h}")))
        .collect();
    let held = report.add(
        SECTION,
        format!("seed {seed}: holds lost + orphaned"),
        holds.len() as f64,
        "count",
    );
    held.target = Some("0".into());
    held.note = listed(&holds);
    report
        .add(
            SECTION,
            format!("seed {seed}: controller kills"),
            run.kills as f64,
            "count",
        )
        .note = Some(format!(
        "{} of them a `snapdrain controller` process's SIGKILL",
        run.process_kills
    ));
    report
        .add(
            SECTION,
            format!("seed {seed}: evictions admitted where the gate applies"),
            run.evictions_admitted as f64,
            "count",
        )
        .note = Some(if run.gated() {
        "no more than the gate allowed, none through a failed call".into()
    } else {
        "MORE than the gate allowed, or one through a failed call".into()
    });
    // From the simulator's record of each webhook call, never the gate's own word.
    for (outcome, n) in &run.gate {
        report.add(
            SECTION,
            format!("seed {seed}: gate calls {outcome} (failurePolicy Fail)"),
            *n as f64,
            "count",
        );
    }
    for (kind, n) in &run.faults {
        report
            .add(
                SECTION,
                format!("seed {seed}: faults injected ({kind})"),
                *n as f64,
                "count",
            )
            .note = run
            .scheduled_faults
            .get(kind)
            .map(|s| format!("{s} scheduled"));
    }
    report.add(
        SECTION,
        format!("seed {seed}: run time"),
        run.elapsed.as_secs_f64(),
        "s",
    );
    if !run.stuck.is_empty() {
        report.skipped(
            SECTION,
            format!("seed {seed}: stuck plans"),
            run.stuck.join("; "),
        );
    }
}
