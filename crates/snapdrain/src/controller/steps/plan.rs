//! Pending: decide which nodes, which pods, which backups (reusing fresh verified ones).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::inventory;
use crate::api::status::{BackupRecord, NodePhase, NodeProgress};
use crate::api::velero::BackupStorageLocation;
use crate::controller::error::ControllerError;
use crate::controller::reconcile::PlanRun;
use crate::planning::{
    BackupNeed, Clock, NodeInputs, PhaseFacts, PlanRef, ReusableBackup, backup_name, find_reusable,
    plan_node, summarize_backups,
};
use crate::signals::plan::{left_before_backup, protected_at_signal};

pub async fn run(
    run: &mut PlanRun,
    facts: &mut PhaseFacts,
) -> Result<Option<Duration>, ControllerError> {
    let client = run.ctx.client.clone();
    let caches = run.ctx.synced_caches().await?.clone();
    let names = match &run.plan.spec.node_selector {
        Some(sel) if run.plan.spec.nodes.is_empty() => inventory::select_nodes(&caches, sel)?,
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
    let reusable: Vec<ReusableBackup> = reusable_records
        .iter()
        .map(|r| ReusableBackup::from_record(r, None))
        .collect();
    let mut needs: BTreeMap<String, BackupNeed> = BTreeMap::new();
    let mut nodes = Vec::new();
    let mut missing = Vec::new();
    let mut refusals = Vec::new();
    let mut on_nodes = Vec::new();
    for name in &names {
        let Some(inv) = inventory::node_inventory(&client, &caches, name).await? else {
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
        on_nodes.extend(inv.pods.iter().cloned());
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
                    // Decided below on the merged PVC set of every node.
                    reuse: None,
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
    if left_unbacked(run, &on_nodes).await {
        return Ok(None);
    }
    // Reuse is decided on what the whole plan needs per namespace: one node's backup does not cover
    // another node's PVCs. Candidates must be in the location a new Backup would go to.
    if !reusable.is_empty() {
        let location = effective_location(run).await?;
        for need in needs.values_mut() {
            need.reuse = find_reusable(
                &need.namespace,
                &need.pvcs,
                &reusable,
                location.as_deref(),
                run.valid.reuse_if_newer_than,
                clock,
            )
            .map(|c| c.name.clone());
        }
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
                // A fresh verified backup from another plan covers these PVCs: a candidate only. The
                // BackingUp step reads the Backup again (Completed, not about to expire) and Verifying
                // checks the bucket again before it counts.
                Some(existing) => BackupRecord {
                    reused: true,
                    verified: false,
                    verified_objects: Vec::new(),
                    verified_at: None,
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

/// Says loudly when protected pods the signal saw have already left the node (a forceful disruptor
/// deleted them before this first look): a Warning Event and a metric, and the plan fails when none of
/// them is left to back up. Returns true when it failed the plan.
async fn left_unbacked(run: &mut PlanRun, on_nodes: &[k8s_openapi::api::core::v1::Pod]) -> bool {
    let seen = protected_at_signal(&run.plan);
    let left = left_before_backup(&seen, on_nodes);
    if left.is_empty() {
        return false;
    }
    run.ctx.metrics.pods_left_unbacked.inc_by(left.len() as u64);
    let deadline = match &run.plan.spec.deadline {
        Some(d) => format!(" (deadline {})", d.0),
        None => String::new(),
    };
    let message = format!(
        "{} protected pod(s) left the node before snapdrain could back them up{deadline}: {}. Their PVCs stay, but this plan has no backup of them; Karpenter deletes pods at terminationGracePeriod minus their own grace period, so give the NodePool a terminationGracePeriod longer than the pods' grace plus the backup time",
        left.len(),
        left.join(", ")
    );
    run.event(
        EventType::Warning,
        "ProtectedPodsLeft",
        "Plan",
        message.clone(),
    )
    .await;
    if left.len() == seen.len() {
        run.fail = Some(message);
        return true;
    }
    false
}

/// The BackupStorageLocation a new Backup of this plan goes to: the plan's, else the one Velero picks, the
/// BSL with `spec.default: true` (velero pkg/controller/backup_controller.go prepareBackupRequest). None
/// when no BSL is marked default.
async fn effective_location(run: &PlanRun) -> Result<Option<String>, ControllerError> {
    if let Some(l) = &run.plan.spec.backup.storage_location {
        return Ok(Some(l.clone()));
    }
    let ns = &run.plan.spec.backup.velero_namespace;
    let bsls: kube::Api<BackupStorageLocation> = kube::Api::namespaced(run.ctx.client.clone(), ns);
    let list = bsls
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|source| ControllerError::Read {
            what: format!("BackupStorageLocations in namespace {ns}"),
            source,
        })?;
    Ok(list
        .items
        .into_iter()
        .find(|b| b.spec.default == Some(true))
        .map(|b| b.name_any()))
}

/// Verified backup records of every other plan (the candidates for reuse), each with the location its
/// Backup went to.
async fn verified_records(run: &PlanRun) -> Result<Vec<BackupRecord>, ControllerError> {
    // Decoded one by one: a plan snapdrain cannot read offers no backup to reuse.
    let list: Vec<crate::api::DisruptionPlan> = crate::api::lenient::list_decoded(&run.ctx.client)
        .await
        .map_err(|source| ControllerError::Read {
            what: "DisruptionPlans".into(),
            source,
        })?;
    Ok(list
        .into_iter()
        .filter(|p| p.uid() != run.plan.uid())
        .flat_map(|p| {
            let location = p.spec.backup.storage_location.clone();
            p.status
                .map(|s| s.backups)
                .unwrap_or_default()
                .into_iter()
                .map(move |mut b| {
                    if b.storage_location.is_none() {
                        b.storage_location = location.clone();
                    }
                    b
                })
        })
        .filter(|b| b.verified && b.storage_location.is_some())
        .collect())
}

fn reusable_record(records: &[BackupRecord], name: &str) -> Option<BackupRecord> {
    records.iter().find(|r| r.name == name).cloned()
}
