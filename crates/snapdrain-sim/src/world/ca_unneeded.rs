//! Which nodes the simulated Cluster Autoscaler finds unneeded, and since when (kubernetes/autoscaler,
//! cluster-autoscaler). Pure: nodes and pods as the API server stores them in, verdicts out; the scan
//! loop that acts on them is [`super::ca_scale_down`].
//!
//! A node is unneeded when (`core/scaledown/eligibility/eligibility.go` `unremovableReasonAndNodeUtilization`,
//! then `simulator/cluster.go` `SimulateNodeRemoval`):
//!
//! - it is not being deleted (no `ToBeDeletedByClusterAutoscaler` taint, `IsNodeBeingDeleted`), not
//!   annotated `cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"` (`HasNoScaleDownAnnotation`)
//!   and belongs to a node group CA manages (`NodeGroupForNode`; see [`autoscaled`]);
//! - it is Ready (unready nodes have their own `--scale-down-unready-time`, not simulated);
//! - its utilisation, the larger of CPU and memory requests over allocatable
//!   (`simulator/utilization/info.go` `Calculate`, DaemonSet and mirror pods counted, as
//!   `--ignore-daemonsets-utilization` and `--ignore-mirror-pods-utilization` are false by default), is
//!   below `--scale-down-utilization-threshold` (`isNodeBelowUtilizationThreshold`: strictly below);
//! - no pod on it blocks the drain ([`drainability`], the rules of
//!   `simulator/drainability/rules/rules.go` `Default` that matter here), and every pod to move fits on
//!   another node (the sim scheduler's checks, volume zones included), counting what the nodes found
//!   unneeded before it in the same pass already moved there and never moving onto one of them
//!   (`FindNodesToRemove`).
//!
//! [`Unneeded`] keeps, per node, since when it has been unneeded (`core/scaledown/unneeded/nodes.go`
//! `Update`: a node that stays unneeded keeps its first time, one that is needed again is forgotten);
//! `RemovableAt` is [`Unneeded::removable`]: unneeded for longer than `--scale-down-unneeded-time`.
//!
//! Left out: the PDB rule (`rules/pdb`), kube-system pods without a PDB (`rules/system`), long-terminating
//! pods, the custom-controller replica count, node-group min sizes and resource limits, GPU and DRA
//! utilisation, `--scale-down-delay-after-add`, the unremovable-node recheck timeout, and the candidate
//! order CA's processors choose (here: by name).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::objects::{annotation, bytes, cpu_millis, is_terminal, label, node_ready, pod_requests};

pub const DELETION_CANDIDATE_TAINT: &str = "DeletionCandidateOfClusterAutoscaler";
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
pub const SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";
/// The label EKS managed node groups put on their nodes. The sim's nodes belong to no Auto Scaling
/// group, so this label stands for "in an ASG CA discovered" (`cloudprovider/aws` `NodeGroupForNode`).
pub const NODE_GROUP_LABEL: &str = "eks.amazonaws.com/nodegroup";

/// Why a node is not unneeded: CA's `simulator.UnremovableReason` names.
#[derive(Clone, Debug, PartialEq)]
pub enum Unremovable {
    CurrentlyBeingDeleted,
    ScaleDownDisabledAnnotation,
    NotAutoscaled,
    NotReady,
    /// The utilisation found (at or above the threshold).
    NotUnderutilized(f64),
    /// A pod whose drainability rule blocks the node: (`namespace/name`, the rule's reason).
    BlockedByPod(String, &'static str),
    /// A pod with nowhere to go, and why.
    NoPlaceToMovePods(String),
}

impl Unremovable {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::CurrentlyBeingDeleted => "CurrentlyBeingDeleted",
            Self::ScaleDownDisabledAnnotation => "ScaleDownDisabledAnnotation",
            Self::NotAutoscaled => "NotAutoscaled",
            Self::NotReady => "ScaleDownUnreadyDisabled",
            Self::NotUnderutilized(_) => "NotUnderutilized",
            Self::BlockedByPod(_, _) => "BlockedByPod",
            Self::NoPlaceToMovePods(_) => "NoPlaceToMovePods",
        }
    }
}

/// What a drainability rule says of one pod (`simulator/drainability/status.go` outcomes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drain {
    /// Not moved and not in the way (mirror, DaemonSet, finished pods).
    Skip,
    /// Must be rescheduled elsewhere.
    Move,
    /// Keeps the node, with the rule's reason (`drain.BlockingPodReason`).
    Block(&'static str),
}

fn owner_kinds(pod: &Value) -> impl Iterator<Item = (&str, bool)> {
    pod.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r.get("kind").and_then(Value::as_str).unwrap_or(""),
                r.get("controller").and_then(Value::as_bool) == Some(true),
            )
        })
}

/// The drainability rules in `rules.go` `Default` order, those that matter here: `mirror` (skip),
/// `daemonset` (skip), `safetoevict` (`safe-to-evict: "true"` moves the pod, whatever follows),
/// `terminal` (skip), `replicated` (a pod no ReplicationController, Job, ReplicaSet or StatefulSet
/// controls blocks: `NotReplicated`; a custom controller's pod too, e.g. Velero 1.17's PodVolumeBackup
/// hosting pod, so a file-system backup running on a node keeps CA off it), `notsafetoevict`
/// (`safe-to-evict: "false"` blocks: `NotSafeToEvictAnnotation`), `localstorage` (an emptyDir or hostPath
/// volume blocks, as `--skip-nodes-with-local-storage` is true by default: `LocalStorageRequested`).
pub fn drainability(pod: &Value) -> Drain {
    if annotation(pod, "kubernetes.io/config.mirror").is_some() {
        return Drain::Skip;
    }
    if owner_kinds(pod).any(|(k, c)| k == "DaemonSet" && c) {
        return Drain::Skip;
    }
    if annotation(pod, SAFE_TO_EVICT) == Some("true") {
        return Drain::Move;
    }
    if is_terminal(pod) {
        return Drain::Skip;
    }
    // `replicated/rule.go` under `--skip-nodes-with-custom-controller-pods` (true by default): only
    // these controllers' pods count as replicated (`replicatedKind`).
    let replicated = owner_kinds(pod).any(|(kind, controller)| {
        controller
            && matches!(
                kind,
                "ReplicationController" | "Job" | "ReplicaSet" | "StatefulSet"
            )
    });
    if !replicated {
        return Drain::Block("NotReplicated");
    }
    if annotation(pod, SAFE_TO_EVICT) == Some("false") {
        return Drain::Block("NotSafeToEvictAnnotation");
    }
    let local = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|v| v.get("emptyDir").is_some() || v.get("hostPath").is_some());
    if local {
        return Drain::Block("LocalStorageRequested");
    }
    Drain::Move
}

/// `utilization.Calculate`: the larger of the CPU and memory requests of the node's pods (finished
/// ones left out) over its allocatable; 1 when the node reports no allocatable (CA skips such a node
/// with an error).
pub fn utilization(node: &Value, pods: &[&Value]) -> f64 {
    let alloc = node.pointer("/status/allocatable");
    let a_cpu = alloc.and_then(|a| a.get("cpu")).map_or(0, cpu_millis);
    let a_mem = alloc.and_then(|a| a.get("memory")).map_or(0, bytes);
    if a_cpu <= 0 || a_mem <= 0 {
        return 1.0;
    }
    let (cpu, mem) = pods
        .iter()
        .filter(|p| !is_terminal(p))
        .map(|p| pod_requests(p))
        .fold((0, 0), |(c, m), (pc, pm)| (c + pc, m + pm));
    (cpu as f64 / a_cpu as f64).max(mem as f64 / a_mem as f64)
}

fn has_taint(node: &Value, key: &str) -> bool {
    node.pointer("/spec/taints")
        .and_then(Value::as_array)
        .is_some_and(|ts| ts.iter().any(|t| t["key"] == key))
}

/// Whether CA manages the node: it has an EC2 providerID and carries [`NODE_GROUP_LABEL`] (Karpenter's
/// nodes, launched outside any Auto Scaling group, never do).
pub fn autoscaled(node: &Value) -> bool {
    let instance = node
        .pointer("/spec/providerID")
        .and_then(Value::as_str)
        .and_then(|p| p.rsplit('/').next())
        .is_some_and(|id| id.starts_with("i-"));
    instance && label(node, NODE_GROUP_LABEL).is_some()
}

/// The node's own refusals and its pods' drainability (everything but the rescheduling): the pods that
/// would have to move, or why the node stays.
pub fn candidate<'a>(
    node: &Value,
    pods: &[&'a Value],
    threshold: f64,
) -> Result<Vec<&'a Value>, Unremovable> {
    if has_taint(node, TO_BE_DELETED_TAINT) {
        return Err(Unremovable::CurrentlyBeingDeleted);
    }
    if annotation(node, SCALE_DOWN_DISABLED) == Some("true") {
        return Err(Unremovable::ScaleDownDisabledAnnotation);
    }
    if !autoscaled(node) {
        return Err(Unremovable::NotAutoscaled);
    }
    if !node_ready(node) {
        return Err(Unremovable::NotReady);
    }
    let u = utilization(node, pods);
    if u >= threshold {
        return Err(Unremovable::NotUnderutilized(u));
    }
    let mut to_move = Vec::new();
    for p in pods {
        match drainability(p) {
            Drain::Skip => {}
            Drain::Move => to_move.push(*p),
            Drain::Block(reason) => {
                let key = format!(
                    "{}/{}",
                    super::objects::namespace(p),
                    super::objects::name(p)
                );
                return Err(Unremovable::BlockedByPod(key, reason));
            }
        }
    }
    Ok(to_move)
}

/// Since when each node has been unneeded (`unneeded/nodes.go` `Nodes`).
#[derive(Debug, Default)]
pub struct Unneeded {
    since: BTreeMap<String, Instant>,
}

impl Unneeded {
    /// This scan's unneeded nodes: those already known keep their time, new ones start at `now`, the
    /// rest are forgotten (`Update`).
    pub fn update<'a>(&mut self, names: impl IntoIterator<Item = &'a str>, now: Instant) {
        let mut next = BTreeMap::new();
        for n in names {
            let since = self.since.get(n).copied().unwrap_or(now);
            next.insert(n.to_string(), since);
        }
        self.since = next;
    }

    pub fn contains(&self, node: &str) -> bool {
        self.since.contains_key(node)
    }

    /// The nodes unneeded for longer than `unneeded_time` at `now` (`RemovableAt`: `since + unneeded time`
    /// strictly before now), by name.
    pub fn removable(&self, now: Instant, unneeded_time: Duration) -> Vec<String> {
        self.since
            .iter()
            .filter(|(_, since)| **since + unneeded_time < now)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Forgets a node (deleted, or its scale-down started).
    pub fn drop_node(&mut self, node: &str) {
        self.since.remove(node);
    }
}

/// Groups pods by the node they are bound to.
pub fn by_node(pods: &[std::sync::Arc<Value>]) -> HashMap<String, Vec<std::sync::Arc<Value>>> {
    let mut out: HashMap<String, Vec<std::sync::Arc<Value>>> = HashMap::new();
    for p in pods {
        if let Some(n) = super::objects::node_name(p) {
            out.entry(n.to_string()).or_default().push(p.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(annotations: Value, labels: Value, taints: Value) -> Value {
        json!({"metadata": {"name": "ng-a", "annotations": annotations, "labels": labels},
            "spec": {"providerID": "aws:///us-east-1a/i-0123456789abcdef0", "taints": taints},
            "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]}})
    }

    fn managed() -> Value {
        node(json!({}), json!({NODE_GROUP_LABEL: "workers"}), json!([]))
    }

    fn pod(
        cpu: &str,
        memory: &str,
        owner: Option<&str>,
        annotations: Value,
        volumes: Value,
    ) -> Value {
        let owners = owner.map_or(
            json!([]),
            |k| json!([{"kind": k, "name": "o", "uid": "u", "controller": true}]),
        );
        json!({"metadata": {"name": "p", "namespace": "shop", "ownerReferences": owners,
                "annotations": annotations},
            "spec": {"nodeName": "ng-a", "volumes": volumes, "containers": [{"name": "c",
                "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
            "status": {"phase": "Running"}})
    }

    fn sts(cpu: &str) -> Value {
        pod(cpu, "1Gi", Some("StatefulSet"), json!({}), json!([]))
    }

    #[test]
    fn utilisation_is_the_larger_of_cpu_and_memory_requests_over_allocatable() {
        let n = managed();
        let a = sts("1");
        let b = pod("500m", "6Gi", Some("ReplicaSet"), json!({}), json!([]));
        // CPU 1.5/4 = 0.375, memory 7/16 = 0.4375.
        assert!((utilization(&n, &[&a, &b]) - 0.4375).abs() < 1e-9);
        let mut done = sts("3");
        done["status"]["phase"] = json!("Succeeded");
        assert!((utilization(&n, &[&a, &done]) - 0.25).abs() < 1e-9);
        // Strictly below the threshold: exactly at it keeps the node.
        let half = sts("2");
        assert_eq!(
            candidate(&n, &[&half], 0.5),
            Err(Unremovable::NotUnderutilized(0.5))
        );
        assert_eq!(candidate(&n, &[&a], 0.5).map(|m| m.len()), Ok(1));
    }

    #[test]
    fn safe_to_evict_false_blocks_and_true_lets_even_a_bare_pod_move() {
        let n = managed();
        let held = pod(
            "100m",
            "1Gi",
            Some("StatefulSet"),
            json!({SAFE_TO_EVICT: "false"}),
            json!([]),
        );
        assert_eq!(
            drainability(&held),
            Drain::Block("NotSafeToEvictAnnotation")
        );
        assert_eq!(
            candidate(&n, &[&sts("100m"), &held], 0.5),
            Err(Unremovable::BlockedByPod(
                "shop/p".into(),
                "NotSafeToEvictAnnotation"
            ))
        );
        let bare = pod("100m", "1Gi", None, json!({}), json!([]));
        assert_eq!(drainability(&bare), Drain::Block("NotReplicated"));
        let custom = pod("100m", "1Gi", Some("PodVolumeBackup"), json!({}), json!([]));
        assert_eq!(drainability(&custom), Drain::Block("NotReplicated"));
        let bare_allowed = pod(
            "100m",
            "1Gi",
            None,
            json!({SAFE_TO_EVICT: "true"}),
            json!([]),
        );
        assert_eq!(drainability(&bare_allowed), Drain::Move);
        let scratch = pod(
            "100m",
            "1Gi",
            Some("ReplicaSet"),
            json!({}),
            json!([{"name": "tmp", "emptyDir": {}}]),
        );
        assert_eq!(
            drainability(&scratch),
            Drain::Block("LocalStorageRequested")
        );
        let with_pvc = pod(
            "100m",
            "1Gi",
            Some("StatefulSet"),
            json!({}),
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data-p"}}]),
        );
        assert_eq!(drainability(&with_pvc), Drain::Move);
    }

    #[test]
    fn daemonset_and_mirror_pods_neither_move_nor_block() {
        let ds = pod(
            "100m",
            "1Gi",
            Some("DaemonSet"),
            json!({}),
            json!([{"name": "h", "hostPath": {}}]),
        );
        assert_eq!(drainability(&ds), Drain::Skip);
        let mirror = pod(
            "100m",
            "1Gi",
            None,
            json!({"kubernetes.io/config.mirror": "x"}),
            json!([]),
        );
        assert_eq!(drainability(&mirror), Drain::Skip);
        assert_eq!(candidate(&managed(), &[&ds, &mirror], 0.5), Ok(vec![]));
    }

    #[test]
    fn only_ready_nodes_of_a_node_group_not_already_going_are_candidates() {
        let karpenter = node(
            json!({}),
            json!({"karpenter.sh/nodepool": "default"}),
            json!([]),
        );
        assert_eq!(
            candidate(&karpenter, &[], 0.5),
            Err(Unremovable::NotAutoscaled)
        );
        let disabled = node(
            json!({SCALE_DOWN_DISABLED: "true"}),
            json!({NODE_GROUP_LABEL: "workers"}),
            json!([]),
        );
        assert_eq!(
            candidate(&disabled, &[], 0.5),
            Err(Unremovable::ScaleDownDisabledAnnotation)
        );
        let going = node(
            json!({}),
            json!({NODE_GROUP_LABEL: "workers"}),
            json!([{"key": TO_BE_DELETED_TAINT, "value": "1", "effect": "NoSchedule"}]),
        );
        assert_eq!(
            candidate(&going, &[], 0.5),
            Err(Unremovable::CurrentlyBeingDeleted)
        );
        let mut unready = managed();
        unready["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
        assert_eq!(candidate(&unready, &[], 0.5), Err(Unremovable::NotReady));
        let mut no_instance = managed();
        no_instance["spec"]["providerID"] = json!("kind://docker/x");
        assert_eq!(
            candidate(&no_instance, &[], 0.5),
            Err(Unremovable::NotAutoscaled)
        );
    }

    #[test]
    fn a_node_is_removable_once_unneeded_for_longer_than_the_unneeded_time() {
        let t0 = Instant::now();
        let unneeded_time = Duration::from_secs(600);
        let mut u = Unneeded::default();
        u.update(["a", "b"], t0);
        assert!(
            u.removable(t0 + unneeded_time, unneeded_time).is_empty(),
            "not yet: strictly after"
        );
        // `a` stays unneeded and keeps its first time; `b` was needed for a scan and starts over.
        u.update(["a"], t0 + Duration::from_secs(300));
        u.update(["a", "b"], t0 + Duration::from_secs(400));
        let later = t0 + unneeded_time + Duration::from_secs(1);
        assert_eq!(u.removable(later, unneeded_time), vec!["a".to_string()]);
        assert!(u.contains("b"));
        u.drop_node("a");
        assert!(!u.contains("a"));
        assert_eq!(
            u.removable(t0 + Duration::from_secs(1001), unneeded_time),
            vec!["b".to_string()]
        );
    }
}
