//! Reading what planning needs about a node from the API: the node, its pods, and the StatefulSets,
//! PVCs and PDBs of their namespaces (the "dereference" step; planning itself is pure).

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::controller::error::ControllerError;

/// Everything [`crate::planning::plan_node`] looks at for one node, owned.
pub struct NodeInventory {
    pub node: Node,
    pub pods: Vec<Pod>,
    pub stateful_sets: Vec<StatefulSet>,
    pub pvcs: Vec<PersistentVolumeClaim>,
    pub pdbs: Vec<PodDisruptionBudget>,
}

fn read_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ControllerError {
    let what = what.into();
    move |source| ControllerError::Read { what, source }
}

pub async fn get_node(client: &Client, name: &str) -> Result<Option<Node>, ControllerError> {
    Api::<Node>::all(client.clone())
        .get_opt(name)
        .await
        .map_err(read_err(format!("node {name}")))
}

pub async fn pods_on_node(client: &Client, node: &str) -> Result<Vec<Pod>, ControllerError> {
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    Ok(Api::<Pod>::all(client.clone())
        .list(&lp)
        .await
        .map_err(read_err(format!("pods on node {node}")))?
        .items)
}

/// The node and what its pods refer to; None when the node does not exist.
pub async fn node_inventory(
    client: &Client,
    name: &str,
) -> Result<Option<NodeInventory>, ControllerError> {
    let Some(node) = get_node(client, name).await? else {
        return Ok(None);
    };
    let pods = pods_on_node(client, name).await?;
    let namespaces: BTreeSet<String> = pods.iter().filter_map(|p| p.namespace()).collect();
    let mut stateful_sets = Vec::new();
    let mut pvcs = Vec::new();
    let mut pdbs = Vec::new();
    for ns in &namespaces {
        let lp = ListParams::default();
        stateful_sets.extend(
            Api::<StatefulSet>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .map_err(read_err(format!("StatefulSets in {ns}")))?
                .items,
        );
        pvcs.extend(
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .map_err(read_err(format!("PVCs in {ns}")))?
                .items,
        );
        pdbs.extend(
            Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .map_err(read_err(format!("PodDisruptionBudgets in {ns}")))?
                .items,
        );
    }
    Ok(Some(NodeInventory {
        node,
        pods,
        stateful_sets,
        pvcs,
        pdbs,
    }))
}

/// Names of the nodes a plan is about: `spec.nodes`, or the nodes matching `spec.nodeSelector` when the
/// plan was decided (kept in status from then on).
pub async fn select_nodes(
    client: &Client,
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> Result<Vec<String>, ControllerError> {
    let mut parts = Vec::new();
    for (k, v) in selector.match_labels.clone().unwrap_or_default() {
        parts.push(format!("{k}={v}"));
    }
    for e in selector.match_expressions.clone().unwrap_or_default() {
        let values = e.values.unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            _ => format!("!{}", e.key),
        });
    }
    let lp = ListParams::default().labels(&parts.join(","));
    let nodes = Api::<Node>::all(client.clone())
        .list(&lp)
        .await
        .map_err(read_err("nodes matching spec.nodeSelector"))?;
    Ok(nodes.items.iter().map(|n| n.name_any()).collect())
}
