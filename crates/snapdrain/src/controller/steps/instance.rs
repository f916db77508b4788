//! A node's instance as EC2 describes it while it runs (subnet, zone, instance profile, security groups,
//! IMDS options, Auto Scaling group), recorded once in the plan's status: a terminated instance loses
//! its network interfaces and profile, so the replacement and the termination read the record instead.

use crate::api::status::InstanceRecord;
use crate::controller::error::ControllerError;
use crate::controller::reconcile::PlanRun;

/// Records node `i`'s instance if not done yet and EC2 still knows it. Returns the record.
pub async fn record_instance(
    run: &mut PlanRun,
    i: usize,
) -> Result<Option<InstanceRecord>, ControllerError> {
    if let Some(r) = &run.status.nodes[i].instance {
        return Ok(Some(r.clone()));
    }
    let Some(id) = run.status.nodes[i].instance_id.clone() else {
        return Ok(None);
    };
    let Some(d) = run.ctx.ec2().await?.describe_instance(&id).await? else {
        return Ok(None);
    };
    let record = InstanceRecord {
        auto_scaling_group: d.auto_scaling_group().map(str::to_string),
        subnet_id: d.subnet_id,
        zone: d.zone,
        instance_profile: d.instance_profile,
        security_group_ids: d.security_group_ids,
        http_tokens_required: d.metadata.as_ref().map(|m| m.tokens_required),
        hop_limit: d.metadata.as_ref().map(|m| m.hop_limit),
    };
    // A terminated instance says nothing about how it ran; only its group tag is still worth keeping.
    if d.state.is_gone() {
        return Ok(Some(InstanceRecord {
            auto_scaling_group: record.auto_scaling_group,
            ..Default::default()
        }));
    }
    run.status.nodes[i].instance = Some(record.clone());
    run.save().await?;
    Ok(Some(record))
}
