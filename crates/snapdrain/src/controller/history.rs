//! The history keeper: deletes the finished plans the policy's `history` no longer keeps (decisions:
//! [`crate::planning::history`]). Runs on the Lease holder only, from the plan store and the node
//! cache; it deletes nothing until both are filled, since an empty node cache would read as "every node
//! is gone" and an unfilled store as "no plan is newer".

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use tokio::sync::watch;

use super::cache::Cache;
use crate::api::policy::{DisruptionPolicySpec, HistorySpec};
use crate::api::{DisruptionPlan, KEEP_ANNOTATION};
use crate::planning::history::{PlanAge, Retention, expired};
use crate::telemetry::Metrics;

/// The longest pause between two looks: a TTL of days needs no finer grain.
const MOST: Duration = Duration::from_secs(60);
/// The shortest pause: the store changes faster than plans age.
const LEAST: Duration = Duration::from_secs(1);

/// Deletes expired plans until `until`, looking every quarter of the TTL (between one second and a
/// minute) and at once when the policy changes.
pub async fn run(
    client: Client,
    plans: Store<DisruptionPlan>,
    nodes: Cache<Node>,
    mut policy: watch::Receiver<DisruptionPolicySpec>,
    metrics: Metrics,
    until: impl std::future::Future<Output = ()>,
) {
    let api: Api<DisruptionPlan> = Api::all(client);
    let mut until = std::pin::pin!(until);
    // Nothing is deleted under the built-in defaults: a user's longer TTL must be read first (the
    // follower announces the first valid policy it reads).
    tokio::select! {
        () = &mut until => return,
        r = policy.changed() => if r.is_err() { return },
    }
    loop {
        let history = policy.borrow_and_update().history.clone();
        let pause = match retention(&history) {
            Some(retention) => {
                if plans.wait_until_ready().await.is_ok() && nodes.synced() {
                    sweep(&api, &plans, &nodes, retention, &metrics).await;
                }
                (retention.ttl / 4).clamp(LEAST, MOST)
            }
            None => MOST,
        };
        tokio::select! {
            () = &mut until => return,
            r = policy.changed() => if r.is_err() { return },
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// The settings, parsed (the policy was validated before it was accepted; a value that still does not
/// parse deletes nothing).
fn retention(history: &HistorySpec) -> Option<Retention> {
    let ttl = crate::api::validate::spec_duration(&history.ttl_after_finished).ok()?;
    Some(Retention {
        ttl,
        keep_per_node: usize::try_from(history.keep_per_node).unwrap_or(usize::MAX),
    })
}

async fn sweep(
    api: &Api<DisruptionPlan>,
    plans: &Store<DisruptionPlan>,
    nodes: &Cache<Node>,
    retention: Retention,
    metrics: &Metrics,
) {
    let state = plans.state();
    let ages: Vec<PlanAge> = state.iter().map(|p| age_of(p)).collect();
    let nodes = nodes.all();
    let live: HashSet<&str> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    for name in expired(&ages, &live, jiff::Timestamp::now(), retention) {
        let Some(plan) = state.iter().find(|p| p.name_any() == name) else {
            continue;
        };
        // Deletes exactly the plan decided on: one re-created under the same name meanwhile stays.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: plan.uid(),
                resource_version: plan.resource_version(),
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {
                metrics.plans_deleted.inc();
                tracing::info!(plan = %name, "deleted a finished plan past the policy's history.ttlAfterFinished");
            }
            // Gone, or changed since the store saw it: the next look decides again.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => {
                tracing::warn!(plan = %name, error = %e, "cannot delete a finished plan; trying again later");
            }
        }
    }
}

/// When `plan` ended, which nodes it covers, and whether it is marked to be kept.
fn age_of(plan: &DisruptionPlan) -> PlanAge {
    let status = plan.status.as_ref();
    let ended_at = status.filter(|s| s.phase.is_terminal()).map(|s| {
        // The terminal phase's start; an invalid spec is failed without one, at its condition's time.
        s.phase_started_at
            .as_ref()
            .map(|t| t.0)
            .or_else(|| s.conditions.iter().map(|c| c.last_transition_time.0).max())
            .or_else(|| plan.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .unwrap_or_else(jiff::Timestamp::now)
    });
    let nodes = match status.map(|s| &s.nodes) {
        Some(progress) if !progress.is_empty() => progress.iter().map(|n| n.name.clone()).collect(),
        _ => plan.spec.nodes.clone(),
    };
    PlanAge {
        name: plan.name_any(),
        ended_at,
        nodes,
        keep: plan
            .annotations()
            .get(KEEP_ANNOTATION)
            .is_some_and(|v| v == "true"),
    }
}
