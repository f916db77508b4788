//! The judge of a chaos run (pure): from what the simulator recorded and holds at the end, never from
//! snapdrain's own decisions. It states each rule itself:
//!
//! - safety: the oracle ([`crate::safety`]) over every pod that left through the API, against the
//!   verified backups of every plan (a plan may reuse another's fresh verified backup) and, for EBS
//!   claims, the snapshots the simulated EC2 itself holds tagged with a plan's uid (a forceful plan
//!   releases at its emergency snapshot);
//! - no protected pod lost with its node: one that left with no eviction or DELETE (the pod garbage
//!   collector's removal once its Node was gone) needs, for each of its claims, a Velero Backup taken
//!   after it last started there and completed before the node went, or a plan's snapshot of the claim's
//!   EBS volume cut in that span ([`lost_with_node`]);
//! - every plan terminal (Completed, Failed or Aborted);
//! - no duplicate backup: at most one Velero Backup per plan, namespace and attempt (the labels the
//!   Backup carries);
//! - no duplicate instance: at most one instance launched per plan and replaced node (its tags);
//! - holds consistent: every protected pod on a live node carries `karpenter.sh/do-not-disrupt: "true"`
//!   and so does its node (none lost: all plans are over, none has them released), and no hold that
//!   `snapdrain.io/held` marks as snapdrain's sits on a pod nothing protects or on a node without a
//!   protected pod (none orphaned).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use snapdrain_sim::apiserver::audit::AuditEntry;

use crate::safety;

const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
const HELD_MARK: &str = "snapdrain.io/held";
const RELEASED_BY: &str = "snapdrain.io/released-by";
const PLAN_NAME: &str = "snapdrain.io/plan-name";
const ATTEMPT: &str = "snapdrain.io/attempt";
const BACKUP_NAMESPACE: &str = "snapdrain.io/namespace";
const TERMINAL: &[&str] = &["Completed", "Failed", "Aborted"];

/// An instance as EC2 knows it: its id and tags.
#[derive(Clone, Debug)]
pub struct Launched {
    pub id: String,
    pub tags: BTreeMap<String, String>,
}

impl Launched {
    /// Every instance the simulated EC2 of `cluster` ever launched (none when it runs no EC2).
    pub fn all_of(cluster: &snapdrain_sim::SimCluster) -> Vec<Launched> {
        cluster
            .ec2
            .as_ref()
            .map(|e| e.instances())
            .unwrap_or_default()
            .into_iter()
            .map(|i| Launched {
                id: i.info.id,
                tags: i.info.tags,
            })
            .collect()
    }
}

/// What a run left behind.
pub struct Evidence<'a> {
    pub audit: &'a [AuditEntry],
    /// Protected pods (`ns/name` → claims), by the oracle's rule, taken before any disruption.
    pub protected: &'a BTreeMap<String, BTreeSet<String>>,
    pub plans: &'a [Value],
    pub backups: &'a [Value],
    pub instances: &'a [Launched],
    /// The pods and nodes at the end.
    pub pods: &'a [Value],
    pub nodes: &'a [Value],
    /// The PersistentVolumes at the end: each EBS claim's volume id.
    pub pvs: &'a [Value],
    /// Every snapshot the simulated EC2 holds (its own state, [`safety::Ec2Snapshot::all_of`]).
    pub snapshots: &'a [safety::Ec2Snapshot],
    /// Every CSI snapshot the simulated CSI driver cut ([`safety::csi_cuts_of`]).
    pub csi_cuts: &'a [safety::CsiCutEvidence],
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verdict {
    pub violations: Vec<String>,
    pub plans: usize,
    pub terminal: usize,
    pub completed: usize,
    /// `name (phase)` of plans that are not terminal.
    pub not_terminal: Vec<String>,
    pub duplicate_backups: Vec<String>,
    pub duplicate_instances: Vec<String>,
    pub holds_lost: Vec<String>,
    pub holds_orphaned: Vec<String>,
    /// Protected pods evicted without a verified backup from a node a disruptor was taking forcefully
    /// after the signal's plan had failed or been aborted: the one exception the promise makes
    /// (README, "let go"), judged by [`let_go_excuse`].
    pub let_go: Vec<String>,
    /// Of the violations, the protected pods lost with their node ([`lost_with_node`]).
    pub lost_with_node: usize,
}

impl Verdict {
    /// The figures a chaos run must have: no violation, every plan terminal, no duplicate.
    pub fn clean(&self) -> bool {
        self.violations.is_empty()
            && self.not_terminal.is_empty()
            && self.duplicate_backups.is_empty()
            && self.duplicate_instances.is_empty()
    }

    /// Whether the holds are where they belong (judged once every plan is over).
    pub fn holds_consistent(&self) -> bool {
        self.holds_lost.is_empty() && self.holds_orphaned.is_empty()
    }

    pub fn terminal_percent(&self) -> f64 {
        if self.plans == 0 {
            100.0
        } else {
            self.terminal as f64 * 100.0 / self.plans as f64
        }
    }
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn annotation<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

fn label<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.pointer("/metadata/labels")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

fn name(v: &Value) -> &str {
    str_at(v, "/metadata/name").unwrap_or_default()
}

fn phase(plan: &Value) -> &str {
    str_at(plan, "/status/phase").unwrap_or("Pending")
}

pub fn judge(e: &Evidence<'_>) -> Verdict {
    let mut v = Verdict {
        plans: e.plans.len(),
        ..Verdict::default()
    };
    // Safety, against every plan's verified backups and the EC2 snapshots tagged with a plan's uid.
    let backups: Vec<safety::RecordedBackup> =
        e.plans.iter().flat_map(safety::recorded_backups).collect();
    let ebs = safety::EbsEvidence {
        claim_volumes: safety::ebs_claim_volumes(e.pvs),
        snapshots: e.snapshots.to_vec(),
        plan_uids: e
            .plans
            .iter()
            .filter_map(|p| str_at(p, "/metadata/uid"))
            .map(str::to_owned)
            .collect(),
        csi_cuts: e.csi_cuts.to_vec(),
        snapshot_release_uids: e
            .plans
            .iter()
            .filter_map(safety::snapshot_release_uid)
            .collect(),
        pod_starts: safety::pod_starts(e.audit),
    };
    for violation in safety::eviction_violations_with_snapshots(
        &safety::pods_removed(e.audit),
        e.protected,
        &backups,
        &ebs,
    ) {
        match let_go_excuse(&violation, e.audit, e.plans) {
            Some(excuse) => v.let_go.push(format!("{violation} ({excuse})")),
            None => v.violations.push(violation.to_string()),
        }
    }
    for lost in lost_with_node(e.audit, e.protected, &ebs) {
        match let_go_on(&lost.node, lost.node_went, e.plans) {
            Some(excuse) => v.let_go.push(format!("{lost} ({excuse})")),
            None => {
                v.lost_with_node += 1;
                v.violations.push(lost.to_string());
            }
        }
    }
    // Terminal plans.
    for p in e.plans {
        let ph = phase(p);
        if TERMINAL.contains(&ph) {
            v.terminal += 1;
            v.completed += usize::from(ph == "Completed");
        } else {
            v.not_terminal.push(format!("{} ({ph})", name(p)));
        }
    }
    v.duplicate_backups = duplicate_backups(e.backups);
    v.duplicate_instances = duplicate_instances(e.instances);
    let (lost, orphaned) = holds(e.pods, e.nodes, e.plans);
    v.holds_lost = lost;
    v.holds_orphaned = orphaned;
    v
}

/// The annotation in which a signal plan records every signal it took (`[{"source", "reason"}]`).
const SIGNALS: &str = "snapdrain.io/signals";

/// Signals after which the node goes whatever snapdrain does (the README's forceful list).
const FORCEFUL: &[(&str, &str)] = &[
    ("karpenter", "NodeClaimDeleted"),
    ("node-termination-handler", "SpotInterruption"),
    (
        "node-termination-handler",
        "AutoScalingLifecycleTermination",
    ),
    ("node-termination-handler", "ScheduledMaintenance"),
];

/// Why an eviction before a verified backup is the documented let-go, or None when it is a violation:
/// the simulator recorded the pod's eviction from node N at that time, and a plan for N made for a
/// forceful signal had ended Failed or Aborted (its `Done` condition) before it.
fn let_go_excuse(
    violation: &safety::Violation,
    audit: &[AuditEntry],
    plans: &[Value],
) -> Option<String> {
    let (pod, evicted_at) = match violation {
        safety::Violation::NotCovered {
            pod, evicted_at, ..
        }
        | safety::Violation::EvictedBeforeVerified {
            pod, evicted_at, ..
        } => (pod, evicted_at),
        safety::Violation::UnreadableTime { .. } => return None,
    };
    let at: jiff::Timestamp = evicted_at.parse().ok()?;
    let (ns, name) = pod.split_once('/')?;
    // The server's own record of the eviction, just before its answer (whose time the violation has).
    let node = audit
        .iter()
        .rev()
        .find(|a| {
            a.source == "world"
                && a.verb == "evicted"
                && a.namespace.as_deref() == Some(ns)
                && a.name.as_deref() == Some(name)
                && a.time <= *evicted_at
        })?
        .detail["node"]
        .as_str()?;
    let_go_on(node, at, plans)
}

/// The let-go rule for a pod that left `node` at `at`: a plan for `node` made for a forceful signal
/// had ended Failed or Aborted (its `Done` condition) by then.
fn let_go_on(node: &str, at: jiff::Timestamp, plans: &[Value]) -> Option<String> {
    plans.iter().find_map(|p| {
        let on_node = p["spec"]["nodes"]
            .as_array()?
            .iter()
            .any(|n| n.as_str() == Some(node));
        // The signal it was made for, or one it took on later: a plan made for Karpenter's
        // `karpenter.sh/disrupted` taint that then records the NodeClaim's deletion (the taint's watch
        // event can come first) is that deletion's plan too.
        let recorded: Vec<Value> = p["metadata"]["annotations"][SIGNALS]
            .as_str()
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default();
        let forceful = FORCEFUL.iter().any(|(source, reason)| {
            (str_at(p, "/spec/source") == Some(source) && str_at(p, "/spec/reason") == Some(reason))
                || recorded
                    .iter()
                    .any(|r| r["source"] == *source && r["reason"] == *reason)
        });
        let ended = matches!(phase(p), "Failed" | "Aborted");
        let done_at: jiff::Timestamp = p["status"]["conditions"]
            .as_array()?
            .iter()
            // Done is False (reason Failed or Aborted) for a plan that ended without completing.
            .find(|c| c["type"] == "Done")?
            .get("lastTransitionTime")?
            .as_str()?
            .parse()
            .ok()?;
        (on_node && forceful && ended && done_at <= at).then(|| {
            format!(
                "let go: plan {} for node {node} ended {} at {done_at}",
                self::name(p),
                phase(p)
            )
        })
    })
}

/// A protected pod that went with its node: removed with no eviction or DELETE through the API (the
/// pod garbage collector's, once its Node was gone) and no Velero Backup of all its claims taken while
/// it ran there.
#[derive(Clone, Debug, PartialEq)]
pub struct LostWithNode {
    /// `ns/name`.
    pub pod: String,
    pub node: String,
    /// When it last started on `node` (the kubelet's record).
    pub started: jiff::Timestamp,
    /// The first record of the node going after that: its instance reclaimed or terminated, its Node
    /// removed.
    pub node_went: jiff::Timestamp,
    pub removed: jiff::Timestamp,
    /// The claims no such backup covers.
    pub uncovered: Vec<String>,
}

impl std::fmt::Display for LostWithNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "protected pod {} lost with its node {}: started there at {}, the node went at {}, the pod removed at {} with no eviction, and no Velero Backup taken since it started and completed before the node went covers its PVC(s) {}",
            self.pod,
            self.node,
            self.started,
            self.node_went,
            self.removed,
            self.uncovered.join(", ")
        )
    }
}

/// A Velero Backup as the simulated Velero recorded it in the audit log: when it went InProgress and
/// Completed, and the claims (`ns/name`) it covered. The audit's millisecond times, not the Backup's
/// `completionTimestamp` (whole seconds), so that its order against a pod's start is not rounded away.
struct VeleroBackup {
    started: Option<jiff::Timestamp>,
    completed: Option<jiff::Timestamp>,
    pvcs: BTreeSet<String>,
}

fn velero_backups(audit: &[AuditEntry]) -> BTreeMap<(String, String), VeleroBackup> {
    let mut out: BTreeMap<(String, String), VeleroBackup> = BTreeMap::new();
    for a in audit
        .iter()
        .filter(|a| a.source == "world" && a.verb == "phase" && a.resource == "backups.velero.io")
    {
        let key = (
            a.namespace.clone().unwrap_or_default(),
            a.name.clone().unwrap_or_default(),
        );
        let b = out.entry(key).or_insert(VeleroBackup {
            started: None,
            completed: None,
            pvcs: BTreeSet::new(),
        });
        let at = a.time.parse().ok();
        match a.detail["phase"].as_str() {
            Some("InProgress") if b.started.is_none() => b.started = at,
            Some("Completed") => b.completed = at,
            _ => {}
        }
        // A finalizer after a Velero restart records the final phase without the claims.
        b.pvcs.extend(
            a.detail["pvcs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string),
        );
    }
    out
}

/// Verbs of the world's records that a node went, with where the node's name is.
const NODE_GONE: &[(&str, bool)] = &[
    // EC2's spot reclaim (detail.node; not when the terminate call failed, see below).
    ("spot-instance-reclaimed", true),
    // Karpenter terminated the NodeClaim's instance (detail.node).
    ("nodeclaim-terminated", true),
    // Cluster Autoscaler terminated the node's instance (name).
    ("scale-down-deleted", false),
    // EC2 terminated the instance (name).
    ("node-removed", false),
    // The Node left the store (name).
    ("removed", false),
];

/// Protected pods (by the judge's rule: `protected`, as for evictions) that the simulator removed with
/// their node and no backup: the kubelet's record of the pod's removal names its node and says it was
/// Failed (the pod garbage collector's mark); the node went (a [`NODE_GONE`] record since the pod last
/// started there); no eviction or DELETE of the pod was accepted since it started (that removal is the
/// eviction rule's to judge); and some claim has no Velero Backup that went InProgress after the pod
/// started and Completed before the node went (one begun before the pod started copied an older
/// state), nor a snapshot of its EBS volume cut for a plan in that span ([`safety::EbsEvidence::saved_between`]:
/// the storage's own record, as the eviction rule takes it). A pod that never started there is not
/// judged: nothing of it ran on that node. A pod with no record at all before its removal was there,
/// Running, when the log began (a materialized scenario writes its pods so): it counts as started then.
pub fn lost_with_node(
    audit: &[AuditEntry],
    protected: &BTreeMap<String, BTreeSet<String>>,
    ebs: &safety::EbsEvidence,
) -> Vec<LostWithNode> {
    let time = |a: &AuditEntry| a.time.parse::<jiff::Timestamp>().ok();
    let removed_through_api = safety::pods_removed(audit);
    let backups = velero_backups(audit);
    let mut out = Vec::new();
    for (i, del) in audit.iter().enumerate() {
        if !(del.source == "world" && del.verb == "deleted" && del.resource == "pods") {
            continue;
        }
        let (ns, name) = (
            del.namespace.as_deref().unwrap_or_default(),
            del.name.as_deref().unwrap_or_default(),
        );
        let pod = format!("{ns}/{name}");
        let Some(claims) = protected.get(&pod) else {
            continue;
        };
        let (Some(uid), Some(node), Some(removed)) = (
            del.detail["uid"].as_str(),
            del.detail["node"].as_str(),
            time(del),
        ) else {
            continue;
        };
        let of_this_pod = |a: &&AuditEntry| {
            a.source == "world" && a.resource == "pods" && a.detail["uid"].as_str() == Some(uid)
        };
        let last_start = audit[..i]
            .iter()
            .rev()
            .filter(of_this_pod)
            .find(|a| a.verb == "started");
        let started = match last_start {
            Some(a) => time(a),
            // No record of this pod before its removal: a materialized scenario wrote it Running
            // into the store before the log began (snapdrain-sim `scenario/materialize.rs`), so it
            // ran there from the log's start. A pod created during the run has its creation on record.
            None if !audit[..i].iter().any(|a| of_this_pod(&a)) => audit.first().and_then(time),
            None => None,
        };
        let Some(started) = started else {
            continue;
        };
        let through_api = removed_through_api.iter().any(|r| {
            r.pod == pod
                && r.time
                    .parse::<jiff::Timestamp>()
                    .is_ok_and(|t| started <= t && t <= removed)
        });
        if through_api {
            continue;
        }
        // The pod garbage collector marks a gone Node's pods Failed before it removes them.
        if del.detail["phase"].as_str() != Some("Failed") {
            continue;
        }
        // The whole log: the kubelet may remove the pod a moment before the record of its Node's
        // removal is written.
        let Some(node_went) = audit
            .iter()
            .filter(|a| a.source == "world")
            .filter(|a| {
                NODE_GONE.iter().any(|(verb, in_detail)| {
                    a.verb == *verb
                        && a.detail.get("error").is_none()
                        && if *in_detail {
                            a.detail["node"].as_str() == Some(node)
                        } else {
                            a.resource == "nodes" && a.name.as_deref() == Some(node)
                        }
                })
            })
            .filter_map(time)
            .find(|t| *t >= started)
        else {
            continue;
        };
        let uncovered: Vec<String> = claims
            .iter()
            .filter(|claim| {
                let key = format!("{ns}/{claim}");
                let backed_up = backups.values().any(|b| {
                    b.pvcs.contains(&key)
                        && b.started.is_some_and(|t| t >= started)
                        && b.completed.is_some_and(|t| t <= node_went)
                });
                !(backed_up || ebs.saved_between(&key, Some(started), node_went))
            })
            .cloned()
            .collect();
        if !uncovered.is_empty() {
            out.push(LostWithNode {
                pod,
                node: node.to_string(),
                started,
                node_went,
                removed,
                uncovered,
            });
        }
    }
    out
}

/// Two Backups for one plan attempt in one namespace.
fn duplicate_backups(backups: &[Value]) -> Vec<String> {
    let mut by_attempt: BTreeMap<(String, String, String), Vec<&str>> = BTreeMap::new();
    for b in backups {
        let Some(plan) = annotation(b, PLAN_NAME) else {
            continue;
        };
        let key = (
            plan.to_string(),
            label(b, BACKUP_NAMESPACE).unwrap_or_default().to_string(),
            label(b, ATTEMPT).unwrap_or_default().to_string(),
        );
        by_attempt.entry(key).or_default().push(name(b));
    }
    by_attempt
        .into_iter()
        .filter(|(_, names)| names.len() > 1)
        .map(|((plan, ns, attempt), names)| {
            format!(
                "plan {plan} namespace {ns} attempt {attempt}: {} Backups ({})",
                names.len(),
                names.join(", ")
            )
        })
        .collect()
}

/// More than one instance launched for one plan's replacement of one node.
fn duplicate_instances(instances: &[Launched]) -> Vec<String> {
    let mut by_node: BTreeMap<(String, String), Vec<&str>> = BTreeMap::new();
    for i in instances {
        if let Some(plan) = i.tags.get("snapdrain.io/plan") {
            let node = i
                .tags
                .get("snapdrain.io/replaces")
                .cloned()
                .unwrap_or_default();
            by_node.entry((plan.clone(), node)).or_default().push(&i.id);
        }
    }
    by_node
        .into_iter()
        .filter(|(_, ids)| ids.len() > 1)
        .map(|((plan, node), ids)| {
            format!(
                "plan {plan} launched {} instances to replace {node}: {}",
                ids.len(),
                ids.join(", ")
            )
        })
        .collect()
}

/// (lost, orphaned) holds on pods and nodes.
fn holds(pods: &[Value], nodes: &[Value], plans: &[Value]) -> (Vec<String>, Vec<String>) {
    let live_nodes: BTreeSet<&str> = nodes
        .iter()
        .filter(|n| n.pointer("/metadata/deletionTimestamp").is_none())
        .map(name)
        .collect();
    let running_plans: BTreeSet<&str> = plans
        .iter()
        .filter(|p| !TERMINAL.contains(&phase(p)))
        .map(name)
        .collect();
    let mut lost = Vec::new();
    let mut orphaned = Vec::new();
    let mut nodes_needing: BTreeSet<&str> = BTreeSet::new();
    for p in pods {
        let id = format!(
            "pod {}/{}",
            str_at(p, "/metadata/namespace").unwrap_or_default(),
            name(p)
        );
        let protected = !safety::protected_pods(std::slice::from_ref(p)).is_empty();
        let node = str_at(p, "/spec/nodeName").unwrap_or_default();
        let alive = p.pointer("/metadata/deletionTimestamp").is_none()
            && live_nodes.contains(node)
            && !matches!(
                str_at(p, "/status/phase"),
                Some("Succeeded") | Some("Failed")
            );
        let held = annotation(p, DO_NOT_DISRUPT) == Some("true");
        let released = annotation(p, RELEASED_BY).is_some_and(|plan| running_plans.contains(plan));
        if protected && alive && !released {
            nodes_needing.insert(node);
            if !held {
                lost.push(format!("{id} on {node} has no do-not-disrupt hold"));
            }
        }
        if !protected && annotation(p, HELD_MARK).is_some_and(|m| !m.is_empty()) {
            orphaned.push(format!(
                "{id} carries snapdrain's hold but nothing protects it"
            ));
        }
    }
    for n in nodes
        .iter()
        .filter(|n| n.pointer("/metadata/deletionTimestamp").is_none())
    {
        let node = name(n);
        let held = annotation(n, DO_NOT_DISRUPT) == Some("true");
        let ours = annotation(n, HELD_MARK).is_some_and(|m| !m.is_empty());
        if nodes_needing.contains(node) && !held {
            lost.push(format!(
                "node {node} runs held protected pods but has no do-not-disrupt hold"
            ));
        }
        if ours && !nodes_needing.contains(node) {
            orphaned.push(format!(
                "node {node} carries snapdrain's hold but runs no protected pod"
            ));
        }
    }
    (lost, orphaned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: &str, annotations: Value, protected: bool) -> Value {
        let mut p = json!({"metadata": {"name": name, "namespace": "db", "annotations": annotations},
            "spec": {"nodeName": node}, "status": {"phase": "Running"}});
        if protected {
            p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet",
                "name": "pg", "uid": "u", "controller": true}]);
            p["spec"]["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": format!("data-{name}")}}]);
        }
        p
    }

    fn node(name: &str, annotations: Value) -> Value {
        json!({"metadata": {"name": name, "annotations": annotations}})
    }

    fn plan(name: &str, phase: &str) -> Value {
        json!({"metadata": {"name": name}, "status": {"phase": phase}})
    }

    fn evidence<'a>(
        plans: &'a [Value],
        pods: &'a [Value],
        nodes: &'a [Value],
        backups: &'a [Value],
        instances: &'a [Launched],
        audit: &'a [AuditEntry],
        protected: &'a BTreeMap<String, BTreeSet<String>>,
    ) -> Evidence<'a> {
        Evidence {
            audit,
            protected,
            plans,
            backups,
            instances,
            pods,
            nodes,
            pvs: &[],
            snapshots: &[],
            csi_cuts: &[],
        }
    }

    const HELD: &str = "do-not-disrupt,safe-to-evict";

    #[test]
    fn a_quiet_end_is_clean() {
        let pods = [pod(
            "pg-0",
            "n1",
            json!({DO_NOT_DISRUPT: "true", HELD_MARK: HELD}),
            true,
        )];
        let nodes = [node(
            "n1",
            json!({DO_NOT_DISRUPT: "true", HELD_MARK: "do-not-disrupt"}),
        )];
        let plans = [plan("a", "Completed"), plan("b", "Failed")];
        let protected = BTreeMap::new();
        let v = judge(&evidence(&plans, &pods, &nodes, &[], &[], &[], &protected));
        assert!(v.clean() && v.holds_consistent(), "{v:?}");
        assert_eq!((v.plans, v.terminal, v.completed), (2, 2, 1));
        assert_eq!(v.terminal_percent(), 100.0);
    }

    #[test]
    fn a_running_plan_and_lost_or_orphaned_holds_are_reported() {
        let pods = [
            pod("pg-0", "n1", json!({}), true),
            pod(
                "web-0",
                "n1",
                json!({DO_NOT_DISRUPT: "true", HELD_MARK: HELD}),
                false,
            ),
            // Released by a plan still running: no hold expected.
            pod("pg-1", "n2", json!({RELEASED_BY: "b"}), true),
            // On a node that is gone: not judged.
            pod("pg-2", "gone", json!({}), true),
        ];
        let nodes = [
            node("n1", json!({})),
            node(
                "n2",
                json!({DO_NOT_DISRUPT: "true", HELD_MARK: "do-not-disrupt"}),
            ),
        ];
        let plans = [plan("a", "Completed"), plan("b", "Draining")];
        let protected = BTreeMap::new();
        let v = judge(&evidence(&plans, &pods, &nodes, &[], &[], &[], &protected));
        assert_eq!(v.not_terminal, ["b (Draining)"]);
        assert!(!v.clean());
        assert_eq!(v.holds_lost.len(), 2, "{:?}", v.holds_lost);
        assert!(v.holds_lost[0].contains("pod db/pg-0"));
        assert!(v.holds_lost[1].contains("node n1"));
        assert_eq!(v.holds_orphaned.len(), 2, "{:?}", v.holds_orphaned);
        assert!(v.holds_orphaned[0].contains("db/web-0"));
        assert!(v.holds_orphaned[1].contains("node n2"));
    }

    #[test]
    fn two_backups_of_one_attempt_are_duplicates() {
        let backup = |name: &str, attempt: &str| {
            json!({"metadata": {"name": name,
                "labels": {ATTEMPT: attempt, BACKUP_NAMESPACE: "db"},
                "annotations": {PLAN_NAME: "p"}}})
        };
        assert!(duplicate_backups(&[backup("p-db-1-x", "1"), backup("p-db-2-y", "2")]).is_empty());
        let d = duplicate_backups(&[backup("p-db-1-x", "1"), backup("p-db-1-z", "1")]);
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].contains("attempt 1: 2 Backups"));
    }

    #[test]
    fn two_instances_for_one_replacement_are_duplicates() {
        let launched = |id: &str, node: &str| Launched {
            id: id.into(),
            tags: BTreeMap::from([
                ("snapdrain.io/plan".into(), "p".into()),
                ("snapdrain.io/replaces".into(), node.into()),
            ]),
        };
        assert!(duplicate_instances(&[launched("i-1", "n1"), launched("i-2", "n2")]).is_empty());
        let d = duplicate_instances(&[launched("i-1", "n1"), launched("i-2", "n1")]);
        assert_eq!(d.len(), 1);
        assert!(d[0].contains("2 instances to replace n1"), "{d:?}");
    }

    #[test]
    fn an_eviction_before_any_verified_backup_is_a_violation() {
        let evicted = |source: &str, verb: &str, resource: &str, code: Option<u16>| {
            pg_entry(source, verb, resource, code, "2025-01-01T00:00:05.000Z")
        };
        let audit = [
            evicted("world", "evicted", "pods", None),
            evicted("api", "create", "pods/eviction", Some(201)),
        ];
        let protected = BTreeMap::from([(
            "db/pg-0".to_string(),
            BTreeSet::from(["data-pg-0".to_string()]),
        )]);
        let late = [
            json!({"metadata": {"name": "a"}, "status": {"phase": "Completed", "backups": [
            {"name": "b", "namespace": "db", "pvcs": ["data-pg-0"], "verifiedAt": "2025-01-01T00:00:06Z"}]}}),
        ];
        let v = judge(&evidence(&late, &[], &[], &[], &[], &audit, &protected));
        assert_eq!(v.violations.len(), 1, "{v:?}");
        let early = [
            json!({"metadata": {"name": "a"}, "status": {"phase": "Completed", "backups": [
            {"name": "b", "namespace": "db", "pvcs": ["data-pg-0"], "verifiedAt": "2025-01-01T00:00:04Z"}]}}),
        ];
        let v = judge(&evidence(&early, &[], &[], &[], &[], &audit, &protected));
        assert!(v.violations.is_empty(), "{v:?}");
    }

    /// An audit entry of `db/pg-0` on node `n1`.
    fn pg_entry(
        source: &str,
        verb: &str,
        resource: &str,
        code: Option<u16>,
        time: &str,
    ) -> AuditEntry {
        AuditEntry {
            seq: 1,
            time: time.into(),
            source: source.into(),
            verb: verb.into(),
            resource: resource.into(),
            namespace: Some("db".into()),
            name: Some("pg-0".into()),
            user_agent: None,
            code,
            detail: json!({"node": "n1"}),
        }
    }

    #[test]
    fn only_an_eviction_after_a_forceful_signals_plan_failed_on_that_node_is_let_go() {
        let entry = pg_entry;
        let audit = [
            entry("world", "evicted", "pods", None, "2025-01-01T00:00:05.000Z"),
            entry(
                "api",
                "create",
                "pods/eviction",
                Some(201),
                "2025-01-01T00:00:05.002Z",
            ),
        ];
        let protected = BTreeMap::from([(
            "db/pg-0".to_string(),
            BTreeSet::from(["data-pg-0".to_string()]),
        )]);
        let plan = |node: &str, reason: &str, phase: &str, done: &str| {
            json!({"metadata": {"name": "p"},
                "spec": {"nodes": [node], "source": "karpenter", "reason": reason},
                "status": {"phase": phase, "conditions": [
                    {"type": "Done", "status": "False", "reason": phase, "lastTransitionTime": done}]}})
        };
        let judged =
            |plans: &[Value]| judge(&evidence(plans, &[], &[], &[], &[], &audit, &protected));
        let v = judged(&[plan(
            "n1",
            "NodeClaimDeleted",
            "Failed",
            "2025-01-01T00:00:04Z",
        )]);
        assert!(v.violations.is_empty() && v.let_go.len() == 1, "{v:?}");
        // Ended after the eviction, another node, a graceful signal, or a plan that completed: violations.
        for plans in [
            [plan(
                "n1",
                "NodeClaimDeleted",
                "Failed",
                "2025-01-01T00:00:06Z",
            )],
            [plan(
                "n2",
                "NodeClaimDeleted",
                "Failed",
                "2025-01-01T00:00:04Z",
            )],
            [plan("n1", "Drifted", "Failed", "2025-01-01T00:00:04Z")],
            [plan("n1", "Disrupting", "Failed", "2025-01-01T00:00:04Z")],
            [plan(
                "n1",
                "NodeClaimDeleted",
                "Completed",
                "2025-01-01T00:00:04Z",
            )],
        ] {
            let v = judged(&plans);
            assert_eq!(v.violations.len(), 1, "{plans:?}: {v:?}");
            assert!(v.let_go.is_empty());
        }
        // Made for Karpenter's `karpenter.sh/disrupted` taint, whose watch event came before the
        // NodeClaim's deletion, and then recording that deletion: the deletion's plan (chaos seed 1
        // saw it fail under S3 faults, and snapdrain let the pod go as documented).
        let mut took_deletion = plan("n1", "Disrupting", "Failed", "2025-01-01T00:00:04Z");
        took_deletion["metadata"]["annotations"] = json!({SIGNALS:
            r#"[{"source":"karpenter","reason":"Disrupting"},{"source":"karpenter","reason":"NodeClaimDeleted"}]"#});
        let v = judged(&[took_deletion]);
        assert!(v.violations.is_empty() && v.let_go.len() == 1, "{v:?}");
    }

    /// A world record at `time` (seconds after midnight, with milliseconds).
    fn world(verb: &str, resource: &str, name: &str, time: &str, detail: Value) -> AuditEntry {
        AuditEntry {
            seq: 1,
            time: format!("2025-01-01T00:00:{time}Z"),
            source: "world".into(),
            verb: verb.into(),
            resource: resource.into(),
            namespace: (resource != "nodes").then(|| "db".into()),
            name: Some(name.into()),
            user_agent: None,
            code: None,
            detail,
        }
    }

    /// pg-0 starts on n1 at 01, a Velero Backup of its claim (or none) runs, the instance is
    /// reclaimed at 10, the Node removed and the pod garbage-collected (Failed) at 11.
    fn lost_at_reclaim(backup: Option<(&str, &str)>) -> Vec<AuditEntry> {
        let mut audit = vec![world(
            "started",
            "pods",
            "pg-0",
            "01.000",
            json!({"uid": "u1", "node": "n1", "claims": ["data-pg-0"]}),
        )];
        if let Some((from, to)) = backup {
            for (phase, at) in [("InProgress", from), ("Completed", to)] {
                audit.push(world(
                    "phase",
                    "backups.velero.io",
                    "b1",
                    at,
                    json!({"phase": phase, "pvcs": ["db/data-pg-0"], "pods": ["db/pg-0"]}),
                ));
            }
        }
        audit.extend([
            world(
                "spot-instance-reclaimed",
                "instances",
                "i-1",
                "10.000",
                json!({"node": "n1"}),
            ),
            world("removed", "nodes", "n1", "11.000", json!({})),
            world(
                "deleted",
                "pods",
                "pg-0",
                "11.001",
                json!({"uid": "u1", "node": "n1", "claims": ["data-pg-0"], "phase": "Failed"}),
            ),
        ]);
        audit
    }

    fn pg0() -> BTreeMap<String, BTreeSet<String>> {
        BTreeMap::from([(
            "db/pg-0".to_string(),
            BTreeSet::from(["data-pg-0".to_string()]),
        )])
    }

    #[test]
    fn a_protected_pod_lost_with_its_node_and_no_plan_is_a_violation() {
        let protected = pg0();
        let audit = lost_at_reclaim(None);
        let v = judge(&evidence(&[], &[], &[], &[], &[], &audit, &protected));
        assert_eq!((v.violations.len(), v.lost_with_node), (1, 1), "{v:?}");
        assert!(v.violations[0].contains("lost with its node n1"), "{v:?}");
        assert!(v.let_go.is_empty() && !v.clean());
        // Not protected by the judge's rule: not judged.
        let v = judge(&evidence(&[], &[], &[], &[], &[], &audit, &BTreeMap::new()));
        assert!(v.violations.is_empty(), "{v:?}");
        // A backup that does not cover the claim, one begun before the pod started there, one
        // completed after the node went: none covers the loss.
        for (from, to) in [("00.500", "05.000"), ("02.000", "10.500")] {
            let audit = lost_at_reclaim(Some((from, to)));
            let v = judge(&evidence(&[], &[], &[], &[], &[], &audit, &protected));
            assert_eq!(v.lost_with_node, 1, "backup {from}..{to}: {v:?}");
        }
        let mut other = lost_at_reclaim(Some(("02.000", "05.000")));
        for a in &mut other {
            if a.verb == "phase" {
                a.detail["pvcs"] = json!(["db/data-pg-1"]);
            }
        }
        let v = judge(&evidence(&[], &[], &[], &[], &[], &other, &protected));
        assert_eq!(v.lost_with_node, 1, "{v:?}");
    }

    /// A materialized scenario (scale-5k) writes its pods Running before the log begins, so the log
    /// has no start of theirs: such a pod lost with its node is judged as running there from the log's
    /// start (the soak at scale-5k lost one so, unseen, while this rule skipped it). A pod the world
    /// created during the run and that never started is still not judged.
    #[test]
    fn a_pod_running_before_the_log_began_and_lost_with_its_node_is_a_violation() {
        let protected = pg0();
        let judged =
            |audit: &[AuditEntry]| judge(&evidence(&[], &[], &[], &[], &[], audit, &protected));
        let mut materialized = lost_at_reclaim(None);
        materialized[0] = world("added", "nodes", "n1", "00.000", json!({}));
        let v = judged(&materialized);
        assert_eq!((v.violations.len(), v.lost_with_node), (1, 1), "{v:?}");
        assert!(v.violations[0].contains("lost with its node n1"), "{v:?}");
        // A Backup of its claim taken after the log began and completed before the node went saves it.
        let mut saved = lost_at_reclaim(Some(("02.000", "05.000")));
        saved[0] = world("added", "nodes", "n1", "00.000", json!({}));
        assert_eq!(judged(&saved).lost_with_node, 0);
        // Created during the run, never started: nothing of it ran there.
        let mut never_started = lost_at_reclaim(None);
        never_started[0] = world(
            "created",
            "pods",
            "pg-0",
            "01.000",
            json!({"uid": "u1", "statefulSet": "pg", "claims": ["data-pg-0"]}),
        );
        assert_eq!(judged(&never_started).lost_with_node, 0);
    }

    #[test]
    fn a_verified_backup_taken_while_the_pod_ran_there_covers_its_loss() {
        let protected = pg0();
        let audit = lost_at_reclaim(Some(("02.000", "05.000")));
        let v = judge(&evidence(&[], &[], &[], &[], &[], &audit, &protected));
        assert!(v.violations.is_empty() && v.let_go.is_empty(), "{v:?}");
        assert_eq!(v.lost_with_node, 0);
    }

    /// A pod lost with its node is saved, claim by claim, by a plan's snapshot of its EBS volume cut
    /// after it started there and before the node went (EC2's own record), as by a Velero Backup.
    #[test]
    fn a_plans_snapshot_cut_while_the_pod_ran_there_covers_its_loss() {
        let audit = lost_at_reclaim(None);
        let ebs = |start: &str, uid: &str| safety::EbsEvidence {
            claim_volumes: BTreeMap::from([("db/data-pg-0".to_string(), "vol-a".to_string())]),
            snapshots: vec![safety::Ec2Snapshot {
                snapshot_id: "snap-1".into(),
                volume_id: "vol-a".into(),
                start_time: format!("2025-01-01T00:00:{start}Z")
                    .parse()
                    .expect("test time"),
                tags: BTreeMap::from([(safety::PLAN_UID_TAG.to_string(), uid.to_string())]),
                state: "pending".into(),
            }],
            plan_uids: BTreeSet::from(["uid-1".to_string()]),
            ..safety::EbsEvidence::default()
        };
        assert!(lost_with_node(&audit, &pg0(), &ebs("05.000", "uid-1")).is_empty());
        for (start, uid, why) in [
            ("00.500", "uid-1", "cut before the pod started there"),
            ("10.500", "uid-1", "cut after the node went"),
            ("05.000", "uid-other", "not a plan's snapshot"),
        ] {
            assert_eq!(
                lost_with_node(&audit, &pg0(), &ebs(start, uid)).len(),
                1,
                "{why}"
            );
        }
    }

    #[test]
    fn a_pod_that_left_through_an_eviction_is_judged_by_the_eviction_rule_only() {
        let protected = pg0();
        let mut audit = lost_at_reclaim(None);
        audit.insert(
            1,
            world("evicted", "pods", "pg-0", "03.000", json!({"node": "n1"})),
        );
        audit.insert(
            2,
            AuditEntry {
                source: "api".into(),
                verb: "create".into(),
                resource: "pods/eviction".into(),
                code: Some(201),
                ..world("", "", "pg-0", "03.002", Value::Null)
            },
        );
        let v = judge(&evidence(&[], &[], &[], &[], &[], &audit, &protected));
        assert_eq!((v.violations.len(), v.lost_with_node), (1, 0), "{v:?}");
        assert!(v.violations[0].contains("was evicted"), "{v:?}");
    }

    #[test]
    fn a_pod_lost_with_its_node_after_a_forceful_signals_plan_failed_is_let_go() {
        let protected = pg0();
        let audit = lost_at_reclaim(None);
        let plan = |reason: &str, done: &str| {
            json!({"metadata": {"name": "p"},
                "spec": {"nodes": ["n1"], "source": "node-termination-handler", "reason": reason},
                "status": {"phase": "Failed", "conditions": [
                    {"type": "Done", "status": "False", "reason": "Failed",
                     "lastTransitionTime": format!("2025-01-01T00:00:{done}Z")}]}})
        };
        let plans = [plan("SpotInterruption", "08")];
        let v = judge(&evidence(&plans, &[], &[], &[], &[], &audit, &protected));
        assert!(v.violations.is_empty() && v.lost_with_node == 0, "{v:?}");
        assert_eq!(v.let_go.len(), 1, "{v:?}");
        assert!(
            v.let_go[0].contains("lost with its node") && v.let_go[0].contains("let go: plan p")
        );
        // Ended after the node went, or a graceful signal's plan: a violation.
        for plans in [
            [plan("SpotInterruption", "10.5")],
            [plan("RebalanceRecommendation", "08")],
        ] {
            let v = judge(&evidence(&plans, &[], &[], &[], &[], &audit, &protected));
            assert_eq!(v.lost_with_node, 1, "{plans:?}: {v:?}");
            assert!(v.let_go.is_empty());
        }
    }

    /// A forceful plan released the pod at its emergency EBS snapshot: the judge reads EC2's own
    /// snapshots (tagged with a plan's uid, started before the eviction, not ended in error) and the
    /// claim's volume from the PVs, so the eviction is neither a violation nor a let-go; without such a
    /// snapshot it is a violation.
    #[test]
    fn an_eviction_at_an_ec2_snapshot_of_a_plan_is_no_violation() {
        let entry = |source: &str, verb: &str, resource: &str, code: Option<u16>| {
            pg_entry(source, verb, resource, code, "2025-01-01T00:00:05.000Z")
        };
        let audit = [
            entry("world", "evicted", "pods", None),
            entry("api", "create", "pods/eviction", Some(201)),
        ];
        let protected = BTreeMap::from([(
            "db/pg-0".to_string(),
            BTreeSet::from(["data-pg-0".to_string()]),
        )]);
        // A spot interruption's plan that completed once its snapshot did (no verified backup).
        let plans = [json!({"metadata": {"name": "p", "uid": "uid-p"},
            "spec": {"nodes": ["n1"], "source": "node-termination-handler", "reason": "SpotInterruption"},
            "status": {"phase": "Completed"}})];
        let pvs = [json!({"metadata": {"name": "pv-1"}, "spec": {
            "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"},
            "claimRef": {"namespace": "db", "name": "data-pg-0"}}})];
        let snap = |uid: &str, start: &str, state: &str| safety::Ec2Snapshot {
            snapshot_id: "snap-1".into(),
            volume_id: "vol-1".into(),
            start_time: start.parse().expect("test time"),
            tags: BTreeMap::from([(safety::PLAN_UID_TAG.to_string(), uid.to_string())]),
            state: state.into(),
        };
        let judged = |snapshots: &[safety::Ec2Snapshot]| {
            judge(&Evidence {
                pvs: &pvs,
                snapshots,
                ..evidence(&plans, &[], &[], &[], &[], &audit, &protected)
            })
        };
        let v = judged(&[snap("uid-p", "2025-01-01T00:00:04Z", "completed")]);
        assert!(v.violations.is_empty() && v.let_go.is_empty(), "{v:?}");
        for bad in [
            vec![],
            vec![snap("uid-other", "2025-01-01T00:00:04Z", "completed")],
            vec![snap("uid-p", "2025-01-01T00:00:06Z", "completed")],
            vec![snap("uid-p", "2025-01-01T00:00:04Z", "error")],
        ] {
            let v = judged(&bad);
            assert_eq!(v.violations.len(), 1, "{bad:?}: {v:?}");
        }
    }
}
