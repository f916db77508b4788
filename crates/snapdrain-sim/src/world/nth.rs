//! Simulated aws-node-termination-handler (aws/aws-node-termination-handler, IMDS mode): what it does on
//! a node when an interruption notice reaches it, driven by [`NthHandle::notify`] (the timeline's
//! `spotInterruption` and `rebalanceRecommendation`).
//!
//! - The drain of an event begins at its start time minus `--node-termination-grace-period` (120 s;
//!   `pkg/interruptioneventstore/interruption-event-store.go` `TimeUntilDrain`): at once for a spot
//!   interruption, whose start is the two-minute deadline.
//! - The pre-drain task taints the node with the event's taint, value the event ID (cut to 63
//!   characters), effect `--taint-effect` (NoSchedule) — only with `--taint-node`, which is **off** by
//!   default (`pkg/config/config.go`), as in a default install (`pkg/node/node.go` `TaintSpotItn`,
//!   `TaintRebalanceRecommendation`; event IDs `spot-itn-<sha256>` and `rebalance-recommendation-<sha256>`
//!   from `pkg/monitor/spotitn/spot-itn-monitor.go` and `pkg/monitor/rebalancerecommendation/`).
//! - Then cordon and drain (`pkg/interruptionevent/draincordon/handler.go`), or cordon only with
//!   `--cordon-only` and for a rebalance recommendation without `--enable-rebalance-draining`.
//! - The drain is kubectl's drain library as `pkg/node/node.go` `getDrainHelper` configures it:
//!   `Force` (unmanaged pods too), `IgnoreAllDaemonSets` and `DeleteEmptyDirData` (both on by default),
//!   mirror pods skipped, `GracePeriodSeconds = --pod-termination-grace-period` (-1: the pod's own),
//!   `Timeout = --node-termination-grace-period`. Per pod (kubectl `pkg/drain/drain.go` `evictPods`):
//!   a policy/v1 Eviction; 404 is done; 429 is retried after `EvictErrorRetryDelay`, which NTH leaves at
//!   its zero value, so the real handler retries in a tight loop — the sim waits
//!   [`NthSettings::eviction_retry_floor`] (50 ms) instead so that it does not spin; any other answer
//!   fails that pod; then the pod is waited for (GET every second) until 404 or a new UID. The global
//!   timeout fails whatever is left.
//!
//! The EC2 side of a spot interruption (the instance reclaimed at its deadline, whatever the drain did)
//! is not NTH's: see [`super::spot`].
//!
//! Not simulated: Queue Processor mode (SQS, ASG lifecycle hooks), scheduled events, webhooks, the
//! out-of-service taint, `--exclude-from-load-balancers`, Kubernetes Events and the uncordon after a
//! reboot.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Taint};
use kube::Client;
use kube::api::Api;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::WorldContext;
use super::eviction::{self, is_daemonset, is_mirror};
use super::node_taints;

pub const SPOT_ITN_TAINT: &str = "aws-node-termination-handler/spot-itn";
pub const REBALANCE_TAINT: &str = "aws-node-termination-handler/rebalance-recommendation";
/// What the simulated handler sends as its user agent (and the audit log shows). NTH sets none, so
/// client-go's default names its binary, `node-termination-handler` (Makefile); the version part is
/// client-go's unset placeholder.
pub const USER_AGENT: &str = "node-termination-handler/v0.0.0 (linux/amd64) kubernetes/$Format";
const BY: &str = "aws-node-termination-handler";
/// `maxTaintValueLength` in `pkg/node/node.go`.
const MAX_TAINT_VALUE: usize = 63;

/// NTH's flags that shape a drain (`pkg/config/config.go`; the defaults are its defaults). Grace
/// periods are seconds, as the flags take them; the sim's own intervals are milliseconds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct NthSettings {
    /// `--node-termination-grace-period` (120): the drain's timeout, and how long before an event's start
    /// the drain begins.
    pub node_termination_grace_period: u64,
    /// `--pod-termination-grace-period` (-1: each pod's own).
    pub pod_termination_grace_period: i64,
    /// `--taint-node` (false).
    pub taint_node: bool,
    /// `--taint-effect` (NoSchedule).
    pub taint_effect: String,
    /// `--cordon-only` (false).
    pub cordon_only: bool,
    /// `--enable-rebalance-draining` (false): without it a rebalance recommendation only cordons.
    pub enable_rebalance_draining: bool,
    /// `--ignore-daemon-sets` (true).
    pub ignore_daemon_sets: bool,
    /// The sim's pause between refused evictions, where the real handler has none (ms).
    #[serde(with = "super::millis")]
    pub eviction_retry_floor: Duration,
    /// How often an evicted pod is checked for (kubectl: 1 s; ms).
    #[serde(with = "super::millis")]
    pub delete_poll: Duration,
}

impl Default for NthSettings {
    fn default() -> Self {
        Self {
            node_termination_grace_period: 120,
            pod_termination_grace_period: -1,
            taint_node: false,
            taint_effect: "NoSchedule".into(),
            cordon_only: false,
            enable_rebalance_draining: false,
            ignore_daemon_sets: true,
            eviction_retry_floor: Duration::from_millis(50),
            delete_poll: Duration::from_secs(1),
        }
    }
}

pub struct NthConfig {
    /// A client of the simulated API server ([`super::eviction::drainer_client`] with [`USER_AGENT`]).
    pub client: Client,
    pub settings: NthSettings,
}

/// An interruption notice as the instance metadata service gives it.
#[derive(Clone, Debug, PartialEq)]
pub enum Notice {
    /// `spot/instance-action`: the instance is reclaimed at `deadline`.
    SpotInterruption { deadline: jiff::Timestamp },
    /// `events/recommendations/rebalance`: elevated risk of interruption, no deadline.
    RebalanceRecommendation { noticed: jiff::Timestamp },
}

impl Notice {
    fn kind(&self) -> &'static str {
        match self {
            Notice::SpotInterruption { .. } => "SPOT_ITN",
            Notice::RebalanceRecommendation { .. } => "REBALANCE_RECOMMENDATION",
        }
    }

    fn taint(&self) -> &'static str {
        match self {
            Notice::SpotInterruption { .. } => SPOT_ITN_TAINT,
            Notice::RebalanceRecommendation { .. } => REBALANCE_TAINT,
        }
    }

    /// The monitors hash what IMDS returned, as there is no event ID in it.
    fn event_id(&self) -> String {
        let (prefix, imds) = match self {
            Notice::SpotInterruption { deadline } => {
                ("spot-itn", format!("&{{terminate {}}}", rfc3339(*deadline)))
            }
            Notice::RebalanceRecommendation { noticed } => (
                "rebalance-recommendation",
                format!("&{{{}}}", rfc3339(*noticed)),
            ),
        };
        let hash = Sha256::digest(imds.as_bytes());
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        format!("{prefix}-{hex}")
    }

    /// The event's start: the spot deadline, or the notice itself.
    fn start(&self) -> jiff::Timestamp {
        match self {
            Notice::SpotInterruption { deadline } => *deadline,
            Notice::RebalanceRecommendation { noticed } => *noticed,
        }
    }
}

fn rfc3339(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Tells the running simulated handler about a notice for a node.
#[derive(Clone)]
pub struct NthHandle {
    tx: mpsc::UnboundedSender<(String, Notice)>,
}

/// The receiving end of an [`NthHandle`], for [`run`].
pub struct Notices {
    rx: mpsc::UnboundedReceiver<(String, Notice)>,
}

pub fn handle() -> (NthHandle, Notices) {
    let (tx, rx) = mpsc::unbounded_channel();
    (NthHandle { tx }, Notices { rx })
}

impl NthHandle {
    /// False when the handler is no longer running.
    pub fn notify(&self, node: &str, notice: Notice) -> bool {
        self.tx.send((node.to_string(), notice)).is_ok()
    }
}

/// Runs the simulated handler until the task is dropped or every handle is.
pub async fn run(ctx: Arc<WorldContext>, config: NthConfig, mut notices: Notices) {
    let config = Arc::new(config);
    while let Some((node, notice)) = notices.rx.recv().await {
        let (ctx, config) = (ctx.clone(), config.clone());
        tokio::spawn(async move { handle_event(&ctx, &config, &node, &notice).await });
    }
}

/// `pkg/interruptionevent/draincordon/handler.go` `HandleEvent`, once the event store says the event
/// should drain (`TimeUntilDrain`): pre-drain task (taint), then cordon and drain or cordon only.
async fn handle_event(ctx: &WorldContext, config: &NthConfig, node: &str, notice: &Notice) {
    let s = &config.settings;
    let event_id = notice.event_id();
    ctx.audit.world(
        "nth-event",
        "nodes",
        None,
        Some(node),
        json!({"kind": notice.kind(), "eventID": event_id, "start": rfc3339(notice.start()), "by": BY}),
    );
    let grace = jiff::SignedDuration::from_secs(s.node_termination_grace_period as i64);
    let drain_at = notice.start() - grace;
    if let Ok(wait) = Duration::try_from(drain_at.duration_since(jiff::Timestamp::now())) {
        tokio::time::sleep(wait).await;
    }
    if s.taint_node {
        let value: String = event_id.chars().take(MAX_TAINT_VALUE).collect();
        let taint = Taint {
            key: notice.taint().into(),
            value: Some(value.clone()),
            effect: taint_effect(&s.taint_effect).into(),
            time_added: None,
        };
        if let Err(e) = node_taints::add(&config.client, node, taint, false).await {
            // The pre-drain task failed: NTH cancels the event.
            ctx.audit.world(
                "nth-drain-failed",
                "nodes",
                None,
                Some(node),
                json!({"error": format!("unable to taint node with taint {}:{event_id}: {e}", notice.taint()), "by": BY}),
            );
            return;
        }
        ctx.audit.world(
            "nth-tainted",
            "nodes",
            None,
            Some(node),
            json!({"taint": notice.taint(), "value": value, "effect": taint_effect(&s.taint_effect), "by": BY}),
        );
    }
    if let Err(e) = node_taints::cordon(&config.client, node, true).await {
        ctx.audit.world(
            "nth-drain-failed",
            "nodes",
            None,
            Some(node),
            json!({"error": format!("cordoning failed: {e}"), "by": BY}),
        );
        return;
    }
    let cordon_only = s.cordon_only
        || (matches!(notice, Notice::RebalanceRecommendation { .. })
            && !s.enable_rebalance_draining);
    if cordon_only {
        ctx.audit.world(
            "nth-cordoned",
            "nodes",
            None,
            Some(node),
            json!({"eventID": event_id, "by": BY}),
        );
        return;
    }
    match drain(ctx, config, node).await {
        Ok(n) => ctx.audit.world(
            "nth-drained",
            "nodes",
            None,
            Some(node),
            json!({"eventID": event_id, "pods": n, "by": BY}),
        ),
        Err(errors) => ctx.audit.world(
            "nth-drain-failed",
            "nodes",
            None,
            Some(node),
            json!({"eventID": event_id, "errors": errors, "by": BY}),
        ),
    }
}

/// `getTaintEffect`: unknown effects fall back to NoSchedule.
fn taint_effect(effect: &str) -> &'static str {
    match effect {
        "PreferNoSchedule" => "PreferNoSchedule",
        "NoExecute" => "NoExecute",
        _ => "NoSchedule",
    }
}

/// kubectl's `RunNodeDrain` with NTH's helper: the pods that pass the filters, each evicted and waited
/// for at once, under one global timeout. The number of pods drained, or every pod's error.
async fn drain(ctx: &WorldContext, config: &NthConfig, node: &str) -> Result<usize, Vec<String>> {
    let s = &config.settings;
    let pods = eviction::pods_on(&config.client, node)
        .await
        .map_err(|e| vec![e.to_string()])?;
    let mut errors = Vec::new();
    let mut chosen = Vec::new();
    for p in pods {
        // kubectl's filters, in order, with Force, IgnoreAllDaemonSets and DeleteEmptyDirData set:
        // deleted pods (when skipping is asked, never here), DaemonSet pods, mirror pods.
        if is_daemonset(&p) {
            if !s.ignore_daemon_sets {
                errors.push(format!(
                    "cannot delete DaemonSet-managed Pods: {}",
                    eviction::key(&p)
                ));
            }
            continue;
        }
        if is_mirror(&p) {
            continue;
        }
        chosen.push(p);
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let deadline = Instant::now() + Duration::from_secs(s.node_termination_grace_period);
    let timeout = format!("{}s", s.node_termination_grace_period);
    let results = futures::future::join_all(
        chosen
            .iter()
            .map(|p| evict_and_wait(ctx, config, p.clone(), deadline, &timeout)),
    )
    .await;
    let errors: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    if errors.is_empty() {
        Ok(chosen.len())
    } else {
        Err(errors)
    }
}

/// One pod in kubectl `pkg/drain/drain.go` `evictPods`: evict until it is accepted (429 retried), then
/// `waitForDelete`.
async fn evict_and_wait(
    ctx: &WorldContext,
    config: &NthConfig,
    pod: Pod,
    deadline: Instant,
    timeout: &str,
) -> Result<(), String> {
    let s = &config.settings;
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let options = if s.pod_termination_grace_period >= 0 {
        json!({"gracePeriodSeconds": s.pod_termination_grace_period})
    } else {
        json!({})
    };
    let api: Api<Pod> = Api::namespaced(config.client.clone(), &ns);
    let mut last: Option<(u16, String)> = None;
    let mut refusals = 0u64;
    loop {
        if Instant::now() >= deadline {
            refused(ctx, &ns, &name, &last, refusals);
            return Err(format!(
                "error when evicting pods/{name:?} -n {ns:?}: global timeout reached: {timeout}"
            ));
        }
        let (code, message) =
            eviction::evict(&config.client, "policy/v1", &ns, &name, options.clone()).await;
        match code {
            200..=299 => {
                refused(ctx, &ns, &name, &last, refusals);
                ctx.audit.world(
                    "eviction-attempt",
                    "pods",
                    Some(&ns),
                    Some(&name),
                    json!({"code": code, "message": message, "by": BY}),
                );
                break;
            }
            404 => {
                refused(ctx, &ns, &name, &last, refusals);
                return Ok(());
            }
            429 => {
                // Every refusal is in the API audit log; the world log gets one entry per distinct answer.
                if last.as_ref() != Some(&(code, message.clone())) {
                    refused(ctx, &ns, &name, &last, refusals);
                    ctx.audit.world(
                        "eviction-attempt",
                        "pods",
                        Some(&ns),
                        Some(&name),
                        json!({"code": code, "message": message, "by": BY}),
                    );
                    last = Some((code, message));
                    refusals = 0;
                }
                refusals += 1;
                tokio::time::sleep(s.eviction_retry_floor).await;
            }
            _ => {
                refused(ctx, &ns, &name, &last, refusals);
                ctx.audit.world(
                    "eviction-attempt",
                    "pods",
                    Some(&ns),
                    Some(&name),
                    json!({"code": code, "message": message, "by": BY}),
                );
                return Err(format!(
                    "error when evicting pods/{name:?} -n {ns:?}: {message}"
                ));
            }
        }
    }
    // waitForDelete: gone on 404 or another UID, checked every second until the global timeout.
    loop {
        match api.get_opt(&name).await {
            Ok(None) => return Ok(()),
            Ok(Some(p)) if p.metadata.uid.as_deref() != Some(uid.as_str()) => return Ok(()),
            _ => {}
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "error when waiting for pod {name:?} in namespace {ns:?} to terminate: context deadline exceeded"
            ));
        }
        tokio::time::sleep(s.delete_poll).await;
    }
}

/// Records how many times in a row the last answer came back, once it changes.
fn refused(ctx: &WorldContext, ns: &str, name: &str, last: &Option<(u16, String)>, times: u64) {
    if let Some((code, _)) = last
        && times > 1
    {
        ctx.audit.world(
            "eviction-retried",
            "pods",
            Some(ns),
            Some(name),
            json!({"code": code, "times": times, "by": BY}),
        );
    }
}
