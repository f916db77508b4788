//! Pending: decide which nodes, which pods, which backups (reusing fresh verified ones).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::inventory;
use crate::api::status::{BackupRecord, NodePhase, NodeProgress};
use crate::controller::error::ControllerError;
use crate::controller::reconcile::PlanRun;
use crate::planning::{
    BackupNeed, Clock, NodeInputs, PhaseFacts, PlanRef, ReusableBackup, backup_name, plan_node,
    summarize_backups,
};

pub async fn run(
    run: &mut PlanRun,
    facts: &mut PhaseFacts,
) -> Result<Option<Duration>, ControllerError> {
    let client = run.ctx.client.clone();
    let names = match &run.plan.spec.node_selector {
        Some(sel) if run.plan.spec.nodes.is_empty() => {
            inventory::select_nodes(&client, sel).await?
        }
        _ => run.plan.spec.nodes.clone(),
    };
    let decided_at = run
        .status
        .decided_at
        .as_ref()
        .map(|t| t.0)
        .unwrap_or_else(PlanRun::now);
    let clock = Clock {
        decided_at,
        now: PlanRun::now(),
    };
    let reusable_records = verified_records(run).await?;
    let location = run.plan.spec.backup.storage_location.clone();
    let reusable: Vec<ReusableBackup> = reusable_records
        .iter()
        .map(|r| ReusableBackup::from_record(r, &location))
        .collect();
    let mut needs: BTreeMap<String, BackupNeed> = BTreeMap::new();
    let mut nodes = Vec::new();
    let mut missing = Vec::new();
    let mut refusals = Vec::new();
    for name in &names {
        let Some(inv) = inventory::node_inventory(&client, name).await? else {
            missing.push(name.clone());
            continue;
        };
        let inputs = NodeInputs {
            node: &inv.node,
            pods: &inv.pods,
            stateful_sets: &inv.stateful_sets,
            pvcs: &inv.pvcs,
            pdbs: &inv.pdbs,
            existing_backups: &reusable,
        };
        let plan = plan_node(&inputs, &run.plan.spec, &run.valid, clock);
        if let Some(r) = plan.refusal_message() {
            refusals.push(r);
        }
        for w in &plan.warnings {
            run.event(
                EventType::Warning,
                "PlanWarning",
                "Plan",
                format!("node {name}: {w}"),
            )
            .await;
        }
        for need in plan.backups {
            let merged = needs
                .entry(need.namespace.clone())
                .or_insert_with(|| BackupNeed {
                    namespace: need.namespace.clone(),
                    stateful_sets: Vec::new(),
                    pvcs: Vec::new(),
                    pods: Vec::new(),
                    or_label_selectors: Vec::new(),
                    reuse: need.reuse.clone(),
                });
            {
                for s in need.stateful_sets {
                    if !merged.stateful_sets.contains(&s) {
                        merged.stateful_sets.push(s);
                    }
                }
                for p in need.pvcs {
                    if !merged.pvcs.contains(&p) {
                        merged.pvcs.push(p);
                    }
                }
                for p in need.pods {
                    if !merged.pods.contains(&p) {
                        merged.pods.push(p);
                    }
                }
                for s in need.or_label_selectors {
                    if !merged.or_label_selectors.contains(&s) {
                        merged.or_label_selectors.push(s);
                    }
                }
            }
        }
        nodes.push(NodeProgress {
            name: inv.node.name_any(),
            uid: inv.node.uid(),
            instance_id: plan.instance_id.clone(),
            pods_total: plan.evictions.len() as u32,
            phase: NodePhase::Pending,
            ..NodeProgress::default()
        });
    }
    if !missing.is_empty() {
        run.status.message = Some(format!(
            "node(s) {} do not exist; waiting for them (check spec.nodes)",
            missing.join(", ")
        ));
        return Ok(Some(Duration::from_secs(10)));
    }
    if !refusals.is_empty() {
        run.status.message = Some(refusals.join("; "));
        return Ok(Some(Duration::from_secs(30)));
    }
    let plan_ref = PlanRef {
        name: &run.name(),
        uid: &run.uid(),
    };
    let records: Vec<BackupRecord> = needs
        .values()
        .map(|need| {
            match need
                .reuse
                .as_ref()
                .and_then(|r| reusable_record(&reusable_records, r))
            {
                // A fresh verified backup from another plan covers these PVCs: reuse it, verified as it is.
                Some(existing) => BackupRecord {
                    reused: true,
                    ..existing
                },
                None => BackupRecord {
                    name: backup_name(&plan_ref, &need.namespace, 1),
                    namespace: need.namespace.clone(),
                    stateful_sets: need.stateful_sets.clone(),
                    pvcs: need.pvcs.clone(),
                    pods: need.pods.clone(),
                    attempt: 1,
                    ..BackupRecord::default()
                },
            }
        })
        .collect();
    run.status.nodes = nodes;
    run.status.backups = records;
    run.status.decided_at = Some(Time(decided_at));
    let namespaces: Vec<String> = needs.keys().cloned().collect();
    facts.backups = summarize_backups(
        &namespaces,
        &run.status.backups,
        run.plan.spec.backup.max_attempts,
    );
    let pods: u32 = run.status.nodes.iter().map(|n| n.pods_total).sum();
    run.status.message = Some(format!(
        "{} node(s), {pods} pod(s) to move, {} namespace(s) to back up",
        run.status.nodes.len(),
        namespaces.len()
    ));
    Ok(None)
}

/// Verified backup records of every other plan (the candidates for reuse).
async fn verified_records(run: &PlanRun) -> Result<Vec<BackupRecord>, ControllerError> {
    let plans: kube::Api<crate::api::DisruptionPlan> = kube::Api::all(run.ctx.client.clone());
    let list = plans
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|source| ControllerError::Read {
            what: "DisruptionPlans".into(),
            source,
        })?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| {
            p.uid() != run.plan.uid()
                && p.spec.backup.storage_location == run.plan.spec.backup.storage_location
        })
        .filter_map(|p| p.status)
        .flat_map(|s| s.backups)
        .filter(|b| b.verified)
        .collect())
}

fn reusable_record(records: &[BackupRecord], name: &str) -> Option<BackupRecord> {
    records.iter().find(|r| r.name == name).cloned()
}
