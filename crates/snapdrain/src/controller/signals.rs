//! The signal watcher: Nodes and Karpenter NodeClaims are followed by watch; a node that shows a
//! disruption signal ([`crate::signals::detect`]) and runs protected pods gets a plan, or its signal
//! joins the plan running for it. Graceful signals wait for a maintenance window and for a slot under the
//! policy's concurrency limits; forceful ones never wait. Runs on the Lease holder only.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event as CoreEvent, Node, ObjectReference, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{mpsc, watch};

use super::cache::{Cache, CachedNodeClaim, CachedPod, Caches};

use crate::api::DisruptionPlan;
use crate::api::policy::DisruptionPolicySpec;
use crate::planning::protection;
use crate::signals::detect::{detect, node_pool_of, nodeclaim_of, pod_grace, spot_deadline};
use crate::signals::let_go::{LetGo, let_go, may_let_go};
use crate::signals::limits::{Slots, admit, takes_slot};
use crate::signals::plan::{
    Choice, NODE_LABEL, NodeSignal, Outcome, choose, plans_by_node, source_name,
};
use crate::signals::window;
use crate::signals::{join_or_create, spec_for};
use crate::telemetry::Metrics;

/// How often every node is looked at again without an event (a freed concurrency slot, a deadline).
const TICK: Duration = Duration::from_secs(2);
/// How long a node under a graceful signal, found without protected pods, is trusted to stay so before
/// its pods are listed again ([`trusts_unprotected`]).
const RECHECK_UNPROTECTED: Duration = Duration::from_secs(30);
/// Longest a plan this watcher created is counted against the limits before the plan cache shows it
/// (the cache's watch is milliseconds behind).
const CREATED_LAG: Duration = Duration::from_secs(10);
/// Longest a Node or NodeClaim change waits before it is looked at.
const DEBOUNCE: Duration = Duration::from_millis(250);

struct Watcher {
    client: Client,
    plans: Store<DisruptionPlan>,
    nodes: Cache<Node>,
    claims: Cache<CachedNodeClaim>,
    pods: Cache<CachedPod>,
    policy: watch::Receiver<DisruptionPolicySpec>,
    metrics: Metrics,
    /// Plans this watcher created that the plan cache may not show yet: their node's pool, and when.
    created: BTreeMap<String, (Option<String>, tokio::time::Instant)>,
    /// Events for the publisher task ([`publish_events`]).
    events: mpsc::Sender<(Event, ObjectReference)>,
    /// Publishes warnings at once, outside the paced backlog.
    recorder: Recorder,
    /// Signalled nodes found without protected pods, and when: under a graceful signal not listed again
    /// before [`RECHECK_UNPROTECTED`] ([`trusts_unprotected`]).
    unprotected: BTreeMap<String, tokio::time::Instant>,
    /// Nodes whose signal waits for a slot (logged once, not every tick).
    waiting: BTreeSet<String>,
    /// Nodes being taken that snapdrain will not back up, announced on the Node ([`let_go`]).
    let_go: BTreeSet<String>,
    /// Spot interruption notices looked up for nodes whose NodeClaim is being deleted.
    spot_notices: BTreeMap<String, SpotNotice>,
    /// The signal each node showed at the last look (node -> reason): a Node or NodeClaim change that
    /// shows another is looked at without waiting for the debounce.
    signalled: BTreeMap<String, String>,
}

/// What [`Watcher::spot_notice`] found for a node.
enum SpotNotice {
    Found(jiff::Timestamp),
    /// None when last asked.
    NoneAt(tokio::time::Instant),
}

/// When an Event happened: `eventTime` (events.k8s.io writers), else `firstTimestamp` (client-go's
/// core/v1 recorder), else its creation.
fn event_time(e: &CoreEvent) -> Option<jiff::Timestamp> {
    e.event_time
        .as_ref()
        .map(|t| t.0)
        .or_else(|| e.first_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

impl Watcher {
    /// The slots the running signal plans take, counted once per look: the plan cache's, and the
    /// plans this watcher made that the cache does not show yet (its watch runs behind the create, and
    /// a look counting from the cache alone admitted one plan past `maxPlans`).
    fn slots<'a>(
        &mut self,
        nodes: impl Iterator<Item = &'a Node>,
        plans: &[std::sync::Arc<DisruptionPlan>],
    ) -> Slots {
        let pool_of: BTreeMap<&str, &str> = nodes
            .filter_map(|n| Some((n.metadata.name.as_deref()?, node_pool_of(n)?)))
            .collect();
        let mut slots = Slots::default();
        let cached: BTreeSet<&str> = plans
            .iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        // Until the cache shows it, or for CREATED_LAG at most: a plan deleted before the cache ever
        // held it must not keep its slot for good.
        self.created
            .retain(|name, (_, at)| !cached.contains(name.as_str()) && at.elapsed() < CREATED_LAG);
        for (pool, _) in self.created.values() {
            slots.take(pool.as_deref());
        }
        for p in plans {
            let phase = p.status.as_ref().map(|s| s.phase).unwrap_or_default();
            if !takes_slot(phase, p.spec.mode) || !p.labels().contains_key(NODE_LABEL) {
                continue;
            }
            slots.take(
                p.spec
                    .nodes
                    .iter()
                    .filter_map(|n| pool_of.get(n.as_str()).copied()),
            );
        }
        slots
    }

    /// The pods on the node the policy protects, as `namespace/name` (no plan is needed for a node
    /// without one).
    async fn protected_pods(&self, node: &str) -> Result<Vec<String>, kube::Error> {
        // The shared cache once it is filled; the API before (an empty cache is not "no pods").
        let on_node: Vec<Pod> = if self.pods.synced() {
            self.pods.indexed(node).iter().map(|p| p.to_pod()).collect()
        } else {
            Api::<Pod>::all(self.client.clone())
                .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
                .await?
                .items
        };
        let spec = self.policy.borrow().protection.clone();
        // Namespace labels are not at hand here: a namespace selector is applied by the hold keeper and
        // the plan; a plan for a node whose pods it then finds unprotected completes at once.
        let spec = crate::api::policy::ProtectionSpec {
            namespace_selector: None,
            ..spec
        };
        Ok(on_node
            .iter()
            .filter(|p| protection::protects(&spec, p, None))
            .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
            .collect())
    }

    /// The longest terminationGracePeriodSeconds of the node's protected pods, from the pod cache (zero
    /// before its first list: a later look, with the pods, moves the plan's deadline earlier).
    fn longest_grace(&self, node: &str) -> Duration {
        if !self.pods.synced() {
            return Duration::ZERO;
        }
        let spec = crate::api::policy::ProtectionSpec {
            namespace_selector: None,
            ..self.policy.borrow().protection.clone()
        };
        self.pods
            .indexed(node)
            .iter()
            .map(|p| p.to_pod())
            .filter(|p| protection::protects(&spec, p, None))
            .map(|p| pod_grace(&p))
            .max()
            .unwrap_or_default()
    }

    async fn look(&mut self) {
        let policy = self.policy.borrow().clone();
        let now = jiff::Timestamp::now();
        // The store's own Arcs: no copy of every plan on each look (this runs up to 4 times a second).
        let plans = self.plans.state();
        let by_node = plans_by_node(&plans);
        let no_plans = Vec::new();
        // The policy was validated before it was accepted: every window builds.
        let windows: Vec<window::Window> = policy
            .maintenance_windows
            .iter()
            .filter_map(|w| window::Window::new(w).ok())
            .collect();
        // Each node with its NodeClaim, looked up once. Nodes on a clock first (a NodeClaim being
        // deleted, NTH's forceful notices): a look that makes graceful plans, a request each, never
        // holds up a deadline.
        let mut nodes: Vec<_> = self
            .nodes
            .all()
            .into_iter()
            .map(|n| {
                let claim = nodeclaim_of(&n).and_then(|c| self.claims.get("", c));
                (n, claim)
            })
            .collect();
        nodes.sort_by_key(|(n, c)| !may_let_go(n, c.as_ref().is_some_and(|c| c.deleting())));
        let mut slots = self.slots(nodes.iter().map(|(n, _)| n.as_ref()), &plans);
        // Signals that began to wait in this look, and the first one's reason.
        let mut newly_waiting: Option<(usize, String)> = None;
        self.signalled.clear();
        // Nodes that are gone need no memory.
        self.spot_notices
            .retain(|n, _| nodes.iter().any(|(node, _)| node.name_any() == *n));
        for (node, claim) in nodes {
            let claim = claim.map(|c| c.to_value());
            let name = node.name_any();
            let plans = by_node.get(&name).unwrap_or(&no_plans);
            if let Some(why) = let_go(&node, claim.as_ref(), &policy.signals, plans, now) {
                if !self.let_go.contains(&name) {
                    self.announce_let_go(&node, &why).await;
                }
                continue;
            }
            self.let_go.remove(&name);
            let Some(mut signal) = detect(&node, claim.as_ref(), &policy.signals, now, || {
                self.longest_grace(&name)
            }) else {
                self.waiting.remove(&name);
                self.spot_notices.remove(&name);
                continue;
            };
            self.signalled.insert(name.clone(), signal.reason.clone());
            // A NodeClaim deleted without a termination time may be Karpenter acting on a spot
            // interruption: its Event dates the notice, and EC2 takes the instance two minutes later.
            // So may a node Karpenter has tainted `karpenter.sh/disrupted`: its termination controller
            // taints the node after the claim is deleted (kubernetes-sigs/karpenter
            // `pkg/controllers/node/termination/controller.go`, `terminator.Taint` with
            // `DisruptedNoScheduleTaint`), and the Node's watch can bring the taint
            // before the NodeClaim's brings the deletion. Karpenter publishes the Event before it
            // deletes the claim, so the deadline is usually known from the first look either way, and
            // the plan does not start a Velero copy of volumes EC2 snapshots will hold (a Backup in
            // progress cannot be cancelled, and it would hold Velero's queue past the deadline).
            if signal.deadline.is_none()
                && matches!(signal.reason.as_str(), "NodeClaimDeleted" | "Disrupting")
                && let Some(notice) = self.spot_notice(&name).await
            {
                signal.deadline = Some(spot_deadline(notice, self.longest_grace(&name)));
            }
            let mut protected = Vec::new();
            match choose(plans, &signal) {
                Choice::Join {
                    record: false,
                    earlier_deadline: None,
                    ..
                }
                | Choice::Settled { .. } => continue,
                Choice::Join { .. } => {}
                Choice::Create { .. } => {
                    let forceful = crate::signals::detect::is_forceful(&signal);
                    let pool = node_pool_of(&node);
                    let admitted = if !forceful && !window::open(&windows, now) {
                        Err("outside the policy's maintenance windows".to_owned())
                    } else {
                        admit(&policy.concurrency, &slots.running(pool), forceful)
                    };
                    // Still waiting, and said so: nothing more to look at (its pods are listed again
                    // once it may start). A consolidation burst keeps thousands of nodes here.
                    if admitted.is_err() && self.waiting.contains(&signal.node) {
                        continue;
                    }
                    let found_unprotected =
                        self.unprotected.get(&signal.node).map(|at| at.elapsed());
                    if trusts_unprotected(found_unprotected, forceful) {
                        continue;
                    }
                    match self.protected_pods(&signal.node).await {
                        Ok(pods) if !pods.is_empty() => {
                            self.unprotected.remove(&signal.node);
                            protected = pods;
                        }
                        Ok(_) => {
                            self.unprotected
                                .insert(signal.node.clone(), tokio::time::Instant::now());
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(node = %signal.node, error = %e, "cannot list the node's pods for a disruption signal; retrying");
                            continue;
                        }
                    }
                    if let Err(why) = admitted {
                        if self.waiting.insert(signal.node.clone()) {
                            self.metrics.signal(source_name(signal.source), "waiting");
                            tracing::debug!(node = %signal.node, reason = %signal.reason, "disruption signal waits: {why}");
                            newly_waiting.get_or_insert_with(|| (0, why.clone())).0 += 1;
                            // On the Node, where `kubectl describe node` shows why nothing happens yet.
                            let event = Event {
                                type_: EventType::Normal,
                                reason: "DisruptionWaiting".into(),
                                note: Some(format!(
                                    "{} signal {} waits before snapdrain backs the node up: {why}",
                                    source_name(signal.source),
                                    signal.reason
                                )),
                                action: "Plan".into(),
                                secondary: None,
                            };
                            self.announce(event, &node);
                        }
                        continue;
                    }
                }
            }
            if let Some(plan) = self.act(&signal, &policy, &protected).await {
                let pool = node_pool_of(&node);
                slots.take(pool);
                self.created
                    .insert(plan, (pool.map(str::to_owned), tokio::time::Instant::now()));
            }
        }
        // One line a look, not one a node: a consolidation burst at 5,000 nodes starts thousands of
        // waits at once (each Node's Event says it for that node).
        if let Some((n, why)) = newly_waiting {
            tracing::info!(
                nodes = n,
                "{n} disruption signal(s) wait before snapdrain backs their nodes up: {why}"
            );
        }
    }

    /// When Karpenter announced a spot interruption of `node`: the earliest `SpotInterrupted` Event on
    /// the Node (aws/karpenter-provider-aws `pkg/controllers/interruption/controller.go`
    /// `notifyForMessage`, `events/events.go`; client-go files events of cluster-scoped objects in
    /// `default`). Asked again at most every [`TICK`] while none is found (Karpenter's recorder sends
    /// the Event a moment after it deletes the claim); a found notice is kept.
    async fn spot_notice(&mut self, node: &str) -> Option<jiff::Timestamp> {
        match self.spot_notices.get(node) {
            Some(SpotNotice::Found(t)) => return Some(*t),
            Some(SpotNotice::NoneAt(at)) if at.elapsed() < TICK => return None,
            _ => {}
        }
        let params = ListParams::default().fields(&format!(
            "involvedObject.kind=Node,involvedObject.name={node},reason=SpotInterrupted"
        ));
        let found = match Api::<CoreEvent>::namespaced(self.client.clone(), "default")
            .list(&params)
            .await
        {
            Ok(list) => list.items.iter().filter_map(event_time).min(),
            Err(e) => {
                tracing::debug!(node, error = %e, "cannot list the node's SpotInterrupted events");
                None
            }
        };
        self.spot_notices.insert(
            node.to_owned(),
            match found {
                Some(t) => SpotNotice::Found(t),
                None => SpotNotice::NoneAt(tokio::time::Instant::now()),
            },
        );
        found
    }

    /// Says once on the Node (where `kubectl describe node` shows it) that its protected pods go
    /// without a backup. Not said for a node without protected pods: nothing of them is lost.
    async fn announce_let_go(&mut self, node: &Node, why: &LetGo) {
        let name = node.name_any();
        let protected = match self.protected_pods(&name).await {
            Ok(pods) => pods,
            Err(e) => {
                tracing::warn!(node = %name, error = %e, "cannot list the node's pods for a disruption signal; retrying");
                return;
            }
        };
        self.let_go.insert(name.clone());
        if protected.is_empty() {
            return;
        }
        let message = format!("{} ({})", why.message(), protected.join(", "));
        tracing::warn!(node = %name, "{message}");
        let event = Event {
            type_: EventType::Warning,
            reason: "ProtectedPodsLetGo".into(),
            note: Some(message),
            action: "Release".into(),
            secondary: None,
        };
        self.announce(event, node);
    }

    /// Hands an Event on the Node to the publisher task: a look never waits for the API server to
    /// store an Event. A consolidation burst made hundreds of DisruptionWaiting Events in one look,
    /// each an awaited request, and the look they held up did not see a spot interruption's
    /// NodeClaim deletion until the instance was gone. Past [`EVENT_BACKLOG`] Events are dropped, as
    /// client-go's broadcaster drops them past its queue of 1,000 (`tools/record/event.go`,
    /// `maxQueuedEvents`).
    fn announce(&self, event: Event, node: &Node) {
        let reference = node.object_ref(&());
        // A warning (protected pods let go) is rare and must not wait behind, or be dropped with, a
        // wave of DisruptionWaiting Events.
        if event.type_ == EventType::Warning {
            let recorder = self.recorder.clone();
            tokio::spawn(async move {
                if let Err(e) = recorder.publish(&event, &reference).await {
                    tracing::debug!(error = %e, "cannot publish an event");
                }
            });
            return;
        }
        if let Err(e) = self.events.try_send((event, reference)) {
            tracing::debug!(node = %node.name_any(), error = %e, "event backlog full: an Event on the Node is dropped (the log line stands)");
        }
    }

    async fn act(
        &mut self,
        signal: &NodeSignal,
        policy: &DisruptionPolicySpec,
        protected: &[String],
    ) -> Option<String> {
        let source = source_name(signal.source);
        match join_or_create(
            &self.client,
            signal,
            &spec_for(signal, &policy.plan_defaults()),
            protected,
        )
        .await
        {
            Ok(outcome) => {
                self.waiting.remove(&signal.node);
                let what = match &outcome {
                    Outcome::Created(_) => "created",
                    Outcome::Joined(_) => "joined",
                    Outcome::Settled { .. } => "settled",
                };
                self.metrics.signal(source, what);
                tracing::info!(node = %signal.node, source, reason = %signal.reason, plan = %outcome.plan(), "disruption signal {what} a plan");
                match outcome {
                    Outcome::Created(plan) => Some(plan),
                    Outcome::Joined(_) | Outcome::Settled { .. } => None,
                }
            }
            Err(e) => {
                self.metrics.signal(source, "error");
                tracing::warn!(node = %signal.node, error = %e, "cannot turn a disruption signal into a plan");
                None
            }
        }
    }
}

impl Watcher {
    /// Whether `node`, as it just changed, shows a signal the last look did not see on it (a cheap
    /// look at one node: the deadline's grace is not worked out here).
    fn shows_new_signal(&self, node: &Node) -> bool {
        let claim = nodeclaim_of(node)
            .and_then(|c| self.claims.get("", c))
            .map(|c| c.to_value());
        let policy = self.policy.borrow();
        detect(
            node,
            claim.as_ref(),
            &policy.signals,
            jiff::Timestamp::now(),
            || Duration::ZERO,
        )
        .is_some_and(|s| self.signalled.get(&s.node) != Some(&s.reason))
    }

    /// [`Self::shows_new_signal`] for the node of a NodeClaim that just changed.
    fn claim_shows_new_signal(&self, claim: &CachedNodeClaim) -> bool {
        claim
            .node_name()
            .and_then(|n| self.nodes.get("", n))
            .is_some_and(|node| self.shows_new_signal(&node))
    }
}

/// Watches for signals until `until` resolves, on the shared Node and NodeClaim caches.
pub async fn run(
    client: Client,
    caches: Caches,
    plans: Store<DisruptionPlan>,
    policy: watch::Receiver<DisruptionPolicySpec>,
    metrics: Metrics,
    recorder: Recorder,
    until: impl std::future::Future<Output = ()>,
) {
    let mut node_changes = caches.nodes.changes();
    // Without Karpenter the NodeClaim watch fails and backs off; other signals still work.
    let mut claim_changes = caches.node_claims.changes();
    // The changed objects themselves, to tell a new signal from an ordinary update. A lagging follower
    // misses some, which the `changes` above still mark dirty.
    let mut node_follow = caches.nodes.follow();
    let mut claim_follow = caches.node_claims.follow();
    let mut policy = policy;
    super::policy::wait_for_policy(&mut policy).await;
    let (events, backlog) = mpsc::channel(EVENT_BACKLOG);
    // Ends when the watcher (the only sender) does.
    tokio::spawn(publish_events(recorder.clone(), backlog));
    let mut w = Watcher {
        client,
        plans,
        nodes: caches.nodes.clone(),
        claims: caches.node_claims.clone(),
        pods: caches.pods.clone(),
        policy,
        metrics,
        events,
        recorder,
        created: BTreeMap::new(),
        unprotected: BTreeMap::new(),
        waiting: BTreeSet::new(),
        let_go: BTreeSet::new(),
        spot_notices: BTreeMap::new(),
        signalled: BTreeMap::new(),
    };
    let mut until = std::pin::pin!(until);
    // Changes mark the view dirty; `look_due` decides when a look (which covers every node) runs.
    let mut tick = tokio::time::interval(CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut dirty, mut urgent) = (true, false);
    let mut last: Option<Look> = None;
    loop {
        tokio::select! {
            _ = &mut until => return,
            Ok(()) = node_changes.changed() => dirty = true,
            Ok(()) = claim_changes.changed() => dirty = true,
            Ok(node) = node_follow.recv() => urgent |= w.shows_new_signal(&node),
            Ok(claim) = claim_follow.recv() => urgent |= w.claim_shows_new_signal(&claim),
            _ = tick.tick() => {}
        }
        // Before the Node cache's first list there is nothing to look at yet.
        if look_due(dirty, urgent, last, tokio::time::Instant::now()) && w.nodes.synced() {
            (dirty, urgent) = (false, false);
            let started = tokio::time::Instant::now();
            w.look().await;
            let took = started.elapsed();
            tracing::trace!(
                took_us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
                "looked at every node for disruption signals"
            );
            // Said when looks turn slow, not on every slow one.
            let was_slow = last.is_some_and(|l| l.took > SLOW_LOOK);
            if took > SLOW_LOOK && !was_slow {
                tracing::warn!(
                    took_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
                    "a look for disruption signals over every node took {took:?}: a new signal (a NodeClaim deleted, a spot notice) waits up to twice that before it becomes a plan"
                );
            }
            last = Some(Look {
                since: started,
                took,
            });
        }
    }
}

/// Events waiting for [`publish_events`]; past it they are dropped.
const EVENT_BACKLOG: usize = 1024;
/// The least time between two of the watcher's Events (20 a second).
const EVENT_GAP: Duration = Duration::from_millis(50);

/// Publishes the watcher's Events one at a time, apart from its looks, at most one per
/// [`EVENT_GAP`]: a consolidation wave at 5,000 nodes gives thousands of waiting nodes an Event each,
/// which unpaced was thousands of API requests within seconds.
async fn publish_events(recorder: Recorder, mut backlog: mpsc::Receiver<(Event, ObjectReference)>) {
    while let Some((event, reference)) = backlog.recv().await {
        if let Err(e) = recorder.publish(&event, &reference).await {
            tracing::debug!(error = %e, "cannot publish an event");
        }
        tokio::time::sleep(EVENT_GAP).await;
    }
}

/// A look slower than this is logged: a new signal's plan then waits seconds. A look that makes its
/// maxPlans (10) plans in a consolidation wave took up to 3.1 s in the scale-5k soak on 2 busy cores.
const SLOW_LOOK: Duration = Duration::from_secs(5);

/// How often the loop asks [`look_due`] without a change.
const CHECK: Duration = Duration::from_millis(25);
/// The least time between looks for new signals: a burst of them (every NodeClaim of a pool marked
/// drifted) is looked at in steps, not once per object.
const URGENT_GAP: Duration = Duration::from_millis(25);

/// When the last look started, and how long it took.
#[derive(Clone, Copy, Debug)]
struct Look {
    since: tokio::time::Instant,
    took: Duration,
}

/// Whether the signal watcher looks now.
/// - A new signal (`urgent`) at once, so a NodeClaim deleted becomes a plan in milliseconds: once
///   [`URGENT_GAP`] has passed since the last look and at least twice that look's duration (a look
///   covers every node, so at 5,000 nodes it is not free: a burst of signals never keeps the
///   watcher looking more than a third of the time).
/// - Other changes (`dirty`) once [`DEBOUNCE`] has passed: a burst of Node updates costs one look
///   per `DEBOUNCE`.
/// - Without any change, every [`TICK`] (a freed concurrency slot, a deadline).
///
/// Before the first look, at once.
fn look_due(dirty: bool, urgent: bool, last: Option<Look>, now: tokio::time::Instant) -> bool {
    let Some(last) = last else {
        return true;
    };
    let since = now.saturating_duration_since(last.since);
    (urgent && since >= URGENT_GAP.max(last.took * 2))
        || (dirty && since >= DEBOUNCE)
        || since >= TICK
}

/// Whether a node found without protected pods `found_unprotected` ago is taken to have none still,
/// without looking at its pods again. Under a graceful signal, for [`RECHECK_UNPROTECTED`]: a protected
/// pod that arrives meanwhile is held by the hold keeper, so the autoscaler waits for the next look.
/// Never under a forceful one (a spot interruption, a NodeClaim deleted): its clock runs whatever holds
/// the pods, and a protected pod scheduled there since the last look (the soak saw them, rescheduled
/// from another disrupted node) would be lost with the instance, unbacked, before the recheck.
fn trusts_unprotected(found_unprotected: Option<Duration>, forceful: bool) -> bool {
    !forceful && found_unprotected.is_some_and(|ago| ago < RECHECK_UNPROTECTED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    fn look(at: Instant, took_ms: u64) -> Option<Look> {
        Some(Look {
            since: at,
            took: Duration::from_millis(took_ms),
        })
    }

    #[test]
    fn a_forceful_signal_always_looks_at_the_pods_again() {
        let just = Some(Duration::from_secs(1));
        assert!(
            trusts_unprotected(just, false),
            "graceful: trusted for a while"
        );
        assert!(
            !trusts_unprotected(Some(RECHECK_UNPROTECTED), false),
            "graceful: looked at again once the recheck is due"
        );
        assert!(!trusts_unprotected(None, false), "never found unprotected");
        assert!(!trusts_unprotected(just, true), "forceful: every look");
    }

    #[test]
    fn a_new_signal_is_looked_at_without_the_debounce() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert!(
            look_due(false, false, None, t0),
            "the first look is at once"
        );
        // 30 ms after a 1 ms look: a new signal goes now, an ordinary change waits for DEBOUNCE.
        assert!(look_due(true, true, look(t0, 1), at(30)));
        assert!(!look_due(true, false, look(t0, 1), at(30)));
        assert!(look_due(true, false, look(t0, 1), at(250)));
        // Nothing changed: only the periodic look.
        assert!(!look_due(false, false, look(t0, 1), at(1999)));
        assert!(look_due(false, false, look(t0, 1), at(2000)));
    }

    #[test]
    fn new_signals_never_keep_the_watcher_looking_more_than_a_third_of_the_time() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert!(!look_due(false, true, look(t0, 1), at(10)), "URGENT_GAP");
        // A look that took 100 ms (thousands of nodes) is followed by 200 ms without one.
        assert!(!look_due(false, true, look(t0, 100), at(150)));
        assert!(look_due(false, true, look(t0, 100), at(200)));
    }
}
