//! The EC2 actions the simulator implements. Each returns a response document or an [`ApiError`].

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;

use super::bottlerocket::MAX_USER_DATA_BYTES;
use super::params::Params;
use super::state::{
    self, FleetError, FleetLaunch, Instance, LaunchSecurity, TemplateData, TokenRecord, World,
};
use super::templates;
use super::xml::Xml;
use super::{
    DEFAULT_SECURITY_GROUP, FleetOverrideRecord, FleetRequest, InstanceInfo, InstanceState,
    MetadataOptions, Shared, SubnetConfig,
};

/// An EC2 error as the API returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ApiError {
    pub(super) status: u16,
    pub(super) code: String,
    pub(super) message: String,
}

impl ApiError {
    pub(super) fn new(status: u16, code: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code: code.into(),
            message: message.into(),
        }
    }

    pub(super) fn bad(code: &str, message: impl Into<String>) -> ApiError {
        ApiError::new(400, code, message)
    }

    pub(super) fn missing(name: &str) -> ApiError {
        ApiError::bad(
            "MissingParameter",
            format!("The request must contain the parameter {name}"),
        )
    }

    /// Capacity errors come back as 500 (so SDKs retry them); quota errors as 400.
    fn capacity(code: &str, instance_type: &str, zone: &str) -> ApiError {
        let status = if code == "InsufficientInstanceCapacity" {
            500
        } else {
            400
        };
        ApiError::new(status, code, capacity_message(code, instance_type, zone))
    }
}

/// EC2's answer when a pool has no capacity (EC2 API reference, "Error codes").
const INSUFFICIENT_CAPACITY: &str = "InsufficientInstanceCapacity";

fn capacity_message(code: &str, instance_type: &str, zone: &str) -> String {
    match code {
        "InsufficientInstanceCapacity" => format!(
            "We currently do not have sufficient {instance_type} capacity in the Availability Zone you requested ({zone}). Our system will be working on provisioning additional capacity."
        ),
        other => format!("{other} for {instance_type} in {zone} (injected by the simulator)"),
    }
}

type ActionResult = Result<String, ApiError>;

pub(super) fn dispatch(shared: &Arc<Shared>, p: &Params, request_id: &str) -> ActionResult {
    let action = p.get("Action").ok_or_else(|| ApiError::missing("Action"))?;
    if p.flag("DryRun") {
        return Err(ApiError::new(
            412,
            "DryRunOperation",
            "Request would have succeeded, but DryRun flag is set.",
        ));
    }
    let mut x = Xml::response(action, request_id);
    match action {
        "RunInstances" => run_instances(shared, p, &mut x)?,
        "CreateFleet" => create_fleet(shared, p, &mut x)?,
        "TerminateInstances" => terminate_instances(shared, p, &mut x)?,
        "DescribeInstances" => describe_instances(shared, p, &mut x)?,
        "DescribeInstanceAttribute" => describe_instance_attribute(shared, p, &mut x)?,
        "CreateTags" => create_tags(shared, p, &mut x)?,
        "CreateLaunchTemplate" => templates::create_launch_template(shared, p, &mut x)?,
        "CreateLaunchTemplateVersion" => {
            templates::create_launch_template_version(shared, p, &mut x)?
        }
        "DescribeLaunchTemplates" => templates::describe_launch_templates(shared, p, &mut x)?,
        "DescribeLaunchTemplateVersions" => {
            templates::describe_launch_template_versions(shared, p, &mut x)?
        }
        "DeleteLaunchTemplate" => templates::delete_launch_template(shared, p, &mut x)?,
        "DescribeSubnets" => describe_subnets(shared, p, &mut x)?,
        "DescribeImages" => super::images::describe_images(shared, p, &mut x)?,
        "DescribeInstanceTypes" => super::images::describe_instance_types(p, &mut x)?,
        "CreateSnapshots" => super::snapshots::create_snapshots(shared, p, &mut x)?,
        "CreateSnapshot" => super::snapshots::create_snapshot(shared, p, &mut x)?,
        "DescribeSnapshots" => super::snapshots::describe_snapshots(shared, p, &mut x)?,
        other => {
            return Err(ApiError::bad(
                "InvalidAction",
                format!(
                    "The action {other} is not valid for this web service (the simulator implements RunInstances, CreateFleet, TerminateInstances, DescribeInstances, DescribeInstanceAttribute, CreateTags, CreateLaunchTemplate, CreateLaunchTemplateVersion, DescribeLaunchTemplates, DescribeLaunchTemplateVersions, DeleteLaunchTemplate, DescribeSubnets, DescribeImages, DescribeInstanceTypes, CreateSnapshots, CreateSnapshot, DescribeSnapshots)."
                ),
            ));
        }
    }
    Ok(x.finish(action))
}

// ---------- shared launch plumbing ----------

/// Fully resolved launch parameters for one batch of identical instances.
struct Resolved {
    image_id: String,
    instance_type: String,
    subnet_index: usize,
    subnet: SubnetConfig,
    user_data: Option<Vec<u8>>,
    tags: BTreeMap<String, String>,
    spot: bool,
    security: LaunchSecurity,
}

/// `IamInstanceProfile.{Arn|Name}`, `SecurityGroupId.N` and `MetadataOptions.*` under `p`, checked
/// against what exists (EC2 API reference, RunInstances; errors-overview: `InvalidGroup.NotFound`,
/// `InvalidParameterValue`).
pub(super) fn launch_security(shared: &Shared, p: &Params) -> Result<LaunchSecurity, ApiError> {
    let config = &shared.config;
    let profile = match (
        p.get("IamInstanceProfile.Arn"),
        p.get("IamInstanceProfile.Name"),
    ) {
        (Some(arn), _) => {
            let known = config
                .instance_profiles
                .iter()
                .any(|n| config.instance_profile_arn(n) == arn);
            if !known {
                return Err(ApiError::bad(
                    "InvalidParameterValue",
                    format!(
                        "Value ({arn}) for parameter iamInstanceProfile.arn is invalid. Invalid IAM Instance Profile ARN"
                    ),
                ));
            }
            Some(arn.to_string())
        }
        (None, Some(name)) => {
            if !config.instance_profiles.iter().any(|n| n == name) {
                return Err(ApiError::bad(
                    "InvalidParameterValue",
                    format!(
                        "Value ({name}) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name"
                    ),
                ));
            }
            Some(config.instance_profile_arn(name))
        }
        (None, None) => None,
    };
    let groups = p.list("SecurityGroupId");
    for g in &groups {
        if !g.starts_with("sg-") {
            return Err(ApiError::bad(
                "InvalidSecurityGroupId.Malformed",
                format!("Invalid id: \"{g}\" (expecting \"sg-...\")"),
            ));
        }
        if !config.security_groups.iter().any(|s| &s.id == g) {
            return Err(ApiError::bad(
                "InvalidGroup.NotFound",
                format!("The security group '{g}' does not exist in VPC 'vpc-0sim0000000000000'"),
            ));
        }
    }
    let http_tokens = match p.get("MetadataOptions.HttpTokens") {
        None => None,
        Some(t @ ("optional" | "required")) => Some(t.to_string()),
        Some(other) => {
            return Err(ApiError::bad(
                "InvalidParameterValue",
                format!("Invalid value '{other}' for HttpTokens (use optional or required)"),
            ));
        }
    };
    let hop_limit = match p.get("MetadataOptions.HttpPutResponseHopLimit") {
        None => None,
        Some(v) => match v.parse::<u32>() {
            Ok(n @ 1..=64) => Some(n),
            _ => {
                return Err(ApiError::bad(
                    "InvalidParameterValue",
                    format!("Invalid value '{v}' for HttpPutResponseHopLimit (1-64)"),
                ));
            }
        },
    };
    Ok(LaunchSecurity {
        instance_profile: profile,
        security_group_ids: groups,
        http_tokens,
        hop_limit,
    })
}

/// EC2 refuses an empty subnet id instead of picking one (errors-overview: `InvalidSubnetID.Malformed`,
/// "Ensure that you specify the ID in the form subnet-xxxxxxxx").
fn refuse_blank_subnet(p: &Params, name: &str) -> Result<(), ApiError> {
    if p.is_blank(name) {
        return Err(ApiError::bad(
            "InvalidSubnetID.Malformed",
            "Invalid id: \"\" (expecting \"subnet-...\")",
        ));
    }
    Ok(())
}

pub(super) fn decode_user_data(b64: &str) -> Result<Vec<u8>, ApiError> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|_| {
            ApiError::bad(
                "InvalidUserData.Malformed",
                "Invalid BASE64 encoding of user data.",
            )
        })?;
    if raw.len() > MAX_USER_DATA_BYTES {
        return Err(ApiError::bad(
            "InvalidParameterValue",
            format!("User data is limited to {MAX_USER_DATA_BYTES} bytes"),
        ));
    }
    Ok(raw)
}

pub(super) fn check_image(image: &str) -> Result<(), ApiError> {
    if image.starts_with("ami-") || image.starts_with("resolve:ssm:") {
        Ok(())
    } else {
        Err(ApiError::bad(
            "InvalidAMIID.Malformed",
            format!("Invalid id: \"{image}\" (expecting \"ami-...\")"),
        ))
    }
}

pub(super) fn check_instance_type(t: &str) -> Result<(), ApiError> {
    let ok = t.split_once('.').is_some_and(|(f, s)| {
        !f.is_empty()
            && !s.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
    });
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad(
            "InvalidParameterValue",
            format!("Invalid value '{t}' for InstanceType."),
        ))
    }
}

pub(super) fn subnet_for(
    shared: &Shared,
    subnet: Option<&str>,
    zone: Option<&str>,
) -> Result<(usize, SubnetConfig), ApiError> {
    let subnets = &shared.config.subnets;
    let found = match (subnet, zone) {
        (Some(id), _) => subnets.iter().position(|s| s.id == id).ok_or_else(|| {
            ApiError::bad(
                "InvalidSubnetID.NotFound",
                format!("The subnet ID '{id}' does not exist"),
            )
        })?,
        (None, Some(z)) => subnets.iter().position(|s| s.zone == z).ok_or_else(|| {
            ApiError::bad(
                "InvalidParameterValue",
                format!("Invalid availability zone: [{z}]"),
            )
        })?,
        (None, None) => 0,
    };
    let s = subnets.get(found).cloned().ok_or_else(|| {
        ApiError::new(
            500,
            "InternalError",
            "The simulator has no subnets configured.",
        )
    })?;
    if let (Some(z), Some(_)) = (zone, subnet)
        && z != s.zone
    {
        return Err(ApiError::bad(
            "InvalidParameterCombination",
            format!("Subnet {} is in {}, not {z}", s.id, s.zone),
        ));
    }
    Ok((found, s))
}

/// Tags from `TagSpecification.N` entries for `resource_type`.
pub(super) fn tag_specs(
    p: &Params,
    prefix: &str,
    resource_type: &str,
) -> Result<BTreeMap<String, String>, ApiError> {
    let mut tags = BTreeMap::new();
    for spec in p.structs(prefix) {
        if spec.get("ResourceType") != Some(resource_type) {
            continue;
        }
        tags.extend(tag_list(&spec, "Tag")?);
    }
    Ok(tags)
}

fn tag_list(p: &Params, prefix: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let mut tags = BTreeMap::new();
    for t in p.structs(prefix) {
        let key = t.get("Key").ok_or_else(|| ApiError::missing("Tag.Key"))?;
        if key.len() > 128 || key.starts_with("aws:") {
            return Err(ApiError::bad(
                "InvalidParameterValue",
                format!(
                    "Tag key '{key}' is invalid: keys are at most 128 characters and may not start with 'aws:'"
                ),
            ));
        }
        let value = t.get("Value").unwrap_or_default();
        if value.len() > 256 {
            return Err(ApiError::bad(
                "InvalidParameterValue",
                format!("The value of tag '{key}' is longer than 256 characters"),
            ));
        }
        tags.insert(key.to_string(), value.to_string());
    }
    Ok(tags)
}

/// Looks up `LaunchTemplateId|LaunchTemplateName` + `Version` in `spec`: the template's id, the version
/// number the launch uses (`$Default` when absent: EC2 API reference, LaunchTemplateSpecification
/// `Version`, "Default: The default version of the launch template") and that version's parameters.
fn find_template(
    world: &World,
    spec: &Params,
) -> Result<Option<(String, u32, TemplateData)>, ApiError> {
    let t = match (spec.get("LaunchTemplateId"), spec.get("LaunchTemplateName")) {
        (None, None) => return Ok(None),
        (id, name) => super::templates::named(world, id, name)?,
    };
    let version = spec.get("Version").unwrap_or("$Default");
    let (n, data) = super::templates::version(t, version)?;
    Ok(Some((t.id.clone(), n, data.clone())))
}

/// Creates `count` pending instances; the caller starts their boot timers after unlocking.
fn launch(
    shared: &Shared,
    world: &mut World,
    r: &Resolved,
    count: u32,
    reservation_id: &str,
    client_token: Option<&str>,
) -> Vec<String> {
    let now = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .unwrap_or_else(|_| jiff::Timestamp::now());
    (0..count)
        .map(|_| {
            let id = super::random_instance_id();
            let ip = world.allocate_ip(r.subnet_index);
            world.insert(Instance {
                info: InstanceInfo {
                    id: id.clone(),
                    instance_type: r.instance_type.clone(),
                    image_id: r.image_id.clone(),
                    zone: r.subnet.zone.clone(),
                    subnet_id: r.subnet.id.clone(),
                    private_dns_name: state::private_dns_name(&ip, &shared.config.region),
                    private_ip: ip,
                    tags: r.tags.clone(),
                    user_data: None,
                    kubelet_error: None,
                    launch_time: now,
                    spot: r.spot,
                    iam_instance_profile: r.security.instance_profile.clone(),
                    // Without SecurityGroupIds, EC2 uses the VPC's default security group.
                    security_group_ids: if r.security.security_group_ids.is_empty() {
                        vec![DEFAULT_SECURITY_GROUP.to_string()]
                    } else {
                        r.security.security_group_ids.clone()
                    },
                    metadata_options: MetadataOptions {
                        http_tokens: r
                            .security
                            .http_tokens
                            .clone()
                            .unwrap_or_else(|| MetadataOptions::default().http_tokens),
                        hop_limit: r
                            .security
                            .hop_limit
                            .unwrap_or(MetadataOptions::default().hop_limit),
                    },
                },
                state: InstanceState::Pending,
                state_reason: None,
                reservation_id: reservation_id.to_string(),
                client_token: client_token.map(str::to_string),
                raw_user_data: r.user_data.clone(),
            });
            id
        })
        .collect()
}

fn check_token(token: &str) -> Result<(), ApiError> {
    if token.len() > 64 || !token.is_ascii() {
        return Err(ApiError::bad(
            "InvalidParameterValue",
            "ClientToken must be at most 64 ASCII characters",
        ));
    }
    Ok(())
}

fn mismatch(token: &str) -> ApiError {
    ApiError::bad(
        "IdempotentParameterMismatch",
        format!("The client token '{token}' was already used with different request parameters."),
    )
}

// ---------- RunInstances ----------

fn run_instances(shared: &Arc<Shared>, p: &Params, x: &mut Xml) -> Result<(), ApiError> {
    let token = p.get("ClientToken");
    let fingerprint = p.fingerprint();
    let (reservation_id, new_ids) = {
        let mut world = shared.world();
        if let Some(t) = token {
            check_token(t)?;
            if let Some(rec) = world.tokens.get(&("RunInstances".into(), t.into())) {
                if rec.fingerprint() != fingerprint {
                    return Err(mismatch(t));
                }
                if let TokenRecord::Run { reservation_id, .. } = rec {
                    let rid = reservation_id.clone();
                    write_reservation(shared, &world, &rid, x);
                    return Ok(());
                }
            }
        }
        let min: u32 = count_param(p, "MinCount")?;
        let max: u32 = count_param(p, "MaxCount")?;
        if min == 0 || min > max {
            return Err(ApiError::bad(
                "InvalidParameterValue",
                format!("MinCount ({min}) must be at least 1 and at most MaxCount ({max})"),
            ));
        }
        let (tdata, tref) = match find_template(&world, &p.nested("LaunchTemplate"))? {
            Some((id, n, data)) => (data, Some((id, n))),
            None => (TemplateData::default(), None),
        };
        // Request parameters override the template.
        let image_id = p
            .get("ImageId")
            .map(str::to_string)
            .or(tdata.image_id.clone())
            .ok_or_else(|| ApiError::missing("ImageId"))?;
        check_image(&image_id)?;
        if let Some(unknown) = super::images::unknown_image(&world, &image_id) {
            return Err(unknown);
        }
        let instance_type = p
            .get("InstanceType")
            .map(str::to_string)
            .or(tdata.instance_type.clone())
            .unwrap_or_else(|| "m1.small".into());
        check_instance_type(&instance_type)?;
        if let Some(refused) =
            super::images::architecture_mismatch(&world, &image_id, &instance_type)
        {
            return Err(refused);
        }
        refuse_blank_subnet(p, "SubnetId")?;
        let subnet_id = p
            .get("SubnetId")
            .map(str::to_string)
            .or(tdata.subnet_id.clone());
        let (subnet_index, subnet) = subnet_for(
            shared,
            subnet_id.as_deref(),
            p.get("Placement.AvailabilityZone"),
        )?;
        let security = launch_security(shared, p)?.over(&tdata.launch);
        let user_data = p
            .get("UserData")
            .map(str::to_string)
            .or(tdata.user_data.clone())
            .map(|u| decode_user_data(&u))
            .transpose()?;
        let mut tags = tdata.instance_tags.clone();
        tags.extend(tag_specs(p, "TagSpecification", "instance")?);
        if let Some((id, version)) = &tref {
            // EC2 marks instances launched from a template.
            tags.insert("aws:ec2launchtemplate:id".into(), id.clone());
            tags.insert("aws:ec2launchtemplate:version".into(), version.to_string());
        }
        let spot = match p.get("InstanceMarketOptions.MarketType") {
            Some(m) => m == "spot",
            None => tdata.spot,
        };
        let injected = shared
            .capacity_short("RunInstances")
            .then_some(INSUFFICIENT_CAPACITY);
        if let Some(code) = world.fault_for(&instance_type, &subnet.zone).or(injected) {
            return Err(ApiError::capacity(code, &instance_type, &subnet.zone));
        }
        let resolved = Resolved {
            image_id,
            instance_type,
            subnet_index,
            subnet,
            user_data,
            tags,
            spot,
            security,
        };
        let reservation_id = state::random_id("r-");
        let ids = launch(shared, &mut world, &resolved, max, &reservation_id, token);
        if let Some(t) = token {
            world.tokens.insert(
                ("RunInstances".into(), t.into()),
                TokenRecord::Run {
                    fingerprint,
                    reservation_id: reservation_id.clone(),
                },
            );
        }
        write_reservation(shared, &world, &reservation_id, x);
        (reservation_id, ids)
    };
    tracing::debug!(reservation = %reservation_id, ids = ?new_ids, "sim ec2: RunInstances");
    for id in new_ids {
        shared.schedule_boot(id);
    }
    Ok(())
}

fn count_param(p: &Params, name: &str) -> Result<u32, ApiError> {
    let v = p.get(name).ok_or_else(|| ApiError::missing(name))?;
    v.parse().map_err(|_| {
        ApiError::bad(
            "InvalidParameterValue",
            format!("Invalid value '{v}' for {name}"),
        )
    })
}

/// The body of RunInstancesResponse: one reservation.
fn write_reservation(shared: &Shared, world: &World, reservation_id: &str, x: &mut Xml) {
    x.leaf("reservationId", reservation_id)
        .leaf("ownerId", &shared.config.account_id)
        .open("groupSet")
        .close("groupSet")
        .open("instancesSet");
    for inst in world
        .ordered()
        .filter(|i| i.reservation_id == reservation_id)
    {
        write_instance(world, inst, x);
    }
    x.close("instancesSet");
}

fn write_instance(world: &World, inst: &Instance, x: &mut Xml) {
    let i = &inst.info;
    // The AMI's architecture (an image the simulator does not know: x86_64).
    let architecture = world
        .images
        .get(&i.image_id)
        .map_or("x86_64", |image| image.architecture.as_str());
    x.open("item")
        .leaf("instanceId", &i.id)
        .leaf("imageId", &i.image_id)
        .open("instanceState")
        .leaf("code", inst.state.code().to_string())
        .leaf("name", inst.state.name())
        .close("instanceState")
        .leaf("privateDnsName", &i.private_dns_name)
        .leaf("dnsName", "")
        .leaf("amiLaunchIndex", "0")
        .leaf("instanceType", &i.instance_type)
        .leaf("launchTime", i.launch_time.to_string())
        .open("placement")
        .leaf("availabilityZone", &i.zone)
        .leaf("tenancy", "default")
        .close("placement")
        .open("monitoring")
        .leaf("state", "disabled")
        .close("monitoring")
        .leaf("architecture", architecture)
        .leaf("rootDeviceType", "ebs")
        .leaf("rootDeviceName", "/dev/xvda")
        .leaf("virtualizationType", "hvm")
        .leaf("hypervisor", "xen")
        .opt("clientToken", inst.client_token.as_deref());
    // A terminated instance has lost its network interface (subnet, address, security groups) and its
    // instance profile association; DescribeInstances shows it without them for a while.
    let terminated = inst.state == InstanceState::Terminated;
    if !terminated {
        x.leaf("subnetId", &i.subnet_id)
            .leaf("vpcId", "vpc-0sim0000000000000")
            .leaf("privateIpAddress", &i.private_ip);
    }
    if let Some(arn) = i.iam_instance_profile.as_ref().filter(|_| !terminated) {
        x.open("iamInstanceProfile")
            .leaf("arn", arn)
            .leaf("id", "AIPAS1MSNAPDRAIN0000")
            .close("iamInstanceProfile");
    }
    x.open("groupSet");
    for g in i.security_group_ids.iter().filter(|_| !terminated) {
        x.open("item").leaf("groupId", g).close("item");
    }
    x.close("groupSet")
        .open("metadataOptions")
        .leaf("state", "applied")
        .leaf("httpTokens", &i.metadata_options.http_tokens)
        .leaf(
            "httpPutResponseHopLimit",
            i.metadata_options.hop_limit.to_string(),
        )
        .leaf("httpEndpoint", "enabled")
        .close("metadataOptions");
    if i.spot {
        x.leaf("instanceLifecycle", "spot");
    }
    if let Some((code, message)) = &inst.state_reason {
        x.leaf("reason", message)
            .open("stateReason")
            .leaf("code", code)
            .leaf("message", message)
            .close("stateReason");
    }
    write_tags(&i.tags, x);
    x.close("item");
}

pub(super) fn write_tags(tags: &BTreeMap<String, String>, x: &mut Xml) {
    x.open("tagSet");
    for (k, v) in tags {
        x.open("item").leaf("key", k).leaf("value", v).close("item");
    }
    x.close("tagSet");
}

// ---------- CreateFleet ----------

fn create_fleet(shared: &Arc<Shared>, p: &Params, x: &mut Xml) -> Result<(), ApiError> {
    let token = p.get("ClientToken");
    let fingerprint = p.fingerprint();
    let new_ids = {
        let mut world = shared.world();
        if let Some(t) = token {
            check_token(t)?;
            if let Some(rec) = world.tokens.get(&("CreateFleet".into(), t.into())) {
                if rec.fingerprint() != fingerprint {
                    return Err(mismatch(t));
                }
                if let TokenRecord::Fleet {
                    fleet_id,
                    errors,
                    launches,
                    ..
                } = rec
                {
                    write_fleet(fleet_id, errors, launches, x);
                    return Ok(());
                }
            }
        }
        match p.get("Type") {
            Some("instant") => {}
            other => {
                return Err(ApiError::bad(
                    "InvalidParameterValue",
                    format!(
                        "Fleet type {} is not supported by the simulator; use Type=instant",
                        other.unwrap_or("maintain (the default)")
                    ),
                ));
            }
        }
        let tcs = p.nested("TargetCapacitySpecification");
        let total: u32 = count_param(&tcs, "TotalTargetCapacity")?;
        let spot = match tcs.get("DefaultTargetCapacityType") {
            Some("spot") => true,
            Some("on-demand") | None => false,
            Some(other) => {
                return Err(ApiError::bad(
                    "InvalidParameterValue",
                    format!("Invalid DefaultTargetCapacityType '{other}' (use spot or on-demand)"),
                ));
            }
        };
        let configs = p.structs("LaunchTemplateConfigs");
        if configs.is_empty() {
            return Err(ApiError::missing("LaunchTemplateConfigs"));
        }
        let on_demand_strategy = p
            .get("OnDemandOptions.AllocationStrategy")
            .map(str::to_string);
        let spot_strategy = p.get("SpotOptions.AllocationStrategy").map(str::to_string);
        // EC2 API reference, OnDemandOptionsRequest / SpotOptionsRequest `AllocationStrategy`.
        if let Some(s) = &on_demand_strategy
            && !matches!(s.as_str(), "lowest-price" | "prioritized")
        {
            return Err(ApiError::bad(
                "InvalidParameterValue",
                format!(
                    "Invalid OnDemandOptions.AllocationStrategy '{s}' (lowest-price or prioritized)"
                ),
            ));
        }
        if let Some(s) = &spot_strategy
            && !matches!(
                s.as_str(),
                "lowest-price"
                    | "diversified"
                    | "capacity-optimized"
                    | "capacity-optimized-prioritized"
                    | "price-capacity-optimized"
            )
        {
            return Err(ApiError::bad(
                "InvalidParameterValue",
                format!("Invalid SpotOptions.AllocationStrategy '{s}'"),
            ));
        }
        let strategy = if spot {
            spot_strategy.clone()
        } else {
            on_demand_strategy.clone()
        }
        .unwrap_or_else(|| "lowest-price".into());
        let mut instance_tags = tag_specs(p, "TagSpecification", "instance")?;
        let fleet_id = format!("fleet-{}", uuid::Uuid::new_v4());
        let mut errors = Vec::new();
        let mut launches = Vec::new();
        let mut new_ids = Vec::new();

        // Every (template, override) candidate in request order.
        let mut candidates: Vec<(String, String, TemplateData, Params)> = Vec::new();
        for cfg in &configs {
            let spec = cfg.nested("LaunchTemplateSpecification");
            let (tid, version, tdata) = find_template(&world, &spec)?
                .ok_or_else(|| ApiError::missing("LaunchTemplateSpecification.LaunchTemplateId"))?;
            let version = version.to_string();
            let mut overrides = cfg.structs("Overrides");
            if overrides.is_empty() {
                overrides.push(Params::default());
            }
            for o in overrides {
                refuse_blank_subnet(&o, "SubnetId")?;
                candidates.push((tid.clone(), version.clone(), tdata.clone(), o));
            }
        }
        world.fleet_requests.push(FleetRequest {
            default_capacity_type: if spot { "spot" } else { "on-demand" }.into(),
            on_demand_allocation_strategy: on_demand_strategy,
            spot_allocation_strategy: spot_strategy,
            overrides: candidates
                .iter()
                .map(|(_, _, t, o)| FleetOverrideRecord {
                    instance_type: o
                        .get("InstanceType")
                        .map(str::to_string)
                        .or(t.instance_type.clone())
                        .unwrap_or_default(),
                    subnet_id: o.get("SubnetId").map(str::to_string),
                    priority: o.get("Priority").and_then(|v| v.parse().ok()),
                })
                .collect(),
        });
        // EC2 Fleet user guide, "Allocation strategies": `prioritized` and
        // `capacity-optimized-prioritized` honour Priority (lowest number first, unset last); the default
        // `lowest-price` takes the cheapest pool first whatever the request order.
        let priority = |o: &Params| {
            o.get("Priority")
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(f64::MAX)
        };
        match strategy.as_str() {
            "prioritized" | "capacity-optimized-prioritized" => {
                candidates.sort_by(|a, b| priority(&a.3).total_cmp(&priority(&b.3)))
            }
            _ => candidates.sort_by_key(|(_, _, t, o)| {
                price_rank(
                    o.get("InstanceType")
                        .or(t.instance_type.as_deref())
                        .unwrap_or_default(),
                )
            }),
        }

        // A fault rule leaves the request without capacity in every pool it names.
        let injected = shared
            .capacity_short("CreateFleet")
            .then_some(INSUFFICIENT_CAPACITY);
        // The first candidate that has capacity takes the whole target.
        for (tid, version, tdata, o) in &candidates {
            let (tid, version) = (tid.clone(), version.clone());
            {
                let instance_type = o
                    .get("InstanceType")
                    .map(str::to_string)
                    .or(tdata.instance_type.clone())
                    .ok_or_else(|| ApiError::missing("Overrides.InstanceType"))?;
                check_instance_type(&instance_type)?;
                let subnet_id = o
                    .get("SubnetId")
                    .map(str::to_string)
                    .or(tdata.subnet_id.clone());
                let (subnet_index, subnet) =
                    subnet_for(shared, subnet_id.as_deref(), o.get("AvailabilityZone"))?;
                let image_id = o
                    .get("ImageId")
                    .map(str::to_string)
                    .or(tdata.image_id.clone());
                // An override whose AMI EC2 does not have, or whose type cannot run the AMI, fails
                // alone, in the errorSet, before any pool is asked for capacity.
                let refused = image_id.as_deref().and_then(|image| {
                    super::images::unknown_image(&world, image).or_else(|| {
                        super::images::architecture_mismatch(&world, image, &instance_type)
                    })
                });
                if let Some(refused) = refused {
                    errors.push(FleetError {
                        template_id: tid.clone(),
                        template_version: version.clone(),
                        message: refused.message,
                        code: refused.code,
                        instance_type,
                        subnet_id: subnet.id,
                        zone: subnet.zone,
                        image_id: o.get("ImageId").map(str::to_string),
                    });
                    continue;
                }
                if let Some(code) = world.fault_for(&instance_type, &subnet.zone).or(injected) {
                    errors.push(FleetError {
                        template_id: tid.clone(),
                        template_version: version.clone(),
                        message: capacity_message(code, &instance_type, &subnet.zone),
                        code: code.to_string(),
                        instance_type,
                        subnet_id: subnet.id,
                        zone: subnet.zone,
                        image_id: o.get("ImageId").map(str::to_string),
                    });
                    continue;
                }
                let image = image_id.ok_or_else(|| {
                    ApiError::missing("ImageId (in the launch template or the override)")
                })?;
                check_image(&image)?;
                let user_data = tdata
                    .user_data
                    .as_deref()
                    .map(decode_user_data)
                    .transpose()?;
                let mut tags = tdata.instance_tags.clone();
                tags.append(&mut instance_tags);
                tags.insert("aws:ec2:fleet-id".into(), fleet_id.clone());
                tags.insert("aws:ec2launchtemplate:id".into(), tid.clone());
                tags.insert("aws:ec2launchtemplate:version".into(), version.clone());
                let resolved = Resolved {
                    image_id: image,
                    instance_type: instance_type.clone(),
                    subnet_index,
                    subnet: subnet.clone(),
                    user_data,
                    tags,
                    spot,
                    // Fleet overrides cannot set these: they come from the launch template.
                    security: tdata.launch.clone(),
                };
                let reservation_id = state::random_id("r-");
                let ids = launch(shared, &mut world, &resolved, total, &reservation_id, token);
                new_ids.extend(ids.iter().cloned());
                launches.push(FleetLaunch {
                    template_id: tid.clone(),
                    template_version: version.clone(),
                    instance_type,
                    subnet_id: subnet.id,
                    zone: subnet.zone,
                    image_id: o.get("ImageId").map(str::to_string),
                    spot,
                    instance_ids: ids,
                });
                break;
            }
        }
        write_fleet(&fleet_id, &errors, &launches, x);
        // An instant fleet has completed even when every override failed (HTTP 200, the failures in
        // its errorSet), so its token keeps that answer: a retry with the same token gets the same
        // errors however much capacity is back ("Ensuring idempotency in Amazon EC2 API requests",
        // EC2 developer guide: a retried request that completed returns the original result). A
        // RunInstances that fails with InsufficientInstanceCapacity (HTTP 500, a server error the
        // guide says to retry) records no token.
        if let Some(t) = token {
            world.tokens.insert(
                ("CreateFleet".into(), t.into()),
                TokenRecord::Fleet {
                    fingerprint,
                    fleet_id,
                    errors,
                    launches,
                },
            );
        }
        new_ids
    };
    for id in new_ids {
        shared.schedule_boot(id);
    }
    Ok(())
}

/// A stand-in for the on-demand price: bigger sizes cost more (`large` < `xlarge` < `2xlarge` ...).
fn price_rank(instance_type: &str) -> u32 {
    let size = instance_type
        .split_once('.')
        .map(|(_, s)| s)
        .unwrap_or_default();
    match size {
        "nano" => 1,
        "micro" => 2,
        "small" => 3,
        "medium" => 4,
        "large" => 5,
        "xlarge" => 6,
        other => other
            .strip_suffix("xlarge")
            .and_then(|n| n.parse::<u32>().ok())
            .map(|n| 6 + n)
            .unwrap_or(100),
    }
}

#[allow(clippy::too_many_arguments)]
fn write_template_and_overrides(
    template_id: &str,
    version: &str,
    instance_type: &str,
    subnet_id: &str,
    zone: &str,
    image_id: Option<&str>,
    x: &mut Xml,
) {
    x.open("launchTemplateAndOverrides")
        .open("launchTemplateSpecification")
        .leaf("launchTemplateId", template_id)
        .leaf("version", version)
        .close("launchTemplateSpecification")
        .open("overrides")
        .leaf("instanceType", instance_type)
        .leaf("subnetId", subnet_id)
        .leaf("availabilityZone", zone)
        .opt("imageId", image_id)
        .close("overrides")
        .close("launchTemplateAndOverrides");
}

fn write_fleet(fleet_id: &str, errors: &[FleetError], launches: &[FleetLaunch], x: &mut Xml) {
    x.leaf("fleetId", fleet_id).open("errorSet");
    for e in errors {
        x.open("item");
        write_template_and_overrides(
            &e.template_id,
            &e.template_version,
            &e.instance_type,
            &e.subnet_id,
            &e.zone,
            e.image_id.as_deref(),
            x,
        );
        x.leaf("lifecycle", "on-demand")
            .leaf("errorCode", &e.code)
            .leaf("errorMessage", &e.message)
            .close("item");
    }
    x.close("errorSet").open("fleetInstanceSet");
    for l in launches {
        x.open("item");
        write_template_and_overrides(
            &l.template_id,
            &l.template_version,
            &l.instance_type,
            &l.subnet_id,
            &l.zone,
            l.image_id.as_deref(),
            x,
        );
        x.leaf("lifecycle", if l.spot { "spot" } else { "on-demand" })
            .open("instanceIds");
        for id in &l.instance_ids {
            x.leaf("item", id);
        }
        x.close("instanceIds")
            .leaf("instanceType", &l.instance_type)
            .close("item");
    }
    x.close("fleetInstanceSet");
}

// ---------- TerminateInstances, DescribeInstances, CreateTags ----------

fn known_ids(world: &World, ids: &[String]) -> Result<(), ApiError> {
    for id in ids {
        if !id.starts_with("i-") {
            return Err(ApiError::bad(
                "InvalidInstanceID.Malformed",
                format!("Invalid id: \"{id}\""),
            ));
        }
    }
    let unknown: Vec<&str> = ids
        .iter()
        .filter(|id| !world.instances.contains_key(*id))
        .map(String::as_str)
        .collect();
    match unknown.as_slice() {
        [] => Ok(()),
        [one] => Err(ApiError::bad(
            "InvalidInstanceID.NotFound",
            format!("The instance ID '{one}' does not exist"),
        )),
        many => Err(ApiError::bad(
            "InvalidInstanceID.NotFound",
            format!("The instance IDs '{}' do not exist", many.join(", ")),
        )),
    }
}

fn terminate_instances(shared: &Arc<Shared>, p: &Params, x: &mut Xml) -> Result<(), ApiError> {
    let ids = p.list("InstanceId");
    if ids.is_empty() {
        return Err(ApiError::missing("InstanceId"));
    }
    known_ids(&shared.world(), &ids)?;
    x.open("instancesSet");
    for id in &ids {
        let (prev, cur) = shared
            .begin_terminate(id)
            .map_err(|e| ApiError::bad("InvalidInstanceID.NotFound", e.to_string()))?;
        x.open("item")
            .leaf("instanceId", id)
            .open("currentState")
            .leaf("code", cur.code().to_string())
            .leaf("name", cur.name())
            .close("currentState")
            .open("previousState")
            .leaf("code", prev.code().to_string())
            .leaf("name", prev.name())
            .close("previousState")
            .close("item");
    }
    x.close("instancesSet");
    Ok(())
}

/// A DescribeInstances filter the simulator understands.
enum Filter {
    State(Vec<String>),
    Id(Vec<String>),
    Type(Vec<String>),
    Zone(Vec<String>),
    Subnet(Vec<String>),
    DnsName(Vec<String>),
    TagKey(Vec<String>),
    Tag(String, Vec<String>),
}

fn parse_filters(p: &Params) -> Result<Vec<Filter>, ApiError> {
    p.structs("Filter")
        .into_iter()
        .map(|f| {
            let name = f.get("Name").ok_or_else(|| ApiError::missing("Filter.Name"))?;
            let values = f.list("Value");
            Ok(match name {
                "instance-state-name" => Filter::State(values),
                "instance-id" => Filter::Id(values),
                "instance-type" => Filter::Type(values),
                "availability-zone" => Filter::Zone(values),
                "subnet-id" => Filter::Subnet(values),
                "private-dns-name" => Filter::DnsName(values),
                "tag-key" => Filter::TagKey(values),
                n if n.starts_with("tag:") => Filter::Tag(n["tag:".len()..].to_string(), values),
                other => {
                    return Err(ApiError::bad(
                        "InvalidParameterValue",
                        format!("The filter '{other}' is invalid (the simulator supports instance-state-name, instance-id, instance-type, availability-zone, subnet-id, private-dns-name, tag-key, tag:<key>)"),
                    ));
                }
            })
        })
        .collect()
}

/// EC2 filter values accept `*` and `?` wildcards.
pub(super) fn value_matches(patterns: &[String], value: &str) -> bool {
    patterns.iter().any(|pat| {
        if !pat.contains(['*', '?']) {
            return pat == value;
        }
        let re = format!(
            "^{}$",
            regex::escape(pat).replace(r"\*", ".*").replace(r"\?", ".")
        );
        regex::Regex::new(&re).is_ok_and(|r| r.is_match(value))
    })
}

fn filter_matches(f: &Filter, inst: &Instance) -> bool {
    let i = &inst.info;
    match f {
        Filter::State(v) => value_matches(v, inst.state.name()),
        Filter::Id(v) => value_matches(v, &i.id),
        Filter::Type(v) => value_matches(v, &i.instance_type),
        Filter::Zone(v) => value_matches(v, &i.zone),
        Filter::Subnet(v) => value_matches(v, &i.subnet_id),
        Filter::DnsName(v) => value_matches(v, &i.private_dns_name),
        Filter::TagKey(v) => i.tags.keys().any(|k| value_matches(v, k)),
        Filter::Tag(key, v) => i.tags.get(key).is_some_and(|val| value_matches(v, val)),
    }
}

fn describe_instances(shared: &Arc<Shared>, p: &Params, x: &mut Xml) -> Result<(), ApiError> {
    let ids = p.list("InstanceId");
    let filters = parse_filters(p)?;
    let world = shared.world();
    known_ids(&world, &ids)?;
    // Group matches by reservation, keeping launch order.
    let mut reservations: Vec<(String, Vec<&Instance>)> = Vec::new();
    for inst in world.ordered() {
        if !ids.is_empty() && !ids.contains(&inst.info.id) {
            continue;
        }
        if !filters.iter().all(|f| filter_matches(f, inst)) {
            continue;
        }
        match reservations
            .iter_mut()
            .find(|(r, _)| *r == inst.reservation_id)
        {
            Some((_, list)) => list.push(inst),
            None => reservations.push((inst.reservation_id.clone(), vec![inst])),
        }
    }
    x.open("reservationSet");
    for (rid, insts) in reservations {
        x.open("item")
            .leaf("reservationId", &rid)
            .leaf("ownerId", &shared.config.account_id)
            .open("groupSet")
            .close("groupSet")
            .open("instancesSet");
        for inst in insts {
            write_instance(&world, inst, x);
        }
        x.close("instancesSet").close("item");
    }
    x.close("reservationSet");
    Ok(())
}

/// The attribute names DescribeInstanceAttribute accepts (EC2 API reference, `Attribute`).
const INSTANCE_ATTRIBUTES: &[&str] = &[
    "instanceType",
    "kernel",
    "ramdisk",
    "userData",
    "disableApiTermination",
    "instanceInitiatedShutdownBehavior",
    "rootDeviceName",
    "blockDeviceMapping",
    "productCodes",
    "sourceDestCheck",
    "groupSet",
    "ebsOptimized",
    "sriovNetSupport",
    "enaSupport",
    "enclaveOptions",
    "disableApiStop",
];

/// DescribeInstanceAttribute for `userData` (base64, as EC2 returns it; an empty `<userData/>` for an
/// instance launched without), `instanceType` and `groupSet`, in the response shape of the EC2 API
/// reference (`<instanceId>` then the attribute's element, a `<value>` inside for single values).
fn describe_instance_attribute(
    shared: &Arc<Shared>,
    p: &Params,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let id = p
        .get("InstanceId")
        .ok_or_else(|| ApiError::missing("InstanceId"))?;
    let attribute = p
        .get("Attribute")
        .ok_or_else(|| ApiError::missing("Attribute"))?;
    if !INSTANCE_ATTRIBUTES.contains(&attribute) {
        return Err(ApiError::bad(
            "InvalidParameterValue",
            format!("Value ({attribute}) for parameter attribute is invalid. Unknown attribute."),
        ));
    }
    let world = shared.world();
    known_ids(&world, &[id.to_string()])?;
    let Some(inst) = world.instances.get(id) else {
        return Err(ApiError::bad(
            "InvalidInstanceID.NotFound",
            format!("The instance ID '{id}' does not exist"),
        ));
    };
    x.leaf("instanceId", id);
    match attribute {
        "userData" => {
            x.open("userData");
            if let Some(raw) = &inst.raw_user_data {
                x.leaf(
                    "value",
                    base64::engine::general_purpose::STANDARD.encode(raw),
                );
            }
            x.close("userData");
        }
        "instanceType" => {
            x.open("instanceType")
                .leaf("value", &inst.info.instance_type)
                .close("instanceType");
        }
        "groupSet" => {
            x.open("groupSet");
            for g in &inst.info.security_group_ids {
                x.open("item").leaf("groupId", g).close("item");
            }
            x.close("groupSet");
        }
        other => {
            return Err(ApiError::bad(
                "UnsupportedOperation",
                format!(
                    "the simulator answers DescribeInstanceAttribute for userData, instanceType and groupSet, not {other}"
                ),
            ));
        }
    }
    Ok(())
}

fn create_tags(shared: &Arc<Shared>, p: &Params, x: &mut Xml) -> Result<(), ApiError> {
    let resources = p.list("ResourceId");
    if resources.is_empty() {
        return Err(ApiError::missing("ResourceId"));
    }
    let tags = tag_list(p, "Tag")?;
    let mut world = shared.world();
    let (instances, templates): (Vec<String>, Vec<String>) =
        resources.into_iter().partition(|r| !r.starts_with("lt-"));
    known_ids(&world, &instances)?;
    for t in &templates {
        if !world.templates.contains_key(t) {
            return Err(ApiError::bad(
                "InvalidLaunchTemplateId.NotFound",
                format!("The specified launch template, with template ID {t}, does not exist."),
            ));
        }
    }
    for id in &instances {
        if let Some(inst) = world.instances.get_mut(id) {
            inst.info.tags.extend(tags.clone());
        }
    }
    for t in &templates {
        if let Some(lt) = world.templates.get_mut(t) {
            lt.tags.extend(tags.clone());
        }
    }
    x.leaf("return", "true");
    Ok(())
}

/// DescribeSubnets by `SubnetId.N` (all when none): id, zone, VPC.
fn describe_subnets(shared: &Arc<Shared>, p: &Params, x: &mut Xml) -> Result<(), ApiError> {
    let ids = p.list("SubnetId");
    let subnets = &shared.config.subnets;
    for id in &ids {
        if !subnets.iter().any(|s| &s.id == id) {
            return Err(ApiError::bad(
                "InvalidSubnetID.NotFound",
                format!("The subnet ID '{id}' does not exist"),
            ));
        }
    }
    x.open("subnetSet");
    for s in subnets
        .iter()
        .filter(|s| ids.is_empty() || ids.contains(&s.id))
    {
        x.open("item")
            .leaf("subnetId", &s.id)
            .leaf("state", "available")
            .leaf("vpcId", "vpc-0sim0000000000000")
            .leaf("availabilityZone", &s.zone)
            .close("item");
    }
    x.close("subnetSet");
    Ok(())
}
