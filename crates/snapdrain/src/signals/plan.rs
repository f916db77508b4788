//! One plan per node at a time: a signal joins the plan that is running for its node, or creates one.
//!
//! Which plan a signal gets is a pure decision ([`choose`]) over the plans that exist; [`join_or_create`]
//! is its I/O. Names are deterministic ([`naming::signal_plan_name`]), so two callers deciding at once
//! (two webhook replicas, the signal watcher and the gate) end with one plan: the second create gets 409
//! and joins.

use std::borrow::Borrow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde::{Deserialize, Serialize};

use super::error::SignalError;
use crate::api::lenient;
use crate::api::{DisruptionPlan, DisruptionPlanSpec, PlanMode, PlanPhase, PlanSource};
use crate::planning::naming;

/// Label on plans made for a signal: the node (as a label value), for finding a node's plans by selector.
pub const NODE_LABEL: &str = "snapdrain.io/node";
/// Annotation listing every signal a plan has taken (JSON array of [`SignalRecord`]), the first one too.
pub const SIGNALS_ANNOTATION: &str = "snapdrain.io/signals";
/// Annotation on a plan a signal made: the protected pods (`namespace/name`, JSON array) its node ran when
/// the signal came. A pod of this list that has left the node before the plan's first look left without a
/// backup, and the plan says so ([`left_before_backup`]).
pub const PROTECTED_PODS_ANNOTATION: &str = "snapdrain.io/protected-pods";

/// A reason to take a node away, as a watcher or the eviction gate saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSignal {
    pub node: String,
    /// The Node's uid (empty when unknown): new plans for a re-created node of the same name.
    pub node_uid: String,
    pub source: PlanSource,
    /// What happened, for people reading the plan: "Drifted", "Expired", "SpotInterruption", ...
    pub reason: String,
    pub mode: PlanMode,
    /// When the node goes regardless (forceful signals).
    pub deadline: Option<jiff::Timestamp>,
}

/// A signal as written in [`SIGNALS_ANNOTATION`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalRecord {
    pub source: PlanSource,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<jiff::Timestamp>,
}

impl From<&NodeSignal> for SignalRecord {
    fn from(s: &NodeSignal) -> Self {
        Self {
            source: s.source,
            reason: s.reason.clone(),
            deadline: s.deadline,
        }
    }
}

/// What to do with a signal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// A plan for the node is running: the signal joins it. `record` is false when the plan already lists
    /// this signal; `earlier_deadline` is set when the signal's deadline is earlier than the plan's.
    Join {
        plan: String,
        record: bool,
        earlier_deadline: Option<jiff::Timestamp>,
    },
    /// No plan runs for the node: create this one.
    Create { name: String },
    /// This signal's last plan failed or was aborted: a failure stays loud until a person acts (deletes
    /// the plan, or runs `snapdrain drain`); the signal does not start another backup by itself.
    Settled { plan: String, phase: PlanPhase },
}

/// Whether `plan` is (or, still Pending, will be) about `node`.
fn plan_covers(plan: &DisruptionPlan, node: &str) -> bool {
    plan.spec.nodes.iter().any(|n| n == node)
        || plan
            .status
            .as_ref()
            .is_some_and(|s| s.nodes.iter().any(|n| n.name == node))
}

/// The plans covering each node ([`plan_covers`]). [`choose`] and [`let_go`](super::let_go::let_go)
/// need only a node's own plans: the signal watcher groups them once per look instead of scanning
/// every stored plan for each signalled node (a consolidation burst at 5,000 nodes signals thousands
/// at once, and `keepPerNode` keeps up to one finished plan per node).
pub fn plans_by_node<P: Borrow<DisruptionPlan> + Clone>(
    plans: &[P],
) -> std::collections::HashMap<String, Vec<P>> {
    let mut by_node: std::collections::HashMap<String, Vec<P>> = Default::default();
    for p in plans {
        let plan = p.borrow();
        let nodes: std::collections::BTreeSet<&str> = plan
            .spec
            .nodes
            .iter()
            .map(String::as_str)
            .chain(
                plan.status
                    .iter()
                    .flat_map(|s| s.nodes.iter().map(|n| n.name.as_str())),
            )
            .collect();
        for node in nodes {
            by_node.entry(node.to_owned()).or_default().push(p.clone());
        }
    }
    by_node
}

fn phase_of(plan: &DisruptionPlan) -> PlanPhase {
    plan.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

fn records_of(plan: &DisruptionPlan) -> Vec<SignalRecord> {
    plan.annotations()
        .get(SIGNALS_ANNOTATION)
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// The protected pods the signal saw on the plan's node ([`PROTECTED_PODS_ANNOTATION`]); empty for a
/// person's plan.
pub fn protected_at_signal(plan: &DisruptionPlan) -> Vec<String> {
    plan.annotations()
        .get(PROTECTED_PODS_ANNOTATION)
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// Of the pods protected when the signal came (`namespace/name`), those no longer running on the plan's
/// nodes: gone, or being deleted by someone else. `on_nodes` are the pods on the plan's nodes now.
pub fn left_before_backup(
    protected: &[String],
    on_nodes: &[k8s_openapi::api::core::v1::Pod],
) -> Vec<String> {
    let still: std::collections::BTreeSet<String> = on_nodes
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect();
    protected
        .iter()
        .filter(|p| !still.contains(*p))
        .cloned()
        .collect()
}

/// Decides where `signal` goes among `plans` (all plans, or at least those for its node).
pub fn choose<P: Borrow<DisruptionPlan>>(plans: &[P], signal: &NodeSignal) -> Choice {
    let running = plans.iter().map(Borrow::borrow).find(|p| {
        plan_covers(p, &signal.node)
            && !phase_of(p).is_terminal()
            && p.metadata.deletion_timestamp.is_none()
    });
    if let Some(plan) = running {
        let record = SignalRecord::from(signal);
        let known = records_of(plan).iter().any(|r| r == &record);
        let current = plan.spec.deadline.as_ref().map(|t| t.0);
        let earlier_deadline = signal.deadline.filter(|d| current.is_none_or(|c| *d < c));
        return Choice::Join {
            plan: plan.name_any(),
            record: !known,
            earlier_deadline,
        };
    }
    // The node's earlier runs. Finished plans are deleted by the policy's history, so the runs that are
    // left may have gaps: the next run follows the highest, never fills a gap.
    // Every run's name carries the hash of the node and its uid: a substring test skips the other
    // plans before a name is rebuilt (the gate decides over every stored plan on each eviction).
    let first = naming::signal_plan_name(&signal.node, &signal.node_uid, 1);
    let hash = first.rsplit_once('-').map_or(first.as_str(), |(_, h)| h);
    let runs: Vec<(u32, &DisruptionPlan)> = plans
        .iter()
        .map(Borrow::borrow)
        .filter(|p| p.metadata.name.as_deref().is_some_and(|n| n.contains(hash)))
        .filter_map(|p| Some((run_of(p, signal)?, p)))
        .collect();
    // This signal's plan failed or was aborted: it stays so, rather than coming back as a new plan on
    // every look (a plan without records is taken as this signal's).
    if let Some((_, p)) = runs
        .iter()
        .filter(|(_, p)| {
            matches!(phase_of(p), PlanPhase::Failed | PlanPhase::Aborted) && took(p, signal)
        })
        .max_by_key(|(run, _)| *run)
    {
        return Choice::Settled {
            plan: p.name_any(),
            phase: phase_of(p),
        };
    }
    // Completed (the node was not taken in its release window, or came back), or another signal's plan
    // that ended: the next run.
    let next = runs.iter().map(|(run, _)| run + 1).max().unwrap_or(1);
    Choice::Create {
        name: naming::signal_plan_name(&signal.node, &signal.node_uid, next),
    }
}

/// The run number of `plan` among the plans of `signal`'s node, when it is one of them: its name is
/// [`naming::signal_plan_name`] of that node and run (a trailing `-<run>`, none for the first).
fn run_of(plan: &DisruptionPlan, signal: &NodeSignal) -> Option<u32> {
    let name = plan.metadata.name.as_deref()?;
    let run = match name.rsplit_once('-') {
        Some((_, tail)) if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) => {
            tail.parse().unwrap_or(1)
        }
        _ => 1,
    };
    // A first run whose hash ends in digits reads as a run too: the name is checked both ways.
    [run, 1]
        .into_iter()
        .find(|r| naming::signal_plan_name(&signal.node, &signal.node_uid, *r) == name)
}

/// Whether `plan` took `signal` (same source and reason), or records no signals at all.
fn took(plan: &DisruptionPlan, signal: &NodeSignal) -> bool {
    let records = records_of(plan);
    records.is_empty()
        || records
            .iter()
            .any(|r| r.source == signal.source && r.reason == signal.reason)
}

/// The kebab-case name of a source, as in the plan's spec.
pub fn source_name(source: PlanSource) -> &'static str {
    match source {
        PlanSource::Manual => "manual",
        PlanSource::Karpenter => "karpenter",
        PlanSource::ClusterAutoscaler => "cluster-autoscaler",
        PlanSource::NodeTerminationHandler => "node-termination-handler",
        PlanSource::EvictionGate => "eviction-gate",
        PlanSource::Api => "api",
    }
}

/// The spec of a new plan for `signal`, on top of `defaults` (the policy's backup, drain and termination
/// settings; `nodes`, `source`, `reason`, `mode` and `deadline` come from the signal).
pub fn spec_for(signal: &NodeSignal, defaults: &DisruptionPlanSpec) -> DisruptionPlanSpec {
    DisruptionPlanSpec {
        nodes: vec![signal.node.clone()],
        node_selector: None,
        reason: Some(signal.reason.clone()),
        source: signal.source,
        mode: signal.mode,
        deadline: signal.deadline.map(Time),
        replacement: match signal.mode {
            PlanMode::Release => None,
            PlanMode::Execute => defaults.replacement.clone(),
        },
        ..defaults.clone()
    }
}

/// What [`join_or_create`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Created(String),
    Joined(String),
    Settled { plan: String, phase: PlanPhase },
}

impl Outcome {
    /// The plan the signal belongs to.
    pub fn plan(&self) -> &str {
        match self {
            Self::Created(p) | Self::Joined(p) | Self::Settled { plan: p, .. } => p,
        }
    }
}

/// Finds the node's running plan and joins it, or creates a plan from `defaults` (see [`spec_for`]).
/// `protected`: the node's protected pods as the caller saw them, recorded on a new plan.
pub async fn join_or_create(
    client: &Client,
    signal: &NodeSignal,
    defaults: &DisruptionPlanSpec,
    protected: &[String],
) -> Result<Outcome, SignalError> {
    let api: Api<DisruptionPlan> = Api::all(client.clone());
    // A 409 on create is another caller making the node's plan at the same moment (same name): look
    // again, and join it. Twice is enough: after a 409 the plan exists.
    let mut taken = String::new();
    for _ in 0..2 {
        // Plans a signal made carry the node label; a person's plan naming the node does not, so all
        // are read. Decoded one by one: a plan snapdrain cannot read is left out instead of failing
        // the list.
        let plans: Vec<DisruptionPlan> = lenient::list_decoded(&api.clone().into_client())
            .await
            .map_err(|source| SignalError::List {
                node: signal.node.clone(),
                source,
            })?;
        match decide(&api, &plans, signal, defaults, protected).await? {
            Ok(outcome) => return Ok(outcome),
            Err(name) => taken = name,
        }
    }
    Ok(Outcome::Joined(taken))
}

/// [`join_or_create`] over plans already in memory (a reflector's store): no LIST, one create or one
/// patch at most. A 409 on create means the plan exists (another replica or the signal watcher made it
/// at the same moment): it is joined as it is.
pub async fn join_or_create_known<P: Borrow<DisruptionPlan>>(
    client: &Client,
    plans: &[P],
    signal: &NodeSignal,
    defaults: &DisruptionPlanSpec,
    protected: &[String],
) -> Result<Outcome, SignalError> {
    let api: Api<DisruptionPlan> = Api::all(client.clone());
    Ok(decide(&api, plans, signal, defaults, protected)
        .await?
        .unwrap_or_else(Outcome::Joined))
}

/// One look at `plans`: join, settle or create. `Err(name)` when the create of `name` met the same
/// plan made meanwhile by another caller.
async fn decide<P: Borrow<DisruptionPlan>>(
    api: &Api<DisruptionPlan>,
    plans: &[P],
    signal: &NodeSignal,
    defaults: &DisruptionPlanSpec,
    protected: &[String],
) -> Result<Result<Outcome, String>, SignalError> {
    match choose(plans, signal) {
        Choice::Join {
            plan,
            record,
            earlier_deadline,
        } => {
            if record || earlier_deadline.is_some() {
                join(api, plans, &plan, signal, record, earlier_deadline).await?;
            }
            Ok(Ok(Outcome::Joined(plan)))
        }
        Choice::Settled { plan, phase } => Ok(Ok(Outcome::Settled { plan, phase })),
        Choice::Create { name } => {
            let plan = DisruptionPlan {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(
                        [(NODE_LABEL.to_owned(), naming::label_value(&signal.node))].into(),
                    ),
                    annotations: Some(
                        [
                            (
                                SIGNALS_ANNOTATION.to_owned(),
                                records_json(&[SignalRecord::from(signal)]),
                            ),
                            (
                                PROTECTED_PODS_ANNOTATION.to_owned(),
                                serde_json::to_string(protected)
                                    .expect("a list of strings serializes"),
                            ),
                        ]
                        .into(),
                    ),
                    ..ObjectMeta::default()
                },
                spec: spec_for(signal, defaults),
                status: None,
            };
            match api.create(&PostParams::default(), &plan).await {
                Ok(_) => Ok(Ok(Outcome::Created(name))),
                // Another caller made the node's plan at the same moment: look again, to join it with
                // this signal recorded.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Err(name)),
                Err(source) => Err(SignalError::Create {
                    plan: name,
                    node: signal.node.clone(),
                    source,
                }),
            }
        }
    }
}

async fn join<P: Borrow<DisruptionPlan>>(
    api: &Api<DisruptionPlan>,
    plans: &[P],
    name: &str,
    signal: &NodeSignal,
    record: bool,
    earlier_deadline: Option<jiff::Timestamp>,
) -> Result<(), SignalError> {
    let mut records = plans
        .iter()
        .map(Borrow::borrow)
        .find(|p| p.name_any() == name)
        .map(records_of)
        .unwrap_or_default();
    if record {
        records.push(SignalRecord::from(signal));
    }
    let mut patch = serde_json::json!({
        "metadata": {"annotations": {SIGNALS_ANNOTATION: records_json(&records)}}
    });
    if let Some(d) = earlier_deadline {
        patch["spec"] = serde_json::json!({"deadline": Time(d)});
    }
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| SignalError::Join {
            plan: name.to_owned(),
            node: signal.node.clone(),
            source,
        })?;
    Ok(())
}

fn records_json(records: &[SignalRecord]) -> String {
    // Plain data (enums, strings, timestamps): serializing it cannot fail.
    serde_json::to_string(records).unwrap_or_else(|_| "[]".into())
}

#[cfg(test)]
mod tests {
    #[test]
    fn pods_gone_or_deleted_since_the_signal_left_before_the_backup() {
        let pod = |ns: &str, name: &str, deleting: bool| -> k8s_openapi::api::core::v1::Pod {
            let mut p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(
                serde_json::json!({"metadata": {"name": name, "namespace": ns}}),
            )
            .expect("a pod");
            if deleting {
                p.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
            }
            p
        };
        let seen = vec![
            "shop/db-0".to_string(),
            "shop/db-1".to_string(),
            "shop/cache-0".to_string(),
        ];
        let now = [
            pod("shop", "db-0", false),
            pod("shop", "cache-0", true),
            pod("other", "db-1", false),
        ];
        assert_eq!(
            super::left_before_backup(&seen, &now),
            vec!["shop/db-1".to_string(), "shop/cache-0".to_string()]
        );
        assert!(super::left_before_backup(&[], &now).is_empty());
    }

    use super::*;
    use crate::api::DisruptionPlanStatus;

    fn signal(reason: &str, deadline: Option<&str>) -> NodeSignal {
        NodeSignal {
            node: "n1".into(),
            node_uid: "u1".into(),
            source: PlanSource::Karpenter,
            reason: reason.into(),
            mode: PlanMode::Release,
            deadline: deadline.map(|d| d.parse().expect("test timestamps are valid")),
        }
    }

    fn plan(name: &str, nodes: &[&str], phase: PlanPhase) -> DisruptionPlan {
        let mut p = DisruptionPlan::new(
            name,
            DisruptionPlanSpec {
                nodes: nodes.iter().map(|n| n.to_string()).collect(),
                ..DisruptionPlanSpec::default()
            },
        );
        p.status = Some(DisruptionPlanStatus {
            phase,
            ..DisruptionPlanStatus::default()
        });
        p
    }

    #[test]
    fn a_first_signal_creates_a_plan_named_for_it() {
        let s = signal("Drifted", None);
        let name = naming::signal_plan_name("n1", "u1", 1);
        assert_eq!(
            choose::<DisruptionPlan>(&[], &s),
            Choice::Create { name: name.clone() }
        );
        let other = plan("other", &["n2"], PlanPhase::BackingUp);
        assert_eq!(choose(&[other], &s), Choice::Create { name });
    }

    #[test]
    fn a_second_signal_joins_the_running_plan_and_moves_its_deadline_earlier_only() {
        let mut running = plan("manual-n1", &["n1", "n2"], PlanPhase::BackingUp);
        running.spec.deadline = Some(Time("2026-12-01T10:00:00Z".parse().expect("valid")));
        let later = signal("Expired", Some("2026-12-01T11:00:00Z"));
        assert_eq!(
            choose(std::slice::from_ref(&running), &later),
            Choice::Join {
                plan: "manual-n1".into(),
                record: true,
                earlier_deadline: None
            }
        );
        let sooner = signal("SpotInterruption", Some("2026-12-01T09:00:00Z"));
        assert_eq!(
            choose(&[running], &sooner),
            Choice::Join {
                plan: "manual-n1".into(),
                record: true,
                earlier_deadline: sooner.deadline
            }
        );
    }

    #[test]
    fn a_signal_the_plan_already_lists_is_not_recorded_twice() {
        let s = signal("Drifted", None);
        let mut running = plan("p", &["n1"], PlanPhase::Verifying);
        running.annotations_mut().insert(
            SIGNALS_ANNOTATION.into(),
            records_json(&[SignalRecord::from(&s)]),
        );
        assert_eq!(
            choose(&[running], &s),
            Choice::Join {
                plan: "p".into(),
                record: false,
                earlier_deadline: None
            }
        );
    }

    #[test]
    fn different_signals_for_one_node_decide_on_the_same_plan_name() {
        // The signal watcher (Cluster Autoscaler's taint) and the gate (the first refused eviction) at
        // the same moment: one name, so the second create gets 409 and joins.
        let taint = NodeSignal {
            source: PlanSource::ClusterAutoscaler,
            ..signal("ScaleDown", None)
        };
        let gate = NodeSignal {
            source: PlanSource::EvictionGate,
            ..signal("EvictionRefused", None)
        };
        assert_eq!(
            choose::<DisruptionPlan>(&[], &taint),
            choose::<DisruptionPlan>(&[], &gate)
        );
    }

    #[test]
    fn another_signals_failed_plan_does_not_settle_this_one() {
        let first = naming::signal_plan_name("n1", "u1", 1);
        let mut aborted = plan(&first, &["n1"], PlanPhase::Aborted);
        aborted.metadata.annotations = Some(
            [(
                SIGNALS_ANNOTATION.to_owned(),
                records_json(&[SignalRecord {
                    source: PlanSource::ClusterAutoscaler,
                    reason: "ScaleDown".into(),
                    deadline: None,
                }]),
            )]
            .into(),
        );
        assert_eq!(
            choose(std::slice::from_ref(&aborted), &signal("Drifted", None)),
            Choice::Create {
                name: naming::signal_plan_name("n1", "u1", 2)
            },
            "a user's abort of a scale-down does not stop a later drift"
        );
        let same = NodeSignal {
            source: PlanSource::ClusterAutoscaler,
            ..signal("ScaleDown", None)
        };
        assert_eq!(
            choose(&[aborted], &same),
            Choice::Settled {
                plan: first,
                phase: PlanPhase::Aborted
            }
        );
    }

    #[test]
    fn a_completed_run_leads_to_the_next_and_a_failed_one_stays_failed() {
        let s = signal("Drifted", None);
        let first = naming::signal_plan_name("n1", "u1", 1);
        let second = naming::signal_plan_name("n1", "u1", 2);
        let done = plan(&first, &["n1"], PlanPhase::Completed);
        assert_eq!(
            choose(std::slice::from_ref(&done), &s),
            Choice::Create {
                name: second.clone()
            }
        );
        let failed = plan(&second, &["n1"], PlanPhase::Failed);
        assert_eq!(
            choose(&[done, failed], &s),
            Choice::Settled {
                plan: second,
                phase: PlanPhase::Failed
            }
        );
    }

    #[test]
    fn after_earlier_runs_were_deleted_the_next_run_follows_the_highest_left() {
        let s = signal("Drifted", None);
        let name = |run| naming::signal_plan_name("n1", "u1", run);
        // Runs 1 and 2 were deleted by the policy's history; run 3 completed.
        let third = plan(&name(3), &["n1"], PlanPhase::Completed);
        assert_eq!(
            choose(std::slice::from_ref(&third), &s),
            Choice::Create { name: name(4) }
        );
        // A settled run is found wherever it sits, not only in an unbroken row from the first.
        let failed = plan(&name(5), &["n1"], PlanPhase::Failed);
        assert_eq!(
            choose(&[third, failed], &s),
            Choice::Settled {
                plan: name(5),
                phase: PlanPhase::Failed
            }
        );
    }

    #[test]
    fn another_nodes_plan_is_no_run_of_this_node() {
        let s = signal("Drifted", None);
        let other = plan(
            &naming::signal_plan_name("n2", "u2", 7),
            &["n2"],
            PlanPhase::Failed,
        );
        assert_eq!(
            choose(&[other], &s),
            Choice::Create {
                name: naming::signal_plan_name("n1", "u1", 1)
            }
        );
    }

    /// A node's own plans decide as all plans do: grouped by `spec.nodes` and by the nodes a plan's
    /// status resolved (a selector's), each plan once per node.
    #[test]
    fn a_nodes_own_plans_decide_as_all_plans_do() {
        let name = |run| naming::signal_plan_name("n1", "u1", run);
        let mut by_selector = plan("by-selector", &[], PlanPhase::BackingUp);
        if let Some(status) = by_selector.status.as_mut() {
            status.nodes = ["n3", "n3"]
                .iter()
                .map(|n| crate::api::status::NodeProgress {
                    name: n.to_string(),
                    ..Default::default()
                })
                .collect();
        }
        let all = vec![
            plan(&name(1), &["n1"], PlanPhase::Completed),
            plan(&name(2), &["n1"], PlanPhase::Failed),
            plan("manual", &["n1", "n2"], PlanPhase::Draining),
            plan(
                &naming::signal_plan_name("n2", "u2", 1),
                &["n2"],
                PlanPhase::Failed,
            ),
            by_selector,
        ];
        let by_node = plans_by_node(&all);
        let names =
            |node: &str| -> Vec<String> { by_node[node].iter().map(|p| p.name_any()).collect() };
        assert_eq!(names("n1"), [name(1), name(2), "manual".to_string()]);
        assert_eq!(names("n3"), ["by-selector"]);
        assert_eq!(by_node.len(), 3);
        for (node, uid) in [("n1", "u1"), ("n2", "u2"), ("n3", "u3")] {
            let s = NodeSignal {
                node: node.into(),
                node_uid: uid.into(),
                ..signal("Drifted", None)
            };
            assert_eq!(choose(&by_node[node], &s), choose(&all, &s), "{node}");
        }
    }

    #[test]
    fn a_plan_being_deleted_is_not_joined() {
        let mut going = plan("p", &["n1"], PlanPhase::Draining);
        going.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        assert!(matches!(
            choose(&[going], &signal("Drifted", None)),
            Choice::Create { .. }
        ));
    }

    #[test]
    fn a_release_plan_never_carries_replacement() {
        let defaults = DisruptionPlanSpec {
            replacement: Some(crate::api::ReplacementSpec::default()),
            ..DisruptionPlanSpec::default()
        };
        let spec = spec_for(&signal("Drifted", None), &defaults);
        assert_eq!(spec.nodes, vec!["n1".to_string()]);
        assert_eq!(spec.mode, PlanMode::Release);
        assert!(spec.replacement.is_none());
        assert_eq!(spec.reason.as_deref(), Some("Drifted"));
    }
}
