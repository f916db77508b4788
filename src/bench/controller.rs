//! Controller overhead (DESIGN "Orchestration overhead") and drain speed against `kubectl drain`, each
//! run on a fresh simulated cluster with instant world timings, the controller talking to it over HTTP
//! as in production.

use std::time::Instant;

use anyhow::bail;

use super::report::Report;
use super::scenarios;
use super::sim::{
    PodsGone, audit_gap, is_api, is_backup_phase, on_node, run_plan, start_cluster,
    start_controller,
};
use super::stats::Summary;
use snapdrain_sim::apiserver::audit::AuditEntry;
use snapdrain_sim::apiserver::resources::ResKey;
use snapdrain_sim::world::Timings;

const SECTION: &str = "controller";

pub async fn overhead(runs: usize, report: &mut Report) -> anyhow::Result<()> {
    let (mut total, mut to_backup, mut to_evict) = (Vec::new(), Vec::new(), Vec::new());
    let mut pods_on_node = 0;
    for run in 0..runs {
        let b = start_cluster(scenarios::OVERHEAD, "bench-overhead", Timings::instant()).await?;
        pods_on_node = b
            .cluster
            .store
            .snapshot(&ResKey::core("pods"))
            .0
            .iter()
            .filter(|p| on_node(p, &b.node))
            .count();
        let controller = start_controller(&b).await?;
        let result = run_plan(&b, &format!("bench-{run}")).await;
        controller.shutdown().await;
        let (created, done) = result?;
        total.push(done - created);
        let audit = b.cluster.audit.since(0);
        let plan_created =
            |e: &AuditEntry| is_api(e, "create", "disruptionplans.snapdrain.io", 201);
        to_backup.extend(audit_gap(&audit, plan_created, |e| {
            is_api(e, "create", "backups.velero.io", 201)
        }));
        to_evict.extend(audit_gap(
            &audit,
            |e| is_backup_phase(e, "Completed"),
            |e| is_api(e, "create", "pods/eviction", 201),
        ));
    }
    let note = format!("fresh cluster per run; node with {pods_on_node} pods (3 StatefulSet)");
    if let Some(s) = Summary::of(&total) {
        report.add_summary_ms(
            SECTION,
            "plan creation -> Completed (one node, instant world)",
            &s,
            Some(("max", "< 2 s")),
            Some(&note),
        );
    }
    let audit_note = "from the audit log (ms timestamps)";
    match Summary::of(&to_backup) {
        Some(s) => report.add_summary_ms(
            SECTION,
            "plan created -> Velero Backup created",
            &s,
            Some(("p99", "< 100 ms")),
            Some(audit_note),
        ),
        None => report.skipped(
            SECTION,
            "plan created -> Velero Backup created",
            "no Backup create in the audit log",
        ),
    }
    match Summary::of(&to_evict) {
        Some(s) => report.add_summary_ms(
            SECTION,
            "Backup Completed -> first eviction accepted",
            &s,
            Some(("p99", "< 200 ms")),
            Some(audit_note),
        ),
        None => report.skipped(
            SECTION,
            "Backup Completed -> first eviction accepted",
            "no Completed backup or eviction in the audit log",
        ),
    }
    Ok(())
}

pub async fn drain_speed(runs: usize, report: &mut Report) -> anyhow::Result<()> {
    let (mut snap_drained, mut snap_done) = (Vec::new(), Vec::new());
    let mut evicted = 0;
    for run in 0..runs {
        let b = start_cluster(scenarios::DRAIN_110, "bench-drain-110", Timings::instant()).await?;
        let controller = start_controller(&b).await?;
        let gone = tokio::spawn(PodsGone::subscribe(&b.cluster.store, &b.node).wait());
        let result = run_plan(&b, &format!("drain-{run}")).await;
        controller.shutdown().await;
        let (created, done) = result?;
        let (drained, count) = gone.await??;
        evicted = count;
        snap_drained.push(drained.saturating_duration_since(created));
        snap_done.push(done - created);
    }
    let note = format!("110-pod node, {evicted} non-DaemonSet pods; fresh cluster per run");
    if let Some(s) = Summary::of(&snap_drained) {
        report.add_summary_ms(
            SECTION,
            "drain 110-pod node, snapdrain: plan created -> pods gone",
            &s,
            None,
            Some(&note),
        );
    }
    if let Some(s) = Summary::of(&snap_done) {
        report.add_summary_ms(
            SECTION,
            "drain 110-pod node, snapdrain: plan created -> Completed",
            &s,
            None,
            Some("includes terminating the instance and deleting the node"),
        );
    }
    kubectl_drain(runs, report).await
}

async fn kubectl_drain(runs: usize, report: &mut Report) -> anyhow::Result<()> {
    let name = "drain 110-pod node, kubectl drain";
    let available = tokio::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .await
        .is_ok_and(|o| o.status.success());
    if !available {
        report.skipped(SECTION, name, "skipped: kubectl is not on PATH");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let (mut drained, mut exited) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let b = start_cluster(scenarios::DRAIN_110, "bench-drain-110", Timings::instant()).await?;
        let kubeconfig = b.cluster.write_kubeconfig(&dir.path().join("kubeconfig"))?;
        let gone = tokio::spawn(PodsGone::subscribe(&b.cluster.store, &b.node).wait());
        let started = Instant::now();
        let out = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args([
                "drain",
                &b.node,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--force",
            ])
            .args(["--timeout", "120s"])
            .output()
            .await?;
        let exit = started.elapsed();
        if !out.status.success() {
            gone.abort();
            bail!(
                "kubectl drain failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let (t, _) = gone.await??;
        drained.push(t.saturating_duration_since(started));
        exited.push(exit);
    }
    if let Some(s) = Summary::of(&drained) {
        report.add_summary_ms(
            SECTION,
            &format!("{name}: started -> pods gone"),
            &s,
            None,
            Some("--ignore-daemonsets --delete-emptydir-data --force; includes kubectl start-up and discovery"),
        );
    }
    if let Some(s) = Summary::of(&exited) {
        report.add_summary_ms(
            SECTION,
            &format!("{name}: process wall time"),
            &s,
            None,
            None,
        );
    }
    Ok(())
}
