//! Scenarios: every built-in loads and its StatefulSets become Ready; scale-5k loads; malformed files
//! are refused with the file, the position and the problem.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::Value;
use snapdrain_sim::world::Timings;
use snapdrain_sim::world::objects::{condition, nodeclaims, pods};
use snapdrain_sim::{ScenarioSource, SimCluster, SimConfig, SimError};
use snapdrain_testkit::{eventually_within, start_scenario};

fn fast() -> Timings {
    Timings {
        pod_start: Duration::from_millis(20),
        pod_stop: Duration::from_millis(20),
        volume_detach: Duration::from_millis(20),
        ..Timings::instant()
    }
}

async fn all_statefulsets_ready(client: &Client, expected: usize) {
    let sets: Api<StatefulSet> = Api::all(client.clone());
    eventually_within(
        "every StatefulSet Ready",
        Duration::from_secs(30),
        || async {
            let items = sets.list(&ListParams::default()).await.unwrap().items;
            let ready = items.iter().all(|s| {
                let want = s.spec.as_ref().and_then(|sp| sp.replicas).unwrap_or(1);
                s.status.as_ref().and_then(|st| st.ready_replicas) == Some(want)
            });
            (items.len() == expected && ready).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn quickstart_loads_karpenter_nodes_velero_and_ready_statefulsets() {
    let (cluster, client) = start_scenario("quickstart", fast()).await;
    all_statefulsets_ready(&client, 2).await;
    let store = &cluster.store;
    let nodes = store.snapshot(&snapdrain_sim::world::objects::nodes()).0;
    assert_eq!(nodes.len(), 6);
    let claims = store.snapshot(&nodeclaims()).0;
    assert_eq!(claims.len(), 6, "one NodeClaim per Karpenter node");
    for n in &nodes {
        let pid = n
            .pointer("/spec/providerID")
            .and_then(Value::as_str)
            .unwrap();
        assert!(
            pid.starts_with("aws:///us-east-1") && pid.contains("/i-"),
            "{pid}"
        );
        assert!(
            n.pointer("/status/nodeInfo/osImage")
                .and_then(Value::as_str)
                .unwrap()
                .starts_with("Bottlerocket OS")
        );
        let claim = claims
            .iter()
            .find(|c| c.pointer("/status/providerID").and_then(Value::as_str) == Some(pid))
            .expect("NodeClaim with the node's providerID");
        assert_eq!(
            n.pointer("/metadata/ownerReferences/0/uid"),
            claim.pointer("/metadata/uid")
        );
        assert_eq!(
            n.pointer("/metadata/labels/karpenter.sh~1nodepool")
                .and_then(Value::as_str),
            Some("default")
        );
        assert_eq!(condition(claim, "Initialized"), Some("True"));
        assert_eq!(
            claim
                .pointer("/metadata/finalizers/0")
                .and_then(Value::as_str),
            Some("karpenter.sh/termination")
        );
    }
    let bsl = store
        .get(
            &snapdrain_sim::apiserver::resources::ResKey::new(
                "velero.io",
                "backupstoragelocations",
            ),
            Some("velero"),
            "default",
        )
        .expect("BSL");
    assert_eq!(
        bsl.pointer("/spec/config/s3Url").and_then(Value::as_str),
        cluster.s3.as_ref().map(|s| s.endpoint()).as_deref(),
        "the BSL points at the simulated S3 endpoint"
    );
    assert!(
        store
            .get(
                &snapdrain_sim::apiserver::resources::ResKey::core("secrets"),
                Some("velero"),
                "cloud-credentials"
            )
            .is_some()
    );
    let ready_pods = |ns: &str| {
        store
            .list(
                &pods(),
                Some(ns),
                &|p| p.pointer("/status/phase").and_then(Value::as_str) == Some("Running"),
                None,
                None,
            )
            .items
            .len()
    };
    eventually_within(
        "node-agent on every node",
        Duration::from_secs(15),
        || async { (ready_pods("velero") == 7).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn batch_burst_loads_and_its_statefulsets_become_ready() {
    let (_cluster, client) = start_scenario("batch-burst", fast()).await;
    all_statefulsets_ready(&client, 3).await;
}

#[tokio::test]
async fn drift_rollout_marks_twenty_nodeclaims_drifted() {
    let (cluster, client) = start_scenario("drift-rollout", fast()).await;
    all_statefulsets_ready(&client, 3).await;
    eventually_within("20 Drifted NodeClaims", Duration::from_secs(20), || async {
        let drifted = cluster
            .store
            .snapshot(&nodeclaims())
            .0
            .iter()
            .filter(|c| condition(c, "Drifted") == Some("True"))
            .count();
        (drifted == 20).then_some(())
    })
    .await;
}

#[tokio::test]
async fn scale_5k_loads() {
    let t = Instant::now();
    let cluster = SimCluster::start(SimConfig {
        scenario: Some(ScenarioSource::Named("scale-5k".into())),
        ..Default::default()
    })
    .await
    .expect("scale-5k loads");
    let loaded = t.elapsed();
    let pod_count = cluster.store.snapshot(&pods()).0.len();
    let nodes = cluster
        .store
        .snapshot(&snapdrain_sim::world::objects::nodes())
        .0
        .len();
    println!("scale-5k: {nodes} nodes and {pod_count} pods loaded in {loaded:?}");
    assert_eq!(nodes, 5000);
    assert_eq!(pod_count, 150_000);
    assert_eq!(cluster.scenario.as_ref().unwrap().instances.len(), 5000);
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

async fn refused(path: &str) -> String {
    match SimCluster::start(SimConfig {
        scenario: Some(ScenarioSource::Named(path.into())),
        ..Default::default()
    })
    .await
    {
        Ok(_) => panic!("{path} must be refused"),
        Err(e @ SimError::ScenarioFile(_)) => e.to_string(),
        Err(other) => panic!("unexpected error kind: {other}"),
    }
}

#[tokio::test]
async fn malformed_scenarios_are_refused_with_file_and_position() {
    let dir = tempfile::tempdir().unwrap();
    let typo = write(
        &dir,
        "typo.yaml",
        "name: t\nnodes:\n  - count: 2\n    zone: us-east-1a\n    instanceTyp: m6i.large\n",
    );
    let msg = refused(&typo).await;
    assert!(msg.contains("typo.yaml"), "{msg}");
    assert!(msg.contains("line 5"), "{msg}");
    assert!(msg.contains("instanceTyp"), "{msg}");

    let syntax = write(&dir, "syntax.yaml", "name: t\nnodes: [\n");
    let msg = refused(&syntax).await;
    assert!(msg.contains("syntax.yaml") && msg.contains("line"), "{msg}");

    let invalid = write(
        &dir,
        "invalid.yaml",
        "nodes:\n  - name: n1\n    count: 3\n    zone: us-east-1a\n",
    );
    let msg = refused(&invalid).await;
    assert!(
        msg.contains("invalid.yaml") && msg.contains("nodes[0].count"),
        "{msg}"
    );

    let msg = refused("no-such-scenario").await;
    assert!(msg.contains("quickstart"), "lists the built-ins: {msg}");
}
