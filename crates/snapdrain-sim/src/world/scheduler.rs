//! The default scheduler, reduced to what matters for drains: it binds pending pods to Ready,
//! schedulable nodes whose free CPU, memory and pod slots fit the requests, whose NoSchedule/NoExecute
//! taints the pod tolerates, that match nodeSelector and required node affinity, and that lie in the
//! zone of the pod's bound volumes. Unbound claims are provisioned in the chosen node's zone before the
//! pod is bound (WaitForFirstConsumer, like the real VolumeBinding plugin's PreBind). Among the nodes
//! that fit it prefers the one with the fewest pods of the same owner, then the most free CPU, so
//! replicas spread. Like kube-scheduler in large clusters it stops looking once it has found
//! [`feasible_nodes_to_find`] nodes that fit, starting each search where the last one stopped.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::{Value, json};

use super::WorldContext;
use super::feed::{Change, Feed, ObjKey};
use super::objects::*;
use super::volumes;

/// What the pods bound to one node request.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Usage {
    pub cpu: i64,
    pub mem: i64,
    pub pods: i64,
}

impl Usage {
    /// Adds one pod's requests.
    pub(crate) fn add(&mut self, pod: &Value) {
        let (cpu, mem) = pod_requests(pod);
        self.cpu += cpu;
        self.mem += mem;
        self.pods += 1;
    }
}

/// What one bound pod takes from its node.
#[derive(Clone, PartialEq)]
struct Placement {
    node: String,
    cpu: i64,
    mem: i64,
    owner: Option<String>,
}

struct Scheduler {
    ctx: Arc<WorldContext>,
    usage: HashMap<String, Usage>,
    placed: HashMap<ObjKey, Placement>,
    owners_on_node: HashMap<(String, String), u32>,
    /// Pending pods in arrival order.
    queue: BTreeSet<(u64, ObjKey)>,
    queued: HashMap<ObjKey, u64>,
    seq: u64,
    /// The Unschedulable message last written per pod, to write only changes.
    reported: HashMap<ObjKey, String>,
    dirty: bool,
    /// Where the next search for feasible nodes starts (kube-scheduler's `nextStartNodeIndex`).
    next_start: usize,
}

/// K: kubernetes pkg/scheduler/schedule_one.go `numFeasibleNodesToFind` with the default
/// `percentageOfNodesToScore` (0, adaptive): every node below 100 nodes, else 50% minus 1% per 125
/// nodes, at least 5% and at least 100 nodes (500 of scale-5k's 5,000).
pub(crate) fn feasible_nodes_to_find(all: usize) -> usize {
    const MIN_NODES: usize = 100;
    const MIN_PERCENT: usize = 5;
    if all < MIN_NODES {
        return all;
    }
    let percent = 50usize.saturating_sub(all / 125).max(MIN_PERCENT);
    (all * percent / 100).max(MIN_NODES)
}

pub async fn run(ctx: Arc<WorldContext>) {
    let (mut node_feed, _) = Feed::open(&ctx.store, nodes());
    let (mut pod_feed, initial) = Feed::open(&ctx.store, pods());
    let mut s = Scheduler {
        ctx,
        usage: HashMap::new(),
        placed: HashMap::new(),
        owners_on_node: HashMap::new(),
        queue: BTreeSet::new(),
        queued: HashMap::new(),
        seq: 0,
        reported: HashMap::new(),
        dirty: true,
        next_start: 0,
    };
    for c in initial {
        s.on_pod(&c);
    }
    loop {
        s.schedule(&node_feed, &pod_feed);
        tokio::select! {
            changes = node_feed.recv() => { s.dirty |= !changes.is_empty(); }
            changes = pod_feed.recv() => { for c in changes { s.on_pod(&c); } }
        }
        // Take everything already waiting before scheduling again: bursts are handled in one pass.
        s.dirty |= !node_feed.try_recv().is_empty();
        for c in pod_feed.try_recv() {
            s.on_pod(&c);
        }
    }
}

fn wants_scheduling(pod: &Value) -> bool {
    node_name(pod).is_none()
        && !is_terminating(pod)
        && !is_terminal(pod)
        && str_at(pod, "/spec/schedulerName")
            .is_none_or(|n| n.is_empty() || n == "default-scheduler")
        && pod
            .pointer("/spec/schedulingGates")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
}

fn placement_of(pod: &Value) -> Option<Placement> {
    let node = node_name(pod)?;
    if is_terminal(pod) {
        return None;
    }
    let (cpu, mem) = pod_requests(pod);
    Some(Placement {
        node: node.to_string(),
        cpu,
        mem,
        owner: controller_of(pod).map(|(_, _, u)| u.to_string()),
    })
}

impl Scheduler {
    fn on_pod(&mut self, c: &Change) {
        let want = c.new.as_deref().and_then(placement_of);
        self.account(&c.key, want);
        match c.new.as_deref() {
            Some(pod) if wants_scheduling(pod) => {
                if !self.queued.contains_key(&c.key) {
                    self.seq += 1;
                    self.queue.insert((self.seq, c.key.clone()));
                    self.queued.insert(c.key.clone(), self.seq);
                    self.dirty = true;
                }
            }
            _ => {
                if let Some(seq) = self.queued.remove(&c.key) {
                    self.queue.remove(&(seq, c.key.clone()));
                }
                self.reported.remove(&c.key);
            }
        }
    }

    /// Brings the recorded usage of one pod to `want`; freed capacity makes pending pods worth retrying.
    fn account(&mut self, key: &ObjKey, want: Option<Placement>) {
        let have = self.placed.get(key).cloned();
        if have == want {
            return;
        }
        if let Some(p) = have {
            let u = self.usage.entry(p.node.clone()).or_default();
            u.cpu -= p.cpu;
            u.mem -= p.mem;
            u.pods -= 1;
            if let Some(o) = p.owner
                && let Some(n) = self.owners_on_node.get_mut(&(p.node.clone(), o.clone()))
            {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.owners_on_node.remove(&(p.node, o));
                }
            }
            self.placed.remove(key);
            self.dirty = true;
        }
        if let Some(p) = want {
            let u = self.usage.entry(p.node.clone()).or_default();
            u.cpu += p.cpu;
            u.mem += p.mem;
            u.pods += 1;
            if let Some(o) = &p.owner {
                *self
                    .owners_on_node
                    .entry((p.node.clone(), o.clone()))
                    .or_default() += 1;
            }
            self.placed.insert(key.clone(), p);
        }
    }

    fn schedule(&mut self, node_feed: &Feed, pod_feed: &Feed) {
        if !self.dirty || self.queue.is_empty() {
            self.dirty = false;
            return;
        }
        self.dirty = false;
        let mut node_list: Vec<&Arc<Value>> = node_feed.objects().collect();
        node_list.sort_by(|a, b| name(a).cmp(name(b)));
        let queue: Vec<(u64, ObjKey)> = self.queue.iter().cloned().collect();
        for (seq, key) in queue {
            let Some(pod) = pod_feed.get(&key).cloned() else {
                continue;
            };
            match self.pick(&pod, &node_list) {
                Ok(node) => {
                    if self.bind(&pod, node).is_ok() {
                        self.queue.remove(&(seq, key.clone()));
                        self.queued.remove(&key);
                        self.reported.remove(&key);
                        self.account(&key, placement_of(&with_node(&pod, name(node))));
                    }
                }
                Err(message) => self.report_unschedulable(&key, &pod, message),
            }
        }
    }

    fn pick<'a>(
        &mut self,
        pod: &Value,
        node_list: &[&'a Arc<Value>],
    ) -> Result<&'a Arc<Value>, String> {
        let (cpu, _) = pod_requests(pod);
        let owner = controller_of(pod).map(|(_, _, u)| u.to_string());
        let volume_terms = volume_constraints(&self.ctx, pod)?;
        let mut reasons: HashMap<String, usize> = HashMap::new();
        let mut best: Option<(&Arc<Value>, (i64, i64))> = None;
        let (all, want) = (node_list.len(), feasible_nodes_to_find(node_list.len()));
        let (mut feasible, mut processed) = (0, 0);
        let start = if all == 0 { 0 } else { self.next_start % all };
        for node in node_list[start..].iter().chain(&node_list[..start]) {
            if feasible >= want {
                break;
            }
            processed += 1;
            let used = self.usage.get(name(node)).copied().unwrap_or_default();
            if let Err(r) = fits(pod, node, used, &volume_terms) {
                *reasons.entry(r).or_default() += 1;
                continue;
            }
            feasible += 1;
            let a_cpu = node
                .pointer("/status/allocatable/cpu")
                .map_or(0, cpu_millis);
            let same_owner = owner
                .as_ref()
                .and_then(|o| {
                    self.owners_on_node
                        .get(&(name(node).to_string(), o.clone()))
                })
                .copied()
                .unwrap_or(0) as i64;
            let free_permille = if a_cpu > 0 {
                (a_cpu - used.cpu - cpu) * 1000 / a_cpu
            } else {
                0
            };
            let score = (-same_owner, free_permille);
            if best.as_ref().is_none_or(|(_, s)| score > *s) {
                best = Some((node, score));
            }
        }
        if all > 0 {
            self.next_start = (start + processed) % all;
        }
        if let Some((node, _)) = best {
            return Ok(node);
        }
        let mut parts: Vec<String> = reasons
            .into_iter()
            .map(|(r, n)| format!("{n} {r}"))
            .collect();
        parts.sort();
        Err(format!(
            "0/{} nodes are available: {}.",
            node_list.len(),
            if parts.is_empty() {
                "no nodes".to_string()
            } else {
                parts.join(", ")
            }
        ))
    }

    fn bind(&self, pod: &Value, node: &Value) -> Result<(), ()> {
        let ns = namespace(pod);
        let zone = label(node, "topology.kubernetes.io/zone").unwrap_or("");
        for claim in pod_claims(pod) {
            if let Some(pvc) = self.ctx.store.get(&pvcs(), Some(ns), claim)
                && str_at(&pvc, "/spec/volumeName").is_none_or(str::is_empty)
            {
                volumes::provision(&self.ctx, &pvc, zone, Some(name(node))).map_err(|e| {
                    tracing::warn!(claim, error = %e, "cannot provision a volume");
                })?;
            }
        }
        let node_name = name(node).to_string();
        modify_uid(
            &self.ctx.store,
            &pods(),
            Some(ns),
            name(pod),
            uid(pod),
            |p| {
                if node_name_of(p).is_some() || is_terminating(p) {
                    return false;
                }
                p["spec"]["nodeName"] = json!(node_name);
                set_condition(p, "PodScheduled", "True", "", "");
                true
            },
        )
        .map(|_| ())
        .ok_or(())
    }

    fn report_unschedulable(&mut self, key: &ObjKey, pod: &Value, message: String) {
        if self.reported.get(key) == Some(&message) {
            return;
        }
        self.reported.insert(key.clone(), message.clone());
        let _ = modify_uid(
            &self.ctx.store,
            &pods(),
            Some(namespace(pod)),
            name(pod),
            uid(pod),
            |p| {
                if node_name_of(p).is_some() {
                    return false;
                }
                set_condition(p, "PodScheduled", "False", "Unschedulable", &message);
                true
            },
        );
    }
}

/// For each bound claim of the pod, the node selector terms of its volume (one must match).
pub(crate) fn volume_constraints(
    ctx: &WorldContext,
    pod: &Value,
) -> Result<Vec<Vec<Value>>, String> {
    let ns = namespace(pod);
    let mut out = Vec::new();
    for claim in pod_claims(pod) {
        let Some(pvc) = ctx.store.get(&pvcs(), Some(ns), claim) else {
            return Err(format!("persistentvolumeclaim \"{claim}\" not found"));
        };
        if is_terminating(&pvc) {
            return Err(format!(
                "persistentvolumeclaim \"{claim}\" is being deleted"
            ));
        }
        let Some(pv_name) = str_at(&pvc, "/spec/volumeName").filter(|v| !v.is_empty()) else {
            continue;
        };
        let Some(pv) = ctx.store.get(&pvs(), None, pv_name) else {
            return Err(format!("persistentvolume \"{pv_name}\" not found"));
        };
        if let Some(terms) = pv
            .pointer("/spec/nodeAffinity/required/nodeSelectorTerms")
            .and_then(Value::as_array)
        {
            out.push(terms.clone());
        } else if let Some(zone) = label(&pv, "topology.kubernetes.io/zone") {
            out.push(vec![json!({"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}]})]);
        }
    }
    Ok(out)
}

/// Whether `pod` fits on `node`, which already carries `used`: readiness, cordon, taints, node
/// affinity, the zones of its bound volumes (`volume_terms`, from [`volume_constraints`]) and free
/// CPU, memory and pod slots. The error is the scheduler's per-node reason. Karpenter's consolidation
/// simulates rescheduling with it.
pub(crate) fn fits(
    pod: &Value,
    node: &Value,
    used: Usage,
    volume_terms: &[Vec<Value>],
) -> Result<(), String> {
    if !node_ready(node) || is_terminating(node) {
        return Err("node(s) were not ready".into());
    }
    let unschedulable_taint =
        json!({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"});
    if node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true)
        && !tolerates(pod.pointer("/spec/tolerations"), &unschedulable_taint)
    {
        return Err("node(s) were unschedulable".into());
    }
    if let Some(t) = untolerated_taint(pod, node) {
        let key = t.get("key").and_then(Value::as_str).unwrap_or("");
        let value = t.get("value").and_then(Value::as_str).unwrap_or("");
        return Err(format!("node(s) had untolerated taint {{{key}: {value}}}"));
    }
    if !node_affinity_allows(pod, node) {
        return Err("node(s) didn't match Pod's node affinity/selector".into());
    }
    if !volume_terms
        .iter()
        .all(|terms| terms.iter().any(|t| node_term_matches(t, node)))
    {
        return Err("node(s) had volume node affinity conflict".into());
    }
    let (cpu, mem) = pod_requests(pod);
    let alloc = node.pointer("/status/allocatable");
    let a_cpu = alloc.and_then(|a| a.get("cpu")).map_or(0, cpu_millis);
    let a_mem = alloc.and_then(|a| a.get("memory")).map_or(0, bytes);
    let a_pods = alloc.and_then(|a| a.get("pods")).map_or(110, |p| match p {
        Value::String(s) => s.parse().unwrap_or(110),
        other => other.as_i64().unwrap_or(110),
    });
    if used.pods + 1 > a_pods {
        return Err("Too many pods".into());
    }
    if used.cpu + cpu > a_cpu {
        return Err("Insufficient cpu".into());
    }
    if used.mem + mem > a_mem {
        return Err("Insufficient memory".into());
    }
    Ok(())
}

fn node_name_of(pod: &Value) -> Option<&str> {
    node_name(pod)
}

fn with_node(pod: &Value, node: &str) -> Value {
    let mut p = pod.clone();
    p["spec"]["nodeName"] = json!(node);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    // K: kubernetes pkg/scheduler/schedule_one.go numFeasibleNodesToFind (adaptive percentage).
    #[test]
    fn large_clusters_search_a_share_of_their_nodes() {
        assert_eq!(feasible_nodes_to_find(0), 0);
        assert_eq!(feasible_nodes_to_find(99), 99);
        assert_eq!(feasible_nodes_to_find(100), 100);
        assert_eq!(feasible_nodes_to_find(1000), 420);
        assert_eq!(feasible_nodes_to_find(5000), 500);
        assert_eq!(feasible_nodes_to_find(20_000), 1000);
    }
}
