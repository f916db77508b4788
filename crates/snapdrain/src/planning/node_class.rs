//! A replacement launched from a Karpenter EC2NodeClass: what Karpenter resolved for the class (its
//! `status`) and what the platform team wrote in it (`spec.userData`, `spec.tags`,
//! `spec.metadataOptions`), checked while planning so a class that cannot launch fails the plan before
//! any node is touched. Pure: the controller reads the class and the replaced Node's labels.

use std::collections::BTreeMap;

use crate::api::karpenter::{Ami, Ec2NodeClass};
use crate::api::status::{NodeClassRecord, NodeJoinRecord};

/// What every replacement of the plan takes from the class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassLaunch {
    pub record: NodeClassRecord,
    /// `spec.userData` (Bottlerocket TOML), the base of the replacement's user data.
    pub user_data: Option<String>,
    pub instance_profile: String,
    pub security_group_ids: Vec<String>,
    pub subnet_ids: Vec<String>,
    pub http_tokens_required: bool,
    pub hop_limit: i32,
}

/// The class's launch settings, or why it cannot launch (not Ready, or a selector Karpenter resolved to
/// nothing), naming the class and what to fix.
pub fn resolve_class(class: &Ec2NodeClass) -> Result<ClassLaunch, String> {
    let name = class.metadata.name.clone().unwrap_or_default();
    let status = class.status.clone().unwrap_or_default();
    // Karpenter launches from a class only once its root condition Ready is True
    // (karpenter-provider-aws pkg/apis/v1/ec2nodeclass_status.go `StatusConditions`; the core
    // provisioner skips NodePools whose class is not ready).
    match status.conditions.iter().find(|c| c.type_ == "Ready") {
        Some(c) if c.status == "True" => {}
        other => {
            let why = match other {
                Some(c) => format!("Ready is {} ({}: {})", c.status, c.reason, c.message),
                None => "Karpenter has not resolved it yet (no Ready condition)".to_string(),
            };
            let unready: Vec<String> = status
                .conditions
                .iter()
                .filter(|c| c.type_ != "Ready" && c.status != "True")
                .map(|c| format!("{} {}: {}", c.type_, c.reason, c.message))
                .collect();
            return Err(format!(
                "EC2NodeClass {name} is not Ready: {why}{}; fix the class (kubectl describe ec2nodeclass {name}) or name another in spec.replacement.nodeClassRef",
                if unready.is_empty() {
                    String::new()
                } else {
                    format!(" [{}]", unready.join("; "))
                }
            ));
        }
    }
    let mut missing = Vec::new();
    let profile = status.instance_profile.clone().filter(|p| !p.is_empty());
    if profile.is_none() {
        missing.push("status.instanceProfile");
    }
    if status.subnets.is_empty() {
        missing.push("status.subnets");
    }
    if status.security_groups.is_empty() {
        missing.push("status.securityGroups");
    }
    if status.amis.is_empty() {
        missing.push("status.amis");
    }
    if !missing.is_empty() {
        return Err(format!(
            "EC2NodeClass {name} resolves no {}: its selectors match nothing Karpenter could find; fix the class or name another in spec.replacement.nodeClassRef",
            missing.join(", ")
        ));
    }
    let imds = class.spec.metadata_options.clone().unwrap_or_default();
    let user_data = class
        .spec
        .user_data
        .clone()
        .filter(|u| !u.trim().is_empty());
    Ok(ClassLaunch {
        record: NodeClassRecord {
            name,
            uid: class.metadata.uid.clone(),
            generation: class.metadata.generation,
            image_name: None,
            user_data_sha256: user_data.as_deref().map(sha256_hex),
            tags: class.spec.tags.clone(),
        },
        user_data,
        instance_profile: profile.unwrap_or_default(),
        security_group_ids: status
            .security_groups
            .iter()
            .map(|g| g.id.clone())
            .collect(),
        subnet_ids: status.subnets.iter().map(|s| s.id.clone()).collect(),
        // The CRD's defaults (`required`, 1), as Karpenter's launch template writes them.
        http_tokens_required: imds.http_tokens.as_deref().unwrap_or("required") == "required",
        hop_limit: imds
            .http_put_response_hop_limit
            .and_then(|h| i32::try_from(h).ok())
            .unwrap_or(1),
    })
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The AMI a node with `labels` gets: the first (newest) non-deprecated AMI of the class whose
/// requirements the node's labels meet, else the first deprecated one, as karpenter-provider-aws
/// `pkg/providers/amifamily/ami.go` `MapToInstanceTypes` picks per instance type. A requirement on a
/// label the node does not carry counts as met for `In`/`NotIn`/`DoesNotExist` (Karpenter allows
/// undefined well-known labels) and as unmet for `Exists` (e.g. the GPU count of an accelerated AMI).
pub fn pick_ami<'a>(amis: &'a [Ami], labels: &BTreeMap<String, String>) -> Option<&'a Ami> {
    let fits = |a: &&Ami| a.requirements.iter().all(|r| meets(r, labels));
    amis.iter()
        .filter(|a| !a.deprecated)
        .find(fits)
        .or_else(|| amis.iter().filter(|a| a.deprecated).find(fits))
}

fn meets(
    r: &k8s_openapi::api::core::v1::NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
    let values = r.values.clone().unwrap_or_default();
    let have = labels.get(&r.key);
    let number = |v: Option<&String>| v.and_then(|v| v.parse::<i64>().ok());
    match (r.operator.as_str(), have) {
        ("In", Some(v)) => values.contains(v),
        ("NotIn", Some(v)) => !values.contains(v),
        ("Exists", h) => h.is_some(),
        ("DoesNotExist", h) => h.is_none(),
        ("Gt", Some(v)) => {
            matches!((number(Some(v)), number(values.first())), (Some(a), Some(b)) if a > b)
        }
        ("Lt", Some(v)) => {
            matches!((number(Some(v)), number(values.first())), (Some(a), Some(b)) if a < b)
        }
        (_, None) => true,
        _ => false,
    }
}

/// Node `node`'s launch settings from the class, with the AMI its labels select; an error names the
/// node, its labels that matter and the class.
pub fn node_record(
    launch: &ClassLaunch,
    amis: &[Ami],
    node: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(NodeJoinRecord, Option<String>), String> {
    let class = &launch.record.name;
    let Some(ami) = pick_ami(amis, labels) else {
        let arch = labels
            .get("kubernetes.io/arch")
            .map_or("unknown".to_string(), Clone::clone);
        return Err(format!(
            "EC2NodeClass {class} has no AMI for node {node} (architecture {arch}): none of status.amis meets the node's labels; widen the class's amiSelectorTerms or name another class"
        ));
    };
    let from = |field: &str, what: &str| format!("{field}: EC2NodeClass {class} {what}");
    Ok((
        NodeJoinRecord {
            image_id: Some(ami.id.clone()),
            instance_profile: Some(launch.instance_profile.clone()),
            security_group_ids: launch.security_group_ids.clone(),
            subnet_ids: launch.subnet_ids.clone(),
            http_tokens_required: Some(launch.http_tokens_required),
            hop_limit: Some(launch.hop_limit),
            from: vec![
                from(
                    "imageId",
                    &format!(
                        "status.amis ({})",
                        ami.name.clone().unwrap_or_else(|| ami.id.clone())
                    ),
                ),
                from("iamInstanceProfile", "status.instanceProfile"),
                from("securityGroupIds", "status.securityGroups"),
                from("subnets", "status.subnets"),
                from("metadataOptions", "spec.metadataOptions"),
            ],
            ..Default::default()
        },
        ami.name.clone(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(status: serde_json::Value) -> Ec2NodeClass {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "default", "uid": "u1", "generation": 3},
            "spec": {"userData": "[settings.kernel.lockdown]\n", "tags": {"team": "db"},
                     "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 2}},
            "status": status
        }))
        .expect("a class")
    }

    fn ready() -> serde_json::Value {
        serde_json::json!([{"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}])
    }

    fn amis() -> serde_json::Value {
        serde_json::json!([
            {"id": "ami-new-arm", "name": "br-arm", "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}]},
            {"id": "ami-gpu", "name": "br-nvidia", "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Exists"}]},
            {"id": "ami-old", "name": "br-old", "deprecated": true, "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]},
            {"id": "ami-x86", "name": "br-x86", "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "DoesNotExist"}]}
        ])
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_ready_class_gives_what_karpenter_resolved_and_the_newest_fitting_ami() {
        let c = class(serde_json::json!({
            "amis": amis(), "instanceProfile": "cluster_123",
            "subnets": [{"id": "subnet-a", "zone": "us-west-2a"}, {"id": "subnet-b", "zone": "us-west-2b"}],
            "securityGroups": [{"id": "sg-1"}], "conditions": ready()
        }));
        let launch = resolve_class(&c).expect("ready");
        assert_eq!(launch.instance_profile, "cluster_123");
        assert_eq!(launch.subnet_ids, ["subnet-a", "subnet-b"]);
        assert_eq!((launch.http_tokens_required, launch.hop_limit), (true, 2));
        assert_eq!(
            launch.record.tags.get("team").map(String::as_str),
            Some("db")
        );
        assert_eq!(launch.record.generation, Some(3));
        assert_eq!(
            launch.user_data.as_deref(),
            Some("[settings.kernel.lockdown]\n")
        );
        assert_eq!(
            launch.record.user_data_sha256.as_ref().map(String::len),
            Some(64)
        );
        let amis = &c.status.as_ref().expect("status").amis;
        let (r, name) = node_record(
            &launch,
            amis,
            "n1",
            &labels(&[("kubernetes.io/arch", "amd64")]),
        )
        .expect("an AMI");
        assert_eq!(
            r.image_id.as_deref(),
            Some("ami-x86"),
            "not deprecated, no GPU"
        );
        assert_eq!(name.as_deref(), Some("br-x86"));
        assert_eq!(
            r.from[0],
            "imageId: EC2NodeClass default status.amis (br-x86)"
        );
        let gpu = labels(&[
            ("kubernetes.io/arch", "amd64"),
            ("karpenter.k8s.aws/instance-gpu-count", "1"),
        ]);
        assert_eq!(pick_ami(amis, &gpu).map(|a| a.id.as_str()), Some("ami-gpu"));
        let arm = labels(&[("kubernetes.io/arch", "arm64")]);
        assert_eq!(
            pick_ami(amis, &arm).map(|a| a.id.as_str()),
            Some("ami-new-arm")
        );
        let e = node_record(
            &launch,
            amis,
            "n2",
            &labels(&[("kubernetes.io/arch", "s390x")]),
        )
        .expect_err("no AMI");
        assert!(e.contains("no AMI for node n2 (architecture s390x)"), "{e}");
        // Only a deprecated AMI fits: used, as Karpenter does rather than launching nothing.
        let only_old = &amis[2..3];
        assert_eq!(
            pick_ami(only_old, &labels(&[("kubernetes.io/arch", "amd64")])).map(|a| a.id.as_str()),
            Some("ami-old")
        );
    }

    #[test]
    fn a_class_that_is_not_ready_or_resolves_nothing_is_named() {
        let c = class(serde_json::json!({
            "amis": amis(),
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "UnhealthyDependents", "message": "SubnetsReady=False", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "SubnetsReady", "status": "False", "reason": "SubnetsNotFound", "message": "SubnetSelector did not match any Subnets", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]
        }));
        let e = resolve_class(&c).expect_err("not ready");
        assert!(
            e.contains("EC2NodeClass default is not Ready: Ready is False (UnhealthyDependents"),
            "{e}"
        );
        assert!(e.contains("SubnetsReady SubnetsNotFound"), "{e}");
        assert!(e.contains("spec.replacement.nodeClassRef"), "{e}");
        let e = resolve_class(&class(serde_json::json!({}))).expect_err("never resolved");
        assert!(e.contains("no Ready condition"), "{e}");
        let e =
            resolve_class(&class(serde_json::json!({"conditions": ready()}))).expect_err("empty");
        assert!(
            e.contains(
                "status.instanceProfile, status.subnets, status.securityGroups, status.amis"
            ),
            "{e}"
        );
    }
}
