//! Starting the controller: clients, metrics endpoint, leader election, and kube-runtime's Controller
//! over DisruptionPlans, woken by changes to the Velero Backups it created.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::api::Api;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Config, ResourceExt};
use tokio::sync::watch;

use super::context::{Context, Settings};
use super::error::ControllerError;
use super::health::{Health, LeadLoopGuard, ReconcileGuard};
use super::reconcile::{error_policy, reconcile, record_phases};
use super::{holds, leader, policy, server, signals, undecodable};
use crate::api::DisruptionPlan;
use crate::api::lenient;
use crate::api::policy::DisruptionPolicySpec;
use crate::api::velero::Backup;
use crate::planning::backups::PLAN_LABEL;
use crate::telemetry::Metrics;

#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Where `/metrics` and `/healthz` listen (None: not served).
    pub metrics_addr: Option<SocketAddr>,
    /// Namespace of the leader-election Lease (None: no election, act at once).
    pub lease_namespace: Option<String>,
    pub lease_seconds: u64,
    /// The eviction gate, served by every replica whether it leads or not (None: not served).
    pub webhook: Option<crate::webhook::WebhookConfig>,
    /// A reconcile in flight for longer than this fails `/healthz` (a pass waits at most a few wait
    /// slices, so ten minutes means a request that never returned).
    pub stuck_reconcile_after: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            metrics_addr: None,
            lease_namespace: Some("default".into()),
            lease_seconds: 15,
            webhook: None,
            stuck_reconcile_after: Duration::from_secs(600),
        }
    }
}

/// A running controller. `shutdown` stops it gracefully; dropping the handle stops it too.
pub struct ControllerHandle {
    pub metrics: Metrics,
    pub metrics_addr: Option<SocketAddr>,
    /// True while this replica holds the Lease and reconciles.
    pub leading: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    /// Without leader election this replica always leads; the sender keeps that channel open.
    _always_leading: Option<watch::Sender<bool>>,
    /// Renews the Lease (with leader election).
    lease_task: Option<leader::LeaseTask>,
    /// Where the eviction gate listens, when served.
    pub webhook_addr: Option<SocketAddr>,
    webhook: Option<crate::webhook::WebhookHandle>,
    /// The shared caches' watches: stopped with the handle however it goes.
    _caches: CacheTasks,
}

/// Aborts the cache watches when dropped (shutdown, kill, or the handle dropped).
struct CacheTasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for CacheTasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

impl ControllerHandle {
    /// The eviction gate's serving certificate (PEM), when the gate is served.
    pub fn webhook_certificate(&self) -> Option<String> {
        self.webhook.as_ref().and_then(|w| w.serving())
    }

    /// Stops reconciling (in-flight reconciles finish) and waits for it.
    pub async fn shutdown(self) {
        if let Some(w) = &self.webhook {
            w.stop(Duration::from_secs(5));
        }
        let _ = self.stop.send(true);
        let _ = self.task.await;
        // The last receiver gone, the Lease manager releases the Lease so a standby takes over at once.
        drop(self.leading);
        // Other clones of the receiver keep it renewing; then stop it and let the Lease expire.
        if let Some(mut t) = self.lease_task
            && tokio::time::timeout(std::time::Duration::from_secs(2), &mut t)
                .await
                .is_err()
        {
            t.abort();
        }
    }

    /// Stops at once, as a crash would: in-flight work is abandoned mid-step and the Lease is no longer
    /// renewed (a standby takes it when it expires).
    pub fn kill(self) {
        if let Some(w) = &self.webhook {
            w.stop(Duration::ZERO);
        }
        self.task.abort();
        if let Some(t) = &self.lease_task {
            t.abort();
        }
    }
}

/// Who snapdrain says it is to the API server. kube-apiserver's audit log keeps each request's
/// `userAgent`: it is how an operator tells snapdrain's evictions and writes from Karpenter's
/// (`karpenter/<version>`) or kubectl's. kube-rs sends none of its own.
pub const USER_AGENT: &str = concat!("snapdrain/", env!("CARGO_PKG_VERSION"));

/// `config` sending [`USER_AGENT`], unless it names a User-Agent already.
pub fn identified(mut config: Config) -> Config {
    let named = config
        .headers
        .iter()
        .any(|(name, _)| name == http::header::USER_AGENT);
    if !named {
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_static(USER_AGENT),
        ));
    }
    config
}

pub async fn start(
    config: Config,
    settings: Settings,
    opts: RunOptions,
) -> Result<ControllerHandle, ControllerError> {
    let config = identified(config);
    let client = Client::try_from(config.clone())
        .map_err(|e| ControllerError::Config(format!("cannot build a Kubernetes client: {e}")))?;
    let mut no_retry = config;
    no_retry.default_retry = false;
    let eviction_client = Client::try_from(no_retry)
        .map_err(|e| ControllerError::Config(format!("cannot build a Kubernetes client: {e}")))?;
    let metrics = Metrics::new();
    let health = Health::new(opts.stuck_reconcile_after);
    // Marked before `/healthz` is served so that a starting replica does not fail its first probe.
    let lead_loop_running = health.lead_loop_running();
    let metrics_addr = match opts.metrics_addr {
        Some(addr) => Some(
            server::serve(addr, metrics.clone(), health.clone())
                .await
                .map_err(|e| {
                    ControllerError::Config(format!(
                        "cannot serve metrics on {addr}: {e} (pick another --metrics-addr)"
                    ))
                })?,
        ),
        None => None,
    };
    let (leading, always_leading, lease_task) = match &opts.lease_namespace {
        Some(ns) => {
            let (rx, task) =
                leader::contend(client.clone(), ns, &settings.identity, opts.lease_seconds).await?;
            (rx, None, Some(task))
        }
        None => {
            let (tx, rx) = watch::channel(true);
            (rx, Some(tx), None)
        }
    };
    // One set of caches for the process: the gate (every replica) and the leader's steps share them,
    // and a standby's are warm when it takes over.
    let (caches, cache_tasks) = super::cache::Caches::start(&client, &metrics);
    let ctx = Arc::new(Context::new(
        client.clone(),
        eviction_client,
        metrics.clone(),
        settings,
        caches.clone(),
    ));
    // Every replica serves the gate: its decisions read a cache and its plan creation is idempotent.
    let webhook = match opts.webhook {
        Some(cfg) => Some(
            crate::webhook::start(
                client.clone(),
                metrics.clone(),
                ctx.recorder.clone(),
                caches.clone(),
                cfg,
            )
            .await
            .map_err(|e| ControllerError::Config(format!("cannot start the eviction gate: {e}")))?,
        ),
        None => None,
    };
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(lead_loop(
        client,
        ctx,
        health,
        lead_loop_running,
        leading.clone(),
        stop_rx,
    ));
    Ok(ControllerHandle {
        metrics,
        metrics_addr,
        leading,
        stop,
        task,
        _always_leading: always_leading,
        lease_task,
        webhook_addr: webhook.as_ref().map(|w| w.addr),
        webhook,
        _caches: CacheTasks(cache_tasks),
    })
}

/// Waits for the Lease, reconciles while holding it, stops when it is lost or on shutdown.
async fn lead_loop(
    client: Client,
    ctx: Arc<Context>,
    health: Health,
    // Held for as long as this task lives: it clears the health flag however the task ends.
    _running: LeadLoopGuard,
    mut leading: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            r = leading.wait_for(|l| *l) => if r.is_err() { return },
        }
        tracing::info!(identity = %ctx.settings.identity, "leading: reconciling DisruptionPlans");
        ctx.metrics.set_leading(true);
        let mut lost = leading.clone();
        let mut stop_now = stop.clone();
        let until = async move {
            tokio::select! {
                _ = lost.wait_for(|l| !*l) => {},
                _ = stop_now.wait_for(|s| *s) => {},
            }
        };
        run_controller(client.clone(), ctx.clone(), health.clone(), until).await;
        ctx.metrics.set_leading(false);
        // Stopped on request, or the handle is gone (its sender dropped).
        if *stop.borrow() || stop.has_changed().is_err() {
            return;
        }
        tracing::warn!(identity = %ctx.settings.identity, "lost the Lease: standing by");
    }
}

fn plan_of(backup: &Backup) -> Option<String> {
    crate::planning::backups::plan_of_backup(backup)
}

/// Counts a reconcile in `snapdrain_reconciles_in_flight` and in [`Health`] for as long as it lives,
/// however it ends.
struct InFlight {
    gauge: prometheus_client::metrics::gauge::Gauge,
    _health: ReconcileGuard,
}

impl InFlight {
    fn start(ctx: &Context, health: &Health, plan: &str) -> Self {
        ctx.metrics.reconciles_in_flight.inc();
        Self {
            gauge: ctx.metrics.reconciles_in_flight.clone(),
            _health: health.reconcile_started(plan),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// One reconcile that stops at its next await once this replica must stop acting (Lease lost,
/// shutdown): a deposed leader makes no further request, and SIGTERM does not wait for a drain slice.
/// Cancelling is as safe as a crash, which every step is built to survive.
async fn reconcile_while_acting(
    plan: Arc<DisruptionPlan>,
    ctx: Arc<Context>,
    health: Health,
    mut acting: watch::Receiver<bool>,
) -> Result<kube::runtime::controller::Action, ControllerError> {
    if !*acting.borrow() {
        return Err(ControllerError::NotLeading);
    }
    let _counted = InFlight::start(&ctx, &health, &plan.name_any());
    tokio::select! {
        biased;
        _ = acting.wait_for(|a| !*a) => Err(ControllerError::NotLeading),
        r = reconcile(plan, ctx.clone()) => r,
    }
}

async fn run_controller(
    client: Client,
    ctx: Arc<Context>,
    health: Health,
    until: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (acting_tx, acting) = watch::channel(true);
    let stop_acting = tokio::spawn(async move {
        until.await;
        acting_tx.send_replace(false);
        // Keep the sender alive so receivers see `false` rather than a closed channel.
        std::future::pending::<()>().await;
    });
    let shutdown = {
        let mut acting = acting.clone();
        async move {
            let _ = acting.wait_for(|a| !*a).await;
        }
    };
    let backups: Api<Backup> = Api::all(client.clone());
    // Plans are decoded one by one: one that cannot be read is reported (below) and every other plan
    // is still reconciled (api::lenient).
    let (store, writer) = reflector::store::<DisruptionPlan>();
    let (undecodable_tx, undecodable_rx) = tokio::sync::mpsc::unbounded_channel();
    let plans = lenient::watch_decoded(client.clone(), undecodable::stub, move |u| {
        let _ = undecodable_tx.send(u.clone());
    })
    .reflect(writer)
    .applied_objects();
    let controller = Controller::for_stream(plans, store.clone())
        .with_config(ControllerConfig::default().concurrency(16));
    let reporter = tokio::spawn(undecodable::report(ctx.clone(), undecodable_rx));
    let helpers = start_helpers(&client, &ctx, store.clone(), &acting);
    let listed = store.clone();
    let gauge_ctx = ctx.clone();
    let gauge = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        loop {
            tick.tick().await;
            record_phases(&gauge_ctx, &store.state());
        }
    });
    let stopped_before_ready = {
        let mut acting = acting.clone();
        async move {
            let _ = acting.wait_for(|a| !*a).await;
            // kube-runtime holds its runner until the plans store is ready and never ends a runner so
            // held: a shutdown during the first LIST would wait forever. Nothing ran then, so stop here.
            if listed.wait_until_ready().now_or_never().is_none() {
                return;
            }
            std::future::pending::<()>().await;
        }
    };
    let run = controller
        .watches(
            backups,
            watcher::Config::default().labels(PLAN_LABEL),
            |b: Backup| plan_of(&b).map(|plan| ObjectRef::<DisruptionPlan>::new(&plan)),
        )
        .graceful_shutdown_on(shutdown)
        .run(
            move |plan, ctx| reconcile_while_acting(plan, ctx, health.clone(), acting.clone()),
            error_policy,
            ctx,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller event");
            }
        });
    tokio::select! {
        () = run => {},
        () = stopped_before_ready => tracing::debug!("stopped before the plans were listed"),
    }
    gauge.abort();
    reporter.abort();
    for h in helpers {
        h.abort();
    }
    stop_acting.abort();
}

/// What runs beside the plan controller while this replica leads: the DisruptionPolicy follower, the
/// hold keeper, the history keeper, the warm-backup keeper and the signal watcher. Each stops by itself when `acting` turns false.
fn start_helpers(
    client: &Client,
    ctx: &Arc<Context>,
    plans: kube::runtime::reflector::Store<DisruptionPlan>,
    acting: &watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let stopped = |acting: &watch::Receiver<bool>| {
        let mut acting = acting.clone();
        async move {
            let _ = acting.wait_for(|a| !*a).await;
        }
    };
    let (policy_tx, policy) = watch::channel(DisruptionPolicySpec::defaults());
    let policy_task = {
        let client = client.clone();
        let recorder = ctx.recorder.clone();
        let until = stopped(acting);
        tokio::spawn(async move {
            policy::ensure_default(&client).await;
            policy::follow(client, Some(recorder), policy_tx, until).await;
        })
    };
    let policy_for_notify = policy.clone();
    ctx.policy.clear();
    let mirror = {
        let ctx = ctx.clone();
        let policy = policy.clone();
        tokio::spawn(async move { policy::mirror(policy, &ctx.policy).await })
    };
    let keeper = tokio::spawn(holds::run(
        client.clone(),
        ctx.caches.clone(),
        plans.clone(),
        policy.clone(),
        ctx.metrics.clone(),
        stopped(acting),
    ));
    let history = tokio::spawn(super::history::run(
        client.clone(),
        plans.clone(),
        ctx.caches.nodes.clone(),
        policy.clone(),
        ctx.metrics.clone(),
        stopped(acting),
    ));
    let warm = tokio::spawn(super::warm::run(
        client.clone(),
        ctx.caches.clone(),
        policy.clone(),
        stopped(acting),
    ));
    let watcher = tokio::spawn(signals::run(
        client.clone(),
        ctx.caches.clone(),
        plans,
        policy,
        ctx.metrics.clone(),
        ctx.recorder.clone(),
        stopped(acting),
    ));
    // The notification webhook follows the policy too, its URL read from a Secret when it says so.
    let notify = tokio::spawn(super::notifications::follow(
        client.clone(),
        ctx.settings.namespace.clone(),
        ctx.notifier.clone(),
        policy_for_notify,
        ctx.settings.notification_url_recheck,
    ));
    vec![policy_task, mirror, keeper, history, warm, watcher, notify]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planning::backups::PLAN_ANNOTATION;

    #[test]
    fn the_client_names_snapdrain_unless_a_user_agent_is_set() {
        let base = Config::new("https://127.0.0.1:6443".parse().expect("a URI"));
        let agents = |c: &Config| -> Vec<String> {
            c.headers
                .iter()
                .filter(|(n, _)| n == http::header::USER_AGENT)
                .map(|(_, v)| v.to_str().unwrap_or_default().to_owned())
                .collect()
        };
        assert_eq!(agents(&identified(base.clone())), [USER_AGENT]);
        assert!(USER_AGENT.starts_with("snapdrain/"));
        let mut named = base;
        named.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_static("ops-tool"),
        ));
        assert_eq!(agents(&identified(named)), ["ops-tool"]);
    }

    fn backup(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Backup {
        let map = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let mut b: Backup = serde_json::from_value(serde_json::json!({
            "apiVersion": "velero.io/v1", "kind": "Backup",
            "metadata": {"name": "b", "namespace": "velero"}, "spec": {}
        }))
        .expect("a minimal Backup deserializes");
        b.metadata.labels = Some(map(labels));
        b.metadata.annotations = Some(map(annotations));
        b
    }

    #[test]
    fn a_backup_maps_to_its_plan_by_the_full_name_even_when_the_label_is_a_hash() {
        let long = "x".repeat(100);
        let b = backup(&[(PLAN_LABEL, "xxxx-3f2a")], &[(PLAN_ANNOTATION, &long)]);
        assert_eq!(plan_of(&b), Some(long));
        let old = backup(&[(PLAN_LABEL, "drain-n1")], &[]);
        assert_eq!(plan_of(&old).as_deref(), Some("drain-n1"));
        assert_eq!(plan_of(&backup(&[], &[])), None);
    }
}
