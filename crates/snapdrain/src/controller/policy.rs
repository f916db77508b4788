//! The DisruptionPolicy the controller works under: the object named `default`, created with the
//! documented defaults when absent, followed by watch. An invalid update is refused loudly (a Warning
//! Event on the policy and an error log naming every problem) and the last valid policy stays in force,
//! so a typo never turns protection off.

use futures::StreamExt;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tokio::sync::watch;

use crate::api::policy::{DEFAULT_POLICY, DisruptionPolicy, DisruptionPolicySpec};

/// Creates the default policy when it is missing. A 403 (no create permission) or a missing CRD is not
/// fatal: snapdrain then works under the built-in defaults and says so.
pub async fn ensure_default(client: &Client) {
    let api: Api<DisruptionPolicy> = Api::all(client.clone());
    let policy = DisruptionPolicy::new(DEFAULT_POLICY, DisruptionPolicySpec::defaults());
    match api.create(&PostParams::default(), &policy).await {
        Ok(_) => tracing::info!("created DisruptionPolicy {DEFAULT_POLICY} with the default rules"),
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => tracing::warn!(
            error = %e,
            "cannot create DisruptionPolicy {DEFAULT_POLICY}; working under the built-in defaults (is the DisruptionPolicy CRD installed?)"
        ),
    }
}

/// How long the hold keeper and the signal watcher wait for the first policy read before they act under
/// the built-in defaults (no DisruptionPolicy CRD, no permission to read it).
const FIRST_POLICY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits until the policy in the cluster was read once (or [`FIRST_POLICY_WAIT`] passed), so a user's
/// narrower policy is in force before the first hold or plan.
pub async fn wait_for_policy(policy: &mut watch::Receiver<DisruptionPolicySpec>) {
    if tokio::time::timeout(FIRST_POLICY_WAIT, policy.changed())
        .await
        .is_err()
    {
        tracing::warn!(
            "no DisruptionPolicy read within {FIRST_POLICY_WAIT:?}; holding and watching signals under the built-in defaults"
        );
    }
}

/// The policy as plan reconciles judge plans by: nothing until it was read once (or
/// [`FIRST_POLICY_WAIT`] passed, then the built-in defaults, which refuse every free-form launch
/// setting), so a plan is never judged by defaults the cluster's policy would have relaxed, nor let
/// through by a policy not yet read.
#[derive(Debug, Default)]
pub struct PolicyView(std::sync::RwLock<Option<DisruptionPolicySpec>>);

impl PolicyView {
    /// The policy in force, once known.
    pub fn get(&self) -> Option<DisruptionPolicySpec> {
        self.0.read().ok().and_then(|p| p.clone())
    }

    pub fn set(&self, policy: DisruptionPolicySpec) {
        if let Ok(mut p) = self.0.write() {
            *p = Some(policy);
        }
    }

    /// Forgets the policy (a replica that leads again reads it afresh before judging plans).
    pub fn clear(&self) {
        if let Ok(mut p) = self.0.write() {
            *p = None;
        }
    }
}

/// Keeps `view` at the followed policy: after the first read (or the wait), then on every change.
pub async fn mirror(mut policy: watch::Receiver<DisruptionPolicySpec>, view: &PolicyView) {
    wait_for_policy(&mut policy).await;
    loop {
        view.set(policy.borrow_and_update().clone());
        if policy.changed().await.is_err() {
            return;
        }
    }
}

/// Follows the default policy until `until`; the receiver always holds the last valid spec. With a
/// `recorder` (the Lease holder) an invalid update is also reported as a Warning Event; every replica's
/// eviction gate follows the policy too, without one, so that it is reported once.
pub async fn follow(
    client: Client,
    recorder: Option<Recorder>,
    tx: watch::Sender<DisruptionPolicySpec>,
    until: impl std::future::Future<Output = ()>,
) {
    let api: Api<DisruptionPolicy> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={DEFAULT_POLICY}"));
    let stream = watcher(api, config).default_backoff().applied_objects();
    let mut stream = std::pin::pin!(stream);
    let mut until = std::pin::pin!(until);
    let mut first = true;
    let mut last_warned: Option<std::time::Instant> = None;
    loop {
        tokio::select! {
            _ = &mut until => return,
            event = stream.next() => match event {
                Some(Ok(policy)) => accept(&recorder, &tx, &policy, &mut first).await,
                // A policy that cannot be decoded (or cannot be read at all) leaves the last valid
                // rules in force without a word at the default log level: warn, at most once per
                // WATCH_WARN_EVERY, as the watch retries with backoff.
                Some(Err(e)) => {
                    let now = std::time::Instant::now();
                    if last_warned.is_none_or(|at| now.duration_since(at) >= WATCH_WARN_EVERY) {
                        last_warned = Some(now);
                        tracing::warn!(
                            error = %e,
                            "cannot read DisruptionPolicy {DEFAULT_POLICY}; the previous rules stay in force (fix the object, e.g. `kubectl get disruptionpolicy {DEFAULT_POLICY} -o yaml`, or check snapdrain may list and watch disruptionpolicies)"
                        );
                    } else {
                        tracing::debug!(error = %e, "DisruptionPolicy watch");
                    }
                }
                None => return,
            },
        }
    }
}

/// The least time between two warnings of a failing policy watch (it retries with backoff, so each
/// failure would otherwise log once per retry).
const WATCH_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

async fn accept(
    recorder: &Option<Recorder>,
    tx: &watch::Sender<DisruptionPolicySpec>,
    policy: &DisruptionPolicy,
    first: &mut bool,
) {
    match policy.spec.validate() {
        Ok(()) => {
            // The first valid policy is always announced, even when it equals the built-in defaults:
            // the hold keeper and the signal watcher wait for it before they act (`wait_for_policy`).
            let announce = std::mem::take(first);
            tx.send_if_modified(|current| {
                let changed = announce || *current != policy.spec;
                *current = policy.spec.clone();
                changed
            });
        }
        Err(problems) => {
            let note = format!(
                "DisruptionPolicy {DEFAULT_POLICY} is invalid, the previous rules stay in force: {}",
                problems.join("; ")
            );
            let Some(recorder) = recorder else {
                tracing::debug!("{note}");
                return;
            };
            tracing::error!("{note}");
            let _ = recorder
                .publish(
                    &Event {
                        type_: EventType::Warning,
                        reason: "InvalidPolicy".into(),
                        note: Some(note),
                        action: "Validate".into(),
                        secondary: None,
                    },
                    &policy.object_ref(&()),
                )
                .await;
        }
    }
}
