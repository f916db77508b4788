//! The scenario timeline: store operations at fixed times after start. They change what a real cluster
//! would show at that moment (a NodeClaim marked Drifted, a NodeClaim deleted, a node cordoned) or what
//! reaches it from outside (an EC2 spot notice, a Cluster Autoscaler scale-down decision); how Karpenter,
//! Cluster Autoscaler, aws-node-termination-handler or snapdrain react is up to them.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::manifest::load_object;
use crate::apiserver::faults::FaultRule;
use crate::apiserver::store::DeleteOptions;
use crate::world::WorldContext;
use crate::world::autoscaler::{AutoscalerHandle, TO_BE_DELETED_TAINT};
use crate::world::karpenter::{Cloud, KarpenterHandle};
use crate::world::nth::{Notice, NthHandle};
use crate::world::objects::*;

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimelineEntry {
    /// Milliseconds after the cluster started.
    pub at: u64,
    pub action: Action,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Action {
    /// Sets `Drifted=True` on the NodeClaims of `nodes`, or of the first `count` Karpenter nodes by name
    /// that are not drifted yet (a new Bottlerocket AMI: reason `AMIDrift`).
    #[serde(rename_all = "camelCase")]
    MarkDrifted {
        #[serde(default)]
        nodes: Vec<String>,
        #[serde(default)]
        count: Option<usize>,
        #[serde(default = "ami_drift")]
        reason: String,
    },
    /// Deletes the node's NodeClaim, as Karpenter's expiration does (its finalizer keeps it until
    /// Karpenter's termination finishes).
    ExpireNodeClaim {
        node: String,
    },
    /// An EC2 spot interruption notice for the node's instance: annotates the Node (and its NodeClaim, when
    /// Karpenter owns it) with `sim.snapdrain.io/interruption-deadline`, `notice` ms from now (default two
    /// minutes, as EC2 warns); tells aws-node-termination-handler, when the scenario installs it; and at
    /// the deadline EC2 terminates the instance, whatever was drained.
    SpotInterruption {
        node: String,
        #[serde(default = "spot_notice_ms")]
        notice: u64,
    },
    /// An EC2 rebalance recommendation for the node's instance (no deadline): only
    /// aws-node-termination-handler acts on it, when the scenario installs it.
    RebalanceRecommendation {
        node: String,
    },
    /// Cluster Autoscaler decided to scale these nodes down (or the first `count` nodes by name that no
    /// Karpenter NodePool owns and CA is not deleting yet): it drains and deletes each unless something on
    /// it refuses (see `world::autoscaler`).
    #[serde(rename_all = "camelCase")]
    AutoscalerScaleDown {
        #[serde(default)]
        nodes: Vec<String>,
        #[serde(default)]
        count: Option<usize>,
    },
    InjectFault(FaultRule),
    ClearFaults,
    DeleteNode {
        node: String,
    },
    Cordon {
        node: String,
    },
    Uncordon {
        node: String,
    },
    /// Sets the node's Ready condition (False: NotReady).
    SetNodeReady {
        node: String,
        ready: bool,
    },
    /// Sets `spec.replicas` of a StatefulSet or Deployment.
    #[serde(rename_all = "camelCase")]
    Scale {
        kind: String,
        #[serde(default = "super::format::default_namespace")]
        namespace: String,
        name: String,
        replicas: u32,
    },
    DeletePod {
        #[serde(default = "super::format::default_namespace")]
        namespace: String,
        name: String,
    },
    /// Creates any manifest.
    Apply {
        object: Value,
    },
}

fn ami_drift() -> String {
    "AMIDrift".into()
}

fn spot_notice_ms() -> u64 {
    crate::world::spot::NOTICE.as_millis() as u64
}

/// What actions reach beyond the store: the drainers they notify and the cloud that reclaims spot
/// instances. An absent one is not installed in this cluster.
#[derive(Clone, Default)]
pub struct Reach {
    pub autoscaler: Option<AutoscalerHandle>,
    pub nth: Option<NthHandle>,
    pub cloud: Option<Arc<dyn Cloud>>,
    /// Karpenter, when it reads an interruption queue (`KarpenterSettings::interruption_queue`): it then
    /// gets EC2's spot interruption warnings.
    pub karpenter_interruptions: Option<KarpenterHandle>,
}

pub const INTERRUPTION_DEADLINE: &str = "sim.snapdrain.io/interruption-deadline";

impl Action {
    pub fn nodes(&self) -> Vec<&str> {
        match self {
            Action::MarkDrifted { nodes, .. } | Action::AutoscalerScaleDown { nodes, .. } => {
                nodes.iter().map(String::as_str).collect()
            }
            Action::ExpireNodeClaim { node }
            | Action::SpotInterruption { node, .. }
            | Action::RebalanceRecommendation { node }
            | Action::DeleteNode { node }
            | Action::Cordon { node }
            | Action::Uncordon { node }
            | Action::SetNodeReady { node, .. } => vec![node.as_str()],
            _ => Vec::new(),
        }
    }

    fn verb(&self) -> &'static str {
        match self {
            Action::MarkDrifted { .. } => "markDrifted",
            Action::ExpireNodeClaim { .. } => "expireNodeClaim",
            Action::SpotInterruption { .. } => "spotInterruption",
            Action::RebalanceRecommendation { .. } => "rebalanceRecommendation",
            Action::AutoscalerScaleDown { .. } => "autoscalerScaleDown",
            Action::InjectFault(_) => "injectFault",
            Action::ClearFaults => "clearFaults",
            Action::DeleteNode { .. } => "deleteNode",
            Action::Cordon { .. } => "cordon",
            Action::Uncordon { .. } => "uncordon",
            Action::SetNodeReady { .. } => "setNodeReady",
            Action::Scale { .. } => "scale",
            Action::DeletePod { .. } => "deletePod",
            Action::Apply { .. } => "apply",
        }
    }
}

/// Runs the timeline from now; the task ends after the last action.
pub fn spawn(
    ctx: Arc<WorldContext>,
    mut entries: Vec<TimelineEntry>,
    reach: Reach,
) -> JoinHandle<()> {
    entries.sort_by_key(|e| e.at);
    tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        for e in entries {
            tokio::time::sleep_until(start + Duration::from_millis(e.at)).await;
            let _ = act(&ctx, &reach, &e.action, e.at);
        }
    })
}

/// Applies one action and records it in the audit log (`at`: its time in the timeline, in ms).
pub fn act(
    ctx: &Arc<WorldContext>,
    reach: &Reach,
    action: &Action,
    at: u64,
) -> Result<Value, String> {
    let outcome = apply(ctx, reach, action);
    let detail = match &outcome {
        Ok(d) => json!({"at": at, "result": d}),
        Err(msg) => json!({"at": at, "error": msg}),
    };
    if let Err(msg) = &outcome {
        tracing::warn!(action = action.verb(), error = %msg, "scenario timeline action failed");
    }
    ctx.audit
        .world(action.verb(), "timeline", None, None, detail);
    outcome
}

/// The NodeClaim whose `status.nodeName` is `node`.
fn nodeclaim_of(ctx: &WorldContext, node: &str) -> Result<Arc<Value>, String> {
    ctx.store
        .list(
            &nodeclaims(),
            None,
            &|c| str_at(c, "/status/nodeName") == Some(node),
            Some(1),
            None,
        )
        .items
        .into_iter()
        .next()
        .ok_or_else(|| format!("node {node} has no NodeClaim (is it Karpenter-managed?)"))
}

/// The EC2 instance ID in the Node's providerID (`aws:///<zone>/<id>`).
fn instance_of(node: &Value) -> Option<String> {
    str_at(node, "/spec/providerID")?
        .rsplit('/')
        .next()
        .filter(|id| id.starts_with("i-"))
        .map(str::to_string)
}

fn node_obj(ctx: &WorldContext, node: &str) -> Result<Arc<Value>, String> {
    ctx.store
        .get(&nodes(), None, node)
        .ok_or_else(|| format!("node {node} does not exist"))
}

fn apply(ctx: &Arc<WorldContext>, reach: &Reach, action: &Action) -> Result<Value, String> {
    let store = &ctx.store;
    match action {
        Action::MarkDrifted {
            nodes: names,
            count,
            reason,
        } => {
            let claims: Vec<Arc<Value>> = if names.is_empty() {
                let mut all = store
                    .list(
                        &nodeclaims(),
                        None,
                        &|c| condition(c, "Drifted") != Some("True") && !is_terminating(c),
                        None,
                        None,
                    )
                    .items;
                all.sort_by(|a, b| {
                    str_at(a, "/status/nodeName").cmp(&str_at(b, "/status/nodeName"))
                });
                all.truncate(count.unwrap_or(all.len()));
                all
            } else {
                names
                    .iter()
                    .map(|n| nodeclaim_of(ctx, n))
                    .collect::<Result<_, _>>()?
            };
            let mut marked = Vec::new();
            for c in claims {
                if modify_uid(store, &nodeclaims(), None, name(&c), uid(&c), |c| {
                    set_condition(c, "Drifted", "True", reason, "");
                    true
                })
                .is_some()
                {
                    marked.push(str_at(&c, "/status/nodeName").unwrap_or("").to_string());
                }
            }
            Ok(json!({"drifted": marked}))
        }
        Action::ExpireNodeClaim { node } => {
            let c = nodeclaim_of(ctx, node)?;
            store
                .delete(&nodeclaims(), None, name(&c), &DeleteOptions::default())
                .map_err(|e| e.message)?;
            Ok(json!({"nodeClaim": name(&c)}))
        }
        Action::SpotInterruption { node, notice } => {
            let at = jiff::Timestamp::now() + Duration::from_millis(*notice);
            let deadline = at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
            let n = node_obj(ctx, node)?;
            let claim = nodeclaim_of(ctx, node).ok();
            let mut annotate = vec![(nodes(), n.clone())];
            annotate.extend(claim.iter().map(|c| (nodeclaims(), c.clone())));
            for (res, obj) in annotate {
                modify_uid(store, &res, None, name(&obj), uid(&obj), |o| {
                    if !o
                        .pointer("/metadata/annotations")
                        .is_some_and(Value::is_object)
                    {
                        o["metadata"]["annotations"] = json!({});
                    }
                    o["metadata"]["annotations"][INTERRUPTION_DEADLINE] = json!(deadline);
                    true
                });
            }
            let notified = reach
                .nth
                .as_ref()
                .is_some_and(|h| h.notify(node, Notice::SpotInterruption { deadline: at }));
            let karpenter = match (&reach.karpenter_interruptions, &claim) {
                (Some(k), Some(c)) => {
                    k.spot_interruption(name(c));
                    true
                }
                _ => false,
            };
            let instance = instance_of(&n);
            if let (Some(cloud), Some(id)) = (&reach.cloud, &instance) {
                tokio::spawn(crate::world::spot::reclaim_at(
                    ctx.clone(),
                    cloud.clone(),
                    id.clone(),
                    node.clone(),
                    at,
                ));
            }
            Ok(
                json!({"nodeClaim": claim.as_ref().map(|c| name(c)), "deadline": deadline,
                "instance": instance, "nodeTerminationHandler": notified, "karpenter": karpenter}),
            )
        }
        Action::RebalanceRecommendation { node } => {
            node_obj(ctx, node)?;
            let notified = reach.nth.as_ref().is_some_and(|h| {
                h.notify(
                    node,
                    Notice::RebalanceRecommendation {
                        noticed: jiff::Timestamp::now(),
                    },
                )
            });
            Ok(json!({"nodeTerminationHandler": notified}))
        }
        Action::AutoscalerScaleDown {
            nodes: names,
            count,
        } => {
            let ca = reach
                .autoscaler
                .as_ref()
                .ok_or("Cluster Autoscaler does not run in this cluster")?;
            let chosen: Vec<String> = if names.is_empty() {
                let mut all: Vec<String> = store
                    .list(
                        &nodes(),
                        None,
                        &|n| {
                            n.pointer("/metadata/labels/karpenter.sh~1nodepool")
                                .is_none()
                                && !is_terminating(n)
                                && !n
                                    .pointer("/spec/taints")
                                    .and_then(Value::as_array)
                                    .is_some_and(|ts| {
                                        ts.iter().any(|t| t["key"] == TO_BE_DELETED_TAINT)
                                    })
                        },
                        None,
                        None,
                    )
                    .items
                    .iter()
                    .map(|n| name(n).to_string())
                    .collect();
                all.sort();
                all.truncate(count.unwrap_or(all.len()));
                all
            } else {
                names.clone()
            };
            for n in &chosen {
                if !ca.scale_down(n) {
                    return Err("Cluster Autoscaler stopped".into());
                }
            }
            Ok(json!({"requested": chosen}))
        }
        Action::InjectFault(rule) => {
            rule.validate()?;
            ctx.faults.add(rule.clone());
            Ok(json!(rule))
        }
        Action::ClearFaults => {
            ctx.faults.set(Vec::new());
            Ok(Value::Null)
        }
        Action::DeleteNode { node } => {
            store
                .delete(&nodes(), None, node, &DeleteOptions::default())
                .map_err(|e| e.message)?;
            Ok(json!({"node": node}))
        }
        Action::Cordon { node } | Action::Uncordon { node } => {
            let on = matches!(action, Action::Cordon { .. });
            let n = node_obj(ctx, node)?;
            modify_uid(store, &nodes(), None, node, uid(&n), |o| {
                o["spec"]["unschedulable"] = json!(on);
                true
            });
            Ok(json!({"node": node, "unschedulable": on}))
        }
        Action::SetNodeReady { node, ready } => {
            let n = node_obj(ctx, node)?;
            let (status, reason) = if *ready {
                ("True", "KubeletReady")
            } else {
                ("Unknown", "NodeStatusUnknown")
            };
            modify_uid(store, &nodes(), None, node, uid(&n), |o| {
                set_condition(o, "Ready", status, reason, "");
                true
            });
            Ok(json!({"node": node, "ready": ready}))
        }
        Action::Scale {
            kind,
            namespace: ns,
            name: obj_name,
            replicas,
        } => {
            let res = match kind.as_str() {
                "StatefulSet" => statefulsets(),
                "Deployment" => deployments(),
                "ReplicaSet" => replicasets(),
                other => {
                    return Err(format!(
                        "cannot scale kind {other}; use StatefulSet, Deployment or ReplicaSet"
                    ));
                }
            };
            store
                .modify(&res, Some(ns), obj_name, None, internal(), |o| {
                    let mut o = o.clone();
                    o["spec"]["replicas"] = json!(replicas);
                    Ok(o)
                })
                .map_err(|e| e.message)?;
            Ok(json!({"replicas": replicas}))
        }
        Action::DeletePod {
            namespace: ns,
            name: pod,
        } => {
            store
                .delete(&pods(), Some(ns), pod, &DeleteOptions::default())
                .map_err(|e| e.message)?;
            Ok(json!({"pod": pod}))
        }
        Action::Apply { object } => {
            load_object(store, object.clone())?;
            Ok(json!({"kind": object.get("kind")}))
        }
    }
}
