//! Cordon and uncordon, remembering whether snapdrain was the one who cordoned (so a rollback never
//! uncordons a node someone else cordoned).

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::DrainError;

/// Marks `node` unschedulable. Returns true when this call changed it (it was schedulable before).
pub async fn cordon(client: &Client, node: &str) -> Result<bool, DrainError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes
        .get_opt(node)
        .await
        .map_err(|source| DrainError::ReadNode {
            node: node.to_string(),
            source,
        })?
        .ok_or_else(|| DrainError::NodeMissing {
            node: node.to_string(),
        })?;
    if current
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        return Ok(false);
    }
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .map_err(|source| DrainError::Cordon {
            node: node.to_string(),
            source,
        })?;
    Ok(true)
}

/// Makes `node` schedulable again; a node that is gone needs nothing.
pub async fn uncordon(client: &Client, node: &str) -> Result<(), DrainError> {
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"unschedulable": null}})),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(DrainError::Uncordon {
            node: node.to_string(),
            source,
        }),
    }
}
