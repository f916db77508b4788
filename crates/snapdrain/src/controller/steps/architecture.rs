//! While planning: the architecture of each replacement's AMI (DescribeImages) against the plan's
//! instance types (DescribeInstanceTypes). EC2 would refuse a type that cannot run the AMI only at
//! launch, after the drain ([`crate::planning::architecture`]); here the types that cannot are dropped
//! from the node's join record, and a node none of whose types can fails the plan before any node is
//! touched.

use std::collections::BTreeMap;

use crate::api::plan::ReplacementSpec;
use crate::api::status::NodeJoinRecord;
use crate::cloud::ec2::{CloudError, ImageInfo};
use crate::controller::error::ControllerError;
use crate::controller::step::Io;
use crate::planning::architecture::{LaunchImage, fit_instance_types};

/// Checks every node's AMI against the plan's instance types and records, in each node's join record,
/// the AMI's architecture and the types kept. Returns the problems (a node without a fitting type, an
/// AMI or type EC2 does not have, a refused Describe call). `Err`: EC2 could not be asked (retried).
/// Not checked: a launch whose AMI or types only a launch template names.
pub async fn check(
    spec: &ReplacementSpec,
    io: &Io<'_>,
    nodes: &[(String, Option<NodeJoinRecord>)],
) -> Result<(Vec<Option<NodeJoinRecord>>, Vec<String>), ControllerError> {
    let mut records: Vec<Option<NodeJoinRecord>> = nodes.iter().map(|(_, r)| r.clone()).collect();
    let image_of = |r: &NodeJoinRecord| spec.image_id.clone().or_else(|| r.image_id.clone());
    let mut images: Vec<String> = records.iter().flatten().filter_map(image_of).collect();
    images.sort();
    images.dedup();
    if spec.instance_types.is_empty() || images.is_empty() {
        return Ok((records, Vec::new()));
    }
    let ec2 = io.cloud.ec2().await?;
    let described = match ec2.describe_images(&images).await {
        Ok(d) => d,
        Err(e) if e.is_permanent() => {
            return Ok((records, vec![refused(&e, "DescribeImages", "AMI", &images)]));
        }
        Err(e) => return Err(e.into()),
    };
    let architectures = match ec2.instance_type_architectures(&spec.instance_types).await {
        Ok(a) => a,
        Err(e) if e.is_permanent() => {
            return Ok((
                records,
                vec![refused(
                    &e,
                    "DescribeInstanceTypes",
                    "instance types",
                    &spec.instance_types,
                )],
            ));
        }
        Err(e) => return Err(e.into()),
    };
    let by_id: BTreeMap<&str, &ImageInfo> = described.iter().map(|i| (i.id.as_str(), i)).collect();
    let mut problems = Vec::new();
    for ((node, _), record) in nodes.iter().zip(records.iter_mut()) {
        let Some(record) = record.as_mut() else {
            continue;
        };
        let Some(id) = image_of(record) else {
            continue;
        };
        let Some(info) = by_id.get(id.as_str()) else {
            problems.push(format!(
                "AMI {id} of node {node}'s replacement: EC2 DescribeImages did not describe it; it does not exist in this region or is not shared with the account"
            ));
            continue;
        };
        let Some(architecture) = info.architecture.as_deref() else {
            continue;
        };
        let source = if spec.image_id.is_some() {
            "spec.replacement.imageId".to_string()
        } else {
            record
                .from
                .iter()
                .find_map(|f| f.strip_prefix("imageId: "))
                .unwrap_or("the join settings")
                .to_string()
        };
        let image = LaunchImage {
            id: &id,
            name: info.name.as_deref(),
            architecture,
            source: &source,
        };
        match fit_instance_types(node, &image, &spec.instance_types, &architectures) {
            Ok(fit) => {
                record.from.push(fit.note(&image));
                record.image_architecture = Some(architecture.to_string());
                record.instance_types = fit.kept;
            }
            Err(why) => problems.push(why),
        }
    }
    Ok((records, problems))
}

/// A Describe call EC2 refused for good: which, for what, and what to change (an AMI or instance type
/// EC2 does not have, or the IAM action).
fn refused(e: &CloudError, action: &str, noun: &str, what: &[String]) -> String {
    let hint = match e.code() {
        Some("UnauthorizedOperation" | "AccessDenied") => format!(
            "; snapdrain's IAM role needs ec2:{action}, see deploy/iam/snapdrain-policy.json"
        ),
        Some("InvalidAMIID.NotFound" | "InvalidAMIID.Malformed") => "; the AMI does not exist in this region or is not shared with the account: set spec.replacement.imageId (or the EC2NodeClass's amiSelectorTerms) to one that does".to_string(),
        Some("InvalidInstanceType") => {
            "; fix spec.replacement.instanceTypes (aws ec2 describe-instance-types lists the region's)"
                .to_string()
        }
        _ => String::new(),
    };
    format!(
        "the replacement's {noun} {} cannot be launched: {e}{hint}",
        what.join(", ")
    )
}
