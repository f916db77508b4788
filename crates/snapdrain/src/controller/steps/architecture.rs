//! While planning: the architecture of each replacement's AMI (DescribeImages) against its instance
//! types (DescribeInstanceTypes). EC2 would refuse a type that cannot run the AMI only at launch, after
//! the drain ([`crate::planning::architecture`]); here the types that cannot are dropped from the node's
//! join record, and a node none of whose types can fails the plan before any node is touched. A launch
//! from a launch template takes the AMI and type the plan does not name from the template version it
//! launches, read with DescribeLaunchTemplateVersions ([`read_template`]).

use std::collections::BTreeMap;

use crate::api::plan::ReplacementSpec;
use crate::api::status::NodeJoinRecord;
use crate::cloud::ec2::{CloudError, ImageInfo, LaunchTemplateRef};
use crate::controller::error::ControllerError;
use crate::controller::step::Io;
use crate::planning::architecture::{
    LaunchImage, LaunchTypes, ReadTemplate, fit_instance_types, template_launch,
    unreadable_template,
};

/// The version of `spec.replacement.launchTemplate` the launch uses (`version`, else `$Default`, as
/// the launch names it), read with DescribeLaunchTemplateVersions. `Ok(None)`: the plan names no
/// template. `Ok(Some(Err(message)))`: EC2 has no such template or version, or refused to say; the
/// message names the template and the fix. `Err`: EC2 could not be asked (retried).
pub async fn read_template(
    spec: &ReplacementSpec,
    io: &Io<'_>,
) -> Result<Option<Result<ReadTemplate, String>>, ControllerError> {
    let Some(t) = &spec.launch_template else {
        return Ok(None);
    };
    let id_or_name = t.id_or_name().to_owned();
    let version = t.version_or_default().to_owned();
    let ec2 = io.cloud.ec2().await?;
    let asked = LaunchTemplateRef {
        id_or_name: id_or_name.clone(),
        version: version.clone(),
    };
    Ok(Some(match ec2.launch_template_version(&asked).await {
        Ok(described) => Ok(ReadTemplate {
            id_or_name,
            version,
            described,
        }),
        Err(e) if e.is_permanent() => Err(unreadable_template(
            &id_or_name,
            &version,
            e.code(),
            &e.to_string(),
        )),
        Err(e) => return Err(e.into()),
    }))
}

/// Checks every node's AMI against its instance types and records, in each node's join record, the
/// AMI's architecture and the types kept. The AMI is the plan's, else the node's (copied from the
/// replaced instance or the node class), else the launch template version's; the types are the plan's,
/// else the template version's `InstanceType`. Returns the problems (a node without a fitting type, an
/// AMI or type EC2 does not have, a refused Describe call, a template launch without an AMI). `Err`:
/// EC2 could not be asked (retried). Not checked: a template version that chooses its types by
/// attributes (`InstanceRequirements`) and a plan naming none.
pub async fn check(
    spec: &ReplacementSpec,
    io: &Io<'_>,
    nodes: &[(String, Option<NodeJoinRecord>)],
    template: Option<&ReadTemplate>,
) -> Result<(Vec<Option<NodeJoinRecord>>, Vec<String>), ControllerError> {
    let mut records: Vec<Option<NodeJoinRecord>> = nodes.iter().map(|(_, r)| r.clone()).collect();
    let launch = match template
        .map(|t| template_launch(t, spec.image_id.as_deref(), &spec.instance_types))
        .transpose()
    {
        Ok(l) => l,
        Err(why) => return Ok((records, vec![why])),
    };
    if let Some(l) = &launch {
        // The launch names the version checked here, not `$Latest`/`$Default` again.
        let number = template.and_then(|t| t.described.version_number);
        for record in records.iter_mut().flatten() {
            record.from.push(l.note.clone());
            record.launch_template_version = number.map(|n| n.to_string());
        }
    }
    let template_image = launch.as_ref().and_then(|l| l.image_id.clone());
    let image_of = |r: &NodeJoinRecord| {
        spec.image_id
            .clone()
            .or_else(|| r.image_id.clone())
            .or_else(|| template_image.clone())
    };
    let (instance_types, types_from) = match &launch {
        Some(l) if spec.instance_types.is_empty() => {
            (l.instance_types.clone(), l.types_from.clone())
        }
        _ => (
            spec.instance_types.clone(),
            "spec.replacement.instanceTypes".to_string(),
        ),
    };
    let types_from_template = spec.instance_types.is_empty();
    let mut images: Vec<String> = records.iter().flatten().filter_map(image_of).collect();
    images.sort();
    images.dedup();
    if instance_types.is_empty() || images.is_empty() {
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
    let architectures = match ec2.instance_type_architectures(&instance_types).await {
        Ok(a) => a,
        Err(e) if e.is_permanent() => {
            return Ok((
                records,
                vec![refused(
                    &e,
                    "DescribeInstanceTypes",
                    "instance types",
                    &instance_types,
                )],
            ));
        }
        Err(e) => return Err(e.into()),
    };
    let by_id: BTreeMap<&str, &ImageInfo> = described.iter().map(|i| (i.id.as_str(), i)).collect();
    let types = LaunchTypes {
        names: &instance_types,
        from: &types_from,
    };
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
        } else if record.image_id.is_none()
            && let Some(l) = &launch
        {
            l.image_source.clone()
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
        match fit_instance_types(node, &image, &types, &architectures) {
            Ok(fit) => {
                record.from.push(fit.note(&image, &types));
                record.image_architecture = Some(architecture.to_string());
                // A template's own type is what the launch takes without being told.
                if !types_from_template {
                    record.instance_types = fit.kept;
                }
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
        Some("InvalidAMIID.NotFound" | "InvalidAMIID.Malformed") => "; the AMI does not exist in this region or is not shared with the account: set spec.replacement.imageId (or the EC2NodeClass's amiSelectorTerms, or the launch template's ImageId) to one that does".to_string(),
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
