//! The disruption loop: graceful methods (Emptiness, Drift, then single-node consolidation) pick candidates that nothing blocks,
//! within NodePool budgets, and run a command: taint, DisruptionReason, pre-launch replacements, wait
//! for them to initialize, then delete the candidate (or drop the command on timeout).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    DISRUPTED_TAINT, DO_NOT_DISRUPT, KarpenterConfig, KarpenterHandle, NODEPOOL_POINTER, budgets,
    condition_true, consolidatable, consolidation, lock, modify_claim, modify_node, node_of,
    nodeclaim_from_pool, nodeclaims, nodepools, pods_on, remove_condition, set_condition,
};
use crate::apiserver::meta::meta_str;
use crate::apiserver::resources::ResKey;
use crate::apiserver::store::DeleteOptions;
use crate::world::WorldContext;
use crate::world::velero::scope::label_selector_matches;
use crate::world::velero::scope::labels_of;

/// A NodeClaim, its Node and the pods on it.
type Candidate = (Arc<Value>, Arc<Value>, Vec<Arc<Value>>);

pub(super) fn is_terminal(p: &Value) -> bool {
    matches!(
        p.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    )
}

pub(super) fn is_daemonset_pod(p: &Value) -> bool {
    p.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|o| o.iter().any(|r| r["kind"] == "DaemonSet"))
}

pub(super) fn do_not_disrupt(obj: &Value) -> bool {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(DO_NOT_DISRUPT))
        .and_then(Value::as_str)
        == Some("true")
}

fn has_taint(node: &Value) -> bool {
    node.pointer("/spec/taints")
        .and_then(Value::as_array)
        .is_some_and(|t| t.iter().any(|t| t["key"] == DISRUPTED_TAINT))
}

fn not_ready(node: &Value) -> bool {
    !node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// Why a candidate may not be disrupted gracefully, if anything blocks it. The Node's own
/// `karpenter.sh/do-not-disrupt` first, for every method (kubernetes-sigs/karpenter
/// `pkg/controllers/state/statenode.go` `ValidateNodeDisruptable`); then the pods' do-not-disrupt and
/// PDBs (`ValidatePodsDisruptable`), which do not block an `eventual` method (Drift,
/// `pkg/controllers/disruption/drift.go` `Class`) when the NodeClaim has a terminationGracePeriod
/// (`pkg/controllers/disruption/types.go` `NewCandidate`).
fn blocked(
    claim: &Value,
    node: &Value,
    pods: &[Arc<Value>],
    pdbs: &[Arc<Value>],
    eventual: bool,
) -> Option<String> {
    if do_not_disrupt(node) {
        return Some(format!(
            "node {} has {DO_NOT_DISRUPT}",
            meta_str(node, "name").unwrap_or("")
        ));
    }
    if eventual && claim.pointer("/spec/terminationGracePeriod").is_some() {
        return None;
    }
    if let Some(p) = pods.iter().find(|p| do_not_disrupt(p)) {
        return Some(format!(
            "pod {}/{} has {DO_NOT_DISRUPT}",
            meta_str(p, "namespace").unwrap_or(""),
            meta_str(p, "name").unwrap_or("")
        ));
    }
    for p in pods {
        let ns = meta_str(p, "namespace");
        let labels = labels_of(p);
        let matching: Vec<&Arc<Value>> = pdbs
            .iter()
            .filter(|b| meta_str(b, "namespace") == ns)
            .filter(|b| {
                b.pointer("/spec/selector")
                    .is_some_and(|s| label_selector_matches(s, &labels))
            })
            .collect();
        if matching.len() > 1 {
            return Some(format!(
                "pod {}/{} has more than one PodDisruptionBudget",
                ns.unwrap_or(""),
                meta_str(p, "name").unwrap_or("")
            ));
        }
        if let Some(b) = matching.first()
            && b.pointer("/status/disruptionsAllowed")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                <= 0
        {
            return Some(format!(
                "pdb {}/{} prevents pod evictions",
                ns.unwrap_or(""),
                meta_str(b, "name").unwrap_or("")
            ));
        }
    }
    None
}

/// Everything a disruption pass decides from: the change marks of pods, nodes, NodeClaims, PDBs and
/// NodePools, and the commands in flight.
pub(super) type Seen = ([(usize, u64); 5], Vec<String>);

fn seen(ctx: &WorldContext, handle: &KarpenterHandle) -> Seen {
    let marks = [
        ResKey::core("pods"),
        ResKey::core("nodes"),
        nodeclaims(),
        ResKey::new("policy", "poddisruptionbudgets"),
        nodepools(),
    ]
    .map(|k| ctx.store.change_mark(&k));
    let mut commands: Vec<String> = lock(&handle.shared.commands).iter().cloned().collect();
    commands.sort();
    (marks, commands)
}

/// One pass of the disruption controller over every NodePool, unless nothing it decides from has
/// changed since a pass that started nothing (it would start nothing again).
pub(super) fn pass(
    ctx: &Arc<WorldContext>,
    config: &Arc<KarpenterConfig>,
    handle: &KarpenterHandle,
) {
    let before = seen(ctx, handle);
    if lock(&handle.shared.idle).as_ref() == Some(&before) {
        return;
    }
    let started = pass_once(ctx, config, handle);
    *lock(&handle.shared.idle) = (!started).then_some(before);
}

/// Returns whether a command was started.
fn pass_once(
    ctx: &Arc<WorldContext>,
    config: &Arc<KarpenterConfig>,
    handle: &KarpenterHandle,
) -> bool {
    let mut started_any = false;
    let (pools, _) = ctx.store.snapshot(&nodepools());
    let (claims, _) = ctx.store.snapshot(&nodeclaims());
    let (pdbs, _) = ctx
        .store
        .snapshot(&ResKey::new("policy", "poddisruptionbudgets"));
    // Built on first use: the scheduling simulation only runs when some node is Consolidatable.
    let mut simulation: Option<consolidation::Simulation> = None;
    // Like Karpenter's cluster consolidation state: a pass that found nothing to consolidate is not
    // repeated until pods, nodes, NodeClaims or PDBs change (5,000 candidates would cost seconds).
    let state = [
        ResKey::core("pods"),
        ResKey::core("nodes"),
        nodeclaims(),
        ResKey::new("policy", "poddisruptionbudgets"),
    ]
    .map(|k| ctx.store.change_mark(&k));
    let settled = *lock(&handle.shared.consolidated) == Some(state);
    let mut consolidated_any = false;
    for pool in pools {
        let pool_name = meta_str(&pool, "name").unwrap_or("");
        let members: Vec<(Arc<Value>, Option<Arc<Value>>)> = claims
            .iter()
            .filter(|c| c.pointer(NODEPOOL_POINTER).and_then(Value::as_str) == Some(pool_name))
            .map(|c| (c.clone(), node_of(ctx, c)))
            .collect();
        let total = members.len();
        let in_flight = lock(&handle.shared.commands).clone();
        let disrupting = members
            .iter()
            .filter(|(c, n)| {
                c.pointer("/metadata/deletionTimestamp").is_some()
                    || in_flight.contains(meta_str(c, "name").unwrap_or(""))
                    || n.as_ref().is_some_and(|n| has_taint(n) || not_ready(n))
            })
            .count();
        // Candidates: initialized, not deleting, not already being disrupted, with a Node. Only a
        // Consolidatable (Emptiness, Underutilized) or Drifted NodeClaim can be picked by a method, so
        // only theirs have their pods looked up (from the store's index of pods by node).
        let candidates: Vec<Candidate> = members
            .iter()
            .filter(|(c, _)| {
                condition_true(c, "Initialized")
                    && c.pointer("/metadata/deletionTimestamp").is_none()
                    && (condition_true(c, consolidatable::CONSOLIDATABLE)
                        || condition_true(c, "Drifted"))
            })
            .filter(|(c, _)| !in_flight.contains(meta_str(c, "name").unwrap_or("")))
            .filter_map(|(c, n)| {
                let n = n.clone()?;
                if has_taint(&n) {
                    return None;
                }
                let on = pods_on(ctx, meta_str(&n, "name").unwrap_or(""));
                Some((c.clone(), n, on))
            })
            .collect();

        // Emptiness (K: pkg/controllers/disruption/emptiness.go): consolidation on and the NodeClaim
        // Consolidatable, with no reschedulable pods.
        if consolidatable::consolidate_after(&pool).is_some() {
            let empty: Vec<&Candidate> = candidates
                .iter()
                .filter(|(c, _, on)| {
                    condition_true(c, consolidatable::CONSOLIDATABLE)
                        && !on.iter().any(|p| consolidation::reschedulable(p))
                })
                .filter(|(c, n, on)| blocked(c, n, on, &pdbs, false).is_none())
                .collect();
            let allowed = budgets::allowed(&pool, "Empty", total, disrupting);
            if let Some((c, n, _)) = empty.first()
                && allowed > 0
            {
                start_command(ctx, config, handle, &pool, c, n, "Empty", false);
                started_any = true;
                continue;
            }
        }

        // Drift: oldest Drifted first, empty nodes first.
        let mut drifted: Vec<&Candidate> = candidates
            .iter()
            .filter(|(c, _, _)| condition_true(c, "Drifted"))
            .collect();
        drifted.sort_by_key(|(c, _, on)| (!on.is_empty(), drifted_since(c)));
        let allowed = budgets::allowed(&pool, "Drifted", total, disrupting);
        let mut started = false;
        for (c, n, on) in drifted {
            let name = meta_str(c, "name").unwrap_or("").to_string();
            match blocked(c, n, on, &pdbs, true) {
                Some(reason) => note_blocked(ctx, handle, &name, &reason),
                None if allowed > 0 && !started => {
                    start_command(ctx, config, handle, &pool, c, n, "Drifted", true);
                    started = true;
                }
                None => {
                    if allowed == 0 {
                        note_blocked(
                            ctx,
                            handle,
                            &name,
                            "no allowed disruptions for reason Drifted (budget)",
                        );
                    }
                }
            }
        }
        if started {
            started_any = true;
            continue;
        }

        // Single-node consolidation: cheapest to disrupt first (fewest pods to move, standing in for
        // Karpenter's disruption cost); the first whose pods all fit elsewhere is deleted.
        if settled {
            continue;
        }
        let mut under: Vec<&Candidate> = candidates
            .iter()
            .filter(|(c, _, _)| consolidation::should_disrupt(&pool, c))
            .collect();
        if under.is_empty() {
            continue;
        }
        // Cached: the key counts a node's pods, and a sort of 5,000 candidates asks for it ~130,000 times.
        under.sort_by_cached_key(|(c, _, on)| {
            (
                on.iter()
                    .filter(|p| consolidation::reschedulable(p))
                    .count(),
                meta_str(c, "name").unwrap_or("").to_string(),
            )
        });
        let allowed = budgets::allowed(&pool, "Underutilized", total, disrupting);
        let sim = simulation.get_or_insert_with(|| {
            let (nodes, _) = ctx.store.snapshot(&ResKey::core("nodes"));
            let by_node: HashMap<String, Vec<Arc<Value>>> = nodes
                .iter()
                .filter_map(|n| meta_str(n, "name"))
                .map(|n| (n.to_string(), pods_on(ctx, n)))
                .collect();
            consolidation::Simulation::new(nodes, &by_node)
        });
        let mut consolidated = false;
        for (c, n, on) in under {
            let name = meta_str(c, "name").unwrap_or("").to_string();
            if let Some(reason) = blocked(c, n, on, &pdbs, false) {
                note_blocked(ctx, handle, &name, &reason);
                continue;
            }
            if allowed == 0 {
                note_blocked(
                    ctx,
                    handle,
                    &name,
                    "no allowed disruptions for reason Underutilized (budget)",
                );
                continue;
            }
            let moving: Vec<&Arc<Value>> = on
                .iter()
                .filter(|p| consolidation::reschedulable(p))
                .collect();
            match sim.reschedule(ctx, meta_str(n, "name").unwrap_or(""), &moving) {
                Ok(()) => {
                    start_command(ctx, config, handle, &pool, c, n, "Underutilized", false);
                    consolidated = true;
                    break;
                }
                // Karpenter's Unconsolidatable event.
                Err(why) => note_blocked(ctx, handle, &name, &why),
            }
        }
        if consolidated {
            // The candidate's pods are about to land elsewhere: later pools simulate afresh.
            simulation = None;
            consolidated_any = true;
        }
    }
    *lock(&handle.shared.consolidated) = (!consolidated_any).then_some(state);
    started_any || consolidated_any
}

fn drifted_since(claim: &Value) -> String {
    claim
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Drifted"))
        .and_then(|c| c["lastTransitionTime"].as_str())
        .unwrap_or("")
        .to_string()
}

/// Audits a blocked candidate once per distinct reason (Karpenter's DisruptionBlocked event).
fn note_blocked(ctx: &WorldContext, handle: &KarpenterHandle, claim: &str, reason: &str) {
    let mut seen = lock(&handle.shared.blocked);
    if seen.get(claim).map(String::as_str) != Some(reason) {
        seen.insert(claim.to_string(), reason.to_string());
        ctx.audit.world(
            "disruption-blocked",
            "nodeclaims.karpenter.sh",
            None,
            Some(claim),
            json!({"reason": reason}),
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn start_command(
    ctx: &Arc<WorldContext>,
    config: &Arc<KarpenterConfig>,
    handle: &KarpenterHandle,
    pool: &Value,
    claim: &Value,
    node: &Value,
    reason: &str,
    replace: bool,
) {
    let name = meta_str(claim, "name").unwrap_or("").to_string();
    let node_name = meta_str(node, "name").unwrap_or("").to_string();
    lock(&handle.shared.commands).insert(name.clone());
    let tainted = modify_node(ctx, &node_name, |v| {
        if !v["spec"]["taints"].is_array() {
            v["spec"]["taints"] = json!([]);
        }
        if let Some(t) = v["spec"]["taints"].as_array_mut() {
            t.push(json!({"key": DISRUPTED_TAINT, "effect": "NoSchedule"}));
        }
    });
    let marked = modify_claim(ctx, &name, |v| {
        set_condition(v, "DisruptionReason", "True", reason, reason)
    });
    if tainted.is_err() || marked.is_err() {
        lock(&handle.shared.commands).remove(&name);
        return;
    }
    let replacement = if replace {
        match ctx.store.create(
            &nodeclaims(),
            None,
            nodeclaim_from_pool(pool),
            super::INTERNAL,
        ) {
            Ok(r) => meta_str(&r, "name").map(str::to_string),
            Err(e) => {
                tracing::warn!(nodeclaim = %name, error = %e, "karpenter sim: cannot create replacement");
                None
            }
        }
    } else {
        None
    };
    ctx.audit.world(
        "disruption-started",
        "nodeclaims.karpenter.sh",
        None,
        Some(&name),
        json!({"reason": reason, "node": node_name, "replacement": replacement, "decision": if replace { "replace" } else { "delete" }}),
    );
    let (ctx, config, handle, reason) = (
        ctx.clone(),
        config.clone(),
        handle.clone(),
        reason.to_string(),
    );
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + config.replacement_timeout;
        let ok = loop {
            let Some(r) = &replacement else { break true };
            match ctx.store.get(&nodeclaims(), None, r) {
                Some(c) if condition_true(&c, "Initialized") => break true,
                Some(c)
                    if c.pointer("/metadata/deletionTimestamp").is_none()
                        && tokio::time::Instant::now() < deadline => {}
                _ => break false,
            }
            tokio::time::sleep(config.requeue).await;
        };
        if ok {
            ctx.audit.world(
                "disruption-terminating",
                "nodeclaims.karpenter.sh",
                None,
                Some(&name),
                json!({"reason": reason}),
            );
            let _ = ctx
                .store
                .delete(&nodeclaims(), None, &name, &DeleteOptions::default());
        } else {
            // Untaint and forget the command, as Karpenter does when replacements fail.
            let _ = modify_node(&ctx, &node_name, |v| {
                if let Some(t) = v["spec"]["taints"].as_array_mut() {
                    t.retain(|t| t["key"] != DISRUPTED_TAINT);
                }
            });
            let _ = modify_claim(&ctx, &name, |v| remove_condition(v, "DisruptionReason"));
            ctx.audit.world(
                "disruption-dropped",
                "nodeclaims.karpenter.sh",
                None,
                Some(&name),
                json!({"reason": "replacement did not initialize", "replacement": replacement}),
            );
        }
        lock(&handle.shared.commands).remove(&name);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(tgp: Option<&str>) -> Value {
        let mut c = json!({"metadata": {"name": "c1"}, "spec": {}});
        if let Some(t) = tgp {
            c["spec"]["terminationGracePeriod"] = json!(t);
        }
        c
    }

    fn node(held: bool) -> Value {
        let mut n = json!({"metadata": {"name": "n1"}});
        if held {
            n["metadata"]["annotations"] = json!({DO_NOT_DISRUPT: "true"});
        }
        n
    }

    fn held_pod() -> Arc<Value> {
        Arc::new(
            json!({"metadata": {"name": "pg-0", "namespace": "db", "labels": {"app": "pg"},
                                     "annotations": {DO_NOT_DISRUPT: "true"}}}),
        )
    }

    fn pdb_at_zero() -> Arc<Value> {
        Arc::new(json!({"metadata": {"name": "pg", "namespace": "db"},
                        "spec": {"selector": {"matchLabels": {"app": "pg"}}},
                        "status": {"disruptionsAllowed": 0}}))
    }

    #[test]
    fn drift_with_a_termination_grace_period_ignores_pod_holds_and_pdbs() {
        let pods = [held_pod()];
        let pdbs = [pdb_at_zero()];
        let tgp = claim(Some("30s"));
        assert_eq!(blocked(&tgp, &node(false), &pods, &pdbs, true), None);
        // Without a TGP, or for a graceful (not eventual) method, the pod's hold blocks.
        let why = blocked(&claim(None), &node(false), &pods, &pdbs, true).expect("blocked");
        assert!(why.contains("pod db/pg-0"), "{why}");
        let why = blocked(&tgp, &node(false), &pods, &pdbs, false).expect("blocked");
        assert!(why.contains("pod db/pg-0"), "{why}");
        // A PDB alone blocks unless eventual with a TGP.
        let unheld = [Arc::new(
            json!({"metadata": {"name": "pg-0", "namespace": "db", "labels": {"app": "pg"}}}),
        )];
        let why = blocked(&claim(None), &node(false), &unheld, &pdbs, true).expect("blocked");
        assert!(why.contains("pdb db/pg"), "{why}");
        assert_eq!(blocked(&tgp, &node(false), &unheld, &pdbs, true), None);
    }

    #[test]
    fn the_nodes_own_do_not_disrupt_blocks_every_method_even_with_a_termination_grace_period() {
        let tgp = claim(Some("30s"));
        for eventual in [true, false] {
            let why = blocked(&tgp, &node(true), &[], &[], eventual).expect("blocked");
            assert!(why.contains("node n1"), "{why}");
        }
        // A value other than "true" does not count (Karpenter compares with "true").
        let mut other = node(false);
        other["metadata"]["annotations"] = json!({DO_NOT_DISRUPT: "false"});
        assert_eq!(blocked(&tgp, &other, &[], &[], true), None);
    }
}
