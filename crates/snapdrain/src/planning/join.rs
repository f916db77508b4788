//! What a replacement needs to join the cluster, resolved once while planning so that a plan whose
//! replacement could never be built fails before its node is cordoned, drained or terminated.
//!
//! Each setting comes from the first that has it:
//! - cluster name, API server, CA: the plan (`spec.replacement.bottlerocket`), the controller's flags,
//!   the user data of the instance being replaced (Karpenter and EKS node groups write all three there);
//! - instance profile, security groups, subnet, IMDS options: the plan, the replaced instance
//!   (DescribeInstances). A launch template carries its own, so then only what the plan names is used.

use thiserror::Error;

use crate::api::plan::ReplacementSpec;
use crate::api::status::{ClusterJoinRecord, InstanceRecord, NodeJoinRecord};
use crate::cloud::bottlerocket::ClusterSettings;
use crate::cloud::ec2::{JoinSettings, MetadataSettings};

/// A Bottlerocket cluster setting a replacement may need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ClusterKey {
    ClusterName,
    ApiServer,
    ClusterCertificate,
}

impl ClusterKey {
    pub const ALL: [ClusterKey; 3] = [
        ClusterKey::ClusterName,
        ClusterKey::ApiServer,
        ClusterKey::ClusterCertificate,
    ];

    /// The key under `settings.kubernetes`.
    pub fn toml(self) -> &'static str {
        match self {
            Self::ClusterName => "cluster-name",
            Self::ApiServer => "api-server",
            Self::ClusterCertificate => "cluster-certificate",
        }
    }

    /// The field under `spec.replacement.bottlerocket` (and of the status record).
    pub fn field(self) -> &'static str {
        match self {
            Self::ClusterName => "clusterName",
            Self::ApiServer => "apiServer",
            Self::ClusterCertificate => "clusterCertificate",
        }
    }

    /// The controller's flag.
    pub fn flag(self) -> &'static str {
        match self {
            Self::ClusterName => "--cluster-name",
            Self::ApiServer => "--api-server",
            Self::ClusterCertificate => "--cluster-certificate",
        }
    }

    /// Its value in what a node's user data says.
    pub fn of(self, s: &ClusterSettings) -> Option<&str> {
        match self {
            Self::ClusterName => s.cluster_name.as_deref(),
            Self::ApiServer => s.api_server.as_deref(),
            Self::ClusterCertificate => s.cluster_certificate.as_deref(),
        }
    }
}

/// What one replaced instance's user data said about the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UserData {
    /// Read: the keys it sets.
    Read(ClusterSettings),
    /// The instance was launched without user data (or EC2 no longer knows it).
    Empty,
    /// It could not be used, and why (not Bottlerocket TOML; EC2 refused to answer).
    Unusable(String),
}

/// One replaced instance's user data, for [`resolve_cluster`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceUserData {
    pub node: String,
    pub instance: String,
    pub user_data: UserData,
}

/// Why a replacement could not be resolved; each names what is missing and where to set it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum JoinError {
    #[error("{}", cluster_message(.missing, .looked))]
    ClusterSettings {
        missing: Vec<ClusterKey>,
        /// What was looked at besides the plan and the flags, for the message.
        looked: String,
    },
    #[error("{}", node_message(.node, .missing, .why))]
    NodeSettings {
        node: String,
        missing: Vec<NodeKey>,
        /// Why nothing could be copied from the replaced instance.
        why: String,
    },
}

/// A launch setting of the replacement instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKey {
    Image,
    InstanceProfile,
    SecurityGroups,
    Subnet,
}

impl NodeKey {
    fn needs(self) -> &'static str {
        match self {
            Self::Image => "an AMI",
            Self::InstanceProfile => {
                "an IAM instance profile (its kubelet authenticates to the cluster with the node role)"
            }
            Self::SecurityGroups => "security groups that reach the control plane",
            Self::Subnet => "a subnet to launch into",
        }
    }

    fn field(self) -> &'static str {
        match self {
            Self::Image => "imageId",
            Self::InstanceProfile => "iamInstanceProfile",
            Self::SecurityGroups => "securityGroupIds",
            Self::Subnet => "subnets",
        }
    }
}

fn node_message(node: &str, missing: &[NodeKey], why: &str) -> String {
    format!(
        "the replacement of node {node} needs {}, and {why}: name an EC2NodeClass in spec.replacement.nodeClassRef, or set spec.replacement.{} (or name a launch template that carries them)",
        missing
            .iter()
            .map(|k| k.needs())
            .collect::<Vec<_>>()
            .join(", "),
        missing
            .iter()
            .map(|k| k.field())
            .collect::<Vec<_>>()
            .join(", spec.replacement."),
    )
}

fn cluster_message(missing: &[ClusterKey], looked: &str) -> String {
    let list = |f: fn(ClusterKey) -> &'static str| {
        missing.iter().map(|k| f(*k)).collect::<Vec<_>>().join(", ")
    };
    format!(
        "the replacement's Bottlerocket user data needs the cluster's settings.kubernetes.{{{}}} to join, and none was found: the plan sets no spec.replacement.bottlerocket.{{{}}}, the controller runs without {}, and {looked}. Set them in spec.replacement.bottlerocket, or start the controller with {}",
        list(ClusterKey::toml),
        list(ClusterKey::field),
        list(ClusterKey::flag),
        list(ClusterKey::flag),
    )
}

/// The controller's `--cluster-name`, `--api-server` and `--cluster-certificate`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClusterDefaults<'a> {
    pub cluster_name: Option<&'a str>,
    pub api_server: Option<&'a str>,
    pub cluster_certificate: Option<&'a str>,
}

/// The cluster keys the replacement needs: the cluster name always (it tags the instance
/// `kubernetes.io/cluster/<name>`, which the IAM policy requires), the API server and CA only when
/// snapdrain writes the user data (not when a launch template carries it and the plan sets none).
pub fn needed_keys(spec: &ReplacementSpec) -> Vec<ClusterKey> {
    if spec.launch_template.is_some() && spec.bottlerocket.is_none() {
        vec![ClusterKey::ClusterName]
    } else {
        ClusterKey::ALL.to_vec()
    }
}

/// Which needed keys neither the plan nor the flags set: only these are looked for in user data.
pub fn unset_keys(spec: &ReplacementSpec, defaults: &ClusterDefaults<'_>) -> Vec<ClusterKey> {
    needed_keys(spec)
        .into_iter()
        .filter(|k| plan_value(spec, *k).is_none() && flag_value(defaults, *k).is_none())
        .collect()
}

fn plan_value(spec: &ReplacementSpec, key: ClusterKey) -> Option<&str> {
    let br = spec.bottlerocket.as_ref()?;
    match key {
        ClusterKey::ClusterName => br.cluster_name.as_deref(),
        ClusterKey::ApiServer => br.api_server.as_deref(),
        ClusterKey::ClusterCertificate => br.cluster_certificate.as_deref(),
    }
    .filter(|v| !v.trim().is_empty())
}

fn flag_value<'a>(d: &ClusterDefaults<'a>, key: ClusterKey) -> Option<&'a str> {
    match key {
        ClusterKey::ClusterName => d.cluster_name,
        ClusterKey::ApiServer => d.api_server,
        ClusterKey::ClusterCertificate => d.cluster_certificate,
    }
    .filter(|v| !v.trim().is_empty())
}

/// The cluster settings, each from the plan, else the flags, else the first instance whose user data
/// sets it. An error names every key still missing, what was looked at, and where to set it.
pub fn resolve_cluster(
    spec: &ReplacementSpec,
    defaults: &ClusterDefaults<'_>,
    instances: &[InstanceUserData],
) -> Result<ClusterJoinRecord, JoinError> {
    let mut record = ClusterJoinRecord::default();
    let mut missing = Vec::new();
    for key in needed_keys(spec) {
        let found = plan_value(spec, key)
            .map(|v| {
                (
                    v.to_string(),
                    format!("spec.replacement.bottlerocket.{}", key.field()),
                )
            })
            .or_else(|| flag_value(defaults, key).map(|v| (v.to_string(), key.flag().to_string())))
            .or_else(|| {
                instances.iter().find_map(|i| match &i.user_data {
                    UserData::Read(s) => key.of(s).map(|v| {
                        (
                            v.to_string(),
                            format!("user data of instance {} (node {})", i.instance, i.node),
                        )
                    }),
                    _ => None,
                })
            });
        let Some((value, from)) = found else {
            missing.push(key);
            continue;
        };
        record.from.push(format!("{}: {from}", key.field()));
        match key {
            ClusterKey::ClusterName => record.cluster_name = value,
            ClusterKey::ApiServer => record.api_server = Some(value),
            ClusterKey::ClusterCertificate => record.cluster_certificate = Some(value),
        }
    }
    if missing.is_empty() {
        return Ok(record);
    }
    Err(JoinError::ClusterSettings {
        looked: looked_at(instances),
        missing,
    })
}

/// What the replaced instances' user data said, for the error.
fn looked_at(instances: &[InstanceUserData]) -> String {
    if instances.is_empty() {
        return "no replaced node names an EC2 instance in its spec.providerID whose user data could be read".into();
    }
    instances
        .iter()
        .map(|i| {
            let what = match &i.user_data {
                UserData::Read(_) => "sets none of them".to_string(),
                UserData::Empty => "is empty".to_string(),
                UserData::Unusable(why) => format!("cannot be used: {why}"),
            };
            format!(
                "the user data of instance {} (node {}) {what}",
                i.instance, i.node
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Node `node`'s replacement settings besides its user data: instance profile, security groups and IMDS
/// options from the plan, else copied from the replaced instance's record (IMDS: else Karpenter's
/// EC2NodeClass default, IMDSv2 with hop limit 1); subnets from the plan, else the replaced instance's.
/// A launch template carries its own, so then only what the plan names is kept. Without a template, a
/// replacement lacking a profile, security groups or a subnet could never join: an error naming which.
pub fn resolve_node(
    spec: &ReplacementSpec,
    node: &str,
    instance_id: Option<&str>,
    replaced: Option<&InstanceRecord>,
) -> Result<NodeJoinRecord, JoinError> {
    let from_template = spec.launch_template.is_some();
    let copy = if from_template { None } else { replaced };
    let copied = instance_id.map_or_else(
        || "the replaced instance".to_string(),
        |id| format!("instance {id}"),
    );
    let mut from = Vec::new();
    let mut pick = |field: &str, plan: bool, copied_one: bool| {
        if plan {
            from.push(format!("{field}: spec.replacement.{field}"));
        } else if copied_one {
            from.push(format!("{field}: {copied}"));
        }
    };
    let image_id = spec
        .image_id
        .clone()
        .or_else(|| copy.and_then(|r| r.image_id.clone()));
    pick("imageId", spec.image_id.is_some(), image_id.is_some());
    let instance_profile = spec
        .iam_instance_profile
        .clone()
        .or_else(|| copy.and_then(|r| r.instance_profile.clone()));
    pick(
        "iamInstanceProfile",
        spec.iam_instance_profile.is_some(),
        instance_profile.is_some(),
    );
    let security_group_ids = if spec.security_group_ids.is_empty() {
        copy.map(|r| r.security_group_ids.clone())
            .unwrap_or_default()
    } else {
        spec.security_group_ids.clone()
    };
    pick(
        "securityGroupIds",
        !spec.security_group_ids.is_empty(),
        !security_group_ids.is_empty(),
    );
    let subnet_ids: Vec<String> = if spec.subnets.is_empty() {
        copy.and_then(|r| r.subnet_id.clone()).into_iter().collect()
    } else {
        spec.subnets.clone()
    };
    pick("subnets", !spec.subnets.is_empty(), !subnet_ids.is_empty());
    let (http_tokens_required, hop_limit) = match &spec.metadata_options {
        Some(m) => (
            Some(m.http_tokens == "required"),
            Some(m.http_put_response_hop_limit),
        ),
        None if from_template => (None, None),
        None => (
            Some(copy.and_then(|r| r.http_tokens_required).unwrap_or(true)),
            Some(copy.and_then(|r| r.hop_limit).unwrap_or(1)),
        ),
    };
    pick(
        "metadataOptions",
        spec.metadata_options.is_some(),
        copy.is_some_and(|r| r.http_tokens_required.is_some()),
    );
    if !from_template {
        let why = || match (instance_id, replaced) {
            (None, _) => {
                "the Node names no EC2 instance in spec.providerID to copy it from".to_string()
            }
            (Some(id), None) => format!(
                "EC2 does not know the replaced instance {id}, so nothing can be copied from it"
            ),
            (Some(id), Some(_)) => format!("the replaced instance {id} has none to copy"),
        };
        let missing: Vec<NodeKey> = [
            (NodeKey::Image, image_id.is_none()),
            (NodeKey::InstanceProfile, instance_profile.is_none()),
            (NodeKey::SecurityGroups, security_group_ids.is_empty()),
            (NodeKey::Subnet, subnet_ids.is_empty()),
        ]
        .into_iter()
        .filter_map(|(k, absent)| absent.then_some(k))
        .collect();
        if !missing.is_empty() {
            return Err(JoinError::NodeSettings {
                node: node.to_string(),
                missing,
                why: why(),
            });
        }
    }
    Ok(NodeJoinRecord {
        image_id,
        instance_profile,
        security_group_ids,
        subnet_ids,
        http_tokens_required,
        hop_limit,
        from,
        ..Default::default()
    })
}

/// The launch's join settings from the node's record.
pub fn join_settings(record: &NodeJoinRecord) -> JoinSettings {
    JoinSettings {
        instance_profile: record.instance_profile.clone(),
        security_group_ids: record.security_group_ids.clone(),
        metadata: match (record.http_tokens_required, record.hop_limit) {
            (Some(tokens_required), Some(hop_limit)) => Some(MetadataSettings {
                tokens_required,
                hop_limit,
            }),
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::plan::{
        BottlerocketSpec, LaunchTemplateRef, MetadataOptionsSpec, ReplacementWhen,
    };

    fn record() -> InstanceRecord {
        InstanceRecord {
            image_id: Some("ami-0old".into()),
            subnet_id: Some("subnet-a".into()),
            zone: Some("us-east-1a".into()),
            instance_profile: Some("arn:aws:iam::1:instance-profile/node".into()),
            security_group_ids: vec!["sg-1".into()],
            http_tokens_required: Some(true),
            hop_limit: Some(2),
            auto_scaling_group: None,
        }
    }

    fn spec() -> ReplacementSpec {
        ReplacementSpec {
            when: ReplacementWhen::AfterDrain,
            instance_types: vec!["m5.large".into()],
            image_id: Some("ami-1".into()),
            ..Default::default()
        }
    }

    fn read(name: Option<&str>, api: Option<&str>, ca: Option<&str>) -> InstanceUserData {
        InstanceUserData {
            node: "n1".into(),
            instance: "i-1".into(),
            user_data: UserData::Read(ClusterSettings {
                cluster_name: name.map(Into::into),
                api_server: api.map(Into::into),
                cluster_certificate: ca.map(Into::into),
            }),
        }
    }

    #[test]
    fn cluster_settings_come_from_the_plan_then_the_flags_then_the_user_data() {
        let mut s = spec();
        s.bottlerocket = Some(BottlerocketSpec {
            cluster_name: Some("from-plan".into()),
            ..Default::default()
        });
        let flags = ClusterDefaults {
            cluster_name: Some("from-flag"),
            api_server: Some("https://flag"),
            ..Default::default()
        };
        let instances = [read(Some("from-ud"), Some("https://ud"), Some("Y2E="))];
        let r = resolve_cluster(&s, &flags, &instances).unwrap();
        assert_eq!(
            (
                r.cluster_name.as_str(),
                r.api_server.as_deref(),
                r.cluster_certificate.as_deref()
            ),
            ("from-plan", Some("https://flag"), Some("Y2E="))
        );
        assert_eq!(
            r.from,
            [
                "clusterName: spec.replacement.bottlerocket.clusterName",
                "apiServer: --api-server",
                "clusterCertificate: user data of instance i-1 (node n1)",
            ]
        );
        // Nothing set anywhere but the user data: all three from it.
        let r = resolve_cluster(&spec(), &ClusterDefaults::default(), &instances).unwrap();
        assert_eq!(r.cluster_name, "from-ud");
        assert_eq!(
            unset_keys(&s, &flags),
            [ClusterKey::ClusterCertificate],
            "only what the plan and the flags leave unset is looked for in user data"
        );
    }

    #[test]
    fn missing_cluster_settings_are_named_with_where_to_set_them() {
        let instances = [
            read(Some("prod"), None, None),
            InstanceUserData {
                node: "n2".into(),
                instance: "i-2".into(),
                user_data: UserData::Unusable("not valid TOML".into()),
            },
        ];
        let e = resolve_cluster(&spec(), &ClusterDefaults::default(), &instances).unwrap_err();
        assert_eq!(
            e,
            JoinError::ClusterSettings {
                missing: vec![ClusterKey::ApiServer, ClusterKey::ClusterCertificate],
                looked: "the user data of instance i-1 (node n1) sets none of them; the user data of instance i-2 (node n2) cannot be used: not valid TOML".into(),
            }
        );
        let m = e.to_string();
        for want in [
            "settings.kubernetes.{api-server, cluster-certificate}",
            "spec.replacement.bottlerocket",
            "--api-server, --cluster-certificate",
            "instance i-2",
        ] {
            assert!(m.contains(want), "{want:?} in {m}");
        }
        let e = resolve_cluster(&spec(), &ClusterDefaults::default(), &[]).unwrap_err();
        assert!(e.to_string().contains("spec.providerID"), "{e}");
    }

    #[test]
    fn a_launch_template_with_its_own_user_data_needs_only_the_cluster_name() {
        let mut s = spec();
        s.launch_template = Some(LaunchTemplateRef {
            name: Some("nodes".into()),
            ..Default::default()
        });
        assert_eq!(needed_keys(&s), [ClusterKey::ClusterName]);
        let r = resolve_cluster(
            &s,
            &ClusterDefaults::default(),
            &[read(Some("prod"), None, None)],
        )
        .unwrap();
        assert_eq!((r.cluster_name.as_str(), r.api_server), ("prod", None));
    }

    #[test]
    fn node_settings_are_copied_from_the_replaced_instance() {
        let r = resolve_node(&spec(), "n1", Some("i-1"), Some(&record())).unwrap();
        assert_eq!(
            r.instance_profile.as_deref(),
            Some("arn:aws:iam::1:instance-profile/node")
        );
        assert_eq!(r.security_group_ids, ["sg-1"]);
        assert_eq!(r.subnet_ids, ["subnet-a"]);
        assert_eq!(
            join_settings(&r).metadata,
            Some(MetadataSettings {
                tokens_required: true,
                hop_limit: 2
            })
        );
        assert!(
            r.from
                .contains(&"iamInstanceProfile: instance i-1".to_string())
        );
    }

    #[test]
    fn the_plan_wins_and_missing_node_settings_are_named() {
        let mut s = spec();
        s.iam_instance_profile = Some("other".into());
        s.security_group_ids = vec!["sg-2".into()];
        s.subnets = vec!["subnet-b".into()];
        s.metadata_options = Some(MetadataOptionsSpec {
            http_tokens: "optional".into(),
            http_put_response_hop_limit: 3,
        });
        let r = resolve_node(&s, "n1", Some("i-1"), Some(&record())).unwrap();
        assert_eq!(r.instance_profile.as_deref(), Some("other"));
        assert_eq!(r.security_group_ids, ["sg-2"]);
        assert_eq!(r.subnet_ids, ["subnet-b"]);
        assert_eq!(
            (r.http_tokens_required, r.hop_limit),
            (Some(false), Some(3))
        );
        assert!(
            r.from
                .contains(&"iamInstanceProfile: spec.replacement.iamInstanceProfile".into())
        );

        let e = resolve_node(&spec(), "n1", None, None).unwrap_err();
        assert!(
            matches!(&e, JoinError::NodeSettings { missing, .. } if missing.len() == 3),
            "{e}"
        );
        let m = e.to_string();
        assert!(
            m.contains("set spec.replacement.iamInstanceProfile, spec.replacement.securityGroupIds, spec.replacement.subnets"),
            "{m}"
        );
        assert!(m.contains("spec.providerID"), "{m}");
        let e = resolve_node(&spec(), "n1", Some("i-9"), None).unwrap_err();
        assert!(
            e.to_string()
                .contains("EC2 does not know the replaced instance i-9"),
            "{e}"
        );
        let mut no_sg = record();
        no_sg.security_group_ids.clear();
        let e = resolve_node(&spec(), "n1", Some("i-1"), Some(&no_sg)).unwrap_err();
        assert!(
            matches!(&e, JoinError::NodeSettings { missing, .. } if *missing == [NodeKey::SecurityGroups]),
            "{e}"
        );
        assert!(e.to_string().contains("has none to copy"), "{e}");
        assert!(
            e.to_string().contains("spec.replacement.securityGroupIds"),
            "{e}"
        );
        let mut no_subnet = record();
        no_subnet.subnet_id = None;
        let e = resolve_node(&spec(), "n1", Some("i-1"), Some(&no_subnet)).unwrap_err();
        assert!(e.to_string().contains("spec.replacement.subnets"), "{e}");
        // Defaults without anything to copy: IMDSv2, hop limit 1.
        let mut s = spec();
        s.iam_instance_profile = Some("p".into());
        s.security_group_ids = vec!["sg-1".into()];
        s.subnets = vec!["subnet-a".into()];
        let r = resolve_node(&s, "n1", None, None).unwrap();
        assert_eq!((r.http_tokens_required, r.hop_limit), (Some(true), Some(1)));
    }

    #[test]
    fn without_an_image_id_the_replaced_instances_ami_is_launched() {
        let mut s = spec();
        s.image_id = None;
        let r = resolve_node(&s, "n1", Some("i-1"), Some(&record())).unwrap();
        assert_eq!(r.image_id.as_deref(), Some("ami-0old"));
        assert!(
            r.from.contains(&"imageId: instance i-1".to_string()),
            "{:?}",
            r.from
        );
        let mut unknown = record();
        unknown.image_id = None;
        let e = resolve_node(&s, "n1", Some("i-1"), Some(&unknown)).unwrap_err();
        assert!(
            matches!(&e, JoinError::NodeSettings { missing, .. } if *missing == [NodeKey::Image]),
            "{e}"
        );
        assert!(
            e.to_string().contains("spec.replacement.nodeClassRef"),
            "{e}"
        );
        // The plan's own image wins.
        let r = resolve_node(&spec(), "n1", Some("i-1"), Some(&record())).unwrap();
        assert_eq!(r.image_id.as_deref(), Some("ami-1"));
    }

    #[test]
    fn a_launch_template_carries_its_own_node_settings() {
        let mut s = spec();
        s.launch_template = Some(LaunchTemplateRef {
            name: Some("nodes".into()),
            ..Default::default()
        });
        let r = resolve_node(&s, "n1", Some("i-1"), Some(&record())).unwrap();
        assert_eq!(join_settings(&r), JoinSettings::default());
        assert!(r.subnet_ids.is_empty());
    }
}
