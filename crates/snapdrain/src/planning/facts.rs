//! The phase machine's facts, read from the plan and its written status alone: a restarted controller
//! decides exactly as the one before it would have, and the invariant test can be stated over statuses.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::api::plan::PlanMode;
use crate::api::status::{BackupRecord, DisruptionPlanStatus, NodePhase};
use crate::api::{ABORT_ANNOTATION, DisruptionPlan, ValidSpec};

use super::drain::drain_verdict;
use super::phase::{PhaseFacts, abort_requested, deadline_passed, summarize_with_snapshots};

/// Namespaces a plan backs up (one record per attempt each), in name order.
pub fn backup_namespaces(records: &[BackupRecord]) -> Vec<String> {
    let set: std::collections::BTreeSet<&str> =
        records.iter().map(|r| r.namespace.as_str()).collect();
    set.into_iter().map(str::to_owned).collect()
}

impl PhaseFacts {
    /// The facts for the plan's current phase, from its metadata, spec and written status at `now`.
    pub fn of(
        plan: &DisruptionPlan,
        valid: &ValidSpec,
        status: &DisruptionPlanStatus,
        now: Timestamp,
    ) -> Self {
        let nodes = &status.nodes;
        let all = |f: fn(NodePhase) -> bool| !nodes.is_empty() && nodes.iter().all(|n| f(n.phase));
        let release = status.release.as_ref().map(|r| r.outcome);
        let drain = if plan.spec.mode == PlanMode::Execute {
            let blocked: Vec<String> = nodes
                .iter()
                .filter(|n| !matches!(n.phase, NodePhase::Drained | NodePhase::Gone))
                .filter_map(|n| n.blocked_by.clone())
                .collect();
            let started = status.phase_started_at.as_ref().map_or(now, |t| t.0);
            drain_verdict(
                all(|p| matches!(p, NodePhase::Drained | NodePhase::Gone)),
                started,
                now,
                valid.drain_timeout,
                &blocked,
            )
        } else {
            Default::default()
        };
        let deadline_passed = deadline_passed(plan.spec.deadline.as_ref().map(|d| d.0), now);
        let sets = &status.emergency_snapshots;
        Self {
            abort_requested: abort_requested(
                plan.annotations().get(ABORT_ANNOTATION).map(String::as_str),
                plan.metadata.deletion_timestamp.is_some(),
            ),
            planning_blocked: nodes.is_empty(),
            deadline_passed,
            backups: summarize_with_snapshots(
                &backup_namespaces(&status.backups),
                &status.backups,
                plan.spec.backup.max_attempts,
                sets,
                deadline_passed,
            ),
            nodes_cordoned: all(|p| {
                !matches!(
                    p,
                    NodePhase::Pending | NodePhase::BackingUp | NodePhase::Released
                )
            }),
            drain,
            nodes_gone: match plan.spec.mode {
                PlanMode::Release => release.is_some_and(|r| r.taken()),
                PlanMode::Execute => all(|p| matches!(p, NodePhase::Gone | NodePhase::Kept)),
            },
            replacement_ready: plan.spec.replacement.is_none()
                || (!nodes.is_empty()
                    && nodes
                        .iter()
                        .all(|n| n.replacement.as_ref().is_some_and(|r| r.ready))),
            release_expired: release.is_some_and(|r| !r.taken()),
            snapshots_accepted: !sets.is_empty() && sets.iter().all(|s| s.accepted()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::status::{NodeProgress, ReleaseEnd, ReleaseOutcome, ReplacementProgress};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
    use serde_json::json;

    fn plan(spec: serde_json::Value) -> DisruptionPlan {
        serde_json::from_value(json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": "p"}, "spec": spec
        }))
        .expect("a plan")
    }

    fn node(phase: NodePhase) -> NodeProgress {
        NodeProgress {
            name: "n1".into(),
            phase,
            ..NodeProgress::default()
        }
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("a timestamp")
    }

    #[test]
    fn a_plan_with_no_recorded_nodes_is_blocked_and_not_cordoned() {
        let p = plan(json!({"nodes": ["n1"]}));
        let f = PhaseFacts::of(
            &p,
            &ValidSpec::default(),
            &DisruptionPlanStatus::default(),
            at("2026-12-03T10:00:00Z"),
        );
        assert!(f.planning_blocked && !f.nodes_cordoned && !f.nodes_gone);
    }

    #[test]
    fn drain_times_out_from_the_written_phase_start_naming_what_blocks() {
        let p = plan(json!({"nodes": ["n1", "n2"]}));
        let valid = ValidSpec {
            drain_timeout: Some(std::time::Duration::from_secs(60)),
            ..ValidSpec::default()
        };
        let mut blocked = node(NodePhase::Draining);
        blocked.blocked_by = Some("shop/db-0: PDB".into());
        let status = DisruptionPlanStatus {
            nodes: vec![node(NodePhase::Drained), blocked],
            phase_started_at: Some(MicroTime(at("2026-12-03T10:00:00Z"))),
            ..Default::default()
        };
        let within = PhaseFacts::of(&p, &valid, &status, at("2026-12-03T10:00:30Z"));
        assert_eq!(within.drain, crate::planning::DrainState::InProgress);
        let late = PhaseFacts::of(&p, &valid, &status, at("2026-12-03T10:02:00Z"));
        assert!(
            matches!(late.drain, crate::planning::DrainState::Failed { ref message } if message.contains("shop/db-0: PDB"))
        );
    }

    #[test]
    fn termination_is_done_when_every_node_is_gone_or_kept() {
        let p = plan(json!({"nodes": ["n1"]}));
        let now = at("2026-12-03T10:00:00Z");
        let of = |phases: &[NodePhase]| {
            let status = DisruptionPlanStatus {
                nodes: phases.iter().map(|p| node(*p)).collect(),
                ..Default::default()
            };
            PhaseFacts::of(&p, &ValidSpec::default(), &status, now).nodes_gone
        };
        assert!(of(&[NodePhase::Gone, NodePhase::Kept]));
        assert!(!of(&[NodePhase::Gone, NodePhase::Terminating]));
    }

    #[test]
    fn a_release_ends_taken_or_expired_as_written() {
        let p = plan(json!({"nodes": ["n1"], "mode": "Release"}));
        let now = at("2026-12-03T10:00:00Z");
        let of = |outcome: Option<ReleaseOutcome>| {
            let status = DisruptionPlanStatus {
                nodes: vec![node(NodePhase::Released)],
                release: outcome.map(|outcome| ReleaseEnd {
                    ended_at: Time(now),
                    outcome,
                }),
                ..Default::default()
            };
            let f = PhaseFacts::of(&p, &ValidSpec::default(), &status, now);
            (f.nodes_gone, f.release_expired)
        };
        assert_eq!(of(None), (false, false));
        assert_eq!(of(Some(ReleaseOutcome::PodsLeft)), (true, false));
        assert_eq!(of(Some(ReleaseOutcome::WindowPassed)), (false, true));
    }

    #[test]
    fn replacements_are_ready_only_when_every_node_has_a_ready_one() {
        let p = plan(
            json!({"nodes": ["n1"], "replacement": {"when": "after-drain", "instanceTypes": ["m5.large"]}}),
        );
        let now = at("2026-12-03T10:00:00Z");
        let mut n = node(NodePhase::Gone);
        n.replacement = Some(ReplacementProgress::default());
        let mut status = DisruptionPlanStatus {
            nodes: vec![n],
            ..Default::default()
        };
        assert!(!PhaseFacts::of(&p, &ValidSpec::default(), &status, now).replacement_ready);
        if let Some(r) = status.nodes[0].replacement.as_mut() {
            r.ready = true;
        }
        assert!(PhaseFacts::of(&p, &ValidSpec::default(), &status, now).replacement_ready);
        let none = plan(json!({"nodes": ["n1"]}));
        assert!(
            PhaseFacts::of(
                &none,
                &ValidSpec::default(),
                &DisruptionPlanStatus::default(),
                now
            )
            .replacement_ready
        );
    }

    /// The safety invariant stated over written statuses, not hand-made facts: from every phase before the
    /// drain, whatever the status says (any mix of backup attempts per namespace, node phases, release
    /// ends, aborts and deadlines), a plan under `backup.policy: required` moves on to anything but a
    /// failure only when its status has no backup to make or every namespace's latest attempt is
    /// verified. The judge reads the records itself.
    #[test]
    fn no_written_status_leaves_the_backup_phases_unverified_under_policy_required() {
        use crate::api::status::PlanPhase::{self, *};
        let at = |s: &str| -> Timestamp { s.parse().expect("a timestamp") };
        let now = at("2026-12-03T10:00:00Z");
        let record = |ns: &str, attempt: u32, phase: Option<&str>, verified: bool, error: bool| {
            BackupRecord {
                name: format!("{ns}-{attempt}"),
                namespace: ns.into(),
                attempt,
                phase: phase.map(str::to_owned),
                verified,
                verification_error: error.then(|| "missing".to_string()),
                ..BackupRecord::default()
            }
        };
        let namespace_states = |ns: &str| -> Vec<Vec<BackupRecord>> {
            vec![
                vec![],
                vec![record(ns, 1, None, false, false)],
                vec![record(ns, 1, Some("InProgress"), false, false)],
                vec![record(ns, 1, Some("Completed"), false, false)],
                vec![record(ns, 1, Some("Completed"), true, false)],
                vec![record(ns, 1, Some("Completed"), false, true)],
                vec![record(ns, 1, Some("Failed"), false, false)],
                vec![record(ns, 3, Some("PartiallyFailed"), false, false)],
                vec![
                    record(ns, 1, Some("Completed"), true, false),
                    record(ns, 2, Some("InProgress"), false, false),
                ],
                vec![
                    record(ns, 1, Some("Failed"), false, false),
                    record(ns, 2, Some("Completed"), true, false),
                ],
            ]
        };
        // The judge: no records, or the highest attempt of every namespace verified.
        let verified = |records: &[BackupRecord]| {
            let mut latest: std::collections::BTreeMap<&str, &BackupRecord> = Default::default();
            for r in records {
                if latest
                    .get(r.namespace.as_str())
                    .is_none_or(|l| l.attempt < r.attempt)
                {
                    latest.insert(&r.namespace, r);
                }
            }
            latest.values().all(|r| r.verified)
        };
        let mut statuses = Vec::new();
        for a in namespace_states("a") {
            for b in namespace_states("b") {
                for node_phase in [
                    NodePhase::Pending,
                    NodePhase::Cordoned,
                    NodePhase::Drained,
                    NodePhase::Gone,
                ] {
                    for release in [
                        None,
                        Some(ReleaseOutcome::PodsLeft),
                        Some(ReleaseOutcome::WindowPassed),
                    ] {
                        statuses.push(DisruptionPlanStatus {
                            backups: a.iter().chain(b.iter()).cloned().collect(),
                            nodes: vec![NodeProgress {
                                name: "n1".into(),
                                phase: node_phase,
                                ..NodeProgress::default()
                            }],
                            release: release.map(|outcome| ReleaseEnd {
                                ended_at: Time(now),
                                outcome,
                            }),
                            ..Default::default()
                        });
                    }
                }
            }
        }
        let before_drain = [Pending, Cordoning, BackingUp, Verifying];
        let allowed_unverified =
            |p: PlanPhase| before_drain.contains(&p) || matches!(p, Failed | Aborted);
        let mut checked = 0u32;
        for mode in ["Execute", "Release"] {
            for when in [None, Some("before-drain"), Some("after-drain")] {
                for (terminate, delete) in
                    [(true, true), (false, true), (true, false), (false, false)]
                {
                    for (abort, deadline) in
                        [(false, false), (true, false), (false, true), (true, true)]
                    {
                        let mut v = json!({
                            "nodes": ["n1"], "mode": mode, "backup": {"policy": "required", "maxAttempts": 3},
                            "termination": {"terminateInstance": terminate, "deleteNode": delete},
                        });
                        if let Some(w) = when.filter(|_| mode == "Execute") {
                            v["replacement"] =
                                json!({"when": w, "imageId": "ami-0123456789abcdef0"});
                        }
                        if deadline {
                            v["deadline"] = json!("2026-12-03T09:00:00Z");
                        }
                        let mut p = plan(v);
                        if abort {
                            p.metadata.annotations =
                                Some([(ABORT_ANNOTATION.to_string(), "true".to_string())].into());
                        }
                        for status in &statuses {
                            for phase in before_drain {
                                let facts = PhaseFacts::of(&p, &ValidSpec::default(), status, now);
                                let to = crate::planning::next_phase(phase, &p.spec, &facts).phase;
                                assert!(
                                    allowed_unverified(to) || verified(&status.backups),
                                    "{mode}/{when:?}: {phase:?} -> {to:?} with unverified backups {:?}",
                                    status.backups
                                );
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 2 * 3 * 4 * 4 * 1200 * 4);
    }
}
