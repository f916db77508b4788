//! Single-node consolidation of underutilized nodes (K: pkg/controllers/disruption/
//! singlenodeconsolidation.go, consolidation.go): with `consolidationPolicy: WhenEmptyOrUnderutilized`,
//! a Consolidatable candidate whose reschedulable pods all fit on the other nodes is deleted (reason
//! `Underutilized`). Only the delete decision is modelled; a cheaper replacement is never launched.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::condition_true;
use super::consolidatable::{CONSOLIDATABLE, consolidate_after};
use super::disruption::is_daemonset_pod;
use crate::apiserver::meta::meta_str;
use crate::world::WorldContext;
use crate::world::objects::is_terminating;
use crate::world::scheduler::{Usage, fits, volume_constraints};

/// K: consolidation.go `ShouldDisrupt`: the pool allows underutilized consolidation and the
/// NodeClaim is Consolidatable.
pub(super) fn should_disrupt(pool: &Value, claim: &Value) -> bool {
    pool.pointer("/spec/disruption/consolidationPolicy")
        .and_then(Value::as_str)
        .unwrap_or("WhenEmptyOrUnderutilized")
        == "WhenEmptyOrUnderutilized"
        && consolidate_after(pool).is_some()
        && condition_true(claim, CONSOLIDATABLE)
}

/// K: pkg/utils/pod `IsReschedulable`: what would have to move if the node went away.
pub(super) fn reschedulable(pod: &Value) -> bool {
    !is_terminating(pod)
        && !is_daemonset_pod(pod)
        && !pod
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .is_some_and(|o| o.iter().any(|r| r["kind"] == "Node"))
}

/// The cluster as the scheduling simulation sees it: every Node and what its pods request.
pub(super) struct Simulation {
    nodes: Vec<Arc<Value>>,
    usage: HashMap<String, Usage>,
}

impl Simulation {
    pub(super) fn new(nodes: Vec<Arc<Value>>, by_node: &HashMap<String, Vec<Arc<Value>>>) -> Self {
        let mut nodes = nodes;
        nodes.sort_by(|a, b| meta_str(a, "name").cmp(&meta_str(b, "name")));
        let usage = by_node
            .iter()
            .map(|(n, pods)| {
                let mut u = Usage::default();
                for p in pods {
                    u.add(p);
                }
                (n.to_string(), u)
            })
            .collect();
        Self { nodes, usage }
    }

    /// Whether every pod fits on a node other than `candidate` (with the scheduler's checks, so a pod
    /// with a zonal volume fits only in its zone); otherwise why the first that does not.
    pub(super) fn reschedule(
        &self,
        ctx: &WorldContext,
        candidate: &str,
        pods: &[&Arc<Value>],
    ) -> Result<(), String> {
        let mut usage = self.usage.clone();
        for pod in pods {
            let pod_name = format!(
                "{}/{}",
                meta_str(pod, "namespace").unwrap_or(""),
                meta_str(pod, "name").unwrap_or("")
            );
            let terms = volume_constraints(ctx, pod)
                .map_err(|e| format!("pod {pod_name} cannot be rescheduled: {e}"))?;
            let mut reasons: Vec<String> = Vec::new();
            let target = self.nodes.iter().find_map(|n| {
                let name = meta_str(n, "name").unwrap_or("");
                if name == candidate {
                    return None;
                }
                let used = usage.get(name).copied().unwrap_or_default();
                match fits(pod, n, used, &terms) {
                    Ok(()) => Some(name.to_string()),
                    Err(r) => {
                        if !reasons.contains(&r) {
                            reasons.push(r);
                        }
                        None
                    }
                }
            });
            match target {
                Some(t) => usage.entry(t).or_default().add(pod),
                None => {
                    reasons.sort();
                    return Err(format!(
                        "pod {pod_name} does not fit on another node: {}",
                        if reasons.is_empty() {
                            "no other nodes".to_string()
                        } else {
                            reasons.join(", ")
                        }
                    ));
                }
            }
        }
        Ok(())
    }
}
