//! Which of a replacement's instance types can run its AMI. EC2 refuses a launch whose instance type
//! does not support the AMI's architecture (RunInstances `InvalidParameterValue`: "The architecture
//! 'arm64' of the specified instance type does not match the architecture 'x86_64' of the specified
//! AMI...", as skypilot-org/skypilot issue 6315 quotes it; CreateFleet answers it per override), so the
//! types that cannot are dropped while planning, and a plan none of whose types can fails before its
//! node is touched. Pure: the controller asks DescribeImages and DescribeInstanceTypes.
//!
//! A launch from a launch template takes the AMI and the instance type the plan does not name from the
//! template version it launches (RunInstances and CreateFleet overrides: request parameters override
//! the template; EC2 API reference, RunInstances `LaunchTemplate`), so the controller reads that version
//! (DescribeLaunchTemplateVersions) and [`template_launch`] says what the launch runs.

use std::collections::BTreeMap;

use crate::cloud::ec2::TemplateVersion;

/// The AMI a node's replacement launches with, as DescribeImages described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchImage<'a> {
    pub id: &'a str,
    pub name: Option<&'a str>,
    /// `x86_64`, `arm64`, ...
    pub architecture: &'a str,
    /// Where the AMI came from, e.g. `the replaced instance i-0abc` or `spec.replacement.imageId`.
    pub source: &'a str,
}

/// The instance types a replacement may launch, in order of preference, and where they come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchTypes<'a> {
    pub names: &'a [String],
    /// `spec.replacement.instanceTypes`, or the launch template version's `InstanceType`.
    pub from: &'a str,
}

/// The instance types that run the AMI, in the plan's order, and those dropped with their
/// architectures.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fit {
    pub kept: Vec<String>,
    pub dropped: Vec<(String, Vec<String>)>,
}

impl Fit {
    /// A line for the record's `from`: what was kept and why the others were dropped.
    pub fn note(&self, image: &LaunchImage<'_>, types: &LaunchTypes<'_>) -> String {
        let mut note = format!(
            "instanceTypes: {} that run {} AMI {}",
            types.from, image.architecture, image.id
        );
        if !self.dropped.is_empty() {
            note.push_str(&format!(" (dropped {})", list(&self.dropped)));
        }
        note
    }
}

fn list(types: &[(String, Vec<String>)]) -> String {
    types
        .iter()
        .map(|(t, a)| format!("{t} ({})", a.join(",")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Splits `instance_types` (the plan's order) by whether their architectures include the AMI's. `Err`:
/// none does; the message names the AMI, its architecture and source, every type with its
/// architectures, and what to change.
pub fn fit_instance_types(
    node: &str,
    image: &LaunchImage<'_>,
    types: &LaunchTypes<'_>,
    architectures: &BTreeMap<String, Vec<String>>,
) -> Result<Fit, String> {
    let mut fit = Fit::default();
    for t in types.names {
        let archs = architectures.get(t).cloned().unwrap_or_default();
        if archs.iter().any(|a| a == image.architecture) {
            fit.kept.push(t.clone());
        } else {
            fit.dropped.push((t.clone(), archs));
        }
    }
    if !fit.kept.is_empty() {
        return Ok(fit);
    }
    let named = image.name.map(|n| format!(" ({n})")).unwrap_or_default();
    let other: Vec<&str> = {
        let mut archs: Vec<&str> = fit
            .dropped
            .iter()
            .flat_map(|(_, a)| a.iter().map(String::as_str))
            .collect();
        archs.sort_unstable();
        archs.dedup();
        archs
    };
    Err(format!(
        "the replacement of node {node} cannot launch: its AMI {}{named}, from {}, is {}, and none of {} runs {}: {}; list {} instance types in spec.replacement.instanceTypes, or launch an AMI built for {}",
        image.id,
        image.source,
        image.architecture,
        types.from,
        image.architecture,
        list(&fit.dropped),
        image.architecture,
        if other.is_empty() {
            "their architecture".to_string()
        } else {
            other.join(" or ")
        },
    ))
}

/// The version of `spec.replacement.launchTemplate` a launch uses, as DescribeLaunchTemplateVersions
/// answered for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadTemplate {
    /// The plan's `launchTemplate.id` or `.name`.
    pub id_or_name: String,
    /// As the launch names it: a number, `$Latest` or `$Default`.
    pub version: String,
    pub described: TemplateVersion,
}

impl ReadTemplate {
    /// `launch template workers version 3 ($Latest)`.
    pub fn describe(&self) -> String {
        let number = self.described.version_number.map(|n| n.to_string());
        match number {
            Some(n) if n != self.version => format!(
                "launch template {} version {n} ({})",
                self.id_or_name, self.version
            ),
            _ => format!(
                "launch template {} version {}",
                self.id_or_name, self.version
            ),
        }
    }
}

/// What a launch from a template version runs besides what the plan names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateLaunch {
    /// The version's `ImageId`, used when the plan names no AMI.
    pub image_id: Option<String>,
    /// Where that AMI comes from: `launch template workers version 3 ($Latest)`.
    pub image_source: String,
    /// The types the launch may use when the plan names none: the version's `InstanceType`. Empty when
    /// the plan names types (they override the template's), or the version names none.
    pub instance_types: Vec<String>,
    /// Where those types come from, for messages.
    pub types_from: String,
    /// A line for the node's join record.
    pub note: String,
}

/// What a launch from `template` runs where the plan is silent: the plan's `imageId` and
/// `instanceTypes` win (request parameters override the template). `Err`: the launch could not run,
/// because neither the plan nor the version names an AMI (RunInstances: `MissingParameter`; an
/// instant fleet: "Parameter 'amiIdList' cannot be empty", aws/karpenter-provider-aws issue 1138), or
/// the version chooses its types by attributes and the plan names none: a launch without types is a
/// RunInstances, and attribute-based selection "is only supported when using Auto Scaling groups, EC2
/// Fleet, and Spot Fleet" (EC2 API reference, `InstanceRequirementsRequest`).
pub fn template_launch(
    template: &ReadTemplate,
    plan_image: Option<&str>,
    plan_types: &[String],
) -> Result<TemplateLaunch, String> {
    let at = template.describe();
    let v = &template.described;
    if plan_image.is_none() && v.image_id.is_none() {
        return Err(format!(
            "the replacement cannot launch from {at}: it names no AMI (ImageId) and neither does spec.replacement.imageId; set one of them"
        ));
    }
    if plan_types.is_empty() && v.instance_requirements {
        return Err(format!(
            "the replacement cannot launch from {at}: it chooses its instance types by attributes (InstanceRequirements), which EC2 launches only in an EC2 Fleet or an Auto Scaling group, never with RunInstances, and spec.replacement.instanceTypes names none; list the instance types to launch there (they override the template's and are checked against the AMI)"
        ));
    }
    let mut note = format!("launchTemplate: {at}");
    if plan_image.is_none()
        && let Some(image) = &v.image_id
    {
        note.push_str(&format!(", its AMI {image}"));
    }
    let instance_types = match (&v.instance_type, plan_types.is_empty()) {
        (Some(t), true) => {
            note.push_str(&format!(", its instance type {t}"));
            vec![t.clone()]
        }
        _ => Vec::new(),
    };
    Ok(TemplateLaunch {
        image_id: v.image_id.clone(),
        image_source: at.clone(),
        instance_types,
        types_from: format!("the instance type of {at}"),
        note,
    })
}

/// Why `spec.replacement.launchTemplate` cannot be used, from DescribeLaunchTemplateVersions' refusal
/// (`code`, `error` the whole error), naming the template and what to do.
pub fn unreadable_template(
    id_or_name: &str,
    version: &str,
    code: Option<&str>,
    error: &str,
) -> String {
    match code {
        Some(
            "InvalidLaunchTemplateId.NotFound" | "InvalidLaunchTemplateName.NotFoundException",
        ) => {
            format!(
                "spec.replacement.launchTemplate {id_or_name} does not exist in this region ({error}); create it, or name another (aws ec2 describe-launch-templates lists them)"
            )
        }
        Some("InvalidLaunchTemplateId.VersionNotFound") => format!(
            "spec.replacement.launchTemplate {id_or_name} has no version {version} ({error}); name a version it has in spec.replacement.launchTemplate.version (aws ec2 describe-launch-template-versions lists them), or leave it out for $Default"
        ),
        Some(
            "InvalidLaunchTemplateId.Malformed" | "InvalidLaunchTemplateName.MalformedException",
        ) => format!(
            "spec.replacement.launchTemplate {id_or_name} is not a launch template id or name EC2 accepts ({error}); fix it"
        ),
        Some("UnauthorizedOperation" | "AccessDenied") => format!(
            "spec.replacement.launchTemplate {id_or_name} cannot be read ({error}); snapdrain's IAM role needs ec2:DescribeLaunchTemplateVersions, see deploy/iam/snapdrain-policy.json"
        ),
        _ => format!(
            "spec.replacement.launchTemplate {id_or_name} version {version} cannot be read: {error}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN_TYPES: &str = "spec.replacement.instanceTypes";

    fn plan_types(names: &[String]) -> LaunchTypes<'_> {
        LaunchTypes {
            names,
            from: PLAN_TYPES,
        }
    }

    fn archs() -> BTreeMap<String, Vec<String>> {
        [
            ("m6g.large", "arm64"),
            ("m7g.large", "arm64"),
            ("m6i.large", "x86_64"),
        ]
        .iter()
        .map(|(t, a)| (t.to_string(), vec![a.to_string()]))
        .collect()
    }

    fn image() -> LaunchImage<'static> {
        LaunchImage {
            id: "ami-0x86",
            name: Some("bottlerocket-aws-k8s-1.35-x86_64-v1.42.0"),
            architecture: "x86_64",
            source: "the replaced instance i-0abc",
        }
    }

    fn types(t: &[&str]) -> Vec<String> {
        t.iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn a_mixed_list_keeps_the_types_that_run_the_ami_in_order() {
        let names = types(&["m6g.large", "m6i.large", "m7g.large"]);
        let fit = fit_instance_types("n1", &image(), &plan_types(&names), &archs())
            .expect("one type fits");
        assert_eq!(fit.kept, ["m6i.large"]);
        assert_eq!(
            fit.note(&image(), &plan_types(&names)),
            "instanceTypes: spec.replacement.instanceTypes that run x86_64 AMI ami-0x86 (dropped m6g.large (arm64), m7g.large (arm64))"
        );
    }

    #[test]
    fn no_type_that_runs_the_ami_names_the_ami_the_types_and_the_way_out() {
        let names = types(&["m6g.large", "m7g.large"]);
        let e = fit_instance_types("n1", &image(), &plan_types(&names), &archs())
            .expect_err("nothing fits");
        assert_eq!(
            e,
            "the replacement of node n1 cannot launch: its AMI ami-0x86 (bottlerocket-aws-k8s-1.35-x86_64-v1.42.0), from the replaced instance i-0abc, is x86_64, and none of spec.replacement.instanceTypes runs x86_64: m6g.large (arm64), m7g.large (arm64); list x86_64 instance types in spec.replacement.instanceTypes, or launch an AMI built for arm64"
        );
    }

    #[test]
    fn every_type_that_runs_the_ami_is_kept() {
        let names = types(&["m6i.large"]);
        let fit = fit_instance_types("n1", &image(), &plan_types(&names), &archs()).expect("fits");
        assert_eq!(fit.kept, ["m6i.large"]);
        assert!(fit.dropped.is_empty());
    }

    fn read(version: &str, number: i64, image: Option<&str>, t: Option<&str>) -> ReadTemplate {
        ReadTemplate {
            id_or_name: "workers".into(),
            version: version.into(),
            described: TemplateVersion {
                template_id: Some("lt-0123456789abcdef0".into()),
                version_number: Some(number),
                image_id: image.map(str::to_string),
                instance_type: t.map(str::to_string),
                instance_requirements: false,
            },
        }
    }

    #[test]
    fn a_template_launch_takes_the_ami_and_type_the_plan_does_not_name() {
        let t = read("$Latest", 3, Some("ami-0arm"), Some("m6i.large"));
        let l = template_launch(&t, None, &[]).expect("launches");
        assert_eq!(l.image_id.as_deref(), Some("ami-0arm"));
        assert_eq!(
            l.image_source,
            "launch template workers version 3 ($Latest)"
        );
        assert_eq!(l.instance_types, ["m6i.large"]);
        assert_eq!(
            l.note,
            "launchTemplate: launch template workers version 3 ($Latest), its AMI ami-0arm, its instance type m6i.large"
        );
        // The arm64 AMI against the template's x86_64 type: the message names where both come from.
        let image = LaunchImage {
            id: "ami-0arm",
            name: None,
            architecture: "arm64",
            source: &l.image_source,
        };
        let e = fit_instance_types(
            "n1",
            &image,
            &LaunchTypes {
                names: &l.instance_types,
                from: &l.types_from,
            },
            &archs(),
        )
        .expect_err("an x86_64 type cannot run an arm64 AMI");
        assert_eq!(
            e,
            "the replacement of node n1 cannot launch: its AMI ami-0arm, from launch template workers version 3 ($Latest), is arm64, and none of the instance type of launch template workers version 3 ($Latest) runs arm64: m6i.large (x86_64); list arm64 instance types in spec.replacement.instanceTypes, or launch an AMI built for x86_64"
        );
    }

    #[test]
    fn the_plans_types_and_ami_override_the_templates() {
        let t = read("2", 2, Some("ami-0arm"), Some("m6i.large"));
        let l = template_launch(&t, Some("ami-0x86"), &types(&["m6g.large"])).expect("launches");
        assert!(l.instance_types.is_empty(), "the plan's types are used");
        assert_eq!(l.note, "launchTemplate: launch template workers version 2");
    }

    #[test]
    fn a_template_and_a_plan_without_an_ami_cannot_launch() {
        let t = read("$Default", 1, None, Some("m6i.large"));
        let e = template_launch(&t, None, &[]).expect_err("no AMI");
        assert_eq!(
            e,
            "the replacement cannot launch from launch template workers version 1 ($Default): it names no AMI (ImageId) and neither does spec.replacement.imageId; set one of them"
        );
        assert!(template_launch(&t, Some("ami-1"), &[]).is_ok());
    }

    #[test]
    fn a_template_choosing_types_by_attributes_needs_the_plan_to_name_types() {
        let mut t = read("$Default", 4, Some("ami-0x86"), None);
        t.described.instance_requirements = true;
        let e =
            template_launch(&t, None, &[]).expect_err("RunInstances takes no InstanceRequirements");
        assert!(
            e.starts_with("the replacement cannot launch from launch template workers version 4 ($Default): it chooses its instance types by attributes (InstanceRequirements)"),
            "{e}"
        );
        assert!(e.contains("spec.replacement.instanceTypes"), "{e}");
        let l = template_launch(&t, None, &types(&["m6i.large", "m6i.xlarge"])).expect("launches");
        assert!(l.instance_types.is_empty(), "the plan's types are used");
    }

    #[test]
    fn an_unreadable_template_names_the_template_and_the_fix() {
        assert_eq!(
            unreadable_template(
                "workers",
                "$Default",
                Some("InvalidLaunchTemplateName.NotFoundException"),
                "EC2 DescribeLaunchTemplateVersions failed with InvalidLaunchTemplateName.NotFoundException: The specified launch template, with template name workers, does not exist."
            ),
            "spec.replacement.launchTemplate workers does not exist in this region (EC2 DescribeLaunchTemplateVersions failed with InvalidLaunchTemplateName.NotFoundException: The specified launch template, with template name workers, does not exist.); create it, or name another (aws ec2 describe-launch-templates lists them)"
        );
        let version = unreadable_template(
            "lt-0123456789abcdef0",
            "7",
            Some("InvalidLaunchTemplateId.VersionNotFound"),
            "...",
        );
        assert!(
            version.starts_with("spec.replacement.launchTemplate lt-0123456789abcdef0 has no version 7 (...); name a version it has"),
            "{version}"
        );
        let denied =
            unreadable_template("workers", "$Default", Some("UnauthorizedOperation"), "...");
        assert!(
            denied.ends_with("snapdrain's IAM role needs ec2:DescribeLaunchTemplateVersions, see deploy/iam/snapdrain-policy.json"),
            "{denied}"
        );
        assert_eq!(
            unreadable_template("workers", "$Latest", None, "timed out"),
            "spec.replacement.launchTemplate workers version $Latest cannot be read: timed out"
        );
    }
}
