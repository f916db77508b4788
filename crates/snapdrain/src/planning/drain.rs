//! Drain decisions: which planned evictions may be sent in this pass (the safety gate for protected pods
//! and Karpenter's tier order), and whether the drain is done, still going, or out of time.

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;

use super::evictions::PlannedEviction;
use super::phase::DrainState;
use crate::api::plan::BackupPolicy;
use crate::api::status::BackupRecord;

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
}

/// Karpenter's order: only the first tier that still has pods is evicted in a pass, and pods already
/// terminating are waited for, not evicted again. Each candidate then passes [`gate_eviction`];
/// `claims_of` gives a planned pod's claims as `ns/pvc`.
pub fn select_batch(
    evictions: &[PlannedEviction],
    claims_of: impl Fn(&PlannedEviction) -> Vec<String>,
    records: &[BackupRecord],
    policy: BackupPolicy,
) -> Batch {
    let covered = covered_claims(records);
    let first_tier = evictions.iter().map(|e| e.tier).min();
    let mut batch = Batch::default();
    for e in evictions {
        if e.terminating || Some(e.tier) != first_tier {
            continue;
        }
        match gate_eviction(e.protected, &claims_of(e), &covered, policy) {
            Gate::Allow => batch.send.push(e.clone()),
            Gate::Hold { missing } => batch.held.push(format!(
                "{}/{}: no verified backup covers {} (it came after the plan was decided); not evicted",
                e.namespace,
                e.name,
                missing.join(", ")
            )),
        }
    }
    batch
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
        let b = select_batch(&evictions, claims, &records, BackupPolicy::Required);
        let sent: Vec<&str> = b.send.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(sent, ["web-1", "pg-0"]);
        assert_eq!(b.held.len(), 1);
        assert!(
            b.held[0].starts_with("db/pg-1: no verified backup covers db/data-pg-1"),
            "{:?}",
            b.held
        );

        // Once the first tier is gone, the next one goes.
        let rest = vec![planned("dns", EvictionTier::Critical, false)];
        let b = select_batch(&rest, claims, &records, BackupPolicy::Required);
        assert_eq!(b.send.len(), 1);
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
