//! Taints and cordons written through the API server as Cluster Autoscaler writes them
//! (`cluster-autoscaler/utils/taints/taints.go`: `AddTaints`, `CleanTaints`) and as
//! aws-node-termination-handler does (`pkg/node/node.go`: `addTaint`, `removeTaint`): GET the Node,
//! change `spec.taints`, PUT it back (an Update, which the audit log and admission see as a request),
//! and on a 409 conflict GET again every 750 ms for up to 5 s. A taint whose key is already there is
//! left as it is. Cordoning is kubectl drain's `RunCordonOrUncordon` (as NTH calls it): a strategic
//! merge patch of `spec.unschedulable`.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::time::Instant;

const CONFLICT_RETRY: Duration = Duration::from_millis(750);
const MAX_RETRY: Duration = Duration::from_secs(5);

/// Adds `taint` unless the node has a taint with its key; with `cordon`, also sets
/// `spec.unschedulable` (CA's `--cordon-node-before-terminating`). Whether the node changed.
pub async fn add(client: &Client, node: &str, taint: Taint, cordon: bool) -> kube::Result<bool> {
    update(client, node, |n| {
        let spec = n.spec.get_or_insert_with(Default::default);
        let taints = spec.taints.get_or_insert_with(Vec::new);
        if taints.iter().any(|t| t.key == taint.key) {
            return false;
        }
        taints.push(taint.clone());
        if cordon {
            spec.unschedulable = Some(true);
        }
        true
    })
    .await
}

/// Removes the taints with `keys`; with `uncordon`, also clears `spec.unschedulable`. Whether the node
/// changed.
pub async fn remove(
    client: &Client,
    node: &str,
    keys: &[&str],
    uncordon: bool,
) -> kube::Result<bool> {
    update(client, node, |n| {
        let spec = n.spec.get_or_insert_with(Default::default);
        let Some(taints) = spec.taints.as_mut() else {
            return false;
        };
        let before = taints.len();
        taints.retain(|t| !keys.contains(&t.key.as_str()));
        if taints.len() == before {
            return false;
        }
        if uncordon {
            spec.unschedulable = Some(false);
        }
        true
    })
    .await
}

/// Sets or clears `spec.unschedulable` with a strategic merge patch, as kubectl's CordonHelper does.
pub async fn cordon(client: &Client, node: &str, on: bool) -> kube::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    api.patch(
        node,
        &PatchParams::default(),
        &Patch::Strategic(json!({"spec": {"unschedulable": on}})),
    )
    .await
    .map(|_| ())
}

async fn update(
    client: &Client,
    node: &str,
    change: impl Fn(&mut Node) -> bool,
) -> kube::Result<bool> {
    let api: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + MAX_RETRY;
    loop {
        let mut n = api.get(node).await?;
        if !change(&mut n) {
            return Ok(false);
        }
        match api.replace(node, &PostParams::default(), &n).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 && Instant::now() < deadline => {
                tokio::time::sleep(CONFLICT_RETRY).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether the node carries a taint with `key`.
pub fn has(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key))
}
