//! Drain decisions: which planned evictions may be sent in this pass (the safety gate for protected pods
//! and Karpenter's tier order), and whether the drain is done, still going, or out of time.

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::evictions::PlannedEviction;
use super::phase::DrainState;
use crate::api::plan::BackupPolicy;
use crate::api::status::{BackupRecord, EvictionTarget};

/// PVC claims a verified backup record covers, as `ns/pvc`.
pub fn covered_claims(records: &[BackupRecord]) -> BTreeSet<String> {
    records
        .iter()
        .filter(|r| r.verified)
        .flat_map(|r| r.pvcs.iter().map(move |p| format!("{}/{p}", r.namespace)))
        .collect()
}

/// May this pod be evicted now?
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    Allow,
    /// A protected pod whose claims (`ns/pvc`) are not all covered by a verified backup.
    Hold {
        missing: Vec<String>,
    },
}

/// The promise, as a decision: under `backup.policy: required`, a protected pod is evicted only when every
/// one of its PVC claims (`ns/pvc`) is covered by a verified backup. Other policies and unprotected pods
/// pass.
pub fn gate_eviction(
    protected: bool,
    claims: &[String],
    covered: &BTreeSet<String>,
    policy: BackupPolicy,
) -> Gate {
    if !protected || policy != BackupPolicy::Required {
        return Gate::Allow;
    }
    let missing: Vec<String> = claims
        .iter()
        .filter(|c| !covered.contains(*c))
        .cloned()
        .collect();
    if missing.is_empty() {
        Gate::Allow
    } else {
        Gate::Hold { missing }
    }
}

/// The evictions to send in this pass, and a line for each one held back.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    pub send: Vec<PlannedEviction>,
    pub held: Vec<String>,
    /// Of the held, the protected pods (`namespace/name`) no verified backup of the plan covers: they
    /// came after the plan was decided, and no amount of waiting covers them.
    pub uncovered: Vec<String>,
}

/// True when the only pods left on a node (`remaining`, `namespace/name`) are protected pods no backup
/// of the plan covers (`uncovered`): the drain can never finish, so the plan should end (and be run
/// again to back them up) rather than wait forever.
pub fn only_uncovered_left(remaining: &[String], uncovered: &[String]) -> bool {
    !uncovered.is_empty() && remaining.iter().all(|p| uncovered.contains(p))
}

/// Karpenter's order: only the first tier that still has pods is evicted in a pass, and pods already
/// terminating are waited for, not evicted again. Pods with an active `karpenter.sh/do-not-disrupt` and
/// pods whose last eviction was refused and whose backoff (in `targets`) runs past `now` are held; the
/// rest then pass [`gate_eviction`]; `claims_of` gives a planned pod's claims as `ns/pvc`.
pub fn select_batch(
    evictions: &[PlannedEviction],
    claims_of: impl Fn(&PlannedEviction) -> Vec<String>,
    records: &[BackupRecord],
    policy: BackupPolicy,
    targets: &[EvictionTarget],
    now: Timestamp,
) -> Batch {
    let covered = covered_claims(records);
    let first_tier = evictions.iter().map(|e| e.tier).min();
    let mut batch = Batch::default();
    for e in evictions {
        if e.terminating || Some(e.tier) != first_tier {
            continue;
        }
        if e.do_not_disrupt {
            batch.held.push(format!(
                "{}/{}: karpenter.sh/do-not-disrupt is set; not evicted until it is removed (or spec.drain.force is set)",
                e.namespace, e.name
            ));
            continue;
        }
        if let Some(t) = targets
            .iter()
            .find(|t| Some(t.uid.as_str()) == e.uid.as_deref())
            .filter(|t| backing_off(t, now))
        {
            batch.held.push(format!(
                "{}/{}: eviction refused {} time(s), next try at {}: {}",
                e.namespace,
                e.name,
                t.failures,
                t.retry_at
                    .as_ref()
                    .map(|r| r.0.to_string())
                    .unwrap_or_default(),
                t.last_error.as_deref().unwrap_or("no message")
            ));
            continue;
        }
        match gate_eviction(e.protected, &claims_of(e), &covered, policy) {
            Gate::Allow => batch.send.push(e.clone()),
            Gate::Hold { missing } => {
                batch.held.push(format!(
                    "{}/{}: no verified backup covers {} (it came after the plan was decided); not evicted",
                    e.namespace,
                    e.name,
                    missing.join(", ")
                ));
                batch.uncovered.push(format!("{}/{}", e.namespace, e.name));
            }
        }
    }
    batch
}

/// First wait after a refused (`Failed`) eviction; it doubles with each further refusal.
pub const FAILED_EVICTION_BACKOFF: Duration = Duration::from_secs(5);
/// The longest wait between two tries of a refused eviction.
pub const FAILED_EVICTION_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The wait after `failures` consecutive refusals: 5 s, 10 s, 20 s, ... up to 5 min. A refusal (RBAC 403,
/// a webhook's 400) does not go away by asking again at once, but a person may fix it, so the drain
/// keeps trying, less and less often, until `drain.timeout` or the deadline.
pub fn failed_eviction_backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FAILED_EVICTION_BACKOFF
        .saturating_mul(1u32 << doublings)
        .min(FAILED_EVICTION_BACKOFF_MAX)
}

/// True while the target's backoff runs.
pub fn backing_off(target: &EvictionTarget, now: Timestamp) -> bool {
    target.retry_at.as_ref().is_some_and(|t| t.0 > now)
}

/// Records a refused eviction: one more failure, and the next try after the backoff.
pub fn record_refusal(target: &mut EvictionTarget, message: &str, now: Timestamp) {
    target.failures = target.failures.saturating_add(1);
    let wait = jiff::SignedDuration::try_from(failed_eviction_backoff(target.failures))
        .unwrap_or(jiff::SignedDuration::from_secs(300));
    target.retry_at = Some(Time(now.saturating_add(wait).unwrap_or(now)));
    target.last_error = Some(super::status_size::bounded(
        message,
        super::status_size::MAX_REFUSAL,
    ));
}

/// The pods the drain will wait for, fixed on its first pass: every planned eviction with a UID. Only
/// the UID is kept (a plan may hold thousands: [`super::status_size`]).
pub fn eviction_targets(evictions: &[PlannedEviction]) -> Vec<EvictionTarget> {
    evictions
        .iter()
        .filter_map(|e| {
            Some(EvictionTarget {
                uid: e.uid.clone()?,
                ..EvictionTarget::default()
            })
        })
        .collect()
}

/// This pass's planned evictions that are targets (by UID): pods that came later (tolerating the taint,
/// or bound with `spec.nodeName`) are not the drain's business.
pub fn targeted(evictions: &[PlannedEviction], targets: &[EvictionTarget]) -> Vec<PlannedEviction> {
    let uids: BTreeSet<&str> = targets.iter().map(|t| t.uid.as_str()).collect();
    evictions
        .iter()
        .filter(|e| e.uid.as_deref().is_some_and(|u| uids.contains(u)))
        .cloned()
        .collect()
}

/// Targets still on the node: their UID is among the node's pods (terminating ones included).
pub fn remaining_targets<'a>(
    targets: &'a [EvictionTarget],
    present_uids: &BTreeSet<String>,
) -> Vec<&'a EvictionTarget> {
    targets
        .iter()
        .filter(|t| present_uids.contains(&t.uid))
        .collect()
}

/// What the drain of one node waits for, for `status.message`: the targets still there (`remaining`,
/// as `namespace/name`; a few by name) and what blocks them.
pub fn waiting_message(
    node: &str,
    remaining: &[String],
    total: usize,
    blocked: &[String],
) -> String {
    const SHOWN: usize = 3;
    let mut names: Vec<String> = remaining.iter().take(SHOWN).cloned().collect();
    if remaining.len() > SHOWN {
        names.push(format!("{} more", remaining.len() - SHOWN));
    }
    let mut msg = if remaining.is_empty() {
        format!("node {node}: evicted pods are gone; waiting for their VolumeAttachments to detach")
    } else {
        format!(
            "node {node}: waiting for {} of {total} pods planned for eviction to leave ({})",
            remaining.len(),
            names.join(", ")
        )
    };
    if !blocked.is_empty() {
        msg.push_str("; blocked: ");
        msg.push_str(&blocked.join("; "));
    }
    msg
}

/// Where the drain stands after a pass: done when every node is drained; failed once `drain.timeout`
/// (counted from the phase's start) has passed with nodes left; otherwise still in progress.
pub fn drain_verdict(
    all_done: bool,
    started: Timestamp,
    now: Timestamp,
    timeout: Option<Duration>,
    blocked: &[String],
) -> DrainState {
    if all_done {
        return DrainState::Done;
    }
    match timeout {
        Some(t) if now > started && now.duration_since(started).unsigned_abs() > t => {
            DrainState::Failed {
                message: format!(
                    "drain.timeout ({t:?}) passed; still blocked: {}",
                    if blocked.is_empty() {
                        "pods still terminating".to_string()
                    } else {
                        blocked.join("; ")
                    }
                ),
            }
        }
        _ => DrainState::InProgress,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planning::evictions::EvictionTier;

    fn record(ns: &str, pvcs: &[&str], verified: bool) -> BackupRecord {
        BackupRecord {
            name: format!("b-{ns}"),
            namespace: ns.into(),
            pvcs: pvcs.iter().map(|p| p.to_string()).collect(),
            verified,
            ..Default::default()
        }
    }

    fn planned(name: &str, tier: EvictionTier, protected: bool) -> PlannedEviction {
        PlannedEviction {
            namespace: "db".into(),
            name: name.into(),
            uid: Some(format!("uid-{name}")),
            tier,
            protected,
            pdbs: Vec::new(),
            terminating: false,
            do_not_disrupt: false,
        }
    }

    fn claims(e: &PlannedEviction) -> Vec<String> {
        if e.protected {
            vec![format!("db/data-{}", e.name)]
        } else {
            Vec::new()
        }
    }

    /// Exhaustive over three claims, every set of backup records over them (each verified or not, in the
    /// pod's namespace or another) and every policy: a protected pod is allowed exactly when each of its
    /// claims is in a verified record of its own namespace, or the policy is not `required`.
    #[test]
    fn the_gate_allows_a_protected_pod_only_when_every_claim_is_verified() {
        let all = ["a", "b", "c"];
        let subsets = |mask: u32| -> Vec<&str> {
            all.iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, c)| *c)
                .collect()
        };
        for pod_mask in 1..8u32 {
            let pod_claims: Vec<String> = subsets(pod_mask)
                .iter()
                .map(|c| format!("db/{c}"))
                .collect();
            // Two records, each: which claims, verified or not, which namespace.
            for r1 in 0..8u32 {
                for r2 in 0..8u32 {
                    for flags in 0..16u32 {
                        let records = [
                            record(
                                if flags & 4 == 0 { "db" } else { "other" },
                                &subsets(r1),
                                flags & 1 != 0,
                            ),
                            record(
                                if flags & 8 == 0 { "db" } else { "other" },
                                &subsets(r2),
                                flags & 2 != 0,
                            ),
                        ];
                        // The oracle: plain set reasoning over the records, not `covered_claims`.
                        let verified_in_db = |c: &str| {
                            records.iter().any(|r| {
                                r.verified && r.namespace == "db" && r.pvcs.iter().any(|p| p == c)
                            })
                        };
                        let should_allow = subsets(pod_mask).iter().all(|c| verified_in_db(c));
                        let covered = covered_claims(&records);
                        for policy in [
                            BackupPolicy::Required,
                            BackupPolicy::BestEffort,
                            BackupPolicy::Skip,
                        ] {
                            let got = gate_eviction(true, &pod_claims, &covered, policy);
                            let want_allow = should_allow || policy != BackupPolicy::Required;
                            assert_eq!(
                                got == Gate::Allow,
                                want_allow,
                                "claims {pod_claims:?}, records {records:?}, {policy:?}: {got:?}"
                            );
                            assert_eq!(
                                gate_eviction(false, &pod_claims, &covered, policy),
                                Gate::Allow
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_batch_is_the_first_tier_without_terminating_or_held_pods() {
        let mut terminating = planned("web-2", EvictionTier::NonCritical, false);
        terminating.terminating = true;
        let evictions = vec![
            planned("web-1", EvictionTier::NonCritical, false),
            terminating,
            planned("pg-0", EvictionTier::NonCritical, true),
            planned("pg-1", EvictionTier::NonCritical, true),
            planned("dns", EvictionTier::Critical, false),
        ];
        let records = [
            record("db", &["data-pg-0"], true),
            record("db", &["data-pg-1"], false),
        ];
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let b = select_batch(
            &evictions,
            claims,
            &records,
            BackupPolicy::Required,
            &[],
            now,
        );
        let sent: Vec<&str> = b.send.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(sent, ["web-1", "pg-0"]);
        assert_eq!(b.held.len(), 1);
        assert!(
            b.held[0].starts_with("db/pg-1: no verified backup covers db/data-pg-1"),
            "{:?}",
            b.held
        );
        assert_eq!(b.uncovered, ["db/pg-1"]);

        // Once the first tier is gone, the next one goes.
        let rest = vec![planned("dns", EvictionTier::Critical, false)];
        let b = select_batch(&rest, claims, &records, BackupPolicy::Required, &[], now);
        assert_eq!(b.send.len(), 1);
    }

    /// A drain whose only pods left are protected pods no backup of the plan covers can never finish;
    /// one with any other pod still to leave (held by a PDB, do-not-disrupt, a backoff) still waits.
    #[test]
    fn only_uncovered_protected_pods_left_is_a_drain_that_cannot_finish() {
        let uncovered = ["shop/redis-0".to_string()];
        assert!(only_uncovered_left(
            &["shop/redis-0".to_string()],
            &uncovered
        ));
        assert!(only_uncovered_left(&[], &uncovered));
        assert!(!only_uncovered_left(
            &["shop/redis-0".to_string(), "shop/web-1".to_string()],
            &uncovered
        ));
        assert!(!only_uncovered_left(&["shop/web-1".to_string()], &[]));
        assert!(!only_uncovered_left(&[], &[]));
    }

    #[test]
    fn do_not_disrupt_pods_are_held_and_keep_later_tiers_waiting() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let mut held = planned("batch", EvictionTier::NonCritical, false);
        held.do_not_disrupt = true;
        let evictions = vec![held, planned("dns", EvictionTier::Critical, false)];
        let b = select_batch(&evictions, claims, &[], BackupPolicy::Required, &[], now);
        assert!(b.send.is_empty());
        assert!(
            b.held[0].contains("db/batch: karpenter.sh/do-not-disrupt"),
            "{:?}",
            b.held
        );
    }

    #[test]
    fn refused_evictions_back_off_exponentially() {
        assert_eq!(failed_eviction_backoff(1), Duration::from_secs(5));
        assert_eq!(failed_eviction_backoff(2), Duration::from_secs(10));
        assert_eq!(failed_eviction_backoff(4), Duration::from_secs(40));
        assert_eq!(failed_eviction_backoff(50), FAILED_EVICTION_BACKOFF_MAX);
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let evictions = vec![planned("web-1", EvictionTier::NonCritical, false)];
        let mut targets = eviction_targets(&evictions);
        assert_eq!(targets.len(), 1);
        record_refusal(
            &mut targets[0],
            "eviction refused with HTTP 403: denied",
            now,
        );
        record_refusal(
            &mut targets[0],
            "eviction refused with HTTP 403: denied",
            now,
        );
        assert_eq!(targets[0].failures, 2);
        let at = |s: i64| now + jiff::SignedDuration::from_secs(s);
        let b = select_batch(
            &evictions,
            claims,
            &[],
            BackupPolicy::Required,
            &targets,
            at(9),
        );
        assert!(b.send.is_empty(), "still backing off");
        assert!(b.held[0].contains("refused 2 time(s)") && b.held[0].contains("HTTP 403"));
        let b = select_batch(
            &evictions,
            claims,
            &[],
            BackupPolicy::Required,
            &targets,
            at(10),
        );
        assert_eq!(b.send.len(), 1, "due again");
    }

    #[test]
    fn the_drain_waits_for_its_targets_only() {
        let evictions = vec![
            planned("web-1", EvictionTier::NonCritical, false),
            planned("pg-0", EvictionTier::NonCritical, true),
        ];
        let targets = eviction_targets(&evictions);
        // A pod that arrived later (it tolerates the taint) is not a target.
        let mut later = evictions.clone();
        later.push(planned("newcomer", EvictionTier::NonCritical, false));
        let names: Vec<String> = targeted(&later, &targets)
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["web-1", "pg-0"]);
        let present: BTreeSet<String> = ["uid-pg-0".to_string(), "uid-newcomer".to_string()].into();
        let left = remaining_targets(&targets, &present);
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].uid, "uid-pg-0");
        // Only the UID is recorded: thousands of targets must fit in the plan's status.
        assert_eq!(
            serde_json::to_value(left[0]).unwrap(),
            serde_json::json!({"uid": "uid-pg-0"})
        );
        let msg = waiting_message(
            "n1",
            &["db/pg-0".into()],
            targets.len(),
            &["db/pg-0: PDB".into()],
        );
        assert_eq!(
            msg,
            "node n1: waiting for 1 of 2 pods planned for eviction to leave (db/pg-0); blocked: db/pg-0: PDB"
        );
        assert!(remaining_targets(&targets, &BTreeSet::new()).is_empty());
    }

    #[test]
    fn the_drain_times_out_only_after_its_timeout_and_never_when_done() {
        let start: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let at = |s: i64| start + jiff::SignedDuration::from_secs(s);
        let t = Some(Duration::from_secs(60));
        assert_eq!(
            drain_verdict(true, start, at(600), t, &[]),
            DrainState::Done
        );
        assert_eq!(
            drain_verdict(false, start, at(60), t, &[]),
            DrainState::InProgress
        );
        assert_eq!(
            drain_verdict(false, start, at(3600), None, &[]),
            DrainState::InProgress
        );
        // A clock behind the recorded start (another replica's clock) is not a timeout.
        assert_eq!(
            drain_verdict(false, at(10), start, t, &[]),
            DrainState::InProgress
        );
        let blocked = vec!["db/pg-0: PDB".to_string()];
        match drain_verdict(false, start, at(61), t, &blocked) {
            DrainState::Failed { message } => {
                assert!(message.contains("db/pg-0: PDB"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
}
