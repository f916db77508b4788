//! The replacement's join settings, resolved and recorded while planning: a plan whose replacement
//! could never be built fails in Pending, before its node is cordoned, backed up, drained or
//! terminated, instead of after, with the cluster a node short.
//!
//! Reads only: the EC2NodeClass the plan names (`spec.replacement.nodeClassRef`); the replaced instances (DescribeInstances, recorded as the plan's instance records, which
//! Terminating and Replacing then use); for cluster settings neither the plan nor the controller's
//! flags give, their user data (DescribeInstanceAttribute `userData`); the subnets the plan names
//! (DescribeSubnets); the version of the launch template the launch uses (DescribeLaunchTemplateVersions);
//! the replacement AMI's architecture and the instance types' (DescribeImages, DescribeInstanceTypes:
//! [`super::architecture`]).

use kube::api::{Api, DynamicObject};

use crate::api::DisruptionPlan;
use crate::api::karpenter::{Ami, Ec2NodeClass, ec2nodeclass_resource};
use crate::api::plan::{PlanMode, ReplacementSpec, ReplacementWhen};
use crate::api::status::{DisruptionPlanStatus, NodeClassRecord};
use crate::cloud::bottlerocket::{self, cluster_settings};
use crate::controller::error::ControllerError;
use crate::controller::step::Io;
use crate::planning::join::{
    ClusterDefaults, InstanceUserData, UserData, needed_keys, resolve_cluster, resolve_node,
    unset_keys,
};
use crate::planning::node_class::{ClassLaunch, node_record, resolve_class};

use super::instance::{Instance, observe};
use super::replace::{join_timeout, node_settings};

/// The plan launches replacements: Execute mode with `replacement.when` set, not a dry run (a dry run
/// reads nothing from EC2).
pub fn launches(plan: &DisruptionPlan) -> Option<&ReplacementSpec> {
    let spec = &plan.spec;
    spec.replacement
        .as_ref()
        .filter(|r| r.when != ReplacementWhen::None)
        .filter(|_| spec.mode == PlanMode::Execute && !spec.dry_run)
}

/// Resolves what every node's replacement joins with and records it in `status` (with each replaced
/// instance's record). `Ok(Err(message))`: no replacement could be built; the message names what is
/// missing and where to set it. `Err`: EC2 could not be asked (retried).
pub async fn resolve(
    spec: &ReplacementSpec,
    io: &Io<'_>,
    status: &mut DisruptionPlanStatus,
) -> Result<Result<(), String>, ControllerError> {
    if let Err(why) = join_timeout(spec) {
        return Ok(Err(why));
    }
    // A node class that cannot launch fails the plan alone: nothing else about the launch matters.
    let class = match &spec.node_class_ref {
        None => None,
        Some(r) => match node_class(io, &r.name).await? {
            Ok(c) => Some(c),
            Err(why) => return Ok(Err(why)),
        },
    };
    // Every problem is reported at once, so one edit of the plan (or the flags) fixes them all.
    let mut problems = Vec::new();
    let mut records = Vec::with_capacity(status.nodes.len());
    let mut image_name = None;
    for i in 0..status.nodes.len() {
        let record = match observe(status, i, io).await? {
            Instance::New(r) => {
                status.nodes[i].instance = Some(r.clone());
                Some(r)
            }
            Instance::Known(r) => r,
            // Terminated already: nothing about how it ran is left to copy.
            Instance::Gone(_) => None,
        };
        let node = &status.nodes[i];
        let resolved = match &class {
            Some((launch, amis)) => {
                let labels = io
                    .caches
                    .nodes
                    .get("", &node.name)
                    .and_then(|n| n.metadata.labels.clone())
                    .unwrap_or_default();
                node_record(launch, amis, &node.name, &labels).map(|(r, name)| {
                    image_name = image_name.take().or(name);
                    r
                })
            }
            None => resolve_node(
                spec,
                &node.name,
                node.instance_id.as_deref(),
                record.as_ref(),
            )
            .map_err(|e| e.to_string()),
        };
        match resolved {
            Ok(join) => records.push((Some(join), record.is_some())),
            Err(e) => {
                problems.push(e);
                records.push((None, record.is_some()));
            }
        }
    }
    let settings = io.settings;
    let defaults = ClusterDefaults {
        cluster_name: settings.cluster_name.as_deref(),
        api_server: settings.api_server.as_deref(),
        cluster_certificate: settings.cluster_certificate.as_deref(),
    };
    let mut unset = unset_keys(spec, &defaults);
    let mut read = Vec::new();
    for (i, (_, described)) in records.iter().enumerate() {
        if unset.is_empty() {
            break;
        }
        let node = &status.nodes[i];
        let Some(id) = node.instance_id.as_deref().filter(|_| *described) else {
            continue;
        };
        let user_data = user_data(io, id).await?;
        if let UserData::Read(s) = &user_data {
            unset.retain(|k| k.of(s).is_none());
        }
        read.push(InstanceUserData {
            node: node.name.clone(),
            instance: id.to_string(),
            user_data,
        });
    }
    let cluster = resolve_cluster(spec, &defaults, &read)
        .map_err(|e| problems.push(e.to_string()))
        .ok();
    problems.extend(launch_targets(spec, io).await?);
    // A template or version EC2 does not have would only be refused at launch, after the drain.
    let template = match super::architecture::read_template(spec, io).await? {
        None => None,
        Some(Ok(t)) => Some(t),
        Some(Err(why)) => {
            problems.push(why);
            None
        }
    };
    // The AMI each replacement gets (the plan's, the node's, or the template version's) against its
    // instance types: the types that cannot run it are dropped from the node's record, a node left with
    // none is a problem.
    let nodes: Vec<_> = status
        .nodes
        .iter()
        .zip(&records)
        .map(|(n, (join, _))| (n.name.clone(), join.clone()))
        .collect();
    let (checked, mismatched) = if spec.launch_template.is_some() && template.is_none() {
        // The template could not be read (a problem already): nothing to check the AMI against.
        (nodes.into_iter().map(|(_, j)| j).collect(), Vec::new())
    } else {
        super::architecture::check(spec, io, &nodes, template.as_ref()).await?
    };
    problems.extend(mismatched);
    for ((join, _), checked) in records.iter_mut().zip(checked) {
        *join = checked;
    }
    let Some(cluster) = cluster.filter(|_| problems.is_empty()) else {
        return Ok(Err(problems.join("; ")));
    };
    let class_user_data = class
        .as_ref()
        .and_then(|(l, _)| Some((l.record.name.clone(), l.user_data.clone()?)));
    let class_record = class.map(|(launch, _)| NodeClassRecord {
        image_name,
        ..launch.record
    });
    // Rendered (and validated as the host would) now, so a label kubelet refuses or settings that are
    // not TOML fail the plan here rather than at launch.
    if needed_keys(spec).len() > 1
        && let Err(e) = node_settings(
            spec,
            &cluster,
            class_user_data
                .as_ref()
                .map(|(n, u)| (n.as_str(), u.as_str())),
        )
        .and_then(|s| bottlerocket::render(&s).map_err(|e| e.to_string()))
    {
        return Ok(Err(format!(
            "the replacement's user data would not boot: {e}"
        )));
    }
    for (node, (join, _)) in status.nodes.iter_mut().zip(records) {
        node.join = join;
    }
    status.join = Some(cluster);
    status.node_class = class_record;
    Ok(Ok(()))
}

/// The EC2NodeClass `name`, resolved for launching: `Ok(Err(message))` when it does not exist or cannot
/// launch (not Ready, a selector resolved to nothing). `Err`: the API server could not be asked
/// (retried), or refused (RBAC: the plan fails naming the permission).
pub(super) async fn node_class(
    io: &Io<'_>,
    name: &str,
) -> Result<Result<(ClassLaunch, Vec<Ami>), String>, ControllerError> {
    let api: Api<DynamicObject> = Api::all_with(io.client.clone(), &ec2nodeclass_resource());
    let found = api
        .get_opt(name)
        .await
        .map_err(|source| ControllerError::Read {
            what: format!("EC2NodeClass {name} (karpenter.k8s.aws/v1)"),
            source,
        })?;
    let Some(found) = found else {
        return Ok(Err(format!(
            "EC2NodeClass {name} (spec.replacement.nodeClassRef) does not exist: create it, name another (kubectl get ec2nodeclasses), or check that Karpenter's CRDs are installed"
        )));
    };
    let class: Ec2NodeClass = match serde_json::to_value(&found).and_then(serde_json::from_value) {
        Ok(c) => c,
        Err(e) => {
            return Ok(Err(format!(
                "EC2NodeClass {name} cannot be read as karpenter.k8s.aws/v1: {e}"
            )));
        }
    };
    Ok(resolve_class(&class).map(|launch| {
        let amis = class.status.map(|s| s.amis).unwrap_or_default();
        (launch, amis)
    }))
}

/// What instance `id`'s user data says about its cluster. A refusal no retry fixes (no
/// `ec2:DescribeInstanceAttribute` permission, say) makes it unusable, with the reason; a transient
/// failure is retried.
async fn user_data(io: &Io<'_>, id: &str) -> Result<UserData, ControllerError> {
    let ec2 = io.cloud.ec2().await?;
    Ok(match ec2.user_data(id).await {
        Ok(None) => UserData::Empty,
        Ok(Some(raw)) => match cluster_settings(&raw) {
            Ok(s) => UserData::Read(s),
            Err(e) => UserData::Unusable(format!("it is not Bottlerocket user data ({e})")),
        },
        Err(e) if e.is_permanent() => UserData::Unusable(format!(
            "{e} (snapdrain's IAM role needs ec2:DescribeInstanceAttribute, see deploy/iam/snapdrain-policy.json)"
        )),
        Err(e) => return Err(e.into()),
    })
}

/// What the plan names for the launch that EC2 does not have: its subnets (DescribeSubnets), which
/// would only be refused at launch, after the drain.
async fn launch_targets(
    spec: &ReplacementSpec,
    io: &Io<'_>,
) -> Result<Vec<String>, ControllerError> {
    let mut problems = Vec::new();
    if spec.subnets.is_empty() {
        // Copied from the replaced instances, which run in them (or the launch template's).
        return Ok(problems);
    }
    let ec2 = io.cloud.ec2().await?;
    match ec2.subnet_zones(&spec.subnets).await {
        Ok(zones) => {
            let unknown: Vec<&str> = spec
                .subnets
                .iter()
                .filter(|s| !zones.contains_key(*s))
                .map(String::as_str)
                .collect();
            if !unknown.is_empty() {
                problems.push(format!(
                    "spec.replacement.subnets names subnets EC2 does not have in this region: {}",
                    unknown.join(", ")
                ));
            }
        }
        Err(e) if e.is_permanent() => {
            problems.push(format!("spec.replacement.subnets cannot be used: {e}"))
        }
        Err(e) => return Err(e.into()),
    }
    Ok(problems)
}
