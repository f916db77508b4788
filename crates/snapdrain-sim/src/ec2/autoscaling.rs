//! The Amazon EC2 Auto Scaling actions the simulator serves on the same endpoint as EC2 (both use the
//! AWS query protocol; the `Action` tells them apart). Documents follow the awsQuery shape aws-sdk-
//! autoscaling parses: `<XResponse><XResult>…</XResult><ResponseMetadata>` and `<ErrorResponse>` errors.

use std::sync::Arc;

use super::actions::ApiError;
use super::params::Params;
use super::xml::escape;
use super::{InstanceState, Shared};

const NAMESPACE: &str = "http://autoscaling.amazonaws.com/doc/2011-01-01/";

/// Actions answered by this module.
pub(super) fn handles(action: &str) -> bool {
    matches!(action, "TerminateInstanceInAutoScalingGroup")
}

pub(super) fn dispatch(
    shared: &Arc<Shared>,
    p: &Params,
    request_id: &str,
) -> Result<String, ApiError> {
    match p.get("Action") {
        Some("TerminateInstanceInAutoScalingGroup") => terminate_in_group(shared, p, request_id),
        other => Err(ApiError::new(
            400,
            "InvalidAction",
            format!("The action {other:?} is not valid for this web service."),
        )),
    }
}

fn validation(message: impl Into<String>) -> ApiError {
    ApiError::new(400, "ValidationError", message)
}

/// TerminateInstanceInAutoScalingGroup (Auto Scaling API reference): terminates a member and, when
/// `ShouldDecrementDesiredCapacity` is true, lowers the desired capacity so the group does not launch
/// a replacement; otherwise "Amazon EC2 Auto Scaling launches instances to replace the ones that are
/// terminated".
fn terminate_in_group(
    shared: &Arc<Shared>,
    p: &Params,
    request_id: &str,
) -> Result<String, ApiError> {
    let id = p
        .get("InstanceId")
        .ok_or_else(|| validation("1 validation error detected: Value null at 'instanceId' failed to satisfy constraint: Member must not be null"))?;
    let decrement = match p.get("ShouldDecrementDesiredCapacity") {
        Some(v) => v.eq_ignore_ascii_case("true"),
        None => {
            return Err(validation(
                "1 validation error detected: Value null at 'shouldDecrementDesiredCapacity' failed to satisfy constraint: Member must not be null",
            ));
        }
    };
    let group = {
        let mut world = shared.world();
        let live = world.instances.get(id).is_some_and(|i| {
            !matches!(
                i.state,
                InstanceState::ShuttingDown | InstanceState::Terminated
            )
        });
        let name = world
            .groups
            .iter()
            .find(|(_, g)| g.members.iter().any(|m| m == id))
            .map(|(n, _)| n.clone());
        let (Some(name), true) = (name, live) else {
            return Err(validation(format!(
                "Instance Id not found - No managed instance found for instance ID: {id}"
            )));
        };
        if decrement && let Some(g) = world.groups.get_mut(&name) {
            g.desired = g.desired.saturating_sub(1);
        }
        name
    };
    shared
        .begin_terminate(id)
        .map_err(|e| validation(e.to_string()))?;
    let now = jiff::Timestamp::now();
    let activity = format!(
        "<Activity><ActivityId>{}</ActivityId><AutoScalingGroupName>{}</AutoScalingGroupName><Description>Terminating EC2 instance: {}</Description><Cause>At {now} instance {} was taken out of service in response to a user request{}.</Cause><StartTime>{now}</StartTime><StatusCode>InProgress</StatusCode><Progress>0</Progress></Activity>",
        uuid::Uuid::new_v4(),
        escape(&group),
        escape(id),
        escape(id),
        if decrement {
            ", shrinking the capacity from the desired capacity"
        } else {
            ""
        },
    );
    Ok(format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<TerminateInstanceInAutoScalingGroupResponse xmlns=\"{NAMESPACE}\"><TerminateInstanceInAutoScalingGroupResult>{activity}</TerminateInstanceInAutoScalingGroupResult><ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata></TerminateInstanceInAutoScalingGroupResponse>"
    ))
}

/// The awsQuery error envelope (differs from EC2's `<Response><Errors>`).
pub(super) fn error_document(code: &str, message: &str, request_id: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ErrorResponse xmlns=\"{NAMESPACE}\"><Error><Type>Sender</Type><Code>{}</Code><Message>{}</Message></Error><RequestId>{}</RequestId></ErrorResponse>",
        escape(code),
        escape(message),
        escape(request_id)
    )
}
