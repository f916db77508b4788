//! The built-in scenarios run to their end with the whole simulated world: Velero on quickstart driven by
//! kubectl, EC2 instances joining as Nodes, Karpenter replacing drifted nodes on drift-rollout and
//! consolidating the emptied batch pool on batch-burst.

use std::collections::BTreeSet;
use std::time::Duration;

use aws_sdk_ec2::types::InstanceType;
use base64::Engine;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::json;
use snapdrain_sim::cluster::cluster_join;
use snapdrain_sim::ec2::bottlerocket::karpenter_user_data;
use snapdrain_sim::world::Timings;
use snapdrain_sim::world::velero::VeleroFault;
use snapdrain_testkit::{Kubectl, eventually_within, start_scenario};

fn fast() -> Timings {
    Timings {
        pod_start: Duration::from_millis(20),
        pod_stop: Duration::from_millis(20),
        volume_detach: Duration::from_millis(20),
        instance_boot: Duration::from_millis(200),
        backup_overhead: Duration::from_millis(50),
        backup_mib_per_second: 0.0,
        ebs_snapshot_mib_per_second: 0.0,
        ebs_snapshot_per_volume_interval: snapdrain_sim::ec2::PER_VOLUME_INTERVAL,
    }
}

fn nodeclaims(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "nodeclaims"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quickstart_backup_from_kubectl_completes_into_the_bucket_with_its_uid() {
    let (cluster, client) = start_scenario("quickstart", fast()).await;
    let k = Kubectl::new(&cluster);
    let manifest = k.file(
        "backup.yaml",
        "apiVersion: velero.io/v1\nkind: Backup\nmetadata: {name: shop-now, namespace: velero}\nspec:\n  includedNamespaces: [shop]\n  defaultVolumesToFsBackup: true\n  storageLocation: default\n",
    );
    // StatefulSet pods must run for their volumes to be backed up through the node-agent.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    eventually_within(
        "postgres and redis running",
        Duration::from_secs(30),
        || async {
            let list = pods.list(&ListParams::default()).await.ok()?;
            let running = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            (running >= 9).then_some(())
        },
    )
    .await;
    snapdrain_testkit::node_agents_running(&client).await;
    k.ok(&["apply", "-f", &manifest]).await;
    let phase = |name: &'static str| {
        let k = &k;
        async move {
            k.ok(&[
                "get",
                "backups.velero.io",
                name,
                "-n",
                "velero",
                "-o",
                "jsonpath={.status.phase}",
            ])
            .await
        }
    };
    eventually_within(
        "the Backup to complete",
        Duration::from_secs(30),
        || async { (phase("shop-now").await == "Completed").then_some(()) },
    )
    .await;
    let uid = k
        .ok(&[
            "get",
            "backups.velero.io",
            "shop-now",
            "-n",
            "velero",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .await;
    let s3 = cluster.s3.as_ref().unwrap().client();
    let obj = s3
        .get_object()
        .bucket("velero")
        .key("cluster-a/backups/shop-now/velero-backup.json")
        .send()
        .await
        .unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&obj.body.collect().await.unwrap().into_bytes()).unwrap();
    assert_eq!(json["metadata"]["uid"], json!(uid));
    assert_eq!(json["status"]["phase"], "Completed");
    let tar = s3
        .head_object()
        .bucket("velero")
        .key("cluster-a/backups/shop-now/shop-now.tar.gz")
        .send()
        .await
        .unwrap();
    assert!(tar.content_length().unwrap_or(0) > 0);

    // An injected fault fails the next backup as Velero would, and the bucket copy says so too.
    cluster
        .velero
        .as_ref()
        .unwrap()
        .inject(VeleroFault::FailNextBackup {
            reason: "injected: node-agent lost its connection".into(),
        });
    k.ok(&["apply", "-f", &k.file("b2.yaml", "apiVersion: velero.io/v1\nkind: Backup\nmetadata: {name: shop-later, namespace: velero}\nspec: {includedNamespaces: [shop], defaultVolumesToFsBackup: true}\n")]).await;
    eventually_within(
        "the faulted Backup to fail",
        Duration::from_secs(30),
        || async { (phase("shop-later").await == "Failed").then_some(()) },
    )
    .await;
    let reason = k
        .ok(&[
            "get",
            "backups.velero.io",
            "shop-later",
            "-n",
            "velero",
            "-o",
            "jsonpath={.status.failureReason}",
        ])
        .await;
    assert!(
        reason.contains("node-agent lost its connection"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_instances_joins_as_a_ready_node_once_per_token_and_bad_user_data_fails_visibly() {
    let (cluster, client) = start_scenario("quickstart", fast()).await;
    let ec2 = cluster.ec2.as_ref().unwrap();
    let sdk = aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::Config::builder()
            .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
            .region(aws_sdk_ec2::config::Region::new(
                ec2.config().region.clone(),
            ))
            .credentials_provider(aws_credential_types::Credentials::new(
                "ak", "sk", None, None, "test",
            ))
            .endpoint_url(ec2.endpoint())
            .build(),
    );
    let labels = std::collections::BTreeMap::from([("example.com/joined".into(), "yes".into())]);
    let good = base64::engine::general_purpose::STANDARD.encode(karpenter_user_data(
        &cluster_join(&cluster.url(), cluster.ca_pem()),
        &labels,
        &[],
    ));
    let subnet = ec2.config().subnets[0].id.clone();
    let launch = |token: &'static str, user_data: String| {
        sdk.run_instances()
            // An AMI the simulated account has: EC2 refuses one it does not (InvalidAMIID.NotFound).
            .image_id(snapdrain_sim::ec2::images::BOTTLEROCKET_X86_64)
            .instance_type(InstanceType::M6iXlarge)
            .min_count(1)
            .max_count(1)
            .subnet_id(&subnet)
            // What a node needs to join besides its user data (see ec2::instances_join_only_with_...).
            .iam_instance_profile(
                aws_sdk_ec2::types::IamInstanceProfileSpecification::builder()
                    .name(snapdrain_sim::ec2::NODE_INSTANCE_PROFILE)
                    .build(),
            )
            .security_group_ids(snapdrain_sim::ec2::CLUSTER_SECURITY_GROUP)
            .user_data(user_data)
            .client_token(token)
            .send()
    };
    let first = launch("join-test-1", good.clone()).await.unwrap();
    let again = launch("join-test-1", good.clone()).await.unwrap();
    let id = first.instances()[0].instance_id().unwrap().to_string();
    assert_eq!(
        again.instances()[0].instance_id(),
        Some(id.as_str()),
        "same token, same instance"
    );
    let nodes: Api<Node> = Api::all(client.clone());
    let node = eventually_within(
        "the instance to join as a Ready node",
        Duration::from_secs(30),
        || async {
            let list = nodes.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.provider_id.as_deref())
                    .is_some_and(|p| p.ends_with(&id))
                    && n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
        },
    )
    .await;
    assert_eq!(
        node.labels().get("example.com/joined").map(String::as_str),
        Some("yes")
    );
    let launched: Vec<_> = ec2
        .instances()
        .into_iter()
        .filter(|i| i.client_token.as_deref() == Some("join-test-1"))
        .collect();
    assert_eq!(launched.len(), 1);

    let bad = base64::engine::general_purpose::STANDARD
        .encode("[settings.kubernetes]\ncluster-name = \"bad name!\"\n");
    let out = launch("join-test-bad", bad).await.unwrap();
    let bad_id = out.instances()[0].instance_id().unwrap().to_string();
    let reason = eventually_within(
        "the bad instance to stop",
        Duration::from_secs(30),
        || async { ec2.instance(&bad_id).and_then(|i| i.state_reason.clone()) },
    )
    .await;
    assert!(reason.1.contains("settings.kubernetes"), "{reason:?}");
    // The world audits the failed boot when it takes in EC2's BootFailed event, which EC2 sends after it
    // set the state reason: wait for the entry, do not expect it at the same instant.
    eventually_within(
        "the failed boot to be audited",
        Duration::from_secs(30),
        || async {
            cluster
                .audit
                .since(0)
                .iter()
                .any(|e| e.source == "world" && e.name.as_deref() == Some(bad_id.as_str()))
                .then_some(())
        },
    )
    .await;
    let all = nodes.list(&ListParams::default()).await.unwrap();
    assert!(!all.items.iter().any(|n| {
        n.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .is_some_and(|p| p.ends_with(&bad_id))
    }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drift_rollout_replaces_drifted_nodes_except_those_held_by_do_not_disrupt() {
    let (cluster, client) = start_scenario("drift-rollout", fast()).await;
    // Before the timeline marks the nodes Drifted (5 s in), hold one node with a do-not-disrupt pod.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");
    let held_pod = eventually_within(
        "a running postgres pod",
        Duration::from_secs(20),
        || async {
            pods.get_opt("postgres-0")
                .await
                .ok()
                .flatten()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        },
    )
    .await;
    let held_node = held_pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    pods.patch(
        "postgres-0",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}}),
        ),
    )
    .await
    .unwrap();
    let claims = nodeclaims(&client);
    let original: BTreeSet<String> = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(original.len(), 20);
    let drifted = |c: &DynamicObject| {
        c.data["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Drifted" && c["status"] == "True")
        })
    };
    let held_claim = eventually_within("every node Drifted", Duration::from_secs(30), || async {
        let list = claims.list(&ListParams::default()).await.ok()?;
        let marked = list
            .items
            .iter()
            .filter(|c| original.contains(&c.name_any()) && drifted(c))
            .count();
        (marked == 20).then(|| {
            list.items
                .iter()
                .find(|c| c.data["status"]["nodeName"] == json!(held_node))
                .map(|c| c.name_any())
        })?
    })
    .await;
    let left = eventually_within(
        "every drifted node but the held one replaced",
        Duration::from_secs(120),
        || async {
            let list = claims.list(&ListParams::default()).await.ok()?;
            let old: Vec<String> = list
                .items
                .iter()
                .map(|c| c.name_any())
                .filter(|n| original.contains(n))
                .collect();
            let new = list
                .items
                .iter()
                .filter(|c| !original.contains(&c.name_any()))
                .count();
            (old.len() == 1 && new >= 19).then_some(old)
        },
    )
    .await;
    assert_eq!(left, vec![held_claim], "only the held node stays");
    let nodes: Api<Node> = Api::all(client.clone());
    assert!(nodes.get_opt(&held_node).await.unwrap().is_some());
    let audit = cluster.audit.since(0);
    assert!(
        audit.iter().any(|e| e.verb == "disruption-blocked"),
        "the hold is audited"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batch_burst_runs_its_job_then_the_batch_pool_is_emptied() {
    let (_cluster, client) = start_scenario("batch-burst", fast()).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let batch_nodes = || async {
        nodes
            .list(&ListParams::default().labels("karpenter.sh/nodepool=batch"))
            .await
            .map(|l| l.items.len())
            .unwrap_or(usize::MAX)
    };
    assert!(batch_nodes().await > 0);
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), "batch");
    eventually_within(
        "the 400-pod job to succeed",
        Duration::from_secs(120),
        || async {
            let job = jobs.get_opt("etl").await.ok().flatten()?;
            (job.status.and_then(|s| s.succeeded) == Some(400)).then_some(())
        },
    )
    .await;
    eventually_within(
        "Karpenter to remove the emptied batch nodes",
        Duration::from_secs(120),
        || async { (batch_nodes().await == 0).then_some(()) },
    )
    .await;
}
