//! Which of a replacement's instance types can run its AMI. EC2 refuses a launch whose instance type
//! does not support the AMI's architecture (RunInstances `InvalidParameterValue`: "The architecture
//! 'arm64' of the specified instance type does not match the architecture 'x86_64' of the specified
//! AMI...", as skypilot-org/skypilot issue 6315 quotes it; CreateFleet answers it per override), so the
//! types that cannot are dropped while planning, and a plan none of whose types can fails before its
//! node is touched. Pure: the controller asks DescribeImages and DescribeInstanceTypes.

use std::collections::BTreeMap;

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

/// The instance types that run the AMI, in the plan's order, and those dropped with their
/// architectures.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fit {
    pub kept: Vec<String>,
    pub dropped: Vec<(String, Vec<String>)>,
}

impl Fit {
    /// A line for the record's `from`: what was kept and why the others were dropped.
    pub fn note(&self, image: &LaunchImage<'_>) -> String {
        let mut note = format!(
            "instanceTypes: spec.replacement.instanceTypes that run {} AMI {}",
            image.architecture, image.id
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
    instance_types: &[String],
    architectures: &BTreeMap<String, Vec<String>>,
) -> Result<Fit, String> {
    let mut fit = Fit::default();
    for t in instance_types {
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
        "the replacement of node {node} cannot launch: its AMI {}{named}, from {}, is {}, and none of spec.replacement.instanceTypes runs {}: {}; list {} instance types in spec.replacement.instanceTypes, or launch an AMI built for {}",
        image.id,
        image.source,
        image.architecture,
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let fit = fit_instance_types(
            "n1",
            &image(),
            &types(&["m6g.large", "m6i.large", "m7g.large"]),
            &archs(),
        )
        .expect("one type fits");
        assert_eq!(fit.kept, ["m6i.large"]);
        assert_eq!(
            fit.note(&image()),
            "instanceTypes: spec.replacement.instanceTypes that run x86_64 AMI ami-0x86 (dropped m6g.large (arm64), m7g.large (arm64))"
        );
    }

    #[test]
    fn no_type_that_runs_the_ami_names_the_ami_the_types_and_the_way_out() {
        let e = fit_instance_types(
            "n1",
            &image(),
            &types(&["m6g.large", "m7g.large"]),
            &archs(),
        )
        .expect_err("nothing fits");
        assert_eq!(
            e,
            "the replacement of node n1 cannot launch: its AMI ami-0x86 (bottlerocket-aws-k8s-1.35-x86_64-v1.42.0), from the replaced instance i-0abc, is x86_64, and none of spec.replacement.instanceTypes runs x86_64: m6g.large (arm64), m7g.large (arm64); list x86_64 instance types in spec.replacement.instanceTypes, or launch an AMI built for arm64"
        );
    }

    #[test]
    fn every_type_that_runs_the_ami_is_kept() {
        let fit =
            fit_instance_types("n1", &image(), &types(&["m6i.large"]), &archs()).expect("fits");
        assert_eq!(fit.kept, ["m6i.large"]);
        assert!(fit.dropped.is_empty());
    }
}
