//! Reads a report's inputs from a cluster: the plan, its Events (events.k8s.io/v1, as the controller
//! records them, and core/v1 from older recorders), its Velero Backups, and on the simulated cluster
//! the audit log (`GET /sim/audit`; a real API server answers 404 and the report goes without it).

use k8s_openapi::api::core::v1::Event as CoreEvent;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::model::{AuditRecord, PlanEvent, ReportData, VeleroBackupTimes};
use snapdrain::api::DisruptionPlan;
use snapdrain::api::velero::Backup;

#[derive(Debug, thiserror::Error)]
pub enum GatherError {
    #[error("plan {0} not found; list plans with `snapdrain status`")]
    NotFound(String),
    #[error("cannot read plan {plan}: {source}")]
    Plan {
        plan: String,
        #[source]
        source: kube::Error,
    },
}

fn event_time(e: &Event) -> Option<jiff::Timestamp> {
    e.event_time
        .as_ref()
        .map(|t| t.0)
        .or_else(|| e.deprecated_last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// Events about the plan, oldest first. Unreadable Events make a shorter report, not a failure.
async fn plan_events(client: &Client, plan: &DisruptionPlan) -> Vec<PlanEvent> {
    let name = plan.name_any();
    let uid = plan.uid();
    let mut out = Vec::new();
    if let Ok(list) = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        for e in list.items {
            let about = e.regarding.as_ref();
            let ours = about.is_some_and(|r| {
                r.kind.as_deref() == Some("DisruptionPlan")
                    && r.name.as_deref() == Some(name.as_str())
                    && (uid.is_none() || r.uid.is_none() || r.uid == uid)
            });
            if let (true, Some(time)) = (ours, event_time(&e)) {
                out.push(PlanEvent {
                    time,
                    type_: e.type_.clone().unwrap_or_default(),
                    reason: e.reason.clone().unwrap_or_default(),
                    note: e.note.clone().unwrap_or_default(),
                });
            }
        }
    }
    if out.is_empty()
        && let Ok(list) = Api::<CoreEvent>::all(client.clone())
            .list(&ListParams::default())
            .await
    {
        for e in list.items {
            let o = &e.involved_object;
            if o.kind.as_deref() == Some("DisruptionPlan")
                && o.name.as_deref() == Some(name.as_str())
            {
                let time = e
                    .last_timestamp
                    .as_ref()
                    .or(e.first_timestamp.as_ref())
                    .map(|t| t.0)
                    .or_else(|| e.event_time.as_ref().map(|t| t.0));
                if let Some(time) = time {
                    out.push(PlanEvent {
                        time,
                        type_: e.type_.clone().unwrap_or_default(),
                        reason: e.reason.clone().unwrap_or_default(),
                        note: e.message.clone().unwrap_or_default(),
                    });
                }
            }
        }
    }
    out.sort_by_key(|e| e.time);
    out
}

async fn velero_backups(client: &Client, plan: &DisruptionPlan) -> Vec<VeleroBackupTimes> {
    let api: Api<Backup> = Api::namespaced(client.clone(), &plan.spec.backup.velero_namespace);
    let lp = ListParams::default().labels(&format!("snapdrain.io/plan={}", plan.name_any()));
    let Ok(list) = api.list(&lp).await else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .map(|b| {
            let s = b.status.clone().unwrap_or_default();
            VeleroBackupTimes {
                name: b.name_any(),
                created: b.metadata.creation_timestamp.as_ref().map(|t| t.0),
                started: s.start_timestamp.as_ref().map(|t| t.0),
                completed: s.completion_timestamp.as_ref().map(|t| t.0),
                phase: s.phase.clone(),
                items: s.progress.map(|p| (p.items_backed_up, p.total_items)),
            }
        })
        .collect()
}

/// The simulator's audit log, or None on any other API server.
async fn sim_audit(client: &Client) -> Option<Vec<AuditRecord>> {
    let req = http::Request::get("/sim/audit").body(Vec::new()).ok()?;
    let text = client.request_text(req).await.ok()?;
    serde_json::from_str(&text).ok()
}

pub async fn gather(client: &Client, plan: &str) -> Result<ReportData, GatherError> {
    let api: Api<DisruptionPlan> = Api::all(client.clone());
    let found = api
        .get_opt(plan)
        .await
        .map_err(|source| GatherError::Plan {
            plan: plan.into(),
            source,
        })?
        .ok_or_else(|| GatherError::NotFound(plan.into()))?;
    Ok(ReportData {
        events: plan_events(client, &found).await,
        backups: velero_backups(client, &found).await,
        audit: sim_audit(client).await,
        plan: found,
        generated_at: jiff::Timestamp::now(),
    })
}
