//! Draining. Execute mode: evict the node's pods in Karpenter's tier order with bounded concurrency,
//! retrying 429s and the multi-PDB 500 with jittered backoff, then wait for the pods and their
//! VolumeAttachments to go. Release mode: the autoscaler drains; wait for the nodes to disappear.
//!
//! The safety invariant is enforced here once more: under `backup.policy: required`, a protected pod is
//! evicted only if a verified backup of this plan covers every one of its PVCs.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::cordon::{Marks, mark_nodes};
use super::inventory::{self, NodeInventory};
use super::release::{release_holds, release_newcomers, released_pods_gone, restore_holds};
use crate::api::status::{EvictionTarget, NodePhase, NodeProgress, ReleaseEnd, ReleaseOutcome};
use crate::controller::error::ControllerError;
use crate::controller::report::What;
use crate::controller::step::{Io, Next, Outcome, PlanView, Wake, attachments_left};
use crate::drain::evict::evict_with_retry;
use crate::planning::drain::{
    Batch, eviction_targets, only_uncovered_left, record_refusal, remaining_targets, select_batch,
    targeted, waiting_message,
};
use crate::planning::inventory::{is_terminal, pvc_claims};
use crate::planning::{EvictionOutcome, PlannedEviction, plan_node};
use crate::signals::detect::{self, nodeclaim_of};

/// How one node's drain stands after this call.
enum NodeDrain {
    Done,
    /// Only protected pods no backup of the plan covers are left: the drain cannot finish.
    Stuck(String),
    /// Waiting for pods to finish terminating, for blocked evictions or for volumes to detach.
    Waiting {
        message: String,
        wake: Wake,
        blocked: bool,
    },
}

pub async fn run(v: &PlanView<'_>, io: &Io<'_>) -> Result<Outcome, ControllerError> {
    // Done in Cordoning already; a plan persisted by an older controller in BackingUp, Verifying or
    // Replacing reaches Draining without it (its nodes are in no drain phase yet).
    let cordoned = v.status.nodes.iter().all(|n| {
        matches!(
            n.phase,
            NodePhase::Cordoned | NodePhase::Draining | NodePhase::Drained | NodePhase::Gone
        )
    });
    let status = if cordoned {
        v.status.clone()
    } else {
        match mark_nodes(v.status, io, true).await? {
            Marks::Intent(status) => return Ok(Outcome::decide(status).then(Next::Checkpoint)),
            Marks::Done(status) => status,
        }
    };
    let mut out = Outcome::decide(status);
    let (mut waiting, mut wakes, mut blocked) = (Vec::new(), Vec::new(), false);
    for i in 0..out.status.nodes.len() {
        if matches!(
            out.status.nodes[i].phase,
            NodePhase::Drained | NodePhase::Gone
        ) {
            continue;
        }
        match drain_node(v, io, i, &mut out).await? {
            NodeDrain::Done => out.status.nodes[i].phase = NodePhase::Drained,
            // Failing rolls the cordon back (only what snapdrain set), so the node serves its pods
            // again instead of staying cordoned behind a drain that waits forever.
            NodeDrain::Stuck(why) => return Ok(out.then(Next::Fail(why))),
            NodeDrain::Waiting {
                message,
                wake,
                blocked: b,
            } => {
                out.status.nodes[i].phase = NodePhase::Draining;
                waiting.push(message);
                wakes.push(wake);
                blocked |= b;
            }
        }
    }
    if wakes.is_empty() {
        return Ok(out);
    }
    out.status.message = Some(waiting.join("; "));
    // Refused evictions are asked again soon; otherwise wait for the pods (by watch) a whole slice.
    let recheck = if blocked {
        Duration::from_millis(500)
    } else {
        io.settings.wait_slice
    };
    Ok(out.then(Next::Wait {
        wake: Wake::Any(wakes),
        recheck,
    }))
}

/// One node: fix its targets, evict the next batch, and say what it waits for.
async fn drain_node(
    v: &PlanView<'_>,
    io: &Io<'_>,
    i: usize,
    out: &mut Outcome,
) -> Result<NodeDrain, ControllerError> {
    let node_name = out.status.nodes[i].name.clone();
    let Some(inv) = inventory::node_inventory(io.client, io.caches, &node_name).await? else {
        // The node is already gone (someone else terminated it): nothing left to drain.
        return Ok(NodeDrain::Done);
    };
    let protects = inventory::policy_protects(io.policy.as_ref(), &io.caches.namespaces);
    let inputs = inv.inputs(&[], &protects);
    let plan = plan_node(&inputs, &v.plan.spec, v.valid, v.clock());
    // The pods to evict are fixed on the first look, by UID: a DaemonSet or tolerating pod that comes
    // back later is not waited for (kubectl likewise waits only for the pods it evicted). They are
    // recorded with the first evictions' results, not written before them: if that write is lost, the
    // next look fixes them again from the pods still there, and the node is cordoned and tainted, so
    // none of the evicted pods can have come back to it.
    let targets = out.status.nodes[i]
        .eviction_targets
        .get_or_insert_with(|| eviction_targets(&plan.evictions))
        .clone();
    let present: BTreeSet<String> = inv
        .pods
        .iter()
        .filter(|p| !is_terminal(p))
        .filter_map(|p| p.uid())
        .collect();
    let remaining: Vec<EvictionTarget> = remaining_targets(&targets, &present)
        .into_iter()
        .cloned()
        .collect();
    let candidates = targeted(&plan.evictions, &targets);
    let Batch {
        send,
        held,
        uncovered,
    } = select_batch(
        &candidates,
        |e| pod_of(&inv, e).map(claims_of).unwrap_or_default(),
        &v.status.backups,
        v.plan.spec.backup.policy,
        &targets,
        v.now,
    );
    let results = evict_all(v, io, send).await;
    let blocked = record_evictions(&mut out.status.nodes[i], held, &results, v.now);
    if !blocked.is_empty() {
        out.note(
            What::EvictionBlocked,
            format!("node {node_name}: {}", blocked.join("; ")),
        );
    }
    let blocked_now = out.status.nodes[i].blocked_by.is_some();
    if remaining.is_empty() {
        return Ok(volumes(io, &inv, &node_name, &mut out.status.nodes[i]));
    }
    let names: Vec<String> = remaining
        .iter()
        .filter_map(|t| {
            let pod = inv
                .pods
                .iter()
                .find(|p| p.uid().as_deref() == Some(&t.uid))?;
            Some(format!(
                "{}/{}",
                pod.namespace().unwrap_or_default(),
                pod.name_any()
            ))
        })
        .collect();
    // A plan with a deadline ends with its node anyway (and may hold pods its EC2 snapshots saved,
    // which no Velero record covers): only a plan that would otherwise wait forever fails here.
    if v.plan.spec.deadline.is_none()
        && results.is_empty()
        && only_uncovered_left(&names, &uncovered)
    {
        return Ok(NodeDrain::Stuck(format!(
            "node {node_name}: protected pod(s) {} arrived on it after the plan was decided (between its inventory and its cordon), and no backup of this plan covers their volumes; the drain cannot finish, so the plan fails and snapdrain's cordon is undone: run the plan again to back them up and drain",
            uncovered.join(", ")
        )));
    }
    let blocked_list: Vec<String> = out.status.nodes[i].blocked_by.iter().cloned().collect();
    Ok(NodeDrain::Waiting {
        message: waiting_message(&node_name, &names, targets.len(), &blocked_list),
        wake: Wake::PodsLeft {
            node: node_name,
            uids: remaining.into_iter().map(|t| t.uid).collect(),
        },
        blocked: blocked_now,
    })
}

fn pod_of<'a>(inv: &'a NodeInventory, e: &PlannedEviction) -> Option<&'a Pod> {
    inv.pods
        .iter()
        .find(|p| p.namespace().as_deref() == Some(e.namespace.as_str()) && p.name_any() == e.name)
}

fn claims_of(pod: &Pod) -> Vec<String> {
    let ns = pod.namespace().unwrap_or_default();
    pvc_claims(pod).map(|c| format!("{ns}/{c}")).collect()
}

/// Sends the batch with bounded concurrency.
async fn evict_all(
    v: &PlanView<'_>,
    io: &Io<'_>,
    batch: Vec<PlannedEviction>,
) -> Vec<(PlannedEviction, EvictionOutcome)> {
    let concurrency = v.plan.spec.drain.max_concurrent_evictions.max(1) as usize;
    let grace = v.plan.spec.drain.grace_period_seconds;
    let budget = io.settings.wait_slice;
    futures::stream::iter(batch)
        .map(|e| async move {
            let outcome =
                evict_with_retry(io.eviction_client, io.requests, &e, grace, budget).await;
            (e, outcome)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

/// Records the answers to a node's evictions: counts, refusals backed off (in the status, so a restarted
/// controller keeps the pace), and what blocks the node. Returns what blocks it when that changed (for
/// an Event: when it changes, not on every pass).
fn record_evictions(
    node: &mut NodeProgress,
    mut blocked: Vec<String>,
    results: &[(PlannedEviction, EvictionOutcome)],
    now: Timestamp,
) -> Vec<String> {
    let mut evicted = 0u32;
    for (e, outcome) in results {
        match outcome {
            EvictionOutcome::Evicted | EvictionOutcome::AlreadyGone => evicted += 1,
            EvictionOutcome::RetryAfter { reason, .. } => {
                blocked.push(format!("{}/{}: {reason}", e.namespace, e.name))
            }
            EvictionOutcome::Failed { message } => {
                blocked.push(format!("{}/{}: {message}", e.namespace, e.name));
                // A refusal (RBAC, a webhook) is not asked again at once: the pod backs off.
                if let Some(t) = node
                    .eviction_targets
                    .as_mut()
                    .and_then(|ts| ts.iter_mut().find(|t| Some(&t.uid) == e.uid.as_ref()))
                {
                    record_refusal(t, message, now);
                }
            }
        }
    }
    if evicted > 0 {
        tracing::info!(node = %node.name, evicted, "evictions accepted");
    }
    node.pods_evicted += evicted;
    node.pods_blocked = blocked.len() as u32;
    let blocked_by = (!blocked.is_empty()).then(|| blocked.join("; "));
    let changed = node.blocked_by != blocked_by;
    node.blocked_by = blocked_by;
    if changed { blocked } else { Vec::new() }
}

/// After the pods left: wait for the VolumeAttachments of their volumes to go (Karpenter does too), so a
/// StatefulSet pod rescheduled elsewhere can attach its volume. Volumes of pods that stay (DaemonSets,
/// mirror and tolerating pods) keep their attachments.
fn volumes(io: &Io<'_>, inv: &NodeInventory, node: &str, progress: &mut NodeProgress) -> NodeDrain {
    let staying_claims: BTreeSet<&str> = inv
        .pods
        .iter()
        .filter(|p| !is_terminal(p))
        .flat_map(pvc_claims)
        .collect();
    let keep_pvs: BTreeSet<String> = inv
        .pvcs
        .iter()
        .filter(|c| staying_claims.contains(c.name_any().as_str()))
        .filter_map(|c| c.spec.as_ref().and_then(|s| s.volume_name.clone()))
        .collect();
    if attachments_left(&io.caches.volume_attachments.indexed(node), node, &keep_pvs) == 0 {
        return NodeDrain::Done;
    }
    // Named in the timeout's message if it comes to that.
    progress.blocked_by = Some(format!(
        "node {node}: waiting for VolumeAttachments to detach"
    ));
    NodeDrain::Waiting {
        message: format!(
            "node {node}: evicted pods are gone; waiting for their VolumeAttachments to detach"
        ),
        wake: Wake::AttachmentsGone {
            node: node.to_owned(),
            keep_pvs,
        },
        blocked: false,
    }
}

/// Release mode: the holds of the pods the verified backups cover are released; Karpenter (or whoever
/// disrupts) drains and terminates. The release ends when the nodes are gone or every released pod has
/// left them (a `kubectl drain` leaves the node), or, when the release window passes first or protected
/// pods no backup covers arrive, with the holds restored and the backup reusable.
pub async fn release(v: &PlanView<'_>, io: &Io<'_>) -> Result<Outcome, ControllerError> {
    let mut out = v.outcome();
    if v.status.released_at.is_none() {
        release_once(v, io, &mut out).await?;
    }
    for n in out
        .status
        .nodes
        .iter_mut()
        .filter(|n| n.phase != NodePhase::Gone)
    {
        n.phase = NodePhase::Released;
    }
    let released_at = out.status.released_at.as_ref().map_or(v.now, |t| t.0);
    let window_left = v
        .valid
        .release_window
        .saturating_sub(v.now.duration_since(released_at).unsigned_abs());
    let names: Vec<String> = v.status.nodes.iter().map(|n| n.name.clone()).collect();
    // "Gone" ends the plan: confirmed by the API, never concluded from the cache alone.
    let cached_gone = names.iter().all(|n| io.caches.nodes.get("", n).is_none());
    if cached_gone && all_gone(io, &names).await? {
        for n in out.status.nodes.iter_mut() {
            n.phase = NodePhase::Gone;
        }
        return Ok(ended(
            out,
            ReleaseOutcome::NodesGone,
            "released nodes are gone",
            v.now,
        ));
    }
    let (newly, uncovered) = release_newcomers(v, io, &out.status.released_pods).await?;
    if !newly.is_empty() {
        out.note(
            What::NewcomersReleased {
                pods: newly.len() as u64,
            },
            String::new(),
        );
        out.status.released_pods.extend(newly);
    }
    if released_pods_gone(&out.status.released_pods, io).await? {
        return Ok(ended(
            out,
            ReleaseOutcome::PodsLeft,
            "every released pod has left its node",
            v.now,
        ));
    }
    let taken = taking(io, &names);
    if !uncovered.is_empty() || (window_left.is_zero() && taken.is_none()) {
        return Ok(expire(v, io, out, &names, &uncovered).await);
    }
    if window_left.is_zero()
        && let Some(why) = taken
    {
        // Past the window, but mid-drain: the holds stay released until the node goes or its pods leave.
        out.status.message = Some(format!(
            "backups verified, holds released; the release window has passed but {why}: waiting for it to finish"
        ));
        let gone = v
            .status
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.uid.clone()))
            .collect();
        return Ok(out.then(Next::Wait {
            wake: Wake::NodesGone(gone),
            recheck: TAKEN_RECHECK,
        }));
    }
    // The window's end, not the seconds left: a message that changes on every pass is a status write
    // on every pass, and a released node's pods moving wake the plan many times a second.
    let window_end = released_at
        .checked_add(v.valid.release_window)
        .and_then(|t| t.round(jiff::Unit::Second))
        .unwrap_or(released_at);
    out.status.message = Some(format!(
        "backups verified, holds released; waiting for the disruptor to drain (release window until {window_end})"
    ));
    let gone = v
        .status
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.uid.clone()))
        .collect();
    Ok(out.then(Next::Wait {
        wake: Wake::NodesGone(gone),
        recheck: window_left.max(Duration::from_millis(100)),
    }))
}

/// How often a release past its window looks again at a node a disruptor is taking.
const TAKEN_RECHECK: Duration = Duration::from_secs(5);

/// Whether a disruptor is taking one of the plan's nodes (from the caches), and how.
fn taking(io: &Io<'_>, names: &[String]) -> Option<String> {
    names.iter().find_map(|name| {
        let node = io.caches.nodes.get("", name)?;
        let claim = nodeclaim_of(&node)
            .and_then(|c| io.caches.node_claims.get("", c))
            .map(|c| c.to_value());
        detect::taking(&node, claim.as_ref()).map(|why| format!("node {name}: {why}"))
    })
}

/// Releases the holds of the covered pods, once, and records them and when.
async fn release_once(
    v: &PlanView<'_>,
    io: &Io<'_>,
    out: &mut Outcome,
) -> Result<(), ControllerError> {
    let (released, changed) = release_holds(v, io).await?;
    let nodes: Vec<&str> = v.status.nodes.iter().map(|n| n.name.as_str()).collect();
    out.note(What::HoldsReleased { pods: changed }, format!(
        "released the holds of {} pod(s) whose backups are verified; the disruptor may now drain {}",
        released.len(),
        nodes.join(", ")
    ));
    // Pods an emergency EBS snapshot released earlier stay recorded (their holds must come back with
    // the others when the release expires).
    for p in released {
        if !out.status.released_pods.contains(&p) {
            out.status.released_pods.push(p);
        }
    }
    out.status.released_at = Some(Time(v.now));
    Ok(())
}

/// The nodes were not taken: the window passed, or protected pods no backup covers arrived (held pods
/// would keep the node forever). The holds come back and this run makes way for the next, which backs
/// the newcomers up (reusing this run's verified backups for the others).
async fn expire(
    v: &PlanView<'_>,
    io: &Io<'_>,
    mut out: Outcome,
    names: &[String],
    uncovered: &[String],
) -> Outcome {
    let restored = restore_holds(&out.status.released_pods, io).await;
    out.note(
        What::HoldsRestored {
            pods: restored as u64,
            event: false,
        },
        String::new(),
    );
    let nodes = names.join(", ");
    let (outcome, what, text) = if uncovered.is_empty() {
        (
            ReleaseOutcome::WindowPassed,
            What::ReleaseWindowPassed,
            format!(
                "the disruptor did not take {nodes} within the release window ({}s): restored the holds of {restored} pod(s)",
                v.valid.release_window.as_secs()
            ),
        )
    } else {
        (
            ReleaseOutcome::NewProtectedPods,
            What::NewProtectedPods,
            format!(
                "protected pods arrived on {nodes} after the backup ({}): restored {restored} hold(s); the next run backs them up",
                uncovered.join(", ")
            ),
        )
    };
    out.note(what, text.clone());
    ended(out, outcome, &text, v.now)
}

/// Records how the release ended; the phase machine decides from it.
fn ended(mut out: Outcome, outcome: ReleaseOutcome, message: &str, now: Timestamp) -> Outcome {
    out.status.release = Some(ReleaseEnd {
        ended_at: Time(now),
        outcome,
    });
    out.status.message = Some(message.to_owned());
    out
}

async fn all_gone(io: &Io<'_>, names: &[String]) -> Result<bool, ControllerError> {
    for n in names {
        if inventory::get_node(io.client, n).await?.is_some() {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(name: &str) -> PlannedEviction {
        PlannedEviction {
            namespace: "shop".into(),
            name: name.into(),
            uid: Some(format!("u-{name}")),
            tier: crate::planning::EvictionTier::NonCritical,
            protected: true,
            pdbs: Vec::new(),
            terminating: false,
            do_not_disrupt: false,
        }
    }

    fn node() -> NodeProgress {
        NodeProgress {
            name: "n1".into(),
            eviction_targets: Some(vec![EvictionTarget {
                namespace: "shop".into(),
                name: "db-0".into(),
                uid: "u-db-0".into(),
                ..EvictionTarget::default()
            }]),
            ..NodeProgress::default()
        }
    }

    #[test]
    fn a_refused_eviction_backs_off_in_the_status_and_is_announced_once() {
        let now: Timestamp = "2026-12-03T10:00:00Z".parse().expect("a timestamp");
        let mut n = node();
        let refused = vec![(
            planned("db-0"),
            EvictionOutcome::Failed {
                message: "denied by webhook".into(),
            },
        )];
        let blocked = record_evictions(&mut n, Vec::new(), &refused, now);
        assert_eq!(blocked, ["shop/db-0: denied by webhook"]);
        let target = &n.eviction_targets.as_ref().expect("targets")[0];
        assert_eq!(target.failures, 1);
        assert!(target.retry_at.as_ref().is_some_and(|t| t.0 > now));
        // The same block again: recorded, not announced again.
        assert!(record_evictions(&mut n, Vec::new(), &refused, now).is_empty());
        assert_eq!(n.pods_blocked, 1);
    }

    #[test]
    fn accepted_evictions_are_counted_and_clear_the_block() {
        let now: Timestamp = "2026-12-03T10:00:00Z".parse().expect("a timestamp");
        let mut n = node();
        n.blocked_by = Some("shop/db-0: PDB".into());
        let ok = vec![(planned("db-0"), EvictionOutcome::Evicted)];
        assert!(record_evictions(&mut n, Vec::new(), &ok, now).is_empty());
        assert_eq!(
            (n.pods_evicted, n.pods_blocked, n.blocked_by.clone()),
            (1, 0, None)
        );
    }
}
