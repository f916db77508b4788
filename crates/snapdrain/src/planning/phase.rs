//! The plan's phase machine as a pure function: current phase + spec + observed facts → next phase.
//!
//! One step per call: the controller persists the new phase, performs that phase's action (create Backups,
//! verify, release holds and cordon, evict, terminate, launch) and calls again when facts change. Phases a
//! plan does not need are skipped in the same step (e.g. Pending → Cordoning when nothing needs a backup).
//!
//! Execute: Pending → Cordoning → BackingUp → Verifying → [Replacing if before-drain] → Draining →
//! [Terminating] → [Replacing if after-drain] → Completed.
//! Release: Pending → BackingUp → Verifying → Draining (holds released; the autoscaler drains; wait for
//! the nodes or the released pods to go, or the release window to pass) → Completed.
//!
//! Execute cordons and taints first, before the backup (as kubectl and Karpenter do before evicting), so
//! nothing new lands on the node while it is backed up; a failed or aborted plan rolls that back. A
//! running FSB is unaffected: running pods keep running. Release does not cordon: the drainer the plan
//! releases to (Karpenter, Cluster Autoscaler, a person) cordons and taints itself, and a node the
//! autoscaler then decides not to take must not be left unschedulable by snapdrain.
//!
//! Plans persisted by an older controller mid-flight resume: `Cordoning` (then after Verifying) goes on
//! to BackingUp, which finds the backups verified and moves on; a plan in BackingUp, Verifying or
//! Replacing that was never cordoned reaches Draining, whose step cordons and taints before evicting.

use crate::api::plan::{BackupPolicy, DisruptionPlanSpec, PlanMode, ReplacementWhen};
use crate::api::status::{BackupRecord, EmergencySnapshotSet, PlanPhase};

use super::backups::{BackupProgress, classify_backup_phase};

/// The state of the plan's backups taken together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackupsState {
    /// Policy skip, or no protected pods.
    NotNeeded,
    /// At least one namespace still waits for Velero (or a retry).
    InProgress,
    /// Every backup Completed; some not verified yet.
    AllCompleted,
    /// Every backup Completed and verified in the bucket.
    AllVerified,
    /// A namespace ran out of attempts (or verification failed for good).
    Failed { message: String },
}

/// Whether the drain (Execute) is done.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum DrainState {
    #[default]
    InProgress,
    Done,
    Failed {
        message: String,
    },
}

/// What the controller observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseFacts {
    /// Someone asked to stop (plan deletion, abort annotation).
    pub abort_requested: bool,
    /// Pending could not decide the plan yet (a node is missing, or kubectl's refusals: pods with local
    /// storage, pods no controller owns): the plan waits in Pending, with the reason in its message,
    /// until the cluster or the spec changes.
    pub planning_blocked: bool,
    /// `spec.deadline` has passed.
    pub deadline_passed: bool,
    pub backups: BackupsState,
    /// Every node is unschedulable.
    pub nodes_cordoned: bool,
    pub drain: DrainState,
    /// Every node's instance is terminated / Node deleted as the spec asks (Release: the nodes are gone).
    pub nodes_gone: bool,
    /// Every replacement node is Ready.
    pub replacement_ready: bool,
    /// Release mode: the nodes were not taken (the release window passed, or held pods arrived that no
    /// backup covers); the holds are back and the next run takes over.
    pub release_expired: bool,
    /// Every emergency EBS snapshot set of the plan was accepted by EC2 (snapshot ids known): the data's
    /// point in time is fixed, so the deadline no longer fails the plan while EC2 completes them.
    pub snapshots_accepted: bool,
}

impl Default for PhaseFacts {
    fn default() -> Self {
        Self {
            abort_requested: false,
            planning_blocked: false,
            deadline_passed: false,
            backups: BackupsState::InProgress,
            nodes_cordoned: false,
            drain: DrainState::InProgress,
            nodes_gone: false,
            replacement_ready: false,
            release_expired: false,
            snapshots_accepted: false,
        }
    }
}

/// The next phase, and whether leaving the current one means undoing (uncordon nodes snapdrain cordoned,
/// restore holds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseDecision {
    pub phase: PlanPhase,
    pub rollback: bool,
    pub message: Option<String>,
}

impl PhaseDecision {
    fn to(phase: PlanPhase) -> Self {
        Self {
            phase,
            rollback: false,
            message: None,
        }
    }

    fn with(phase: PlanPhase, message: impl Into<String>) -> Self {
        Self {
            phase,
            rollback: false,
            message: Some(message.into()),
        }
    }

    fn fail(phase: PlanPhase, message: impl Into<String>) -> Self {
        Self {
            phase,
            rollback: true,
            message: Some(message.into()),
        }
    }
}

/// A stop is asked for with the annotation `snapdrain.io/abort: "true"` or by deleting the plan (its
/// finalizer holds it until the rollback is done).
pub fn abort_requested(abort_annotation: Option<&str>, deleting: bool) -> bool {
    deleting || abort_annotation == Some("true")
}

/// `spec.deadline` is behind `now`. Checked before each pass, so no step starts after it.
pub fn deadline_passed(deadline: Option<jiff::Timestamp>, now: jiff::Timestamp) -> bool {
    deadline.is_some_and(|d| d < now)
}

/// Decides the next phase. Terminal phases stay.
pub fn next_phase(
    current: PlanPhase,
    spec: &DisruptionPlanSpec,
    facts: &PhaseFacts,
) -> PhaseDecision {
    use PlanPhase::*;
    if current.is_terminal() {
        return PhaseDecision::to(current);
    }
    if facts.abort_requested {
        return PhaseDecision::fail(
            Aborted,
            "aborted on request; nodes uncordoned and holds restored",
        );
    }
    let replacement_when = spec
        .replacement
        .as_ref()
        .map_or(ReplacementWhen::None, |r| r.when);
    let after_backup = || match (spec.mode, replacement_when) {
        (PlanMode::Release, _) => Draining,
        (PlanMode::Execute, ReplacementWhen::BeforeDrain) => Replacing,
        (PlanMode::Execute, _) => Draining,
    };
    let after_drain = || {
        if spec.termination.terminate_instance || spec.termination.delete_node {
            Terminating
        } else if replacement_when == ReplacementWhen::AfterDrain {
            Replacing
        } else {
            Completed
        }
    };
    let after_terminate = || {
        if replacement_when == ReplacementWhen::AfterDrain {
            Replacing
        } else {
            Completed
        }
    };

    match current {
        Pending if spec.dry_run => {
            PhaseDecision::with(Completed, "dry run: plan recorded, nothing changed")
        }
        // A plan that cannot start (its nodes missing, or pods the drain refuses) still has a deadline:
        // waiting past it would hold a slot and the disruptor's node for nothing.
        Pending if facts.planning_blocked && facts.deadline_passed => PhaseDecision::fail(
            Failed,
            "deadline passed before the plan could start (see the message above: its nodes were missing or its drain refused pods); nothing was changed",
        ),
        Pending if facts.planning_blocked => PhaseDecision::to(Pending),
        Pending if spec.mode == PlanMode::Execute => PhaseDecision::to(Cordoning),
        Pending if facts.backups == BackupsState::NotNeeded => PhaseDecision::to(after_backup()),
        Pending => PhaseDecision::to(BackingUp),
        BackingUp | Verifying => backup_step(current, spec, facts, after_backup()),
        Replacing if replacement_when == ReplacementWhen::BeforeDrain => {
            if facts.replacement_ready {
                PhaseDecision::to(Draining)
            } else {
                PhaseDecision::to(Replacing)
            }
        }
        Replacing => {
            if facts.replacement_ready {
                PhaseDecision::to(Completed)
            } else {
                PhaseDecision::to(Replacing)
            }
        }
        // BackingUp decides what the backups need (and moves on at once when none is needed or they are
        // verified already, as for a plan an older controller persisted in Cordoning after Verifying).
        Cordoning => PhaseDecision::to(if facts.nodes_cordoned {
            BackingUp
        } else {
            Cordoning
        }),
        Draining if spec.mode == PlanMode::Release => {
            if facts.nodes_gone {
                PhaseDecision::to(Completed)
            } else if facts.release_expired {
                PhaseDecision::with(
                    Completed,
                    "the nodes were not taken (the release window passed, or protected pods arrived that this run's backup does not cover): holds restored; the verified backup stays reusable for the next run",
                )
            } else {
                PhaseDecision::to(Draining)
            }
        }
        Draining => match &facts.drain {
            DrainState::InProgress => PhaseDecision::to(Draining),
            DrainState::Done => PhaseDecision::to(after_drain()),
            DrainState::Failed { message } => {
                PhaseDecision::fail(Failed, format!("drain failed: {message}"))
            }
        },
        Terminating => PhaseDecision::to(if facts.nodes_gone {
            after_terminate()
        } else {
            Terminating
        }),
        Completed | Failed | Aborted => PhaseDecision::to(current),
    }
}

fn backup_step(
    current: PlanPhase,
    spec: &DisruptionPlanSpec,
    facts: &PhaseFacts,
    next: PlanPhase,
) -> PhaseDecision {
    let best_effort = spec.backup.policy == BackupPolicy::BestEffort;
    match &facts.backups {
        BackupsState::NotNeeded | BackupsState::AllVerified => PhaseDecision::to(next),
        BackupsState::Failed { message } if best_effort => PhaseDecision::with(
            next,
            format!("backup failed, continuing (policy best-effort): {message}"),
        ),
        BackupsState::Failed { message } => PhaseDecision::fail(
            PlanPhase::Failed,
            format!("backup failed, node left in service (policy required): {message}"),
        ),
        // Past the deadline with the snapshots cut: the pods went at the cut; EC2 finishes the copy.
        BackupsState::InProgress if facts.snapshots_accepted => PhaseDecision::to(current),
        _ if facts.deadline_passed && best_effort => PhaseDecision::with(
            next,
            "deadline passed before the backup was verified; continuing (policy best-effort)",
        ),
        _ if facts.deadline_passed => PhaseDecision::fail(
            PlanPhase::Failed,
            "deadline passed before the backup was verified; the drain was not started (policy required)",
        ),
        BackupsState::AllCompleted => PhaseDecision::to(PlanPhase::Verifying),
        BackupsState::InProgress => PhaseDecision::to(current),
    }
}

/// [`summarize_backups`] when emergency EBS snapshot sets stand for some claims: a namespace whose every
/// claim is in a set needs no Velero backup (none is created for it); the others still do. The backups
/// are verified when Velero's are and every snapshot is `completed`; a snapshot in `error` fails them,
/// and so does the deadline passing before Velero saved the claims EC2 cannot (node-local volumes),
/// which are named.
pub fn summarize_with_snapshots(
    namespaces: &[String],
    records: &[BackupRecord],
    max_attempts: u32,
    sets: &[EmergencySnapshotSet],
    deadline_passed: bool,
) -> BackupsState {
    if sets.is_empty() {
        return summarize_backups(namespaces, records, max_attempts);
    }
    if let Some(set) = sets.iter().find(|s| s.error.is_some()) {
        return BackupsState::Failed {
            message: format!(
                "EC2 snapshots of node {} ({}): {}",
                set.node,
                set.instance_id,
                set.error.as_deref().unwrap_or_default()
            ),
        };
    }
    let velero = velero_namespaces(namespaces, records, sets);
    let state = summarize_backups(&velero, records, max_attempts);
    let accepted = sets.iter().all(EmergencySnapshotSet::accepted);
    let completed = accepted && sets.iter().all(|s| s.completed_at.is_some());
    if let BackupsState::Failed { .. } = state {
        return state;
    }
    let velero_done = matches!(state, BackupsState::NotNeeded | BackupsState::AllVerified);
    if deadline_passed && accepted && !velero_done {
        let unsaved: Vec<&str> = sets
            .iter()
            .flat_map(|s| s.unsaved.iter().map(|u| u.claim.as_str()))
            .collect();
        let snapshots: Vec<String> = sets
            .iter()
            .flat_map(|s| &s.volumes)
            .map(|v| {
                format!(
                    "{} by {}",
                    v.claim,
                    v.snapshot_id.as_deref().unwrap_or_default()
                )
            })
            .collect();
        return BackupsState::Failed {
            message: format!(
                "the deadline passed before Velero saved the claims no EC2 snapshot can save ({}); the EBS claims were saved by EC2 snapshots ({})",
                unsaved.join(", "),
                snapshots.join(", ")
            ),
        };
    }
    match state {
        _ if !completed => BackupsState::InProgress,
        BackupsState::NotNeeded | BackupsState::AllVerified => BackupsState::AllVerified,
        other => other,
    }
}

/// The namespaces that still need a Velero backup: those with a claim no emergency set holds.
pub fn velero_namespaces(
    namespaces: &[String],
    records: &[BackupRecord],
    sets: &[EmergencySnapshotSet],
) -> Vec<String> {
    let saved: std::collections::BTreeSet<&str> = sets
        .iter()
        .flat_map(|s| s.volumes.iter().map(|v| v.claim.as_str()))
        .collect();
    namespaces
        .iter()
        .filter(|ns| {
            records
                .iter()
                .filter(|r| &r.namespace == *ns)
                .max_by_key(|r| r.attempt)
                .is_none_or(|r| {
                    r.pvcs
                        .iter()
                        .any(|c| !saved.contains(format!("{ns}/{c}").as_str()))
                })
        })
        .cloned()
        .collect()
}

/// Combines the records of each needed namespace (the latest attempt decides) into one [`BackupsState`].
/// A failed latest attempt with attempts left counts as in progress: the retry is the controller's next step.
pub fn summarize_backups(
    namespaces: &[String],
    records: &[BackupRecord],
    max_attempts: u32,
) -> BackupsState {
    if namespaces.is_empty() {
        return BackupsState::NotNeeded;
    }
    let mut all_verified = true;
    for ns in namespaces {
        let Some(latest) = records
            .iter()
            .filter(|r| &r.namespace == ns)
            .max_by_key(|r| r.attempt)
        else {
            return BackupsState::InProgress;
        };
        if latest.verified {
            continue;
        }
        all_verified = false;
        let progress = match &latest.verification_error {
            Some(e) => BackupProgress::Failed(format!("verification failed: {e}")),
            None => classify_backup_phase(latest.phase.as_deref()),
        };
        match progress {
            BackupProgress::Completed => {}
            BackupProgress::Waiting => return BackupsState::InProgress,
            BackupProgress::Failed(reason) => {
                if latest.attempt >= max_attempts {
                    let detail = latest.message.clone().unwrap_or(reason);
                    return BackupsState::Failed {
                        message: format!(
                            "namespace {ns}: backup {} failed after {} attempts: {detail}",
                            latest.name, latest.attempt
                        ),
                    };
                }
                return BackupsState::InProgress;
            }
        }
    }
    if all_verified {
        BackupsState::AllVerified
    } else {
        BackupsState::AllCompleted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PlanPhase::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> DisruptionPlanSpec {
        let mut base = json!({"nodes": ["n1"]});
        if let (Some(b), Some(o)) = (base.as_object_mut(), v.as_object()) {
            b.extend(o.clone());
        }
        serde_json::from_value(base).expect("spec")
    }

    fn facts(backups: BackupsState) -> PhaseFacts {
        PhaseFacts {
            backups,
            ..PhaseFacts::default()
        }
    }

    /// Runs the machine with fixed facts until it stops moving.
    fn run(spec: &DisruptionPlanSpec, f: &PhaseFacts) -> Vec<PlanPhase> {
        let mut seen = vec![Pending];
        let mut cur = Pending;
        loop {
            let next = next_phase(cur, spec, f).phase;
            if next == cur {
                return seen;
            }
            seen.push(next);
            cur = next;
        }
    }

    fn all_done() -> PhaseFacts {
        PhaseFacts {
            backups: BackupsState::AllVerified,
            nodes_cordoned: true,
            drain: DrainState::Done,
            nodes_gone: true,
            replacement_ready: true,
            ..PhaseFacts::default()
        }
    }

    #[test]
    fn execute_happy_path() {
        assert_eq!(
            run(&spec(json!({})), &all_done()),
            [
                Pending,
                Cordoning,
                BackingUp,
                Draining,
                Terminating,
                Completed
            ]
        );
    }

    #[test]
    fn completed_backup_goes_through_verifying() {
        let s = spec(json!({}));
        assert_eq!(
            next_phase(BackingUp, &s, &facts(BackupsState::AllCompleted)).phase,
            Verifying
        );
        assert_eq!(
            next_phase(Verifying, &s, &facts(BackupsState::AllCompleted)).phase,
            Verifying
        );
        assert_eq!(
            next_phase(BackingUp, &s, &facts(BackupsState::InProgress)).phase,
            BackingUp
        );
        assert_eq!(
            next_phase(Verifying, &s, &facts(BackupsState::AllVerified)).phase,
            Draining
        );
    }

    #[test]
    fn execute_cordons_before_the_backup_and_a_failed_backup_rolls_it_back() {
        let s = spec(json!({}));
        assert_eq!(
            next_phase(Pending, &s, &facts(BackupsState::InProgress)).phase,
            Cordoning
        );
        assert_eq!(
            next_phase(Cordoning, &s, &facts(BackupsState::InProgress)).phase,
            Cordoning,
            "waits until the nodes are cordoned and tainted"
        );
        let mut cordoned = facts(BackupsState::InProgress);
        cordoned.nodes_cordoned = true;
        assert_eq!(next_phase(Cordoning, &s, &cordoned).phase, BackingUp);
        let failed = facts(BackupsState::Failed {
            message: "x".into(),
        });
        let d = next_phase(BackingUp, &s, &failed);
        assert_eq!((d.phase, d.rollback), (Failed, true));
        let mut abort = cordoned.clone();
        abort.abort_requested = true;
        let d = next_phase(Cordoning, &s, &abort);
        assert_eq!((d.phase, d.rollback), (Aborted, true));
    }

    #[test]
    fn a_plan_pending_refused_pods_waits_in_pending() {
        let mut f = facts(BackupsState::InProgress);
        f.planning_blocked = true;
        for mode in ["Execute", "Release"] {
            let d = next_phase(Pending, &spec(json!({"mode": mode})), &f);
            assert_eq!((d.phase, d.rollback), (Pending, false), "{mode}");
        }
        f.abort_requested = true;
        assert_eq!(next_phase(Pending, &spec(json!({})), &f).phase, Aborted);
    }

    #[test]
    fn a_blocked_plan_fails_once_its_deadline_passes_and_changes_nothing() {
        let mut f = facts(BackupsState::InProgress);
        f.planning_blocked = true;
        f.deadline_passed = true;
        for mode in ["Execute", "Release"] {
            let d = next_phase(Pending, &spec(json!({"mode": mode})), &f);
            assert_eq!(d.phase, Failed, "{mode}");
            let message = d.message.unwrap_or_default();
            assert!(message.contains("deadline passed"), "{message}");
        }
    }

    #[test]
    fn plans_persisted_by_the_older_order_resume() {
        // Cordoning used to come after Verifying: BackingUp then finds the backups verified.
        let s = spec(json!({}));
        let mut f = all_done();
        assert_eq!(next_phase(Cordoning, &s, &f).phase, BackingUp);
        assert_eq!(next_phase(BackingUp, &s, &f).phase, Draining);
        f.backups = BackupsState::NotNeeded;
        assert_eq!(next_phase(BackingUp, &s, &f).phase, Draining);
        // Phase names on the wire are unchanged.
        assert_eq!(
            serde_json::to_value(Cordoning).expect("json"),
            json!("Cordoning")
        );
    }

    #[test]
    fn replacement_positions() {
        let before =
            spec(json!({"replacement": {"when": "before-drain", "instanceTypes": ["m7i.large"]}}));
        assert_eq!(
            run(&before, &all_done()),
            [
                Pending,
                Cordoning,
                BackingUp,
                Replacing,
                Draining,
                Terminating,
                Completed
            ]
        );
        let after =
            spec(json!({"replacement": {"when": "after-drain", "instanceTypes": ["m7i.large"]}}));
        assert_eq!(
            run(&after, &all_done()),
            [
                Pending,
                Cordoning,
                BackingUp,
                Draining,
                Terminating,
                Replacing,
                Completed
            ]
        );
        let mut waiting = all_done();
        waiting.replacement_ready = false;
        assert_eq!(run(&before, &waiting).last(), Some(&Replacing));
    }

    #[test]
    fn release_mode_waits_for_the_autoscaler() {
        let s = spec(json!({"mode": "Release"}));
        assert_eq!(
            run(&s, &all_done()),
            [Pending, BackingUp, Draining, Completed]
        );
        let mut f = all_done();
        f.nodes_gone = false;
        assert_eq!(run(&s, &f).last(), Some(&Draining));
    }

    #[test]
    fn no_backup_needed_skips_the_backup_phases() {
        let s = spec(json!({}));
        assert_eq!(
            next_phase(Pending, &s, &facts(BackupsState::NotNeeded)).phase,
            Cordoning
        );
        assert_eq!(
            next_phase(BackingUp, &s, &facts(BackupsState::NotNeeded)).phase,
            Draining
        );
        let release = spec(json!({"mode": "Release"}));
        assert_eq!(
            next_phase(Pending, &release, &facts(BackupsState::NotNeeded)).phase,
            Draining,
            "Release does not cordon"
        );
    }

    #[test]
    fn no_termination_completes_after_drain() {
        let s = spec(json!({"termination": {"terminateInstance": false, "deleteNode": false}}));
        assert_eq!(
            run(&s, &all_done()),
            [Pending, Cordoning, BackingUp, Draining, Completed]
        );
    }

    #[test]
    fn dry_run_changes_nothing() {
        let d = next_phase(Pending, &spec(json!({"dryRun": true})), &all_done());
        assert_eq!(d.phase, Completed);
        assert!(!d.rollback);
    }

    #[test]
    fn required_backup_failure_fails_and_rolls_back() {
        let f = facts(BackupsState::Failed {
            message: "namespace db: gave up".into(),
        });
        let d = next_phase(BackingUp, &spec(json!({})), &f);
        assert_eq!(d.phase, Failed);
        assert!(d.rollback);
        assert!(
            d.message
                .as_deref()
                .is_some_and(|m| m.contains("node left in service") && m.contains("gave up"))
        );
    }

    #[test]
    fn best_effort_backup_failure_continues_with_a_message() {
        let f = facts(BackupsState::Failed {
            message: "x".into(),
        });
        let d = next_phase(
            Verifying,
            &spec(json!({"backup": {"policy": "best-effort"}})),
            &f,
        );
        assert_eq!(d.phase, Draining);
        assert!(!d.rollback);
        assert!(d.message.is_some());
    }

    #[test]
    fn deadline_during_backup() {
        let mut f = facts(BackupsState::InProgress);
        f.deadline_passed = true;
        assert_eq!(next_phase(BackingUp, &spec(json!({})), &f).phase, Failed);
        assert_eq!(
            next_phase(
                BackingUp,
                &spec(json!({"backup": {"policy": "best-effort"}})),
                &f
            )
            .phase,
            Draining
        );
    }

    #[test]
    fn drain_failure_rolls_back_and_abort_wins() {
        let mut f = all_done();
        f.drain = DrainState::Failed {
            message: "global timeout reached: 10m".into(),
        };
        let d = next_phase(Draining, &spec(json!({})), &f);
        assert_eq!((d.phase, d.rollback), (Failed, true));
        f.abort_requested = true;
        assert_eq!(next_phase(Terminating, &spec(json!({})), &f).phase, Aborted);
        assert_eq!(
            next_phase(Completed, &spec(json!({})), &f).phase,
            Completed,
            "terminal phases stay"
        );
    }

    fn rec(ns: &str, attempt: u32, phase: &str, verified: bool) -> BackupRecord {
        BackupRecord {
            name: format!("b-{ns}-{attempt}"),
            namespace: ns.into(),
            attempt,
            phase: Some(phase.into()),
            verified,
            ..Default::default()
        }
    }

    #[test]
    fn summarizing_records() {
        let ns = vec!["db".to_owned(), "mq".to_owned()];
        assert_eq!(summarize_backups(&[], &[], 3), BackupsState::NotNeeded);
        assert_eq!(
            summarize_backups(&ns, &[rec("db", 1, "Completed", true)], 3),
            BackupsState::InProgress
        );
        let done = [
            rec("db", 1, "Completed", true),
            rec("mq", 1, "Completed", true),
        ];
        assert_eq!(summarize_backups(&ns, &done, 3), BackupsState::AllVerified);
        let unverified = [
            rec("db", 1, "Completed", true),
            rec("mq", 1, "Completed", false),
        ];
        assert_eq!(
            summarize_backups(&ns, &unverified, 3),
            BackupsState::AllCompleted
        );
        let retrying = [
            rec("db", 1, "Completed", true),
            rec("mq", 1, "Failed", false),
        ];
        assert_eq!(
            summarize_backups(&ns, &retrying, 3),
            BackupsState::InProgress
        );
        let retried = [
            rec("db", 1, "Completed", true),
            rec("mq", 1, "Failed", false),
            rec("mq", 2, "Completed", true),
        ];
        assert_eq!(
            summarize_backups(&ns, &retried, 3),
            BackupsState::AllVerified
        );
        let mut bad_bucket = rec("mq", 3, "Completed", false);
        bad_bucket.verification_error = Some("PVC mq/data-rabbit-2 missing from volumeinfo".into());
        let failed_verify = [rec("db", 1, "Completed", true), bad_bucket];
        assert!(
            matches!(summarize_backups(&ns, &failed_verify, 3), BackupsState::Failed { message } if message.contains("verification failed"))
        );
        let exhausted = [
            rec("db", 1, "Completed", true),
            rec("mq", 3, "PartiallyFailed", false),
        ];
        match summarize_backups(&ns, &exhausted, 3) {
            BackupsState::Failed { message } => assert!(
                message.contains("namespace mq") && message.contains("3 attempts"),
                "{message}"
            ),
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn abort_by_annotation_or_deletion_and_deadlines_strictly_in_the_past() {
        assert!(abort_requested(Some("true"), false));
        assert!(abort_requested(None, true));
        assert!(!abort_requested(Some("yes"), false));
        assert!(!abort_requested(None, false));
        let now: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        assert!(!deadline_passed(None, now));
        assert!(!deadline_passed(Some(now), now));
        assert!(deadline_passed(
            Some(now - jiff::SignedDuration::from_secs(1)),
            now
        ));
    }

    /// Every spec shape and every sequence of observations: under `backup.policy: required`, the phase
    /// machine reaches Draining (where evictions happen, each through the drain gate) only along a path
    /// that left the backup phases with every backup verified or none needed. Explores all reachable
    /// (phase, verified) states from Pending.
    #[test]
    fn no_path_reaches_draining_without_verified_backups_under_policy_required() {
        let backups = [
            BackupsState::NotNeeded,
            BackupsState::InProgress,
            BackupsState::AllCompleted,
            BackupsState::AllVerified,
            BackupsState::Failed {
                message: "x".into(),
            },
        ];
        let drains = [
            DrainState::InProgress,
            DrainState::Done,
            DrainState::Failed {
                message: "x".into(),
            },
        ];
        let mut all_facts = Vec::new();
        for bits in 0..256u32 {
            for b in &backups {
                for d in &drains {
                    all_facts.push(PhaseFacts {
                        abort_requested: bits & 1 != 0,
                        planning_blocked: bits & 32 != 0,
                        deadline_passed: bits & 2 != 0,
                        backups: b.clone(),
                        nodes_cordoned: bits & 4 != 0,
                        drain: d.clone(),
                        nodes_gone: bits & 8 != 0,
                        replacement_ready: bits & 16 != 0,
                        release_expired: bits & 64 != 0,
                        snapshots_accepted: bits & 128 != 0,
                    });
                }
            }
        }
        // Cordoning sits between Pending and BackingUp: still before the backup is decided.
        let backup_phases = [Pending, Cordoning, BackingUp, Verifying];
        let mut specs = 0;
        for mode in ["Execute", "Release"] {
            for when in [None, Some("before-drain"), Some("after-drain")] {
                for policy in ["required", "best-effort", "skip"] {
                    for (terminate, delete) in
                        [(true, true), (true, false), (false, true), (false, false)]
                    {
                        let mut v = json!({
                            "nodes": ["n"], "mode": mode, "backup": {"policy": policy},
                            "termination": {"terminateInstance": terminate, "deleteNode": delete},
                        });
                        if let Some(w) = when {
                            v["replacement"] =
                                json!({"when": w, "imageId": "ami-0123456789abcdef0"});
                        }
                        let spec = spec(v);
                        specs += 1;
                        let mut seen = std::collections::BTreeSet::new();
                        let mut todo = vec![(Pending, false)];
                        while let Some((phase, verified)) = todo.pop() {
                            if !seen.insert((phase, verified)) {
                                continue;
                            }
                            for f in &all_facts {
                                let d = next_phase(phase, &spec, f);
                                let leaves_backup = backup_phases.contains(&phase)
                                    && !backup_phases.contains(&d.phase);
                                let ok = matches!(
                                    f.backups,
                                    BackupsState::AllVerified | BackupsState::NotNeeded
                                );
                                let verified = verified || (leaves_backup && ok);
                                if d.phase == Draining
                                    && spec.backup.policy == BackupPolicy::Required
                                {
                                    assert!(
                                        verified,
                                        "{mode}/{when:?}/{policy}: {phase:?} -> Draining with {f:?} and no verified backup on the path"
                                    );
                                }
                                todo.push((d.phase, verified));
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(specs, 72);
    }

    fn set(claims: &[(&str, Option<&str>)], completed: bool) -> EmergencySnapshotSet {
        use crate::api::status::EmergencySnapshot;
        EmergencySnapshotSet {
            node: "n1".into(),
            instance_id: "i-1".into(),
            volumes: claims
                .iter()
                .enumerate()
                .map(|(i, (c, snap))| EmergencySnapshot {
                    claim: (*c).into(),
                    volume_id: format!("vol-{i}"),
                    snapshot_id: snap.map(str::to_string),
                    ..Default::default()
                })
                .collect(),
            completed_at: completed.then(|| {
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    "2026-12-03T10:00:00Z".parse().expect("a time"),
                )
            }),
            ..Default::default()
        }
    }

    fn queued(ns: &str, pvcs: &[&str]) -> BackupRecord {
        BackupRecord {
            name: format!("b-{ns}"),
            namespace: ns.into(),
            pvcs: pvcs.iter().map(|p| p.to_string()).collect(),
            attempt: 1,
            phase: Some("InProgress".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_namespace_the_snapshots_save_needs_no_velero_and_completes_with_them() {
        let ns = vec!["db".to_string()];
        let records = vec![queued("db", &["data-0"])];
        assert!(velero_namespaces(&ns, &records, &[set(&[("db/data-0", None)], false)]).is_empty());
        // Intent only, then accepted and pending: in progress, even past the deadline.
        for s in [
            set(&[("db/data-0", None)], false),
            set(&[("db/data-0", Some("snap-1"))], false),
        ] {
            assert_eq!(
                summarize_with_snapshots(&ns, &records, 3, &[s], true),
                BackupsState::InProgress
            );
        }
        assert_eq!(
            summarize_with_snapshots(
                &ns,
                &records,
                3,
                &[set(&[("db/data-0", Some("snap-1"))], true)],
                false
            ),
            BackupsState::AllVerified,
            "Velero's own backup of the namespace is not waited for"
        );
        let mut failed = set(&[("db/data-0", Some("snap-1"))], false);
        failed.error = Some("snapshot snap-1 ended in error".into());
        assert!(matches!(
            summarize_with_snapshots(&ns, &records, 3, &[failed], false),
            BackupsState::Failed { message } if message.contains("snap-1") && message.contains("n1")
        ));
        // No set: today's rule.
        assert_eq!(
            summarize_with_snapshots(&ns, &records, 3, &[], false),
            summarize_backups(&ns, &records, 3)
        );
    }

    #[test]
    fn a_node_local_claim_still_waits_for_velero_and_is_named_when_the_deadline_passes() {
        let ns = vec!["db".to_string()];
        let records = vec![queued("db", &["data-0", "scratch-0"])];
        let mut s = set(&[("db/data-0", Some("snap-1"))], true);
        s.unsaved = vec![crate::api::status::UnsavedVolume {
            claim: "db/scratch-0".into(),
            why: "node-local".into(),
        }];
        assert_eq!(
            velero_namespaces(&ns, &records, std::slice::from_ref(&s)),
            ns
        );
        assert_eq!(
            summarize_with_snapshots(&ns, &records, 3, std::slice::from_ref(&s), false),
            BackupsState::InProgress
        );
        let BackupsState::Failed { message } =
            summarize_with_snapshots(&ns, &records, 3, std::slice::from_ref(&s), true)
        else {
            panic!("the deadline passed with a node-local claim unsaved");
        };
        assert!(
            message.contains("db/scratch-0") && message.contains("db/data-0 by snap-1"),
            "{message}"
        );
        let mut verified = records.clone();
        verified[0].phase = Some("Completed".into());
        verified[0].verified = true;
        assert_eq!(
            summarize_with_snapshots(&ns, &verified, 3, &[s], true),
            BackupsState::AllVerified
        );
    }

    #[test]
    fn accepted_snapshots_keep_a_plan_past_its_deadline_until_they_complete() {
        let s = spec(json!({"mode": "Release"}));
        let mut f = facts(BackupsState::InProgress);
        f.deadline_passed = true;
        assert_eq!(next_phase(BackingUp, &s, &f).phase, Failed);
        f.snapshots_accepted = true;
        assert_eq!(next_phase(BackingUp, &s, &f).phase, BackingUp);
        f.backups = BackupsState::AllVerified;
        assert_eq!(next_phase(BackingUp, &s, &f).phase, Draining);
    }

    #[test]
    fn a_release_plan_completes_when_the_nodes_go_or_its_window_passes() {
        let release = spec(json!({"mode": "Release"}));
        let waiting = facts(BackupsState::AllVerified);
        assert_eq!(next_phase(Draining, &release, &waiting).phase, Draining);
        let gone = PhaseFacts {
            nodes_gone: true,
            ..facts(BackupsState::AllVerified)
        };
        assert_eq!(
            next_phase(Draining, &release, &gone),
            PhaseDecision::to(Completed)
        );
        let expired = PhaseFacts {
            release_expired: true,
            ..facts(BackupsState::AllVerified)
        };
        let d = next_phase(Draining, &release, &expired);
        assert_eq!(d.phase, Completed);
        assert!(
            !d.rollback,
            "the holds are restored by the step, nothing to roll back"
        );
        assert!(d.message.unwrap_or_default().contains("release window"));
    }
}
