//! The EC2 simulator driven by the real aws-sdk-ec2 over HTTP, directly and through Ec2Cloud.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    Filter, InstanceStateName, InstanceType, LaunchTemplateSpecification,
    RequestLaunchTemplateData, ResourceType, Tag, TagSpecification,
};
use snapdrain::cloud::bottlerocket::encode_base64;
use snapdrain::cloud::ec2::{
    CapacityType, CloudError, Ec2Cloud, FleetOverride, InstanceLifecycleState, JoinSettings,
    LaunchRequest, LaunchStrategy, LaunchTemplateRef, MetadataSettings, TerminateOutcome,
};
use snapdrain_sim::ec2::{Ec2Sim, Ec2SimConfig, ImageConfig, InstanceEvent, InstanceState};
use tokio::sync::broadcast;

const USER_DATA: &str =
    include_str!("../../../snapdrain/src/cloud/bottlerocket/testdata/bottlerocket-userdata.toml");
const AMI: &str = "ami-0abcdef1234567890";

async fn start() -> (Ec2Sim, Ec2Cloud) {
    let sim = Ec2Sim::start(Ec2SimConfig::default()).await.unwrap();
    // EC2 launches only AMIs the account has (RunInstances: InvalidAMIID.NotFound otherwise).
    sim.register_image(ImageConfig::bottlerocket(AMI, "1.35", "x86_64", "1.42.0"));
    let cloud = Ec2Cloud::with_endpoint(&sim.endpoint(), "us-west-2", Some(("test", "test"))).await;
    (sim, cloud)
}

fn subnet(sim: &Ec2Sim, i: usize) -> String {
    sim.config().subnets[i].id.clone()
}

/// Waits for the first event that `pick` accepts.
async fn wait_for<T>(
    rx: &mut broadcast::Receiver<InstanceEvent>,
    mut pick: impl FnMut(&InstanceEvent) -> Option<T>,
) -> T {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let ev = rx.recv().await.expect("event channel open");
            if let Some(t) = pick(&ev) {
                return t;
            }
        }
    })
    .await
    .expect("expected event within 10s")
}

fn run(
    client: &Client,
    sim: &Ec2Sim,
) -> aws_sdk_ec2::operation::run_instances::builders::RunInstancesFluentBuilder {
    client
        .run_instances()
        .image_id(AMI)
        .instance_type(InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .subnet_id(subnet(sim, 1))
}

async fn make_template(client: &Client, name: &str, user_data: &str) -> String {
    let out = client
        .create_launch_template()
        .launch_template_name(name)
        .launch_template_data(
            RequestLaunchTemplateData::builder()
                .image_id(AMI)
                .instance_type(InstanceType::M5Large)
                .user_data(encode_base64(user_data))
                .build(),
        )
        .send()
        .await
        .unwrap();
    out.launch_template()
        .unwrap()
        .launch_template_id()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn run_instances_boots_and_carries_user_data() {
    let (sim, cloud) = start().await;
    let mut rx = sim.subscribe();
    let out = run(cloud.client(), &sim)
        .user_data(encode_base64(USER_DATA))
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Instance)
                .tags(
                    Tag::builder()
                        .key("snapdrain.io/replaces")
                        .value("node-1")
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    let inst = &out.instances()[0];
    let id = inst.instance_id().unwrap().to_string();
    assert!(id.starts_with("i-") && id.len() == 19, "{id}");
    assert_eq!(
        inst.state().unwrap().name(),
        Some(&InstanceStateName::Pending)
    );
    assert_eq!(
        inst.placement().unwrap().availability_zone(),
        Some("us-west-2b")
    );
    let dns = inst.private_dns_name().unwrap();
    assert!(
        regex::Regex::new(r"^ip-10-0-\d+-\d+\.us-west-2\.compute\.internal$")
            .unwrap()
            .is_match(dns),
        "{dns}"
    );

    let booted = wait_for(&mut rx, |ev| match ev {
        InstanceEvent::Booted { instance } if instance.id == id => Some(instance.clone()),
        _ => None,
    })
    .await;
    let ud = booted.user_data.expect("parsed user data");
    assert_eq!(ud.cluster_name, "prod-eks-1");
    assert_eq!(ud.node_labels["example.com/node-pool"], "logging");
    assert_eq!(
        ud.node_taints,
        vec![(
            "example.com/dedicated".to_string(),
            "logging".to_string(),
            "NoSchedule".to_string()
        )]
    );
    assert_eq!(ud.sysctls["fs.inotify.max_user_instances"], "8192");
    assert_eq!(booted.tags["snapdrain.io/replaces"], "node-1");
    assert_eq!(booted.private_dns_name, dns);
    assert_eq!(
        cloud.instance_state(&id).await.unwrap(),
        Some(InstanceLifecycleState::Running)
    );
}

#[tokio::test]
async fn client_token_makes_run_instances_idempotent() {
    let (sim, cloud) = start().await;
    let token = "node-uid-1234-attempt-1";
    let a = run(cloud.client(), &sim)
        .client_token(token)
        .send()
        .await
        .unwrap();
    let b = run(cloud.client(), &sim)
        .client_token(token)
        .send()
        .await
        .unwrap();
    assert_eq!(
        a.instances()[0].instance_id(),
        b.instances()[0].instance_id()
    );
    assert_eq!(a.reservation_id(), b.reservation_id());
    assert_eq!(sim.instances().len(), 1);

    let err = run(cloud.client(), &sim)
        .instance_type(InstanceType::C5Large)
        .client_token(token)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("IdempotentParameterMismatch"));
    assert_eq!(sim.instances().len(), 1);
}

#[tokio::test]
async fn invalid_user_data_fails_the_boot_visibly() {
    let (sim, cloud) = start().await;
    let mut rx = sim.subscribe();
    let bad = USER_DATA.replace("logging:NoSchedule", "logging:Sometimes");
    let out = run(cloud.client(), &sim)
        .user_data(encode_base64(&bad))
        .send()
        .await
        .unwrap();
    let id = out.instances()[0].instance_id().unwrap().to_string();
    let reason = wait_for(&mut rx, |ev| match ev {
        InstanceEvent::BootFailed { id: i, reason } if *i == id => Some(reason.clone()),
        InstanceEvent::Booted { instance } if instance.id == id => {
            panic!("booted with bad user data")
        }
        _ => None,
    })
    .await;
    assert!(
        reason.contains("settings.kubernetes.node-taints"),
        "{reason}"
    );

    let desc = cloud
        .client()
        .describe_instances()
        .instance_ids(&id)
        .send()
        .await
        .unwrap();
    let inst = &desc.reservations()[0].instances()[0];
    assert_eq!(
        inst.state().unwrap().name(),
        Some(&InstanceStateName::Stopped)
    );
    let msg = inst.state_reason().unwrap().message().unwrap();
    assert!(
        msg.contains("NoSchedule, PreferNoSchedule or NoExecute"),
        "{msg}"
    );
    assert_eq!(sim.instance(&id).unwrap().state, InstanceState::Stopped);

    let err = run(cloud.client(), &sim)
        .user_data("this is not base64!")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidUserData.Malformed"));
}

#[tokio::test]
async fn launch_template_request_params_override_template() {
    let (sim, cloud) = start().await;
    let mut rx = sim.subscribe();
    let lt = make_template(cloud.client(), "workers", USER_DATA).await;
    let found = cloud
        .client()
        .describe_launch_templates()
        .launch_template_names("workers")
        .send()
        .await
        .unwrap();
    assert_eq!(
        found.launch_templates()[0].launch_template_id(),
        Some(lt.as_str())
    );

    let launched = cloud
        .launch(LaunchRequest {
            strategy: LaunchStrategy::LaunchTemplate {
                template: LaunchTemplateRef {
                    id_or_name: "workers".into(),
                    version: "$Latest".into(),
                },
                instance_type: Some("r5.xlarge".into()),
                subnet_id: Some(subnet(&sim, 2)),
                capacity_type: None,
            },
            image_id: None,
            user_data: None,
            tags: BTreeMap::from([("snapdrain.io/plan".into(), "p1".into())]),
            join: JoinSettings::default(),
            client_token: "lt-launch-1".into(),
        })
        .await
        .unwrap();
    assert_eq!(launched.len(), 1);
    assert_eq!(launched[0].instance_type.as_deref(), Some("r5.xlarge"));
    assert_eq!(launched[0].zone.as_deref(), Some("us-west-2c"));
    let id = launched[0].instance_id.clone();
    let booted = wait_for(&mut rx, |ev| match ev {
        InstanceEvent::Booted { instance } if instance.id == id => Some(instance.clone()),
        _ => None,
    })
    .await;
    // User data and image came from the template.
    assert_eq!(booted.image_id, AMI);
    assert_eq!(booted.user_data.unwrap().cluster_name, "prod-eks-1");
    assert_eq!(booted.tags["aws:ec2launchtemplate:id"], lt);
    assert_eq!(booted.tags["snapdrain.io/plan"], "p1");

    let err = cloud
        .client()
        .run_instances()
        .launch_template(
            LaunchTemplateSpecification::builder()
                .launch_template_name("nope")
                .version("$Latest")
                .build(),
        )
        .min_count(1)
        .max_count(1)
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some("InvalidLaunchTemplateName.NotFoundException")
    );
}

fn fleet_request(sim: &Ec2Sim, token: &str) -> LaunchRequest {
    LaunchRequest {
        strategy: LaunchStrategy::Fleet {
            overrides: vec![
                FleetOverride {
                    instance_type: "m5.large".into(),
                    subnet_id: subnet(sim, 0),
                },
                FleetOverride {
                    instance_type: "c5.large".into(),
                    subnet_id: subnet(sim, 1),
                },
            ],
            capacity_type: CapacityType::Spot,
            launch_template: None,
        },
        image_id: Some(AMI.into()),
        user_data: Some(USER_DATA.into()),
        tags: BTreeMap::from([("snapdrain.io/replaces".into(), "node-7".into())]),
        join: JoinSettings::default(),
        client_token: token.into(),
    }
}

#[tokio::test]
async fn fleet_falls_back_to_the_next_override_and_reports_the_error() {
    let (sim, cloud) = start().await;
    let mut rx = sim.subscribe();
    sim.inject_capacity_error(
        "m5.large",
        Some("us-west-2a"),
        "InsufficientInstanceCapacity",
    );
    let outcome = cloud
        .launch_with_report(fleet_request(&sim, "fleet-token-1"))
        .await
        .unwrap();
    assert_eq!(outcome.instances.len(), 1);
    let launched = &outcome.instances[0];
    assert_eq!(launched.instance_type.as_deref(), Some("c5.large"));
    assert_eq!(launched.zone.as_deref(), Some("us-west-2b"));
    assert_eq!(outcome.override_failures.len(), 1);
    let f = &outcome.override_failures[0];
    assert_eq!(f.code, "InsufficientInstanceCapacity");
    assert_eq!(f.instance_type.as_deref(), Some("m5.large"));
    assert_eq!(f.zone.as_deref(), Some("us-west-2a"));

    let id = launched.instance_id.clone();
    let booted = wait_for(&mut rx, |ev| match ev {
        InstanceEvent::Booted { instance } if instance.id == id => Some(instance.clone()),
        _ => None,
    })
    .await;
    assert!(booted.spot);
    assert_eq!(booted.tags["snapdrain.io/replaces"], "node-7");
    assert_eq!(booted.user_data.unwrap().max_pods, Some(29));

    // A retry with the same token returns the same instance instead of launching another.
    sim.clear_faults();
    let again = cloud
        .launch(fleet_request(&sim, "fleet-token-1"))
        .await
        .unwrap();
    assert_eq!(again[0].instance_id, id);
    assert_eq!(sim.instances().len(), 1);
}

#[tokio::test]
async fn fleet_with_every_override_failing_is_an_error_naming_them() {
    let (sim, cloud) = start().await;
    sim.inject_capacity_error("m5.large", None, "InsufficientInstanceCapacity");
    sim.inject_capacity_error("c5.large", None, "MaxSpotInstanceCountExceeded");
    let err = cloud
        .launch(fleet_request(&sim, "fleet-token-2"))
        .await
        .unwrap_err();
    let CloudError::NoCapacity { failures } = &err else {
        panic!("expected NoCapacity, got {err}");
    };
    assert_eq!(failures.len(), 2);
    let msg = err.to_string();
    assert!(
        msg.contains("m5.large") && msg.contains("InsufficientInstanceCapacity"),
        "{msg}"
    );
    assert!(
        msg.contains("c5.large") && msg.contains("MaxSpotInstanceCountExceeded"),
        "{msg}"
    );
    assert!(sim.instances().is_empty());
}

/// An instant CreateFleet whose every override failed has completed (HTTP 200 with its errorSet): EC2
/// answers a retry with the same ClientToken with that first result ("Ensuring idempotency in Amazon
/// EC2 API requests", EC2 developer guide), even once capacity is back; a new token launches.
#[tokio::test]
async fn a_fleet_token_keeps_its_failure_and_a_new_token_launches() {
    let (sim, cloud) = start().await;
    sim.inject_capacity_error("m5.large", None, "InsufficientInstanceCapacity");
    sim.inject_capacity_error("c5.large", None, "InsufficientInstanceCapacity");
    let first = cloud
        .launch(fleet_request(&sim, "fleet-token-3"))
        .await
        .unwrap_err();
    assert!(first.is_capacity(), "{first}");
    sim.clear_faults();
    let again = cloud
        .launch(fleet_request(&sim, "fleet-token-3"))
        .await
        .unwrap_err();
    assert!(
        again.is_capacity(),
        "the same token, the same answer: {again}"
    );
    assert!(sim.instances().is_empty());
    let launched = cloud
        .launch(fleet_request(&sim, "fleet-token-3-c1"))
        .await
        .unwrap();
    assert_eq!(launched.len(), 1);
    assert_eq!(sim.instances().len(), 1);
}

#[tokio::test]
async fn terminate_is_idempotent_and_unknown_ids_are_not_found() {
    let (sim, cloud) = start().await;
    let mut rx = sim.subscribe();
    let out = run(cloud.client(), &sim).send().await.unwrap();
    let id = out.instances()[0].instance_id().unwrap().to_string();
    wait_for(&mut rx, |ev| {
        matches!(ev, InstanceEvent::Booted { instance } if instance.id == id).then_some(())
    })
    .await;

    let first = cloud.terminate(&id).await.unwrap();
    assert_eq!(
        first,
        TerminateOutcome::Terminating {
            previous: InstanceLifecycleState::Running
        }
    );
    assert!(matches!(
        cloud.terminate(&id).await.unwrap(),
        TerminateOutcome::Terminating { .. }
    ));
    wait_for(&mut rx, |ev| {
        matches!(ev, InstanceEvent::Terminated { id: i } if *i == id).then_some(())
    })
    .await;
    assert_eq!(
        cloud.instance_state(&id).await.unwrap(),
        Some(InstanceLifecycleState::Terminated)
    );
    // Terminating a terminated instance is still fine.
    assert!(matches!(
        cloud.terminate(&id).await.unwrap(),
        TerminateOutcome::Terminating { .. }
    ));

    let unknown = "i-0000000000000dead";
    assert_eq!(
        cloud.terminate(unknown).await.unwrap(),
        TerminateOutcome::NotFound
    );
    assert_eq!(cloud.instance_state(unknown).await.unwrap(), None);
    let err = cloud
        .client()
        .terminate_instances()
        .instance_ids(unknown)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidInstanceID.NotFound"));
    assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(400));
}

#[tokio::test]
async fn describe_instances_filters() {
    let (sim, cloud) = start().await;
    let mut rx = sim.subscribe();
    let tagged = |k: &str, v: &str| {
        TagSpecification::builder()
            .resource_type(ResourceType::Instance)
            .tags(Tag::builder().key(k).value(v).build())
            .build()
    };
    let a = run(cloud.client(), &sim)
        .tag_specifications(tagged("team", "db"))
        .send()
        .await
        .unwrap();
    let b = run(cloud.client(), &sim)
        .tag_specifications(tagged("team", "web"))
        .send()
        .await
        .unwrap();
    let c = run(cloud.client(), &sim).send().await.unwrap();
    let [a, b, c] = [a, b, c].map(|o| o.instances()[0].instance_id().unwrap().to_string());
    for _ in 0..3 {
        wait_for(&mut rx, |ev| {
            matches!(ev, InstanceEvent::Booted { .. }).then_some(())
        })
        .await;
    }
    cloud.terminate(&c).await.unwrap();

    let ids = |filters: Vec<Filter>| {
        let client = cloud.client().clone();
        async move {
            let out = client
                .describe_instances()
                .set_filters(Some(filters))
                .send()
                .await?;
            let mut ids: Vec<String> = out
                .reservations()
                .iter()
                .flat_map(|r| r.instances())
                .filter_map(|i| i.instance_id().map(str::to_string))
                .collect();
            ids.sort();
            Ok::<_, aws_sdk_ec2::error::SdkError<_, _>>(ids)
        }
    };
    let f = |name: &str, values: &[&str]| {
        Filter::builder()
            .name(name)
            .set_values(Some(values.iter().map(|v| v.to_string()).collect()))
            .build()
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    assert_eq!(
        ids(vec![f("tag:team", &["db"])]).await.unwrap(),
        vec![a.clone()]
    );
    assert_eq!(
        ids(vec![f("tag-key", &["team"])]).await.unwrap(),
        sorted(vec![a.clone(), b.clone()])
    );
    assert_eq!(
        ids(vec![f("tag:team", &["w*"])]).await.unwrap(),
        vec![b.clone()]
    );
    assert_eq!(
        ids(vec![f("instance-state-name", &["running"])])
            .await
            .unwrap(),
        sorted(vec![a.clone(), b.clone()])
    );
    assert_eq!(
        ids(vec![f(
            "instance-state-name",
            &["shutting-down", "terminated"]
        )])
        .await
        .unwrap(),
        vec![c.clone()]
    );
    assert_eq!(
        ids(vec![
            f("instance-id", &[&a, &c]),
            f("instance-state-name", &["running"])
        ])
        .await
        .unwrap(),
        vec![a.clone()]
    );

    let err = ids(vec![f("instance-lifecycle", &["spot"])])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterValue"));
    assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(400));

    // CreateTags makes an instance match.
    cloud
        .client()
        .create_tags()
        .resources(&c)
        .tags(Tag::builder().key("team").value("db").build())
        .send()
        .await
        .unwrap();
    assert_eq!(
        ids(vec![f("tag:team", &["db"])]).await.unwrap(),
        sorted(vec![a, c])
    );
}

#[tokio::test]
async fn outage_and_in_process_hooks() {
    let (sim, cloud) = start().await;
    let mut rx = sim.subscribe();
    sim.set_outage(true);
    let err = cloud
        .instance_state("i-0123456789abcdef0")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ServiceUnavailable"), "{err}");
    assert!(err.to_string().contains("i-0123456789abcdef0"), "{err}");
    sim.set_outage(false);

    // Pre-populated instances are visible through the API; in-process terminate works.
    let info = snapdrain_sim::ec2::InstanceInfo {
        id: "i-0aaaaaaaaaaaaaaaa".into(),
        instance_type: "m5.large".into(),
        image_id: AMI.into(),
        zone: "us-west-2a".into(),
        subnet_id: subnet(&sim, 0),
        private_ip: "10.0.0.9".into(),
        private_dns_name: "ip-10-0-0-9.us-west-2.compute.internal".into(),
        tags: BTreeMap::new(),
        user_data: None,
        kubelet_error: None,
        launch_time: jiff::Timestamp::now(),
        spot: false,
        ..Default::default()
    };
    sim.insert_running(info.clone()).unwrap();
    assert!(sim.insert_running(info).is_err());
    assert_eq!(
        cloud.instance_state("i-0aaaaaaaaaaaaaaaa").await.unwrap(),
        Some(InstanceLifecycleState::Running)
    );
    sim.terminate("i-0aaaaaaaaaaaaaaaa").unwrap();
    wait_for(&mut rx, |ev| {
        matches!(ev, InstanceEvent::Terminated { id } if id == "i-0aaaaaaaaaaaaaaaa").then_some(())
    })
    .await;
    assert_eq!(
        cloud.instance_state("i-0aaaaaaaaaaaaaaaa").await.unwrap(),
        Some(InstanceLifecycleState::Terminated)
    );
}

/// The Booted event of `id`.
async fn booted(
    rx: &mut broadcast::Receiver<InstanceEvent>,
    id: &str,
) -> snapdrain_sim::ec2::InstanceInfo {
    wait_for(rx, |ev| match ev {
        InstanceEvent::Booted { instance } if instance.id == id => Some((**instance).clone()),
        _ => None,
    })
    .await
}

/// A Bottlerocket host joins EKS only with the node role's instance profile (aws-iam-authenticator reads
/// its credentials from IMDS; Bottlerocket QUICKSTART-EKS) and a security group that reaches the control
/// plane; EC2 refuses unknown groups and profiles, and an empty SubnetId (errors-overview:
/// InvalidSubnetID.Malformed).
#[tokio::test]
async fn instances_join_only_with_an_instance_profile_and_a_control_plane_security_group() {
    use snapdrain_sim::ec2::{
        CLUSTER_SECURITY_GROUP, DEFAULT_SECURITY_GROUP, NODE_INSTANCE_PROFILE,
    };
    let (sim, cloud) = start().await;
    let mut rx = sim.subscribe();
    let launch = |profile: Option<&str>, sg: Option<&str>| {
        let mut r = run(cloud.client(), &sim).user_data(encode_base64(USER_DATA));
        if let Some(p) = profile {
            r = r.iam_instance_profile(
                aws_sdk_ec2::types::IamInstanceProfileSpecification::builder()
                    .name(p)
                    .build(),
            );
        }
        if let Some(sg) = sg {
            r = r.security_group_ids(sg);
        }
        r
    };
    let id_of = |out: &aws_sdk_ec2::operation::run_instances::RunInstancesOutput| {
        out.instances()[0].instance_id().unwrap().to_string()
    };
    let bare = id_of(&launch(None, None).send().await.unwrap());
    let no_profile = booted(&mut rx, &bare).await;
    assert!(
        no_profile
            .kubelet_error
            .as_deref()
            .is_some_and(|e| e.contains("instance profile")),
        "{no_profile:?}"
    );
    assert_eq!(no_profile.security_group_ids, [DEFAULT_SECURITY_GROUP]);
    let default_sg = id_of(
        &launch(Some(NODE_INSTANCE_PROFILE), None)
            .send()
            .await
            .unwrap(),
    );
    let e = booted(&mut rx, &default_sg).await.kubelet_error.unwrap();
    assert!(e.contains("control plane"), "{e}");
    let good = id_of(
        &launch(Some(NODE_INSTANCE_PROFILE), Some(CLUSTER_SECURITY_GROUP))
            .metadata_options(
                aws_sdk_ec2::types::InstanceMetadataOptionsRequest::builder()
                    .http_tokens(aws_sdk_ec2::types::HttpTokensState::Required)
                    .http_put_response_hop_limit(2)
                    .build(),
            )
            .send()
            .await
            .unwrap(),
    );
    assert_eq!(booted(&mut rx, &good).await.kubelet_error, None);
    let d = cloud.describe_instance(&good).await.unwrap().unwrap();
    assert_eq!(
        d.instance_profile,
        Some(sim.config().instance_profile_arn(NODE_INSTANCE_PROFILE))
    );
    assert_eq!(d.security_group_ids, [CLUSTER_SECURITY_GROUP]);
    assert_eq!(
        d.metadata,
        Some(MetadataSettings {
            tokens_required: true,
            hop_limit: 2
        })
    );
    assert_eq!(d.subnet_id, Some(subnet(&sim, 1)));

    let err = launch(Some("nope"), None).send().await.unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterValue"), "{err:?}");
    let err = launch(Some(NODE_INSTANCE_PROFILE), Some("sg-0123456789abcdef0"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidGroup.NotFound"));
    let err = run(cloud.client(), &sim)
        .subnet_id("")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidSubnetID.Malformed"));
    let err = cloud
        .launch(LaunchRequest {
            strategy: LaunchStrategy::Fleet {
                overrides: vec![FleetOverride {
                    instance_type: "m5.large".into(),
                    subnet_id: String::new(),
                }],
                capacity_type: CapacityType::OnDemand,
                launch_template: None,
            },
            ..fleet_request(&sim, "blank-subnet")
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidSubnetID.Malformed"), "{err}");
    // A terminated instance no longer shows its network interface or profile.
    cloud.terminate(&good).await.unwrap();
    wait_for(&mut rx, |ev| {
        matches!(ev, InstanceEvent::Terminated { id } if *id == good).then_some(())
    })
    .await;
    let d = cloud.describe_instance(&good).await.unwrap().unwrap();
    assert!(
        d.subnet_id.is_none() && d.security_group_ids.is_empty() && d.instance_profile.is_none()
    );
}

/// Spot on RunInstances is `InstanceMarketOptions` (EC2 API reference); CreateFleet honours the
/// overrides' priorities only with the `prioritized` / `capacity-optimized-prioritized` strategies, and
/// takes the cheapest otherwise (EC2 user guide, "Allocation strategies for EC2 Fleet").
#[tokio::test]
async fn spot_run_instances_and_fleet_priorities_follow_the_request() {
    use snapdrain_sim::ec2::{CLUSTER_SECURITY_GROUP, NODE_INSTANCE_PROFILE};
    let (sim, cloud) = start().await;
    make_template(cloud.client(), "workers", USER_DATA).await;
    let join = JoinSettings {
        instance_profile: Some(NODE_INSTANCE_PROFILE.into()),
        security_group_ids: vec![CLUSTER_SECURITY_GROUP.into()],
        metadata: Some(MetadataSettings {
            tokens_required: true,
            hop_limit: 1,
        }),
    };
    let spot = cloud
        .launch(LaunchRequest {
            strategy: LaunchStrategy::LaunchTemplate {
                template: LaunchTemplateRef {
                    id_or_name: "workers".into(),
                    version: "$Latest".into(),
                },
                instance_type: None,
                subnet_id: Some(subnet(&sim, 0)),
                capacity_type: Some(CapacityType::Spot),
            },
            image_id: None,
            user_data: None,
            tags: BTreeMap::new(),
            join: join.clone(),
            client_token: "spot-1".into(),
        })
        .await
        .unwrap();
    let inst = sim.instance(&spot[0].instance_id).unwrap();
    assert!(inst.info.spot, "RunInstances asked for spot");
    assert_eq!(inst.info.security_group_ids, [CLUSTER_SECURITY_GROUP]);
    assert_eq!(inst.info.metadata_options.http_tokens, "required");

    // The plan prefers the bigger type; lowest-price would take m5.large.
    let outcome = cloud
        .launch_with_report(LaunchRequest {
            strategy: LaunchStrategy::Fleet {
                overrides: vec![
                    FleetOverride {
                        instance_type: "m5.2xlarge".into(),
                        subnet_id: subnet(&sim, 0),
                    },
                    FleetOverride {
                        instance_type: "m5.large".into(),
                        subnet_id: subnet(&sim, 0),
                    },
                ],
                capacity_type: CapacityType::OnDemand,
                launch_template: None,
            },
            join: join.clone(),
            ..fleet_request(&sim, "prio-1")
        })
        .await
        .unwrap();
    assert_eq!(
        outcome.instances[0].instance_type.as_deref(),
        Some("m5.2xlarge")
    );
    let req = sim.fleet_requests().pop().unwrap();
    assert_eq!(
        req.on_demand_allocation_strategy.as_deref(),
        Some("prioritized")
    );
    assert_eq!(
        req.spot_allocation_strategy.as_deref(),
        Some("capacity-optimized-prioritized")
    );
    let priorities: Vec<Option<f64>> = req.overrides.iter().map(|o| o.priority).collect();
    assert_eq!(priorities, [Some(0.0), Some(1.0)]);
    // The template made for the fleet carried the join settings; it can go once the fleet launched.
    let inst = sim.instance(&outcome.instances[0].instance_id).unwrap();
    assert_eq!(
        inst.info.iam_instance_profile,
        Some(NODE_INSTANCE_PROFILE).map(|n| sim.config().instance_profile_arn(n))
    );
    let made = outcome.created_template.expect("a template was made");
    assert!(sim.launch_template_names().contains(&made));
    cloud.delete_launch_template(&made).await.unwrap();
    cloud.delete_launch_template(&made).await.unwrap();
    assert!(!sim.launch_template_names().contains(&made));
}

/// An Auto Scaling group keeps its desired capacity: an instance terminated outside it is replaced;
/// TerminateInstanceInAutoScalingGroup with ShouldDecrementDesiredCapacity shrinks the group instead
/// (Auto Scaling API reference, TerminateInstanceInAutoScalingGroup), through the real
/// aws-sdk-autoscaling.
#[tokio::test]
async fn auto_scaling_group_replaces_what_is_terminated_outside_it() {
    let (sim, cloud) = start().await;
    let ids: Vec<String> = (0..3).map(|i| format!("i-0aaaaaaaaaaaaaa{i:02}")).collect();
    for (i, id) in ids.iter().enumerate() {
        sim.insert_running(snapdrain_sim::ec2::InstanceInfo {
            id: id.clone(),
            instance_type: "m5.large".into(),
            image_id: AMI.into(),
            zone: "us-west-2a".into(),
            subnet_id: subnet(&sim, 0),
            private_ip: format!("10.0.0.{}", 10 + i),
            private_dns_name: format!("ip-10-0-0-{}.us-west-2.compute.internal", 10 + i),
            ..Default::default()
        })
        .unwrap();
    }
    sim.create_auto_scaling_group("eks-ng-1", &ids).unwrap();
    let d = cloud.describe_instance(&ids[0]).await.unwrap().unwrap();
    assert_eq!(d.auto_scaling_group(), Some("eks-ng-1"));

    cloud.terminate(&ids[0]).await.unwrap();
    let g = sim.auto_scaling_group("eks-ng-1").unwrap();
    assert_eq!(g.desired, 3);
    assert_eq!(g.members.len(), 3, "{g:?}");
    assert!(!g.members.contains(&ids[0]));

    cloud
        .terminate_in_auto_scaling_group(&ids[1], true)
        .await
        .unwrap();
    let g = sim.auto_scaling_group("eks-ng-1").unwrap();
    assert_eq!((g.desired, g.members.len()), (2, 2), "{g:?}");

    cloud
        .terminate_in_auto_scaling_group(&ids[2], false)
        .await
        .unwrap();
    let g = sim.auto_scaling_group("eks-ng-1").unwrap();
    assert_eq!((g.desired, g.members.len()), (2, 2), "{g:?}");
    assert!(!g.members.contains(&ids[2]));

    let err = cloud
        .terminate_in_auto_scaling_group(&ids[2], true)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationError"), "{err}");
    assert!(err.to_string().contains("No managed instance"), "{err}");
}

/// RunInstances answers InsufficientInstanceCapacity as an API error (HTTP 500, research note
/// bottlerocket-ec2-s3.md §2 [ICE-500]), not as a fleet override error: Ec2Cloud reports it as a capacity
/// error that is retried (the replacement fails after `CAPACITY_ATTEMPTS`), not as a permanent one.
#[tokio::test]
async fn run_instances_capacity_errors_are_capacity_not_permanent() {
    let (sim, cloud) = start().await;
    make_template(cloud.client(), "workers", USER_DATA).await;
    sim.inject_capacity_error("m5.large", None, "InsufficientInstanceCapacity");
    let err = cloud
        .launch(LaunchRequest {
            strategy: LaunchStrategy::LaunchTemplate {
                template: LaunchTemplateRef {
                    id_or_name: "workers".into(),
                    version: "$Latest".into(),
                },
                instance_type: None,
                subnet_id: Some(subnet(&sim, 0)),
                capacity_type: None,
            },
            image_id: None,
            user_data: None,
            tags: BTreeMap::new(),
            join: JoinSettings::default(),
            client_token: "ice-1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InsufficientInstanceCapacity"), "{err}");
    assert!(err.is_capacity() && !err.is_permanent(), "{err}");
    assert!(
        (2..=10).contains(&snapdrain::cloud::ec2::CAPACITY_ATTEMPTS),
        "tried again, a bounded number of times"
    );
}

/// DescribeInstanceAttribute `userData` answers the user data an instance was launched with, base64 as
/// EC2 returns it (EC2 API reference, DescribeInstanceAttribute; `<userData><value>` in the response),
/// and an empty `<userData/>` for an instance launched without; Ec2Cloud decodes it and reads the
/// cluster it names. An unknown attribute or instance is refused with EC2's codes.
#[tokio::test]
async fn describe_instance_attribute_returns_the_user_data_base64() {
    let (sim, cloud) = start().await;
    let client = cloud.client().clone();
    let out = run(&client, &sim)
        .subnet_id(subnet(&sim, 0))
        .user_data(encode_base64(USER_DATA))
        .send()
        .await
        .unwrap();
    let id = out.instances()[0].instance_id().unwrap().to_string();
    let attr = client
        .describe_instance_attribute()
        .instance_id(&id)
        .attribute(aws_sdk_ec2::types::InstanceAttributeName::UserData)
        .send()
        .await
        .unwrap();
    assert_eq!(attr.instance_id(), Some(id.as_str()));
    assert_eq!(
        attr.user_data().and_then(|v| v.value()),
        Some(encode_base64(USER_DATA).as_str())
    );
    let raw = cloud.user_data(&id).await.unwrap().expect("user data");
    let cluster = snapdrain::cloud::bottlerocket::cluster_settings(&raw).unwrap();
    assert_eq!(cluster.cluster_name.as_deref(), Some("prod-eks-1"));

    let bare = run(&client, &sim)
        .subnet_id(subnet(&sim, 0))
        .send()
        .await
        .unwrap();
    let bare = bare.instances()[0].instance_id().unwrap().to_string();
    assert_eq!(cloud.user_data(&bare).await.unwrap(), None);
    assert_eq!(cloud.user_data("i-0000000000000dead").await.unwrap(), None);

    let e = client
        .describe_instance_attribute()
        .instance_id(&id)
        .attribute(aws_sdk_ec2::types::InstanceAttributeName::from("userdata"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("InvalidParameterValue"));
}

/// The `ec2` kind of the simulator's fault rules: `InsufficientInstanceCapacity` leaves a CreateFleet
/// without capacity in every pool it names (reported in the fleet's `Errors`, as EC2 does for an
/// instant fleet) and `RequestLimitExceeded` throttles any action in EC2's error shape, which the SDK
/// reads as its code; each ends with its `times`.
#[tokio::test]
async fn fault_rules_leave_launches_without_capacity_and_throttle_requests() {
    use snapdrain_sim::apiserver::faults::{FaultRule, Faults};
    let (sim, cloud) = start().await;
    let faults = std::sync::Arc::new(Faults::default());
    sim.attach_faults(faults.clone());
    let rule = |v: serde_json::Value| {
        let r: FaultRule = serde_json::from_value(v).unwrap();
        r.validate().unwrap();
        r
    };
    faults.add(rule(
        serde_json::json!({"kind": "ec2", "code": "InsufficientInstanceCapacity",
        "operation": "CreateFleet", "errorRate": 1.0, "times": 1}),
    ));
    let err = cloud
        .launch(fleet_request(&sim, "fleet-token-rule-1"))
        .await
        .unwrap_err();
    let CloudError::NoCapacity { failures } = &err else {
        panic!("expected NoCapacity, got {err}");
    };
    assert!(
        failures
            .iter()
            .all(|f| f.code == "InsufficientInstanceCapacity"),
        "{failures:?}"
    );
    let launched = cloud
        .launch(fleet_request(&sim, "fleet-token-rule-2"))
        .await
        .expect("capacity is back once the rule is used up");
    let id = launched[0].instance_id.clone();
    faults.add(rule(
        serde_json::json!({"kind": "ec2", "code": "RequestLimitExceeded",
        "operation": "DescribeInstances", "errorRate": 1.0, "times": 20}),
    ));
    let err = cloud.instance_state(&id).await.unwrap_err();
    assert_eq!(err.code(), Some("RequestLimitExceeded"), "{err}");
    assert!(faults.injected()["ec2"] >= 2, "{:?}", faults.injected());
}
