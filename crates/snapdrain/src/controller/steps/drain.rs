//! Draining. Execute mode: evict the node's pods in Karpenter's tier order with bounded concurrency,
//! retrying 429s and the multi-PDB 500 with jittered backoff, then wait for the pods and their
//! VolumeAttachments to go. Release mode: the autoscaler drains; wait for the nodes to disappear.
//!
//! The safety invariant is enforced here once more: under `backup.policy: required`, a protected pod is
//! evicted only if a verified backup of this plan covers every one of its PVCs.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::inventory;
use crate::api::plan::PlanMode;
use crate::api::status::{EvictionTarget, NodePhase};
use crate::controller::cache::Caches;
use crate::controller::error::ControllerError;
use crate::controller::reconcile::PlanRun;
use crate::drain::evict::evict;
use crate::planning::drain::{
    Batch, drain_verdict, eviction_targets, record_refusal, remaining_targets, select_batch,
    targeted, waiting_message,
};
use crate::planning::{
    Clock, DrainState, EvictionOutcome, NodeInputs, PhaseFacts, PlannedEviction, plan_node,
};

/// How one node's drain stands after this pass.
enum NodeDrain {
    Done,
    /// The pods evicted so far are gone: look again at once.
    Progress,
    /// Waiting for pods to finish terminating, for blocked evictions or for volumes to detach.
    Waiting {
        /// What the node waits for, for `status.message`.
        message: String,
        blocked: Vec<String>,
    },
}

pub async fn run(
    run: &mut PlanRun,
    facts: &mut PhaseFacts,
) -> Result<Option<Duration>, ControllerError> {
    if run.plan.spec.mode == PlanMode::Release {
        return release(run, facts).await;
    }
    // Normally done in Cordoning already (a no-op then); a plan persisted by an older controller in
    // BackingUp, Verifying or Replacing reaches Draining without it.
    super::cordon::mark_nodes(run, true).await?;
    let mut all_done = true;
    let mut blocked_all = Vec::new();
    let mut waiting = Vec::new();
    for i in 0..run.status.nodes.len() {
        if matches!(
            run.status.nodes[i].phase,
            NodePhase::Drained | NodePhase::Gone
        ) {
            continue;
        }
        let mut outcome = NodeDrain::Progress;
        for _ in 0..8 {
            outcome = drain_node(run, i).await?;
            if !matches!(outcome, NodeDrain::Progress) {
                break;
            }
        }
        match outcome {
            NodeDrain::Done => run.status.nodes[i].phase = NodePhase::Drained,
            NodeDrain::Progress => {
                all_done = false;
                run.status.nodes[i].phase = NodePhase::Draining;
                waiting.push(format!("node {}: evicting", run.status.nodes[i].name));
            }
            NodeDrain::Waiting { message, blocked } => {
                all_done = false;
                run.status.nodes[i].phase = NodePhase::Draining;
                blocked_all.extend(blocked);
                waiting.push(message);
            }
        }
    }
    let started = run
        .status
        .phase_started_at
        .as_ref()
        .map(|t| t.0)
        .unwrap_or_else(PlanRun::now);
    facts.drain = drain_verdict(
        all_done,
        started,
        PlanRun::now(),
        run.valid.drain_timeout,
        &blocked_all,
    );
    if facts.drain != DrainState::InProgress {
        return Ok(None);
    }
    run.status.message = Some(waiting.join("; "));
    Ok(Some(Duration::from_millis(500)))
}

fn claims_of(pod: &Pod) -> Vec<String> {
    let ns = pod.namespace().unwrap_or_default();
    crate::planning::inventory::pvc_claims(pod)
        .map(|c| format!("{ns}/{c}"))
        .collect()
}

async fn drain_node(run: &mut PlanRun, index: usize) -> Result<NodeDrain, ControllerError> {
    let client = run.ctx.client.clone();
    let caches = run.ctx.synced_caches().await?.clone();
    let node_name = run.status.nodes[index].name.clone();
    let Some(inv) = inventory::node_inventory(&client, &caches, &node_name).await? else {
        // The node is already gone (someone else terminated it): nothing left to drain.
        return Ok(NodeDrain::Done);
    };
    let decided_at = run
        .status
        .decided_at
        .as_ref()
        .map(|t| t.0)
        .unwrap_or_else(PlanRun::now);
    let now = PlanRun::now();
    let inputs = NodeInputs {
        node: &inv.node,
        pods: &inv.pods,
        stateful_sets: &inv.stateful_sets,
        pvcs: &inv.pvcs,
        pdbs: &inv.pdbs,
        existing_backups: &[],
    };
    let plan = plan_node(
        &inputs,
        &run.plan.spec,
        &run.valid,
        Clock { decided_at, now },
    );
    // The pods to evict are fixed on the first pass, by UID: a DaemonSet or tolerating pod that comes
    // back later is not waited for (kubectl likewise waits only for the pods it evicted).
    let targets = run.status.nodes[index]
        .eviction_targets
        .get_or_insert_with(|| eviction_targets(&plan.evictions))
        .clone();
    let present: BTreeSet<String> = inv
        .pods
        .iter()
        .filter(|p| !crate::planning::inventory::is_terminal(p))
        .filter_map(|p| p.uid())
        .collect();
    let remaining: Vec<EvictionTarget> = remaining_targets(&targets, &present)
        .into_iter()
        .cloned()
        .collect();
    let candidates = targeted(&plan.evictions, &targets);
    let pod_of = |e: &PlannedEviction| {
        inv.pods.iter().find(|p| {
            p.namespace().as_deref() == Some(e.namespace.as_str()) && p.name_any() == e.name
        })
    };
    let Batch {
        send: batch,
        held: mut blocked,
    } = select_batch(
        &candidates,
        |e| pod_of(e).map(claims_of).unwrap_or_default(),
        &run.status.backups,
        run.plan.spec.backup.policy,
        &targets,
        now,
    );

    let concurrency = run.plan.spec.drain.max_concurrent_evictions.max(1) as usize;
    let grace = run.plan.spec.drain.grace_period_seconds;
    let budget = run.ctx.settings.wait_slice;
    let ctx = run.ctx.clone();
    let results: Vec<(PlannedEviction, EvictionOutcome)> = futures::stream::iter(batch)
        .map(|e| {
            let ctx = ctx.clone();
            async move {
                let outcome = evict_with_retry(&ctx, &e, grace, budget).await;
                (e, outcome)
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut evicted = 0u32;
    let mut refused = Vec::new();
    for (e, outcome) in &results {
        match outcome {
            EvictionOutcome::Evicted | EvictionOutcome::AlreadyGone => evicted += 1,
            EvictionOutcome::RetryAfter { reason, .. } => {
                blocked.push(format!("{}/{}: {reason}", e.namespace, e.name))
            }
            EvictionOutcome::Failed { message } => {
                blocked.push(format!("{}/{}: {message}", e.namespace, e.name));
                refused.push((e.uid.clone(), message.clone()));
            }
        }
    }
    if evicted > 0 {
        tracing::info!(plan = %run.name(), node = %node_name, evicted, "evictions accepted");
    }
    let node = &mut run.status.nodes[index];
    // A refusal (RBAC, a webhook) is not asked again at once: the pod backs off, recorded in the status
    // so a restarted controller keeps the pace.
    if let Some(targets) = node.eviction_targets.as_mut() {
        for (uid, message) in &refused {
            if let Some(t) = targets.iter_mut().find(|t| Some(&t.uid) == uid.as_ref()) {
                record_refusal(t, message, now);
            }
        }
    }
    node.pods_evicted += evicted;
    node.pods_blocked = blocked.len() as u32;
    let blocked_by = (!blocked.is_empty()).then(|| blocked.join("; "));
    let changed = node.blocked_by != blocked_by;
    node.blocked_by = blocked_by;
    // An Event when what blocks the node changes, not on every pass.
    if changed && !blocked.is_empty() {
        let note = format!("node {node_name}: {}", blocked.join("; "));
        run.event(EventType::Warning, "EvictionBlocked", "Drain", note)
            .await;
    }

    if remaining.is_empty() {
        // Everything still on the node stays (DaemonSet, mirror and tolerating pods): their volumes stay
        // attached.
        let staying: BTreeSet<String> = inv
            .pods
            .iter()
            .filter(|p| !crate::planning::inventory::is_terminal(p))
            .flat_map(|p| {
                crate::planning::inventory::pvc_claims(p)
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect();
        return Ok(wait_volumes(run, &caches, &node_name, &inv.pvcs, &staying).await);
    }
    let remaining_refs: Vec<&EvictionTarget> = remaining.iter().collect();
    let message = waiting_message(&node_name, &remaining_refs, targets.len(), &blocked);
    // Wait (by watch) for the targets to leave, bounded by the slice; the next pass continues.
    let uids: BTreeSet<String> = remaining.iter().map(|t| t.uid.clone()).collect();
    let slice = if blocked.is_empty() {
        budget
    } else {
        Duration::from_millis(500)
    };
    // The pod cache's node index: re-checked after every pod change, no watch of our own.
    let gone = caches
        .pods
        .wait_until(slice, |pods| {
            !pods
                .indexed(&node_name)
                .iter()
                .any(|p| p.uid().is_some_and(|u| uids.contains(u)))
        })
        .await;
    Ok(if gone && blocked.is_empty() {
        NodeDrain::Progress
    } else {
        NodeDrain::Waiting { message, blocked }
    })
}

/// Sends one eviction, retrying "come back later" answers with jittered exponential backoff (honouring
/// the server's retryAfter) until `budget` is spent.
async fn evict_with_retry(
    ctx: &crate::controller::context::Context,
    e: &PlannedEviction,
    grace: Option<i64>,
    budget: Duration,
) -> EvictionOutcome {
    let start = Instant::now();
    let uid = e.uid.clone().unwrap_or_default();
    let attempt = || async {
        let r = evict(&ctx.eviction_client, &e.namespace, &e.name, &uid, grace).await;
        ctx.metrics.eviction(r.code);
        match r.outcome {
            retry @ EvictionOutcome::RetryAfter { .. } => Err(retry),
            other => Ok(other),
        }
    };
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(10))
        .with_jitter()
        .without_max_times();
    let result = attempt
        .retry(backoff)
        .when(|_| start.elapsed() < budget)
        .adjust(|err, dur| match (err, dur) {
            (EvictionOutcome::RetryAfter { delay, .. }, Some(d)) => Some(d.max(*delay).min(budget)),
            (_, d) => d,
        })
        .notify(|err, dur| tracing::debug!(pod = %format!("{}/{}", e.namespace, e.name), ?err, retry_in = ?dur, "eviction refused, will retry"))
        .await;
    match result {
        Ok(o) => o,
        Err(o) => o,
    }
}

/// After the pods left: wait for the VolumeAttachments of their volumes to go (Karpenter does too), so a
/// StatefulSet pod rescheduled elsewhere can attach its volume.
async fn wait_volumes(
    run: &PlanRun,
    caches: &Caches,
    node: &str,
    pvcs: &[k8s_openapi::api::core::v1::PersistentVolumeClaim],
    staying_claims: &BTreeSet<String>,
) -> NodeDrain {
    // PVs used by pods that stay (DaemonSets) keep their attachments.
    let staying_pvs: BTreeSet<String> = pvcs
        .iter()
        .filter(|c| staying_claims.contains(&c.name_any()))
        .filter_map(|c| c.spec.as_ref().and_then(|s| s.volume_name.clone()))
        .collect();
    let node_owned = node.to_string();
    let pending = |vas: &[Arc<VolumeAttachment>]| {
        vas.iter()
            .filter(|va| va.spec.node_name == node_owned)
            .filter(|va| {
                va.spec
                    .source
                    .persistent_volume_name
                    .as_ref()
                    .is_none_or(|pv| !staying_pvs.contains(pv))
            })
            .count()
    };
    let done = caches
        .volume_attachments
        .wait_until(run.ctx.settings.wait_slice, |vas| {
            pending(&vas.indexed(node)) == 0
        })
        .await;
    if done {
        NodeDrain::Done
    } else {
        NodeDrain::Waiting {
            message: format!(
                "node {node}: evicted pods are gone; waiting for their VolumeAttachments to detach"
            ),
            // Named in the timeout's message if it comes to that.
            blocked: vec![format!(
                "node {node}: waiting for VolumeAttachments to detach"
            )],
        }
    }
}

async fn all_gone(run: &PlanRun, names: &BTreeSet<String>) -> Result<bool, ControllerError> {
    for n in names {
        if inventory::get_node(&run.ctx.client, n).await?.is_some() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Release mode: the holds of the pods the verified backups cover are released; Karpenter (or whoever
/// disrupts) drains and terminates. The plan completes when the nodes are gone or every released pod has
/// left them (a `kubectl drain` leaves the node), or, when the release window passes first, restores
/// the holds and completes with its backup reusable.
async fn release(
    run: &mut PlanRun,
    facts: &mut PhaseFacts,
) -> Result<Option<Duration>, ControllerError> {
    super::release::release_holds(run).await?;
    let names: BTreeSet<String> = run.status.nodes.iter().map(|n| n.name.clone()).collect();
    for n in run.status.nodes.iter_mut() {
        if n.phase != NodePhase::Gone {
            n.phase = NodePhase::Released;
        }
    }
    let released_at = run
        .status
        .released_at
        .as_ref()
        .map_or_else(PlanRun::now, |t| t.0);
    let window_left = run
        .valid
        .release_window
        .saturating_sub(PlanRun::now().duration_since(released_at).unsigned_abs());
    let caches = run.ctx.synced_caches().await?.clone();
    let cached_gone = caches
        .nodes
        .wait_until(
            run.ctx
                .settings
                .wait_slice
                .min(window_left.max(Duration::from_millis(100))),
            |nodes| names.iter().all(|n| nodes.get("", n).is_none()),
        )
        .await;
    // "Gone" ends the plan: confirmed by the API, never concluded from the cache alone.
    let nodes_gone = cached_gone && all_gone(run, &names).await?;
    if nodes_gone {
        for n in run.status.nodes.iter_mut() {
            n.phase = NodePhase::Gone;
        }
    }
    let uncovered = if nodes_gone {
        Vec::new()
    } else {
        super::release::release_newcomers(run).await?
    };
    let pods_gone = !nodes_gone && super::release::released_pods_gone(run).await?;
    facts.nodes_gone = nodes_gone || pods_gone;
    if !facts.nodes_gone && !uncovered.is_empty() {
        // Held pods no backup covers would keep the node forever: this run makes way for the next, which
        // backs them up (reusing this run's verified backups for the others).
        let restored = super::release::restore_holds(run).await;
        facts.release_expired = true;
        run.event(
            EventType::Normal,
            "NewProtectedPods",
            "Release",
            format!(
                "protected pods arrived on {} after the backup ({}): restored {restored} hold(s); the next run backs them up",
                names.iter().cloned().collect::<Vec<_>>().join(", "),
                uncovered.join(", ")
            ),
        )
        .await;
        return Ok(None);
    }
    if !facts.nodes_gone && window_left.is_zero() {
        let restored = super::release::restore_holds(run).await;
        facts.release_expired = true;
        run.event(
            EventType::Warning,
            "ReleaseWindowPassed",
            "Release",
            format!(
                "the disruptor did not take {} within the release window ({}s): restored the holds of {restored} pod(s)",
                names.iter().cloned().collect::<Vec<_>>().join(", "),
                run.valid.release_window.as_secs()
            ),
        )
        .await;
        return Ok(None);
    }
    run.status.message = Some(if nodes_gone {
        "released nodes are gone".into()
    } else if pods_gone {
        "every released pod has left its node".into()
    } else {
        format!(
            "backups verified, holds released; waiting for the disruptor to drain (release window: {}s left)",
            window_left.as_secs()
        )
    });
    Ok((!facts.nodes_gone).then_some(Duration::from_secs(1)))
}
