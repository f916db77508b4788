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
    CapacityType, CloudError, Ec2Cloud, FleetOverride, InstanceLifecycleState, LaunchRequest,
    LaunchStrategy, LaunchTemplateRef, TerminateOutcome,
};
use snapdrain_sim::ec2::{Ec2Sim, Ec2SimConfig, InstanceEvent, InstanceState};
use tokio::sync::broadcast;

const USER_DATA: &str =
    include_str!("../../../snapdrain/src/cloud/bottlerocket/testdata/bottlerocket-userdata.toml");
const AMI: &str = "ami-0abcdef1234567890";

async fn start() -> (Ec2Sim, Ec2Cloud) {
    let sim = Ec2Sim::start(Ec2SimConfig::default()).await.unwrap();
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
            },
            image_id: None,
            user_data: None,
            tags: BTreeMap::from([("snapdrain.io/plan".into(), "p1".into())]),
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
