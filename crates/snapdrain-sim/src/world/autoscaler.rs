//! Simulated Cluster Autoscaler scale-down (kubernetes/autoscaler, cluster-autoscaler). With
//! `scaleDownEnabled` CA chooses unneeded nodes itself ([`super::ca_scale_down`], rules in
//! [`super::ca_unneeded`]: utilisation, drainability, rescheduling, the soft `DeletionCandidate` taint,
//! `--scale-down-unneeded-time`); without it (the default in the sim, so that worlds that do not model CA
//! keep their nodes) it scales down only what [`AutoscalerHandle::scale_down`] (the timeline's
//! `autoscalerScaleDown`) asks for. Either way the actuation refuses:
//!
//! - a node with a pod annotated `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`
//!   (`simulator/drainability/rules/notsafetoevict/rule.go`, reason `NotSafeToEvictAnnotation`), a node
//!   annotated `cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"`
//!   (`core/scaledown/eligibility/eligibility.go`) and a node no node group owns (no providerID): the node is
//!   skipped, untouched, and the audit log says why (`scale-down-skipped`).
//!
//! The actuation (`core/scaledown/actuation/actuator.go`, `drain.go`; taints from `utils/taints/taints.go`):
//!
//! 1. taint `ToBeDeletedByClusterAutoscaler=<unix seconds>:NoSchedule` (cordon too with
//!    `--cordon-node-before-terminating`);
//! 2. evict every pod but mirror pods (DaemonSet pods best effort, not waited for, as
//!    `--daemonset-eviction-for-occupied-nodes` does by default), one task per pod, policy/v1beta1 Eviction
//!    with `gracePeriodSeconds = min(pod's terminationGracePeriodSeconds (30 when unset),
//!    --max-graceful-termination-sec)`; 2xx and 404 are success, any other answer is retried every
//!    `EvictionRetryTime` until `--max-pod-eviction-time` after the drain began;
//! 3. wait (GET every 5 s) up to the max graceful termination plus `PodEvictionHeadroom` (30 s) for the
//!    pods to be gone (404, or the name now on another node);
//! 4. delete the node through the cloud provider (its instance terminated; the Node then goes as the
//!    cloud's node lifecycle does for any terminated instance, see `ec2_nodes`).
//!
//! A failed eviction or a pod still there after the wait fails the scale-down: CA removes its taint
//! (`CleanUpAndRecordFailedScaleDownEvent`), the node stays, and the audit log has `scale-down-failed`.
//! At most `--max-drain-parallelism` (1) nodes are drained at once; the rest wait their turn untainted.
//!
//! Not simulated: the cloud provider's `TerminateInstanceInAutoScalingGroup` (the sim's cloud terminates
//! the instance with TerminateInstances, as scenario nodes belong to no Auto Scaling group), the
//! `delay-deletion.cluster-autoscaler.kubernetes.io/` annotations, empty-node deletion batching and
//! priority-ordered eviction (`--drain-priority-config`); for CA's own choice, see [`super::ca_unneeded`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::Client;
use kube::api::Api;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;

use super::WorldContext;
use super::ca_scale_down::Planner;
use super::eviction::{self, annotation, is_daemonset, is_finished, is_mirror};
use super::karpenter::Cloud;
use super::node_taints;

pub use super::ca_unneeded::{
    DELETION_CANDIDATE_TAINT, NODE_GROUP_LABEL, SAFE_TO_EVICT, SCALE_DOWN_DISABLED,
    TO_BE_DELETED_TAINT,
};
/// What the simulated Cluster Autoscaler sends as its user agent (and the audit log shows): CA's
/// `--user-agent` default (`config/flags/flags.go`).
pub const USER_AGENT: &str = "cluster-autoscaler";
const BY: &str = "cluster-autoscaler";

/// CA's flags and constants that shape a scale-down. Durations in scenario files are milliseconds;
/// the defaults are CA's.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct AutoscalerSettings {
    /// `EvictionRetryTime` (`DefaultEvictionRetryTime`, 10 s): the pause between eviction attempts.
    #[serde(with = "super::millis")]
    pub eviction_retry_time: Duration,
    /// `--max-pod-eviction-time` (2 m): how long refused evictions are retried before CA gives up.
    #[serde(with = "super::millis")]
    pub max_pod_eviction_time: Duration,
    /// `--max-graceful-termination-sec` (600): the longest grace period an eviction asks for.
    pub max_graceful_termination_sec: i64,
    /// `DefaultPodEvictionHeadroom` (30 s): extra wait for evicted pods past the grace period.
    #[serde(with = "super::millis")]
    pub pod_eviction_headroom: Duration,
    /// How often CA checks that evicted pods are gone (5 s in `waitPodsToDisappear`).
    #[serde(with = "super::millis")]
    pub pod_gone_poll: Duration,
    /// `--cordon-node-before-terminating` (false).
    pub cordon_node_before_terminating: bool,
    /// `--max-drain-parallelism` (1).
    pub max_drain_parallelism: usize,
    /// `--daemonset-eviction-for-occupied-nodes` (true): DaemonSet pods are evicted, best effort.
    pub daemonset_eviction_for_occupied_nodes: bool,
    /// `--scale-down-enabled` (true upstream; false here unless the scenario says so, so that a world
    /// modelling no CA keeps its nodes): CA picks unneeded nodes of its node groups itself.
    pub scale_down_enabled: bool,
    /// `--scan-interval` (10 s): how often CA looks for unneeded nodes.
    #[serde(with = "super::millis")]
    pub scan_interval: Duration,
    /// `--scale-down-utilization-threshold` (0.5): a node whose requests are below this share of its
    /// allocatable (the larger of CPU and memory) may be unneeded.
    pub scale_down_utilization_threshold: f64,
    /// `--scale-down-unneeded-time` (10 m): how long a node stays unneeded before CA scales it down.
    #[serde(with = "super::millis")]
    pub scale_down_unneeded_time: Duration,
    /// `--scale-down-delay-after-failure` (3 m): no scale-down starts this long after one failed.
    #[serde(with = "super::millis")]
    pub scale_down_delay_after_failure: Duration,
}

impl Default for AutoscalerSettings {
    fn default() -> Self {
        Self {
            eviction_retry_time: Duration::from_secs(10),
            max_pod_eviction_time: Duration::from_secs(120),
            max_graceful_termination_sec: 600,
            pod_eviction_headroom: Duration::from_secs(30),
            pod_gone_poll: Duration::from_secs(5),
            cordon_node_before_terminating: false,
            max_drain_parallelism: 1,
            daemonset_eviction_for_occupied_nodes: true,
            scale_down_enabled: false,
            scan_interval: Duration::from_secs(10),
            scale_down_utilization_threshold: 0.5,
            scale_down_unneeded_time: Duration::from_secs(600),
            scale_down_delay_after_failure: Duration::from_secs(180),
        }
    }
}

pub struct AutoscalerConfig {
    /// A client of the simulated API server ([`super::eviction::drainer_client`] with [`USER_AGENT`]).
    pub client: Client,
    /// The cloud provider that deletes a scaled-down node's instance.
    pub cloud: Arc<dyn Cloud>,
    pub settings: AutoscalerSettings,
}

/// Asks the running simulated Cluster Autoscaler to scale nodes down.
#[derive(Clone)]
pub struct AutoscalerHandle {
    tx: mpsc::UnboundedSender<String>,
}

/// The receiving end of an [`AutoscalerHandle`], for [`run`].
pub struct Requests {
    rx: mpsc::UnboundedReceiver<String>,
}

pub fn handle() -> (AutoscalerHandle, Requests) {
    let (tx, rx) = mpsc::unbounded_channel();
    (AutoscalerHandle { tx }, Requests { rx })
}

impl AutoscalerHandle {
    /// CA decided `node` is unneeded: drain it and delete it, unless something on it refuses. False when
    /// the autoscaler is no longer running.
    pub fn scale_down(&self, node: &str) -> bool {
        self.tx.send(node.to_string()).is_ok()
    }
}

/// Runs the simulated Cluster Autoscaler until the task is dropped or every handle is: the scale-downs
/// asked for, and with `scaleDownEnabled` its own scans ([`super::ca_scale_down`]).
pub async fn run(ctx: Arc<WorldContext>, config: AutoscalerConfig, mut requests: Requests) {
    let config = Arc::new(config);
    let drains = Arc::new(Semaphore::new(config.settings.max_drain_parallelism.max(1)));
    let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
    let last_failure: Arc<Mutex<Option<Instant>>> = Arc::default();
    let mut planner = Planner::default();
    let mut scan =
        tokio::time::interval(config.settings.scan_interval.max(Duration::from_millis(10)));
    scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let node = tokio::select! {
            asked = requests.rx.recv() => match asked {
                Some(node) => node,
                None => return,
            },
            _ = scan.tick(), if config.settings.scale_down_enabled => {
                planner.last_failure = *lock(&last_failure);
                let busy = lock(&in_flight).clone();
                match planner.scan(&ctx, &config, &busy, drains.available_permits() > 0).await {
                    Some(node) => node,
                    None => continue,
                }
            }
        };
        if !lock(&in_flight).insert(node.clone()) {
            skipped(&ctx, &node, "AlreadyBeingDeleted", json!({}));
            continue;
        }
        let (ctx, config, drains, in_flight, last_failure) = (
            ctx.clone(),
            config.clone(),
            drains.clone(),
            in_flight.clone(),
            last_failure.clone(),
        );
        // Nodes are taken in the order they were asked for; the semaphore is never closed, so acquiring
        // only waits for a drain to finish.
        let Ok(permit) = drains.acquire_owned().await else {
            return;
        };
        tokio::spawn(async move {
            if !scale_down(&ctx, &config, &node).await {
                *lock(&last_failure) = Some(Instant::now());
            }
            drop(permit);
            lock(&in_flight).remove(&node);
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain bookkeeping; a panic elsewhere cannot leave it inconsistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn skipped(ctx: &WorldContext, node: &str, reason: &str, mut detail: Value) {
    detail["reason"] = json!(reason);
    detail["by"] = json!(BY);
    ctx.audit
        .world("scale-down-skipped", "nodes", None, Some(node), detail);
}

/// Why CA will not take the node (before it touches it), as CA's planner reports unremovable nodes.
enum Refusal {
    Skip(&'static str, Value),
    Error(String),
}

/// One scale-down; false when it failed (not when CA skipped the node).
async fn scale_down(ctx: &WorldContext, config: &AutoscalerConfig, node: &str) -> bool {
    let (n, pods) = match eligible(&config.client, node).await {
        Ok(found) => found,
        Err(Refusal::Skip(reason, detail)) => {
            skipped(ctx, node, reason, detail);
            return true;
        }
        Err(Refusal::Error(message)) => {
            skipped(ctx, node, "Error", json!({"error": message}));
            return true;
        }
    };
    let s = &config.settings;
    // `taints.go` `MarkToBeDeleted`: the value is the Unix time in seconds.
    let taint = Taint {
        key: TO_BE_DELETED_TAINT.into(),
        value: Some(jiff::Timestamp::now().as_second().to_string()),
        effect: "NoSchedule".into(),
        time_added: None,
    };
    let value = taint.value.clone();
    if let Err(e) = node_taints::add(
        &config.client,
        node,
        taint,
        s.cordon_node_before_terminating,
    )
    .await
    {
        failed(
            ctx,
            config,
            node,
            format!("couldn't taint node {node:?} with ToBeDeleted: {e}"),
            false,
        )
        .await;
        return false;
    }
    ctx.audit.world(
        "scale-down-tainted",
        "nodes",
        None,
        Some(node),
        json!({"taint": TO_BE_DELETED_TAINT, "value": value, "effect": "NoSchedule", "by": BY}),
    );
    // The actuator lists the node's pods again once it is tainted (`deleteNodesAsync`, `GetPodsToMove`):
    // a pod that arrived meanwhile is drained too, and one that blocks fails the scale-down.
    let pods = match eviction::pods_on(&config.client, node).await {
        Ok(now) => now,
        Err(e) => {
            tracing::debug!(node, error = %e, "cluster autoscaler sim: relisting pods failed");
            pods
        }
    };
    if let Some(p) = blocking(&pods) {
        let message = format!(
            "failed to get pods to move on node: pod annotated as not safe to evict present: {}",
            p.metadata.name.as_deref().unwrap_or("")
        );
        failed(ctx, config, node, message, true).await;
        return false;
    }
    if let Err(message) = drain(ctx, config, node, pods).await {
        failed(ctx, config, node, message, true).await;
        return false;
    }
    let Some(instance) = instance_id(&n) else {
        let message = format!("node {node} has no providerID");
        failed(ctx, config, node, message, true).await;
        return false;
    };
    match config.cloud.terminate(&instance).await {
        Ok(()) => {
            ctx.audit.world(
                "scale-down-deleted",
                "nodes",
                None,
                Some(node),
                json!({"instance": instance, "by": BY}),
            );
            true
        }
        Err(e) => {
            let message = format!("failed to delete node {node}: {e}");
            failed(ctx, config, node, message, true).await;
            false
        }
    }
}

/// The node and its pods when CA may scale it down: the refusals CA's planner reports for unremovable
/// nodes (`core/scaledown/eligibility/eligibility.go`, `simulator/drainability/rules/notsafetoevict`).
async fn eligible(client: &Client, node: &str) -> Result<(Node, Vec<Pod>), Refusal> {
    let nodes: Api<Node> = Api::all(client.clone());
    let n = match nodes.get_opt(node).await {
        Ok(Some(n)) => n,
        Ok(None) => return Err(Refusal::Skip("NotFound", json!({}))),
        Err(e) => return Err(Refusal::Error(e.to_string())),
    };
    if n.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SCALE_DOWN_DISABLED))
        .is_some_and(|v| v == "true")
    {
        return Err(Refusal::Skip("ScaleDownDisabledAnnotation", json!({})));
    }
    if instance_id(&n).is_none() {
        // CA's NodeGroupForNode finds no group for a node without a providerID.
        return Err(Refusal::Skip("NotAutoscaled", json!({})));
    }
    if node_taints::has(&n, TO_BE_DELETED_TAINT) {
        return Err(Refusal::Skip("AlreadyBeingDeleted", json!({})));
    }
    let pods = eviction::pods_on(client, node)
        .await
        .map_err(|e| Refusal::Error(e.to_string()))?;
    if let Some(p) = blocking(&pods) {
        return Err(Refusal::Skip(
            "NotSafeToEvictAnnotation",
            json!({"pod": eviction::key(p), "message": format!("pod annotated as not safe to evict present: {}", p.metadata.name.as_deref().unwrap_or(""))}),
        ));
    }
    Ok((n, pods))
}

/// A pod whose `safe-to-evict: "false"` keeps CA from scaling its node down.
fn blocking(pods: &[Pod]) -> Option<&Pod> {
    pods.iter()
        .find(|p| !is_finished(p) && annotation(p, SAFE_TO_EVICT) == Some("false"))
}

fn instance_id(n: &Node) -> Option<String> {
    let pid = n.spec.as_ref()?.provider_id.as_deref()?;
    let id = pid.rsplit('/').next()?;
    id.starts_with("i-").then(|| id.to_string())
}

/// CA's failed scale-down (`actuator.go` `CleanUpAndRecordFailedScaleDownEvent`, which calls
/// `taints.go` `CleanToBeDeleted`): the taint goes (and the cordon, when CA cordoned), the node stays.
async fn failed(
    ctx: &WorldContext,
    config: &AutoscalerConfig,
    node: &str,
    message: String,
    untaint: bool,
) {
    let mut untainted = false;
    if untaint {
        untainted = node_taints::remove(
            &config.client,
            node,
            &[TO_BE_DELETED_TAINT],
            config.settings.cordon_node_before_terminating,
        )
        .await
        .unwrap_or(false);
    }
    ctx.audit.world(
        "scale-down-failed",
        "nodes",
        None,
        Some(node),
        json!({"error": message, "untainted": untainted, "by": BY}),
    );
}

/// `drain.go` `Evictor.DrainNode` (`podsToEvict`, `initiateEviction`): every pod's eviction at once, one
/// deadline for all of them, then the wait for them to go.
async fn drain(
    ctx: &WorldContext,
    config: &AutoscalerConfig,
    node: &str,
    pods: Vec<Pod>,
) -> Result<(), String> {
    let s = &config.settings;
    let retry_until = Instant::now() + s.max_pod_eviction_time;
    let mut full = Vec::new();
    let mut tasks = Vec::new();
    for p in pods
        .into_iter()
        .filter(|p| !is_mirror(p) && !is_finished(p))
    {
        let best_effort = is_daemonset(&p);
        if best_effort && !s.daemonset_eviction_for_occupied_nodes {
            continue;
        }
        if !best_effort {
            full.push(p.clone());
        }
        tasks.push(async move { (best_effort, evict_pod(ctx, config, &p, retry_until).await) });
    }
    let errors: Vec<String> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .filter_map(|(best_effort, r)| r.err().filter(|_| !best_effort))
        .collect();
    if !errors.is_empty() {
        return Err(format!(
            "Failed to drain node /{node}, due to following errors: [{}]",
            errors.join(" ")
        ));
    }
    wait_gone(config, node, &full).await
}

/// `drain.go` `Evictor.evictPod`: the first attempt always, then one every retry time until
/// `retry_until`; success is no error or a 404, every other answer (429 included) is retried.
async fn evict_pod(
    ctx: &WorldContext,
    config: &AutoscalerConfig,
    pod: &Pod,
    retry_until: Instant,
) -> Result<(), String> {
    let s = &config.settings;
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    let grace = if s.max_graceful_termination_sec > 0 {
        grace.min(s.max_graceful_termination_sec)
    } else {
        grace
    };
    let mut first = true;
    let mut last = String::new();
    while first || Instant::now() < retry_until {
        if !first {
            tokio::time::sleep(s.eviction_retry_time).await;
        }
        first = false;
        let (code, message) = eviction::evict(
            &config.client,
            "policy/v1beta1",
            ns,
            name,
            json!({"gracePeriodSeconds": grace}),
        )
        .await;
        ctx.audit.world(
            "eviction-attempt",
            "pods",
            Some(ns),
            Some(name),
            json!({"code": code, "message": message, "by": BY}),
        );
        if (200..300).contains(&code) || code == 404 {
            return Ok(());
        }
        last = message;
    }
    Err(format!(
        "failed to evict pod {ns}/{name} within allowed timeout (last error: {last})"
    ))
}

/// `drain.go` `Evictor.waitPodsToDisappear`: gone is a 404 or the name bound to another node.
async fn wait_gone(config: &AutoscalerConfig, node: &str, pods: &[Pod]) -> Result<(), String> {
    let s = &config.settings;
    let limit =
        Duration::from_secs(s.max_graceful_termination_sec.max(0) as u64) + s.pod_eviction_headroom;
    let start = Instant::now();
    loop {
        let mut all_gone = true;
        for p in pods {
            let api: Api<Pod> = Api::namespaced(
                config.client.clone(),
                p.metadata.namespace.as_deref().unwrap_or(""),
            );
            match api.get_opt(p.metadata.name.as_deref().unwrap_or("")).await {
                Ok(None) => {}
                Ok(Some(now))
                    if now.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node) => {}
                _ => {
                    all_gone = false;
                    break;
                }
            }
        }
        if all_gone {
            return Ok(());
        }
        if start.elapsed() >= limit {
            return Err(format!(
                "Failed to drain node /{node}: pods remaining after timeout"
            ));
        }
        tokio::time::sleep(s.pod_gone_poll).await;
    }
}
