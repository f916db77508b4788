//! Pure decisions for terminating and replacing a node on EC2: where a replacement launches, whether an
//! Auto Scaling group shrinks, and when a launch that never joined has timed out. What it needs to join
//! is resolved while planning ([`super::join`]).

use std::collections::BTreeSet;
use std::time::Duration;

use crate::api::plan::{ReplacementSpec, TerminationSpec};

/// How long a replacement may take to become a Ready node when the plan does not say.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(600);

/// The subnets resolved for a replacement, those in a zone of the evicted pods' volumes first (an EBS
/// volume only attaches in its own zone), otherwise in the resolved order.
pub fn order_subnets(
    subnets: &[String],
    subnet_zone: impl Fn(&str) -> Option<String>,
    volume_zones: &BTreeSet<String>,
) -> Vec<String> {
    let mut subnets = subnets.to_vec();
    // Stable: the plan's order within each group.
    subnets.sort_by_key(|s| !subnet_zone(s).is_some_and(|z| volume_zones.contains(&z)));
    subnets
}

/// Whether terminating a member of an Auto Scaling group lowers its desired capacity: as the plan says,
/// else when snapdrain launches the replacement (otherwise the group would launch one too).
pub fn decrement_desired_capacity(
    termination: &TerminationSpec,
    replacement: Option<&ReplacementSpec>,
) -> bool {
    termination.decrement_desired_capacity.unwrap_or_else(|| {
        replacement.is_some_and(|r| r.when != crate::api::plan::ReplacementWhen::None)
    })
}

/// What to do with a launched replacement that is not Ready yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinWait {
    /// Keep waiting, at most this long.
    Wait(Duration),
    /// Timed out: terminate it and launch attempt `next`.
    Retry { next: u32 },
    /// Timed out on the last attempt: terminate it and fail the plan.
    GiveUp,
}

pub fn join_wait(
    launched_at: jiff::Timestamp,
    now: jiff::Timestamp,
    timeout: Duration,
    attempt: u32,
    max_attempts: u32,
) -> JoinWait {
    let waited = now.duration_since(launched_at).unsigned_abs();
    if waited < timeout {
        return JoinWait::Wait(timeout - waited);
    }
    if attempt < max_attempts {
        JoinWait::Retry { next: attempt + 1 }
    } else {
        JoinWait::GiveUp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::plan::ReplacementWhen;

    fn spec() -> ReplacementSpec {
        ReplacementSpec {
            when: ReplacementWhen::AfterDrain,
            instance_types: vec!["m5.large".into()],
            image_id: Some("ami-1".into()),
            ..Default::default()
        }
    }

    #[test]
    fn subnets_in_the_volume_zone_come_first() {
        let subnets = ["subnet-b".to_string(), "subnet-c".into(), "subnet-a".into()];
        let zone = |id: &str| Some(format!("us-east-1{}", id.trim_start_matches("subnet-")));
        let zones = BTreeSet::from(["us-east-1a".to_string()]);
        assert_eq!(
            order_subnets(&subnets, zone, &zones),
            ["subnet-a", "subnet-b", "subnet-c"]
        );
        assert_eq!(order_subnets(&subnets, |_| None, &zones), subnets);
    }

    #[test]
    fn asg_shrinks_when_snapdrain_replaces_or_the_plan_says() {
        let t = TerminationSpec::default();
        assert!(decrement_desired_capacity(&t, Some(&spec())));
        assert!(!decrement_desired_capacity(&t, None));
        let keep = TerminationSpec {
            decrement_desired_capacity: Some(false),
            ..Default::default()
        };
        assert!(!decrement_desired_capacity(&keep, Some(&spec())));
    }

    #[test]
    fn join_timeout_retries_then_gives_up() {
        let t0 = jiff::Timestamp::from_second(1_000).unwrap();
        let at = |s: i64| jiff::Timestamp::from_second(1_000 + s).unwrap();
        let timeout = Duration::from_secs(60);
        assert_eq!(
            join_wait(t0, at(20), timeout, 1, 2),
            JoinWait::Wait(Duration::from_secs(40))
        );
        assert_eq!(
            join_wait(t0, at(60), timeout, 1, 2),
            JoinWait::Retry { next: 2 }
        );
        assert_eq!(join_wait(t0, at(61), timeout, 2, 2), JoinWait::GiveUp);
    }
}
