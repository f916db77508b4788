//! Terminating: hand a Karpenter-owned node back to Karpenter by deleting its NodeClaim (Karpenter then
//! terminates the instance), otherwise terminate the EC2 instance named by the providerID and delete the
//! Node. Every call is idempotent (TerminateInstances and 404s are fine twice).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind};
use kube::runtime::events::EventType;
use kube::runtime::watcher;

use super::inventory::get_node;
use crate::api::status::NodePhase;
use crate::controller::error::ControllerError;
use crate::controller::reconcile::PlanRun;
use crate::drain::wait::wait_for;
use crate::planning::PhaseFacts;

/// The NodeClaim that owns a node, when Karpenter manages it.
fn owning_nodeclaim(node: &Node) -> Option<String> {
    node.owner_references()
        .iter()
        .find(|o| o.kind == "NodeClaim" && o.api_version.starts_with("karpenter.sh/"))
        .map(|o| o.name.clone())
}

async fn delete_ignoring_missing<K>(
    api: &Api<K>,
    name: &str,
    what: String,
) -> Result<(), ControllerError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(ControllerError::Delete { what, source }),
    }
}

pub async fn run(
    run: &mut PlanRun,
    facts: &mut PhaseFacts,
) -> Result<Option<Duration>, ControllerError> {
    let client = run.ctx.client.clone();
    let termination = run.plan.spec.termination.clone();
    for i in 0..run.status.nodes.len() {
        if run.status.nodes[i].phase == NodePhase::Gone {
            continue;
        }
        let name = run.status.nodes[i].name.clone();
        let Some(node) = get_node(&client, &name).await? else {
            run.status.nodes[i].phase = NodePhase::Gone;
            continue;
        };
        if run.status.nodes[i].phase == NodePhase::Terminating {
            continue;
        }
        if let Some(claim) = owning_nodeclaim(&node) {
            let gvk = GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim");
            let api: Api<DynamicObject> = Api::all_with(
                client.clone(),
                &ApiResource::from_gvk_with_plural(&gvk, "nodeclaims"),
            );
            delete_ignoring_missing(&api, &claim, format!("NodeClaim {claim}")).await?;
            run.event(EventType::Normal, "NodeClaimDeleted", "Terminate", format!(
                "node {name} is Karpenter's: deleted NodeClaim {claim}; Karpenter terminates the instance"
            ))
            .await;
        } else {
            if termination.terminate_instance
                && let Some(id) = run.status.nodes[i].instance_id.clone()
            {
                let outcome = run.ctx.ec2().await?.terminate(&id).await?;
                tracing::info!(plan = %run.name(), node = %name, instance = %id, ?outcome, "instance terminated");
                run.event(
                    EventType::Normal,
                    "InstanceTerminated",
                    "Terminate",
                    format!("EC2 instance {id} of node {name} terminated"),
                )
                .await;
            }
            if termination.delete_node {
                let nodes: Api<Node> = Api::all(client.clone());
                delete_ignoring_missing(&nodes, &name, format!("node {name}")).await?;
            }
        }
        run.status.nodes[i].phase = NodePhase::Terminating;
    }
    // A node we were told to keep (deleteNode false, not Karpenter's) counts as gone once its instance is.
    let keep_nodes = !termination.delete_node;
    let waiting: BTreeSet<String> = run
        .status
        .nodes
        .iter()
        .filter(|n| {
            n.phase != NodePhase::Gone && !(keep_nodes && n.phase == NodePhase::Terminating)
        })
        .map(|n| n.name.clone())
        .collect();
    if waiting.is_empty() {
        facts.nodes_gone = true;
        return Ok(None);
    }
    let api: Api<Node> = Api::all(client);
    let gone = wait_for(
        api,
        watcher::Config::default(),
        "terminated nodes to go",
        run.ctx.settings.wait_slice,
        |nodes| !nodes.iter().any(|n| waiting.contains(&n.name_any())),
    )
    .await?;
    if gone {
        for n in run
            .status
            .nodes
            .iter_mut()
            .filter(|n| waiting.contains(&n.name))
        {
            n.phase = NodePhase::Gone;
        }
    }
    facts.nodes_gone = gone;
    Ok((!gone).then_some(Duration::from_secs(1)))
}
