//! The EC2 simulator's AMI and instance-type architectures through the real aws-sdk-ec2: DescribeImages,
//! DescribeInstanceTypes, and launches whose instance type cannot run the AMI refused as EC2 refuses
//! them (RunInstances `InvalidParameterValue`, "The architecture 'arm64' of the specified instance type
//! does not match the architecture 'x86_64' of the specified AMI. ...", quoted from EC2 in
//! skypilot-org/skypilot issue 6315; CreateFleet: one errorSet entry per such override, EC2 API reference
//! CreateFleet "Errors").

use std::collections::BTreeMap;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{ArchitectureValues, InstanceType};
use snapdrain::cloud::ec2::{
    CapacityType, CloudError, Ec2Cloud, FleetOverride, JoinSettings, LaunchRequest, LaunchStrategy,
};
use snapdrain_sim::ec2::images::{BOTTLEROCKET_ARM64, BOTTLEROCKET_X86_64};
use snapdrain_sim::ec2::{Ec2Sim, Ec2SimConfig};

const REFUSAL: &str = "The architecture 'arm64' of the specified instance type does not match the architecture 'x86_64' of the specified AMI. Specify an instance type and an AMI that have matching architectures, and try again. You can use 'describe-instance-types' or 'describe-images' to discover the architecture of the instance type or AMI.";

async fn start() -> (Ec2Sim, Ec2Cloud) {
    let sim = Ec2Sim::start(Ec2SimConfig::default()).await.unwrap();
    let cloud = Ec2Cloud::with_endpoint(&sim.endpoint(), "us-west-2", Some(("test", "test"))).await;
    (sim, cloud)
}

#[tokio::test]
async fn run_instances_refuses_an_instance_type_that_cannot_run_the_ami() {
    let (sim, cloud) = start().await;
    let run = |image: &str, t: InstanceType| {
        cloud
            .client()
            .run_instances()
            .image_id(image)
            .instance_type(t)
            .min_count(1)
            .max_count(1)
            .subnet_id(sim.config().subnets[0].id.clone())
            .send()
    };
    let err = run(BOTTLEROCKET_X86_64, InstanceType::M6gLarge)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterValue"));
    assert_eq!(err.message(), Some(REFUSAL));
    let err = run(BOTTLEROCKET_ARM64, InstanceType::M6iLarge)
        .await
        .unwrap_err();
    assert!(
        err.message().is_some_and(|m| m.starts_with(
            "The architecture 'x86_64' of the specified instance type does not match the architecture 'arm64' of the specified AMI."
        )),
        "{err:?}"
    );
    assert!(sim.instances().is_empty(), "nothing was launched");
    run(BOTTLEROCKET_X86_64, InstanceType::M6iLarge)
        .await
        .expect("an x86_64 type runs the x86_64 AMI");
    let arm = run(BOTTLEROCKET_ARM64, InstanceType::M7gLarge)
        .await
        .expect("an arm64 type runs the arm64 AMI");
    assert_eq!(
        arm.instances()[0].architecture(),
        Some(&ArchitectureValues::Arm64),
        "the instance reports its AMI's architecture"
    );
}

fn fleet(sim: &Ec2Sim, types: &[&str], token: &str) -> LaunchRequest {
    LaunchRequest {
        strategy: LaunchStrategy::Fleet {
            overrides: types
                .iter()
                .map(|t| FleetOverride {
                    instance_type: t.to_string(),
                    subnet_id: sim.config().subnets[0].id.clone(),
                })
                .collect(),
            capacity_type: CapacityType::OnDemand,
            launch_template: None,
        },
        image_id: Some(BOTTLEROCKET_X86_64.into()),
        user_data: None,
        tags: BTreeMap::from([("snapdrain.io/replaces".into(), "node-1".into())]),
        join: JoinSettings::default(),
        client_token: token.into(),
    }
}

#[tokio::test]
async fn create_fleet_answers_each_mismatched_override_in_its_error_set() {
    let (sim, cloud) = start().await;
    let outcome = cloud
        .launch_with_report(fleet(&sim, &["m6g.large", "m6i.xlarge"], "arch-1"))
        .await
        .expect("one override fits");
    assert_eq!(outcome.instances.len(), 1);
    let launched = sim
        .instance(&outcome.instances[0].instance_id)
        .expect("launched");
    assert_eq!(launched.info.instance_type, "m6i.xlarge");
    let failures: Vec<_> = outcome
        .override_failures
        .iter()
        .map(|f| {
            (
                f.instance_type.as_deref(),
                f.code.as_str(),
                f.message.as_str(),
            )
        })
        .collect();
    assert_eq!(
        failures,
        [(Some("m6g.large"), "InvalidParameterValue", REFUSAL)]
    );

    let err = cloud
        .launch_with_report(fleet(&sim, &["m6g.large", "c7g.large"], "arch-2"))
        .await
        .expect_err("no override fits");
    match &err {
        CloudError::NoCapacity { failures } => {
            assert_eq!(failures.len(), 2, "{failures:?}");
            assert!(failures.iter().all(|f| f.code == "InvalidParameterValue"));
        }
        other => panic!("expected every override refused, got {other:?}"),
    }
    assert!(!err.is_capacity(), "no capacity wait fixes an architecture");
}

#[tokio::test]
async fn describe_images_and_instance_types_give_their_architectures() {
    let (_sim, cloud) = start().await;
    let images = cloud
        .client()
        .describe_images()
        .image_ids(BOTTLEROCKET_X86_64)
        .image_ids(BOTTLEROCKET_ARM64)
        .send()
        .await
        .unwrap();
    let archs: BTreeMap<&str, Option<&ArchitectureValues>> = images
        .images()
        .iter()
        .map(|i| (i.image_id().unwrap_or_default(), i.architecture()))
        .collect();
    assert_eq!(
        archs,
        BTreeMap::from([
            (BOTTLEROCKET_X86_64, Some(&ArchitectureValues::X8664)),
            (BOTTLEROCKET_ARM64, Some(&ArchitectureValues::Arm64)),
        ])
    );
    assert!(
        images.images()[0]
            .name()
            .is_some_and(|n| n.starts_with("bottlerocket-aws-k8s-1.35-")),
        "{images:?}"
    );
    let err = cloud
        .client()
        .describe_images()
        .image_ids("ami-0000000000000dead")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidAMIID.NotFound"));

    let types = cloud
        .instance_type_architectures(&["m6g.large".into(), "m5.large".into()])
        .await
        .unwrap();
    assert_eq!(
        types,
        BTreeMap::from([
            ("m5.large".to_string(), vec!["x86_64".to_string()]),
            ("m6g.large".to_string(), vec!["arm64".to_string()]),
        ])
    );
    let err = cloud
        .instance_type_architectures(&["m9z.large".into()])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidInstanceType"));
    assert!(err.is_permanent());
    assert!(
        err.to_string()
            .contains("The following supplied instance types do not exist: [m9z.large]"),
        "{err}"
    );
}
