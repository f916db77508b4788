//! The simulated Cluster Autoscaler's own scale-down decisions, one scan every `--scan-interval`
//! (kubernetes/autoscaler `cluster-autoscaler/core/static_autoscaler.go` `RunOnce`, with
//! `--scale-down-enabled`): find the unneeded nodes ([`super::ca_unneeded`]), keep the soft taint
//! `DeletionCandidateOfClusterAutoscaler=<unix seconds>:PreferNoSchedule` on exactly those
//! (`core/scaledown/actuation/softtaint.go` `UpdateSoftDeletionTaints`, `utils/taints/taints.go`
//! `MarkDeletionCandidate`, `CleanDeletionCandidate`; a node tainted ToBeDeleted is left as it is), and
//! hand a node unneeded for longer than `--scale-down-unneeded-time` to the actuation
//! ([`super::autoscaler`]: ToBeDeleted taint, evictions retried until `--max-pod-eviction-time`, then the
//! instance deleted, or the taint removed and the scale-down given up).
//!
//! At most `--max-drain-parallelism` drains run at once. After a failed scale-down no new one starts for
//! `--scale-down-delay-after-failure` (`static_autoscaler.go` `isScaleDownInCooldown`); the failed node,
//! skipped as `CurrentlyBeingDeleted` while it was tainted, is unneeded anew and waits the unneeded time
//! again: CA comes back to it later.
//!
//! Reads nodes and pods from the store, as CA reads its informers' caches; writes taints through the API
//! server, as CA does. The audit log has `scale-down-unneeded` and `scale-down-needed` (the soft taint
//! placed or taken off) and `scale-down-unremovable` (a node of a node group CA keeps, and why: CA's
//! `simulator.UnremovableReason`, written when it changes).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Taint;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::WorldContext;
use super::autoscaler::AutoscalerConfig;
use super::ca_unneeded::{
    self, DELETION_CANDIDATE_TAINT, TO_BE_DELETED_TAINT, Unneeded, Unremovable,
};
use super::node_taints;
use super::objects::{name, namespace, nodes, pods};
use super::scheduler::{Usage, fits, volume_constraints};

const BY: &str = "cluster-autoscaler";

/// What the scale-down loop remembers between scans.
#[derive(Default)]
pub struct Planner {
    unneeded: Unneeded,
    /// Each unremovable node's last reported reason.
    reported: BTreeMap<String, String>,
    /// When the last scale-down failed.
    pub last_failure: Option<Instant>,
}

fn has_taint(node: &Value, key: &str) -> bool {
    node.pointer("/spec/taints")
        .and_then(Value::as_array)
        .is_some_and(|ts| ts.iter().any(|t| t["key"] == key))
}

/// One scan's verdict per node: unneeded (with its utilisation) or why not.
pub type Verdicts = BTreeMap<String, Result<f64, Unremovable>>;

/// One pass of `FindNodesToRemove`: every node's verdict. Nodes found unneeded earlier in the pass are no
/// destination for later ones, and what moved onto a node counts.
pub fn find_unneeded(ctx: &WorldContext, threshold: f64) -> Verdicts {
    let (mut all, _) = ctx.store.snapshot(&nodes());
    all.sort_by(|a, b| name(a).cmp(name(b)));
    let (all_pods, _) = ctx.store.snapshot(&pods());
    let by_node = ca_unneeded::by_node(&all_pods);
    let mut usage: HashMap<String, Usage> = by_node
        .iter()
        .map(|(n, ps)| {
            let mut u = Usage::default();
            for p in ps.iter().filter(|p| !super::objects::is_terminal(p)) {
                u.add(p);
            }
            (n.clone(), u)
        })
        .collect();
    let mut gone: HashSet<String> = HashSet::new();
    let mut out = Verdicts::new();
    for node in &all {
        let node_name = name(node).to_string();
        let on: Vec<&Value> = by_node
            .get(&node_name)
            .map(|ps| ps.iter().map(Arc::as_ref).collect())
            .unwrap_or_default();
        let to_move = match ca_unneeded::candidate(node, &on, threshold) {
            Ok(to_move) => to_move,
            Err(why) => {
                out.insert(node_name, Err(why));
                continue;
            }
        };
        let mut tentative = usage.clone();
        let mut stuck = None;
        for pod in &to_move {
            let key = format!("{}/{}", namespace(pod), name(pod));
            let terms = match volume_constraints(ctx, pod) {
                Ok(terms) => terms,
                Err(e) => {
                    stuck = Some(format!("{key}: {e}"));
                    break;
                }
            };
            let target = all.iter().find(|n| {
                let n_name = name(n);
                n_name != node_name
                    && !gone.contains(n_name)
                    && fits(
                        pod,
                        n,
                        tentative.get(n_name).copied().unwrap_or_default(),
                        &terms,
                    )
                    .is_ok()
            });
            match target {
                Some(t) => tentative.entry(name(t).to_string()).or_default().add(pod),
                None => {
                    stuck = Some(format!("{key} fits on no other node"));
                    break;
                }
            }
        }
        match stuck {
            None => {
                usage = tentative;
                gone.insert(node_name.clone());
                let u = ca_unneeded::utilization(node, &on);
                out.insert(node_name, Ok(u));
            }
            Some(why) => {
                out.insert(node_name, Err(Unremovable::NoPlaceToMovePods(why)));
            }
        }
    }
    out
}

/// Records a node's verdict in the audit log when it changed since the last scan (as CA reports
/// unremovable nodes and their reasons in its status), so that a test can wait for it.
fn report(ctx: &WorldContext, last: &mut BTreeMap<String, String>, verdicts: &Verdicts) {
    last.retain(|n, _| verdicts.contains_key(n));
    for (node, verdict) in verdicts {
        // A node of no node group is none of CA's business (its processors filter it out first).
        let why = match verdict {
            Err(why) if !matches!(why, Unremovable::NotAutoscaled) => why,
            _ => {
                last.remove(node);
                continue;
            }
        };
        let detail = match why {
            Unremovable::NotUnderutilized(u) => json!({"utilization": u}),
            Unremovable::BlockedByPod(pod, rule) => json!({"pod": pod, "blockedBy": rule}),
            Unremovable::NoPlaceToMovePods(message) => json!({"message": message}),
            _ => json!({}),
        };
        let said = format!("{} {detail}", why.reason());
        if last.get(node) == Some(&said) {
            continue;
        }
        let mut detail = detail;
        detail["reason"] = json!(why.reason());
        detail["by"] = json!(BY);
        ctx.audit
            .world("scale-down-unremovable", "nodes", None, Some(node), detail);
        last.insert(node.clone(), said);
    }
}

/// Brings the soft taints where this scan's verdicts put them.
async fn soft_taints(
    ctx: &WorldContext,
    config: &AutoscalerConfig,
    unneeded: &HashMap<String, f64>,
) {
    let (all, _) = ctx.store.snapshot(&nodes());
    for node in &all {
        let n = name(node);
        if has_taint(node, TO_BE_DELETED_TAINT) {
            continue;
        }
        let tainted = has_taint(node, DELETION_CANDIDATE_TAINT);
        match (unneeded.get(n), tainted) {
            (Some(u), false) => {
                let value = jiff::Timestamp::now().as_second().to_string();
                let taint = Taint {
                    key: DELETION_CANDIDATE_TAINT.into(),
                    value: Some(value.clone()),
                    effect: "PreferNoSchedule".into(),
                    time_added: None,
                };
                match node_taints::add(&config.client, n, taint, false).await {
                    Ok(_) => ctx.audit.world(
                        "scale-down-unneeded",
                        "nodes",
                        None,
                        Some(n),
                        json!({"taint": DELETION_CANDIDATE_TAINT, "value": value,
                            "effect": "PreferNoSchedule", "utilization": u, "by": BY}),
                    ),
                    Err(e) => {
                        tracing::debug!(node = n, error = %e, "soft taint on node adding error")
                    }
                }
            }
            (None, true) => {
                match node_taints::remove(&config.client, n, &[DELETION_CANDIDATE_TAINT], false)
                    .await
                {
                    Ok(_) => ctx.audit.world(
                        "scale-down-needed",
                        "nodes",
                        None,
                        Some(n),
                        json!({"taint": DELETION_CANDIDATE_TAINT, "by": BY}),
                    ),
                    Err(e) => {
                        tracing::debug!(node = n, error = %e, "soft taint on node removal error")
                    }
                }
            }
            _ => {}
        }
    }
}

impl Planner {
    /// One scan: the verdicts, the soft taints, and the node to scale down now, if any (`busy`: the
    /// nodes whose scale-down runs; `drains_free`: whether another may start).
    pub async fn scan(
        &mut self,
        ctx: &WorldContext,
        config: &AutoscalerConfig,
        busy: &HashSet<String>,
        drains_free: bool,
    ) -> Option<String> {
        let s = &config.settings;
        let verdicts = find_unneeded(ctx, s.scale_down_utilization_threshold);
        report(ctx, &mut self.reported, &verdicts);
        let found: HashMap<String, f64> = verdicts
            .into_iter()
            .filter_map(|(n, v)| Some((n, v.ok()?)))
            .collect();
        let now = Instant::now();
        self.unneeded.update(found.keys().map(String::as_str), now);
        soft_taints(ctx, config, &found).await;
        if !drains_free {
            return None;
        }
        if self
            .last_failure
            .is_some_and(|t| now < t + s.scale_down_delay_after_failure)
        {
            return None;
        }
        let next = self
            .unneeded
            .removable(now, s.scale_down_unneeded_time)
            .into_iter()
            .find(|n| !busy.contains(n))?;
        self.unneeded.drop_node(&next);
        Some(next)
    }
}
