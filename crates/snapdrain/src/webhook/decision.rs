//! Whether an eviction may go ahead: pure, over the pod, the plans the reflector holds and a clock.
//!
//! The promise (DESIGN.md): no eviction of a protected pod before a verified backup covers every one of
//! its PVCs. A backup counts when a non-terminal DisruptionPlan records it (`status.backups[]`) as
//! verified for the pod's namespace and lists the claim, and Velero's Backup confirms that record
//! (`webhook::confirm`: the status alone is not trusted). Everything else is allowed: the gate only ever
//! holds protected pods, so a dead or confused gate never blocks what snapdrain does not protect.

use std::borrow::Borrow;
use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::api::plan::{BackupPolicy, ReleasePoint};
use crate::api::status::{BackupRecord, PlanPhase};
use crate::api::{DisruptionPlan, PlanMode};
use crate::planning::csi_release::cut_claims;
use crate::planning::inventory::pvc_claims;
use crate::planning::velero_pods::DataPathOwner;

/// What the gate answers for one eviction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow(Allowed),
    Deny(Held),
}

/// Why an eviction is allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allowed {
    /// The protection rule does not cover the pod.
    NotProtected,
    /// The pod runs on no node (Pending): there is no node to drain it from.
    NotScheduled,
    /// Verified backups (or, under a deadline, EC2 snapshots accepted by EC2) cover all its PVCs; the
    /// plans that hold them.
    Covered { plans: Vec<String> },
    /// A running plan for its node lets it go without a verified backup, as snapdrain's own drain does
    /// under that plan's `backup.policy` (the plan named).
    Waived { plan: String },
}

/// A protected pod whose PVCs are not all covered yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// `namespace/name`.
    pub pod: String,
    pub node: String,
    /// Claims no verified backup covers yet.
    pub uncovered: Vec<String>,
    /// The running plan for the node, if the reflector knows one.
    pub plan: Option<PlanProgress>,
    /// Verified backups a plan's status names that Velero's Backup does not confirm (plan, and why).
    pub refuted: Vec<(String, String)>,
}

/// Where the plan that will cover the pod stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanProgress {
    pub name: String,
    pub phase: PlanPhase,
    /// Velero Backups of the pod's namespace that the pod waits for (not verified yet).
    pub backups: Vec<String>,
    /// Seconds the plan has been in its phase, when the status says when it began.
    pub in_phase_seconds: Option<i64>,
}

fn phase_of(plan: &DisruptionPlan) -> PlanPhase {
    plan.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

/// Whether `plan` still runs: only a running plan's verified backups let a protected pod go (the
/// controller releases newcomers by the same rule, or the gate would refuse the pods it released).
pub fn running(plan: &DisruptionPlan) -> bool {
    !phase_of(plan).is_terminal() && plan.metadata.deletion_timestamp.is_none()
}

fn backups(plan: &DisruptionPlan) -> &[BackupRecord] {
    plan.status.as_ref().map_or(&[], |s| s.backups.as_slice())
}

/// Whether `plan` is about `node` (named in its spec, or resolved into its status from a selector).
fn plan_covers_node(plan: &DisruptionPlan, node: &str) -> bool {
    plan.spec.nodes.iter().any(|n| n == node)
        || plan
            .status
            .as_ref()
            .is_some_and(|s| s.nodes.iter().any(|n| n.name == node))
}

/// The running plan for `node` that lets `pod` go without a verified backup, as snapdrain itself does
/// (review #9: otherwise the gate refuses snapdrain's own evictions and those it meant to allow):
/// - an Execute plan whose `backup.policy` is `best-effort` or `skip`, once it drains: its own drain
///   evicts every pod then (`planning::drain::gate_eviction`), so another drainer going first changes
///   nothing;
/// - a Release plan under `best-effort` or `skip` that released this very pod (`status.releasedPods`,
///   same uid: a pod re-created under the name is not it), as `controller::steps::release::covered`
///   releases pods whose backup did not verify under best-effort.
///
/// Under `required` nothing is waived: only a verified backup lets a protected pod go.
fn waived_by<'a>(
    pod: &Pod,
    node: &str,
    plans: &[&'a DisruptionPlan],
) -> Option<&'a DisruptionPlan> {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let uid = pod.uid().unwrap_or_default();
    plans.iter().copied().find(|p| {
        if p.spec.backup.policy == BackupPolicy::Required
            || !running(p)
            || !plan_covers_node(p, node)
        {
            return false;
        }
        match p.spec.mode {
            PlanMode::Execute => matches!(
                phase_of(p),
                PlanPhase::Draining | PlanPhase::Terminating | PlanPhase::Replacing
            ),
            PlanMode::Release => p.status.as_ref().is_some_and(|s| {
                s.released_pods
                    .iter()
                    .any(|r| r.namespace == namespace && r.name == name && r.uid == uid)
            }),
        }
    })
}

/// True for a pod of Velero's node-agent: the DaemonSet `node-agent` whose pods carry `name: node-agent`,
/// in both `velero install` (vmware-tanzu/velero `pkg/install/daemonset.go`) and the Helm chart
/// (vmware-tanzu/helm-charts `charts/velero/templates/node-agent-daemonset.yaml`).
pub fn is_backup_agent(pod: &Pod) -> bool {
    let owned = crate::planning::inventory::controller_of(pod)
        .is_some_and(|o| o.kind == "DaemonSet" && o.name == "node-agent");
    owned && pod.labels().get("name").map(String::as_str) == Some("node-agent")
}

/// The running plan whose backups still need the node-agent pod `pod` (its node is being backed up and
/// the backups are not complete: file-system backups of the node's pods run in that agent). Cluster
/// Autoscaler evicts DaemonSet pods of a node it drains, best effort and without waiting
/// (kubernetes/autoscaler `core/scaledown/actuation/drain.go`, `--daemonset-eviction-for-occupied-nodes`),
/// and a node-agent gone mid-backup fails it; a 429 leaves the agent until the backup is done.
pub fn agent_needed_by<P: Borrow<DisruptionPlan>>(pod: &Pod, plans: &[P]) -> Option<String> {
    if !is_backup_agent(pod) {
        return None;
    }
    let node = pod.spec.as_ref()?.node_name.as_deref()?;
    plans
        .iter()
        .map(Borrow::borrow)
        .find(|p| {
            running(p)
                && plan_covers_node(p, node)
                && matches!(
                    phase_of(p),
                    PlanPhase::Pending | PlanPhase::Cordoning | PlanPhase::BackingUp
                )
        })
        .map(|p| p.name_any())
}

/// The message of a 429 for a node-agent pod a plan still needs (`plan`), or that the node's protected
/// pods will need once their plan starts (None).
pub fn agent_message(pod: &Pod, plan: Option<&str>) -> String {
    let why = match plan {
        Some(plan) => format!("DisruptionPlan {plan} is backing up that node's volumes"),
        None => "the node runs protected pods no verified backup covers yet".to_owned(),
    };
    format!(
        "snapdrain holds the eviction of Velero's node-agent pod {}/{} on node {}: {why}, and their file-system backups run in this pod (expected wait: until the backup completes)",
        pod.namespace().unwrap_or_default(),
        pod.name_any(),
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default()
    )
}

/// The running plan whose backup the Velero server pod `pod` runs: one in BackingUp whose Velero namespace
/// is the pod's. A restarted server marks every InProgress backup Failed (velero `pkg/cmd/server/
/// server.go` `markInProgressBackupsFailed`), so an eviction then costs the plan an attempt (and a
/// forceful plan its deadline). Other phases do not need the server: verification reads the bucket.
pub fn server_needed_by<P: Borrow<DisruptionPlan>>(pod: &Pod, plans: &[P]) -> Option<String> {
    let ns = pod.metadata.namespace.as_deref()?;
    plans
        .iter()
        .map(Borrow::borrow)
        .find(|p| {
            running(p)
                && phase_of(p) == PlanPhase::BackingUp
                && p.spec.backup.velero_namespace == ns
        })
        .map(|p| p.name_any())
}

/// The message of a 429 for the Velero server pod while `plan` backs up.
pub fn server_message(pod: &Pod, plan: &str) -> String {
    format!(
        "snapdrain holds the eviction of the Velero server pod {}/{}: DisruptionPlan {plan} is backing up, and a Velero restart fails every backup in progress (expected wait: until the backup completes)",
        pod.namespace().unwrap_or_default(),
        pod.name_any()
    )
}

/// The message of a 429 for a Velero data-path pod moving the data of `owner`.
pub fn data_path_message(pod: &Pod, owner: &DataPathOwner) -> String {
    format!(
        "snapdrain holds the eviction of Velero's data-path pod {}/{} on node {}: it is moving the data of {} {}, which fails if the pod goes (expected wait: until that backup's volume is uploaded; Velero deletes the pod then)",
        pod.namespace().unwrap_or_default(),
        pod.name_any(),
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default(),
        owner.kind(),
        owner.name()
    )
}

/// The message of a 429 for a pod of the Velero namespace the gate's cache has not seen yet: a
/// data-path pod is created the moment its backup needs it, and a drainer listing the node from its own
/// cache may ask for it first (no answer here may wait on the API server).
pub fn unseen_message(namespace: &str, name: &str) -> String {
    format!(
        "snapdrain holds the eviction of pod {namespace}/{name} in Velero's namespace: its eviction gate has not seen the pod yet and cannot tell whether a backup runs in it (expected wait: a second)"
    )
}

/// Whether backup record `b` is verified and holds `claim` of `namespace`: the gate's rule for a claim
/// being covered (the controller counts a pod that left covered by the same rule,
/// `controller::steps::plan::covered_by`).
pub fn holds_claim(b: &BackupRecord, namespace: &str, claim: &str) -> bool {
    b.verified && b.namespace == namespace && b.pvcs.iter().any(|c| c == claim)
}

/// Decides an eviction of `pod` given every DisruptionPlan the gate knows. A plan's verified backup
/// counts only when `confirm` agrees (Velero's Backup backs the record: `webhook::confirm`).
pub fn decide<P: Borrow<DisruptionPlan>>(
    pod: &Pod,
    protects: impl Fn(&Pod) -> bool,
    plans: &[P],
    confirm: impl Fn(&DisruptionPlan, &BackupRecord) -> Result<(), String>,
    now: jiff::Timestamp,
) -> Decision {
    if !protects(pod) {
        return Decision::Allow(Allowed::NotProtected);
    }
    let Some(node) = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
    else {
        return Decision::Allow(Allowed::NotScheduled);
    };
    let all: Vec<&DisruptionPlan> = plans.iter().map(Borrow::borrow).collect();
    if let Some(p) = waived_by(pod, &node, &all) {
        return Decision::Allow(Allowed::Waived { plan: p.name_any() });
    }
    let namespace = pod.namespace().unwrap_or_default();
    let claims: BTreeSet<&str> = pvc_claims(pod).collect();
    let mut covering = BTreeSet::new();
    let mut uncovered = Vec::new();
    let mut refuted: Vec<(String, String)> = Vec::new();
    for claim in &claims {
        let by = plans
            .iter()
            .map(Borrow::borrow)
            .filter(|p| running(p))
            .find(|p| {
                backups(p).iter().any(|b| {
                    if !holds_claim(b, &namespace, claim) {
                        return false;
                    }
                    confirmed_or_refuted(p, b, &confirm, &mut refuted)
                })
            });
        let by = by
            .or_else(|| snapshot_of(&all, &node, &namespace, claim))
            .or_else(|| csi_cut_of(&all, &node, &namespace, claim, &confirm, &mut refuted));
        match by {
            Some(p) => {
                covering.insert(p.name_any());
            }
            None => uncovered.push((*claim).to_owned()),
        }
    }
    if uncovered.is_empty() {
        return Decision::Allow(Allowed::Covered {
            plans: covering.into_iter().collect(),
        });
    }
    let plan = plans
        .iter()
        .map(Borrow::borrow)
        .find(|p| running(p) && plan_covers_node(p, &node))
        .map(|p| progress(p, &namespace, now));
    Decision::Deny(Held {
        pod: format!("{namespace}/{}", pod.name_any()),
        node,
        uncovered,
        plan,
        refuted,
    })
}

/// The running plan with a deadline for `node` whose emergency EBS snapshot set holds `claim` in a
/// snapshot EC2 accepted: the claim's data is fixed at the request (EBS user guide, "Create Amazon EBS
/// snapshots", https://docs.aws.amazon.com/ebs/latest/userguide/ebs-creating-snapshot.html: "The snapshot
/// is created immediately, but it remains in the `pending` state until all of data has been transferred
/// to Amazon S3"; it "includes only the data that was written to the volume at the time the snapshot was
/// requested"), so the pod may go before the snapshot is `completed`. Only plans with a deadline take
/// such sets (`controller::steps::emergency`).
fn snapshot_of<'a>(
    plans: &[&'a DisruptionPlan],
    node: &str,
    namespace: &str,
    claim: &str,
) -> Option<&'a DisruptionPlan> {
    let wanted = format!("{namespace}/{claim}");
    plans.iter().copied().find(|p| {
        running(p)
            && p.spec.deadline.is_some()
            && p.status.as_ref().is_some_and(|s| {
                s.emergency_snapshots.iter().any(|set| {
                    set.node == node
                        && set.error.is_none()
                        && set.saved_claims().any(|c| c == wanted)
                })
            })
    })
}

/// Whether Velero's Backup confirms `record` of `plan`; a refusal is remembered once for the 429's
/// message.
fn confirmed_or_refuted(
    plan: &DisruptionPlan,
    record: &BackupRecord,
    confirm: &impl Fn(&DisruptionPlan, &BackupRecord) -> Result<(), String>,
    refuted: &mut Vec<(String, String)>,
) -> bool {
    match confirm(plan, record) {
        Ok(()) => true,
        Err(why) => {
            let entry = (plan.name_any(), why);
            if !refuted.contains(&entry) {
                refuted.push(entry);
            }
            false
        }
    }
}

/// The running plan for `node` with `releaseNetworkVolumesAt: Snapshot` whose live attempt for
/// `namespace` (the latest, not abandoned) records `claim`'s CSI snapshot as cut
/// (`planning::csi_release`), confirmed by Velero's Backup being past the cut and not failed
/// (`webhook::confirm::snapshot_confirms`). Only network volumes are ever recorded so.
fn csi_cut_of<'a>(
    plans: &[&'a DisruptionPlan],
    node: &str,
    namespace: &str,
    claim: &str,
    confirm: &impl Fn(&DisruptionPlan, &BackupRecord) -> Result<(), String>,
    refuted: &mut Vec<(String, String)>,
) -> Option<&'a DisruptionPlan> {
    plans.iter().copied().find(|p| {
        if !(running(p)
            && p.spec.backup.release_network_volumes_at == ReleasePoint::Snapshot
            && plan_covers_node(p, node))
        {
            return false;
        }
        let all = backups(p);
        let latest = all
            .iter()
            .filter(|b| b.namespace == namespace)
            .max_by_key(|b| b.attempt);
        let Some(record) = latest.filter(|b| b.abandoned.is_none() && !b.verified) else {
            return false;
        };
        if !cut_claims(record).any(|c| c == claim) {
            return false;
        }
        confirmed_or_refuted(p, record, confirm, refuted)
    })
}

fn progress(plan: &DisruptionPlan, namespace: &str, now: jiff::Timestamp) -> PlanProgress {
    let backups = backups(plan)
        .iter()
        .filter(|b| b.namespace == namespace && !b.verified && b.abandoned.is_none())
        .map(|b| b.name.clone())
        .collect();
    let in_phase_seconds = plan
        .status
        .as_ref()
        .and_then(|s| s.phase_started_at.as_ref())
        .map(|t| (now - t.0).get_seconds().max(0));
    PlanProgress {
        name: plan.name_any(),
        phase: phase_of(plan),
        backups,
        in_phase_seconds,
    }
}

/// What the plan the gate joined or created says, for the message of a refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanNote {
    /// The reflector's view (the plan was there already).
    Known(PlanProgress),
    /// The plan (named) is being started or joined off the request path, or was moments ago.
    Starting(String),
    /// The node's last plan for this signal failed or was aborted: it waits for a person.
    Settled { plan: String, phase: PlanPhase },
    /// A dry run: nothing was created.
    WouldStart,
    /// The plan could not be started moments ago, or the start queue is full (the error is logged).
    NotStarted,
}

/// The message of a 429: which pod, which claims, which plan and backups it waits for, and how long
/// that may take. kube-apiserver prefixes it with `admission webhook "<name>" denied the request: `
/// (`apiserver/pkg/admission/plugin/webhook/errors/statuserror.go`) and kubectl drain prints it on each
/// retry, so it is what the person running the drain reads.
pub fn message(held: &Held, note: &PlanNote) -> String {
    let head = format!(
        "snapdrain holds the eviction of pod {} until a verified backup covers its PVC(s) {}",
        held.pod,
        held.uncovered.join(", ")
    );
    let tail = match note {
        PlanNote::Known(p) => {
            let waits = if p.backups.is_empty() {
                "its backup has not started yet".to_owned()
            } else {
                format!("waiting for backup {}", p.backups.join(", "))
            };
            let wait = match (p.phase, p.in_phase_seconds) {
                (PlanPhase::Verifying, Some(s)) => {
                    format!("verifying in the bucket for {s}s; expected wait: seconds")
                }
                (phase, Some(s)) => format!("phase {phase} for {s}s; expected wait: unknown"),
                (phase, None) => format!("phase {phase}; expected wait: unknown"),
            };
            format!("DisruptionPlan {} is {waits} ({wait})", p.name)
        }
        PlanNote::Starting(plan) => format!(
            "starting DisruptionPlan {plan} for node {} to back them up (expected wait: unknown)",
            held.node
        ),
        PlanNote::Settled { plan, phase } => format!(
            "DisruptionPlan {plan} for node {} is {phase}: the eviction waits until a person acts \
             (kubectl describe disruptionplan {plan})",
            held.node
        ),
        PlanNote::WouldStart => format!(
            "a DisruptionPlan would be started for node {} (dry run: nothing was created)",
            held.node
        ),
        PlanNote::NotStarted => format!(
            "no DisruptionPlan could be started for node {} (see snapdrain's log; expected wait: unknown)",
            held.node
        ),
    };
    if held.refuted.is_empty() {
        return format!("{head}; {tail}");
    }
    let refuted: Vec<String> = held
        .refuted
        .iter()
        .map(|(plan, why)| format!("DisruptionPlan {plan} records a verified backup, but {why}"))
        .collect();
    format!(
        "{head}; {}: the plan's status is not trusted without Velero's Backup (only snapdrain writes a plan's status: check who changed it); {tail}",
        refuted.join("; ")
    )
}

/// The message of a 429 while the gate's caches are still loading (`kinds`): the gate cannot tell a
/// protected pod from another yet, and it does not ask the API server inside the admission call.
pub fn loading_message(namespace: &str, name: &str, kinds: &[&str]) -> String {
    format!(
        "snapdrain holds the eviction of pod {namespace}/{name}: its eviction gate is still loading its {} cache(s) and cannot tell yet whether the pod is protected (expected wait: seconds; if this lasts, check snapdrain's log and that it may list and watch them)",
        kinds.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(node: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "node-agent-x1", "namespace": "velero", "labels": {"name": "node-agent"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "node-agent",
                                     "uid": "d1", "controller": true}]},
            "spec": {"nodeName": node, "containers": []}
        }))
        .expect("a node-agent pod")
    }

    fn plan_in(phase: PlanPhase, node: &str) -> DisruptionPlan {
        let mut p: DisruptionPlan = serde_json::from_value(serde_json::json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": format!("plan-{node}")}, "spec": {"nodes": [node]}
        }))
        .expect("a plan");
        p.status = Some(crate::api::DisruptionPlanStatus {
            phase,
            ..Default::default()
        });
        p
    }

    #[test]
    fn the_node_agent_is_held_only_while_its_node_is_being_backed_up() {
        let a = agent("n1");
        assert_eq!(
            agent_needed_by(&a, &[plan_in(PlanPhase::BackingUp, "n1")]).as_deref(),
            Some("plan-n1")
        );
        assert_eq!(
            agent_needed_by(&a, &[plan_in(PlanPhase::Verifying, "n1")]),
            None
        );
        assert_eq!(
            agent_needed_by(&a, &[plan_in(PlanPhase::BackingUp, "n2")]),
            None
        );
        assert_eq!(
            agent_needed_by(&a, &[plan_in(PlanPhase::Failed, "n1")]),
            None
        );
        let mut other = a.clone();
        other.metadata.labels = None;
        assert_eq!(
            agent_needed_by(&other, &[plan_in(PlanPhase::BackingUp, "n1")]),
            None
        );
        let m = agent_message(&a, Some("plan-n1"));
        assert!(
            m.contains("velero/node-agent-x1") && m.contains("plan-n1"),
            "{m}"
        );
    }

    fn server(ns: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "velero-5d8f-x2", "namespace": ns, "labels": {"deploy": "velero"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "velero-5d8f",
                                     "uid": "r1", "controller": true}]},
            "spec": {"nodeName": "n7", "containers": []}
        }))
        .expect("a server pod")
    }

    #[test]
    fn the_velero_server_is_held_only_while_a_plan_of_its_namespace_backs_up() {
        let s = server("velero");
        // Any node's plan: the server runs every backup.
        assert_eq!(
            server_needed_by(&s, &[plan_in(PlanPhase::BackingUp, "n1")]).as_deref(),
            Some("plan-n1")
        );
        for phase in [
            PlanPhase::Pending,
            PlanPhase::Cordoning,
            PlanPhase::Verifying,
            PlanPhase::Draining,
            PlanPhase::Completed,
            PlanPhase::Failed,
        ] {
            assert_eq!(
                server_needed_by(&s, &[plan_in(phase, "n1")]),
                None,
                "{phase}"
            );
        }
        // A plan whose Velero runs elsewhere does not need this one.
        assert_eq!(
            server_needed_by(&server("other"), &[plan_in(PlanPhase::BackingUp, "n1")]),
            None
        );
        let m = server_message(&s, "plan-n1");
        assert!(
            m.contains("velero/velero-5d8f-x2") && m.contains("plan-n1"),
            "{m}"
        );
    }

    #[test]
    fn data_path_and_unseen_messages_name_the_pod_and_what_it_waits_for() {
        let mut p = server("velero");
        p.metadata.name = Some("b-1".into());
        let m = data_path_message(&p, &DataPathOwner::PodVolumeBackup("b-1".into()));
        assert!(
            m.contains("velero/b-1")
                && m.contains("on node n7")
                && m.contains("PodVolumeBackup b-1"),
            "{m}"
        );
        let m = unseen_message("velero", "b-2");
        assert!(m.contains("velero/b-2") && m.contains("not seen"), "{m}");
    }

    use crate::planning::inventory::ProtectionRule;
    use serde_json::json;

    fn now() -> jiff::Timestamp {
        "2026-05-20T10:00:00Z".parse().expect("a valid timestamp")
    }

    fn pod(node: Option<&str>, claims: &[&str]) -> Pod {
        let volumes: Vec<_> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "pg-0", "namespace": "db", "ownerReferences": [{"apiVersion": "apps/v1",
                "kind": "StatefulSet", "name": "pg", "uid": "u", "controller": true}]},
            "spec": {"nodeName": node, "volumes": volumes, "containers": [{"name": "c"}]},
            "status": {"phase": "Running"}
        }))
        .expect("a pod from JSON")
    }

    fn plan(name: &str, phase: &str, backups: serde_json::Value) -> DisruptionPlan {
        serde_json::from_value(json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": name},
            "spec": {"nodes": ["n1"]},
            "status": {"phase": phase, "backups": backups, "phaseStartedAt": "2026-05-20T09:59:30.000000Z"}
        }))
        .expect("a plan from JSON")
    }

    fn protects(p: &Pod) -> bool {
        ProtectionRule::default().protects(p)
    }

    /// Every record is backed by Velero's Backup.
    fn confirmed(_: &DisruptionPlan, _: &BackupRecord) -> Result<(), String> {
        Ok(())
    }

    /// A BackingUp plan with `releaseNetworkVolumesAt: Snapshot` whose attempt records `cut` as cut.
    fn cut_plan(release: &str, cut: &[&str], volumes: &[(&str, &str)]) -> DisruptionPlan {
        let volumes: Vec<_> = volumes
            .iter()
            .map(|(pvc, at)| {
                let mut v = json!({"pvc": pvc, "class": "Network", "reason": "", "method": "CsiDataMover",
                                   "releaseAt": at});
                if cut.contains(pvc) {
                    v["snapshot"] = json!({"volumeSnapshot": format!("velero-{pvc}-x"),
                        "content": format!("snapcontent-{pvc}"), "handle": "snap-1", "ready": false});
                }
                v
            })
            .collect();
        let mut p = plan(
            "p1",
            "BackingUp",
            json!([{"name": "b1", "namespace": "db", "uid": "u1", "pvcs": ["data", "wal"], "pods": ["pg-0"],
                    "attempt": 1, "volumes": volumes}]),
        );
        p.spec.backup.release_network_volumes_at =
            serde_json::from_value(json!(release)).expect("a release point");
        p
    }

    #[test]
    fn a_pod_whose_every_claim_is_cut_goes_at_the_snapshot_only_when_the_plan_asks_for_it() {
        let pod = pod(Some("n1"), &["data", "wal"]);
        let both = [("data", "Snapshot"), ("wal", "Snapshot")];
        let allowed = |p: &DisruptionPlan| {
            matches!(
                decide(&pod, protects, std::slice::from_ref(p), confirmed, now()),
                Decision::Allow(Allowed::Covered { .. })
            )
        };
        assert!(allowed(&cut_plan("Snapshot", &["data", "wal"], &both)));
        assert!(
            !allowed(&cut_plan("Snapshot", &["data"], &both)),
            "wal is not cut yet"
        );
        assert!(
            !allowed(&cut_plan("Verified", &["data", "wal"], &both)),
            "the plan did not ask"
        );
        let mut other_node = cut_plan("Snapshot", &["data", "wal"], &both);
        other_node.spec.nodes = vec!["n2".into()];
        assert!(!allowed(&other_node), "another node's plan");
        let mut retried = cut_plan("Snapshot", &["data", "wal"], &both);
        let status = retried.status.as_mut().expect("a status");
        let mut next = status.backups[0].clone();
        next.attempt = 2;
        next.name = "b2".into();
        next.volumes.iter_mut().for_each(|v| v.snapshot = None);
        status.backups.push(next);
        assert!(!allowed(&retried), "only the live attempt's cuts count");
        // Velero's Backup must confirm the cut.
        let refuse = |_: &DisruptionPlan, b: &BackupRecord| -> Result<(), String> {
            Err(format!(
                "Backup velero/{} is Failed, not InProgress",
                b.name
            ))
        };
        let p = cut_plan("Snapshot", &["data", "wal"], &both);
        let Decision::Deny(held) = decide(&pod, protects, std::slice::from_ref(&p), refuse, now())
        else {
            panic!("an unconfirmed cut must not allow");
        };
        assert_eq!(held.refuted.len(), 1, "{:?}", held.refuted);
    }

    /// The gate's side of the rule per volume kind, for every mix of two claims (kind, method, cut,
    /// verified), both release points and a live or abandoned attempt. The judge reads the descriptors:
    /// the pod may go when each claim is verified, or is a network volume snapshotted through CSI and
    /// cut in the live attempt of a plan that asked for the release at the snapshot.
    #[test]
    fn the_gate_lets_a_pod_go_at_a_snapshot_only_by_the_rule_per_volume_kind() {
        let kinds = [
            ("Network", "CsiDataMover"),
            ("Network", "CsiSnapshot"),
            ("Network", "FileSystem"),
            ("NodeLocal", "FileSystem"),
            ("NodeLocal", "CsiSnapshot"),
            ("Unknown", "CsiDataMover"),
        ];
        let mut states = Vec::new();
        for (class, method) in kinds {
            for cut in [false, true] {
                for verified in [false, true] {
                    states.push((class, method, cut, verified));
                }
            }
        }
        let pod = pod(Some("n1"), &["x", "y"]);
        for a in &states {
            for b in &states {
                for asked in ["Verified", "Snapshot"] {
                    for live in [true, false] {
                        let claims = [("x", *a), ("y", *b)];
                        let at_cut = |(class, method, cut, _): (&str, &str, bool, bool)| {
                            asked == "Snapshot"
                                && live
                                && class == "Network"
                                && method != "FileSystem"
                                && cut
                        };
                        let want = claims.iter().all(|(_, c)| c.3 || at_cut(*c));
                        let volumes: Vec<_> = claims
                            .iter()
                            .map(|(pvc, (class, method, cut, _))| {
                                let network_csi = *class == "Network" && *method != "FileSystem";
                                let at = if asked == "Snapshot" && network_csi { "Snapshot" } else { "Verified" };
                                let mut v = json!({"pvc": pvc, "class": class, "reason": "", "method": method,
                                                   "releaseAt": at});
                                if *cut && at == "Snapshot" {
                                    v["snapshot"] = json!({"volumeSnapshot": "vs", "content": "vsc",
                                                           "handle": "snap-1", "ready": false});
                                }
                                v
                            })
                            .collect();
                        let verified: Vec<&str> = claims
                            .iter()
                            .filter(|(_, c)| c.3)
                            .map(|(p, _)| *p)
                            .collect();
                        let mut p = plan(
                            "p1",
                            "BackingUp",
                            json!([
                                {"name": "b1", "namespace": "db", "pvcs": verified, "attempt": 1, "verified": true},
                                {"name": "b2", "namespace": "db", "pvcs": ["x", "y"], "pods": ["pg-0"], "attempt": 2,
                                 "volumes": volumes, "abandoned": if live { json!(null) } else { json!("DeletePending") }}
                            ]),
                        );
                        p.spec.backup.release_network_volumes_at =
                            serde_json::from_value(json!(asked)).expect("a release point");
                        let got = matches!(
                            decide(&pod, protects, std::slice::from_ref(&p), confirmed, now()),
                            Decision::Allow(_)
                        );
                        assert_eq!(got, want, "asked {asked}, live {live}: {claims:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_verified_backup_velero_does_not_confirm_holds_the_pod_and_says_why() {
        let verified = plan(
            "p1",
            "Draining",
            json!([{"name": "b1", "namespace": "db", "pvcs": ["data"], "verified": true}]),
        );
        let refuse = |_: &DisruptionPlan, b: &BackupRecord| -> Result<(), String> {
            Err(format!("Backup velero/{} is Failed, not Completed", b.name))
        };
        let Decision::Deny(held) = decide(
            &pod(Some("n1"), &["data"]),
            protects,
            std::slice::from_ref(&verified),
            refuse,
            now(),
        ) else {
            panic!("an unconfirmed verified backup must not allow");
        };
        assert_eq!(
            held.refuted,
            [(
                "p1".to_string(),
                "Backup velero/b1 is Failed, not Completed".to_string()
            )]
        );
        let progress = held.plan.clone().expect("the node's running plan");
        let m = message(&held, &PlanNote::Known(progress));
        assert!(
            m.contains(
                "DisruptionPlan p1 records a verified backup, but Backup velero/b1 is Failed"
            ) && m.contains("not trusted"),
            "{m}"
        );
    }

    #[test]
    fn unprotected_and_unscheduled_pods_are_allowed() {
        let none: [DisruptionPlan; 0] = [];
        assert_eq!(
            decide(&pod(Some("n1"), &[]), protects, &none, confirmed, now()),
            Decision::Allow(Allowed::NotProtected)
        );
        assert_eq!(
            decide(&pod(None, &["data"]), protects, &none, confirmed, now()),
            Decision::Allow(Allowed::NotScheduled)
        );
        // The predicate is a parameter: a policy with other rules decides what is protected.
        assert_eq!(
            decide(
                &pod(Some("n1"), &["data"]),
                |_| false,
                &none,
                confirmed,
                now()
            ),
            Decision::Allow(Allowed::NotProtected)
        );
    }

    #[test]
    fn a_protected_pod_without_a_plan_is_held() {
        let none: [DisruptionPlan; 0] = [];
        let Decision::Deny(held) = decide(
            &pod(Some("n1"), &["data"]),
            protects,
            &none,
            confirmed,
            now(),
        ) else {
            panic!("a protected pod without any backup is held");
        };
        assert_eq!(held.pod, "db/pg-0");
        assert_eq!(held.node, "n1");
        assert_eq!(held.uncovered, ["data"]);
        assert_eq!(held.plan, None);
    }

    #[test]
    fn a_verified_backup_of_a_running_plan_covering_every_claim_allows() {
        let verified = plan(
            "p1",
            "Draining",
            json!([{"name": "b1", "namespace": "db", "pvcs": ["data", "wal"], "verified": true}]),
        );
        assert_eq!(
            decide(
                &pod(Some("n1"), &["data", "wal"]),
                protects,
                &[verified],
                confirmed,
                now()
            ),
            Decision::Allow(Allowed::Covered {
                plans: vec!["p1".into()]
            })
        );
    }

    #[test]
    fn partial_unverified_other_namespace_and_terminal_plans_do_not_count() {
        let cases = [
            // One claim of two.
            plan(
                "p",
                "Draining",
                json!([{"name": "b", "namespace": "db", "pvcs": ["data"], "verified": true}]),
            ),
            // Not verified yet.
            plan(
                "p",
                "Verifying",
                json!([{"name": "b", "namespace": "db", "pvcs": ["data", "wal"], "verified": false}]),
            ),
            // Another namespace's claim of the same name.
            plan(
                "p",
                "Draining",
                json!([{"name": "b", "namespace": "other", "pvcs": ["data", "wal"], "verified": true}]),
            ),
            // A finished plan: its release window is over.
            plan(
                "p",
                "Completed",
                json!([{"name": "b", "namespace": "db", "pvcs": ["data", "wal"], "verified": true}]),
            ),
        ];
        for p in cases {
            let d = decide(
                &pod(Some("n1"), &["data", "wal"]),
                protects,
                std::slice::from_ref(&p),
                confirmed,
                now(),
            );
            assert!(
                matches!(d, Decision::Deny(_)),
                "{p:?} must not allow: {d:?}"
            );
        }
    }

    fn plan_with(
        mode: &str,
        policy: &str,
        phase: &str,
        status: serde_json::Value,
    ) -> DisruptionPlan {
        let mut status = status;
        status["phase"] = json!(phase);
        serde_json::from_value(json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": "p"},
            "spec": {"nodes": ["n1"], "mode": mode, "backup": {"policy": policy}},
            "status": status
        }))
        .expect("a plan from JSON")
    }

    #[test]
    fn snapdrains_own_drain_without_a_required_backup_is_not_refused() {
        let mut p = pod(Some("n1"), &["data"]);
        p.metadata.uid = Some("u-pg-0".into());
        let decide_with = |plan: DisruptionPlan| decide(&p, protects, &[plan], confirmed, now());
        let waived = Decision::Allow(Allowed::Waived { plan: "p".into() });
        // An Execute plan under skip or best-effort evicts every pod itself once it drains.
        for policy in ["skip", "best-effort"] {
            assert_eq!(
                decide_with(plan_with("Execute", policy, "Draining", json!({}))),
                waived
            );
            // Not before: until it drains, the plan may still be backing the pod up.
            assert!(matches!(
                decide_with(plan_with("Execute", policy, "BackingUp", json!({}))),
                Decision::Deny(_)
            ));
        }
        // Under required, only a verified backup counts, whatever the phase.
        assert!(matches!(
            decide_with(plan_with("Execute", "required", "Draining", json!({}))),
            Decision::Deny(_)
        ));
        // A best-effort Release plan lets go exactly the pods it released (same uid).
        let released =
            |uid: &str| json!({"releasedPods": [{"namespace": "db", "name": "pg-0", "uid": uid}]});
        assert_eq!(
            decide_with(plan_with(
                "Release",
                "best-effort",
                "Draining",
                released("u-pg-0")
            )),
            waived
        );
        assert!(matches!(
            decide_with(plan_with(
                "Release",
                "best-effort",
                "Draining",
                released("other")
            )),
            Decision::Deny(_)
        ));
        assert!(matches!(
            decide_with(plan_with(
                "Release",
                "required",
                "Draining",
                released("u-pg-0")
            )),
            Decision::Deny(_)
        ));
        // A finished plan waives nothing.
        assert!(matches!(
            decide_with(plan_with("Execute", "skip", "Completed", json!({}))),
            Decision::Deny(_)
        ));
    }

    #[test]
    fn the_message_names_plan_backup_and_wait() {
        let p = plan(
            "gate-n1",
            "BackingUp",
            json!([{"name": "gate-n1-db-1", "namespace": "db", "pvcs": ["data"], "verified": false}]),
        );
        let Decision::Deny(held) = decide(
            &pod(Some("n1"), &["data"]),
            protects,
            &[p],
            confirmed,
            now(),
        ) else {
            panic!("an unverified backup holds the pod");
        };
        let progress = held.plan.clone().expect("the node's running plan is known");
        assert_eq!(progress.backups, ["gate-n1-db-1"]);
        assert_eq!(progress.in_phase_seconds, Some(30));
        assert_eq!(
            message(&held, &PlanNote::Known(progress)),
            "snapdrain holds the eviction of pod db/pg-0 until a verified backup covers its PVC(s) data; \
             DisruptionPlan gate-n1 is waiting for backup gate-n1-db-1 (phase BackingUp for 30s; \
             expected wait: unknown)"
        );
        let started = message(&held, &PlanNote::Starting("gate-n1".into()));
        assert!(
            started.contains("starting DisruptionPlan gate-n1 for node n1"),
            "{started}"
        );
        assert!(message(&held, &PlanNote::WouldStart).contains("dry run"));
    }

    /// The 429 goes to whoever asked for the eviction, who may see only their own namespace (review
    /// H-2 c): it names their pod, its claims, its node and the plan, and of the plan's backups only
    /// those of the pod's namespace, never another tenant's Backups or claims.
    #[test]
    fn the_message_names_nothing_of_other_namespaces() {
        let p = plan(
            "gate-n1",
            "BackingUp",
            json!([
                {"name": "gate-n1-db-1", "namespace": "db", "pvcs": ["data"], "verified": false},
                {"name": "gate-n1-payroll-1", "namespace": "payroll", "pvcs": ["ledger-0"], "verified": false}
            ]),
        );
        let Decision::Deny(held) = decide(
            &pod(Some("n1"), &["data"]),
            protects,
            &[p],
            confirmed,
            now(),
        ) else {
            panic!("an unverified backup holds the pod");
        };
        let progress = held.plan.clone().expect("the node's running plan is known");
        for note in [
            PlanNote::Known(progress),
            PlanNote::Starting("gate-n1".into()),
            PlanNote::Settled {
                plan: "gate-n1".into(),
                phase: PlanPhase::Failed,
            },
            PlanNote::WouldStart,
            PlanNote::NotStarted,
        ] {
            let text = message(&held, &note);
            assert!(
                !text.contains("payroll") && !text.contains("ledger"),
                "{note:?}: {text}"
            );
        }
    }
}
