//! The DisruptionPolicy's `replacement` section: what a plan's replacement may launch. Launch settings
//! (AMI, instance profile, security groups, subnets, launch template, user data) decide what runs with
//! the node IAM role and which workloads land on the node, so they come from what the platform team
//! governs: a Karpenter EC2NodeClass, the replaced instance itself, or the allow-lists below. A plan's
//! own free-form values are refused unless the policy allows them (security review, finding C-1).
//!
//! The decisions are in [`crate::planning::launch_policy`].

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Allow-lists of launch settings. An empty list allows nothing free-form (except `nodeClasses` and
/// `instanceTypes`, see their fields); `allowFreeForm: true` allows any value where a list is empty.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReplacementPolicy {
    /// Let plans name any AMI, instance profile, security group, subnet, launch template, IMDS option and
    /// cluster setting of their own (where the matching list below is empty), and any Bottlerocket
    /// setting except host and bootstrap containers, bootstrap commands, kernel settings (sysctls,
    /// modules), boot parameters, trusted certificates and registry mirrors, which `allowedSettings`
    /// must still list. Off (the default): a plan names an EC2NodeClass, or inherits from the
    /// replaced instance, or names only values listed here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_free_form: bool,
    /// EC2NodeClasses a plan may name in `replacement.nodeClassRef`. Empty: any EC2NodeClass of the
    /// cluster (each is the platform team's own object, and Karpenter launches any of them for a pod
    /// that asks); a list narrows it to those names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100), inner(length(min = 1, max = 253)))]
    pub node_classes: Vec<String>,
    /// AMI ids a plan may name in `replacement.imageId`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100), inner(length(min = 1, max = 128)))]
    pub image_ids: Vec<String>,
    /// Instance profiles (name or ARN, as the plan writes it) a plan may name in
    /// `replacement.iamInstanceProfile`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100), inner(length(min = 1, max = 2048)))]
    pub instance_profiles: Vec<String>,
    /// Security groups a plan may name in `replacement.securityGroupIds`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100), inner(length(min = 1, max = 64)))]
    pub security_group_ids: Vec<String>,
    /// Subnets a plan may name in `replacement.subnets`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100), inner(length(min = 1, max = 64)))]
    pub subnets: Vec<String>,
    /// Launch templates (id or name) a plan may name in `replacement.launchTemplate`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100), inner(length(min = 1, max = 128)))]
    pub launch_templates: Vec<String>,
    /// Instance types a plan may name in `replacement.instanceTypes`. Empty: any (an instance type
    /// runs nothing of its own; the IAM policy's `ec2:InstanceType` condition caps cost).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 200), inner(length(min = 1, max = 64)))]
    pub instance_types: Vec<String>,
    /// Bottlerocket settings a plan may set in `replacement.bottlerocket`, as dotted paths under
    /// `settings.`: an entry allows itself and everything under it. E.g. `kubernetes.node-labels`
    /// (any node label), `kubernetes.node-labels.example.com/pool` (one label),
    /// `kernel.sysctl.fs.inotify` (the inotify sysctls), `kubernetes.node-taints`,
    /// `kubernetes.cluster-dns-ip`, `host-containers.admin`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 200), inner(length(min = 1, max = 256)))]
    pub allowed_settings: Vec<String>,
}
