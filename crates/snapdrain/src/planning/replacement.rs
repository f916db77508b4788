//! Pure decisions for terminating and replacing a node on EC2: what a replacement needs to join (from
//! the plan, else copied from the replaced instance), where it launches, whether an Auto Scaling group
//! shrinks, and when a launch that never joined has timed out.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::api::plan::{ReplacementSpec, TerminationSpec};
use crate::api::status::InstanceRecord;
use crate::cloud::ec2::{JoinSettings, MetadataSettings};

/// How long a replacement may take to become a Ready node when the plan does not say.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(600);

/// The instance profile, security groups and IMDS options of the replacement: the plan's, else the
/// replaced instance's. A launch template carries its own, so only what the plan names is sent then.
/// Without a template, a replacement lacking a profile or security groups could never join: an error
/// saying what to set.
pub fn join_settings(
    spec: &ReplacementSpec,
    replaced: Option<&InstanceRecord>,
) -> Result<JoinSettings, String> {
    let from_template = spec.launch_template.is_some();
    let copied = |f: fn(&InstanceRecord) -> Option<String>| {
        if from_template {
            None
        } else {
            replaced.and_then(f)
        }
    };
    let instance_profile = spec
        .iam_instance_profile
        .clone()
        .or_else(|| copied(|r| r.instance_profile.clone()));
    let security_group_ids = if !spec.security_group_ids.is_empty() || from_template {
        spec.security_group_ids.clone()
    } else {
        replaced
            .map(|r| r.security_group_ids.clone())
            .unwrap_or_default()
    };
    let metadata = match &spec.metadata_options {
        Some(m) => Some(MetadataSettings {
            tokens_required: m.http_tokens == "required",
            hop_limit: m.http_put_response_hop_limit,
        }),
        None if from_template => None,
        // The replaced instance's, else Karpenter's EC2NodeClass default (IMDSv2, hop limit 1).
        None => Some(MetadataSettings {
            tokens_required: replaced
                .and_then(|r| r.http_tokens_required)
                .unwrap_or(true),
            hop_limit: replaced.and_then(|r| r.hop_limit).unwrap_or(1),
        }),
    };
    if !from_template {
        if instance_profile.is_none() {
            return Err("it needs an IAM instance profile for the kubelet to authenticate to the cluster: set spec.replacement.iamInstanceProfile (the replaced instance's could not be read from EC2)".into());
        }
        if security_group_ids.is_empty() {
            return Err("it needs security groups that reach the control plane: set spec.replacement.securityGroupIds (the replaced instance's could not be read from EC2)".into());
        }
    }
    Ok(JoinSettings {
        instance_profile,
        security_group_ids,
        metadata,
    })
}

/// Subnets to launch into, in order of preference: the plan's, those in a zone of the evicted pods'
/// volumes first (an EBS volume only attaches in its own zone); else the replaced instance's subnet.
/// Empty only with a launch template (which then names the subnet).
pub fn launch_subnets(
    spec: &ReplacementSpec,
    replaced: Option<&InstanceRecord>,
    subnet_zone: impl Fn(&str) -> Option<String>,
    volume_zones: &BTreeSet<String>,
) -> Vec<String> {
    if spec.subnets.is_empty() {
        return replaced
            .and_then(|r| r.subnet_id.clone())
            .into_iter()
            .collect();
    }
    let mut subnets = spec.subnets.clone();
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
    use crate::api::plan::{LaunchTemplateRef, MetadataOptionsSpec, ReplacementWhen};

    fn record() -> InstanceRecord {
        InstanceRecord {
            subnet_id: Some("subnet-a".into()),
            zone: Some("us-east-1a".into()),
            instance_profile: Some("arn:aws:iam::1:instance-profile/node".into()),
            security_group_ids: vec!["sg-1".into()],
            http_tokens_required: Some(true),
            hop_limit: Some(2),
            auto_scaling_group: None,
        }
    }

    fn spec() -> ReplacementSpec {
        ReplacementSpec {
            when: ReplacementWhen::AfterDrain,
            instance_types: vec!["m5.large".into()],
            image_id: Some("ami-1".into()),
            ..Default::default()
        }
    }

    #[test]
    fn join_settings_are_copied_from_the_replaced_instance() {
        let j = join_settings(&spec(), Some(&record())).unwrap();
        assert_eq!(
            j.instance_profile.as_deref(),
            Some("arn:aws:iam::1:instance-profile/node")
        );
        assert_eq!(j.security_group_ids, ["sg-1"]);
        assert_eq!(
            j.metadata,
            Some(MetadataSettings {
                tokens_required: true,
                hop_limit: 2
            })
        );
    }

    #[test]
    fn the_plan_wins_and_missing_settings_are_named() {
        let mut s = spec();
        s.iam_instance_profile = Some("other".into());
        s.security_group_ids = vec!["sg-2".into()];
        s.metadata_options = Some(MetadataOptionsSpec {
            http_tokens: "optional".into(),
            http_put_response_hop_limit: 3,
        });
        let j = join_settings(&s, Some(&record())).unwrap();
        assert_eq!(j.instance_profile.as_deref(), Some("other"));
        assert_eq!(j.security_group_ids, ["sg-2"]);
        assert!(!j.metadata.unwrap().tokens_required);
        let e = join_settings(&spec(), None).unwrap_err();
        assert!(e.contains("iamInstanceProfile"), "{e}");
        let mut no_sg = record();
        no_sg.security_group_ids.clear();
        let e = join_settings(&spec(), Some(&no_sg)).unwrap_err();
        assert!(e.contains("securityGroupIds"), "{e}");
        // Defaults without anything to copy: IMDSv2, hop limit 1.
        let mut s = spec();
        s.iam_instance_profile = Some("p".into());
        s.security_group_ids = vec!["sg-1".into()];
        assert_eq!(
            join_settings(&s, None).unwrap().metadata,
            Some(MetadataSettings {
                tokens_required: true,
                hop_limit: 1
            })
        );
    }

    #[test]
    fn a_launch_template_carries_its_own_join_settings() {
        let mut s = spec();
        s.launch_template = Some(LaunchTemplateRef {
            name: Some("nodes".into()),
            ..Default::default()
        });
        let j = join_settings(&s, Some(&record())).unwrap();
        assert_eq!(j, JoinSettings::default());
    }

    #[test]
    fn subnets_default_to_the_replaced_one_and_prefer_the_volume_zone() {
        assert_eq!(
            launch_subnets(&spec(), Some(&record()), |_| None, &BTreeSet::new()),
            ["subnet-a"]
        );
        assert!(launch_subnets(&spec(), None, |_| None, &BTreeSet::new()).is_empty());
        let mut s = spec();
        s.subnets = vec!["subnet-b".into(), "subnet-c".into(), "subnet-a".into()];
        let zone = |id: &str| Some(format!("us-east-1{}", id.trim_start_matches("subnet-")));
        let zones = BTreeSet::from(["us-east-1a".to_string()]);
        assert_eq!(
            launch_subnets(&s, Some(&record()), zone, &zones),
            ["subnet-a", "subnet-b", "subnet-c"]
        );
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
