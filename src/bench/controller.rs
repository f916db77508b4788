//! Controller overhead (DESIGN "Orchestration overhead") and drain speed against `kubectl drain`, each
//! run on a fresh simulated cluster with instant world timings, the controller talking to it over HTTP
//! as in production.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::{Client, CustomResourceExt};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::report::Report;
use super::scenarios;
use super::stats::Summary;
use snapdrain::api::DisruptionPlan;
use snapdrain::controller::ControllerHandle;
use snapdrain::controller::run::RunOptions;
use snapdrain_sim::apiserver::audit::AuditEntry;
use snapdrain_sim::apiserver::resources::ResKey;
use snapdrain_sim::apiserver::store::{EventType, Store, WatchEvent, meta_str};
use snapdrain_sim::world::Timings;
use snapdrain_sim::{ScenarioSource, SimCluster, SimConfig};

const SECTION: &str = "controller";
const PLAN_TIMEOUT: Duration = Duration::from_secs(120);
/// Time for a freshly started controller to list and watch before a plan is created, so that the
/// measured latency is the controller's reaction, not its start-up.
const CONTROLLER_SETTLE: Duration = Duration::from_millis(500);

struct Bench {
    cluster: SimCluster,
    client: Client,
    node: String,
}

async fn start_cluster(yaml: &str, label: &str) -> anyhow::Result<Bench> {
    let scenario = snapdrain_sim::scenario::parse(yaml, label)?;
    let cluster = SimCluster::start(SimConfig {
        scenario: Some(ScenarioSource::Inline {
            scenario: Box::new(scenario),
            label: label.into(),
        }),
        timings: Some(Timings::instant()),
        ..Default::default()
    })
    .await?;
    let client = Client::try_from(cluster.kube_config())?;
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &DisruptionPlan::crd())
        .await
        .context("installing the DisruptionPlan CRD")?;
    let node = cluster
        .scenario
        .as_ref()
        .and_then(|s| s.instances.first())
        .map(|i| i.node_name.clone())
        .ok_or_else(|| anyhow!("the {label} scenario has no node"))?;
    Ok(Bench {
        cluster,
        client,
        node,
    })
}

/// A single controller replica (no leader election) with the simulator's EC2 endpoint, as the e2e tests
/// run it.
async fn start_controller(b: &Bench) -> anyhow::Result<ControllerHandle> {
    let settings = snapdrain_testkit::controller_settings(&b.cluster, "snapdrain-bench")
        .ok_or_else(|| anyhow!("the simulated world runs no EC2 endpoint"))?;
    let opts = RunOptions {
        lease_namespace: None,
        ..RunOptions::default()
    };
    let handle = snapdrain::controller::start(b.cluster.kube_config(), settings, opts).await?;
    tokio::time::sleep(CONTROLLER_SETTLE).await;
    Ok(handle)
}

/// Waits, in process, until every pod that was on the node (DaemonSet pods aside) is gone.
struct PodsGone {
    rx: broadcast::Receiver<Arc<WatchEvent>>,
    left: HashSet<(String, String)>,
}

impl PodsGone {
    fn subscribe(store: &Store, node: &str) -> Self {
        let (pods, rx) = store.subscribe(&ResKey::core("pods"));
        let left = pods
            .iter()
            .filter(|p| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node))
            .filter(|p| !owned_by(p, "DaemonSet"))
            .map(|p| key_of(p))
            .collect();
        Self { rx, left }
    }

    async fn wait(mut self) -> anyhow::Result<(Instant, usize)> {
        let count = self.left.len();
        while !self.left.is_empty() {
            match self.rx.recv().await {
                Ok(ev) if ev.type_ == EventType::Deleted => {
                    self.left.remove(&key_of(&ev.object));
                }
                Ok(_) => {}
                Err(e) => bail!("lost the pod feed: {e}"),
            }
        }
        Ok((Instant::now(), count))
    }
}

fn key_of(obj: &Value) -> (String, String) {
    (
        meta_str(obj, "namespace").unwrap_or("").to_string(),
        meta_str(obj, "name").unwrap_or("").to_string(),
    )
}

fn owned_by(obj: &Value, kind: &str) -> bool {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|o| o.iter().any(|r| r["kind"] == kind))
}

/// Creates a plan for the bench node and waits, in process, for a terminal phase.
async fn run_plan(b: &Bench, name: &str) -> anyhow::Result<(Instant, Instant)> {
    let (_, mut plans) = b
        .cluster
        .store
        .subscribe(&ResKey::new("snapdrain.io", "disruptionplans"));
    let plan: DisruptionPlan = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
        "metadata": {"name": name}, "spec": {"nodes": [b.node]}
    }))?;
    let created = Instant::now();
    Api::<DisruptionPlan>::all(b.client.clone())
        .create(&PostParams::default(), &plan)
        .await
        .context("creating the plan")?;
    let wait = async {
        loop {
            let ev = plans.recv().await.context("lost the plan feed")?;
            let phase = ev
                .object
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("");
            match phase {
                "Completed" => return Ok(Instant::now()),
                "Failed" | "Aborted" => bail!(
                    "plan {name} ended {phase}: {}",
                    ev.object
                        .pointer("/status/message")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                ),
                _ => {}
            }
        }
    };
    let done = tokio::time::timeout(PLAN_TIMEOUT, wait)
        .await
        .map_err(|_| anyhow!("plan {name} did not finish within {PLAN_TIMEOUT:?}"))??;
    Ok((created, done))
}

/// Milliseconds between the first audit entry matching `from` and the first after it matching `to`.
fn audit_gap(
    entries: &[AuditEntry],
    from: impl Fn(&AuditEntry) -> bool,
    to: impl Fn(&AuditEntry) -> bool,
) -> Option<Duration> {
    let start = entries.iter().position(from)?;
    let end = entries[start..].iter().find(|e| to(e))?;
    let t0: jiff::Timestamp = entries[start].time.parse().ok()?;
    let t1: jiff::Timestamp = end.time.parse().ok()?;
    Duration::try_from(t1.duration_since(t0)).ok()
}

fn is_api(e: &AuditEntry, verb: &str, resource: &str, code: u16) -> bool {
    e.source == "api" && e.verb == verb && e.resource == resource && e.code == Some(code)
}

pub async fn overhead(runs: usize, report: &mut Report) -> anyhow::Result<()> {
    let (mut total, mut to_backup, mut to_evict) = (Vec::new(), Vec::new(), Vec::new());
    let mut pods_on_node = 0;
    for run in 0..runs {
        let b = start_cluster(scenarios::OVERHEAD, "bench-overhead").await?;
        pods_on_node = b
            .cluster
            .store
            .snapshot(&ResKey::core("pods"))
            .0
            .iter()
            .filter(|p| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(&b.node))
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
            |e| {
                e.source == "world"
                    && e.resource == "backups.velero.io"
                    && e.detail["phase"] == "Completed"
            },
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
        let b = start_cluster(scenarios::DRAIN_110, "bench-drain-110").await?;
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
        let b = start_cluster(scenarios::DRAIN_110, "bench-drain-110").await?;
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
