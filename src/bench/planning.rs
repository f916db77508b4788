//! Planning cost: `planning::plan_node` on one node of the `scale-5k` inventory, with the inputs the
//! controller gives it (the node's pods, and the StatefulSets, PVCs and PDBs of their namespaces).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::report::Report;
use super::stats::Summary;
use snapdrain::api::DisruptionPlanSpec;
use snapdrain::planning::{Clock, NodeInputs, plan_node};
use snapdrain_sim::apiserver::resources::ResKey;
use snapdrain_sim::apiserver::store::{Store, meta_str};

const SECTION: &str = "planning";
/// Enough calls for a stable p99 without making the run long.
const ITERATIONS: usize = 2_000;
/// The node size DESIGN names.
const WANT_PODS: usize = 30;

fn typed<T: DeserializeOwned>(
    objs: impl IntoIterator<Item = Arc<Value>>,
) -> anyhow::Result<Vec<T>> {
    objs.into_iter()
        .map(|o| serde_json::from_value((*o).clone()).map_err(anyhow::Error::from))
        .collect()
}

fn is_stateful(pod: &Value) -> bool {
    pod.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|o| o.iter().any(|r| r["kind"] == "StatefulSet"))
}

pub fn run(store: &Store, report: &mut Report) -> anyhow::Result<()> {
    let (pods, _) = store.snapshot(&ResKey::core("pods"));
    let total_pods = pods.len();
    let mut by_node: HashMap<String, Vec<Arc<Value>>> = HashMap::new();
    for p in pods {
        if let Some(n) = p.pointer("/spec/nodeName").and_then(Value::as_str) {
            by_node.entry(n.to_string()).or_default().push(p.clone());
        }
    }
    // The node closest to 30 pods that runs StatefulSet pods (so planning has backups to work out);
    // ties go to the smallest name, so runs are comparable.
    let (node_name, node_pods) = by_node
        .into_iter()
        .filter(|(_, ps)| ps.iter().any(|p| is_stateful(p)))
        .min_by_key(|(n, ps)| (ps.len().abs_diff(WANT_PODS), n.clone()))
        .ok_or_else(|| anyhow!("no node runs StatefulSet pods"))?;
    let node_obj = store
        .get(&ResKey::core("nodes"), None, &node_name)
        .with_context(|| format!("node {node_name} vanished"))?;
    let node: Node = serde_json::from_value((*node_obj).clone())?;
    let namespaces: BTreeSet<String> = node_pods
        .iter()
        .filter_map(|p| meta_str(p, "namespace").map(str::to_string))
        .collect();
    let in_namespaces = |key: ResKey| {
        namespaces
            .iter()
            .flat_map(|ns| store.list(&key, Some(ns), &|_| true, None, None).items)
            .collect::<Vec<_>>()
    };
    let pods: Vec<Pod> = typed(node_pods)?;
    let stateful_sets: Vec<StatefulSet> =
        typed(in_namespaces(ResKey::new("apps", "statefulsets")))?;
    let pvcs: Vec<PersistentVolumeClaim> =
        typed(in_namespaces(ResKey::core("persistentvolumeclaims")))?;
    let pdbs: Vec<PodDisruptionBudget> =
        typed(in_namespaces(ResKey::new("policy", "poddisruptionbudgets")))?;
    let spec: DisruptionPlanSpec = serde_json::from_value(json!({"nodes": [node_name]}))?;
    let valid = snapdrain::api::validate(&spec).map_err(|p| {
        anyhow!(
            "the bench plan spec is invalid: {}",
            snapdrain::api::problems_message(&p)
        )
    })?;
    let inputs = NodeInputs {
        node: &node,
        pods: &pods,
        stateful_sets: &stateful_sets,
        pvcs: &pvcs,
        pdbs: &pdbs,
        pvs: &[],
        snapshot_classes: &[],
        existing_backups: &[],
        protects: &snapdrain::planning::protection::default_rule,
    };
    let now = Timestamp::now();
    let clock = Clock {
        decided_at: now,
        now,
    };
    let mut samples = Vec::with_capacity(ITERATIONS);
    let mut evictions = 0;
    let mut backups = 0;
    for _ in 0..ITERATIONS {
        let t = Instant::now();
        let plan = std::hint::black_box(plan_node(&inputs, &spec, &valid, clock));
        samples.push(t.elapsed());
        evictions = plan.evictions.len();
        backups = plan.backups.len();
    }
    let s = Summary::of(&samples).ok_or_else(|| anyhow!("no planning samples"))?;
    let note = format!(
        "node {node_name}: {} pods ({total_pods} in cluster), {} StatefulSets, {} PVCs, {} PDBs in its {} namespaces -> {evictions} evictions, {backups} backups",
        pods.len(),
        stateful_sets.len(),
        pvcs.len(),
        pdbs.len(),
        namespaces.len()
    );
    report.add_summary_ms(
        SECTION,
        "plan_node, one node of scale-5k",
        &s,
        Some(("p99", "< 5 ms")),
        Some(&note),
    );
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    report.add(SECTION, "plan_node mean", mean.as_secs_f64() * 1e3, "ms");
    Ok(())
}
