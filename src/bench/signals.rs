//! How soon a disruption signal becomes a Velero Backup: a Karpenter NodeClaim deleted (expiry, a
//! person, a spot interruption Karpenter acts on) on a node with a protected pod, timed from the delete
//! call to the plan and to the Backup appearing in the simulator's store (in process, so the watch adds
//! no delay of its own). One node at a time, twenty in a run.

use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use kube::api::DeleteParams;
use serde_json::Value;
use tokio::sync::broadcast;

use super::report::Report;
use super::scenarios;
use super::sim::{on_node, owned_by, start_cluster, start_controller, wait_store};
use super::stats::Summary;
use snapdrain_sim::apiserver::resources::ResKey;
use snapdrain_sim::apiserver::store::{EventType, Store, WatchEvent, meta_str};
use snapdrain_sim::world::Timings;

const SECTION: &str = "signals";
const WAIT: Duration = Duration::from_secs(30);

fn plans() -> ResKey {
    ResKey::new("snapdrain.io", "disruptionplans")
}

fn backups() -> ResKey {
    ResKey::new("velero.io", "backups")
}

/// The first object added to `rx`'s kind for which `wanted` holds, and when it was seen.
async fn first_added(
    rx: &mut broadcast::Receiver<std::sync::Arc<WatchEvent>>,
    what: &str,
    wanted: impl Fn(&Value) -> bool,
) -> anyhow::Result<(Instant, Value)> {
    let wait = async {
        loop {
            match rx.recv().await {
                Ok(ev) if ev.type_ == EventType::Added && wanted(&ev.object) => {
                    return Ok((Instant::now(), (*ev.object).clone()));
                }
                Ok(_) => {}
                Err(e) => bail!("lost the {what} feed: {e}"),
            }
        }
    };
    tokio::time::timeout(WAIT, wait)
        .await
        .map_err(|_| anyhow!("{what}: none within {WAIT:?}"))?
}

/// Nodes that run a protected (StatefulSet) pod, by the scenario's own shape, with their NodeClaims.
fn signal_targets(store: &Store) -> Vec<(String, String)> {
    let pods = store.snapshot(&ResKey::core("pods")).0;
    store
        .snapshot(&ResKey::new("karpenter.sh", "nodeclaims"))
        .0
        .iter()
        .filter_map(|c| {
            let node = c.pointer("/status/nodeName")?.as_str()?;
            let claim = meta_str(c, "name")?;
            pods.iter()
                .any(|p| on_node(p, node) && owned_by(p, "StatefulSet"))
                .then(|| (node.to_owned(), claim.to_owned()))
        })
        .collect()
}

pub async fn latency(report: &mut Report) -> anyhow::Result<()> {
    let timings = Timings {
        backup_overhead: Duration::from_millis(200),
        ..Timings::instant()
    };
    let b = start_cluster(scenarios::SIGNALS, "bench-signals", timings).await?;
    let store = &b.cluster.store;
    wait_store(
        store,
        &ResKey::new("apps", "statefulsets"),
        "the StatefulSet ready",
        WAIT,
        |sets| {
            !sets.is_empty()
                && sets
                    .iter()
                    .all(|s| s.pointer("/status/readyReplicas") == s.pointer("/spec/replicas"))
        },
    )
    .await?;
    let controller = start_controller(&b).await?;
    // The holds are the controller's policy at work: once every protected pod carries one, the
    // signal watcher reads the policy too.
    wait_store(
        store,
        &ResKey::core("pods"),
        "every StatefulSet pod held",
        WAIT,
        |pods| {
            pods.iter().filter(|p| owned_by(p, "StatefulSet")).all(|p| {
                p.pointer("/metadata/annotations/karpenter.sh~1do-not-disrupt")
                    == Some(&Value::from("true"))
            })
        },
    )
    .await?;
    let result = async {
        let targets = signal_targets(store);
        if targets.is_empty() {
            bail!("no NodeClaim's node runs a StatefulSet pod");
        }
        let claims = snapdrain_testkit::karpenter::nodeclaims(&b.client);
        let (mut to_plan, mut to_backup) = (Vec::new(), Vec::new());
        for (node, claim) in &targets {
            let (_, mut plan_rx) = store.subscribe(&plans());
            let (_, mut backup_rx) = store.subscribe(&backups());
            let signalled = Instant::now();
            claims
                .delete(claim, &DeleteParams::default())
                .await
                .with_context(|| format!("deleting NodeClaim {claim}"))?;
            let (planned, plan) = first_added(&mut plan_rx, "a plan for the node", |p| {
                p.pointer("/spec/nodes")
                    .and_then(Value::as_array)
                    .is_some_and(|ns| ns.iter().any(|n| n == node.as_str()))
            })
            .await?;
            let plan = meta_str(&plan, "name").unwrap_or_default().to_owned();
            let (backed, _) = first_added(&mut backup_rx, "the plan's Backup", |bk| {
                bk.pointer("/metadata/labels/snapdrain.io~1plan")
                    .and_then(Value::as_str)
                    == Some(plan.as_str())
            })
            .await?;
            to_plan.push(planned.saturating_duration_since(signalled));
            to_backup.push(backed.saturating_duration_since(signalled));
        }
        anyhow::Ok((to_plan, to_backup))
    }
    .await;
    controller.shutdown().await;
    let (to_plan, to_backup) = result?;
    let note = format!(
        "{} NodeClaims deleted one after another, each node running one protected pod; timed from the delete call to the object in the simulator's store",
        to_backup.len()
    );
    if let Some(s) = Summary::of(&to_plan) {
        report.add_summary_ms(
            SECTION,
            "NodeClaim deleted -> DisruptionPlan created",
            &s,
            None,
            Some(&note),
        );
    }
    if let Some(s) = Summary::of(&to_backup) {
        report.add_summary_ms(
            SECTION,
            "NodeClaim deleted -> Velero Backup created",
            &s,
            Some(("p99", "< 100 ms")),
            None,
        );
    }
    Ok(())
}
