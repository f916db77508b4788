//! What the demo is about to do: which node, which of its pods are protected (StatefulSet pods with
//! volumes) and which PVCs get backed up, which other pods are simply evicted. Read once from the cluster,
//! then decided by pure functions.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use snapdrain::planning::inventory::{
    ProtectionRule, controller_of, is_daemonset_pod, is_mirror, pvc_claims, statefulset_owner,
};
use snapdrain_testkit::safety::protected_pods;

/// The cluster as listed before the plan.
pub struct ClusterView {
    pub nodes: Vec<Node>,
    pub pods: Vec<Pod>,
    pub pvcs: Vec<PersistentVolumeClaim>,
}

impl ClusterView {
    pub async fn load(client: &Client) -> anyhow::Result<Self> {
        let lp = ListParams::default();
        let nodes = Api::<Node>::all(client.clone())
            .list(&lp)
            .await
            .context("cannot list nodes")?
            .items;
        let pods = Api::<Pod>::all(client.clone())
            .list(&lp)
            .await
            .context("cannot list pods")?
            .items;
        let pvcs = Api::<PersistentVolumeClaim>::all(client.clone())
            .list(&lp)
            .await
            .context("cannot list PVCs")?
            .items;
        Ok(Self { nodes, pods, pvcs })
    }

    /// Every protected pod in the cluster with its PVCs, for the safety check.
    pub fn protected(&self) -> BTreeMap<String, BTreeSet<String>> {
        let pods: Vec<serde_json::Value> = self
            .pods
            .iter()
            .filter_map(|p| serde_json::to_value(p).ok())
            .collect();
        protected_pods(&pods)
    }

    fn pods_on<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Pod> + 'a {
        self.pods
            .iter()
            .filter(move |p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
    }
}

/// The node to disrupt: the one asked for, or the node running the most protected pods (ties by name,
/// so the demo is repeatable).
pub fn pick_node(view: &ClusterView, wanted: Option<&str>) -> anyhow::Result<String> {
    if let Some(name) = wanted {
        if view.nodes.iter().any(|n| n.name_any() == name) {
            return Ok(name.to_string());
        }
        let names: Vec<String> = view.nodes.iter().map(|n| n.name_any()).collect();
        bail!(
            "there is no node {name} in the simulated cluster; pick one of: {}",
            names.join(", ")
        );
    }
    let rule = ProtectionRule::default();
    let best = view
        .nodes
        .iter()
        .map(|n| {
            let name = n.name_any();
            let count = view.pods_on(&name).filter(|p| rule.protects(p)).count();
            (count, name)
        })
        .filter(|(count, _)| *count > 0)
        // Most protected pods first; among equals the smallest name.
        .min_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    match best {
        Some((_, name)) => Ok(name),
        None => bail!(
            "no node runs a StatefulSet pod with a volume, so there is nothing to protect; use a scenario with StatefulSets (e.g. quickstart) or pass --node"
        ),
    }
}

/// A protected pod and the volumes its backup must cover.
#[derive(Clone, Debug, PartialEq)]
pub struct ProtectedPod {
    /// `namespace/name`.
    pub pod: String,
    pub stateful_set: String,
    /// `(claim, requested size)`.
    pub pvcs: Vec<(String, String)>,
}

/// Another pod on the node and what happens to it.
#[derive(Clone, Debug, PartialEq)]
pub struct OtherPod {
    pub pod: String,
    /// The controlling owner's kind (Deployment pods show their ReplicaSet), or `bare`.
    pub owner: String,
    /// True when the drain evicts it (DaemonSet and mirror pods stay, as with `kubectl drain`).
    pub evicted: bool,
}

/// The node and its pods, as the demo shows them before submitting the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    pub name: String,
    pub instance_type: Option<String>,
    pub zone: Option<String>,
    /// From `spec.providerID` (`aws:///<zone>/<id>`).
    pub instance_id: Option<String>,
    /// The Karpenter NodeClaim owning the node, when there is one.
    pub node_claim: Option<String>,
    pub protected: Vec<ProtectedPod>,
    pub others: Vec<OtherPod>,
}

pub fn node_view(view: &ClusterView, name: &str) -> NodeView {
    let node = view.nodes.iter().find(|n| n.name_any() == name);
    let label = |key: &str| node.and_then(|n| n.labels().get(key).cloned());
    let instance_id = node
        .and_then(|n| n.spec.as_ref())
        .and_then(|s| s.provider_id.as_deref())
        .and_then(|p| p.rsplit('/').next())
        .filter(|id| id.starts_with("i-"))
        .map(str::to_string);
    let node_claim = node.and_then(|n| {
        n.owner_references()
            .iter()
            .find(|o| o.kind == "NodeClaim")
            .map(|o| o.name.clone())
    });
    let rule = ProtectionRule::default();
    let mut protected = Vec::new();
    let mut others = Vec::new();
    for pod in view.pods_on(name) {
        let ns = pod.namespace().unwrap_or_default();
        let key = format!("{ns}/{}", pod.name_any());
        if rule.protects(pod) {
            let pvcs = pvc_claims(pod)
                .map(|claim| (claim.to_string(), claim_size(view, &ns, claim)))
                .collect();
            protected.push(ProtectedPod {
                pod: key,
                stateful_set: statefulset_owner(pod).unwrap_or_default().to_string(),
                pvcs,
            });
        } else {
            others.push(OtherPod {
                pod: key,
                owner: controller_of(pod)
                    .map(|o| o.kind.clone())
                    .unwrap_or_else(|| "bare".into()),
                evicted: !is_daemonset_pod(pod) && !is_mirror(pod),
            });
        }
    }
    protected.sort_by(|a, b| a.pod.cmp(&b.pod));
    others.sort_by(|a, b| a.pod.cmp(&b.pod));
    NodeView {
        name: name.to_string(),
        instance_type: label("node.kubernetes.io/instance-type"),
        zone: label("topology.kubernetes.io/zone"),
        instance_id,
        node_claim,
        protected,
        others,
    }
}

fn claim_size(view: &ClusterView, ns: &str, claim: &str) -> String {
    view.pvcs
        .iter()
        .find(|c| c.namespace().as_deref() == Some(ns) && c.name_any() == claim)
        .and_then(|c| {
            let capacity = c.status.as_ref().and_then(|s| s.capacity.as_ref());
            let requests = c
                .spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref());
            capacity
                .and_then(|m| m.get("storage"))
                .or_else(|| requests.and_then(|m| m.get("storage")))
                .map(|q| q.0.clone())
        })
        .unwrap_or_else(|| "?".into())
}

/// The lines describing the node and what will happen to each pod.
pub fn describe(view: &NodeView) -> Vec<String> {
    let mut lines = Vec::new();
    let mut what = vec![
        view.instance_type.clone().unwrap_or_else(|| "?".into()),
        view.zone.clone().unwrap_or_else(|| "?".into()),
    ];
    if let Some(id) = &view.instance_id {
        what.push(format!("instance {id}"));
    }
    if let Some(claim) = &view.node_claim {
        what.push(format!("Karpenter NodeClaim {claim}"));
    }
    lines.push(format!("Node {} ({})", view.name, what.join(", ")));
    if view.protected.is_empty() {
        lines.push("  protected pods: none (no backup is needed)".into());
    } else {
        lines.push(format!(
            "  protected pods ({}), backed up and verified before any of them is evicted:",
            view.protected.len()
        ));
        for p in &view.protected {
            let pvcs: Vec<String> = p.pvcs.iter().map(|(c, s)| format!("{c} ({s})")).collect();
            lines.push(format!(
                "    {:<34} StatefulSet {:<12} PVC {}",
                p.pod,
                p.stateful_set,
                pvcs.join(", ")
            ));
        }
    }
    if view.others.is_empty() {
        lines.push("  other pods: none".into());
    } else {
        lines.push(format!("  other pods ({}):", view.others.len()));
        for p in &view.others {
            let fate = if p.evicted { "evicted" } else { "stays" };
            lines.push(format!("    {:<34} {:<12} {fate}", p.pod, p.owner));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use snapdrain::planning::inventory::fixtures::{deploy_pod, node, sts_pod, with};

    fn on(pod: Pod, node: &str) -> Pod {
        with(pod, json!({"spec": {"nodeName": node}}))
    }

    fn view() -> ClusterView {
        ClusterView {
            nodes: vec![node("n-a"), node("n-b"), node("n-c")],
            pods: vec![
                on(sts_pod("db", "pg", 0, &["data"]), "n-b"),
                on(sts_pod("db", "pg", 1, &["data"]), "n-c"),
                on(sts_pod("db", "redis", 0, &["data"]), "n-c"),
                on(deploy_pod("db", "web-1"), "n-a"),
                on(deploy_pod("db", "web-2"), "n-c"),
            ],
            pvcs: Vec::new(),
        }
    }

    #[test]
    fn picks_the_node_with_most_protected_pods_or_the_one_asked_for() {
        let v = view();
        assert_eq!(pick_node(&v, None).ok().as_deref(), Some("n-c"));
        assert_eq!(pick_node(&v, Some("n-a")).ok().as_deref(), Some("n-a"));
        let err = pick_node(&v, Some("nope")).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("n-a, n-b, n-c")));
    }

    #[test]
    fn describes_protected_and_other_pods() {
        let nv = node_view(&view(), "n-c");
        assert_eq!(nv.protected.len(), 2);
        assert_eq!(nv.protected[0].pod, "db/pg-1");
        assert_eq!(nv.protected[0].pvcs, vec![("data-pg-1".into(), "?".into())]);
        assert_eq!(nv.others.len(), 1);
        assert!(nv.others[0].evicted);
        let text = describe(&nv).join("\n");
        assert!(text.contains("protected pods (2)") && text.contains("db/web-2"));
    }
}
