//! The scenario timeline: store operations at fixed times after start. They change what a real cluster
//! would show at that moment (a NodeClaim marked Drifted, a NodeClaim deleted, a node cordoned); how
//! Karpenter or snapdrain react is up to them.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::apiserver::faults::FaultRule;
use crate::apiserver::store::DeleteOptions;
use crate::cluster::load_object;
use crate::world::WorldContext;
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
    /// Annotates the node's NodeClaim and Node with `sim.snapdrain.io/interruption-deadline` (two minutes
    /// from now), the notice an EC2 spot interruption gives; the simulated Karpenter acts on it.
    SpotInterruption {
        node: String,
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

pub const INTERRUPTION_DEADLINE: &str = "sim.snapdrain.io/interruption-deadline";

impl Action {
    pub fn nodes(&self) -> Vec<&str> {
        match self {
            Action::MarkDrifted { nodes, .. } => nodes.iter().map(String::as_str).collect(),
            Action::ExpireNodeClaim { node }
            | Action::SpotInterruption { node }
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
pub fn spawn(ctx: Arc<WorldContext>, mut entries: Vec<TimelineEntry>) -> JoinHandle<()> {
    entries.sort_by_key(|e| e.at);
    tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        for e in entries {
            tokio::time::sleep_until(start + Duration::from_millis(e.at)).await;
            let outcome = apply(&ctx, &e.action);
            let detail = match &outcome {
                Ok(d) => json!({"at": e.at, "result": d}),
                Err(msg) => json!({"at": e.at, "error": msg}),
            };
            if let Err(msg) = &outcome {
                tracing::warn!(action = e.action.verb(), error = %msg, "scenario timeline action failed");
            }
            ctx.audit
                .world(e.action.verb(), "timeline", None, None, detail);
        }
    })
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

fn node_obj(ctx: &WorldContext, node: &str) -> Result<Arc<Value>, String> {
    ctx.store
        .get(&nodes(), None, node)
        .ok_or_else(|| format!("node {node} does not exist"))
}

fn apply(ctx: &WorldContext, action: &Action) -> Result<Value, String> {
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
        Action::SpotInterruption { node } => {
            let deadline = (jiff::Timestamp::now() + jiff::SignedDuration::from_secs(120))
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string();
            let c = nodeclaim_of(ctx, node)?;
            let n = node_obj(ctx, node)?;
            for (res, obj) in [(nodeclaims(), &c), (nodes(), &n)] {
                modify_uid(store, &res, None, name(obj), uid(obj), |o| {
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
            Ok(json!({"nodeClaim": name(&c), "deadline": deadline}))
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
