//! `snapdrain demo --rollout`: a Karpenter drift rollout of the `drift-rollout` scenario's 20 nodes,
//! guarded by snapdrain. snapdrain holds every protected pod; once all NodeClaims are Drifted (a new AMI),
//! each node with protected pods gets a Release plan that backs up and verifies before it lets Karpenter
//! take the node. The end-of-run check is the same safety oracle as the single-plan demo's, over every
//! plan.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use snapdrain::api::DisruptionPlan;
use snapdrain::api::status::PlanPhase;
use snapdrain_sim::ScenarioSource;
use snapdrain_testkit::safety;

use super::printer::Printer;
use super::setup;

pub const SCENARIO: &str = "drift-rollout";

fn held(pods: &[Pod], protected: &BTreeMap<String, BTreeSet<String>>) -> usize {
    pods.iter()
        .filter(|p| {
            protected.contains_key(&format!(
                "{}/{}",
                p.namespace().unwrap_or_default(),
                p.name_any()
            )) && p
                .annotations()
                .get("karpenter.sh/do-not-disrupt")
                .map(String::as_str)
                == Some("true")
        })
        .count()
}

/// Runs the rollout demo; `Ok(None)` when every drifted node was replaced and the check passed, else
/// why not.
pub async fn run(
    timeout: Duration,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<Option<String>> {
    let mut p = Printer::new(out, false);
    let started = Instant::now();
    let (mut scenario, label) =
        snapdrain_sim::scenario::resolve(SCENARIO).map_err(|e| anyhow::anyhow!("{e}"))?;
    // The demo marks the nodes drifted itself, once snapdrain holds the pods.
    scenario.timeline.clear();
    let (cluster, client) = setup::start_cluster_from(
        ScenarioSource::Inline {
            scenario: Box::new(scenario),
            label,
        },
        None,
        Duration::from_secs(60),
    )
    .await?;
    p.line(format!(
        "Simulated cluster ({SCENARIO}: 20 Karpenter nodes, budget 20%) up at {} in {:.2}s.",
        cluster.url(),
        started.elapsed().as_secs_f64()
    ))?;
    let controller = setup::start_controller(&cluster).await?;
    let view = super::preview::ClusterView::load(&client).await?;
    let protected = view.protected();
    let deadline = tokio::time::Instant::now() + timeout;
    // Holds arrive within a second of the controller's start: watch the pods until all are held.
    let (store, writer) = kube::runtime::reflector::store();
    let pod_events = kube::runtime::reflector::reflector(
        writer,
        watcher(Api::<Pod>::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff();
    let mut pod_events = std::pin::pin!(pod_events);
    let mut listed = false;
    loop {
        let now: Vec<Pod> = store.state().iter().map(|p| (**p).clone()).collect();
        if listed && held(&now, &protected) == protected.len() {
            break;
        }
        match tokio::time::timeout_at(deadline, pod_events.next()).await {
            Ok(Some(Ok(watcher::Event::InitDone))) => listed = true,
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                anyhow::bail!("snapdrain did not hold the protected pods within {timeout:?}")
            }
        }
    }
    p.line(format!(
        "snapdrain holds all {} protected pods (karpenter.sh/do-not-disrupt).",
        protected.len()
    ))?;
    let old: BTreeSet<String> = Api::<Node>::all(client.clone())
        .list(&Default::default())
        .await
        .context("cannot list nodes")?
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    let drifted = snapdrain_testkit::karpenter::mark_all_drifted(&client)
        .await
        .context("cannot mark the NodeClaims drifted")?;
    p.restart_clock();
    p.line(format!(
        "A new AMI: {drifted} NodeClaims are Drifted; Karpenter starts replacing them."
    ))?;
    let rollout = Instant::now();

    // Follow plans and nodes by watch until every drifted node is gone.
    let plan_events = watcher(
        Api::<DisruptionPlan>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .applied_objects();
    let node_events = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .touched_objects();
    let mut plan_events = std::pin::pin!(plan_events);
    let mut node_events = std::pin::pin!(node_events);
    let mut phases: BTreeMap<String, PlanPhase> = BTreeMap::new();
    let mut remaining = old.clone();
    let mut timed_out = false;
    while !remaining.is_empty() {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => { timed_out = true; break; }
            Some(Ok(plan)) = plan_events.next() => {
                let phase = plan.status.as_ref().map(|s| s.phase).unwrap_or_default();
                if phases.insert(plan.name_any(), phase) != Some(phase) {
                    p.event(format!("plan for {}: {phase}", plan.spec.nodes.join(", ")))?;
                }
            }
            Some(Ok(_)) = node_events.next() => {
                let now: BTreeSet<String> = Api::<Node>::all(client.clone())
                    .list(&Default::default())
                    .await
                    .context("cannot list nodes")?
                    .items
                    .iter()
                    .map(|n| n.name_any())
                    .collect();
                remaining.retain(|n| now.contains(n));
            }
        }
    }
    let elapsed = rollout.elapsed();
    let plans: Vec<DisruptionPlan> = Api::<DisruptionPlan>::all(client.clone())
        .list(&Default::default())
        .await
        .context("cannot list plans")?
        .items;
    let backups: Vec<safety::RecordedBackup> = plans
        .iter()
        .filter_map(|p| serde_json::to_value(p).ok())
        .flat_map(|v| safety::recorded_backups(&v))
        .collect();
    let evictions = safety::accepted_evictions(&cluster.audit.since(0));
    let protected_evicted = evictions
        .iter()
        .filter(|e| protected.contains_key(&e.pod))
        .count();
    let violations = safety::eviction_violations(&evictions, &protected, &backups);
    p.line("")?;
    p.line(format!(
        "Rollout: {} of {} drifted nodes replaced in {:.1}s; {} plans ({} Completed), {} backups verified.",
        old.len() - remaining.len(),
        old.len(),
        elapsed.as_secs_f64(),
        plans.len(),
        plans
            .iter()
            .filter(|p| p.status.as_ref().map(|s| s.phase) == Some(PlanPhase::Completed))
            .count(),
        backups.iter().filter(|b| b.verified_at.is_some()).count(),
    ))?;
    p.line(format!(
        "Safety check: {protected_evicted} evictions of protected pods, {} before a verified backup: {}.",
        violations.len(),
        if violations.is_empty() { "PASSED" } else { "FAILED" }
    ))?;
    for v in &violations {
        p.line(format!("  {v}"))?;
    }
    p.flush()?;
    drop(p);
    controller.shutdown().await;
    drop(cluster);
    Ok(if timed_out {
        Some(format!(
            "{} drifted nodes were still there after {timeout:?}: {remaining:?}",
            remaining.len()
        ))
    } else if !violations.is_empty() {
        Some(format!(
            "{} protected pods were evicted before a verified backup",
            violations.len()
        ))
    } else {
        None
    })
}
