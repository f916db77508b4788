//! One AdmissionReview in, one answer out: read the request, GET the pod, decide over the cached plans,
//! and for a held pod start (or join) the plan for its node. The I/O around [`decision::decide`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};

use super::decision::{self, Decision, PlanNote};
use super::error::GateError;
use super::review::{self, Answer, Target};
use tokio::sync::watch;

use crate::api::policy::DisruptionPolicySpec;
use crate::api::{DisruptionPlan, PlanMode, PlanSource};
use crate::controller::cache::{Cache, CachedPod};
use crate::signals::{NodeSignal, Outcome, join_or_create};
use crate::telemetry::Metrics;

/// Which pods the gate protects (the DisruptionPolicy's rule).
pub type Protects = Arc<dyn Fn(&Pod) -> bool + Send + Sync>;

/// At most one denial Event per pod in this window: kubectl retries every 5 s and Karpenter faster, and
/// an eviction storm must not become an Event storm.
const EVENT_WINDOW: Duration = Duration::from_secs(60);

/// What the gate's handler shares.
pub struct Gate {
    pub client: Client,
    /// DisruptionPlans, kept by a reflector so a decision reads memory, not the API.
    pub plans: Store<DisruptionPlan>,
    /// The process's shared pod cache (indexed by node), for the node-agent decision.
    pub pods: Cache<CachedPod>,
    pub protects: Protects,
    /// The policy in force: the spec of plans the gate creates comes from its defaults.
    pub policy: watch::Receiver<DisruptionPolicySpec>,
    pub metrics: Metrics,
    pub recorder: Recorder,
    last_event: Mutex<HashMap<String, Instant>>,
}

impl Gate {
    pub fn new(
        client: Client,
        plans: Store<DisruptionPlan>,
        pods: Cache<CachedPod>,
        protects: Protects,
        policy: watch::Receiver<DisruptionPolicySpec>,
        metrics: Metrics,
        recorder: Recorder,
    ) -> Self {
        Self {
            client,
            plans,
            pods,
            protects,
            policy,
            metrics,
            recorder,
            last_event: Mutex::new(HashMap::new()),
        }
    }

    /// Answers one body: never panics, whatever the bytes.
    pub async fn answer(&self, body: &[u8]) -> Answer {
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
        match self.judge(namespace, name, dry_run).await {
            Ok(None) => {
                self.metrics.gate_decision("allowed");
                review::allow(&asked.request, None)
            }
            Ok(Some(message)) => {
                self.metrics.gate_decision("denied");
                review::hold(&asked.request, &message)
            }
            Err(e) => {
                tracing::warn!(error = %e, "eviction gate cannot decide");
                self.metrics.gate_decision("error");
                review::cannot_decide(&e.to_string())
            }
        }
    }

    /// None to allow, or the message of the 429.
    async fn judge(
        &self,
        namespace: &str,
        name: &str,
        dry_run: bool,
    ) -> Result<Option<String>, GateError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let Some(pod) = pods
            .get_opt(name)
            .await
            .map_err(|source| GateError::GetPod {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                source,
            })?
        else {
            // kube-apiserver answers the eviction of a missing pod with 404 itself.
            return Ok(None);
        };
        let plans = self.current_plans().await?;
        let protects = self.protects.clone();
        if decision::is_backup_agent(&pod) {
            return self.judge_agent(&pod, &plans).await;
        }
        let held = match decision::decide(&pod, |p| protects(p), &plans, jiff::Timestamp::now()) {
            Decision::Allow(_) => return Ok(None),
            Decision::Deny(held) => held,
        };
        let note = match &held.plan {
            Some(p) => PlanNote::Known(p.clone()),
            // The webhook is registered with sideEffects NoneOnDryRun: a dry run creates nothing.
            None if dry_run => PlanNote::WouldStart,
            None => self.start_plan(&held.node).await,
        };
        let message = decision::message(&held, &note);
        if !dry_run {
            self.event_once(&pod, &message).await;
        }
        Ok(Some(message))
    }

    /// Velero's node-agent runs the file-system backups of its node's pods: it stays while a plan backs
    /// the node up, and while the node runs protected pods no verified backup covers yet (a drainer that
    /// evicts every pod at once, as Cluster Autoscaler does, asks for the agent before the plan exists).
    async fn judge_agent(
        &self,
        agent: &Pod,
        plans: &[Arc<DisruptionPlan>],
    ) -> Result<Option<String>, GateError> {
        if let Some(plan) = decision::agent_needed_by(agent, plans) {
            return Ok(Some(decision::agent_message(agent, Some(&plan))));
        }
        let Some(node) = agent.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return Ok(None);
        };
        // The shared pod cache's node index once it is filled; the API before (an empty cache would
        // let the agent go while protected pods are still uncovered).
        let on_node: Vec<Pod> = if self.pods.synced() {
            self.pods
                .indexed(&node)
                .iter()
                .map(|p| p.to_pod())
                .collect()
        } else {
            Api::<Pod>::all(self.client.clone())
                .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
                .await
                .map_err(|source| GateError::ListNodePods {
                    node: node.clone(),
                    source,
                })?
                .items
        };
        let protects = self.protects.clone();
        let now = jiff::Timestamp::now();
        let uncovered = on_node.iter().any(|p| {
            matches!(
                decision::decide(p, |p| protects(p), plans, now),
                Decision::Deny(_)
            )
        });
        Ok(uncovered.then(|| decision::agent_message(agent, None)))
    }

    /// The cached plans, or (while the reflector's first list is not in yet) a list from the API: an
    /// empty cache would hold pods whose backups are verified.
    async fn current_plans(&self) -> Result<Vec<Arc<DisruptionPlan>>, GateError> {
        // Ready means the first list is in; it resolves at once then, so no request waits on it.
        if matches!(self.plans.wait_until_ready().now_or_never(), Some(Ok(()))) {
            return Ok(self.plans.state());
        }
        let api: Api<DisruptionPlan> = Api::all(self.client.clone());
        let list = api
            .list(&Default::default())
            .await
            .map_err(GateError::ListPlans)?;
        Ok(list.items.into_iter().map(Arc::new).collect())
    }

    async fn start_plan(&self, node: &str) -> PlanNote {
        // The node's uid lets a re-created node of the same name get a plan of its own; unknown is fine.
        let node_uid = Api::<Node>::all(self.client.clone())
            .get_opt(node)
            .await
            .ok()
            .flatten()
            .and_then(|n| n.uid())
            .unwrap_or_default();
        let signal = NodeSignal {
            node: node.to_owned(),
            node_uid,
            source: PlanSource::EvictionGate,
            reason: "EvictionRequested".into(),
            mode: PlanMode::Release,
            deadline: None,
        };
        let defaults = self.policy.borrow().plan_defaults();
        match join_or_create(&self.client, &signal, &defaults, &[]).await {
            Ok(Outcome::Created(plan)) => {
                tracing::info!(%node, %plan, "eviction gate started a plan");
                PlanNote::Started(plan)
            }
            Ok(Outcome::Joined(plan)) => PlanNote::Started(plan),
            Ok(Outcome::Settled { plan, phase }) => PlanNote::Settled { plan, phase },
            Err(e) => {
                tracing::warn!(%node, error = %e, "eviction gate cannot start a plan");
                PlanNote::NotStarted
            }
        }
    }

    /// A Warning Event on the pod, at most once per [`EVENT_WINDOW`] per pod.
    async fn event_once(&self, pod: &Pod, message: &str) {
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
        // Events are best-effort: the answer matters, not its record.
        if let Err(e) = self.recorder.publish(&event, &pod.object_ref(&())).await {
            tracing::debug!(pod = %pod.name_any(), error = %e, "cannot publish the eviction gate's event");
        }
    }
}
