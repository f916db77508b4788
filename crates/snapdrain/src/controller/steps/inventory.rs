//! Reading what planning needs about a node: the node (from the API: "gone" is never concluded from a
//! cache), its pods, and the StatefulSets, PVCs and PDBs of their namespaces from the shared caches once
//! they are synced (the "dereference" step; planning itself is pure).

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::controller::cache::{Cache, CachedPvc, CachedStatefulSet, Caches, Stored};
use crate::controller::error::ControllerError;
use crate::planning::inventory::{pvc_claims, statefulset_owner};
use crate::planning::volumes::{
    DEFAULT_SNAPSHOT_CLASS_ANNOTATION, SnapshotClass, VELERO_SNAPSHOT_CLASS_LABEL,
};

/// Everything [`crate::planning::plan_node`] looks at for one node, owned.
pub struct NodeInventory {
    pub node: Node,
    pub pods: Vec<Pod>,
    pub stateful_sets: Vec<StatefulSet>,
    pub pvcs: Vec<PersistentVolumeClaim>,
    pub pdbs: Vec<PodDisruptionBudget>,
    /// The PVs bound to the claims the node's pods mount, once [`NodeInventory::read_volumes`] ran.
    pub pvs: Vec<PersistentVolume>,
    /// The cluster's VolumeSnapshotClasses, once [`NodeInventory::read_snapshot_classes`] ran.
    pub snapshot_classes: Vec<SnapshotClass>,
}

/// The DisruptionPolicy's protection (the default one until the policy is read), judged with the
/// namespaces' labels from the cache: what a plan backs up is what the holds and the gate keep.
pub fn policy_protects<'a>(
    policy: Option<&'a crate::api::DisruptionPolicySpec>,
    namespaces: &'a Cache<k8s_openapi::api::core::v1::Namespace>,
) -> impl Fn(&Pod) -> bool + Sync + 'a {
    move |pod: &Pod| match policy {
        Some(p) => crate::planning::protection::protects_or_more(
            &p.protection,
            pod,
            namespaces.labels_of(pod).as_ref(),
        ),
        None => crate::planning::protection::default_rule(pod),
    }
}

impl NodeInventory {
    /// What [`crate::planning::plan_node`] reads of this inventory, with the backups it may reuse.
    pub fn inputs<'a>(
        &'a self,
        existing_backups: &'a [crate::planning::ReusableBackup],
        protects: &'a (dyn Fn(&Pod) -> bool + Sync),
    ) -> crate::planning::NodeInputs<'a> {
        crate::planning::NodeInputs {
            node: &self.node,
            pods: &self.pods,
            stateful_sets: &self.stateful_sets,
            pvcs: &self.pvcs,
            pdbs: &self.pdbs,
            pvs: &self.pvs,
            snapshot_classes: &self.snapshot_classes,
            existing_backups,
            protects,
        }
    }

    /// Reads, one GET each, the PVs bound to the claims the node's pods mount, so planning can tell network
    /// volumes from node-local ones. A PV that is gone stays out (its volume classifies as unknown).
    pub async fn read_volumes(&mut self, client: &Client) -> Result<(), ControllerError> {
        let claimed: BTreeSet<(String, String)> = self
            .pods
            .iter()
            .flat_map(|p| {
                let ns = p.namespace().unwrap_or_default();
                crate::planning::inventory::pvc_claims(p)
                    .map(move |c| (ns.clone(), c.to_owned()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let names: BTreeSet<String> = self
            .pvcs
            .iter()
            .filter(|c| claimed.contains(&(c.namespace().unwrap_or_default(), c.name_any())))
            .filter_map(|c| c.spec.as_ref()?.volume_name.clone())
            .filter(|n| !n.is_empty())
            .collect();
        let api = Api::<PersistentVolume>::all(client.clone());
        for name in names {
            if let Some(pv) = api
                .get_opt(&name)
                .await
                .map_err(read_err(format!("PersistentVolume {name}")))?
            {
                self.pvs.push(pv);
            }
        }
        Ok(())
    }

    /// Lists the cluster's VolumeSnapshotClasses (`snapshot.storage.k8s.io/v1`); none when the
    /// external-snapshotter's CRDs are not installed.
    pub async fn read_snapshot_classes(&mut self, client: &Client) -> Result<(), ControllerError> {
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshotClass"),
            "volumesnapshotclasses",
        );
        let list = Api::<DynamicObject>::all_with(client.clone(), &ar)
            .list(&ListParams::default())
            .await;
        let items = match list {
            Ok(l) => l.items,
            Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
            Err(e) => return Err(read_err("VolumeSnapshotClasses")(e)),
        };
        self.snapshot_classes = items
            .iter()
            .map(|c| SnapshotClass {
                name: c.name_any(),
                driver: c
                    .data
                    .get("driver")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                velero_label: c.labels().contains_key(VELERO_SNAPSHOT_CLASS_LABEL),
                default: c
                    .annotations()
                    .get(DEFAULT_SNAPSHOT_CLASS_ANNOTATION)
                    .is_some_and(|v| v == "true"),
            })
            .collect();
        Ok(())
    }
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

/// The pods bound to `node`, from the synced cache.
pub fn pods_on_node(caches: &Caches, node: &str) -> Vec<Pod> {
    caches
        .pods
        .indexed(node)
        .iter()
        .map(|p| p.to_pod())
        .collect()
}

/// The objects `keys` name, each once, from `cache`; a name the cache does not hold stays out (planning
/// warns about it).
fn named<K: Stored + Clone>(cache: &Cache<K>, keys: BTreeSet<(&str, &str)>) -> Vec<K> {
    keys.into_iter()
        .filter_map(|(ns, name)| cache.get(ns, name))
        .map(|o| (*o).clone())
        .collect()
}

/// The node and what its pods refer to; None when the node does not exist. `caches` must be synced
/// ([`crate::controller::Context::synced_caches`]).
///
/// Only the StatefulSets owning the node's pods and the PVCs they mount are copied out of the caches,
/// as [`crate::planning::NodeInputs`] asks: copying every one of their namespaces' (tens of thousands
/// at scale-5k, on every pass) cost 40 MiB of short-lived memory per look, which the allocator kept.
pub async fn node_inventory(
    client: &Client,
    caches: &Caches,
    name: &str,
) -> Result<Option<NodeInventory>, ControllerError> {
    let Some(node) = get_node(client, name).await? else {
        return Ok(None);
    };
    let pods = pods_on_node(caches, name);
    let namespaces: BTreeSet<&str> = pods
        .iter()
        .filter_map(|p| p.metadata.namespace.as_deref())
        .collect();
    let owners = pods
        .iter()
        .filter_map(|p| Some((p.metadata.namespace.as_deref()?, statefulset_owner(p)?)))
        .collect();
    let claims = pods
        .iter()
        .filter_map(|p| Some((p.metadata.namespace.as_deref()?, p)))
        .flat_map(|(ns, p)| pvc_claims(p).map(move |c| (ns, c)))
        .collect();
    let stateful_sets = named(&caches.stateful_sets, owners)
        .iter()
        .map(CachedStatefulSet::to_stateful_set)
        .collect();
    let pvcs = named(&caches.pvcs, claims)
        .iter()
        .map(CachedPvc::to_pvc)
        .collect();
    let pdbs = namespaces
        .iter()
        .flat_map(|ns| caches.pdbs.indexed(ns))
        .map(|o| (*o).clone())
        .collect();
    Ok(Some(NodeInventory {
        node,
        pods,
        stateful_sets,
        pvcs,
        pdbs,
        pvs: Vec::new(),
        snapshot_classes: Vec::new(),
    }))
}

/// The same inventory read by listing through the API, for one-shot commands without caches
/// (`snapdrain plan NODE`): the pods by field selector, the rest per namespace.
pub async fn listed_inventory(
    client: &Client,
    name: &str,
) -> Result<Option<NodeInventory>, ControllerError> {
    let Some(node) = get_node(client, name).await? else {
        return Ok(None);
    };
    let lp = ListParams::default().fields(&format!("spec.nodeName={name}"));
    let pods = Api::<Pod>::all(client.clone())
        .list(&lp)
        .await
        .map_err(read_err(format!("pods on node {name}")))?
        .items;
    let namespaces: BTreeSet<String> = pods.iter().filter_map(|p| p.namespace()).collect();
    let mut inv = NodeInventory {
        node,
        pods,
        stateful_sets: Vec::new(),
        pvcs: Vec::new(),
        pdbs: Vec::new(),
        pvs: Vec::new(),
        snapshot_classes: Vec::new(),
    };
    let lp = ListParams::default();
    for ns in &namespaces {
        inv.stateful_sets.extend(
            Api::<StatefulSet>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .map_err(read_err(format!("StatefulSets in {ns}")))?
                .items,
        );
        inv.pvcs.extend(
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .map_err(read_err(format!("PVCs in {ns}")))?
                .items,
        );
        inv.pdbs.extend(
            Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .map_err(read_err(format!("PodDisruptionBudgets in {ns}")))?
                .items,
        );
    }
    Ok(Some(inv))
}

/// Names of the nodes a plan is about: `spec.nodes`, or the nodes matching `spec.nodeSelector` when the
/// plan was decided (kept in status from then on), from the synced Node cache, in name order.
/// snapdrain's own controller pods on `nodes`, as `namespace/name on node`: this replica's pod (named
/// by [`crate::controller::Settings::identity`] in its namespace) and the pods of its namespace that
/// share its `app.kubernetes.io/name` and `app.kubernetes.io/instance` labels (the other replicas).
/// None when this replica's pod is not in the cache (it runs outside the cluster).
pub fn controller_pods_on(
    caches: &Caches,
    settings: &crate::controller::Settings,
    nodes: &[String],
) -> Vec<String> {
    const KEYS: [&str; 2] = ["app.kubernetes.io/name", "app.kubernetes.io/instance"];
    let Some(own) = caches.pods.get(&settings.namespace, &settings.identity) else {
        return Vec::new();
    };
    let own = own.to_pod();
    let wanted: Vec<(&str, String)> = KEYS
        .iter()
        .filter_map(|k| Some((*k, own.labels().get(*k)?.clone())))
        .collect();
    let mut out = Vec::new();
    for node in nodes {
        for pod in caches.pods.indexed(node) {
            let pod = pod.to_pod();
            if pod.namespace().as_deref() != Some(settings.namespace.as_str()) {
                continue;
            }
            let sibling =
                !wanted.is_empty() && wanted.iter().all(|(k, v)| pod.labels().get(*k) == Some(v));
            if pod.name_any() == settings.identity || sibling {
                out.push(format!(
                    "{}/{} on {node}",
                    settings.namespace,
                    pod.name_any()
                ));
            }
        }
    }
    out.sort();
    out
}

pub fn select_nodes(
    caches: &Caches,
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> Result<Vec<String>, ControllerError> {
    use kube::core::{Selector, SelectorExt};
    let selector = Selector::try_from(selector.clone()).map_err(|e| {
        ControllerError::Config(format!(
            "spec.nodeSelector is not a valid label selector ({e}); fix it or list the nodes in spec.nodes"
        ))
    })?;
    let mut names: Vec<String> = caches
        .nodes
        .all()
        .iter()
        .filter(|n| selector.matches(n.labels()))
        .map(|n| n.name_any())
        .collect();
    names.sort();
    Ok(names)
}
