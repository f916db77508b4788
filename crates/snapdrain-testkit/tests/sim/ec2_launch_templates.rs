//! The EC2 simulator's AMI catalogue and launch template versions through the real aws-sdk-ec2.
//!
//! A launch with an AMI the account does not have is refused as EC2 refuses it: RunInstances with
//! `InvalidAMIID.NotFound`, "The image id '[ami-26fc345b]' does not exist" (quoted from EC2 in
//! ambrosejcarr/seqc issue 324 and amplab/training issue 157), a malformed id with
//! `InvalidAMIID.Malformed`, `Invalid id: "{var.ami_id}" (expecting "ami-...")` (hashicorp/terraform
//! issue 22172); CreateFleet in the override's errorSet entry (EC2 API reference, CreateFleet "Errors").
//! A launch template is not validated when it is made (EC2 user guide, "Launch templates", as
//! hashicorp/terraform-provider-aws issue 13352 quotes it). Versions: CreateLaunchTemplateVersion adds
//! the next number, inheriting `SourceVersion`'s data; DescribeLaunchTemplateVersions and launches name a
//! version by number, `$Latest` or `$Default` (EC2 API reference); an unknown template is
//! `InvalidLaunchTemplateName.NotFoundException` (getmoto/moto pull 5477 quotes EC2) or
//! `InvalidLaunchTemplateId.NotFound`, an unknown version `InvalidLaunchTemplateId.VersionNotFound`,
//! "Could not find the specified version 1 for the launch template with ID lt-..." (eksctl-io/eksctl
//! issue 7786).

use std::collections::BTreeMap;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{InstanceType, LaunchTemplateSpecification, RequestLaunchTemplateData};
use snapdrain::cloud::ec2::{
    CapacityType, CloudError, Ec2Cloud, FleetOverride, JoinSettings, LaunchRequest, LaunchStrategy,
    LaunchTemplateRef, TemplateVersion,
};
use snapdrain_sim::ec2::images::{BOTTLEROCKET_ARM64, BOTTLEROCKET_X86_64};
use snapdrain_sim::ec2::{Ec2Sim, Ec2SimConfig, ImageConfig};

/// Well formed, and not in the simulated account.
const UNKNOWN_AMI: &str = "ami-0123456789abcdef0";

async fn start() -> (Ec2Sim, Ec2Cloud) {
    let sim = Ec2Sim::start(Ec2SimConfig::default())
        .await
        .expect("the simulator binds 127.0.0.1");
    let cloud = Ec2Cloud::with_endpoint(&sim.endpoint(), "us-west-2", Some(("test", "test"))).await;
    (sim, cloud)
}

fn data(image: &str, t: Option<InstanceType>) -> RequestLaunchTemplateData {
    RequestLaunchTemplateData::builder()
        .image_id(image)
        .set_instance_type(t)
        .build()
}

#[tokio::test]
async fn run_instances_refuses_an_ami_the_account_does_not_have() {
    let (sim, cloud) = start().await;
    let run = |image: &str| {
        cloud
            .client()
            .run_instances()
            .image_id(image)
            .instance_type(InstanceType::M6iLarge)
            .min_count(1)
            .max_count(1)
            .subnet_id(sim.config().subnets[0].id.clone())
            .send()
    };
    let err = run(UNKNOWN_AMI).await.expect_err("an unknown AMI");
    assert_eq!(err.code(), Some("InvalidAMIID.NotFound"));
    assert_eq!(
        err.message(),
        Some("The image id '[ami-0123456789abcdef0]' does not exist")
    );
    let err = run("bottlerocket-1.42").await.expect_err("not an AMI id");
    assert_eq!(err.code(), Some("InvalidAMIID.Malformed"));
    assert_eq!(
        err.message(),
        Some("Invalid id: \"bottlerocket-1.42\" (expecting \"ami-...\")")
    );
    assert!(sim.instances().is_empty(), "nothing was launched");

    // A template is not validated when made; the launch from it is.
    cloud
        .client()
        .create_launch_template()
        .launch_template_name("stale")
        .launch_template_data(data(UNKNOWN_AMI, Some(InstanceType::M6iLarge)))
        .send()
        .await
        .expect("EC2 does not check a template's AMI when it is made");
    let err = cloud
        .client()
        .run_instances()
        .launch_template(
            LaunchTemplateSpecification::builder()
                .launch_template_name("stale")
                .build(),
        )
        .min_count(1)
        .max_count(1)
        .send()
        .await
        .expect_err("the template's AMI does not exist");
    assert_eq!(err.code(), Some("InvalidAMIID.NotFound"));
    assert!(sim.instances().is_empty(), "nothing was launched");

    // Once the account has the image (shared with it, say), the same launch runs.
    sim.register_image(ImageConfig::bottlerocket(
        UNKNOWN_AMI,
        "1.35",
        "x86_64",
        "1.43.0",
    ));
    run(UNKNOWN_AMI).await.expect("a known AMI launches");
}

#[tokio::test]
async fn create_fleet_answers_an_unknown_ami_in_each_overrides_error_set() {
    let (sim, cloud) = start().await;
    let subnet = sim.config().subnets[0].id.clone();
    let err = cloud
        .launch_with_report(LaunchRequest {
            strategy: LaunchStrategy::Fleet {
                overrides: ["m6i.large", "m6i.xlarge"]
                    .iter()
                    .map(|t| FleetOverride {
                        instance_type: t.to_string(),
                        subnet_id: subnet.clone(),
                    })
                    .collect(),
                capacity_type: CapacityType::OnDemand,
                launch_template: None,
            },
            image_id: Some(UNKNOWN_AMI.into()),
            user_data: None,
            tags: BTreeMap::from([("snapdrain.io/replaces".into(), "node-1".into())]),
            join: JoinSettings::default(),
            client_token: "unknown-ami-1".into(),
        })
        .await
        .expect_err("no override can launch an unknown AMI");
    match &err {
        CloudError::NoCapacity { failures } => {
            let got: Vec<_> = failures
                .iter()
                .map(|f| {
                    (
                        f.instance_type.as_deref(),
                        f.code.as_str(),
                        f.message.as_str(),
                    )
                })
                .collect();
            let message = "The image id '[ami-0123456789abcdef0]' does not exist";
            assert_eq!(
                got,
                [
                    (Some("m6i.large"), "InvalidAMIID.NotFound", message),
                    (Some("m6i.xlarge"), "InvalidAMIID.NotFound", message),
                ]
            );
        }
        other => panic!("expected every override refused, got {other:?}"),
    }
    assert!(!err.is_capacity(), "no capacity wait brings the AMI");
    assert!(err.is_permanent());
    assert!(sim.instances().is_empty(), "nothing was launched");
}

/// The version of a template as a launch names it (by name or id; a number, `$Latest`, `$Default`).
async fn version_of(
    cloud: &Ec2Cloud,
    id_or_name: &str,
    version: &str,
) -> Result<TemplateVersion, CloudError> {
    cloud
        .launch_template_version(&LaunchTemplateRef {
            id_or_name: id_or_name.into(),
            version: version.into(),
        })
        .await
}

#[tokio::test]
async fn launch_template_versions_are_described_and_launched_as_named() {
    let (sim, cloud) = start().await;
    let sdk = cloud.client();
    let made = sdk
        .create_launch_template()
        .launch_template_name("workers")
        .launch_template_data(data(BOTTLEROCKET_X86_64, Some(InstanceType::M6iLarge)))
        .send()
        .await
        .expect("version 1");
    let id = made
        .launch_template()
        .and_then(|t| t.launch_template_id())
        .expect("CreateLaunchTemplate answers the template's id")
        .to_string();
    // Version 2: version 1 with an arm64 AMI (its instance type inherited); version 3: an AMI alone.
    let v2 = sdk
        .create_launch_template_version()
        .launch_template_name("workers")
        .source_version("1")
        .version_description("arm64")
        .launch_template_data(data(BOTTLEROCKET_ARM64, None))
        .send()
        .await
        .expect("version 2");
    assert_eq!(
        v2.launch_template_version()
            .and_then(|v| v.version_number()),
        Some(2)
    );
    sdk.create_launch_template_version()
        .launch_template_id(&id)
        .launch_template_data(data(BOTTLEROCKET_X86_64, None))
        .send()
        .await
        .expect("version 3");

    let listed = sdk
        .describe_launch_templates()
        .launch_template_ids(&id)
        .send()
        .await
        .expect("described");
    let t = &listed.launch_templates()[0];
    assert_eq!(
        (t.default_version_number(), t.latest_version_number()),
        (Some(1), Some(3))
    );

    let all = sdk
        .describe_launch_template_versions()
        .launch_template_name("workers")
        .send()
        .await
        .expect("every version");
    let versions: Vec<_> = all
        .launch_template_versions()
        .iter()
        .map(|v| {
            let d = v.launch_template_data();
            (
                v.version_number(),
                v.default_version(),
                d.and_then(|d| d.image_id()),
                d.and_then(|d| d.instance_type()).map(|t| t.as_str()),
            )
        })
        .collect();
    assert_eq!(
        versions,
        [
            (
                Some(1),
                Some(true),
                Some(BOTTLEROCKET_X86_64),
                Some("m6i.large")
            ),
            (
                Some(2),
                Some(false),
                Some(BOTTLEROCKET_ARM64),
                Some("m6i.large")
            ),
            (Some(3), Some(false), Some(BOTTLEROCKET_X86_64), None),
        ]
    );

    // As a launch names them, by name or id.
    let want = |n: i64, image: &str, t: Option<&str>| TemplateVersion {
        template_id: Some(id.clone()),
        version_number: Some(n),
        image_id: Some(image.into()),
        instance_type: t.map(str::to_string),
        instance_requirements: false,
    };
    assert_eq!(
        version_of(&cloud, "workers", "$Default")
            .await
            .expect("$Default"),
        want(1, BOTTLEROCKET_X86_64, Some("m6i.large"))
    );
    assert_eq!(
        version_of(&cloud, &id, "$Latest").await.expect("$Latest"),
        want(3, BOTTLEROCKET_X86_64, None)
    );
    assert_eq!(
        version_of(&cloud, "workers", "2").await.expect("2"),
        want(2, BOTTLEROCKET_ARM64, Some("m6i.large"))
    );

    // What does not exist, each a permanent error naming it.
    let refused = [
        (
            version_of(&cloud, "no-such-template", "$Default").await,
            "InvalidLaunchTemplateName.NotFoundException",
            "The specified launch template, with template name no-such-template, does not exist.",
        ),
        (
            version_of(&cloud, "lt-0000000000000dead", "$Default").await,
            "InvalidLaunchTemplateId.NotFound",
            "The specified launch template, with template ID lt-0000000000000dead, does not exist.",
        ),
        (
            version_of(&cloud, "workers", "7").await,
            "InvalidLaunchTemplateId.VersionNotFound",
            &format!(
                "Could not find the specified version 7 for the launch template with ID {id}."
            ),
        ),
    ];
    for (got, code, message) in refused {
        let e = got.expect_err(code);
        assert_eq!(e.code(), Some(code), "{e}");
        assert!(e.is_permanent(), "{e}");
        assert!(e.to_string().ends_with(message), "{e}");
    }

    // A launch uses the version it names: version 2's arm64 AMI cannot run on its m6i.large.
    let launch = |version: &str, token: &str| {
        sdk.run_instances()
            .launch_template(
                LaunchTemplateSpecification::builder()
                    .launch_template_name("workers")
                    .version(version)
                    .build(),
            )
            .instance_type(InstanceType::M6iLarge)
            .min_count(1)
            .max_count(1)
            .client_token(token)
            .send()
    };
    let err = launch("2", "v2").await.expect_err("arm64 AMI on x86_64");
    assert_eq!(err.code(), Some("InvalidParameterValue"));
    let out = launch("$Latest", "latest").await.expect("version 3 runs");
    let launched = sim
        .instance(out.instances()[0].instance_id().expect("an instance id"))
        .expect("the simulator knows what it launched");
    assert_eq!(launched.info.image_id, BOTTLEROCKET_X86_64);
    assert_eq!(launched.info.tags["aws:ec2launchtemplate:version"], "3");
}
