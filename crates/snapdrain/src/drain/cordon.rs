//! Cordon and taint a node, and undo it, remembering what snapdrain set itself (so a rollback never
//! uncordons a node someone else cordoned, nor removes a taint someone else set).
//!
//! Both go in one merge patch carrying the node's resourceVersion: `spec.taints` has no strategic merge
//! key (kubernetes `staging/src/k8s.io/api/core/v1/types.go` NodeSpec), so a patch replaces the whole
//! list, and without the precondition a taint another controller added meanwhile would be lost. A
//! conflict re-reads the node and tries again.

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::DrainError;
use crate::planning::taint::{with_drain_taint, without_drain_taint};

/// Conflicting writes tolerated before the step gives up for this pass.
const ATTEMPTS: u32 = 5;

/// What [`cordon_and_taint`] changed (false: it was already so).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marked {
    pub cordoned: bool,
    pub tainted: bool,
}

/// A merge patch of `spec.unschedulable` (when given; null removes it) and the whole taint list (a
/// merge patch replaces lists), guarded by the node's resourceVersion so a concurrent taint change
/// is a 409 and is retried on a fresh read rather than overwritten.
fn node_patch(
    current: &Node,
    unschedulable: Option<serde_json::Value>,
    taints: Option<&[Taint]>,
) -> serde_json::Value {
    let mut spec = json!({});
    if let Some(u) = unschedulable {
        spec["unschedulable"] = u;
    }
    if let Some(t) = taints {
        spec["taints"] = json!(t);
    }
    json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "spec": spec,
    })
}

fn taints_of(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

fn is_cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// The node as the API server has it now (`None`: it is gone).
async fn read(nodes: &Api<Node>, node: &str) -> Result<Option<Node>, DrainError> {
    nodes
        .get_opt(node)
        .await
        .map_err(|source| DrainError::ReadNode {
            node: node.to_string(),
            source,
        })
}

/// What a cordon would change on `node`: whether it must become unschedulable, and the taint list with
/// snapdrain's taint added (None: the taint is there already).
fn cordon_needed(node: &Node) -> (bool, Option<Vec<Taint>>) {
    (!is_cordoned(node), with_drain_taint(taints_of(node)))
}

/// What [`cordon_and_taint`] would change on `node` as it is now (`None`: the node is gone). The plan
/// records this as its ownership intent and writes it before the cordon, so that a status write lost
/// after the patch cannot make the cordon look like someone else's.
pub async fn pending_marks(client: &Client, node: &str) -> Result<Option<Marked>, DrainError> {
    let current = read(&Api::all(client.clone()), node).await?;
    Ok(current.map(|n| {
        let (cordon, taints) = cordon_needed(&n);
        Marked {
            cordoned: cordon,
            tainted: taints.is_some(),
        }
    }))
}

/// Marks `node` unschedulable and adds snapdrain's `snapdrain.io/draining:NoSchedule` taint.
pub async fn cordon_and_taint(client: &Client, node: &str) -> Result<Marked, DrainError> {
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..ATTEMPTS {
        let current = read(&nodes, node)
            .await?
            .ok_or_else(|| DrainError::NodeMissing {
                node: node.to_string(),
            })?;
        let (cordon, taints) = cordon_needed(&current);
        if !cordon && taints.is_none() {
            return Ok(Marked::default());
        }
        let body = node_patch(&current, cordon.then_some(json!(true)), taints.as_deref());
        match nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(body))
            .await
        {
            Ok(_) => {
                return Ok(Marked {
                    cordoned: cordon,
                    tainted: taints.is_some(),
                });
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(source) if cordon => {
                return Err(DrainError::Cordon {
                    node: node.to_string(),
                    source,
                });
            }
            Err(source) => {
                return Err(DrainError::Taint {
                    node: node.to_string(),
                    source,
                });
            }
        }
    }
    Err(DrainError::NodeConflict {
        node: node.to_string(),
        attempts: ATTEMPTS,
    })
}

/// Removes snapdrain's taint (when `untaint`) and makes the node schedulable (when `uncordon`), keeping
/// every other taint. A node that is gone needs nothing. True when it changed the node.
pub async fn release(
    client: &Client,
    node: &str,
    uncordon: bool,
    untaint: bool,
) -> Result<bool, DrainError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let failed = |source| {
        if untaint {
            DrainError::Untaint {
                node: node.to_string(),
                source,
            }
        } else {
            DrainError::Uncordon {
                node: node.to_string(),
                source,
            }
        }
    };
    for _ in 0..ATTEMPTS {
        let Some(current) = nodes.get_opt(node).await.map_err(failed)? else {
            return Ok(false);
        };
        let taints = untaint
            .then(|| without_drain_taint(taints_of(&current)))
            .flatten();
        let uncordon = uncordon && is_cordoned(&current);
        if !uncordon && taints.is_none() {
            return Ok(false);
        }
        let body = node_patch(&current, uncordon.then_some(json!(null)), taints.as_deref());
        match nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(body))
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            Err(source) => return Err(failed(source)),
        }
    }
    Err(DrainError::NodeConflict {
        node: node.to_string(),
        attempts: ATTEMPTS,
    })
}
