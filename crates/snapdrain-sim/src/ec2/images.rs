//! AMIs and instance types with their processor architectures: DescribeImages, DescribeInstanceTypes,
//! and the architecture check RunInstances and CreateFleet make.
//!
//! EC2 API reference: DescribeImages (`ImageId.N`; each image's `imageId`, `name`, `imageState`,
//! `architecture`, `creationDate`; an id EC2 does not know is `InvalidAMIID.NotFound`), DescribeInstanceTypes
//! (`InstanceType.N`; `processorInfo.supportedArchitectures`; an unknown type is `InvalidInstanceType`,
//! "The following supplied instance types do not exist: [i8ge.xlarge]", as scylladb/scylla-cluster-tests
//! issue 12419 quotes it). A launch whose instance type cannot run the AMI's architecture is refused with
//! `InvalidParameterValue` and the message skypilot-org/skypilot issue 6315 and
//! aws/eks-anywhere-build-tooling pull 2158 quote from RunInstances ("The architecture 'arm64' of the
//! specified instance type does not match the architecture 'x86_64' of the specified AMI. Specify an
//! instance type and an AMI that have matching architectures, and try again. ..."); a type with several
//! architectures lists them comma-separated ('x86_64,i386', gardener/gardener-extension-provider-aws
//! issue 694). CreateFleet answers a mismatched override in its `errorSet` (code and message per
//! override, EC2 API reference CreateFleet "Errors"), as c6fc/warcannon issue 19 shows for a spot
//! request's launch specification.

use std::sync::Arc;

use super::Shared;
use super::actions::ApiError;
use super::params::Params;
use super::state::World;
use super::xml::Xml;

/// An AMI the simulated account can launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageConfig {
    pub id: String,
    pub name: String,
    /// `x86_64` or `arm64` (EC2's `ArchitectureValues`).
    pub architecture: String,
    /// ISO 8601, as DescribeImages answers `creationDate`.
    pub creation_date: String,
}

impl ImageConfig {
    /// A Bottlerocket aws-k8s image, named the way Bottlerocket publishes its AMIs
    /// (`bottlerocket-aws-k8s-<k8s>-<arch>-v<version>-<commit>`; research/bottlerocket-ec2-s3.md §1).
    pub fn bottlerocket(id: &str, k8s: &str, architecture: &str, version: &str) -> ImageConfig {
        ImageConfig {
            id: id.into(),
            name: format!("bottlerocket-aws-k8s-{k8s}-{architecture}-v{version}"),
            architecture: architecture.into(),
            creation_date: "2026-11-18T00:00:00.000Z".into(),
        }
    }
}

/// The Bottlerocket AMIs the simulator's own launches use: the image demo and tests launch replacements
/// with, Karpenter's default, and their arm64 counterparts.
pub const BOTTLEROCKET_X86_64: &str = "ami-0bottlerocket1350";
pub const BOTTLEROCKET_ARM64: &str = "ami-0bottlerocketa1350";

pub fn default_images() -> Vec<ImageConfig> {
    vec![
        ImageConfig::bottlerocket(BOTTLEROCKET_X86_64, "1.35", "x86_64", "1.42.0"),
        ImageConfig::bottlerocket(BOTTLEROCKET_ARM64, "1.35", "arm64", "1.42.0"),
        ImageConfig::bottlerocket("ami-0bottlerocket00001", "1.35", "x86_64", "1.42.0"),
        ImageConfig::bottlerocket("ami-0bottlerocket00002", "1.35", "arm64", "1.42.0"),
    ]
}

/// Instance families the simulator knows, with the architectures their processors run (EC2 user guide,
/// "Amazon EC2 instance types": the Graviton families, with a `g` after the generation, are arm64; the
/// Intel and AMD ones x86_64, the oldest also i386).
const FAMILIES: &[(&[&str], &[&str])] = &[
    (
        &[
            "a1", "m6g", "m6gd", "m7g", "m7gd", "m8g", "c6g", "c6gd", "c6gn", "c7g", "c7gd",
            "c7gn", "c8g", "r6g", "r6gd", "r7g", "r7gd", "r8g", "t4g", "x2gd", "im4gn", "is4gen",
            "i4g",
        ],
        &["arm64"],
    ),
    (
        &[
            "m5", "m5a", "m5d", "m5n", "m6i", "m6id", "m6a", "m7i", "m7a", "m8i", "c5", "c5a",
            "c5d", "c5n", "c6i", "c6id", "c6a", "c7i", "c7a", "r5", "r5a", "r5d", "r6i", "r6id",
            "r6a", "r7i", "r7a", "t3", "t3a", "i3", "i4i", "p4d", "p5", "g5", "g6", "inf2", "trn1",
            "x2idn",
        ],
        &["x86_64"],
    ),
    (&["m1", "c1", "t1", "t2"], &["i386", "x86_64"]),
];

/// The architectures `instance_type` runs, or None when the simulator does not know its family.
pub fn instance_type_architectures(instance_type: &str) -> Option<&'static [&'static str]> {
    let (family, size) = instance_type.split_once('.')?;
    if size.is_empty() {
        return None;
    }
    FAMILIES
        .iter()
        .find(|(families, _)| families.contains(&family))
        .map(|(_, archs)| *archs)
}

/// EC2's refusal of a launch with an AMI the account cannot see: RunInstances answers
/// `InvalidAMIID.NotFound`, "The image id '[ami-26fc345b]' does not exist" (as EC2 answered
/// RunInstances in ambrosejcarr/seqc issue 324 and amplab/training issue 157; the same code and message
/// as DescribeImages); CreateFleet puts it in the override's errorSet entry. `None` when the image is
/// known, or malformed (refused as `InvalidAMIID.Malformed` before this is asked), or an SSM parameter
/// (`resolve:ssm:`, which the simulator cannot resolve: launched as given).
pub(super) fn unknown_image(world: &World, image_id: &str) -> Option<ApiError> {
    if !image_id.starts_with("ami-") || world.images.contains_key(image_id) {
        return None;
    }
    Some(ApiError::new(
        400,
        "InvalidAMIID.NotFound",
        format!("The image id '[{image_id}]' does not exist"),
    ))
}

/// EC2's refusal of a launch whose instance type cannot run the AMI, or None when it can (or when the
/// simulator knows the AMI or the type not: it cannot tell).
pub(super) fn architecture_mismatch(
    world: &World,
    image_id: &str,
    instance_type: &str,
) -> Option<ApiError> {
    let image_arch = world.images.get(image_id).map(|i| i.architecture.clone())?;
    let type_archs = instance_type_architectures(instance_type)?;
    if type_archs.contains(&image_arch.as_str()) {
        return None;
    }
    Some(ApiError::new(
        400,
        "InvalidParameterValue",
        mismatch_message(type_archs, &image_arch),
    ))
}

pub(super) fn mismatch_message(type_archs: &[&str], image_arch: &str) -> String {
    // EC2 lists a multi-architecture type's newest first ('x86_64,i386').
    let mut archs: Vec<&str> = type_archs.to_vec();
    archs.sort_by_key(|a| *a == "i386");
    format!(
        "The architecture '{}' of the specified instance type does not match the architecture '{image_arch}' of the specified AMI. Specify an instance type and an AMI that have matching architectures, and try again. You can use 'describe-instance-types' or 'describe-images' to discover the architecture of the instance type or AMI.",
        archs.join(",")
    )
}

/// DescribeImages by `ImageId.N` (every image of the account when none). `Filter.N` is refused: the
/// simulator answers by id only.
pub(super) fn describe_images(
    shared: &Arc<Shared>,
    p: &Params,
    x: &mut Xml,
) -> Result<(), ApiError> {
    if let Some(f) = p.structs("Filter").first() {
        return Err(ApiError::new(
            400,
            "InvalidParameterValue",
            format!(
                "The filter '{}' is invalid (the simulator answers DescribeImages by ImageId only)",
                f.get("Name").unwrap_or_default()
            ),
        ));
    }
    let ids = p.list("ImageId");
    for id in &ids {
        if !id.starts_with("ami-") {
            return Err(ApiError::new(
                400,
                "InvalidAMIID.Malformed",
                format!("Invalid id: \"{id}\" (expecting \"ami-...\")"),
            ));
        }
    }
    let world = shared.world();
    let unknown: Vec<&str> = ids
        .iter()
        .filter(|id| !world.images.contains_key(*id))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        return Err(ApiError::new(
            400,
            "InvalidAMIID.NotFound",
            format!("The image id '[{}]' does not exist", unknown.join(", ")),
        ));
    }
    x.open("imagesSet");
    for image in world
        .images
        .values()
        .filter(|i| ids.is_empty() || ids.contains(&i.id))
    {
        x.open("item")
            .leaf("imageId", &image.id)
            .leaf("imageLocation", format!("amazon/{}", image.name))
            .leaf("imageState", "available")
            .leaf("imageOwnerId", "092701018921")
            .leaf("creationDate", &image.creation_date)
            .leaf("isPublic", "true")
            .leaf("architecture", &image.architecture)
            .leaf("imageType", "machine")
            .leaf("name", &image.name)
            .leaf("rootDeviceType", "ebs")
            .leaf("rootDeviceName", "/dev/xvda")
            .leaf("virtualizationType", "hvm")
            .leaf("hypervisor", "xen")
            .leaf("enaSupport", "true")
            .close("item");
    }
    x.close("imagesSet");
    Ok(())
}

/// DescribeInstanceTypes by `InstanceType.N` (the request must name them: the simulator does not list
/// every type EC2 has).
pub(super) fn describe_instance_types(p: &Params, x: &mut Xml) -> Result<(), ApiError> {
    if let Some(f) = p.structs("Filter").first() {
        return Err(ApiError::new(
            400,
            "InvalidParameterValue",
            format!(
                "The filter '{}' is invalid (the simulator answers DescribeInstanceTypes by InstanceType only)",
                f.get("Name").unwrap_or_default()
            ),
        ));
    }
    let types = p.list("InstanceType");
    if types.is_empty() {
        return Err(ApiError::new(
            400,
            "MissingParameter",
            "The simulator answers DescribeInstanceTypes for the instance types the request names (InstanceType.N)",
        ));
    }
    let unknown: Vec<&str> = types
        .iter()
        .filter(|t| instance_type_architectures(t).is_none())
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        return Err(ApiError::new(
            400,
            "InvalidInstanceType",
            format!(
                "The following supplied instance types do not exist: [{}]",
                unknown.join(", ")
            ),
        ));
    }
    x.open("instanceTypeSet");
    for t in &types {
        let archs = instance_type_architectures(t).unwrap_or_default();
        x.open("item")
            .leaf("instanceType", t)
            .leaf("currentGeneration", "true")
            .open("processorInfo")
            .open("supportedArchitectures");
        for a in archs {
            x.leaf("item", a);
        }
        x.close("supportedArchitectures")
            .leaf(
                "manufacturer",
                if archs.contains(&"arm64") {
                    "AWS"
                } else {
                    "Intel"
                },
            )
            .close("processorInfo")
            .close("item");
    }
    x.close("instanceTypeSet");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graviton_families_are_arm64_the_others_x86_64() {
        for t in ["m6g.large", "m7g.xlarge", "c7g.large", "r7g.2xlarge"] {
            assert_eq!(instance_type_architectures(t), Some(&["arm64"][..]), "{t}");
        }
        for t in [
            "m5.large",
            "m6i.xlarge",
            "c6i.large",
            "r6i.large",
            "m7i.large",
        ] {
            assert_eq!(instance_type_architectures(t), Some(&["x86_64"][..]), "{t}");
        }
        assert_eq!(instance_type_architectures("m9z.large"), None);
        assert_eq!(instance_type_architectures("m6g"), None);
    }

    #[test]
    fn the_refusal_names_both_architectures_as_ec2_does() {
        assert_eq!(
            mismatch_message(&["arm64"], "x86_64"),
            "The architecture 'arm64' of the specified instance type does not match the architecture 'x86_64' of the specified AMI. Specify an instance type and an AMI that have matching architectures, and try again. You can use 'describe-instance-types' or 'describe-images' to discover the architecture of the instance type or AMI."
        );
        assert!(mismatch_message(&["i386", "x86_64"], "arm64").starts_with(
            "The architecture 'x86_64,i386' of the specified instance type does not match the architecture 'arm64'"
        ));
    }
}
