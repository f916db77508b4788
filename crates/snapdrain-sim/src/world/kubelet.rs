//! What the kubelets of all nodes do, plus the node-side half of the node lifecycle:
//! - a pod bound to a Ready node starts (Running and Ready) after `timings.pod_start`;
//! - a terminating pod stops after min(its grace period, `timings.pod_stop`) and is removed;
//! - a pod annotated `sim.snapdrain.io/run-for-ms` (Job pods) succeeds that long after it started;
//! - a node without a Ready condition gets one (and default capacity), as a registering kubelet reports;
//! - a node that goes NotReady has its pods marked not Ready (the node lifecycle controller's
//!   MarkPodsNotReady); the NoExecute eviction after 5 minutes is not simulated;
//! - a deleted node's pods are set Failed with a `DisruptionTarget` condition and force-deleted, as the
//!   pod garbage collector does for pods bound to nodes that no longer exist.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::task::JoinSet;

use super::WorldContext;
use super::feed::{Change, Feed, ObjKey};
use super::objects::*;

/// Job pods (or any pod) with this annotation succeed this many milliseconds after starting.
pub const RUN_FOR_MS: &str = "sim.snapdrain.io/run-for-ms";

struct NodeState {
    ready: bool,
    ip: String,
}

struct Kubelet {
    ctx: Arc<WorldContext>,
    nodes: HashMap<String, NodeState>,
    by_node: HashMap<String, HashSet<ObjKey>>,
    /// Pod uids with a start, stop, finish or removal under way, so each happens once.
    starting: HashSet<String>,
    stopping: HashSet<String>,
    finishing: HashSet<String>,
    failing: HashSet<String>,
    timers: JoinSet<()>,
    next_ip: u32,
}

pub async fn run(ctx: Arc<WorldContext>) {
    let (mut node_feed, initial_nodes) = Feed::open(&ctx.store, nodes());
    let (mut pod_feed, initial_pods) = Feed::open(&ctx.store, pods());
    let mut k = Kubelet {
        ctx,
        nodes: HashMap::new(),
        by_node: HashMap::new(),
        starting: HashSet::new(),
        stopping: HashSet::new(),
        finishing: HashSet::new(),
        failing: HashSet::new(),
        timers: JoinSet::new(),
        next_ip: 0,
    };
    for c in initial_pods {
        k.index_pod(&c);
    }
    for c in initial_nodes {
        k.on_node(c, &pod_feed);
    }
    let keys: Vec<ObjKey> = pod_feed
        .objects()
        .map(|p| super::feed::obj_key(p))
        .collect();
    for key in keys {
        if let Some(p) = pod_feed.get(&key).cloned() {
            k.sync_pod(&p);
        }
    }
    loop {
        tokio::select! {
            changes = node_feed.recv() => {
                for c in changes { k.on_node(c, &pod_feed); }
            }
            changes = pod_feed.recv() => {
                for c in changes { k.on_pod(c); }
            }
            Some(_) = k.timers.join_next(), if !k.timers.is_empty() => {}
        }
    }
}

impl Kubelet {
    fn index_pod(&mut self, c: &Change) {
        let old_node = c.old.as_deref().and_then(node_name);
        let new_node = c.new.as_deref().and_then(node_name);
        if old_node != new_node
            && let Some(n) = old_node
            && let Some(set) = self.by_node.get_mut(n)
        {
            set.remove(&c.key);
            if set.is_empty() {
                self.by_node.remove(n);
            }
        }
        if let Some(n) = new_node {
            self.by_node
                .entry(n.to_string())
                .or_default()
                .insert(c.key.clone());
        }
    }

    fn on_pod(&mut self, c: Change) {
        self.index_pod(&c);
        match &c.new {
            Some(pod) => self.sync_pod(pod),
            None => {
                if let Some(old) = &c.old {
                    let u = uid(old);
                    self.starting.remove(u);
                    self.stopping.remove(u);
                    self.finishing.remove(u);
                    self.failing.remove(u);
                    self.ctx.audit.world(
                        "deleted",
                        "pods",
                        Some(namespace(old)),
                        Some(name(old)),
                        json!({"uid": u, "node": node_name(old), "claims": pod_claims(old), "phase": phase(old)}),
                    );
                }
            }
        }
    }

    fn sync_pod(&mut self, pod: &Arc<Value>) {
        let u = uid(pod).to_string();
        if is_terminating(pod) {
            if node_name(pod).is_some() && self.stopping.insert(u.clone()) {
                self.stop_later(pod, u);
            }
            return;
        }
        let Some(node) = node_name(pod) else {
            return;
        };
        if is_terminal(pod) {
            return;
        }
        match self.nodes.get(node) {
            None => {
                // Our node feed may simply lag behind the pod feed: only the store can say it is gone.
                if self.ctx.store.get(&nodes(), None, node).is_none() && self.failing.insert(u) {
                    fail_and_remove(&self.ctx, pod, node);
                }
            }
            Some(state) if !state.ready => {}
            Some(state) => {
                let ip = state.ip.clone();
                match phase(pod) {
                    "Pending" if self.starting.insert(u.clone()) => self.start_later(pod, ip),
                    "Running" => {
                        if let Some(ms) = annotation(pod, RUN_FOR_MS).and_then(|v| v.parse().ok())
                            && self.finishing.insert(u)
                        {
                            self.finish_later(pod, ms);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn start_later(&mut self, pod: &Value, host_ip: String) {
        let ctx = self.ctx.clone();
        let (ns, pod_name, u) = (
            namespace(pod).to_string(),
            name(pod).to_string(),
            uid(pod).to_string(),
        );
        self.next_ip += 1;
        let pod_ip = format!(
            "10.{}.{}.{}",
            64 + (self.next_ip >> 16) % 64,
            (self.next_ip >> 8) & 255,
            self.next_ip & 255
        );
        let delay = ctx.timings.pod_start;
        self.timers.spawn(async move {
            tokio::time::sleep(delay).await;
            let started = modify_uid(&ctx.store, &pods(), Some(&ns), &pod_name, &u, |p| {
                if is_terminating(p) || phase(p) != "Pending" || node_name(p).is_none() {
                    return false;
                }
                set_running(p, &host_ip, &pod_ip);
                true
            });
            if let Some(p) = started {
                ctx.audit.world(
                    "started",
                    "pods",
                    Some(&ns),
                    Some(&pod_name),
                    json!({"uid": u, "node": node_name(&p), "claims": pod_claims(&p)}),
                );
            }
        });
    }

    fn stop_later(&mut self, pod: &Value, u: String) {
        let ctx = self.ctx.clone();
        let (ns, pod_name) = (namespace(pod).to_string(), name(pod).to_string());
        let grace = i64_at(pod, "/metadata/deletionGracePeriodSeconds")
            .unwrap_or(0)
            .max(0) as u64;
        let delay = ctx.timings.pod_stop.min(Duration::from_secs(grace));
        self.timers.spawn(async move {
            tokio::time::sleep(delay).await;
            // Gone already, or replaced by a new pod of the same name: nothing to do.
            let _ = ctx
                .store
                .delete(&pods(), Some(&ns), &pod_name, &delete_uid(&u, Some(0)));
        });
    }

    fn finish_later(&mut self, pod: &Value, ms: u64) {
        let ctx = self.ctx.clone();
        let (ns, pod_name, u) = (
            namespace(pod).to_string(),
            name(pod).to_string(),
            uid(pod).to_string(),
        );
        self.timers.spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let done = modify_uid(&ctx.store, &pods(), Some(&ns), &pod_name, &u, |p| {
                if is_terminating(p) || phase(p) != "Running" {
                    return false;
                }
                set_succeeded(p);
                true
            });
            if done.is_some() {
                ctx.audit.world(
                    "succeeded",
                    "pods",
                    Some(&ns),
                    Some(&pod_name),
                    json!({"uid": u}),
                );
            }
        });
    }

    fn on_node(&mut self, c: Change, pod_feed: &Feed) {
        let node_name_ = c.key.1.clone();
        let Some(node) = &c.new else {
            self.nodes.remove(&node_name_);
            self.ctx
                .audit
                .world("removed", "nodes", None, Some(&node_name_), json!({}));
            for key in self.by_node.get(&node_name_).cloned().unwrap_or_default() {
                if let Some(pod) = pod_feed.get(&key)
                    && !is_terminal(pod)
                    && self.failing.insert(uid(pod).to_string())
                {
                    fail_and_remove(&self.ctx, pod, &node_name_);
                }
            }
            return;
        };
        if condition(node, "Ready").is_none() {
            register_node(&self.ctx, node);
        }
        let ready = node_ready(node);
        let ip = node
            .pointer("/status/addresses")
            .and_then(Value::as_array)
            .and_then(|a| {
                a.iter()
                    .find(|x| x.get("type").and_then(Value::as_str) == Some("InternalIP"))
            })
            .and_then(|x| x.get("address"))
            .and_then(Value::as_str)
            .unwrap_or("10.0.0.1")
            .to_string();
        let was_ready = self.nodes.get(&node_name_).map(|s| s.ready);
        if c.old.is_none() {
            self.ctx.audit.world(
                "added",
                "nodes",
                None,
                Some(&node_name_),
                json!({"providerID": str_at(node, "/spec/providerID"),
                       "zone": label(node, "topology.kubernetes.io/zone"),
                       "instanceType": label(node, "node.kubernetes.io/instance-type")}),
            );
        }
        self.nodes
            .insert(node_name_.clone(), NodeState { ready, ip });
        if was_ready == Some(ready) {
            return;
        }
        let pod_keys = self.by_node.get(&node_name_).cloned().unwrap_or_default();
        for key in pod_keys {
            let Some(pod) = pod_feed.get(&key).cloned() else {
                continue;
            };
            if ready {
                if phase(&pod) == "Running" && condition(&pod, "Ready") != Some("True") {
                    set_pod_ready(&self.ctx, &pod, true);
                }
                self.sync_pod(&pod);
            } else if was_ready.is_some() && phase(&pod) == "Running" {
                set_pod_ready(&self.ctx, &pod, false);
            }
        }
    }
}

fn register_node(ctx: &WorldContext, node: &Value) {
    let _ = modify_uid(&ctx.store, &nodes(), None, name(node), uid(node), |n| {
        if condition(n, "Ready").is_some() {
            return false;
        }
        if n.pointer("/status/allocatable").is_none() {
            let capacity = n
                .pointer("/status/capacity")
                .cloned()
                .unwrap_or_else(|| json!({"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "20Gi"}));
            n["status"]["capacity"] = capacity.clone();
            n["status"]["allocatable"] = capacity;
        }
        for (t, reason) in [
            ("MemoryPressure", "KubeletHasSufficientMemory"),
            ("DiskPressure", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "KubeletHasSufficientPID"),
        ] {
            set_condition(n, t, "False", reason, "");
        }
        set_condition(
            n,
            "Ready",
            "True",
            "KubeletReady",
            "kubelet is posting ready status",
        );
        true
    });
}

fn set_pod_ready(ctx: &WorldContext, pod: &Value, ready: bool) {
    let status = if ready { "True" } else { "False" };
    let _ = modify_uid(
        &ctx.store,
        &pods(),
        Some(namespace(pod)),
        name(pod),
        uid(pod),
        |p| {
            if phase(p) != "Running" {
                return false;
            }
            set_condition(p, "ContainersReady", status, "", "");
            set_condition(p, "Ready", status, "", "");
            if let Some(cs) = p
                .pointer_mut("/status/containerStatuses")
                .and_then(Value::as_array_mut)
            {
                for c in cs {
                    c["ready"] = json!(ready);
                }
            }
            true
        },
    );
}

/// The pod garbage collector's handling of a pod whose node is gone: Failed, then force-deleted.
fn fail_and_remove(ctx: &WorldContext, pod: &Value, node: &str) {
    let (ns, pod_name, u) = (namespace(pod), name(pod), uid(pod));
    let _ = modify_uid(&ctx.store, &pods(), Some(ns), pod_name, u, |p| {
        if !is_terminal(p) {
            p["status"]["phase"] = json!("Failed");
            p["status"]["reason"] = json!("NodeLost");
            p["status"]["message"] = json!(format!(
                "Node {node} which was running pod {pod_name} is gone"
            ));
        }
        set_condition(
            p,
            "DisruptionTarget",
            "True",
            "DeletionByPodGC",
            "PodGC: node no longer exists",
        );
        set_condition(p, "Ready", "False", "", "");
        true
    });
    let _ = ctx
        .store
        .delete(&pods(), Some(ns), pod_name, &delete_uid(u, Some(0)));
}

fn qos_class(pod: &Value) -> &'static str {
    let (cpu, mem) = pod_requests(pod);
    if cpu == 0 && mem == 0 {
        "BestEffort"
    } else {
        "Burstable"
    }
}

/// The status a kubelet reports once all containers run and pass readiness.
pub fn set_running(pod: &mut Value, host_ip: &str, pod_ip: &str) {
    let now = now();
    let containers: Vec<Value> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let image = c.get("image").and_then(Value::as_str).unwrap_or("busybox");
            let cname = c.get("name").and_then(Value::as_str).unwrap_or("");
            json!({
                "name": cname,
                "image": image,
                "imageID": format!("{image}@sha256:{}", &sha256_hex(image)[..64]),
                "containerID": format!("containerd://{}", &sha256_hex(&format!("{}/{cname}", uid(pod)))[..64]),
                "ready": true,
                "started": true,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    let qos = qos_class(pod);
    let conditions = [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ]
    .map(|t| json!({"type": t, "status": "True", "lastTransitionTime": now}));
    pod["status"] = json!({
        "phase": "Running",
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": now,
        "containerStatuses": containers,
        "qosClass": qos,
    });
}

fn set_succeeded(pod: &mut Value) {
    let now = now();
    pod["status"]["phase"] = json!("Succeeded");
    set_condition(pod, "Ready", "False", "PodCompleted", "");
    set_condition(pod, "ContainersReady", "False", "PodCompleted", "");
    if let Some(cs) = pod
        .pointer_mut("/status/containerStatuses")
        .and_then(Value::as_array_mut)
    {
        for c in cs {
            let started = c.pointer("/state/running/startedAt").cloned();
            c["ready"] = json!(false);
            c["started"] = json!(false);
            c["state"] = json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": now}});
        }
    }
}
