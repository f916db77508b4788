//! The DisruptionPlan the demo submits: the chosen node, Execute mode, backups required (the defaults),
//! and, unless told otherwise, a Bottlerocket replacement launched after the drain.

use serde_json::{Value, json};

use super::preview::NodeView;
use snapdrain_sim::SimCluster;

/// Settings the replacement's Bottlerocket user data carries; the simulator applies them to the new Node,
/// so the summary can show them back.
pub const REPLACEMENT_LABEL: (&str, &str) = ("example.com/pool", "stateful");
pub const REPLACEMENT_TAINT: (&str, &str) = ("example.com/dedicated", "db:NoSchedule");
/// What FluentBit needs on a busy node (the kernel defaults run out of inotify watches).
pub const REPLACEMENT_SYSCTLS: [(&str, &str); 2] = [
    ("fs.inotify.max_user_instances", "8192"),
    ("fs.inotify.max_user_watches", "524288"),
];
/// Used when the node's own instance or type cannot be read.
const FALLBACK_INSTANCE_TYPE: &str = "m6i.xlarge";
const FALLBACK_IMAGE_ID: &str = "ami-0bottlerocket1350";

/// Where and how the replacement is launched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacement {
    pub instance_type: String,
    pub subnet: String,
    pub zone: String,
    pub image_id: String,
}

/// Same instance type, zone and AMI as the node it replaces, in the simulator's subnet for that zone.
pub fn choose_replacement(node: &NodeView, cluster: &SimCluster) -> anyhow::Result<Replacement> {
    let Some(ec2) = cluster.ec2.as_ref() else {
        anyhow::bail!(
            "the simulated cluster runs no EC2 endpoint, so no replacement can be launched; pass --no-replacement"
        );
    };
    let subnets = &ec2.config().subnets;
    let subnet = node
        .zone
        .as_ref()
        .and_then(|z| subnets.iter().find(|s| &s.zone == z))
        .or_else(|| subnets.first())
        .ok_or_else(|| {
            anyhow::anyhow!("the EC2 simulator has no subnets; pass --no-replacement")
        })?;
    let instance = node.instance_id.as_ref().and_then(|id| ec2.instance(id));
    Ok(Replacement {
        instance_type: node
            .instance_type
            .clone()
            .or_else(|| instance.as_ref().map(|i| i.info.instance_type.clone()))
            .unwrap_or_else(|| FALLBACK_INSTANCE_TYPE.into()),
        subnet: subnet.id.clone(),
        zone: subnet.zone.clone(),
        image_id: instance
            .map(|i| i.info.image_id)
            .filter(|id| !id.is_empty())
            .unwrap_or_else(|| FALLBACK_IMAGE_ID.into()),
    })
}

/// `demo-<first label of the node name>`, a valid object name however the node is called.
///
/// Short on purpose: Velero object keys repeat the backup name (derived from the plan name) twice, and
/// the simulated S3 (s3s-fs) keeps per-object metadata in a file named after the base64 of the whole key,
/// which overflows the 255-byte file name limit for keys above ~165 characters. A full EC2 DNS node name
/// (`ip-10-0-10-1.us-east-1.compute.internal`) would push Velero's keys past it.
pub fn plan_name(node: &str) -> String {
    let short = node.split('.').next().unwrap_or(node);
    let mut name: String = format!("demo-{short}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    while name.ends_with('-') {
        name.pop();
    }
    name
}

pub fn plan_spec(node: &str, replacement: Option<&Replacement>) -> Value {
    let mut spec = json!({
        "nodes": [node],
        "reason": "snapdrain demo: replace a node that runs StatefulSet pods",
        "source": "manual",
        "mode": "Execute",
        "backup": {"policy": "required"},
    });
    if let Some(r) = replacement {
        let sysctls: serde_json::Map<String, Value> = REPLACEMENT_SYSCTLS
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        // The AMI, subnet, instance profile and security groups are the replaced instance's (the
        // default DisruptionPolicy refuses a plan's own); `r` says which for the story.
        spec["replacement"] = json!({
            "when": "after-drain",
            "instanceTypes": [r.instance_type],
            "bottlerocket": {
                "nodeLabels": {REPLACEMENT_LABEL.0: REPLACEMENT_LABEL.1},
                "nodeTaints": {REPLACEMENT_TAINT.0: [REPLACEMENT_TAINT.1]},
                "sysctls": sysctls,
            }
        });
    }
    spec
}

/// The steps the plan will take, as shown before it is submitted.
pub fn describe_steps(node: &NodeView, replacement: Option<&Replacement>) -> Vec<String> {
    let mut lines = vec!["What snapdrain will do:".to_string()];
    let namespaces: std::collections::BTreeSet<&str> = node
        .protected
        .iter()
        .filter_map(|p| p.pod.split_once('/').map(|(ns, _)| ns))
        .collect();
    if namespaces.is_empty() {
        lines.push("  1. no protected pods: no backup needed".into());
    } else {
        let ns: Vec<&str> = namespaces.into_iter().collect();
        lines.push(format!(
            "  1. Velero backs up the protected pods' volumes (one Backup per namespace: {}) to the bucket",
            ns.join(", ")
        ));
        lines.push(
            "  2. snapdrain verifies each backup in the bucket (metadata, tarball, per-volume results)"
                .into(),
        );
    }
    let evicted = node.protected.len() + node.others.iter().filter(|p| p.evicted).count();
    lines.push(format!(
        "  3. only then: cordon {} and evict its {evicted} pod(s) (PDBs respected)",
        node.name
    ));
    lines.push(match &node.node_claim {
        Some(claim) => format!(
            "  4. delete Karpenter NodeClaim {claim}; Karpenter terminates the instance{}",
            node.instance_id
                .as_deref()
                .map(|i| format!(" {i}"))
                .unwrap_or_default()
        ),
        None => format!(
            "  4. terminate EC2 instance {} and delete the Node",
            node.instance_id.as_deref().unwrap_or("(unknown)")
        ),
    });
    match replacement {
        Some(r) => {
            let sysctls: Vec<String> = REPLACEMENT_SYSCTLS
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            lines.push(format!(
                "  5. launch a Bottlerocket {} ({}) in {} ({}) and wait for its Node to be Ready",
                r.instance_type, r.image_id, r.subnet, r.zone
            ));
            lines.push(format!(
                "     user data: label {}={}, taint {}={}, sysctls {}",
                REPLACEMENT_LABEL.0,
                REPLACEMENT_LABEL.1,
                REPLACEMENT_TAINT.0,
                REPLACEMENT_TAINT.1,
                sysctls.join(", ")
            ));
        }
        None => lines.push("  5. no replacement (--no-replacement)".into()),
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_names_are_valid_object_names() {
        assert_eq!(
            plan_name("ip-10-0-1-5.us-east-1.compute.internal"),
            "demo-ip-10-0-1-5"
        );
        assert!(plan_name(&"x".repeat(300)).len() <= 63);
        assert_eq!(plan_name("Node_A"), "demo-node-a");
    }

    #[test]
    fn the_spec_parses_as_a_valid_plan_with_the_bottlerocket_settings() {
        let r = Replacement {
            instance_type: "m6i.xlarge".into(),
            subnet: "subnet-1".into(),
            zone: "us-east-1a".into(),
            image_id: "ami-1".into(),
        };
        let spec: snapdrain::api::DisruptionPlanSpec =
            serde_json::from_value(plan_spec("n1", Some(&r))).expect("spec parses");
        assert!(snapdrain::api::validate(&spec).is_ok());
        let policy: snapdrain::api::DisruptionPolicySpec =
            serde_json::from_value(super::super::setup::demo_policy()).expect("a policy");
        assert_eq!(
            snapdrain::planning::launch_policy::check_plan(&spec, &policy, 1),
            [],
            "the demo's policy allows the demo's plan"
        );
        let br = spec
            .replacement
            .and_then(|r| r.bottlerocket)
            .expect("bottlerocket settings");
        assert_eq!(
            br.sysctls
                .get("fs.inotify.max_user_watches")
                .map(String::as_str),
            Some("524288")
        );
        assert_eq!(br.node_taints.len(), 1);
        let bare: snapdrain::api::DisruptionPlanSpec =
            serde_json::from_value(plan_spec("n1", None)).expect("spec parses");
        assert!(bare.replacement.is_none());
    }
}
