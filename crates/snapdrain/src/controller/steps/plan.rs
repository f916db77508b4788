//! Pending: decide which nodes, which pods, which backups (reusing fresh verified ones), and resolve
//! what the replacements join with, so that nothing that can fail the plan is found after its nodes
//! were touched.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::inventory;
use crate::api::status::{BackupRecord, NodePhase, NodeProgress};
use crate::api::velero::BackupStorageLocation;
use crate::controller::error::ControllerError;
use crate::controller::report::What;
use crate::controller::step::{Io, Next, Outcome, PlanView, Wake};
use crate::planning::{
    BackupNeed, PlanRef, ReusableBackup, backup_name, find_reusable, plan_node, status_size,
};
use crate::signals::plan::{left_before_backup, protected_at_signal};

pub async fn run(v: &PlanView<'_>, io: &Io<'_>) -> Result<Outcome, ControllerError> {
    let spec = &v.plan.spec;
    let names = match &spec.node_selector {
        Some(sel) if spec.nodes.is_empty() => inventory::select_nodes(io.caches, sel)?,
        _ => spec.nodes.clone(),
    };
    let (reusable_records, running_records) = verified_records(io.client, v.plan.uid()).await?;
    let reusable: Vec<ReusableBackup> = reusable_records
        .iter()
        .map(|r| ReusableBackup::from_record(r, None))
        .collect();
    let mut out = v.outcome();
    let mut seen = look(v, io, &names, &reusable, &mut out).await?;
    if !seen.missing.is_empty() {
        out.status.message = Some(format!(
            "node(s) {} do not exist; waiting for them (check spec.nodes)",
            seen.missing.join(", ")
        ));
        return Ok(out.then(Next::Wait {
            wake: Wake::Never,
            recheck: Duration::from_secs(10),
        }));
    }
    if !seen.refusals.is_empty() {
        out.status.message = Some(seen.refusals.join("; "));
        // Looked at again soon: a pod that starts running or a person's fix ends the wait.
        return Ok(out.then(Next::Wait {
            wake: Wake::Never,
            recheck: Duration::from_secs(10),
        }));
    }
    // A pod that left under another running plan's verified backup (the gate let it go for that) lost
    // nothing; its claims are read from the pod now under its name (a StatefulSet's keeps them).
    let covered = |pod: &str| {
        let (ns, name) = pod.split_once('/').unwrap_or_default();
        io.caches.pods.get(ns, name).is_some_and(|p| {
            let p = p.to_pod();
            covered_by(
                ns,
                crate::planning::inventory::pvc_claims(&p),
                &running_records,
            )
        })
    };
    if let Some((pods, message, none_left)) = left_unbacked(v.plan, &seen.pods, covered) {
        out.note(What::ProtectedPodsLeft { pods }, message.clone());
        if none_left {
            return Ok(out.then(Next::Fail(message)));
        }
    }
    // Reuse is decided on what the whole plan needs per namespace: one node's backup does not cover
    // another node's PVCs. Candidates must be in the location a new Backup would go to.
    if !reusable.is_empty() {
        let location = effective_location(v, io).await?;
        for need in seen.needs.values_mut() {
            need.reuse = find_reusable(
                &need.namespace,
                &need.pvcs,
                &reusable,
                location.as_deref(),
                v.valid.reuse_if_newer_than,
                v.clock(),
            )
            .map(|c| c.name.clone());
        }
    }
    let plan_ref = PlanRef {
        name: &v.name(),
        uid: &v.uid(),
    };
    // Checked before anything is touched (no cordon, no Backup): a replacement that could never be
    // built fails the plan here, with the node as it was.
    if let Some(replacement) = super::join::launches(v.plan) {
        out.status.nodes = std::mem::take(&mut seen.nodes);
        if let Err(why) = super::join::resolve(replacement, io, &mut out.status).await? {
            return Ok(out.then(Next::Fail(format!(
                "{why} (the plan failed while planning: no node was cordoned, backed up, drained or terminated)"
            ))));
        }
        seen.nodes = std::mem::take(&mut out.status.nodes);
    }
    out.status.backups = seen
        .needs
        .values()
        .map(|need| record_for(need, &reusable_records, &plan_ref))
        .collect();
    out.status.nodes = seen.nodes;
    // A status that could outgrow etcd's object limit would stop every later write, the rollback's
    // too: such a plan fails here, with its nodes as they were.
    if let Err(why) = status_size::check(
        &out.status,
        spec.backup.max_attempts,
        io.settings.status_budget,
    ) {
        return Ok(out.then(Next::Fail(format!(
            "{why} (the plan failed while planning: no node was cordoned, backed up, drained or terminated)"
        ))));
    }
    out.status.decided_at = Some(Time(v.clock().decided_at));
    let pods: u32 = out.status.nodes.iter().map(|n| n.pods_total).sum();
    out.status.message = Some(format!(
        "{} node(s), {pods} pod(s) to move, {} namespace(s) to back up",
        out.status.nodes.len(),
        seen.needs.len()
    ));
    Ok(out)
}

/// What Pending saw on the plan's nodes.
#[derive(Default)]
struct Seen {
    needs: BTreeMap<String, BackupNeed>,
    nodes: Vec<NodeProgress>,
    missing: Vec<String>,
    refusals: Vec<String>,
    /// Every pod on the nodes.
    pods: Vec<Pod>,
}

/// Whether a signal (an autoscaler, the termination handler, the eviction gate) made the plan: its nodes
/// existed when it was made, so a node missing now is gone, not misspelt.
fn made_by_signal(plan: &crate::api::DisruptionPlan) -> bool {
    !matches!(
        plan.spec.source,
        crate::api::PlanSource::Manual | crate::api::PlanSource::Api
    )
}

/// Plans each node (warnings go to `out` as notes) and merges what they need backed up.
async fn look(
    v: &PlanView<'_>,
    io: &Io<'_>,
    names: &[String],
    reusable: &[ReusableBackup],
    out: &mut Outcome,
) -> Result<Seen, ControllerError> {
    let mut seen = Seen::default();
    for name in names {
        let Some(mut inv) = inventory::node_inventory(io.client, io.caches, name).await? else {
            if made_by_signal(v.plan) {
                // The signal came from this node as the caches held it; they hold it no more: it went
                // before this first look (a forceful disruptor, a fast scale-down). Waiting for it would
                // keep the plan Pending for good; the pods the signal saw are judged below.
                out.note(
                    What::PlanWarning,
                    format!("node {name} is gone: it went before snapdrain could plan for it"),
                );
                seen.nodes.push(NodeProgress {
                    name: name.clone(),
                    phase: NodePhase::Gone,
                    ..NodeProgress::default()
                });
            } else {
                seen.missing.push(name.clone());
            }
            continue;
        };
        inv.read_volumes(io.client).await?;
        if v.plan.spec.backup.method != crate::api::plan::BackupMethod::FileSystem {
            inv.read_snapshot_classes(io.client).await?;
        }
        let protects = inventory::policy_protects(io.policy.as_ref(), &io.caches.namespaces);
        let inputs = inv.inputs(reusable, &protects);
        let plan = plan_node(&inputs, &v.plan.spec, v.valid, v.clock());
        seen.pods.extend(inv.pods.iter().cloned());
        seen.refusals.extend(plan.refusal_message());
        for w in &plan.warnings {
            out.note(What::PlanWarning, format!("node {name}: {w}"));
        }
        let rate = crate::planning::estimate::Rate {
            mib_per_second: io.settings.velero_mib_per_second,
            overhead: io.settings.velero_overhead,
        };
        for mut need in plan.backups {
            let records = need.volumes.iter_mut().map(|v| &mut v.record);
            crate::planning::estimate::annotate(records, &inv.pvs, rate);
            merge_need(&mut seen.needs, need);
        }
        for need in seen.needs.values_mut() {
            crate::planning::node::settle_planned(&v.plan.spec.backup, &mut need.volumes);
        }
        seen.nodes.push(NodeProgress {
            name: inv.node.name_any(),
            uid: inv.node.uid(),
            instance_id: plan.instance_id.clone(),
            pods_total: plan.evictions.len() as u32,
            phase: NodePhase::Pending,
            ..NodeProgress::default()
        });
    }
    warn_late_volumes(v, io, &seen, out);
    Ok(seen)
}

/// Under a deadline, names each volume Velero would copy only after it (the estimate at the
/// controller's `--velero-mib-per-second`), when the plan is made rather than after the deadline.
fn warn_late_volumes(v: &PlanView<'_>, io: &Io<'_>, seen: &Seen, out: &mut Outcome) {
    let Some(deadline) = &v.plan.spec.deadline else {
        return;
    };
    let left = deadline.0.duration_since(v.now);
    let left = if left.is_negative() {
        std::time::Duration::ZERO
    } else {
        left.unsigned_abs()
    };
    let rate = crate::planning::estimate::Rate {
        mib_per_second: io.settings.velero_mib_per_second,
        overhead: io.settings.velero_overhead,
    };
    let backups: Vec<(String, Vec<crate::api::volume::VolumeRecord>)> = seen
        .needs
        .iter()
        .map(|(ns, n)| {
            (
                ns.clone(),
                n.volumes.iter().map(|p| p.record.clone()).collect(),
            )
        })
        .collect();
    let ebs_emergency =
        v.plan.spec.backup.emergency_snapshots != crate::api::plan::EmergencySnapshots::Never;
    for late in crate::planning::estimate::late_volumes(&backups, rate, left, ebs_emergency) {
        out.note(What::PlanWarning, late.message);
    }
}

/// Adds one node's need to the plan's need for the same namespace (each StatefulSet, PVC, pod and
/// selector once).
pub fn merge_need(needs: &mut BTreeMap<String, BackupNeed>, need: BackupNeed) {
    let merged = needs
        .entry(need.namespace.clone())
        .or_insert_with(|| BackupNeed {
            namespace: need.namespace.clone(),
            stateful_sets: Vec::new(),
            pvcs: Vec::new(),
            pods: Vec::new(),
            volumes: Vec::new(),
            or_label_selectors: Vec::new(),
            // Decided on the merged PVC set of every node.
            reuse: None,
            skip_drivers: Vec::new(),
            hooks: Vec::new(),
        });
    fn add<T: PartialEq>(into: &mut Vec<T>, from: Vec<T>) {
        for x in from {
            if !into.contains(&x) {
                into.push(x);
            }
        }
    }
    add(&mut merged.stateful_sets, need.stateful_sets);
    add(&mut merged.pvcs, need.pvcs);
    add(&mut merged.pods, need.pods);
    add(&mut merged.volumes, need.volumes);
    add(&mut merged.or_label_selectors, need.or_label_selectors);
}

/// The record of a namespace's backup: a fresh verified backup of another plan that covers its PVCs (a
/// candidate only: BackingUp reads the Backup again and Verifying checks the bucket again before it
/// counts), or this plan's own first attempt.
fn record_for(need: &BackupNeed, reusable: &[BackupRecord], plan: &PlanRef<'_>) -> BackupRecord {
    let existing = need
        .reuse
        .as_ref()
        .and_then(|r| reusable.iter().find(|b| &b.name == r));
    match existing {
        Some(existing) => BackupRecord {
            reused: true,
            verified: false,
            verified_objects: Vec::new(),
            verified_at: None,
            ..existing.clone()
        },
        None => BackupRecord {
            name: backup_name(plan, &need.namespace, 1),
            namespace: need.namespace.clone(),
            stateful_sets: need.stateful_sets.clone(),
            pvcs: need.pvcs.clone(),
            pods: need.pods.clone(),
            volumes: need.volumes.iter().map(|v| v.record.clone()).collect(),
            attempt: 1,
            ..BackupRecord::default()
        },
    }
}

/// Whether verified `records` (of running plans) hold every one of a pod's `claims` in `namespace`, as
/// the eviction gate counts them (`webhook::decision`): a pod without claims is not covered.
pub fn covered_by<'a>(
    namespace: &str,
    claims: impl Iterator<Item = &'a str>,
    records: &[BackupRecord],
) -> bool {
    let mut any = false;
    for claim in claims {
        any = true;
        let held = records
            .iter()
            .any(|r| crate::webhook::decision::holds_claim(r, namespace, claim));
        if !held {
            return false;
        }
    }
    any
}

/// Protected pods the signal saw that have already left the node uncovered (a forceful disruptor
/// deleted them before this first look, and `covered` — a running plan's verified backup of all their
/// claims — does not hold): how many, the message, and whether no protected pod is left on the node to
/// back up (the plan then fails). None when every one that left was covered, or none left.
pub fn left_unbacked(
    plan: &crate::api::DisruptionPlan,
    on_nodes: &[Pod],
    covered: impl Fn(&str) -> bool,
) -> Option<(u64, String, bool)> {
    let seen = protected_at_signal(plan);
    let gone = left_before_backup(&seen, on_nodes);
    let left: Vec<String> = gone.iter().filter(|p| !covered(p)).cloned().collect();
    if left.is_empty() {
        return None;
    }
    let deadline = match &plan.spec.deadline {
        Some(d) => format!(" (deadline {})", d.0),
        None => String::new(),
    };
    let message = format!(
        "{} protected pod(s) left the node before snapdrain could back them up{deadline}: {}. Their PVCs stay, but this plan has no backup of them; Karpenter deletes pods at terminationGracePeriod minus their own grace period, so give the NodePool a terminationGracePeriod longer than the pods' grace plus the backup time",
        left.len(),
        left.join(", ")
    );
    Some((left.len() as u64, message, gone.len() == seen.len()))
}

/// The BackupStorageLocation a new Backup of this plan goes to: the plan's, else the one Velero picks, the
/// BSL with `spec.default: true` (velero pkg/controller/backup_controller.go prepareBackupRequest). None
/// when no BSL is marked default.
async fn effective_location(
    v: &PlanView<'_>,
    io: &Io<'_>,
) -> Result<Option<String>, ControllerError> {
    if let Some(l) = &v.plan.spec.backup.storage_location {
        return Ok(Some(l.clone()));
    }
    let ns = &v.plan.spec.backup.velero_namespace;
    let bsls: kube::Api<BackupStorageLocation> = kube::Api::namespaced(io.client.clone(), ns);
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

/// Verified backup records of every other plan: all of them with the location their Backup went to
/// (the candidates for reuse), and those of running plans (what the eviction gate counts as covering a
/// pod, for [`covered_by`]).
async fn verified_records(
    client: &kube::Client,
    own_uid: Option<String>,
) -> Result<(Vec<BackupRecord>, Vec<BackupRecord>), ControllerError> {
    // Decoded one by one: a plan snapdrain cannot read offers no backup to reuse.
    let list: Vec<crate::api::DisruptionPlan> = crate::api::lenient::list_decoded(client)
        .await
        .map_err(|source| ControllerError::Read {
            what: "DisruptionPlans".into(),
            source,
        })?;
    let running: Vec<BackupRecord> = list
        .iter()
        .filter(|p| p.uid() != own_uid && crate::webhook::decision::running(p))
        .filter_map(|p| p.status.as_ref())
        .flat_map(|s| s.backups.iter().filter(|b| b.verified).cloned())
        .collect();
    let reusable = list
        .into_iter()
        .filter(|p| p.uid() != own_uid)
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
        .collect();
    Ok((reusable, running))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(ns: &str, pvcs: &[&str], pods: &[&str]) -> BackupNeed {
        BackupNeed {
            namespace: ns.into(),
            stateful_sets: vec!["db".into()],
            pvcs: pvcs.iter().map(|s| s.to_string()).collect(),
            pods: pods.iter().map(|s| s.to_string()).collect(),
            volumes: Vec::new(),
            or_label_selectors: Vec::new(),
            reuse: None,
            skip_drivers: Vec::new(),
            hooks: Vec::new(),
        }
    }

    fn signalled(protected: &[&str]) -> crate::api::DisruptionPlan {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": "p", "annotations": {
                crate::signals::plan::PROTECTED_PODS_ANNOTATION: serde_json::to_string(protected).expect("a list")
            }},
            "spec": {"nodes": ["n1"], "mode": "Release"}
        }))
        .expect("a plan")
    }

    fn on_node(name: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop"}, "spec": {"nodeName": "n1", "containers": []}
        }))
        .expect("a pod")
    }

    /// The 1,000-disruption soak: Karpenter evicted a pod the moment it landed on a new node, covered by
    /// another running plan's verified backup, and the node's new plan failed as if it was lost.
    #[test]
    fn a_pod_that_left_under_a_verified_backup_is_not_lost() {
        let plan = signalled(&["shop/pg-0", "shop/pg-1"]);
        let none_covered = |_: &str| false;
        let (n, message, none_left) =
            left_unbacked(&plan, &[], none_covered).expect("both left uncovered");
        assert_eq!((n, none_left), (2, true));
        assert!(message.contains("shop/pg-0, shop/pg-1"), "{message}");
        // Both left, both covered: nothing lost, nothing to fail for.
        assert_eq!(left_unbacked(&plan, &[], |_| true), None);
        // One left covered, one still there: nothing to say.
        let pg0_covered = |p: &str| p == "shop/pg-0";
        assert_eq!(left_unbacked(&plan, &[on_node("pg-1")], pg0_covered), None);
        // One left covered, one left uncovered: the node has no protected pod left to back up.
        let (n, message, none_left) =
            left_unbacked(&plan, &[], pg0_covered).expect("pg-1 left uncovered");
        assert_eq!((n, none_left), (1, true));
        assert!(
            message.contains("shop/pg-1") && !message.contains("pg-0"),
            "{message}"
        );
    }

    #[test]
    fn a_pod_is_covered_only_when_verified_records_hold_every_claim() {
        let record = |ns: &str, pvcs: &[&str], verified: bool| BackupRecord {
            namespace: ns.into(),
            pvcs: pvcs.iter().map(|s| s.to_string()).collect(),
            verified,
            ..BackupRecord::default()
        };
        let records = [
            record("shop", &["data-pg-0"], true),
            record("shop", &["logs-pg-0"], false),
            record("other", &["logs-pg-0"], true),
        ];
        assert!(covered_by("shop", ["data-pg-0"].into_iter(), &records));
        assert!(!covered_by(
            "shop",
            ["data-pg-0", "logs-pg-0"].into_iter(),
            &records
        ));
        assert!(
            !covered_by("shop", std::iter::empty(), &records),
            "no claim, no cover"
        );
        assert!(!covered_by("other", ["data-pg-0"].into_iter(), &records));
    }

    #[test]
    fn needs_of_several_nodes_merge_per_namespace_each_claim_once() {
        let mut needs = BTreeMap::new();
        merge_need(&mut needs, need("shop", &["data-db-0"], &["db-0"]));
        merge_need(
            &mut needs,
            need("shop", &["data-db-0", "data-db-1"], &["db-1"]),
        );
        merge_need(&mut needs, need("auth", &["data-kc-0"], &["kc-0"]));
        assert_eq!(needs.len(), 2);
        assert_eq!(needs["shop"].pvcs, ["data-db-0", "data-db-1"]);
        assert_eq!(needs["shop"].pods, ["db-0", "db-1"]);
        assert_eq!(needs["shop"].stateful_sets, ["db"]);
    }

    #[test]
    fn a_reused_backup_is_a_candidate_to_check_again_and_otherwise_attempt_one() {
        let plan = PlanRef {
            name: "p",
            uid: "u-1",
        };
        let own = record_for(&need("shop", &["data-db-0"], &["db-0"]), &[], &plan);
        assert_eq!(
            (own.attempt, own.reused, own.namespace.as_str()),
            (1, false, "shop")
        );
        let verified = BackupRecord {
            name: "other-shop-1".into(),
            namespace: "shop".into(),
            verified: true,
            verified_objects: vec![crate::api::status::VerifiedObject::default()],
            uid: Some("bu".into()),
            ..BackupRecord::default()
        };
        let mut n = need("shop", &["data-db-0"], &["db-0"]);
        n.reuse = Some("other-shop-1".into());
        let reused = record_for(&n, &[verified], &plan);
        assert!(reused.reused && !reused.verified && reused.verified_objects.is_empty());
        assert_eq!(reused.uid.as_deref(), Some("bu"));
    }
}
