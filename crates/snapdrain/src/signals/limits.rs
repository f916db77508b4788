//! Concurrency of signal plans: a graceful signal waits while the cluster-wide or its NodePool's limit is
//! reached; a forceful one (with a deadline) never waits, because the node goes anyway.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::plan::PlanMode;
use crate::api::policy::ConcurrencySpec;
use crate::api::status::PlanPhase;

/// The running signal plans counted against the limits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Running {
    pub total: u32,
    /// Running plans on nodes of the signal's NodePool.
    pub in_pool: u32,
}

/// The slots taken, counted once per look of the signal watcher (not once per signalled node: in a
/// consolidation burst thousands of nodes ask at once), and updated as the look makes plans, so that
/// a look never admits more than the limits even before the plan cache shows its own new plans.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Slots {
    total: u32,
    per_pool: BTreeMap<String, u32>,
}

impl Slots {
    /// One more plan holding a slot, on nodes of `pools` (a plan counts once in each of its pools).
    pub fn take<'a>(&mut self, pools: impl IntoIterator<Item = &'a str>) {
        self.total += 1;
        let pools: BTreeSet<&str> = pools.into_iter().collect();
        for pool in pools {
            *self.per_pool.entry(pool.to_owned()).or_default() += 1;
        }
    }

    /// What runs against a signal on a node of `pool`.
    pub fn running(&self, pool: Option<&str>) -> Running {
        Running {
            total: self.total,
            in_pool: pool
                .and_then(|p| self.per_pool.get(p))
                .copied()
                .unwrap_or(0),
        }
    }
}

/// Whether a running signal plan takes one of the limits' slots: every plan until its backups are
/// verified (those are what Velero's one worker serves), and an Execute plan until it ends (snapdrain
/// drains that node itself). A Release plan past verification only waits for the disruptor, whose own
/// budget paces it; holding a slot then would leave Velero idle while the next signals wait.
///
/// Karpenter paces a released node by its NodePool's `spec.disruption.budgets` (kubernetes-sigs/karpenter
/// `pkg/apis/v1/nodepool.go` `GetAllowedDisruptionsByReason`, applied per pass in
/// `pkg/controllers/disruption/helpers.go` `BuildDisruptionBudgetMapping`; research/karpenter.md §2).
pub fn takes_slot(phase: PlanPhase, mode: PlanMode) -> bool {
    match phase {
        PlanPhase::Completed | PlanPhase::Failed | PlanPhase::Aborted => false,
        PlanPhase::Pending | PlanPhase::Cordoning | PlanPhase::BackingUp | PlanPhase::Verifying => {
            true
        }
        PlanPhase::Draining | PlanPhase::Terminating | PlanPhase::Replacing => {
            mode == PlanMode::Execute
        }
    }
}

/// `Ok` when a plan may start now, else why it waits (for logs and the node's Event).
pub fn admit(limits: &ConcurrencySpec, running: &Running, forceful: bool) -> Result<(), String> {
    if forceful {
        return Ok(());
    }
    if limits.max_plans > 0 && running.total >= limits.max_plans {
        return Err(format!(
            "{} signal plans are running (policy concurrency.maxPlans {})",
            running.total, limits.max_plans
        ));
    }
    if limits.max_plans_per_node_pool > 0 && running.in_pool >= limits.max_plans_per_node_pool {
        return Err(format!(
            "{} signal plans are running in this NodePool (policy concurrency.maxPlansPerNodePool {})",
            running.in_pool, limits.max_plans_per_node_pool
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_plans_free_their_slot_once_verified_and_execute_plans_when_done() {
        use PlanPhase::*;
        for phase in [Pending, Cordoning, BackingUp, Verifying] {
            assert!(takes_slot(phase, PlanMode::Release), "{phase:?}");
            assert!(takes_slot(phase, PlanMode::Execute), "{phase:?}");
        }
        for phase in [Draining, Terminating, Replacing] {
            assert!(!takes_slot(phase, PlanMode::Release), "{phase:?}");
            assert!(takes_slot(phase, PlanMode::Execute), "{phase:?}");
        }
        for phase in [Completed, Failed, Aborted] {
            assert!(!takes_slot(phase, PlanMode::Execute), "{phase:?}");
        }
    }

    #[test]
    fn slots_count_a_plan_once_in_all_and_once_in_each_of_its_pools() {
        let mut slots = Slots::default();
        assert_eq!(slots.running(Some("a")), Running::default());
        slots.take(["a", "a", "b"]);
        slots.take([]);
        slots.take(["a"]);
        assert_eq!(
            slots.running(Some("a")),
            Running {
                total: 3,
                in_pool: 2
            }
        );
        assert_eq!(
            slots.running(Some("b")),
            Running {
                total: 3,
                in_pool: 1
            }
        );
        assert_eq!(
            slots.running(None),
            Running {
                total: 3,
                in_pool: 0
            }
        );
    }

    #[test]
    fn graceful_signals_wait_for_a_slot_and_forceful_ones_never() {
        let limits = ConcurrencySpec {
            max_plans: 2,
            max_plans_per_node_pool: 1,
        };
        let idle = Running::default();
        assert!(admit(&limits, &idle, false).is_ok());
        let pool_full = Running {
            total: 1,
            in_pool: 1,
        };
        assert!(
            admit(&limits, &pool_full, false)
                .unwrap_err()
                .contains("maxPlansPerNodePool 1")
        );
        let full = Running {
            total: 2,
            in_pool: 0,
        };
        assert!(
            admit(&limits, &full, false)
                .unwrap_err()
                .contains("maxPlans 2")
        );
        assert!(admit(&limits, &full, true).is_ok());
        let unlimited = ConcurrencySpec {
            max_plans: 0,
            max_plans_per_node_pool: 0,
        };
        assert!(
            admit(
                &unlimited,
                &Running {
                    total: 99,
                    in_pool: 99
                },
                false
            )
            .is_ok()
        );
    }
}
