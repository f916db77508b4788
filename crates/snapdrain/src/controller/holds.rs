//! The hold keeper: every protected pod carries snapdrain's holds from the moment it is seen (and on
//! start-up for the pods that exist), a released pod gets them back once the plan that released it is
//! over (completed, failed, aborted or deleted), and a pod the policy no longer protects loses them.
//! Decisions are [`crate::planning::holds`]; this file watches and patches.
//!
//! Runs on the Lease holder only. Every change is a JSON merge patch guarded by the pod's
//! resourceVersion, so a user's concurrent edit is never overwritten (the 409 is retried on the next
//! event or sweep).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tokio::sync::{broadcast, watch};

use super::cache::{Cache, Caches};

use crate::api::DisruptionPlan;
use crate::api::policy::DisruptionPolicySpec;
use crate::planning::holds::{self, AnnotationPatch, HoldState};
use crate::planning::inventory::{is_terminal, is_terminating};
use crate::planning::protection;
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

/// Whether the plan named `name` still runs: in the cache and not over, or (not cached yet: a plan just
/// made) found through the API.
async fn plan_running(client: &Client, plans: &Store<DisruptionPlan>, name: &str) -> bool {
    let running = |p: &DisruptionPlan| {
        p.metadata.deletion_timestamp.is_none()
            && !p
                .status
                .as_ref()
                .map(|s| s.phase)
                .unwrap_or_default()
                .is_terminal()
    };
    if let Some(p) = plans.get(&ObjectRef::new(name)) {
        return running(&p);
    }
    let api: Api<DisruptionPlan> = Api::all(client.clone());
    match api.get_opt(name).await {
        Ok(Some(p)) => running(&p),
        Ok(None) => false,
        // Unknown: keep the release rather than hold a pod its plan may be draining.
        Err(_) => true,
    }
}

struct Keeper {
    client: Client,
    plans: Store<DisruptionPlan>,
    namespaces: Cache<Namespace>,
    policy: watch::Receiver<DisruptionPolicySpec>,
    metrics: Metrics,
}

impl Keeper {
    /// Brings one pod to the state the policy and its plan want.
    async fn ensure(&self, pod: &Pod) {
        if is_terminal(pod) || is_terminating(pod) {
            return;
        }
        let protection = self.policy.borrow().protection.clone();
        let ns_labels = self
            .namespaces
            .get("", &pod.namespace().unwrap_or_default())
            .map(|n| n.labels().clone());
        if protection.namespace_selector.is_some() && ns_labels.is_none() {
            // The namespace is not cached yet (start-up): deciding now could take a hold away.
            return;
        }
        let protected = protection::protects(&protection, pod, ns_labels.as_ref());
        let change = match (protected, holds::state(pod)) {
            (false, _) => holds::remove(pod).map(|p| ("removed", p)),
            (true, HoldState::Released(plan)) => {
                if plan_running(&self.client, &self.plans, &plan).await {
                    None
                } else {
                    holds::restore(pod).map(|p| ("restored", p))
                }
            }
            (true, _) => holds::place(pod).map(|p| ("placed", p)),
        };
        let Some((action, patch)) = change else {
            return;
        };
        match apply(&self.client, pod, &patch).await {
            Ok(true) => {
                self.metrics.hold_change(action);
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
                Ok(pod) if pod.may_be_held() => keeper.ensure(&pod.to_pod()).await,
                Ok(_) => {}
                // Missed changes are caught up by looking at every pod now.
                Err(broadcast::error::RecvError::Lagged(_)) => sweep.reset_immediately(),
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = sweep.tick() => {
                // Before the first list, an empty cache is not "no pods": nothing to count or look at.
                if !caches.pods.synced() {
                    continue;
                }
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
                    keeper.ensure(&pod).await;
                }
                keeper.count(by_state);
            }
        }
    }
}
