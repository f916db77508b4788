//! Simulated Karpenter v1 (core v1.14 behaviour, see `research/karpenter.md`): NodeClaims launch
//! instances and own their Nodes; pod events and `consolidateAfter` make NodeClaims Consolidatable; a
//! disruption loop (Emptiness, Drift, single-node consolidation of underutilized nodes) honours
//! do-not-disrupt, PDBs and NodePool budgets and replaces drifted nodes before it deletes them; the
//! termination finalizer drains through the eviction API, waits for VolumeAttachments and terminates
//! the instance; expiry (`expireAfter`) and spot interruption delete NodeClaims without budgets.

pub mod budgets;
mod consolidatable;
mod consolidation;
mod disruption;
pub mod drift;
pub mod ec2;
mod evict;
pub mod nodeclass;
mod queue;
mod termination;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use thiserror::Error;

use super::WorldContext;
use super::feed::{Change, Feed};
use crate::apiserver::errors::ApiError;
use crate::apiserver::meta::{meta_str, now_rfc3339};
use crate::apiserver::objects::{NODE_PROVIDER_ID, POD_NODE};
use crate::apiserver::resources::ResKey;
use crate::apiserver::store::{DeleteOptions, WriteOptions};

pub const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";
/// `NODEPOOL_LABEL` as a JSON pointer, written out: formatting it per NodeClaim on every pass over
/// 5,000 of them showed in profiles of scale-5k.
const NODEPOOL_POINTER: &str = "/metadata/labels/karpenter.sh~1nodepool";
pub const TERMINATION_FINALIZER: &str = "karpenter.sh/termination";
pub const DISRUPTED_TAINT: &str = "karpenter.sh/disrupted";
pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
pub const TERMINATION_TIMESTAMP: &str = "karpenter.sh/nodeclaim-termination-timestamp";

#[derive(Debug, Error)]
pub enum KarpenterError {
    #[error("writing {what} through the store failed: {source}")]
    Api {
        what: String,
        #[source]
        source: Box<ApiError>,
    },
    #[error("launching an instance for NodeClaim {nodeclaim} failed: {message}")]
    Launch { nodeclaim: String, message: String },
    #[error("terminating instance {instance} failed: {message}")]
    Terminate { instance: String, message: String },
}

/// What Karpenter asks the cloud for.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchRequest {
    pub nodeclaim: String,
    pub instance_type: String,
    pub capacity_type: String,
    /// Labels the Node must carry (Bottlerocket `node-labels`).
    pub labels: BTreeMap<String, String>,
    /// (key, value, effect), Bottlerocket `node-taints`.
    pub taints: Vec<(String, String, String)>,
    /// Karpenter's instance tags (`karpenter.sh/nodepool`, `karpenter.sh/nodeclaim`, cluster tag).
    pub tags: BTreeMap<String, String>,
    /// The AMI its EC2NodeClass maps to it ([`drift::launch_image`]); None: the cloud's default.
    pub image_id: Option<String>,
}

/// A launched instance.
#[derive(Clone, Debug, PartialEq)]
pub struct Launched {
    pub id: String,
    pub zone: String,
    pub image_id: String,
}

pub type CloudFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// The cloud provider Karpenter launches and terminates through (EC2 in the sim).
pub trait Cloud: Send + Sync {
    fn launch(&self, req: LaunchRequest) -> CloudFuture<'_, Launched>;
    fn terminate(&self, id: &str) -> CloudFuture<'_, ()>;
    /// Whether the instance still exists as Karpenter's cloud provider `Get` sees it: pending, running,
    /// stopping, stopped or shutting-down (aws/karpenter-provider-aws `pkg/providers/instance`
    /// `instanceStateFilter`); a terminated or unknown one is gone (`NodeClaimNotFoundError`).
    fn exists(&self, id: &str) -> CloudFuture<'_, bool>;
}

pub struct KarpenterConfig {
    pub cloud: Arc<dyn Cloud>,
    /// A client of the simulated API server: evictions go through `pods/eviction`, so PDBs and
    /// admission webhooks (snapdrain's eviction gate) apply exactly as for real Karpenter.
    pub client: kube::Client,
    /// Disruption loop period (Karpenter: 10 s).
    pub disruption_interval: Duration,
    /// How long a replacement may take to initialize before the command is dropped.
    pub replacement_timeout: Duration,
    /// Lifecycle / termination reconcile period (Karpenter requeues every 1 s).
    pub requeue: Duration,
}

/// Karpenter's settings that change what it does on its own (its Helm chart's `settings`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct KarpenterSettings {
    /// `settings.interruptionQueue` (`INTERRUPTION_QUEUE`; default none): the SQS queue EventBridge feeds
    /// with EC2's spot interruption warnings. Only with it does Karpenter act on them: it deletes the
    /// instance's NodeClaim at once, forceful, without budgets or a pre-launched replacement
    /// (aws/karpenter-provider-aws `pkg/controllers/interruption/controller.go`: `actionForMessage` gives
    /// CordonAndDrain for SpotInterruption, ScheduledChange and StateChange, and `handleNodeClaim`
    /// deletes the NodeClaim; a rebalance recommendation is only an Event). Without a queue the
    /// interruption controller is not started and the notice changes nothing until EC2 takes the instance.
    pub interruption_queue: Option<String>,
}

/// The User-Agent Karpenter's clients send: `<AppName>/<Version>` (kubernetes-sigs/karpenter
/// `pkg/operator/operator.go`: `config.UserAgent = fmt.Sprintf("%s/%s", AppName, Version)`, `AppName`
/// "karpenter"), so the audit log names it as a real API server's does.
pub const USER_AGENT: &str = "karpenter/v1.14.1";

/// A client of the simulated API server for Karpenter: its User-Agent, and without kube's own 429
/// retries, so eviction answers reach Karpenter's backoff (and the audit log) as they come.
pub fn api_client(admin: kube::Config) -> Result<kube::Client, String> {
    crate::world::eviction::drainer_client(admin, USER_AGENT)
}

impl KarpenterConfig {
    pub fn new(cloud: Arc<dyn Cloud>, client: kube::Client) -> Self {
        Self {
            cloud,
            client,
            disruption_interval: Duration::from_secs(1),
            replacement_timeout: Duration::from_secs(60),
            requeue: Duration::from_millis(200),
        }
    }
}

#[derive(Default)]
struct Shared {
    /// NodeClaims being launched, disrupted (command in flight) or terminated.
    launching: Mutex<HashSet<String>>,
    commands: Mutex<HashSet<String>>,
    terminating: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
    interrupt: Mutex<Vec<String>>,
    /// Last audited block reason per NodeClaim, so each is reported once.
    blocked: Mutex<HashMap<String, String>>,
    /// Fingerprints of pods, nodes, NodeClaims and PDBs when consolidation last found nothing to do.
    consolidated: Mutex<Option<[(usize, u64); 4]>>,
    /// What the last disruption pass saw when it started no command: the same state again would make
    /// the same decisions, so the pass is skipped (5,000 NodeClaims and their pods every second).
    idle: Mutex<Option<disruption::Seen>>,
}

/// Controls of a running simulated Karpenter.
#[derive(Clone, Default)]
pub struct KarpenterHandle {
    shared: Arc<Shared>,
}

impl KarpenterHandle {
    pub fn new() -> Self {
        Self::default()
    }

    /// A spot interruption notice for the instance behind `nodeclaim`: its NodeClaim is deleted
    /// (forceful, no budgets, no pre-launched replacement).
    pub fn spot_interruption(&self, nodeclaim: &str) {
        lock(&self.shared.interrupt).push(nodeclaim.to_string());
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain bookkeeping; a panic elsewhere cannot leave it inconsistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn nodeclaims() -> ResKey {
    ResKey::new("karpenter.sh", "nodeclaims")
}

pub(crate) fn nodepools() -> ResKey {
    ResKey::new("karpenter.sh", "nodepools")
}

const INTERNAL: WriteOptions = WriteOptions {
    dry_run: false,
    internal: true,
};

fn api_err(what: impl Into<String>) -> impl FnOnce(ApiError) -> KarpenterError {
    let what = what.into();
    move |source| KarpenterError::Api {
        what,
        source: Box::new(source),
    }
}

/// Sets a metav1.Condition, keeping lastTransitionTime when the status did not change.
pub(crate) fn set_condition(
    obj: &mut Value,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
) {
    let generation = obj
        .pointer("/metadata/generation")
        .cloned()
        .unwrap_or(json!(1));
    if !obj["status"].is_object() {
        obj["status"] = json!({});
    }
    if !obj["status"]["conditions"].is_array() {
        obj["status"]["conditions"] = json!([]);
    }
    let Some(conds) = obj["status"]["conditions"].as_array_mut() else {
        return;
    };
    let now = now_rfc3339();
    let new = json!({"type": type_, "status": status, "reason": reason, "message": message, "observedGeneration": generation, "lastTransitionTime": now});
    match conds.iter_mut().find(|c| c["type"] == type_) {
        Some(c) => {
            let keep = c["status"] == status;
            let ltt = c["lastTransitionTime"].clone();
            *c = new;
            if keep {
                c["lastTransitionTime"] = ltt;
            }
        }
        None => conds.push(new),
    }
}

pub(crate) fn remove_condition(obj: &mut Value, type_: &str) {
    if let Some(conds) = obj
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    {
        conds.retain(|c| c["type"] != type_);
    }
}

pub(crate) fn condition_true(obj: &Value, type_: &str) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == type_ && c["status"] == "True")
        })
}

pub(crate) fn modify_claim(
    ctx: &WorldContext,
    name: &str,
    f: impl FnOnce(&mut Value),
) -> Result<Arc<Value>, KarpenterError> {
    ctx.store
        .modify(&nodeclaims(), None, name, None, INTERNAL, |cur| {
            let mut v = cur.clone();
            f(&mut v);
            Ok(v)
        })
        .map_err(api_err(format!("NodeClaim {name}")))
}

pub(crate) fn modify_node(
    ctx: &WorldContext,
    name: &str,
    f: impl FnOnce(&mut Value),
) -> Result<Arc<Value>, KarpenterError> {
    ctx.store
        .modify(&ResKey::core("nodes"), None, name, None, INTERNAL, |cur| {
            let mut v = cur.clone();
            f(&mut v);
            Ok(v)
        })
        .map_err(api_err(format!("Node {name}")))
}

pub(crate) fn add_finalizer(obj: &mut Value) {
    if !obj["metadata"]["finalizers"].is_array() {
        obj["metadata"]["finalizers"] = json!([]);
    }
    if let Some(f) = obj["metadata"]["finalizers"].as_array_mut()
        && !f.iter().any(|x| x == TERMINATION_FINALIZER)
    {
        f.push(json!(TERMINATION_FINALIZER));
    }
}

pub(crate) fn remove_finalizer(obj: &mut Value) {
    if let Some(f) = obj
        .pointer_mut("/metadata/finalizers")
        .and_then(Value::as_array_mut)
    {
        f.retain(|x| x != TERMINATION_FINALIZER);
    }
}

/// The Node whose providerID is the NodeClaim's.
pub(crate) fn node_of(ctx: &WorldContext, claim: &Value) -> Option<Arc<Value>> {
    let pid = claim
        .pointer("/status/providerID")
        .and_then(Value::as_str)?;
    // From the store's providerID index: a scan of 5,000 nodes per NodeClaim was a hot spot.
    ctx.store
        .by_field(&ResKey::core("nodes"), NODE_PROVIDER_ID, pid)
        .into_iter()
        .next()
}

/// The pods bound to `node` that have not finished (Succeeded or Failed), from the store's index.
pub(crate) fn pods_on(ctx: &WorldContext, node: &str) -> Vec<Arc<Value>> {
    let mut pods = ctx.store.by_field(&ResKey::core("pods"), POD_NODE, node);
    pods.retain(|p| !disruption::is_terminal(p));
    pods
}

/// Builds a NodeClaim from a NodePool's template, as the provisioner does.
pub fn nodeclaim_from_pool(pool: &Value) -> Value {
    let pool_name = meta_str(pool, "name").unwrap_or("default");
    let t = pool.pointer("/spec/template").cloned().unwrap_or(json!({}));
    let mut labels = t.pointer("/metadata/labels").cloned().unwrap_or(json!({}));
    labels[NODEPOOL_LABEL] = json!(pool_name);
    let mut spec = t.get("spec").cloned().unwrap_or(json!({}));
    if spec.get("expireAfter").is_none() {
        spec["expireAfter"] = json!("720h");
    }
    if spec.get("requirements").is_none() {
        spec["requirements"] = json!([]);
    }
    json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {
            "generateName": format!("{pool_name}-"),
            "labels": labels,
            "annotations": t.pointer("/metadata/annotations").cloned().unwrap_or(json!({})),
            "finalizers": [TERMINATION_FINALIZER],
            "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "name": pool_name, "uid": meta_str(pool, "uid").unwrap_or(""), "blockOwnerDeletion": true}],
        },
        "spec": spec,
    })
}

fn requirement(claim: &Value, key: &str) -> Option<String> {
    claim
        .pointer("/spec/requirements")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r["key"] == key && r["operator"] == "In")?
        .pointer("/values/0")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// Runs Karpenter until the task is dropped.
///
/// The lifecycle controllers reconcile one NodeClaim at a time from a work queue: when it changes
/// (its feed), when pods on its node change (pod events write `lastPodEventTime`, which changes it),
/// when its NodePool changes, and when a time it waits for comes. The 200 ms tick only looks at spot
/// interruptions and finished terminations.
pub async fn run(ctx: Arc<WorldContext>, config: KarpenterConfig, handle: KarpenterHandle) {
    let config = Arc::new(config);
    let mut lifecycle = tokio::time::interval(config.requeue);
    let mut disruption = tokio::time::interval(config.disruption_interval);
    let (mut pod_feed, initial) = Feed::open(&ctx.store, ResKey::core("pods"));
    let (mut claim_feed, initial_claims) = Feed::open(&ctx.store, nodeclaims());
    let (mut pool_feed, _) = Feed::open(&ctx.store, nodepools());
    let (mut class_feed, _) = Feed::open(&ctx.store, drift::classes());
    let mut queue = queue::WorkQueue::default();
    let mut pass: Option<tokio::task::JoinHandle<()>> = None;
    for c in &initial_claims {
        queue.add(&c.key.1);
    }
    let mut pod_changes = initial;
    loop {
        let next_due = queue.next_due();
        let timer = async move {
            match next_due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = lifecycle.tick() => {
                pod_changes.extend(pod_feed.try_recv());
                consolidatable::record_pod_events(&ctx, &std::mem::take(&mut pod_changes));
                interruptions(&ctx, &handle);
                // A termination that ended with its NodeClaim still there (an error) starts again.
                lock(&handle.shared.terminating).retain(|name, t| {
                    if t.is_finished() {
                        queue.add(name);
                    }
                    !t.is_finished()
                });
            }
            changes = claim_feed.recv() => enqueue_claims(&mut queue, &changes),
            changes = pool_feed.recv() => enqueue_pools(&ctx, &mut queue, &changes),
            changes = class_feed.recv() => enqueue_classes(&ctx, &mut queue, &changes),
            _ = timer => {}
            _ = disruption.tick() => {
                // The disruption controller runs beside the lifecycle controllers, as in Karpenter: a
                // pass over 5,000 candidates takes seconds here and must not hold up terminations. One
                // pass at a time, on a blocking thread.
                if pass.as_ref().is_none_or(|p| p.is_finished()) {
                    let (ctx, config, handle) = (ctx.clone(), config.clone(), handle.clone());
                    pass = Some(tokio::task::spawn_blocking(move || {
                        disruption::pass(&ctx, &config, &handle)
                    }));
                }
            }
        }
        enqueue_claims(&mut queue, &claim_feed.try_recv());
        let pools = pool_feed.try_recv();
        enqueue_pools(&ctx, &mut queue, &pools);
        enqueue_classes(&ctx, &mut queue, &class_feed.try_recv());
        for name in queue.take(tokio::time::Instant::now()) {
            if let Some(at) = reconcile_claim(&ctx, &config, &handle, &name) {
                queue.add_at(&name, at);
            }
        }
    }
}

fn enqueue_claims(queue: &mut queue::WorkQueue, changes: &[Change]) {
    for c in changes.iter().filter(|c| c.new.is_some()) {
        queue.add(&c.key.1);
    }
}

/// A NodePool's change (its consolidateAfter, say) concerns every NodeClaim of the pool.
fn enqueue_pools(ctx: &WorldContext, queue: &mut queue::WorkQueue, changes: &[Change]) {
    if changes.is_empty() {
        return;
    }
    let names: HashSet<&str> = changes.iter().map(|c| c.key.1.as_str()).collect();
    for claim in ctx.store.snapshot(&nodeclaims()).0 {
        if claim
            .pointer(NODEPOOL_POINTER)
            .and_then(Value::as_str)
            .is_some_and(|p| names.contains(p))
        {
            queue.add(meta_str(&claim, "name").unwrap_or(""));
        }
    }
}

/// An EC2NodeClass's change (its resolved AMIs, say) concerns every NodeClaim launched from it.
fn enqueue_classes(ctx: &WorldContext, queue: &mut queue::WorkQueue, changes: &[Change]) {
    if changes.is_empty() {
        return;
    }
    let names: HashSet<&str> = changes.iter().map(|c| c.key.1.as_str()).collect();
    for claim in ctx.store.snapshot(&nodeclaims()).0 {
        if claim
            .pointer("/spec/nodeClassRef/name")
            .and_then(Value::as_str)
            .is_some_and(|c| names.contains(c))
        {
            queue.add(meta_str(&claim, "name").unwrap_or(""));
        }
    }
}

/// Spot interruption notices: `SpotInterrupted` Warning Events on the NodeClaim and its Node, then the
/// NodeClaim deleted (forceful, no budgets). aws/karpenter-provider-aws
/// `pkg/controllers/interruption/controller.go` `handleNodeClaim` publishes the events
/// (`notifyForMessage`, `events/events.go` `SpotInterrupted`) before `deleteNodeClaim`; the Event's
/// time is the only record of when the two-minute notice began.
fn interruptions(ctx: &WorldContext, handle: &KarpenterHandle) {
    let interrupted: Vec<String> = std::mem::take(&mut *lock(&handle.shared.interrupt));
    for name in interrupted {
        let node = ctx.store.get(&nodeclaims(), None, &name).and_then(|c| {
            c.pointer("/status/nodeName")
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
        spot_interrupted_event(ctx, "NodeClaim", "karpenter.sh/v1", &name);
        if let Some(node) = &node {
            spot_interrupted_event(ctx, "Node", "v1", node);
        }
        ctx.audit.world(
            "disruption-started",
            "nodeclaims.karpenter.sh",
            None,
            Some(&name),
            json!({"reason": "SpotInterruption", "forceful": true}),
        );
        let _ = ctx
            .store
            .delete(&nodeclaims(), None, &name, &DeleteOptions::default());
    }
}

/// A core/v1 Event as client-go's recorder writes it for a cluster-scoped object: in namespace
/// `default`, named `<object>.<unique suffix>`, with `firstTimestamp`/`lastTimestamp`.
fn spot_interrupted_event(ctx: &WorldContext, kind: &str, api_version: &str, name: &str) {
    let now = now_rfc3339();
    let suffix = jiff::Timestamp::now().as_nanosecond();
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{name}.{suffix:x}"), "namespace": "default"},
        "involvedObject": {"kind": kind, "apiVersion": api_version, "name": name},
        "type": "Warning",
        "reason": "SpotInterrupted",
        "message": "Spot interruption warning was triggered",
        "source": {"component": "karpenter"},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    });
    if let Err(e) = ctx
        .store
        .create(&ResKey::core("events"), Some("default"), event, INTERNAL)
    {
        tracing::warn!(object = %name, error = %e, "karpenter: cannot record the SpotInterrupted event");
    }
}

/// Launch, registration, initialization, Consolidatable, expiry and termination of one NodeClaim.
/// Returns when it must be looked at again if nothing changes before (a NodeClaim waiting for its
/// Node, for consolidateAfter or for expireAfter).
fn reconcile_claim(
    ctx: &Arc<WorldContext>,
    config: &Arc<KarpenterConfig>,
    handle: &KarpenterHandle,
    name: &str,
) -> Option<tokio::time::Instant> {
    let claim = ctx.store.get(&nodeclaims(), None, name)?;
    if claim.pointer("/metadata/deletionTimestamp").is_some() {
        lock(&handle.shared.terminating)
            .entry(name.to_string())
            .or_insert_with(|| {
                tokio::spawn(termination::terminate(
                    ctx.clone(),
                    config.clone(),
                    name.to_string(),
                ))
            });
        return None;
    }
    if claim.pointer("/status/providerID").is_none() {
        // The launch task writes the providerID (or deletes the NodeClaim): that change requeues it.
        launch(ctx, config, handle, &claim, name);
        return None;
    }
    let mut next: Option<jiff::Timestamp> = None;
    let mut waiting_for_node = false;
    if !condition_true(&claim, "Initialized") {
        register(ctx, &claim, name);
        // Registration waits for the Node to join and turn Ready: look again after the requeue period,
        // as the old every-tick pass did.
        waiting_for_node = true;
    }
    // Read back: registration may have just written it.
    if let Some(current) = ctx.store.get(&nodeclaims(), None, name) {
        let pool = current
            .pointer(NODEPOOL_POINTER)
            .and_then(Value::as_str)
            .and_then(|p| ctx.store.get(&nodepools(), None, p));
        next = consolidatable::reconcile(ctx, pool.as_deref(), &current);
        drift::reconcile(ctx, &current);
        if condition_true(&current, "Initialized") {
            waiting_for_node = false;
        }
    }
    // Expiration (K: pkg/controllers/nodeclaim/expiration/controller.go): forceful, so no budgets
    // and no do-not-disrupt check; the termination flow holds such pods until the TGP.
    match expires_at(&claim) {
        Some(at) if jiff::Timestamp::now() >= at => {
            ctx.audit.world(
                "disruption-started",
                "nodeclaims.karpenter.sh",
                None,
                Some(name),
                json!({"reason": "Expired", "forceful": true}),
            );
            let _ = ctx
                .store
                .delete(&nodeclaims(), None, name, &DeleteOptions::default());
            return None;
        }
        Some(at) => next = Some(next.map_or(at, |n| n.min(at))),
        None => {}
    }
    let mut at = next.map(instant_of);
    if waiting_for_node {
        let soon = tokio::time::Instant::now() + config.requeue;
        at = Some(at.map_or(soon, |a| a.min(soon)));
    }
    at
}

/// The monotonic instant of a wall-clock time (now when it has passed).
fn instant_of(t: jiff::Timestamp) -> tokio::time::Instant {
    let left = t.duration_since(jiff::Timestamp::now());
    let left = Duration::try_from(left).unwrap_or(Duration::ZERO);
    tokio::time::Instant::now() + left
}

/// When the NodeClaim expires (creationTimestamp + expireAfter), unless `Never` or unparsable.
fn expires_at(claim: &Value) -> Option<jiff::Timestamp> {
    let after = claim.pointer("/spec/expireAfter").and_then(Value::as_str)?;
    if after == "Never" {
        return None;
    }
    let created = meta_str(claim, "creationTimestamp")?
        .parse::<jiff::Timestamp>()
        .ok()?;
    let d = super::go_duration(after)?;
    created
        .checked_add(jiff::SignedDuration::try_from(d).ok()?)
        .ok()
}

fn launch(
    ctx: &Arc<WorldContext>,
    config: &Arc<KarpenterConfig>,
    handle: &KarpenterHandle,
    claim: &Value,
    name: &str,
) {
    if !lock(&handle.shared.launching).insert(name.to_string()) {
        return;
    }
    let labels: BTreeMap<String, String> = claim
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let taints = claim
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|t| {
                    let s = |k: &str| t.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                    (s("key"), s("value"), s("effect"))
                })
                .collect()
        })
        .unwrap_or_default();
    let pool = labels.get(NODEPOOL_LABEL).cloned().unwrap_or_default();
    let req = LaunchRequest {
        nodeclaim: name.to_string(),
        instance_type: requirement(claim, "node.kubernetes.io/instance-type")
            .unwrap_or_else(|| "m5.large".into()),
        capacity_type: requirement(claim, "karpenter.sh/capacity-type")
            .unwrap_or_else(|| "on-demand".into()),
        labels,
        taints,
        tags: BTreeMap::from([
            ("karpenter.sh/nodepool".into(), pool),
            ("karpenter.sh/nodeclaim".into(), name.to_string()),
            ("eks:eks-cluster-name".into(), "sim".into()),
        ]),
        image_id: drift::launch_image(ctx, claim),
    };
    let (ctx, config, handle, name) = (
        ctx.clone(),
        config.clone(),
        handle.clone(),
        name.to_string(),
    );
    tokio::spawn(async move {
        let instance_type = req.instance_type.clone();
        let result = config.cloud.launch(req).await;
        lock(&handle.shared.launching).remove(&name);
        match result {
            Ok(l) => {
                let pid = format!("aws:///{}/{}", l.zone, l.id);
                let _ = modify_claim(&ctx, &name, |v| {
                    v["status"]["providerID"] = json!(pid);
                    v["status"]["imageID"] = json!(l.image_id);
                    v["metadata"]["labels"]["node.kubernetes.io/instance-type"] =
                        json!(instance_type);
                    v["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!(l.zone);
                    set_condition(v, "Launched", "True", "Launched", "");
                });
                ctx.audit.world(
                    "instance-launched",
                    "nodeclaims.karpenter.sh",
                    None,
                    Some(&name),
                    json!({"instance": l.id, "providerID": pid}),
                );
            }
            Err(message) => {
                let e = KarpenterError::Launch {
                    nodeclaim: name.clone(),
                    message,
                };
                ctx.audit.world(
                    "launch-failed",
                    "nodeclaims.karpenter.sh",
                    None,
                    Some(&name),
                    json!({"error": e.to_string()}),
                );
                // Karpenter deletes NodeClaims whose launch failed; the provisioner tries again.
                let _ = modify_claim(&ctx, &name, |v| {
                    set_condition(v, "Launched", "False", "LaunchFailed", &e.to_string())
                });
                let _ = ctx
                    .store
                    .delete(&nodeclaims(), None, &name, &DeleteOptions::default());
            }
        }
    });
}

/// Registration and initialization: the Node with the NodeClaim's providerID joins the NodeClaim.
fn register(ctx: &WorldContext, claim: &Value, name: &str) {
    let Some(node) = node_of(ctx, claim) else {
        return;
    };
    let node_name = meta_str(&node, "name").unwrap_or("").to_string();
    let claim_uid = meta_str(claim, "uid").unwrap_or("").to_string();
    let labels = claim
        .pointer("/metadata/labels")
        .cloned()
        .unwrap_or(json!({}));
    let ready = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
    let res = modify_node(ctx, &node_name, |v| {
        add_finalizer(v);
        if let (Some(l), Some(extra)) =
            (v["metadata"]["labels"].as_object_mut(), labels.as_object())
        {
            for (k, val) in extra {
                l.entry(k.clone()).or_insert(val.clone());
            }
        }
        v["metadata"]["labels"]["karpenter.sh/registered"] = json!("true");
        if ready {
            v["metadata"]["labels"]["karpenter.sh/initialized"] = json!("true");
        }
        v["metadata"]["ownerReferences"] = json!([{"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": name, "uid": claim_uid, "blockOwnerDeletion": true}]);
    });
    if res.is_err() {
        return;
    }
    let _ = modify_claim(ctx, name, |v| {
        v["status"]["nodeName"] = json!(node_name);
        v["status"]["capacity"] = node
            .pointer("/status/capacity")
            .cloned()
            .unwrap_or(json!({}));
        v["status"]["allocatable"] = node
            .pointer("/status/allocatable")
            .cloned()
            .unwrap_or(json!({}));
        set_condition(v, "Registered", "True", "Registered", "");
        if ready {
            set_condition(v, "Initialized", "True", "Initialized", "");
            set_condition(v, "Ready", "True", "Ready", "");
        }
    });
    if ready {
        ctx.audit.world(
            "nodeclaim-initialized",
            "nodeclaims.karpenter.sh",
            None,
            Some(name),
            json!({"node": node_name}),
        );
    }
}
