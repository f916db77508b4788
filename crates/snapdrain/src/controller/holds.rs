//! The hold keeper: every protected pod carries snapdrain's holds from the moment it is seen (and on
//! start-up for the pods that exist), a released pod gets them back once the plan that released it is
//! over (completed, failed, aborted or deleted), and a pod the policy no longer protects loses them.
//! A Velero data-path pod (1.17+: a PodVolumeBackup's hosting pod, a DataUpload's pod) gets
//! `karpenter.sh/do-not-disrupt` as it appears, so Karpenter's termination never queues it while its
//! backup runs (`planning::velero_pods`); Velero deletes it when that backup's volume is done.
//! The Node under a held pod carries `karpenter.sh/do-not-disrupt` too, the only hold Karpenter's drift
//! honours under a NodePool terminationGracePeriod (why: [`crate::planning::holds`]); it goes when no
//! held pod is left on the node (a plan released them all, they left, or they are no longer protected).
//! Decisions are [`crate::planning::holds`]; this file watches and patches.
//!
//! Runs on the Lease holder only. Every change is a JSON merge patch guarded by the object's
//! resourceVersion, so a user's concurrent edit is never overwritten (the 409 is retried on the next
//! event or sweep).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tokio::sync::{broadcast, watch};

use super::cache::{Cache, CachedNodeClaim, CachedPod, Caches};

use crate::api::DisruptionPlan;
use crate::api::policy::{DisruptionPolicySpec, SignalsSpec};
use crate::planning::holds::{self, AnnotationPatch, HoldState};
use crate::planning::inventory::{is_terminal, is_terminating};
use crate::planning::protection;
use crate::planning::velero_pods;
use crate::signals::detect::nodeclaim_of;
use crate::signals::let_go::{let_go, may_let_go};
use crate::telemetry::Metrics;

/// How often every pod in the cache is looked at again (a missed event, a plan that ended).
const SWEEP: Duration = Duration::from_secs(5);

/// Writes `patch` to `pod`'s annotations. `Ok(false)` when the pod changed or went meanwhile (the next
/// event or sweep looks again).
pub async fn apply(
    client: &Client,
    pod: &Pod,
    patch: &AnnotationPatch,
) -> Result<bool, kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let body = holds::merge_patch(pod, patch);
    match api
        .patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&body),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Writes `patch` to the Node's annotations. `Ok(false)` when the Node changed or went meanwhile.
pub async fn apply_node(
    client: &Client,
    node: &Node,
    patch: &AnnotationPatch,
) -> Result<bool, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let body = holds::merge_patch(node, patch);
    match api
        .patch(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&body),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether a pod keeps its node held: it carries snapdrain's hold (not released) and is not leaving. A
/// Velero data-path pod's hold is its own: it keeps Karpenter off the pod, not off the node.
pub fn holds_its_node(pod: &Pod) -> bool {
    matches!(holds::state(pod), HoldState::Held(_))
        && !is_terminal(pod)
        && !is_terminating(pod)
        && velero_pods::data_path_owner(pod).is_none()
}

/// Brings the Node `name` to the hold its pods want (`needed`). From the cache: a Node not cached yet is
/// looked at on a later sweep.
pub async fn ensure_node(
    client: &Client,
    nodes: &Cache<Node>,
    name: &str,
    needed: bool,
) -> Option<&'static str> {
    let node = nodes.get("", name)?;
    let (action, patch) = holds::node_change(&node, needed)?;
    match apply_node(client, &node, &patch).await {
        Ok(true) => {
            tracing::debug!(node = name, action, "node hold");
            Some(action)
        }
        Ok(false) => None,
        Err(e) => {
            tracing::warn!(node = name, error = %e, "cannot change snapdrain's hold on the node (may snapdrain patch nodes?); retrying");
            None
        }
    }
}

/// Whether the node `name` is let go ([`let_go`]), from the caches; shared by the hold keeper (asked
/// for every protected pod on each sweep) and the eviction gate. A cheap first look comes first: most
/// nodes are not being taken, and only then is the NodeClaim converted and every plan looked through.
pub fn node_let_go(
    nodes: &Cache<Node>,
    claims: &Cache<CachedNodeClaim>,
    name: &str,
    signals: &SignalsSpec,
    plans: &Store<DisruptionPlan>,
) -> bool {
    let Some(node) = nodes.get("", name) else {
        return false;
    };
    let claim = nodeclaim_of(&node).and_then(|c| claims.get("", c));
    let deleting = claim.as_ref().is_some_and(|c| c.deleting());
    if !may_let_go(&node, deleting) {
        return false;
    }
    let claim = claim.map(|c| c.to_value());
    let_go(
        &node,
        claim.as_ref(),
        signals,
        &plans.state(),
        jiff::Timestamp::now(),
    )
    .is_some()
}

/// Whether the plan named `name` still runs, from the plans this leader lists and watches: in the
/// store and not over. A plan missing from a listed store is gone (deleted): the store is this
/// leader's own reflector, which held every plan this leader reconciled before that plan could
/// release a hold, and a previous leader's plans were in its first list. No GET: the ClusterRole
/// grants none on plans (a 403 read as "running" kept a deleted plan's pods released for good).
/// `None` until the first list is in: unknown, the pod is left as it is and looked at again on the
/// next event or sweep.
fn plan_running(plans: &Store<DisruptionPlan>, name: &str) -> Option<bool> {
    use futures::FutureExt as _;
    plans.wait_until_ready().now_or_never()?.ok()?;
    Some(plans.get(&ObjectRef::new(name)).is_some_and(|p| {
        p.metadata.deletion_timestamp.is_none()
            && !p
                .status
                .as_ref()
                .map(|s| s.phase)
                .unwrap_or_default()
                .is_terminal()
    }))
}

struct Keeper {
    client: Client,
    plans: Store<DisruptionPlan>,
    namespaces: Cache<Namespace>,
    nodes: Cache<Node>,
    claims: Cache<CachedNodeClaim>,
    pods: Cache<CachedPod>,
    policy: watch::Receiver<DisruptionPolicySpec>,
    metrics: Metrics,
}

impl Keeper {
    /// Brings one pod to the state the policy and its plan want. Returns whether the pod now keeps its
    /// node held (`None`: not known yet, the node's hold is left as it is).
    async fn ensure(&self, pod: &Pod) -> Option<bool> {
        if is_terminal(pod) || is_terminating(pod) {
            return Some(false);
        }
        if self.is_active_data_path(pod) {
            if let Some(patch) = holds::place_data_path(pod) {
                self.write(pod, "placed", &patch).await;
            }
            return Some(false);
        }
        let (protection, ca) = {
            let policy = self.policy.borrow();
            (policy.protection.clone(), policy.holds.cluster_autoscaler)
        };
        let ns_labels = self.namespaces.labels_of(pod);
        if protection.namespace_selector.is_some() && ns_labels.is_none() {
            // The namespace is not cached yet (start-up): deciding now could take a hold away.
            return None;
        }
        let protected = protection::protects(&protection, pod, ns_labels.as_ref());
        let (change, holds_node) = match (protected, holds::state(pod)) {
            (false, _) => (holds::remove(pod).map(|p| ("removed", p)), false),
            // A node going whatever snapdrain does, which snapdrain will not back up: holding on would
            // only keep its termination waiting (the signal watcher says so on the Node).
            (true, _) if self.let_go(pod) => (holds::remove(pod).map(|p| ("let-go", p)), false),
            (true, HoldState::Released(plan)) => match plan_running(&self.plans, &plan) {
                Some(true) => (None, false),
                Some(false) => (holds::restore(pod, ca).map(|p| ("restored", p)), true),
                None => return None,
            },
            (true, _) => (holds::place(pod, ca).map(|p| ("placed", p)), true),
        };
        if let Some((action, patch)) = change {
            self.write(pod, action, &patch).await;
        }
        Some(holds_node)
    }

    /// Whether the pod's node is being taken on a clock snapdrain cannot stop with no backup to come.
    fn let_go(&self, pod: &Pod) -> bool {
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| {
                node_let_go(
                    &self.nodes,
                    &self.claims,
                    n,
                    &self.policy.borrow().signals,
                    &self.plans,
                )
            })
    }

    /// A Velero data-path pod whose backup runs, in a Velero namespace snapdrain knows (the policy's, or
    /// a running plan's).
    fn is_active_data_path(&self, pod: &Pod) -> bool {
        // Cheap first: most pods the sweep looks at are protected pods, not Velero's.
        if velero_pods::data_path_owner(pod).is_none() {
            return false;
        }
        let default_namespace = self.policy.borrow().backup.velero_namespace.clone();
        let plans = self.plans.state();
        let namespaces = velero_pods::velero_namespaces(&default_namespace, &plans);
        velero_pods::active_data_path(pod, &namespaces).is_some()
    }

    async fn write(&self, pod: &Pod, action: &str, patch: &AnnotationPatch) {
        match apply(&self.client, pod, patch).await {
            Ok(true) => {
                self.metrics.hold_change(action);
                if action == "let-go" {
                    self.metrics.pods_left_unbacked.inc();
                }
                tracing::debug!(pod = %format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()), action, "hold");
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(
                pod = %format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
                error = %e,
                "cannot {action} snapdrain's hold (may snapdrain patch pods?); retrying"
            ),
        }
    }

    /// After one pod was looked at: its node is held while this pod or another one there keeps it so
    /// (the others as the cache has them).
    async fn ensure_node_of(&self, pod: &Pod, this_one: Option<bool>) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            return;
        };
        let Some(this_one) = this_one else { return };
        let uid = pod.metadata.uid.as_deref();
        let needed = this_one
            || self
                .pods
                .indexed(node)
                .iter()
                .filter(|p| p.uid().as_deref() != uid)
                .any(|p| holds_its_node(&p.to_pod()));
        self.node_action(ensure_node(&self.client, &self.nodes, node, needed).await);
    }

    fn node_action(&self, action: Option<&'static str>) {
        if let Some(action) = action {
            self.metrics.hold_change(&format!("node-{action}"));
        }
    }

    /// Publishes `snapdrain_pods_held{action}` from one sweep's counts.
    fn count(&self, by_state: BTreeMap<&str, i64>) {
        for (state, n) in by_state {
            self.metrics
                .pods_held
                .get_or_create(&crate::telemetry::metrics::HoldLabel {
                    action: state.into(),
                })
                .set(n);
        }
    }
}

/// Keeps the holds until `until` resolves: each pod the shared cache adds or changes is looked at at
/// once, and every cached pod on each sweep (and after a burst the follower could not keep up with).
pub async fn run(
    client: Client,
    caches: Caches,
    plans: Store<DisruptionPlan>,
    policy: watch::Receiver<DisruptionPolicySpec>,
    metrics: Metrics,
    until: impl std::future::Future<Output = ()>,
) {
    let mut changed = caches.pods.follow();
    let mut policy = policy;
    super::policy::wait_for_policy(&mut policy).await;
    let keeper = Keeper {
        client,
        plans,
        namespaces: caches.namespaces.clone(),
        nodes: caches.nodes.clone(),
        claims: caches.node_claims.clone(),
        pods: caches.pods.clone(),
        policy,
        metrics,
    };
    let mut sweep = tokio::time::interval(SWEEP);
    let mut until = std::pin::pin!(until);
    let mut synced = caches.pods.synced();
    loop {
        tokio::select! {
            _ = &mut until => return,
            // The pods of the first list were not followed: look at them all as soon as it is in.
            in_now = caches.pods.wait_synced(SWEEP), if !synced => if in_now {
                synced = true;
                sweep.reset_immediately();
            },
            event = changed.recv() => match event {
                Ok(pod) if pod.may_be_held() => {
                    let pod = pod.to_pod();
                    let holds_node = keeper.ensure(&pod).await;
                    keeper.ensure_node_of(&pod, holds_node).await;
                }
                Ok(_) => {}
                // Missed changes are caught up by looking at every pod now.
                Err(broadcast::error::RecvError::Lagged(_)) => sweep.reset_immediately(),
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = sweep.tick() => {
                // Before the first list, an empty cache is not "no pods": nothing to count or look at. Nor is
                // an empty Node cache "no nodes".
                if !caches.pods.synced() || !caches.nodes.synced() {
                    continue;
                }
                // Per node: whether a pod there keeps it held (`None`: a pod's protection not known yet).
                let mut nodes_needed: BTreeMap<String, Option<bool>> = BTreeMap::new();
                // One pod at a time back to the Pod form: the cache stays the only copy of them all.
                let mut by_state: BTreeMap<&str, i64> = [("held", 0), ("released", 0)].into();
                for cached in caches.pods.all() {
                    if !cached.may_be_held() {
                        continue;
                    }
                    let pod = cached.to_pod();
                    match holds::state(&pod) {
                        HoldState::Held(_) => *by_state.entry("held").or_default() += 1,
                        HoldState::Released(_) => *by_state.entry("released").or_default() += 1,
                        HoldState::Unheld => {}
                    }
                    let holds_node = keeper.ensure(&pod).await;
                    if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
                        let entry = nodes_needed.entry(node).or_insert(Some(false));
                        *entry = match (*entry, holds_node) {
                            (Some(a), Some(b)) => Some(a || b),
                            (Some(true), None) => Some(true),
                            _ => None,
                        };
                    }
                }
                keeper.count(by_state);
                for node in caches.nodes.all() {
                    let name = node.name_any();
                    match nodes_needed.get(&name) {
                        Some(None) => {}
                        Some(Some(needed)) => keeper.node_action(ensure_node(&keeper.client, &keeper.nodes, &name, *needed).await),
                        None => keeper.node_action(ensure_node(&keeper.client, &keeper.nodes, &name, false).await),
                    }
                }
            }
        }
    }
}
