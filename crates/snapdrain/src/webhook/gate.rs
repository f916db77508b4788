//! One AdmissionReview in, one answer out: read the request, find the pod in the shared pod cache,
//! decide over the cached plans, and for a held pod hand its node to the plan starter. Velero's own
//! pods a backup needs are kept too: its 1.17+ data-path pods while they run, its server while a plan
//! backs up, its node-agent while its node is backed up (`planning::velero_pods`). No API call on
//! the way: kube-apiserver admits the eviction when the gate does not answer within the webhook's
//! `timeoutSeconds` under `failurePolicy: Ignore` (`apiserver/pkg/admission/plugin/webhook/validating/
//! dispatcher.go`), so an answer that waits on a slow API server is a protected pod evicted unbacked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};

use super::decision::{self, Decision, PlanNote};
use super::review::{self, Answer, Target};
use super::starter::{self, Requested, Starter};
use tokio::sync::watch;

use crate::api::DisruptionPlan;
use crate::api::policy::DisruptionPolicySpec;
use crate::api::status::BackupRecord;
use crate::api::velero::Backup;
use crate::controller::cache::{Cache, CachedNodeClaim, CachedPod};
use crate::controller::holds::node_let_go;
use crate::planning::velero_pods;
use crate::signals::plan::{Choice, choose};
use crate::telemetry::Metrics;

/// Which pods the gate protects (the DisruptionPolicy's rule).
pub type Protects = Arc<dyn Fn(&Pod) -> bool + Send + Sync>;

/// At most one denial Event per pod in this window: kubectl retries every 5 s and Karpenter faster, and
/// an eviction storm must not become an Event storm.
const EVENT_WINDOW: Duration = Duration::from_secs(60);

/// How long a pod of Velero's namespace the pod cache has not seen is held after its first refusal. A
/// data-path pod reaches the cache milliseconds after it is created; a pod already deleted never does,
/// and a drainer retrying it must get the API server's 404 (kubectl drain retries every 5 s).
const UNSEEN_WINDOW: Duration = Duration::from_secs(3);
/// How long the first refusal of an unseen pod is remembered.
const UNSEEN_MEMORY: Duration = Duration::from_secs(300);

/// What the gate decides from: everything in memory, kept by watches.
pub struct Sources {
    /// DisruptionPlans, kept by the gate's reflector.
    pub plans: Store<DisruptionPlan>,
    /// The process's shared pod cache (indexed by node).
    pub pods: Cache<CachedPod>,
    /// The process's node cache: the node's uid names the plan the gate starts.
    pub nodes: Cache<Node>,
    /// The process's Karpenter NodeClaim cache: whether a node is being taken ([`let_go`]).
    pub claims: Cache<CachedNodeClaim>,
    /// The process's cache of snapdrain's Velero Backups: a plan's verified backup counts only when its
    /// Backup confirms it (`confirm`).
    pub backups: Cache<Backup>,
}

/// What the gate's handler shares.
pub struct Gate {
    sources: Sources,
    pub protects: Protects,
    /// The policy in force: the spec of plans the gate creates comes from its defaults.
    pub policy: watch::Receiver<DisruptionPolicySpec>,
    pub metrics: Metrics,
    pub recorder: Recorder,
    starter: Starter,
    last_event: Mutex<HashMap<String, Instant>>,
    /// First refusal of each unseen pod of Velero's namespace (`namespace/name`).
    unseen: Mutex<HashMap<String, Instant>>,
}

impl Gate {
    pub fn new(
        sources: Sources,
        starter: Starter,
        protects: Protects,
        policy: watch::Receiver<DisruptionPolicySpec>,
        metrics: Metrics,
        recorder: Recorder,
    ) -> Self {
        Self {
            sources,
            protects,
            policy,
            metrics,
            recorder,
            starter,
            last_event: Mutex::new(HashMap::new()),
            unseen: Mutex::new(HashMap::new()),
        }
    }

    /// Answers one body: never panics, whatever the bytes, and never waits on I/O.
    pub fn answer(&self, body: &[u8]) -> Answer {
        let asked = match review::parse(body) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "eviction gate: unreadable AdmissionReview");
                self.metrics.gate_decision("error");
                return review::unreadable(&e);
            }
        };
        let (namespace, name, dry_run) = match &asked.target {
            Target::NotGated(what) => {
                self.metrics.gate_decision("allowed");
                return review::allow(
                    &asked.request,
                    Some(format!(
                        "snapdrain's eviction gate only judges pods/eviction CREATE and allowed {what}; check the webhook's rules"
                    )),
                );
            }
            Target::Eviction {
                namespace,
                name,
                dry_run,
            } => (namespace, name, *dry_run),
        };
        match self.judge(namespace, name, dry_run) {
            None => {
                self.metrics.gate_decision("allowed");
                review::allow(&asked.request, None)
            }
            Some(message) => {
                self.metrics.gate_decision("denied");
                review::hold(&asked.request, &message)
            }
        }
    }

    /// The caches the gate reads that have not finished their first list, if any. Until they have,
    /// "not in the cache" would mean "not known yet", not "not there".
    fn loading(&self) -> Vec<&'static str> {
        let mut kinds = Vec::new();
        if !self.sources.pods.synced() {
            kinds.push("Pod");
        }
        if !self.sources.nodes.synced() {
            kinds.push("Node");
        }
        // Ready means the first list is in; it resolves at once then, so no request waits on it.
        if !matches!(
            self.sources.plans.wait_until_ready().now_or_never(),
            Some(Ok(()))
        ) {
            kinds.push("DisruptionPlan");
        }
        kinds
    }

    /// None to allow, or the message of the 429.
    fn judge(&self, namespace: &str, name: &str, dry_run: bool) -> Option<String> {
        let loading = self.loading();
        if !loading.is_empty() {
            return Some(decision::loading_message(namespace, name, &loading));
        }
        let plans = self.sources.plans.state();
        let default_namespace = self.policy.borrow().backup.velero_namespace.clone();
        let velero = velero_pods::velero_namespaces(&default_namespace, &plans);
        // Not in a synced cache: no such pod (kube-apiserver's eviction reads the pod after admission
        // and answers 404 itself, `pkg/registry/core/pod/storage/eviction.go`), or one created a moment
        // ago, which has run nothing yet. Except in Velero's namespace: a data-path pod is created the
        // moment a backup needs it, and going then fails that backup.
        let Some(cached) = self.sources.pods.get(namespace, name) else {
            let held = velero.contains(&namespace) && self.still_unseen(namespace, name);
            if !held {
                tracing::debug!(pod = %format!("{namespace}/{name}"), "eviction gate: allowed a pod its cache has not seen");
            }
            return held.then(|| decision::unseen_message(namespace, name));
        };
        let pod = cached.to_pod();
        if let Some(owner) = velero_pods::active_data_path(&pod, &velero) {
            let message = decision::data_path_message(&pod, &owner);
            if !dry_run {
                self.event_once(&pod, &message);
            }
            return Some(message);
        }
        if velero_pods::is_velero_server(&pod, &velero) {
            return decision::server_needed_by(&pod, &plans)
                .map(|plan| decision::server_message(&pod, &plan));
        }
        let protects = self.protects.clone();
        if decision::is_backup_agent(&pod) {
            return self.judge_agent(&pod, &plans);
        }
        let now = jiff::Timestamp::now();
        let confirm = |p: &DisruptionPlan, b: &BackupRecord| self.confirm(p, b);
        let held = match decision::decide(&pod, |p| protects(p), &plans, confirm, now) {
            Decision::Allow(why) => {
                if why != decision::Allowed::NotProtected {
                    tracing::debug!(pod = %format!("{namespace}/{name}"), why = ?why, "eviction gate: allowed a protected pod");
                }
                return None;
            }
            Decision::Deny(held) => held,
        };
        // A node going whatever snapdrain does, which it will not back up: refusing would only keep the
        // termination waiting (the hold keeper takes the holds off and the signal watcher says so).
        if node_let_go(
            &self.sources.nodes,
            &self.sources.claims,
            &held.node,
            &self.policy.borrow().signals,
            &self.sources.plans,
        ) {
            tracing::debug!(pod = %format!("{namespace}/{name}"), node = %held.node, "eviction gate: allowed a protected pod: its node is let go");
            return None;
        }
        let note = match &held.plan {
            Some(p) => PlanNote::Known(p.clone()),
            None => self.start_plan(&held.node, &plans, dry_run),
        };
        let message = decision::message(&held, &note);
        if !dry_run {
            self.event_once(&pod, &message);
        }
        Some(message)
    }

    /// Velero's node-agent runs the file-system backups of its node's pods: it stays while a plan backs
    /// the node up, and while the node runs protected pods no verified backup covers yet (a drainer that
    /// evicts every pod at once, as Cluster Autoscaler does, asks for the agent before the plan exists).
    fn judge_agent(&self, agent: &Pod, plans: &[Arc<DisruptionPlan>]) -> Option<String> {
        if let Some(plan) = decision::agent_needed_by(agent, plans) {
            return Some(decision::agent_message(agent, Some(&plan)));
        }
        let node = agent.spec.as_ref().and_then(|s| s.node_name.clone())?;
        let protects = self.protects.clone();
        let now = jiff::Timestamp::now();
        let uncovered = self.sources.pods.indexed(&node).iter().any(|p| {
            matches!(
                decision::decide(
                    &p.to_pod(),
                    |p| protects(p),
                    plans,
                    |p: &DisruptionPlan, b: &BackupRecord| self.confirm(p, b),
                    now
                ),
                Decision::Deny(_)
            )
        });
        uncovered.then(|| decision::agent_message(agent, None))
    }

    /// What becomes of the node's plan, decided over the store: a settled plan is said at once (no I/O
    /// on any retry), a new one is handed to the starter.
    fn start_plan(&self, node: &str, plans: &[Arc<DisruptionPlan>], dry_run: bool) -> PlanNote {
        let signal = starter::signal_for(node, &self.sources.nodes);
        let name = match choose(plans, &signal) {
            Choice::Settled { plan, phase } => return PlanNote::Settled { plan, phase },
            Choice::Join { plan, .. } | Choice::Create { name: plan } => plan,
        };
        // The webhook is registered with sideEffects NoneOnDryRun: a dry run starts nothing.
        if dry_run {
            return PlanNote::WouldStart;
        }
        match self.starter.request(node) {
            Requested::Starting => PlanNote::Starting(name),
            Requested::Failed | Requested::Busy => PlanNote::NotStarted,
        }
    }

    /// Whether the Backup cache confirms `plan`'s verified `record` (`webhook::confirm`). Until the cache
    /// has listed once, nothing is confirmed: the pod waits, it is never let go on the status alone.
    fn confirm(&self, plan: &DisruptionPlan, record: &BackupRecord) -> Result<(), String> {
        if !self.sources.backups.synced() {
            return Err(
                "the eviction gate's Velero Backup cache has not finished its first list (check that snapdrain may list and watch velero.io Backups)"
                    .into(),
            );
        }
        let backup = self
            .sources
            .backups
            .get(&plan.spec.backup.velero_namespace, &record.name);
        // The decision asks about a record not yet verified only for a release at its CSI snapshots.
        if record.verified {
            super::confirm::backup_confirms(plan, record, backup.as_deref())
        } else {
            super::confirm::snapshot_confirms(plan, record, backup.as_deref())
        }
    }

    /// Whether an unseen pod is still within [`UNSEEN_WINDOW`] of its first refusal (counting this one).
    fn still_unseen(&self, namespace: &str, name: &str) -> bool {
        let now = Instant::now();
        let mut unseen = self.unseen.lock().unwrap_or_else(|e| e.into_inner());
        // First refusals are remembered well past the window, so a drainer retrying a deleted pod is
        // not refused again on each retry.
        unseen.retain(|_, t| now.duration_since(*t) < UNSEEN_MEMORY);
        let first = *unseen.entry(format!("{namespace}/{name}")).or_insert(now);
        now.duration_since(first) < UNSEEN_WINDOW
    }

    /// A Warning Event on the pod, at most once per [`EVENT_WINDOW`] per pod.
    fn event_once(&self, pod: &Pod, message: &str) {
        let key = pod.uid().unwrap_or_else(|| pod.name_any());
        let now = Instant::now();
        {
            let mut last = self.last_event.lock().unwrap_or_else(|e| e.into_inner());
            last.retain(|_, t| now.duration_since(*t) < EVENT_WINDOW);
            if last.contains_key(&key) {
                return;
            }
            last.insert(key, now);
        }
        let event = Event {
            type_: EventType::Warning,
            reason: "EvictionHeld".into(),
            note: Some(message.chars().take(1000).collect()),
            action: "HoldEviction".into(),
            secondary: None,
        };
        // Events are best-effort and published off the request path: the answer matters, not its record.
        let recorder = self.recorder.clone();
        let regarding = pod.object_ref(&());
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &regarding).await {
                tracing::debug!(pod = ?regarding.name, error = %e, "cannot publish the eviction gate's event");
            }
        });
    }
}
