//! What the controller-side measurements share: a fresh simulated cluster per run, a controller talking
//! to it over HTTP, a plan run to its end, and waits on the simulator's own store and audit log (in
//! process, so a measurement adds no API load of its own).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use backon::{ExponentialBuilder, Retryable};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use snapdrain::api::DisruptionPlan;
use snapdrain::controller::ControllerHandle;
use snapdrain::controller::run::RunOptions;
use snapdrain::telemetry::metrics::KindLabel;
use snapdrain_sim::apiserver::audit::AuditEntry;
use snapdrain_sim::apiserver::resources::ResKey;
use snapdrain_sim::apiserver::store::{EventType, Store, WatchEvent, meta_str};
use snapdrain_sim::scenario::format::Scenario;
use snapdrain_sim::world::Timings;
use snapdrain_sim::{ScenarioSource, SimCluster, SimConfig};

pub const PLAN_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest a freshly started controller may take to fill its caches before a plan is created (a plan
/// created earlier would measure the controller's start-up, not its reaction).
const CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// The kinds whose caches planning and draining wait for (`Caches::wait_synced`; NodeClaims aside).
const SYNCED_KINDS: &[&str] = &[
    "Pod",
    "PersistentVolumeClaim",
    "StatefulSet",
    "PodDisruptionBudget",
    "VolumeAttachment",
    "Node",
    "Namespace",
];

pub struct Bench {
    pub cluster: SimCluster,
    pub client: Client,
    /// The scenario's first node.
    pub node: String,
}

/// A cluster from scenario text, with the DisruptionPlan and DisruptionPolicy CRDs installed.
pub async fn start_cluster(yaml: &str, label: &str, timings: Timings) -> anyhow::Result<Bench> {
    let scenario = snapdrain_sim::scenario::parse(yaml, label)?;
    start_scenario(scenario, label, timings).await
}

pub async fn start_scenario(
    scenario: Scenario,
    label: &str,
    timings: Timings,
) -> anyhow::Result<Bench> {
    let cluster = SimCluster::start(SimConfig {
        scenario: Some(ScenarioSource::Inline {
            scenario: Box::new(scenario),
            label: label.into(),
        }),
        timings: Some(timings),
        ..Default::default()
    })
    .await?;
    let client = Client::try_from(cluster.kube_config())?;
    // A world as large as scale-5k keeps the server's runtime busy while it starts, long enough for a
    // TLS handshake to be cut (a reset connection); the API's own answers are not retried.
    (|| snapdrain_testkit::harness::install_plan_crd(&client))
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(5))
                .with_max_times(12),
        )
        .when(|e| !matches!(e, kube::Error::Api(_)))
        .await
        .context("installing the DisruptionPlan and DisruptionPolicy CRDs")?;
    let node = cluster
        .scenario
        .as_ref()
        .and_then(|s| s.instances.first())
        .map(|i| i.node_name.clone())
        .ok_or_else(|| anyhow!("the {label} scenario has no node"))?;
    Ok(Bench {
        cluster,
        client,
        node,
    })
}

/// A single controller replica (no leader election) with the simulator's EC2 endpoint, as the e2e tests
/// run it.
pub async fn start_controller(b: &Bench) -> anyhow::Result<ControllerHandle> {
    let settings = snapdrain_testkit::controller_settings(&b.cluster, "snapdrain-bench")
        .ok_or_else(|| anyhow!("the simulated world runs no EC2 endpoint"))?;
    let opts = RunOptions {
        lease_namespace: None,
        ..RunOptions::default()
    };
    let handle = snapdrain::controller::start(b.cluster.kube_config(), settings, opts).await?;
    wait_caches_synced(&handle).await?;
    Ok(handle)
}

/// Kinds whose cache has not finished a first list, by the controller's own
/// `snapdrain_cache_lists_total{kind}` (the handle does not expose its caches).
fn unsynced_kinds(handle: &ControllerHandle) -> Vec<&'static str> {
    SYNCED_KINDS
        .iter()
        .copied()
        .filter(|kind| {
            handle
                .metrics
                .cache_lists
                .get_or_create(&KindLabel {
                    kind: (*kind).into(),
                })
                .get()
                == 0
        })
        .collect()
}

/// Waits until every cache the controller's plans read has listed once (polling its in-process
/// metrics: the counters offer no change notification).
async fn wait_caches_synced(handle: &ControllerHandle) -> anyhow::Result<()> {
    let deadline = Instant::now() + CACHE_SYNC_TIMEOUT;
    loop {
        let left = unsynced_kinds(handle);
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the controller's caches of {left:?} did not finish a first list within {CACHE_SYNC_TIMEOUT:?} (see its log for the watch errors)"
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits, in process, until every pod that was on the node (DaemonSet pods aside) is gone.
pub struct PodsGone {
    rx: broadcast::Receiver<Arc<WatchEvent>>,
    left: HashSet<(String, String)>,
}

impl PodsGone {
    pub fn subscribe(store: &Store, node: &str) -> Self {
        let (pods, rx) = store.subscribe(&ResKey::core("pods"));
        let left = pods
            .iter()
            .filter(|p| on_node(p, node))
            .filter(|p| !owned_by(p, "DaemonSet"))
            .map(|p| key_of(p))
            .collect();
        Self { rx, left }
    }

    pub async fn wait(mut self) -> anyhow::Result<(Instant, usize)> {
        let count = self.left.len();
        while !self.left.is_empty() {
            match self.rx.recv().await {
                Ok(ev) if ev.type_ == EventType::Deleted => {
                    self.left.remove(&key_of(&ev.object));
                }
                Ok(_) => {}
                Err(e) => bail!("lost the pod feed: {e}"),
            }
        }
        Ok((Instant::now(), count))
    }
}

/// Waits until `done` holds for the objects of `key`, re-checking on each change, for at most `limit`.
pub async fn wait_store(
    store: &Store,
    key: &ResKey,
    what: &str,
    limit: Duration,
    done: impl Fn(&[Arc<Value>]) -> bool,
) -> anyhow::Result<Instant> {
    let (_, mut rx) = store.subscribe(key);
    let wait = async {
        loop {
            if done(&store.snapshot(key).0) {
                return Ok(Instant::now());
            }
            match rx.recv().await {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => bail!("lost the {what} feed: {e}"),
            }
        }
    };
    tokio::time::timeout(limit, wait)
        .await
        .map_err(|_| anyhow!("{what}: not within {limit:?}"))?
}

pub fn on_node(pod: &Value, node: &str) -> bool {
    pod.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node)
}

pub fn key_of(obj: &Value) -> (String, String) {
    (
        meta_str(obj, "namespace").unwrap_or("").to_string(),
        meta_str(obj, "name").unwrap_or("").to_string(),
    )
}

pub fn owned_by(obj: &Value, kind: &str) -> bool {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|o| o.iter().any(|r| r["kind"] == kind))
}

/// Creates a plan for the bench node and waits, in process, for a terminal phase.
pub async fn run_plan(b: &Bench, name: &str) -> anyhow::Result<(Instant, Instant)> {
    let (_, mut plans) = b
        .cluster
        .store
        .subscribe(&ResKey::new("snapdrain.io", "disruptionplans"));
    let plan: DisruptionPlan = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
        "metadata": {"name": name}, "spec": {"nodes": [b.node]}
    }))?;
    let created = Instant::now();
    Api::<DisruptionPlan>::all(b.client.clone())
        .create(&PostParams::default(), &plan)
        .await
        .context("creating the plan")?;
    let wait = async {
        loop {
            let ev = plans.recv().await.context("lost the plan feed")?;
            let phase = ev
                .object
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("");
            match phase {
                "Completed" => return Ok(Instant::now()),
                "Failed" | "Aborted" => bail!(
                    "plan {name} ended {phase}: {}",
                    ev.object
                        .pointer("/status/message")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                ),
                _ => {}
            }
        }
    };
    let done = tokio::time::timeout(PLAN_TIMEOUT, wait)
        .await
        .map_err(|_| anyhow!("plan {name} did not finish within {PLAN_TIMEOUT:?}"))??;
    Ok((created, done))
}

pub fn audit_time(e: &AuditEntry) -> Option<jiff::Timestamp> {
    e.time.parse().ok()
}

/// Milliseconds between the first audit entry matching `from` and the first after it matching `to`.
pub fn audit_gap(
    entries: &[AuditEntry],
    from: impl Fn(&AuditEntry) -> bool,
    to: impl Fn(&AuditEntry) -> bool,
) -> Option<Duration> {
    let start = entries.iter().position(from)?;
    let end = entries[start..].iter().find(|e| to(e))?;
    Duration::try_from(audit_time(end)?.duration_since(audit_time(&entries[start])?)).ok()
}

pub fn is_api(e: &AuditEntry, verb: &str, resource: &str, code: u16) -> bool {
    e.source == "api" && e.verb == verb && e.resource == resource && e.code == Some(code)
}

/// A world event of Velero's: Backup `name` reached `phase`.
pub fn is_backup_phase(e: &AuditEntry, phase: &str) -> bool {
    e.source == "world" && e.resource == "backups.velero.io" && e.detail["phase"] == phase
}

/// Stores `count` finished plans (Completed an hour ago, so the default history keeps them), spread
/// over `nodes`, each with a status of a real plan's size: three verified backup records of a dozen
/// bucket objects, conditions and step timings. Written straight into the store: they stand for the
/// plans of the past weeks, not for work the bench measures.
pub fn seed_finished_plans(store: &Store, nodes: &[String], count: usize) -> anyhow::Result<()> {
    if nodes.is_empty() {
        bail!("no node to give the finished plans");
    }
    let key = ResKey::new("snapdrain.io", "disruptionplans");
    let ended = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1);
    let at = ended.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let micro = ended.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    for i in 0..count {
        let node = &nodes[i % nodes.len()];
        let backups: Vec<Value> = (0..3)
            .map(|b| {
                let objects: Vec<Value> = (0..12)
                    .map(|o| json!({"key": format!("backups/hist-{i}-{b}/hist-{i}-{b}-object-{o}.json.gz"), "size": 4096 + o}))
                    .collect();
                json!({"name": format!("hist-{i}-{b}"), "namespace": "velero", "uid": format!("uid-hist-{i}-{b}"),
                       "statefulSets": [format!("ns-{b}/db")], "pvcs": [format!("ns-{b}/data-db-{i}")],
                       "pods": [format!("ns-{b}/db-{i}")], "attempt": 1,
                       "phase": "Completed", "verified": true, "verifiedObjects": objects,
                       "startedAt": at, "completedAt": micro, "verifiedAt": micro})
            })
            .collect();
        let plan = json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": format!("history-{i:05}"), "labels": {"snapdrain.io/node": node}},
            "spec": {"nodes": [node], "mode": "Release", "source": "karpenter", "reason": "Drifted"},
            "status": {
                "phase": "Completed", "phaseStartedAt": micro, "decidedAt": at,
                "message": format!("completed: {node} handled, 0 pod(s) evicted, 3 backup(s) verified"),
                "nodes": [{"name": node, "phase": "Released"}],
                "backups": backups,
                "conditions": [
                    {"type": "Valid", "status": "True", "reason": "Valid", "message": "", "lastTransitionTime": at},
                    {"type": "Progressing", "status": "False", "reason": "Completed", "message": "", "lastTransitionTime": at},
                ],
                "stepTimings": {"Pending": 0.1, "BackingUp": 41.0, "Verifying": 2.5, "Draining": 30.0},
            }
        });
        store
            .create(
                &key,
                None,
                plan,
                snapdrain_sim::apiserver::store::WriteOptions {
                    dry_run: false,
                    internal: true,
                },
            )
            .map_err(|e| anyhow!("storing finished plan {i}: {e:?}"))?;
    }
    Ok(())
}
