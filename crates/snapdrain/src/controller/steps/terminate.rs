//! Terminating: hand a Karpenter-owned node back to Karpenter by deleting its NodeClaim (Karpenter then
//! terminates the instance), otherwise terminate the EC2 instance named by the providerID (through its
//! Auto Scaling group when it has one) and delete the Node. Every call is idempotent (TerminateInstances
//! and 404s are fine twice). A Node recreated under the same name (a new uid) is a different node: the
//! one the plan drained is gone, and the new one is left alone.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::events::EventType;

use super::instance::record_instance;
use super::inventory::get_node;
use crate::api::status::NodePhase;
use crate::cloud::ec2::CloudError;
use crate::controller::error::ControllerError;
use crate::controller::reconcile::PlanRun;
use crate::planning::PhaseFacts;
use crate::planning::replacement::decrement_desired_capacity;
use crate::signals::detect::{nodeclaim_of, nodeclaims};

/// True when `node` is not the Node the plan was decided for (same name, another uid).
pub fn is_other_node(recorded_uid: Option<&str>, node: &Node) -> bool {
    match (recorded_uid, node.metadata.uid.as_deref()) {
        (Some(want), Some(have)) => want != have,
        _ => false,
    }
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
    let replacement = run.plan.spec.replacement.clone();
    // Nodes expected to disappear, with what the plan waits for (for status.message).
    let mut waiting: Vec<(String, String)> = Vec::new();
    for i in 0..run.status.nodes.len() {
        if run.status.nodes[i].phase == NodePhase::Gone {
            continue;
        }
        let name = run.status.nodes[i].name.clone();
        let Some(node) = get_node(&client, &name).await? else {
            run.status.nodes[i].phase = NodePhase::Gone;
            continue;
        };
        if is_other_node(run.status.nodes[i].uid.as_deref(), &node) {
            // The drained node is gone; this one only has its name (IP-based hostnames are reused).
            run.status.nodes[i].phase = NodePhase::Gone;
            run.event(
                EventType::Normal,
                "NodeRecreated",
                "Terminate",
                format!(
                    "node {name} now has uid {} (the plan drained uid {}): the drained node is gone, the new one is left alone",
                    node.metadata.uid.as_deref().unwrap_or("?"),
                    run.status.nodes[i].uid.as_deref().unwrap_or("?"),
                ),
            )
            .await;
            continue;
        }
        let claim = nodeclaim_of(&node).map(str::to_owned);
        // Karpenter terminates its own instances; with terminateInstance false it keeps them, and
        // deleting the Node would start Karpenter's termination (its finalizer deletes the NodeClaim).
        let expect_gone = match &claim {
            Some(_) => termination.terminate_instance,
            None => termination.delete_node,
        };
        if run.status.nodes[i].phase != NodePhase::Terminating {
            // Read before terminating: the replacement is launched like this instance, and an
            // instance in an Auto Scaling group is terminated through it.
            let record =
                if replacement.is_some() || (claim.is_none() && termination.terminate_instance) {
                    record_instance(run, i).await?
                } else {
                    None
                };
            match &claim {
                Some(claim) if termination.terminate_instance => {
                    delete_ignoring_missing(
                        &nodeclaims(&client),
                        claim,
                        format!("NodeClaim {claim}"),
                    )
                    .await?;
                    run.event(EventType::Normal, "NodeClaimDeleted", "Terminate", format!(
                        "node {name} is Karpenter's: deleted NodeClaim {claim}; Karpenter terminates the instance"
                    ))
                    .await;
                }
                Some(claim) => {
                    run.event(EventType::Normal, "InstanceKept", "Terminate", format!(
                        "node {name} is Karpenter's and termination.terminateInstance is false: NodeClaim {claim}, its instance and the Node are kept (deleting either would make Karpenter terminate the instance)"
                    ))
                    .await;
                }
                None => {
                    if termination.terminate_instance
                        && let Some(id) = run.status.nodes[i].instance_id.clone()
                    {
                        let group = record.as_ref().and_then(|r| r.auto_scaling_group.clone());
                        let note = match group {
                            Some(group) => {
                                let decrement =
                                    decrement_desired_capacity(&termination, replacement.as_ref());
                                terminate_in_group(run, &id, decrement).await?;
                                format!(
                                    "EC2 instance {id} of node {name} terminated through Auto Scaling group {group} ({})",
                                    if decrement {
                                        "desired capacity decremented"
                                    } else {
                                        "desired capacity kept: the group launches a replacement"
                                    }
                                )
                            }
                            None => {
                                let outcome = run.ctx.ec2().await?.terminate(&id).await?;
                                tracing::info!(plan = %run.name(), node = %name, instance = %id, ?outcome, "instance terminated");
                                format!("EC2 instance {id} of node {name} terminated")
                            }
                        };
                        run.event(EventType::Normal, "InstanceTerminated", "Terminate", note)
                            .await;
                    }
                    if termination.delete_node {
                        let nodes: Api<Node> = Api::all(client.clone());
                        delete_ignoring_missing(&nodes, &name, format!("node {name}")).await?;
                    }
                }
            }
            run.status.nodes[i].phase = NodePhase::Terminating;
        }
        if expect_gone {
            let what = match &claim {
                Some(claim) => nodeclaim_wait(&client, claim, &name).await,
                None => format!("node {name} to be deleted"),
            };
            waiting.push((name, what));
        }
    }
    if waiting.is_empty() {
        facts.nodes_gone = true;
        return Ok(None);
    }
    let names: BTreeSet<String> = waiting.iter().map(|(n, _)| n.clone()).collect();
    let uids: Vec<(String, Option<String>)> = run
        .status
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.uid.clone()))
        .collect();
    // The shared Node cache, re-checked after every Node change (no watch of our own per pass).
    let caches = run.ctx.synced_caches().await?.clone();
    let gone = caches
        .nodes
        .wait_until(run.ctx.settings.wait_slice, |cache| {
            let nodes = cache.all();
            // A Node of that name with another uid does not count: it is not the one being terminated.
            !nodes.iter().any(|n| {
                names.contains(&n.name_any())
                    && !uids.iter().any(|(name, uid)| {
                        *name == n.name_any() && is_other_node(uid.as_deref(), n)
                    })
            })
        })
        .await;
    if gone {
        for n in run
            .status
            .nodes
            .iter_mut()
            .filter(|n| names.contains(&n.name))
        {
            n.phase = NodePhase::Gone;
        }
    } else {
        run.status.message = Some(format!(
            "waiting for {}",
            waiting
                .iter()
                .map(|(_, w)| w.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    facts.nodes_gone = gone;
    Ok((!gone).then_some(Duration::from_secs(1)))
}

/// What the plan waits for while Karpenter terminates a NodeClaim, e.g. "Karpenter to terminate
/// NodeClaim default-x7k2p of node n1, deleting since 2026-12-01T14:02:03Z".
async fn nodeclaim_wait(client: &kube::Client, claim: &str, node: &str) -> String {
    let since = match nodeclaims(client).get_opt(claim).await {
        Ok(Some(c)) => c
            .metadata
            .deletion_timestamp
            .map(|t| format!(", deleting since {}", t.0))
            .unwrap_or_else(|| ", not deleting yet".into()),
        Ok(None) => ", NodeClaim gone".into(),
        Err(_) => String::new(),
    };
    format!("Karpenter to terminate NodeClaim {claim} of node {node}{since}")
}

/// TerminateInstanceInAutoScalingGroup, idempotent: a member already gone (a retried pass) is done.
async fn terminate_in_group(
    run: &PlanRun,
    id: &str,
    decrement: bool,
) -> Result<(), ControllerError> {
    let ec2 = run.ctx.ec2().await?;
    match ec2.terminate_in_auto_scaling_group(id, decrement).await {
        Ok(()) => Ok(()),
        // "Instance Id not found - No managed instance found": already terminated (or left the group).
        Err(CloudError::Api { code, .. }) if code == "ValidationError" => {
            match ec2.instance_state(id).await? {
                Some(s) if !s.is_gone() => Err(CloudError::InvalidRequest(format!(
                    "instance {id} is tagged with an Auto Scaling group that does not manage it; terminate it by hand or remove the aws:autoscaling:groupName tag"
                ))
                .into()),
                _ => Ok(()),
            }
        }
        Err(e) => Err(e.into()),
    }
}
