//! Launch templates and their versions: CreateLaunchTemplate, CreateLaunchTemplateVersion,
//! DescribeLaunchTemplates, DescribeLaunchTemplateVersions, DeleteLaunchTemplate, and how a launch
//! names a version.
//!
//! EC2 API reference: CreateLaunchTemplate makes version 1, which is the default;
//! CreateLaunchTemplateVersion adds the next number, its data inheriting the `SourceVersion`'s except
//! for what the request sets; a launch (`LaunchTemplateSpecification.Version`) and
//! DescribeLaunchTemplateVersions (`LaunchTemplateVersion.N`) name a version by number, `$Latest` or
//! `$Default`. Launch parameters are not validated when a template or version is created (EC2 user
//! guide, "Launch templates", as hashicorp/terraform-provider-aws issue 13352 quotes it): an AMI the
//! account does not have is refused only by the launch. Errors as EC2 sends them:
//! `InvalidLaunchTemplateName.NotFoundException`, "The specified launch template, with template name
//! timski, does not exist." (DescribeLaunchTemplateVersions, quoted from EC2 in getmoto/moto pull 5477);
//! `InvalidLaunchTemplateId.VersionNotFound`, "Could not find the specified version 1 for the launch
//! template with ID lt-0f3e2efa769a315f6." (DescribeLaunchTemplateVersions, eksctl-io/eksctl issue
//! 7786).

use std::sync::Arc;

use super::Shared;
use super::actions::{
    ApiError, check_image, check_instance_type, decode_user_data, launch_security, subnet_for,
    tag_specs, write_tags,
};
use super::params::Params;
use super::state::{self, LaunchTemplate, TemplateData, TemplateVersion, World};
use super::xml::Xml;

fn now() -> jiff::Timestamp {
    jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .unwrap_or_else(|_| jiff::Timestamp::now())
}

/// The template a request names by `LaunchTemplateId` (preferred) or `LaunchTemplateName`.
pub(super) fn named<'w>(
    world: &'w World,
    id: Option<&str>,
    name: Option<&str>,
) -> Result<&'w LaunchTemplate, ApiError> {
    match (id, name) {
        (Some(id), _) => world.templates.get(id).ok_or_else(|| {
            ApiError::bad(
                "InvalidLaunchTemplateId.NotFound",
                format!("The specified launch template, with template ID {id}, does not exist."),
            )
        }),
        (None, Some(name)) => world.template_by_name(name).ok_or_else(|| {
            ApiError::bad(
                "InvalidLaunchTemplateName.NotFoundException",
                format!(
                    "The specified launch template, with template name {name}, does not exist."
                ),
            )
        }),
        (None, None) => Err(ApiError::missing("LaunchTemplateId or LaunchTemplateName")),
    }
}

/// The version `version` (a number, `$Latest` or `$Default`) of `t`: its number and parameters.
pub(super) fn version<'t>(
    t: &'t LaunchTemplate,
    version: &str,
) -> Result<(u32, &'t TemplateData), ApiError> {
    t.resolve(version)
        .and_then(|n| Some((n, t.data(n)?)))
        .ok_or_else(|| {
            ApiError::bad(
                "InvalidLaunchTemplateId.VersionNotFound",
                format!(
                    "Could not find the specified version {version} for the launch template with ID {}.",
                    t.id
                ),
            )
        })
}

/// `LaunchTemplateData.*` over `base` (a new template: nothing; a new version: its source version).
fn template_data(
    shared: &Shared,
    d: &Params,
    base: &TemplateData,
) -> Result<TemplateData, ApiError> {
    if let Some(u) = d.get("UserData") {
        decode_user_data(u)?;
    }
    if let Some(i) = d.get("ImageId") {
        check_image(i)?;
    }
    if let Some(t) = d.get("InstanceType") {
        check_instance_type(t)?;
    }
    let subnet_id = d.get("NetworkInterface.1.SubnetId").map(str::to_string);
    if let Some(s) = &subnet_id {
        subnet_for(shared, Some(s), None)?;
    }
    let instance_tags = tag_specs(d, "TagSpecification", "instance")?;
    let instance_requirements = instance_requirements(d)?;
    Ok(TemplateData {
        image_id: d
            .get("ImageId")
            .map(str::to_string)
            .or_else(|| base.image_id.clone()),
        instance_type: d
            .get("InstanceType")
            .map(str::to_string)
            .or_else(|| base.instance_type.clone()),
        subnet_id: subnet_id.or_else(|| base.subnet_id.clone()),
        user_data: d
            .get("UserData")
            .map(str::to_string)
            .or_else(|| base.user_data.clone()),
        instance_tags: if instance_tags.is_empty() {
            base.instance_tags.clone()
        } else {
            instance_tags
        },
        spot: match d.get("InstanceMarketOptions.MarketType") {
            Some(m) => m == "spot",
            None => base.spot,
        },
        launch: launch_security(shared, d)?.over(&base.launch),
        instance_requirements: instance_requirements.or(base.instance_requirements),
    })
}

/// `InstanceRequirements.VCpuCount.Min` and `.MemoryMiB.Min` (both required when either attribute is
/// given; EC2 API reference, `InstanceRequirementsRequest`). The other attributes are not kept.
fn instance_requirements(d: &Params) -> Result<Option<(u32, u32)>, ApiError> {
    let given = |k: &str| d.get(&format!("InstanceRequirements.{k}"));
    let (vcpu, memory) = (given("VCpuCount.Min"), given("MemoryMiB.Min"));
    if vcpu.is_none() && memory.is_none() {
        return Ok(None);
    }
    let number = |v: Option<&str>, name: &str| {
        v.and_then(|v| v.parse::<u32>().ok()).ok_or_else(|| {
            ApiError::bad(
                "InvalidParameterValue",
                format!("InstanceRequirements needs {name}.Min as a whole number"),
            )
        })
    };
    Ok(Some((
        number(vcpu, "VCpuCount")?,
        number(memory, "MemoryMiB")?,
    )))
}

pub(super) fn create_launch_template(
    shared: &Arc<Shared>,
    p: &Params,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let name = p
        .get("LaunchTemplateName")
        .ok_or_else(|| ApiError::missing("LaunchTemplateName"))?;
    let name_ok = (3..=128).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "().-/_".contains(c));
    if !name_ok {
        return Err(ApiError::bad(
            "InvalidLaunchTemplateName.MalformedException",
            format!(
                "Launch template name '{name}' is malformed: use 3-128 characters from letters, digits and ().-/_"
            ),
        ));
    }
    let data = template_data(
        shared,
        &p.nested("LaunchTemplateData"),
        &TemplateData::default(),
    )?;
    let tags = tag_specs(p, "TagSpecification", "launch-template")?;
    let mut world = shared.world();
    if world.template_by_name(name).is_some() {
        return Err(ApiError::bad(
            "InvalidLaunchTemplateName.AlreadyExistsException",
            format!("Launch template name already in use: {name}"),
        ));
    }
    let created = now();
    let t = LaunchTemplate {
        id: state::random_id("lt-"),
        name: name.to_string(),
        created,
        versions: vec![TemplateVersion {
            created,
            description: p.get("VersionDescription").map(str::to_string),
            data,
        }],
        default_version: 1,
        tags,
    };
    write_template("launchTemplate", shared, &t, x);
    world.templates.insert(t.id.clone(), t);
    Ok(())
}

/// CreateLaunchTemplateVersion: the next version of the template named by id or name, from
/// `SourceVersion`'s data (when given) with `LaunchTemplateData` over it. The default version stays.
pub(super) fn create_launch_template_version(
    shared: &Arc<Shared>,
    p: &Params,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let mut world = shared.world();
    let (id, base) = {
        let t = named(
            &world,
            p.get("LaunchTemplateId"),
            p.get("LaunchTemplateName"),
        )?;
        let base = match p.get("SourceVersion") {
            Some(v) => version(t, v)?.1.clone(),
            None => TemplateData::default(),
        };
        (t.id.clone(), base)
    };
    let data = template_data(shared, &p.nested("LaunchTemplateData"), &base)?;
    let t = world.templates.get_mut(&id).ok_or_else(|| {
        ApiError::new(
            500,
            "InternalError",
            "the launch template went away while its version was made",
        )
    })?;
    t.versions.push(TemplateVersion {
        created: now(),
        description: p.get("VersionDescription").map(str::to_string),
        data,
    });
    let n = t.latest_version();
    write_version("launchTemplateVersion", shared, t, n, x);
    Ok(())
}

pub(super) fn write_template(tag: &str, shared: &Shared, t: &LaunchTemplate, x: &mut Xml) {
    x.open(tag)
        .leaf("launchTemplateId", &t.id)
        .leaf("launchTemplateName", &t.name)
        .leaf("createTime", t.created.to_string())
        .leaf(
            "createdBy",
            format!("arn:aws:iam::{}:root", shared.config.account_id),
        )
        .leaf("defaultVersionNumber", t.default_version.to_string())
        .leaf("latestVersionNumber", t.latest_version().to_string());
    write_tags(&t.tags, x);
    x.close(tag);
}

/// One version as DescribeLaunchTemplateVersions and CreateLaunchTemplateVersion answer it
/// (`LaunchTemplateVersion`, its `launchTemplateData` a `ResponseLaunchTemplateData`).
fn write_version(tag: &str, shared: &Shared, t: &LaunchTemplate, n: u32, x: &mut Xml) {
    let Some(v) = usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| t.versions.get(i))
    else {
        return;
    };
    x.open(tag)
        .leaf("launchTemplateId", &t.id)
        .leaf("launchTemplateName", &t.name)
        .leaf("versionNumber", n.to_string())
        .opt("versionDescription", v.description.as_deref())
        .leaf("createTime", v.created.to_string())
        .leaf(
            "createdBy",
            format!("arn:aws:iam::{}:root", shared.config.account_id),
        )
        .leaf("defaultVersion", (n == t.default_version).to_string())
        .open("launchTemplateData");
    let d = &v.data;
    x.opt("imageId", d.image_id.as_deref())
        .opt("instanceType", d.instance_type.as_deref())
        .opt("userData", d.user_data.as_deref());
    if let Some(arn) = &d.launch.instance_profile {
        x.open("iamInstanceProfile")
            .leaf("arn", arn)
            .close("iamInstanceProfile");
    }
    if !d.launch.security_group_ids.is_empty() {
        x.open("securityGroupIdSet");
        for g in &d.launch.security_group_ids {
            x.leaf("item", g);
        }
        x.close("securityGroupIdSet");
    }
    if let Some(s) = &d.subnet_id {
        x.open("networkInterfaceSet")
            .open("item")
            .leaf("deviceIndex", "0")
            .leaf("subnetId", s)
            .close("item")
            .close("networkInterfaceSet");
    }
    if d.launch.http_tokens.is_some() || d.launch.hop_limit.is_some() {
        x.open("metadataOptions")
            .opt("httpTokens", d.launch.http_tokens.as_deref())
            .opt(
                "httpPutResponseHopLimit",
                d.launch.hop_limit.map(|h| h.to_string()),
            )
            .close("metadataOptions");
    }
    if let Some((vcpu, memory)) = d.instance_requirements {
        x.open("instanceRequirements")
            .open("vCpuCount")
            .leaf("min", vcpu.to_string())
            .close("vCpuCount")
            .open("memoryMiB")
            .leaf("min", memory.to_string())
            .close("memoryMiB")
            .close("instanceRequirements");
    }
    if d.spot {
        x.open("instanceMarketOptions")
            .leaf("marketType", "spot")
            .close("instanceMarketOptions");
    }
    x.close("launchTemplateData").close(tag);
}

/// DescribeLaunchTemplateVersions of one template, by `LaunchTemplateId` or `LaunchTemplateName`:
/// the versions `LaunchTemplateVersion.N` names (numbers, `$Latest`, `$Default`), else every version.
/// Without a template EC2 describes the `$Latest` or `$Default` version of every template; the
/// simulator refuses that, and `MinVersion`, `MaxVersion` and `Filter.N`, naming what it answers.
pub(super) fn describe_launch_template_versions(
    shared: &Arc<Shared>,
    p: &Params,
    x: &mut Xml,
) -> Result<(), ApiError> {
    for unsupported in ["MinVersion", "MaxVersion", "Filter.1.Name"] {
        if p.get(unsupported).is_some() {
            return Err(ApiError::bad(
                "InvalidParameterValue",
                format!(
                    "{unsupported} is not supported by the simulator: name the template (LaunchTemplateId or LaunchTemplateName) and its versions (LaunchTemplateVersion.N)"
                ),
            ));
        }
    }
    if p.get("LaunchTemplateId").is_none() && p.get("LaunchTemplateName").is_none() {
        return Err(ApiError::missing(
            "LaunchTemplateId or LaunchTemplateName (the simulator describes the versions of one template)",
        ));
    }
    let world = shared.world();
    let t = named(
        &world,
        p.get("LaunchTemplateId"),
        p.get("LaunchTemplateName"),
    )?;
    let asked = p.list("LaunchTemplateVersion");
    let mut numbers: Vec<u32> = if asked.is_empty() {
        (1..=t.latest_version()).collect()
    } else {
        asked
            .iter()
            .map(|v| version(t, v).map(|(n, _)| n))
            .collect::<Result<_, _>>()?
    };
    numbers.sort_unstable();
    numbers.dedup();
    x.open("launchTemplateVersionSet");
    for n in numbers {
        write_version("item", shared, t, n, x);
    }
    x.close("launchTemplateVersionSet");
    Ok(())
}

pub(super) fn describe_launch_templates(
    shared: &Arc<Shared>,
    p: &Params,
    x: &mut Xml,
) -> Result<(), ApiError> {
    if let Some(f) = p.structs("Filter").first() {
        return Err(ApiError::bad(
            "InvalidParameterValue",
            format!(
                "The filter '{}' is invalid (the simulator supports LaunchTemplateId and LaunchTemplateName only)",
                f.get("Name").unwrap_or_default()
            ),
        ));
    }
    let ids = p.list("LaunchTemplateId");
    let names = p.list("LaunchTemplateName");
    let world = shared.world();
    let mut selected: Vec<&LaunchTemplate> = Vec::new();
    for id in &ids {
        selected.push(named(&world, Some(id), None)?);
    }
    for name in &names {
        selected.push(named(&world, None, Some(name))?);
    }
    if ids.is_empty() && names.is_empty() {
        selected.extend(world.templates.values());
    }
    x.open("launchTemplates");
    for t in selected {
        write_template("item", shared, t, x);
    }
    x.close("launchTemplates");
    Ok(())
}

/// DeleteLaunchTemplate by `LaunchTemplateId` or `LaunchTemplateName`, with every version.
pub(super) fn delete_launch_template(
    shared: &Arc<Shared>,
    p: &Params,
    x: &mut Xml,
) -> Result<(), ApiError> {
    let mut world = shared.world();
    // Not a launch's template lookup: a top-level `Version` is the API version here, not a
    // template version.
    let id = named(
        &world,
        p.get("LaunchTemplateId"),
        p.get("LaunchTemplateName"),
    )?
    .id
    .clone();
    let Some(t) = world.templates.remove(&id) else {
        return Err(ApiError::bad(
            "InvalidLaunchTemplateId.NotFound",
            format!("The specified launch template, with template ID {id}, does not exist."),
        ));
    };
    write_template("launchTemplate", shared, &t, x);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn template(images: &[&str]) -> LaunchTemplate {
        LaunchTemplate {
            id: "lt-0123456789abcdef0".into(),
            name: "workers".into(),
            created: jiff::Timestamp::UNIX_EPOCH,
            versions: images
                .iter()
                .map(|i| TemplateVersion {
                    created: jiff::Timestamp::UNIX_EPOCH,
                    description: None,
                    data: TemplateData {
                        image_id: Some(i.to_string()),
                        ..Default::default()
                    },
                })
                .collect(),
            default_version: 1,
            tags: BTreeMap::new(),
        }
    }

    #[test]
    fn a_version_is_a_number_latest_or_default() {
        let t = template(&["ami-1", "ami-2", "ami-3"]);
        let image = |v: &str| version(&t, v).map(|(n, d)| (n, d.image_id.clone()));
        assert_eq!(image("$Default"), Ok((1, Some("ami-1".into()))));
        assert_eq!(image("$Latest"), Ok((3, Some("ami-3".into()))));
        assert_eq!(image("2"), Ok((2, Some("ami-2".into()))));
        for missing in ["0", "4", "latest", "-1"] {
            let e = image(missing).expect_err(missing);
            assert_eq!(
                e.code, "InvalidLaunchTemplateId.VersionNotFound",
                "{missing}"
            );
            assert_eq!(
                e.message,
                format!(
                    "Could not find the specified version {missing} for the launch template with ID lt-0123456789abcdef0."
                )
            );
        }
    }
}
