//! EC2 from the controller's side: terminate a node's instance, read its state, launch replacements.

use std::collections::BTreeMap;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    DefaultTargetCapacityType, FleetLaunchTemplateConfigRequest,
    FleetLaunchTemplateOverridesRequest, FleetLaunchTemplateSpecificationRequest,
    FleetOnDemandAllocationStrategy, FleetType, HttpTokensState, IamInstanceProfileSpecification,
    InstanceAttributeName, InstanceMarketOptionsRequest, InstanceMetadataOptionsRequest,
    InstanceType, LaunchTemplateHttpTokensState,
    LaunchTemplateIamInstanceProfileSpecificationRequest,
    LaunchTemplateInstanceMetadataOptionsRequest, LaunchTemplateSpecification, MarketType,
    OnDemandOptionsRequest, RequestLaunchTemplateData, ResourceType, SpotAllocationStrategy,
    SpotOptionsRequest, Tag, TagSpecification, TargetCapacitySpecificationRequest,
};
use base64::Engine as _;
use sha2::Digest as _;
use thiserror::Error;

use super::bottlerocket;

/// Tag keys that make Karpenter's garbage collector terminate an instance that has no NodeClaim.
pub const KARPENTER_OWNERSHIP_TAGS: [&str; 3] = [
    "karpenter.sh/nodepool",
    "karpenter.k8s.aws/ec2nodeclass",
    "eks:eks-cluster-name",
];

/// Errors talking to EC2, each naming the instance or request and the AWS error code.
#[derive(Debug, Error)]
pub enum CloudError {
    #[error("providerID {provider_id:?} does not name an EC2 instance: {reason}")]
    InvalidProviderId { provider_id: String, reason: String },
    #[error("invalid launch request: {0}")]
    InvalidRequest(String),
    #[error(
        "refusing to tag a self-launched instance with {keys:?}: with Karpenter's ownership tags its garbage collector terminates instances that have no NodeClaim; use a snapdrain.io/ tag instead"
    )]
    KarpenterOwnershipTags { keys: Vec<String> },
    #[error("EC2 {operation}{} failed with {code}: {message}", instance_suffix(.instance))]
    Api {
        operation: &'static str,
        instance: Option<String>,
        code: String,
        message: String,
    },
    #[error("EC2 {operation}{} failed before EC2 answered (endpoint unreachable, timeout or bad response): {message}", instance_suffix(.instance))]
    Transport {
        operation: &'static str,
        instance: Option<String>,
        message: String,
    },
    #[error("no capacity for the replacement: every override failed: {}", describe_failures(.failures))]
    NoCapacity { failures: Vec<OverrideFailure> },
    #[error("EC2 {operation} answered without {missing}")]
    UnexpectedResponse {
        operation: &'static str,
        missing: &'static str,
    },
}

fn instance_suffix(instance: &Option<String>) -> String {
    instance
        .as_ref()
        .map(|i| format!(" for instance {i}"))
        .unwrap_or_default()
}

fn describe_failures(failures: &[OverrideFailure]) -> String {
    if failures.is_empty() {
        return "EC2 returned neither instances nor errors".into();
    }
    failures
        .iter()
        .map(|f| {
            format!(
                "{} in {} ({}): {}",
                f.instance_type.as_deref().unwrap_or("?"),
                f.subnet_id.as_deref().or(f.zone.as_deref()).unwrap_or("?"),
                f.code,
                f.message
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// EC2 error codes that retrying the same request cannot fix, checked against the EC2 API reference
/// "Error codes for the Amazon EC2 API" (errors-overview.html): the common client errors about
/// credentials, permissions and malformed parameters, and the action-specific ones naming an id that is
/// malformed or does not exist. `IdempotentParameterMismatch`: the ClientToken was used with other
/// parameters; `IdempotentInstanceTerminated`: the token's instance is terminated, so the same token can
/// never launch again. Not here: throttling, `InsufficientInstanceCapacity` (HTTP 500, see
/// [`CloudError::is_capacity`]), quota codes such as `InstanceLimitExceeded`/`VcpuLimitExceeded`
/// (they clear when capacity frees up) and server errors.
const PERMANENT_CODES: &[&str] = &[
    "UnauthorizedOperation",
    "AuthFailure",
    "Blocked",
    "OptInRequired",
    "PendingVerification",
    "InvalidClientTokenId",
    "InvalidParameterValue",
    "InvalidParameterCombination",
    "InvalidParameter",
    "MissingParameter",
    "UnknownParameter",
    "UnsupportedOperation",
    "Unsupported",
    "IdempotentParameterMismatch",
    "IdempotentInstanceTerminated",
    "InvalidAMIID.NotFound",
    "InvalidAMIID.Malformed",
    "InvalidAMIID.Unavailable",
    "InvalidSubnetID.NotFound",
    "InvalidSubnetID.Malformed",
    "InvalidGroup.NotFound",
    "InvalidGroupId.Malformed",
    "InvalidSecurityGroupID.NotFound",
    "InvalidSecurityGroupId.Malformed",
    "InvalidInstanceID.Malformed",
    "InvalidKeyPair.NotFound",
    "InvalidLaunchTemplateId.NotFound",
    "InvalidLaunchTemplateId.Malformed",
    "InvalidLaunchTemplateId.VersionNotFound",
    "InvalidLaunchTemplateName.NotFoundException",
    "InvalidLaunchTemplateName.MalformedException",
    "InvalidUserData.Malformed",
    "InvalidZone.NotFound",
    "InvalidTagKey.Malformed",
    // DescribeInstanceTypes: "The following supplied instance types do not exist: [...]".
    "InvalidInstanceType",
    // Auto Scaling (Query API): the instance is not in a group, or the request is malformed.
    "ValidationError",
];

/// Codes that mean EC2 has no capacity for this type in this zone right now.
const CAPACITY_CODES: &[&str] = &[
    "InsufficientInstanceCapacity",
    "InsufficientCapacityOnHost",
    "InsufficientFreeAddressesInSubnet",
    "UnfulfillableCapacity",
];

/// How many launches in a row without capacity (RunInstances' InsufficientInstanceCapacity, or a
/// CreateFleet whose every override failed for capacity) a replacement takes before the plan fails.
/// The SDK already retried each RunInstances call (EC2 sends InsufficientInstanceCapacity as HTTP 500),
/// and the plan waits between tries (30 s, doubling, by default: `Settings::capacity_retry_base`), so
/// this is 7.5 minutes of trying, not seconds: EC2's capacity shortages pass in minutes (EC2 user guide,
/// "Insufficient instance capacity": wait a few minutes and try again).
pub const CAPACITY_ATTEMPTS: u32 = 5;

impl CloudError {
    /// True when retrying cannot help: the plan fails with this message instead.
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::InvalidProviderId { .. }
            | Self::InvalidRequest(_)
            | Self::KarpenterOwnershipTags { .. } => true,
            // Every pool out of capacity passes; a pool refused for another reason (a quota, a bad
            // subnet) does not by waiting.
            Self::NoCapacity { .. } => !self.is_capacity(),
            Self::Api { code, .. } => PERMANENT_CODES.contains(&code.as_str()),
            Self::Transport { .. } | Self::UnexpectedResponse { .. } => false,
        }
    }

    /// EC2 had no capacity for the request (RunInstances answers InsufficientInstanceCapacity as an API
    /// error, HTTP 500; an instant CreateFleet answers 200 with one error per override, in its errorSet:
    /// EC2 API reference, CreateFleet "Errors"). A fleet counts only when every override failed for
    /// capacity.
    pub fn is_capacity(&self) -> bool {
        match self {
            Self::Api { code, .. } => CAPACITY_CODES.contains(&code.as_str()),
            Self::NoCapacity { failures } => {
                !failures.is_empty()
                    && failures
                        .iter()
                        .all(|f| CAPACITY_CODES.contains(&f.code.as_str()))
            }
            _ => false,
        }
    }

    /// The AWS error code, when EC2 sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            CloudError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    pub(crate) fn from_sdk<E>(operation: &'static str, instance: Option<&str>, err: E) -> CloudError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let instance = instance.map(str::to_string);
        match err.code() {
            Some(code) => CloudError::Api {
                operation,
                instance,
                code: code.to_string(),
                message: err.message().unwrap_or_default().to_string(),
            },
            None => CloudError::Transport {
                operation,
                instance,
                message: aws_smithy_types::error::display::DisplayErrorContext(err).to_string(),
            },
        }
    }
}

/// An AMI as DescribeImages describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    pub id: String,
    pub name: Option<String>,
    /// `x86_64`, `arm64`, `i386`, ... (EC2's `ArchitectureValues`).
    pub architecture: Option<String>,
    /// `available`, `pending`, `failed`, `deregistered`, ...
    pub state: Option<String>,
}

/// What a launch takes from one launch template version (DescribeLaunchTemplateVersions).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TemplateVersion {
    pub template_id: Option<String>,
    pub version_number: Option<i64>,
    /// `ImageId`: absent when the launch must name the AMI.
    pub image_id: Option<String>,
    /// `InstanceType`: absent when the launch names the type, or the version selects types by
    /// attributes.
    pub instance_type: Option<String>,
    /// The version selects instance types by attributes (`InstanceRequirements`) instead of naming one.
    pub instance_requirements: bool,
}

/// One CreateFleet override that EC2 could not fulfil.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverrideFailure {
    pub instance_type: Option<String>,
    pub subnet_id: Option<String>,
    pub zone: Option<String>,
    pub code: String,
    pub message: String,
}

/// Extracts the instance id from a Node's `spec.providerID`: `aws:///<az>/i-…`, `aws:////i-…` or `i-…`.
pub fn instance_id_from_provider_id(provider_id: &str) -> Result<String, CloudError> {
    let invalid = |reason: &str| CloudError::InvalidProviderId {
        provider_id: provider_id.to_string(),
        reason: reason.to_string(),
    };
    let path = match provider_id.split_once("://") {
        Some(("aws", rest)) => rest,
        Some((scheme, _)) => {
            return Err(invalid(&format!(
                "scheme {scheme:?} is not aws (is this node on EC2?)"
            )));
        }
        None if provider_id.starts_with("i-") => provider_id,
        None => return Err(invalid("expected aws:///<zone>/i-… or i-…")),
    };
    // Like cloud-provider-aws: the last path token, which must look like an instance id.
    let id = path.rsplit('/').next().unwrap_or_default();
    let valid =
        id.len() > 2 && id.starts_with("i-") && id[2..].chars().all(|c| c.is_ascii_alphanumeric());
    if valid {
        Ok(id.to_string())
    } else {
        Err(invalid("the last path element is not an instance id (i-…)"))
    }
}

/// Instance states as EC2 reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceLifecycleState {
    Pending,
    Running,
    ShuttingDown,
    Terminated,
    Stopping,
    Stopped,
    Other(String),
}

impl InstanceLifecycleState {
    /// Terminated or on its way there.
    pub fn is_gone(&self) -> bool {
        matches!(
            self,
            InstanceLifecycleState::ShuttingDown | InstanceLifecycleState::Terminated
        )
    }
}

/// What `terminate` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminateOutcome {
    /// EC2 accepted the termination (or it was already under way); `previous` was the state before.
    Terminating { previous: InstanceLifecycleState },
    /// EC2 does not know the instance (already gone, or never existed).
    NotFound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CapacityType {
    #[default]
    OnDemand,
    Spot,
}

/// A launch template and its version (`$Latest`, `$Default` or a number).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchTemplateRef {
    /// Sent as LaunchTemplateId when it is one (see [`is_launch_template_id`]), else as LaunchTemplateName.
    pub id_or_name: String,
    pub version: String,
}

/// EC2 resource ids are the type prefix and 17 lowercase hex characters (EC2 user guide, "Resource IDs":
/// the longer id format, the only one launch templates ever had). `lt-web` or `lt-prod-v2` are names.
pub fn is_launch_template_id(s: &str) -> bool {
    s.strip_prefix("lt-").is_some_and(|hex| {
        hex.len() == 17
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// IMDS options for the replacement (`MetadataOptions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataSettings {
    /// IMDSv2 only (`HttpTokens=required`).
    pub tokens_required: bool,
    pub hop_limit: i32,
}

/// What a self-launched instance needs to join the cluster besides its user data: the node role's
/// instance profile, security groups that reach the control plane, IMDS options (the same things
/// Karpenter's launch templates always carry: karpenter-provider-aws
/// pkg/providers/launchtemplate/types.go).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JoinSettings {
    /// An instance profile ARN (`arn:…`) or name.
    pub instance_profile: Option<String>,
    pub security_group_ids: Vec<String>,
    pub metadata: Option<MetadataSettings>,
}

/// What DescribeInstances says about an instance (while it is not terminated: a terminated instance
/// loses its network interfaces and profile association).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceDetails {
    pub state: InstanceLifecycleState,
    pub instance_type: Option<String>,
    pub image_id: Option<String>,
    pub subnet_id: Option<String>,
    pub zone: Option<String>,
    /// ARN.
    pub instance_profile: Option<String>,
    pub security_group_ids: Vec<String>,
    pub metadata: Option<MetadataSettings>,
    pub tags: BTreeMap<String, String>,
}

/// The tag EC2 Auto Scaling (and so EKS managed node groups) puts on its instances.
pub const ASG_NAME_TAG: &str = "aws:autoscaling:groupName";

impl InstanceDetails {
    /// The Auto Scaling group the instance belongs to.
    pub fn auto_scaling_group(&self) -> Option<&str> {
        self.tags.get(ASG_NAME_TAG).map(String::as_str)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetOverride {
    pub instance_type: String,
    pub subnet_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchStrategy {
    /// CreateFleet `Type=instant`, one instance, overrides tried in order of preference.
    /// Without a launch template, one holding the image and user data is created (reused by name).
    Fleet {
        overrides: Vec<FleetOverride>,
        capacity_type: CapacityType,
        launch_template: Option<LaunchTemplateRef>,
    },
    /// RunInstances from a launch template; request parameters override the template.
    LaunchTemplate {
        template: LaunchTemplateRef,
        instance_type: Option<String>,
        subnet_id: Option<String>,
        /// `None`: what the template says. Spot is requested with `InstanceMarketOptions`.
        capacity_type: Option<CapacityType>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchRequest {
    pub strategy: LaunchStrategy,
    pub image_id: Option<String>,
    /// Rendered Bottlerocket TOML (not base64; this client encodes it).
    pub user_data: Option<String>,
    pub tags: BTreeMap<String, String>,
    /// Instance profile, security groups, IMDS: on the request (RunInstances) or in the launch template
    /// made for the fleet.
    pub join: JoinSettings,
    /// Derived by the caller from the node UID and attempt, so retries never double-launch. ≤ 64 ASCII.
    pub client_token: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchedInstance {
    pub instance_id: String,
    pub instance_type: Option<String>,
    pub zone: Option<String>,
    pub subnet_id: Option<String>,
}

/// Instances plus the overrides that failed on the way (CreateFleet reports both in one 200).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOutcome {
    pub instances: Vec<LaunchedInstance>,
    pub override_failures: Vec<OverrideFailure>,
    /// The launch template made for this fleet launch (no longer needed once it launched).
    pub created_template: Option<String>,
}

/// Controller-side EC2 client (with Auto Scaling beside it, for instances in a group).
#[derive(Debug, Clone)]
pub struct Ec2Cloud {
    client: Client,
    autoscaling: aws_sdk_autoscaling::Client,
}

impl Ec2Cloud {
    /// From the standard AWS environment (credentials chain, `AWS_ENDPOINT_URL_EC2`); `region` (the
    /// `--region` setting) wins over `AWS_REGION` and the profile's region when given.
    pub async fn from_env(region: Option<&str>) -> Ec2Cloud {
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Some(r) = region {
            loader = loader.region(aws_config::Region::new(r.to_string()));
        }
        Ec2Cloud::from_config(&loader.load().await)
    }

    pub fn from_config(config: &aws_config::SdkConfig) -> Ec2Cloud {
        Ec2Cloud {
            client: Client::new(config),
            autoscaling: aws_sdk_autoscaling::Client::new(config),
        }
    }

    /// The region the clients sign for.
    pub fn region(&self) -> Option<String> {
        self.client.config().region().map(|r| r.to_string())
    }

    /// Against an explicit endpoint (a private EC2 endpoint, LocalStack, a test double), which then also
    /// serves Auto Scaling (both are AWS query protocol services). Static credentials when given,
    /// otherwise the default chain.
    pub async fn with_endpoint(
        endpoint: &str,
        region: &str,
        static_credentials: Option<(&str, &str)>,
    ) -> Ec2Cloud {
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .endpoint_url(endpoint)
            .region(aws_config::Region::new(region.to_string()));
        if let Some((ak, sk)) = static_credentials {
            loader = loader.credentials_provider(aws_credential_types::Credentials::new(
                ak,
                sk,
                None,
                None,
                "snapdrain-static",
            ));
        }
        Ec2Cloud::from_config(&loader.load().await)
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Terminates an instance. Idempotent: an already-terminated or unknown instance counts as done.
    pub async fn terminate(&self, instance_id: &str) -> Result<TerminateOutcome, CloudError> {
        match self
            .client
            .terminate_instances()
            .instance_ids(instance_id)
            .send()
            .await
        {
            Ok(out) => {
                let previous = out
                    .terminating_instances()
                    .iter()
                    .find(|c| c.instance_id() == Some(instance_id))
                    .and_then(|c| c.previous_state())
                    .and_then(|s| s.name())
                    .map(state_of)
                    .unwrap_or(InstanceLifecycleState::Other("unknown".into()));
                Ok(TerminateOutcome::Terminating { previous })
            }
            Err(e) if e.code() == Some("InvalidInstanceID.NotFound") => {
                Ok(TerminateOutcome::NotFound)
            }
            Err(e) => Err(CloudError::from_sdk(
                "TerminateInstances",
                Some(instance_id),
                e,
            )),
        }
    }

    /// Terminates an Auto Scaling group member through the group, so that the group does not launch
    /// a replacement behind snapdrain's back when `decrement` (Auto Scaling API reference,
    /// TerminateInstanceInAutoScalingGroup: without the decrement "Amazon EC2 Auto Scaling launches
    /// instances to replace the ones that are terminated").
    pub async fn terminate_in_auto_scaling_group(
        &self,
        instance_id: &str,
        decrement: bool,
    ) -> Result<(), CloudError> {
        match self
            .autoscaling
            .terminate_instance_in_auto_scaling_group()
            .instance_id(instance_id)
            .should_decrement_desired_capacity(decrement)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => Err(CloudError::from_sdk(
                "TerminateInstanceInAutoScalingGroup",
                Some(instance_id),
                e,
            )),
        }
    }

    /// What EC2 knows about the instance, or `None` when it does not know it.
    pub async fn describe_instance(
        &self,
        instance_id: &str,
    ) -> Result<Option<InstanceDetails>, CloudError> {
        let out = match self
            .client
            .describe_instances()
            .instance_ids(instance_id)
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) if e.code() == Some("InvalidInstanceID.NotFound") => return Ok(None),
            Err(e) => {
                return Err(CloudError::from_sdk(
                    "DescribeInstances",
                    Some(instance_id),
                    e,
                ));
            }
        };
        let Some(i) = out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .find(|i| i.instance_id() == Some(instance_id))
        else {
            return Ok(None);
        };
        Ok(Some(InstanceDetails {
            state: i
                .state()
                .and_then(|s| s.name())
                .map(state_of)
                .unwrap_or(InstanceLifecycleState::Other("unknown".into())),
            instance_type: i.instance_type().map(|t| t.as_str().to_string()),
            image_id: i.image_id().filter(|s| !s.is_empty()).map(str::to_string),
            subnet_id: i.subnet_id().filter(|s| !s.is_empty()).map(str::to_string),
            zone: i
                .placement()
                .and_then(|p| p.availability_zone())
                .map(str::to_string),
            instance_profile: i
                .iam_instance_profile()
                .and_then(|p| p.arn())
                .map(str::to_string),
            security_group_ids: i
                .security_groups()
                .iter()
                .filter_map(|g| g.group_id().map(str::to_string))
                .collect(),
            metadata: i.metadata_options().map(|m| MetadataSettings {
                tokens_required: m.http_tokens() == Some(&HttpTokensState::Required),
                hop_limit: m.http_put_response_hop_limit().unwrap_or(1),
            }),
            tags: i
                .tags()
                .iter()
                .filter_map(|t| {
                    Some((
                        t.key()?.to_string(),
                        t.value().unwrap_or_default().to_string(),
                    ))
                })
                .collect(),
        }))
    }

    /// The instance's user data, base64-decoded (DescribeInstanceAttribute `userData`, which EC2 answers
    /// base64-encoded, also for user data that came from a launch template). `None` when EC2 does not
    /// know the instance or it was launched without user data.
    pub async fn user_data(&self, instance_id: &str) -> Result<Option<Vec<u8>>, CloudError> {
        let out = match self
            .client
            .describe_instance_attribute()
            .instance_id(instance_id)
            .attribute(InstanceAttributeName::UserData)
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) if e.code() == Some("InvalidInstanceID.NotFound") => return Ok(None),
            Err(e) => {
                return Err(CloudError::from_sdk(
                    "DescribeInstanceAttribute",
                    Some(instance_id),
                    e,
                ));
            }
        };
        let Some(b64) = out
            .user_data()
            .and_then(|v| v.value())
            .filter(|v| !v.trim().is_empty())
        else {
            return Ok(None);
        };
        base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map(Some)
            .map_err(|_| CloudError::UnexpectedResponse {
                operation: "DescribeInstanceAttribute",
                missing: "base64 user data",
            })
    }

    /// The availability zone of each subnet (DescribeSubnets).
    pub async fn subnet_zones(
        &self,
        subnet_ids: &[String],
    ) -> Result<BTreeMap<String, String>, CloudError> {
        let out = self
            .client
            .describe_subnets()
            .set_subnet_ids(Some(subnet_ids.to_vec()))
            .send()
            .await
            .map_err(|e| CloudError::from_sdk("DescribeSubnets", None, e))?;
        Ok(out
            .subnets()
            .iter()
            .filter_map(|s| {
                Some((
                    s.subnet_id()?.to_string(),
                    s.availability_zone()?.to_string(),
                ))
            })
            .collect())
    }

    /// The AMIs `image_ids` as DescribeImages describes them (architecture, name, state). An id EC2 does
    /// not have, or does not share with the account, is refused with `InvalidAMIID.NotFound` (EC2 API
    /// reference, DescribeImages; errors-overview), a permanent error.
    pub async fn describe_images(
        &self,
        image_ids: &[String],
    ) -> Result<Vec<ImageInfo>, CloudError> {
        let out = self
            .client
            .describe_images()
            .set_image_ids(Some(image_ids.to_vec()))
            .send()
            .await
            .map_err(|e| CloudError::from_sdk("DescribeImages", None, e))?;
        Ok(out
            .images()
            .iter()
            .filter_map(|i| {
                Some(ImageInfo {
                    id: i.image_id()?.to_string(),
                    name: i.name().map(str::to_string),
                    architecture: i.architecture().map(|a| a.as_str().to_string()),
                    state: i.state().map(|s| s.as_str().to_string()),
                })
            })
            .collect())
    }

    /// The processor architectures each of `instance_types` runs (DescribeInstanceTypes
    /// `processorInfo.supportedArchitectures`). A type EC2 does not have in the region is refused with
    /// `InvalidInstanceType`, a permanent error.
    pub async fn instance_type_architectures(
        &self,
        instance_types: &[String],
    ) -> Result<BTreeMap<String, Vec<String>>, CloudError> {
        let out = self
            .client
            .describe_instance_types()
            .set_instance_types(Some(
                instance_types
                    .iter()
                    .map(|t| InstanceType::from(t.as_str()))
                    .collect(),
            ))
            .send()
            .await
            .map_err(|e| CloudError::from_sdk("DescribeInstanceTypes", None, e))?;
        Ok(out
            .instance_types()
            .iter()
            .filter_map(|t| {
                let archs = t
                    .processor_info()?
                    .supported_architectures()
                    .iter()
                    .map(|a| a.as_str().to_string())
                    .collect();
                Some((t.instance_type()?.as_str().to_string(), archs))
            })
            .collect())
    }

    /// The version of a launch template a launch from `template` uses, as DescribeLaunchTemplateVersions
    /// describes it (`LaunchTemplateVersion.1` is the version as the launch names it: a number,
    /// `$Latest` or `$Default`; EC2 API reference, DescribeLaunchTemplateVersions `Versions`). A template
    /// EC2 does not have is `InvalidLaunchTemplateId.NotFound` or
    /// `InvalidLaunchTemplateName.NotFoundException`, a version it does not have
    /// `InvalidLaunchTemplateId.VersionNotFound`, no permission `UnauthorizedOperation`: all permanent.
    pub async fn launch_template_version(
        &self,
        template: &LaunchTemplateRef,
    ) -> Result<TemplateVersion, CloudError> {
        let req = self
            .client
            .describe_launch_template_versions()
            .versions(&template.version);
        let req = if is_launch_template_id(&template.id_or_name) {
            req.launch_template_id(&template.id_or_name)
        } else {
            req.launch_template_name(&template.id_or_name)
        };
        let out = req
            .send()
            .await
            .map_err(|e| CloudError::from_sdk("DescribeLaunchTemplateVersions", None, e))?;
        let v = out
            .launch_template_versions()
            .first()
            .ok_or(CloudError::UnexpectedResponse {
                operation: "DescribeLaunchTemplateVersions",
                missing: "the version asked for",
            })?;
        let data = v.launch_template_data();
        Ok(TemplateVersion {
            template_id: v.launch_template_id().map(str::to_string),
            version_number: v.version_number(),
            image_id: data.and_then(|d| d.image_id()).map(str::to_string),
            instance_type: data
                .and_then(|d| d.instance_type())
                .map(|t| t.as_str().to_string()),
            instance_requirements: data.is_some_and(|d| d.instance_requirements().is_some()),
        })
    }

    /// Deletes a launch template by name; one already gone is fine.
    pub async fn delete_launch_template(&self, name: &str) -> Result<(), CloudError> {
        match self
            .client
            .delete_launch_template()
            .launch_template_name(name)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("InvalidLaunchTemplateName.NotFoundException") => Ok(()),
            Err(e) => Err(CloudError::from_sdk("DeleteLaunchTemplate", None, e)),
        }
    }

    /// The instance's state, or `None` when EC2 does not know it. A freshly launched id can be
    /// briefly unknown (eventual consistency), so callers should not treat `None` as final right after a launch.
    pub async fn instance_state(
        &self,
        instance_id: &str,
    ) -> Result<Option<InstanceLifecycleState>, CloudError> {
        match self
            .client
            .describe_instances()
            .instance_ids(instance_id)
            .send()
            .await
        {
            Ok(out) => Ok(out
                .reservations()
                .iter()
                .flat_map(|r| r.instances())
                .find(|i| i.instance_id() == Some(instance_id))
                .and_then(|i| i.state())
                .and_then(|s| s.name())
                .map(state_of)),
            Err(e) if e.code() == Some("InvalidInstanceID.NotFound") => Ok(None),
            Err(e) => Err(CloudError::from_sdk(
                "DescribeInstances",
                Some(instance_id),
                e,
            )),
        }
    }

    /// Launches replacement capacity; partial CreateFleet failures are logged.
    pub async fn launch(&self, req: LaunchRequest) -> Result<Vec<LaunchedInstance>, CloudError> {
        let outcome = self.launch_with_report(req).await?;
        for f in &outcome.override_failures {
            tracing::warn!(
                instance_type = ?f.instance_type, subnet = ?f.subnet_id, zone = ?f.zone,
                code = %f.code, ec2_message = %f.message,
                "EC2 could not use a launch override; another one was used"
            );
        }
        Ok(outcome.instances)
    }

    /// Like [`Ec2Cloud::launch`], also returning the overrides that failed.
    pub async fn launch_with_report(
        &self,
        req: LaunchRequest,
    ) -> Result<LaunchOutcome, CloudError> {
        check_request(&req)?;
        let tags = tag_specification(ResourceType::Instance, &req.tags);
        match &req.strategy {
            LaunchStrategy::LaunchTemplate {
                template,
                instance_type,
                subnet_id,
                capacity_type,
            } => {
                let join = &req.join;
                let out = self
                    .client
                    .run_instances()
                    .launch_template(launch_template_spec(template))
                    .set_image_id(req.image_id.clone())
                    .set_instance_type(instance_type.as_deref().map(InstanceType::from))
                    .set_subnet_id(subnet_id.clone())
                    .set_iam_instance_profile(join.instance_profile.as_deref().map(|p| {
                        let b = IamInstanceProfileSpecification::builder();
                        if p.starts_with("arn:") {
                            b.arn(p)
                        } else {
                            b.name(p)
                        }
                        .build()
                    }))
                    .set_security_group_ids(
                        (!join.security_group_ids.is_empty())
                            .then(|| join.security_group_ids.clone()),
                    )
                    .set_metadata_options(join.metadata.as_ref().map(|m| {
                        InstanceMetadataOptionsRequest::builder()
                            .http_tokens(if m.tokens_required {
                                HttpTokensState::Required
                            } else {
                                HttpTokensState::Optional
                            })
                            .http_put_response_hop_limit(m.hop_limit)
                            .build()
                    }))
                    // RunInstances launches on-demand unless asked for spot (EC2 API reference,
                    // RunInstances `InstanceMarketOptions`).
                    .set_instance_market_options((*capacity_type == Some(CapacityType::Spot)).then(
                        || {
                            InstanceMarketOptionsRequest::builder()
                                .market_type(MarketType::Spot)
                                .build()
                        },
                    ))
                    .set_user_data(req.user_data.as_deref().map(bottlerocket::encode_base64))
                    .min_count(1)
                    .max_count(1)
                    .set_tag_specifications(tags.map(|t| vec![t]))
                    .client_token(&req.client_token)
                    .send()
                    .await
                    .map_err(|e| CloudError::from_sdk("RunInstances", None, e))?;
                let instances: Vec<LaunchedInstance> = out
                    .instances()
                    .iter()
                    .filter_map(|i| {
                        Some(LaunchedInstance {
                            instance_id: i.instance_id()?.to_string(),
                            instance_type: i.instance_type().map(|t| t.as_str().to_string()),
                            zone: i
                                .placement()
                                .and_then(|p| p.availability_zone())
                                .map(str::to_string),
                            subnet_id: i.subnet_id().map(str::to_string),
                        })
                    })
                    .collect();
                if instances.is_empty() {
                    return Err(CloudError::UnexpectedResponse {
                        operation: "RunInstances",
                        missing: "any instance",
                    });
                }
                Ok(LaunchOutcome {
                    instances,
                    override_failures: Vec::new(),
                    created_template: None,
                })
            }
            LaunchStrategy::Fleet {
                overrides,
                capacity_type,
                launch_template,
            } => {
                let (template, created) = match launch_template {
                    Some(t) => (t.clone(), None),
                    None => {
                        let t = self.ensure_template(&req).await?;
                        let name = t.id_or_name.clone();
                        (t, Some(name))
                    }
                };
                let mut outcome = self
                    .create_fleet(&req, overrides, *capacity_type, &template, tags)
                    .await?;
                outcome.created_template = created;
                Ok(outcome)
            }
        }
    }

    /// A launch template carrying the image and user data for this launch ([`template_name`]).
    async fn ensure_template(&self, req: &LaunchRequest) -> Result<LaunchTemplateRef, CloudError> {
        let image = req.image_id.as_deref().ok_or_else(|| {
            CloudError::InvalidRequest(
                "a fleet launch without a launch template needs an image id".into(),
            )
        })?;
        let name = template_name(req, image);
        let join = &req.join;
        let data = RequestLaunchTemplateData::builder()
            .image_id(image)
            .set_user_data(req.user_data.as_deref().map(bottlerocket::encode_base64))
            .set_iam_instance_profile(join.instance_profile.as_deref().map(|p| {
                let b = LaunchTemplateIamInstanceProfileSpecificationRequest::builder();
                if p.starts_with("arn:") {
                    b.arn(p)
                } else {
                    b.name(p)
                }
                .build()
            }))
            .set_security_group_ids(
                (!join.security_group_ids.is_empty()).then(|| join.security_group_ids.clone()),
            )
            .set_metadata_options(join.metadata.as_ref().map(|m| {
                LaunchTemplateInstanceMetadataOptionsRequest::builder()
                    .http_tokens(if m.tokens_required {
                        LaunchTemplateHttpTokensState::Required
                    } else {
                        LaunchTemplateHttpTokensState::Optional
                    })
                    .http_put_response_hop_limit(m.hop_limit)
                    .build()
            }))
            .build();
        // Tagged at creation with the cluster tag only (the plan's own tags stay on the instances):
        // deploy/iam/snapdrain-policy.json allows creating, launching
        // from and deleting only templates tagged `kubernetes.io/cluster/<name>=owned`.
        let cluster_tags: BTreeMap<String, String> = req
            .tags
            .iter()
            .filter(|(k, _)| k.starts_with("kubernetes.io/cluster/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        match self
            .client
            .create_launch_template()
            .launch_template_name(&name)
            .launch_template_data(data)
            .set_tag_specifications(
                tag_specification(ResourceType::LaunchTemplate, &cluster_tags).map(|t| vec![t]),
            )
            .send()
            .await
        {
            Ok(_) => {}
            Err(e) if e.code() == Some("InvalidLaunchTemplateName.AlreadyExistsException") => {}
            Err(e) => return Err(CloudError::from_sdk("CreateLaunchTemplate", None, e)),
        }
        Ok(LaunchTemplateRef {
            id_or_name: name,
            version: "$Latest".into(),
        })
    }

    async fn create_fleet(
        &self,
        req: &LaunchRequest,
        overrides: &[FleetOverride],
        capacity_type: CapacityType,
        template: &LaunchTemplateRef,
        tags: Option<TagSpecification>,
    ) -> Result<LaunchOutcome, CloudError> {
        let spec = {
            let b = FleetLaunchTemplateSpecificationRequest::builder().version(&template.version);
            if is_launch_template_id(&template.id_or_name) {
                b.launch_template_id(&template.id_or_name).build()
            } else {
                b.launch_template_name(&template.id_or_name).build()
            }
        };
        let overrides: Vec<_> = overrides
            .iter()
            .enumerate()
            .map(|(i, o)| {
                FleetLaunchTemplateOverridesRequest::builder()
                    .instance_type(InstanceType::from(o.instance_type.as_str()))
                    .subnet_id(&o.subnet_id)
                    // A fleet template made by us carries the image; one given by the caller may not.
                    .set_image_id(req.image_id.clone())
                    // Lower is preferred: the order the plan lists them in.
                    .priority(i as f64)
                    .build()
            })
            .collect();
        let config = FleetLaunchTemplateConfigRequest::builder()
            .launch_template_specification(spec)
            .set_overrides(Some(overrides))
            .build();
        let capacity = TargetCapacitySpecificationRequest::builder()
            .total_target_capacity(1)
            .default_target_capacity_type(match capacity_type {
                CapacityType::OnDemand => DefaultTargetCapacityType::OnDemand,
                CapacityType::Spot => DefaultTargetCapacityType::Spot,
            })
            .build();
        // Without an allocation strategy EC2 Fleet takes the lowest price, whatever the priorities. These
        // two honour Priority (EC2 user guide, "Allocation strategies for EC2 Fleet"); Karpenter uses
        // them the same way (karpenter-provider-aws pkg/providers/instance/types.go).
        let out = self
            .client
            .create_fleet()
            .r#type(FleetType::Instant)
            .on_demand_options(
                OnDemandOptionsRequest::builder()
                    .allocation_strategy(FleetOnDemandAllocationStrategy::Prioritized)
                    .build(),
            )
            .spot_options(
                SpotOptionsRequest::builder()
                    .allocation_strategy(SpotAllocationStrategy::CapacityOptimizedPrioritized)
                    .build(),
            )
            .launch_template_configs(config)
            .target_capacity_specification(capacity)
            .set_tag_specifications(tags.map(|t| vec![t]))
            .client_token(&req.client_token)
            .send()
            .await
            .map_err(|e| CloudError::from_sdk("CreateFleet", None, e))?;
        let override_failures: Vec<OverrideFailure> = out
            .errors()
            .iter()
            .map(|e| {
                let o = e
                    .launch_template_and_overrides()
                    .and_then(|l| l.overrides());
                OverrideFailure {
                    instance_type: o
                        .and_then(|o| o.instance_type())
                        .map(|t| t.as_str().to_string()),
                    subnet_id: o.and_then(|o| o.subnet_id()).map(str::to_string),
                    zone: o.and_then(|o| o.availability_zone()).map(str::to_string),
                    code: e.error_code().unwrap_or("Unknown").to_string(),
                    message: e.error_message().unwrap_or_default().to_string(),
                }
            })
            .collect();
        let instances: Vec<LaunchedInstance> = out
            .instances()
            .iter()
            .flat_map(|fi| {
                let o = fi
                    .launch_template_and_overrides()
                    .and_then(|l| l.overrides());
                fi.instance_ids().iter().map(move |id| LaunchedInstance {
                    instance_id: id.clone(),
                    instance_type: fi.instance_type().map(|t| t.as_str().to_string()),
                    zone: o.and_then(|o| o.availability_zone()).map(str::to_string),
                    subnet_id: o.and_then(|o| o.subnet_id()).map(str::to_string),
                })
            })
            .collect();
        if instances.is_empty() {
            return Err(CloudError::NoCapacity {
                failures: override_failures,
            });
        }
        Ok(LaunchOutcome {
            instances,
            override_failures,
            created_template: None,
        })
    }
}

fn state_of(name: &aws_sdk_ec2::types::InstanceStateName) -> InstanceLifecycleState {
    use aws_sdk_ec2::types::InstanceStateName as N;
    match name {
        N::Pending => InstanceLifecycleState::Pending,
        N::Running => InstanceLifecycleState::Running,
        N::ShuttingDown => InstanceLifecycleState::ShuttingDown,
        N::Terminated => InstanceLifecycleState::Terminated,
        N::Stopping => InstanceLifecycleState::Stopping,
        N::Stopped => InstanceLifecycleState::Stopped,
        other => InstanceLifecycleState::Other(other.as_str().to_string()),
    }
}

fn launch_template_spec(t: &LaunchTemplateRef) -> LaunchTemplateSpecification {
    let b = LaunchTemplateSpecification::builder().version(&t.version);
    if is_launch_template_id(&t.id_or_name) {
        b.launch_template_id(&t.id_or_name).build()
    } else {
        b.launch_template_name(&t.id_or_name).build()
    }
}

fn tag_specification(
    kind: ResourceType,
    tags: &BTreeMap<String, String>,
) -> Option<TagSpecification> {
    if tags.is_empty() {
        return None;
    }
    let mut b = TagSpecification::builder().resource_type(kind);
    for (k, v) in tags {
        b = b.tags(Tag::builder().key(k).value(v).build());
    }
    Some(b.build())
}

/// Pure checks before anything is sent.
pub fn check_request(req: &LaunchRequest) -> Result<(), CloudError> {
    let t = &req.client_token;
    if t.is_empty() || t.len() > 64 || !t.is_ascii() {
        return Err(CloudError::InvalidRequest(format!(
            "client token {t:?} must be 1-64 ASCII characters (derive it from the node UID and attempt, hashed if needed)"
        )));
    }
    let karpenter: Vec<String> = req
        .tags
        .keys()
        .filter(|k| KARPENTER_OWNERSHIP_TAGS[..2].contains(&k.as_str()))
        .cloned()
        .collect();
    if !karpenter.is_empty() {
        return Err(CloudError::KarpenterOwnershipTags { keys: karpenter });
    }
    if req.tags.keys().any(|k| k.starts_with("aws:")) {
        return Err(CloudError::InvalidRequest(
            "tag keys starting with aws: are reserved by AWS".into(),
        ));
    }
    if let Some(ud) = &req.user_data {
        bottlerocket::validate(ud).map_err(|e| {
            CloudError::InvalidRequest(format!("the user data would not boot: {e}"))
        })?;
    }
    if let LaunchStrategy::Fleet {
        overrides,
        launch_template,
        ..
    } = &req.strategy
    {
        if overrides.is_empty() {
            return Err(CloudError::InvalidRequest(
                "a fleet launch needs at least one (instance type, subnet) override".into(),
            ));
        }
        if launch_template.is_some() && req.user_data.is_some() {
            return Err(CloudError::InvalidRequest(
                "CreateFleet cannot override user data: put it in the launch template, or leave the template out so one is made"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// The launch template's name: a hash of what it carries and of the launch's client token. Retries of
/// one launch (same token) find the template made before a crash; two plans asking for the same image
/// and user data at once get a template each. Shared, one plan deleted it after its own launch while
/// the other was about to launch from it (`InvalidLaunchTemplateName.NotFoundException` from CreateFleet,
/// seen in the 1,000-disruption soak).
fn template_name(req: &LaunchRequest, image: &str) -> String {
    let mut h = sha2::Sha256::new();
    h.update(image.as_bytes());
    h.update([0]);
    h.update(req.user_data.as_deref().unwrap_or_default().as_bytes());
    h.update([0]);
    h.update(format!("{:?}", req.join).as_bytes());
    h.update([0]);
    h.update(req.client_token.as_bytes());
    let digest = h.finalize();
    format!(
        "snapdrain-{}",
        digest
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids() {
        let ok = |p: &str| instance_id_from_provider_id(p).unwrap();
        assert_eq!(
            ok("aws:///us-west-2a/i-0123456789abcdef0"),
            "i-0123456789abcdef0"
        );
        assert_eq!(ok("aws:////i-0123456789abcdef0"), "i-0123456789abcdef0");
        assert_eq!(ok("i-0123456789abcdef0"), "i-0123456789abcdef0");
        for bad in [
            "",
            "gce://p/z/vm",
            "aws:///us-west-2a/",
            "aws:///us-west-2a/vol-1",
            "node-1",
            "aws:///us-west-2a/i-",
        ] {
            let e = instance_id_from_provider_id(bad).unwrap_err();
            assert!(matches!(e, CloudError::InvalidProviderId { .. }), "{bad}");
        }
    }

    fn req() -> LaunchRequest {
        LaunchRequest {
            strategy: LaunchStrategy::Fleet {
                overrides: vec![FleetOverride {
                    instance_type: "m5.large".into(),
                    subnet_id: "subnet-1".into(),
                }],
                capacity_type: CapacityType::OnDemand,
                launch_template: None,
            },
            image_id: Some("ami-1".into()),
            user_data: None,
            tags: BTreeMap::new(),
            join: JoinSettings::default(),
            client_token: "node-uid-attempt-1".into(),
        }
    }

    #[test]
    fn a_launch_template_is_one_launchs_own_and_its_retries() {
        let a = req();
        assert_eq!(
            template_name(&a, "ami-1"),
            template_name(&req(), "ami-1"),
            "a retry"
        );
        let mut b = req();
        b.client_token = "other-node-uid-attempt-1".into();
        assert_ne!(
            template_name(&a, "ami-1"),
            template_name(&b, "ami-1"),
            "another plan's"
        );
        assert_ne!(template_name(&a, "ami-1"), template_name(&a, "ami-2"));
        let name = template_name(&a, "ami-1");
        // EC2: a launch template name is 3 to 128 characters.
        assert!(name.starts_with("snapdrain-") && name.len() == 26, "{name}");
    }

    #[test]
    fn karpenter_tags_are_refused() {
        let mut r = req();
        r.tags
            .insert("karpenter.sh/nodepool".into(), "default".into());
        let e = check_request(&r).unwrap_err();
        assert!(matches!(e, CloudError::KarpenterOwnershipTags { .. }));
        assert!(e.to_string().contains("garbage collector"));
        let mut r = req();
        r.tags.insert("eks:eks-cluster-name".into(), "c".into());
        r.tags
            .insert("snapdrain.io/replaces".into(), "node-1".into());
        assert!(check_request(&r).is_ok());
    }

    #[test]
    fn tokens_and_fleet_shape_are_checked() {
        let mut r = req();
        r.client_token = "x".repeat(65);
        assert!(check_request(&r).is_err());
        let mut r = req();
        r.strategy = LaunchStrategy::Fleet {
            overrides: vec![],
            capacity_type: CapacityType::Spot,
            launch_template: None,
        };
        assert!(
            check_request(&r)
                .unwrap_err()
                .to_string()
                .contains("override")
        );
        let mut r = req();
        r.user_data = Some("[settings]\n".into());
        assert!(
            check_request(&r)
                .unwrap_err()
                .to_string()
                .contains("would not boot")
        );
    }

    /// #16: the `--region` setting wins (AWS_REGION and the profile only apply without it).
    #[tokio::test]
    async fn the_region_setting_is_used() {
        let cloud = Ec2Cloud::from_env(Some("eu-west-3")).await;
        assert_eq!(cloud.region().as_deref(), Some("eu-west-3"));
    }

    #[test]
    fn launch_template_ids_are_lt_and_17_hex() {
        assert!(is_launch_template_id("lt-0abcd290751193123"));
        for name in [
            "lt-web",
            "lt-prod-v2",
            "lt-0ABCD290751193123",
            "lt-0abcd29075119312",
            "lt-0abcd2907511931234",
            "lt-0abcd29075119312g",
            "snapdrain-0a1b",
        ] {
            assert!(!is_launch_template_id(name), "{name} is a name");
        }
        let by_name = launch_template_spec(&LaunchTemplateRef {
            id_or_name: "lt-web".into(),
            version: "$Default".into(),
        });
        assert_eq!(by_name.launch_template_name(), Some("lt-web"));
        assert_eq!(by_name.launch_template_id(), None);
    }

    #[test]
    fn capacity_errors_are_retried_and_client_errors_are_permanent() {
        let api = |code: &str| CloudError::Api {
            operation: "RunInstances",
            instance: None,
            code: code.into(),
            message: String::new(),
        };
        let ice = api("InsufficientInstanceCapacity");
        assert!(ice.is_capacity() && !ice.is_permanent());
        for code in [
            "InvalidSubnetID.Malformed",
            "InvalidGroup.NotFound",
            "IdempotentInstanceTerminated",
            "InvalidLaunchTemplateId.VersionNotFound",
        ] {
            assert!(api(code).is_permanent(), "{code}");
        }
        for code in ["RequestLimitExceeded", "VcpuLimitExceeded", "InternalError"] {
            assert!(!api(code).is_permanent(), "{code}");
        }
    }

    #[test]
    fn a_fleet_with_every_pool_out_of_capacity_is_a_capacity_error() {
        let pool = |t: &str, code: &str| OverrideFailure {
            instance_type: Some(t.into()),
            subnet_id: Some("subnet-a".into()),
            zone: None,
            code: code.into(),
            message: "none".into(),
        };
        let short = CloudError::NoCapacity {
            failures: vec![
                pool("m5.large", "InsufficientInstanceCapacity"),
                pool("c5.large", "InsufficientInstanceCapacity"),
            ],
        };
        assert!(short.is_capacity() && !short.is_permanent());
        let silent = CloudError::NoCapacity { failures: vec![] };
        assert!(
            silent.is_permanent() && !silent.is_capacity(),
            "neither instances nor errors is no shortage"
        );
    }

    #[test]
    fn no_capacity_names_each_override() {
        let e = CloudError::NoCapacity {
            failures: vec![
                OverrideFailure {
                    instance_type: Some("m5.large".into()),
                    subnet_id: Some("subnet-a".into()),
                    zone: None,
                    code: "InsufficientInstanceCapacity".into(),
                    message: "none".into(),
                },
                OverrideFailure {
                    instance_type: Some("c5.large".into()),
                    subnet_id: Some("subnet-b".into()),
                    zone: None,
                    code: "VcpuLimitExceeded".into(),
                    message: "quota".into(),
                },
            ],
        };
        assert!(
            e.is_permanent() && !e.is_capacity(),
            "a quota in one pool does not pass by waiting"
        );
        let s = e.to_string();
        assert!(
            s.contains("m5.large in subnet-a (InsufficientInstanceCapacity)"),
            "{s}"
        );
        assert!(
            s.contains("c5.large in subnet-b (VcpuLimitExceeded)"),
            "{s}"
        );
    }
}
