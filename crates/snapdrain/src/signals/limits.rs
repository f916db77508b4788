//! Concurrency of signal plans: a graceful signal waits while the cluster-wide or its NodePool's limit is
//! reached; a forceful one (with a deadline) never waits, because the node goes anyway.

use crate::api::policy::ConcurrencySpec;

/// The running signal plans counted against the limits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Running {
    pub total: u32,
    /// Running plans on nodes of the signal's NodePool.
    pub in_pool: u32,
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
