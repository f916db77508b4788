//! Terminating: hand a Karpenter-owned node back to Karpenter by deleting its NodeClaim (Karpenter then
//! terminates the instance), otherwise terminate the EC2 instance named by the providerID (through its
//! Auto Scaling group when it has one) and delete the Node. Every call is idempotent (TerminateInstances
//! and 404s are fine twice). A Node recreated under the same name (a new uid) is a different node: the
//! one the plan drained is gone, and the new one is left alone.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};

use super::instance::{Instance, observe};
use super::inventory::get_node;
use crate::api::plan::{ReplacementSpec, TerminationSpec};
use crate::api::status::{InstanceRecord, NodePhase};
use crate::cloud::ec2::CloudError;
use crate::controller::error::ControllerError;
use crate::controller::report::What;
use crate::controller::step::{Io, Next, Outcome, PlanView, Wake};
use crate::planning::replacement::decrement_desired_capacity;
use crate::signals::detect::{nodeclaim_of, nodeclaims};

/// True when `node` is not the Node the plan was decided for (same name, another uid).
pub fn is_other_node(recorded_uid: Option<&str>, node: &Node) -> bool {
    match (recorded_uid, node.metadata.uid.as_deref()) {
        (Some(want), Some(have)) => want != have,
        _ => false,
    }
}

/// What terminating one node means, decided from the spec and what owns the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Termination {
    /// Karpenter's node: delete its NodeClaim; Karpenter terminates the instance and deletes the Node.
    DeleteNodeClaim(String),
    /// Karpenter's node and `terminateInstance: false`: keep all (deleting either would make Karpenter
    /// terminate the instance).
    KeepKarpenters(String),
    /// Not Karpenter's: terminate the instance (when asked and known), then delete the Node (when asked).
    Direct {
        terminate: Option<String>,
        delete_node: bool,
    },
}

impl Termination {
    pub fn decide(spec: &TerminationSpec, claim: Option<&str>, instance_id: Option<&str>) -> Self {
        match claim {
            Some(c) if spec.terminate_instance => Self::DeleteNodeClaim(c.to_owned()),
            Some(c) => Self::KeepKarpenters(c.to_owned()),
            None => Self::Direct {
                terminate: instance_id
                    .filter(|_| spec.terminate_instance)
                    .map(str::to_owned),
                delete_node: spec.delete_node,
            },
        }
    }

    /// The node is expected to disappear.
    pub fn expect_gone(&self) -> bool {
        match self {
            Self::DeleteNodeClaim(_) => true,
            Self::KeepKarpenters(_) => false,
            Self::Direct { delete_node, .. } => *delete_node,
        }
    }

    /// The instance must be described (and recorded) first: the replacement is launched like it, and an
    /// instance in an Auto Scaling group is terminated through the group.
    pub fn needs_record(&self, replacement: bool) -> bool {
        replacement
            || matches!(
                self,
                Self::Direct {
                    terminate: Some(_),
                    ..
                }
            )
    }
}

pub async fn run(v: &PlanView<'_>, io: &Io<'_>) -> Result<Outcome, ControllerError> {
    let mut out = v.outcome();
    let mut waiting: Vec<(String, String)> = Vec::new();
    for i in 0..v.status.nodes.len() {
        match node(v, io, i, &mut out).await? {
            Step::Next => {}
            Step::Wait(what) => waiting.push((v.status.nodes[i].name.clone(), what)),
            Step::Checkpoint => return Ok(out.then(Next::Checkpoint)),
            Step::Refuse(why) => return Ok(out.then(Next::Fail(why))),
        }
    }
    if waiting.is_empty() {
        return Ok(out);
    }
    out.status.message = Some(format!(
        "waiting for {}",
        waiting
            .iter()
            .map(|(_, w)| w.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    ));
    let gone = v
        .status
        .nodes
        .iter()
        .filter(|n| waiting.iter().any(|(w, _)| *w == n.name))
        .map(|n| (n.name.clone(), n.uid.clone()))
        .collect();
    Ok(out.then(Next::Wait {
        wake: Wake::NodesGone(gone),
        recheck: io.settings.wait_slice,
    }))
}

/// Where one node's termination stands.
enum Step {
    /// Done with this node for now.
    Next,
    /// The node is expected to go; what the plan waits for.
    Wait(String),
    /// The instance's record is new: write it before the instance is terminated.
    Checkpoint,
    /// Terminating would act on something other than the drained node: fail the plan, saying why.
    Refuse(String),
}

/// The instance to terminate for a node: the one its plan recorded, confirmed by the node's own
/// `spec.providerID` as it is now. The status is not trusted alone (review M-2: whoever may write a
/// plan's status could otherwise name another instance), nor the node alone (review L-6: a node
/// recreated under the name, or re-pointed, must not be terminated in the drained one's place).
/// `None`: the plan recorded no instance, so none is terminated.
pub fn instance_to_terminate(
    node: &str,
    recorded: Option<&str>,
    provider_id: Option<&str>,
) -> Result<Option<String>, String> {
    let Some(recorded) = recorded else {
        return Ok(None);
    };
    let live = provider_id.map(crate::cloud::ec2::instance_id_from_provider_id);
    match live {
        Some(Ok(live)) if live == recorded => Ok(Some(live)),
        Some(Ok(live)) => Err(format!(
            "node {node} runs on instance {live} (its providerID), but the plan's status names {recorded}: \
             nothing was terminated. Only snapdrain's controller writes a plan's status; check who \
             changed it (the audit log), then abort this plan and start a new one"
        )),
        _ => Err(format!(
            "node {node} no longer names EC2 instance {recorded} in its providerID ({}): nothing was \
             terminated; check the node, then abort this plan and start a new one",
            provider_id.unwrap_or("unset")
        )),
    }
}

/// Whether the NodeClaim the node's ownerReference names is really that node's (review L-6): Karpenter
/// writes the claim's `status.providerID` at launch and, finding the Node by that providerID, its
/// `status.nodeName` at registration (kubernetes-sigs/karpenter `pkg/controllers/nodeclaim/lifecycle/`
/// `launch.go`, `registration.go`), so a claim whose status names another node or instance is not the
/// drained node's, and deleting it would make Karpenter terminate someone else's instance. A field not
/// yet set proves nothing either way.
pub fn claim_is_the_nodes(claim: &serde_json::Value, node: &Node) -> Result<(), String> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let claim_name = claim
        .pointer("/metadata/name")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("?");
    let status = |field: &str| {
        claim
            .pointer(&format!("/status/{field}"))
            .and_then(serde_json::Value::as_str)
            .filter(|v| !v.is_empty())
    };
    if let Some(other) = status("nodeName").filter(|n| *n != name) {
        return Err(format!(
            "node {name}'s owner NodeClaim {claim_name} belongs to node {other} (its status.nodeName): \
             it was not deleted; check the node's ownerReferences, then abort this plan"
        ));
    }
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    if let (Some(theirs), Some(ours)) = (status("providerID"), provider_id)
        && theirs != ours
    {
        return Err(format!(
            "node {name}'s owner NodeClaim {claim_name} launched {theirs} (its status.providerID), but the \
             node runs on {ours}: it was not deleted; check the node's ownerReferences, then abort this plan"
        ));
    }
    Ok(())
}

/// Terminates node `i` once, as decided from what owns it.
async fn node(
    v: &PlanView<'_>,
    io: &Io<'_>,
    i: usize,
    out: &mut Outcome,
) -> Result<Step, ControllerError> {
    let spec = &v.plan.spec;
    let n = &v.status.nodes[i];
    if matches!(n.phase, NodePhase::Gone | NodePhase::Kept) {
        return Ok(Step::Next);
    }
    let Some(node) = get_node(io.client, &n.name).await? else {
        out.status.nodes[i].phase = NodePhase::Gone;
        return Ok(Step::Next);
    };
    if is_other_node(n.uid.as_deref(), &node) {
        // The drained node is gone; this one only has its name (IP-based hostnames are reused).
        out.status.nodes[i].phase = NodePhase::Gone;
        out.note(What::NodeRecreated, format!(
            "node {} now has uid {} (the plan drained uid {}): the drained node is gone, the new one is left alone",
            n.name, node.metadata.uid.as_deref().unwrap_or("?"), n.uid.as_deref().unwrap_or("?"),
        ));
        return Ok(Step::Next);
    }
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    let instance_id = match instance_to_terminate(&n.name, n.instance_id.as_deref(), provider_id) {
        Ok(id) => id,
        Err(why) => return Ok(Step::Refuse(why)),
    };
    let what = Termination::decide(
        &spec.termination,
        nodeclaim_of(&node),
        instance_id.as_deref(),
    );
    if n.phase != NodePhase::Terminating {
        if let Termination::DeleteNodeClaim(claim) = &what
            && let Some(found) = nodeclaims(io.client)
                .get_opt(claim)
                .await
                .map_err(|source| ControllerError::Read {
                    what: format!("NodeClaim {claim}"),
                    source,
                })?
        {
            // A DynamicObject decoded from JSON serializes back without error.
            let found = serde_json::to_value(&found).unwrap_or_default();
            if let Err(why) = claim_is_the_nodes(&found, &node) {
                return Ok(Step::Refuse(why));
            }
        }
        let mut record = None;
        if what.needs_record(spec.replacement.is_some()) {
            match observe(v.status, i, io).await? {
                // Intent before act: the record is written before the instance goes.
                Instance::New(r) => {
                    out.status.nodes[i].instance = Some(r);
                    return Ok(Step::Checkpoint);
                }
                found => record = found.record().cloned(),
            }
        }
        if let Some((kind, text)) = act(&what, &n.name, record.as_ref(), spec, io).await? {
            out.note(kind, text);
        }
    }
    // Also for a node an older controller left in Terminating that is kept.
    out.status.nodes[i].phase = if what.expect_gone() {
        NodePhase::Terminating
    } else {
        NodePhase::Kept
    };
    Ok(match &what {
        Termination::DeleteNodeClaim(claim) => {
            Step::Wait(nodeclaim_wait(io.client, claim, &n.name).await)
        }
        _ if what.expect_gone() => Step::Wait(format!("node {} to be deleted", n.name)),
        _ => Step::Next,
    })
}

/// Terminates one node as decided; returns the note to announce.
async fn act(
    what: &Termination,
    node: &str,
    record: Option<&InstanceRecord>,
    spec: &crate::api::DisruptionPlanSpec,
    io: &Io<'_>,
) -> Result<Option<(What, String)>, ControllerError> {
    Ok(match what {
        Termination::DeleteNodeClaim(claim) => {
            delete_ignoring_missing(&nodeclaims(io.client), claim, format!("NodeClaim {claim}"))
                .await?;
            Some((
                What::NodeClaimDeleted,
                format!(
                    "node {node} is Karpenter's: deleted NodeClaim {claim}; Karpenter terminates the instance"
                ),
            ))
        }
        Termination::KeepKarpenters(claim) => Some((
            What::InstanceKept,
            format!(
                "node {node} is Karpenter's and termination.terminateInstance is false: NodeClaim {claim}, its instance and the Node are kept (deleting either would make Karpenter terminate the instance)"
            ),
        )),
        Termination::Direct {
            terminate,
            delete_node,
        } => {
            let mut note = None;
            if let Some(id) = terminate {
                let group = record.and_then(|r| r.auto_scaling_group.as_deref());
                let text = terminate_instance(
                    io,
                    id,
                    node,
                    group,
                    &spec.termination,
                    spec.replacement.as_ref(),
                )
                .await?;
                note = Some((What::InstanceTerminated, text));
            }
            if *delete_node {
                let nodes: Api<Node> = Api::all(io.client.clone());
                delete_ignoring_missing(&nodes, node, format!("node {node}")).await?;
            }
            note
        }
    })
}

/// Terminates instance `id` of `node`, through its Auto Scaling group when it has one.
async fn terminate_instance(
    io: &Io<'_>,
    id: &str,
    node: &str,
    group: Option<&str>,
    termination: &TerminationSpec,
    replacement: Option<&ReplacementSpec>,
) -> Result<String, ControllerError> {
    let Some(group) = group else {
        let outcome = io.cloud.ec2().await?.terminate(id).await?;
        tracing::info!(node = %node, instance = %id, ?outcome, "instance terminated");
        return Ok(format!("EC2 instance {id} of node {node} terminated"));
    };
    let decrement = decrement_desired_capacity(termination, replacement);
    terminate_in_group(io, id, decrement).await?;
    Ok(format!(
        "EC2 instance {id} of node {node} terminated through Auto Scaling group {group} ({})",
        if decrement {
            "desired capacity decremented"
        } else {
            "desired capacity kept: the group launches a replacement"
        }
    ))
}

async fn delete_ignoring_missing<K>(
    api: &Api<K>,
    name: &str,
    what: String,
) -> Result<(), ControllerError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(ControllerError::Delete { what, source }),
    }
}

/// What the plan waits for while Karpenter terminates a NodeClaim, e.g. "Karpenter to terminate
/// NodeClaim default-x7k2p of node n1, deleting since 2026-12-01T14:02:03Z".
async fn nodeclaim_wait(client: &kube::Client, claim: &str, node: &str) -> String {
    let since = match nodeclaims(client).get_opt(claim).await {
        Ok(Some(c)) => c
            .metadata
            .deletion_timestamp
            .map(|t| format!(", deleting since {}", t.0))
            .unwrap_or_else(|| ", not deleting yet".into()),
        Ok(None) => ", NodeClaim gone".into(),
        Err(_) => String::new(),
    };
    format!("Karpenter to terminate NodeClaim {claim} of node {node}{since}")
}

/// TerminateInstanceInAutoScalingGroup, idempotent: a member already gone (a retried pass) is done.
async fn terminate_in_group(io: &Io<'_>, id: &str, decrement: bool) -> Result<(), ControllerError> {
    let ec2 = io.cloud.ec2().await?;
    match ec2.terminate_in_auto_scaling_group(id, decrement).await {
        Ok(()) => Ok(()),
        // "Instance Id not found - No managed instance found": already terminated (or left the group).
        Err(CloudError::Api { code, .. }) if code == "ValidationError" => match ec2.instance_state(id).await? {
            Some(s) if !s.is_gone() => Err(CloudError::InvalidRequest(format!(
                "instance {id} is tagged with an Auto Scaling group that does not manage it; terminate it by hand or remove the aws:autoscaling:groupName tag"
            ))
            .into()),
            _ => Ok(()),
        },
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_instance_terminated_is_the_recorded_one_confirmed_by_the_node() {
        use super::instance_to_terminate as pick;
        let aws = "aws:///us-west-2a/i-0abc";
        assert_eq!(
            pick("n1", Some("i-0abc"), Some(aws)),
            Ok(Some("i-0abc".into()))
        );
        // Nothing recorded: nothing terminated, whatever the node says.
        assert_eq!(pick("n1", None, Some(aws)), Ok(None));
        assert_eq!(pick("n1", None, None), Ok(None));
        // A status naming another instance than the node runs on.
        let other = pick("n1", Some("i-0fff"), Some(aws)).unwrap_err();
        assert!(
            other.contains("i-0abc") && other.contains("i-0fff"),
            "{other}"
        );
        // A node that no longer names an instance, or names something that is not one.
        assert!(
            pick("n1", Some("i-0abc"), None)
                .unwrap_err()
                .contains("unset")
        );
        assert!(pick("n1", Some("i-0abc"), Some("kind://x")).is_err());
    }

    use super::*;

    #[test]
    fn a_nodeclaim_naming_another_node_or_instance_is_not_deleted() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"}, "spec": {"providerID": "aws:///us-west-2a/i-0abc"}
        }))
        .expect("a node");
        let claim = |status: serde_json::Value| serde_json::json!({"metadata": {"name": "default-x"}, "status": status});
        assert_eq!(
            claim_is_the_nodes(
                &claim(
                    serde_json::json!({"nodeName": "n1", "providerID": "aws:///us-west-2a/i-0abc"})
                ),
                &node
            ),
            Ok(())
        );
        // Not registered yet: nothing to contradict.
        assert_eq!(
            claim_is_the_nodes(&claim(serde_json::json!({})), &node),
            Ok(())
        );
        let other_node =
            claim_is_the_nodes(&claim(serde_json::json!({"nodeName": "n2"})), &node).unwrap_err();
        assert!(other_node.contains("belongs to node n2"), "{other_node}");
        let other_instance = claim_is_the_nodes(
            &claim(serde_json::json!({"nodeName": "n1", "providerID": "aws:///us-west-2a/i-0fff"})),
            &node,
        )
        .unwrap_err();
        assert!(
            other_instance.contains("i-0fff") && other_instance.contains("i-0abc"),
            "{other_instance}"
        );
    }

    fn spec(terminate_instance: bool, delete_node: bool) -> TerminationSpec {
        TerminationSpec {
            terminate_instance,
            delete_node,
            ..TerminationSpec::default()
        }
    }

    #[test]
    fn karpenters_nodes_go_back_to_karpenter_or_are_kept_whole() {
        let t = Termination::decide(&spec(true, true), Some("default-x7k2p"), Some("i-1"));
        assert_eq!(t, Termination::DeleteNodeClaim("default-x7k2p".into()));
        assert!(t.expect_gone() && !t.needs_record(false) && t.needs_record(true));
        let kept = Termination::decide(&spec(false, true), Some("default-x7k2p"), Some("i-1"));
        assert!(matches!(kept, Termination::KeepKarpenters(_)));
        assert!(!kept.expect_gone());
    }

    #[test]
    fn other_nodes_are_terminated_and_deleted_as_the_spec_asks() {
        let t = Termination::decide(&spec(true, true), None, Some("i-1"));
        assert_eq!(
            t,
            Termination::Direct {
                terminate: Some("i-1".into()),
                delete_node: true
            }
        );
        assert!(
            t.needs_record(false),
            "an instance is recorded before it is terminated"
        );
        let no_id = Termination::decide(&spec(true, false), None, None);
        assert_eq!(
            no_id,
            Termination::Direct {
                terminate: None,
                delete_node: false
            }
        );
        assert!(!no_id.expect_gone() && !no_id.needs_record(false));
    }

    #[test]
    fn a_node_with_the_same_name_and_another_uid_is_another_node() {
        let mut node = Node::default();
        node.metadata.uid = Some("b".into());
        assert!(is_other_node(Some("a"), &node));
        assert!(!is_other_node(Some("b"), &node));
        assert!(!is_other_node(None, &node));
    }
}
