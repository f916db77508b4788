//! A node's instance as EC2 describes it while it runs (subnet, zone, instance profile, security groups,
//! IMDS options, Auto Scaling group), recorded once in the plan's status *before* the instance is
//! terminated: a terminated instance loses its network interfaces and profile, so the replacement and the
//! termination read the record instead.

use crate::api::status::{DisruptionPlanStatus, InstanceRecord};
use crate::cloud::ec2::InstanceDetails;
use crate::controller::error::ControllerError;
use crate::controller::step::Io;

/// What is known of node `i`'s instance, and whether it is news for the record.
pub enum Instance {
    /// Recorded already, or nothing to record (no instance id, unknown to EC2).
    Known(Option<InstanceRecord>),
    /// Newly described: record it (and write the record) before acting on the instance.
    New(InstanceRecord),
    /// Terminated already: only its Auto Scaling group tag is worth knowing; nothing to record.
    Gone(InstanceRecord),
}

impl Instance {
    pub fn record(&self) -> Option<&InstanceRecord> {
        match self {
            Self::Known(r) => r.as_ref(),
            Self::New(r) | Self::Gone(r) => Some(r),
        }
    }
}

/// Node `i`'s instance: from the record, else described by EC2.
pub async fn observe(
    status: &DisruptionPlanStatus,
    i: usize,
    io: &Io<'_>,
) -> Result<Instance, ControllerError> {
    let node = &status.nodes[i];
    if let Some(r) = &node.instance {
        return Ok(Instance::Known(Some(r.clone())));
    }
    let Some(id) = &node.instance_id else {
        return Ok(Instance::Known(None));
    };
    let described = io.cloud.ec2().await?.describe_instance(id).await?;
    Ok(classify(described))
}

/// What an EC2 description means for the record.
pub fn classify(described: Option<InstanceDetails>) -> Instance {
    let Some(d) = described else {
        return Instance::Known(None);
    };
    let record = InstanceRecord {
        auto_scaling_group: d.auto_scaling_group().map(str::to_string),
        image_id: d.image_id,
        subnet_id: d.subnet_id,
        zone: d.zone,
        instance_profile: d.instance_profile,
        security_group_ids: d.security_group_ids,
        http_tokens_required: d.metadata.as_ref().map(|m| m.tokens_required),
        hop_limit: d.metadata.as_ref().map(|m| m.hop_limit),
    };
    // A terminated instance says nothing about how it ran; only its group tag is still worth keeping.
    if d.state.is_gone() {
        return Instance::Gone(InstanceRecord {
            auto_scaling_group: record.auto_scaling_group,
            ..Default::default()
        });
    }
    Instance::New(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::ec2::{ASG_NAME_TAG, InstanceLifecycleState};

    fn details(state: InstanceLifecycleState) -> InstanceDetails {
        InstanceDetails {
            state,
            instance_type: Some("m5.large".into()),
            image_id: Some("ami-0abc".into()),
            subnet_id: Some("subnet-a".into()),
            zone: Some("us-west-2a".into()),
            instance_profile: Some("arn:aws:iam::1:instance-profile/nodes".into()),
            security_group_ids: vec!["sg-1".into()],
            metadata: None,
            tags: [(ASG_NAME_TAG.to_string(), "workers".to_string())].into(),
        }
    }

    #[test]
    fn a_running_instance_is_news_for_the_record_and_a_terminated_one_only_names_its_group() {
        let Instance::New(r) = classify(Some(details(InstanceLifecycleState::Running))) else {
            panic!("a running instance is recorded");
        };
        assert_eq!(r.subnet_id.as_deref(), Some("subnet-a"));
        assert_eq!(r.image_id.as_deref(), Some("ami-0abc"));
        let Instance::Gone(g) = classify(Some(details(InstanceLifecycleState::Terminated))) else {
            panic!("a terminated instance is not recorded");
        };
        assert_eq!(g.auto_scaling_group.as_deref(), Some("workers"));
        assert_eq!(g.subnet_id, None);
        assert!(matches!(classify(None), Instance::Known(None)));
    }
}
