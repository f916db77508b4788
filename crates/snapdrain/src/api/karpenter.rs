//! The parts of Karpenter's `karpenter.k8s.aws/v1` EC2NodeClass that snapdrain reads, as plain serde
//! structs (snapdrain never installs Karpenter's CRDs). Field names follow karpenter-provider-aws
//! v1.14 `pkg/apis/v1/ec2nodeclass.go` (spec) and `ec2nodeclass_status.go` (status: what Karpenter's
//! nodeclass controllers resolved the selectors to). Unknown fields are ignored.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use serde::{Deserialize, Serialize};

/// `karpenter.k8s.aws`, `v1`, `ec2nodeclasses` (cluster-scoped).
pub fn ec2nodeclass_resource() -> kube::api::ApiResource {
    let gvk = kube::api::GroupVersionKind::gvk("karpenter.k8s.aws", "v1", "EC2NodeClass");
    kube::api::ApiResource::from_gvk_with_plural(&gvk, "ec2nodeclasses")
}

/// An EC2NodeClass.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Ec2NodeClass {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Ec2NodeClassSpec,
    #[serde(default)]
    pub status: Option<Ec2NodeClassStatus>,
}

/// `spec`: what the platform team wrote (the selectors themselves are Karpenter's to resolve).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Ec2NodeClassSpec {
    /// Bottlerocket TOML for the Bottlerocket family; Karpenter merges its own settings into it.
    #[serde(default)]
    pub user_data: Option<String>,
    /// Tags for the instances (the CRD refuses Karpenter's own tag keys and `kubernetes.io/cluster/*`).
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// IMDS options; the CRD defaults them to `required` with hop limit 1.
    #[serde(default)]
    pub metadata_options: Option<MetadataOptions>,
    #[serde(default)]
    pub ami_family: Option<String>,
}

/// `spec.metadataOptions`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MetadataOptions {
    #[serde(default)]
    pub http_tokens: Option<String>,
    #[serde(default)]
    pub http_put_response_hop_limit: Option<i64>,
}

/// `status`: the selectors resolved by Karpenter (`pkg/controllers/nodeclass/{ami,subnet,securitygroup,
/// instanceprofile}.go`), and the root `Ready` condition over them (operatorpkg's `NewReadyConditions`
/// of AMIsReady, SubnetsReady, SecurityGroupsReady, InstanceProfileReady, ValidationSucceeded).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Ec2NodeClassStatus {
    #[serde(default)]
    pub amis: Vec<Ami>,
    #[serde(default)]
    pub subnets: Vec<Subnet>,
    #[serde(default)]
    pub security_groups: Vec<SecurityGroup>,
    /// The profile of `spec.role` Karpenter created, or `spec.instanceProfile` copied.
    #[serde(default)]
    pub instance_profile: Option<String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// `status.amis[]`, newest first (karpenter-provider-aws `pkg/providers/amifamily/types.go`
/// `AMIs.Sort`: by creation date, descending).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Ami {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub deprecated: bool,
    #[serde(default)]
    pub requirements: Vec<k8s_openapi::api::core::v1::NodeSelectorRequirement>,
}

/// `status.subnets[]`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Subnet {
    pub id: String,
    #[serde(default)]
    pub zone: Option<String>,
}

/// `status.securityGroups[]`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SecurityGroup {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
}
