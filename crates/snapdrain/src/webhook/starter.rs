//! Starting a node's plan off the request path. kube-apiserver gives the gate `timeoutSeconds` (the
//! chart: 5) and under `failurePolicy: Ignore` admits the eviction when it runs out
//! (`apiserver/pkg/admission/plugin/webhook/validating/dispatcher.go`): an API call inside the
//! admission call is a protected pod evicted without backup whenever the API server is slow. So the
//! gate answers 429 at once and hands the node to this queue, which creates (or joins) the plan in the
//! background: one start per node at a time, none again for a while after one, a bounded queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use tokio::sync::{mpsc, watch};

use crate::api::policy::DisruptionPolicySpec;
use crate::api::{DisruptionPlan, PlanMode, PlanSource};
use crate::controller::cache::Cache;
use crate::signals::{NodeSignal, Outcome, join_or_create_known};

/// Nodes whose start is queued at once: a queue longer than a cluster's nodes is a flood.
const QUEUE: usize = 1024;
/// Starts running at once: each is one POST (or one PATCH), so a few keep up with a drift storm.
const CONCURRENT: usize = 4;
/// After a start, how long the node is not asked again: the reflector shows the new plan well within
/// it, and until then a retry finds the start done, not a reason to POST again.
const SETTLE: Duration = Duration::from_secs(30);
/// After a failed start, how long before the next eviction may try again (the error is logged).
const BACKOFF: Duration = Duration::from_secs(10);

/// The signal the gate raises for `node`. The node's uid comes from the node cache (the plan's name
/// hashes it, as the signal watcher's does, so both name the same plan); unknown is fine.
pub fn signal_for(node: &str, nodes: &Cache<Node>) -> NodeSignal {
    NodeSignal {
        node: node.to_owned(),
        node_uid: nodes
            .get("", node)
            .and_then(|n| n.uid())
            .unwrap_or_default(),
        source: PlanSource::EvictionGate,
        reason: "EvictionRequested".into(),
        mode: PlanMode::Release,
        deadline: None,
    }
}

/// Where one node's start stands.
#[derive(Clone, Copy, Debug)]
enum Start {
    Queued,
    Done(Instant),
    Failed(Instant),
}

/// What a request to start a node's plan got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requested {
    /// Queued now, or queued or done already: the plan is on its way.
    Starting,
    /// The last start for the node failed moments ago (see the log); the next retry tries again.
    Failed,
    /// The queue is full: nothing was queued.
    Busy,
}

/// The gate's handle on the queue. Cheap to share.
pub struct Starter {
    queue: mpsc::Sender<String>,
    starts: Arc<Mutex<HashMap<String, Start>>>,
}

impl Starter {
    /// The queue and the task that works it (it runs until aborted).
    pub fn spawn(
        client: Client,
        plans: Store<DisruptionPlan>,
        nodes: Cache<Node>,
        policy: watch::Receiver<DisruptionPolicySpec>,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (queue, rx) = mpsc::channel(QUEUE);
        let starts = Arc::new(Mutex::new(HashMap::new()));
        let work = Work {
            client,
            plans,
            nodes,
            policy,
            starts: starts.clone(),
        };
        let task = tokio::spawn(work.run(rx));
        (Self { queue, starts }, task)
    }

    /// Asks for `node`'s plan; never waits.
    pub fn request(&self, node: &str) -> Requested {
        let now = Instant::now();
        let mut starts = self.starts.lock().unwrap_or_else(|e| e.into_inner());
        starts.retain(|_, s| match s {
            Start::Queued => true,
            Start::Done(at) => now.duration_since(*at) < SETTLE,
            Start::Failed(at) => now.duration_since(*at) < BACKOFF,
        });
        match starts.get(node) {
            Some(Start::Queued | Start::Done(_)) => Requested::Starting,
            Some(Start::Failed(_)) => Requested::Failed,
            None => match self.queue.try_send(node.to_owned()) {
                Ok(()) => {
                    starts.insert(node.to_owned(), Start::Queued);
                    Requested::Starting
                }
                Err(_) => Requested::Busy,
            },
        }
    }
}

struct Work {
    client: Client,
    plans: Store<DisruptionPlan>,
    nodes: Cache<Node>,
    policy: watch::Receiver<DisruptionPolicySpec>,
    starts: Arc<Mutex<HashMap<String, Start>>>,
}

impl Work {
    async fn run(self, rx: mpsc::Receiver<String>) {
        let queued = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|node| (node, rx))
        });
        queued
            .for_each_concurrent(CONCURRENT, |node| self.start(node))
            .await;
    }

    async fn start(&self, node: String) {
        let signal = signal_for(&node, &self.nodes);
        let defaults = self.policy.borrow().plan_defaults();
        // The store's plans, as the gate decided on them: a plan made since is a 409, joined.
        let plans = self.plans.state();
        let outcome = join_or_create_known(&self.client, &plans, &signal, &defaults, &[]).await;
        let done = match outcome {
            Ok(Outcome::Created(plan)) => {
                tracing::info!(%node, %plan, "eviction gate started a plan");
                Start::Done(Instant::now())
            }
            Ok(Outcome::Joined(_) | Outcome::Settled { .. }) => Start::Done(Instant::now()),
            Err(e) => {
                tracing::warn!(%node, error = %e, "eviction gate cannot start a plan");
                Start::Failed(Instant::now())
            }
        };
        self.starts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node, done);
    }
}
