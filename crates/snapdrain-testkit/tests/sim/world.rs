//! The simulated world through kube-rs against the in-process API server: kubelet, scheduler,
//! StatefulSet/Deployment/DaemonSet controllers, volumes and garbage collection.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use snapdrain_sim::world::Timings;
use snapdrain_sim::{SimCluster, SimConfig};
use snapdrain_testkit::eventually;

async fn start() -> (SimCluster, Client) {
    let timings = Timings {
        pod_start: Duration::from_millis(30),
        pod_stop: Duration::from_millis(30),
        volume_detach: Duration::from_millis(30),
        ..Timings::instant()
    };
    let cluster = SimCluster::start(SimConfig {
        world: true,
        timings: Some(timings),
        ..Default::default()
    })
    .await
    .expect("cluster starts");
    let config = cluster.kube_config();
    let client = Client::try_from(config).expect("client");
    (cluster, client)
}

async fn add_nodes(client: &Client, names: &[(&str, &str)]) {
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, zone) in names {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone, "kubernetes.io/hostname": name}},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
}

fn statefulset(name: &str, replicas: i32) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas, "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "db", "image": "postgres:17",
                                                   "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                                      "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
        },
    }))
    .unwrap()
}

fn running_ready(p: &Pod) -> bool {
    let status = p.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        && p.metadata.deletion_timestamp.is_none()
}

#[tokio::test]
async fn statefulset_gets_ordinal_ready_pods_and_bound_claims() {
    let (cluster, client) = start().await;
    add_nodes(
        &client,
        &[
            ("n1", "us-east-1a"),
            ("n2", "us-east-1b"),
            ("n3", "us-east-1c"),
        ],
    )
    .await;
    let sets: Api<StatefulSet> = Api::default_namespaced(client.clone());
    sets.create(&PostParams::default(), &statefulset("web", 3))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    for i in 0..3 {
        let pod = eventually(&format!("web-{i} Running and Ready"), || async {
            pods.get_opt(&format!("web-{i}"))
                .await
                .unwrap()
                .filter(running_ready)
        })
        .await;
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("StatefulSet", Some(true))
        );
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(
            labels["statefulset.kubernetes.io/pod-name"],
            format!("web-{i}")
        );
        assert!(labels.contains_key("controller-revision-hash"));
        let status = pod.status.unwrap();
        assert!(status.pod_ip.is_some() && status.host_ip.is_some() && status.start_time.is_some());
        assert_eq!(status.container_statuses.unwrap()[0].restart_count, 0);
    }
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    for i in 0..3 {
        let pvc = claims.get(&format!("data-web-{i}")).await.unwrap();
        assert_eq!(pvc.status.unwrap().phase.as_deref(), Some("Bound"));
        assert!(pvc.spec.unwrap().volume_name.unwrap().starts_with("pvc-"));
    }
    // Replicas spread over the three nodes.
    let nodes: std::collections::BTreeSet<String> = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.spec.unwrap().node_name)
        .collect();
    assert_eq!(nodes.len(), 3, "pods spread over nodes: {nodes:?}");
    eventually("statefulset status readyReplicas 3", || async {
        let s = sets.get("web").await.unwrap().status?;
        (s.ready_replicas == Some(3) && s.current_replicas == Some(3)).then_some(())
    })
    .await;
    let started = cluster
        .audit
        .since(0)
        .into_iter()
        .filter(|e| e.source == "world" && e.verb == "started")
        .count();
    assert!(started >= 3, "pod starts are in the audit log");
}

#[tokio::test]
async fn deleted_statefulset_pod_returns_with_same_name_new_uid_and_same_claim() {
    let (cluster, client) = start().await;
    add_nodes(&client, &[("n1", "us-east-1a")]).await;
    let sets: Api<StatefulSet> = Api::default_namespaced(client.clone());
    sets.create(&PostParams::default(), &statefulset("db", 1))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let first = eventually("db-0 ready", || async {
        pods.get_opt("db-0").await.unwrap().filter(running_ready)
    })
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let volume = claims
        .get("data-db-0")
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name;
    pods.delete("db-0", &DeleteParams::default()).await.unwrap();
    let old_uid = first.metadata.uid.clone();
    let second = eventually("db-0 back with a new uid", || async {
        pods.get_opt("db-0")
            .await
            .unwrap()
            .filter(|p| p.metadata.uid != old_uid && running_ready(p))
    })
    .await;
    let claim_of = |p: &Pod| {
        p.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0]
            .persistent_volume_claim
            .as_ref()
            .unwrap()
            .claim_name
            .clone()
    };
    assert_eq!(claim_of(&second), "data-db-0");
    assert_eq!(
        claims
            .get("data-db-0")
            .await
            .unwrap()
            .spec
            .unwrap()
            .volume_name,
        volume
    );
    let log = cluster.audit.since(0);
    let deleted = log
        .iter()
        .find(|e| e.verb == "deleted" && e.resource == "pods" && e.name.as_deref() == Some("db-0"))
        .expect("deletion audited");
    assert_eq!(deleted.detail["node"], "n1");
    assert_eq!(deleted.detail["claims"][0], "data-db-0");
    assert!(
        log.iter()
            .any(|e| e.verb == "recreated" && e.name.as_deref() == Some("db-0"))
    );
}

#[tokio::test]
async fn deployment_pods_run() {
    let (_cluster, client) = start().await;
    add_nodes(&client, &[("n1", "us-east-1a"), ("n2", "us-east-1b")]).await;
    let deps: Api<Deployment> = Api::default_namespaced(client.clone());
    let dep: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
    }))
    .unwrap();
    deps.create(&PostParams::default(), &dep).await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let running = eventually("3 web pods Running", || async {
        let items = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items;
        let ready: Vec<Pod> = items.into_iter().filter(running_ready).collect();
        (ready.len() == 3).then_some(ready)
    })
    .await;
    for p in &running {
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "ReplicaSet");
        assert!(
            p.metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key("pod-template-hash")
        );
    }
    eventually("deployment available", || async {
        let s = deps.get("web").await.unwrap().status?;
        (s.available_replicas == Some(3)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn daemonset_runs_one_pod_per_eligible_node() {
    let (_cluster, client) = start().await;
    add_nodes(
        &client,
        &[
            ("n1", "us-east-1a"),
            ("n2", "us-east-1b"),
            ("n3", "us-east-1c"),
        ],
    )
    .await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch("n3", &PatchParams::default(), &Patch::Merge(json!({"spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}})))
        .await
        .unwrap();
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
                 "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [{"name": "c", "image": "agent"}]}}},
    }))
    .unwrap();
    dss.create(&PostParams::default(), &ds).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let on_nodes = eventually("agent on n1 and n2", || async {
        let items = pods
            .list(&ListParams::default().labels("app=agent"))
            .await
            .unwrap()
            .items;
        let mut nodes: Vec<String> = items
            .iter()
            .filter(|p| running_ready(p))
            .filter_map(|p| p.spec.as_ref()?.node_name.clone())
            .collect();
        nodes.sort();
        (nodes.len() == 2 && items.len() == 2).then_some(nodes)
    })
    .await;
    assert_eq!(on_nodes, vec!["n1", "n2"], "one pod per untainted node");
    eventually("daemonset status", || async {
        let s = dss.get("agent").await.unwrap().status?;
        (s.desired_number_scheduled == 2 && s.number_ready == 2).then_some(())
    })
    .await;
    // A new node gets its pod; a deleted node loses it.
    add_nodes(&client, &[("n4", "us-east-1a")]).await;
    eventually("agent on n4", || async {
        let items = pods
            .list(&ListParams::default().labels("app=agent"))
            .await
            .unwrap()
            .items;
        items
            .iter()
            .any(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("n4")
                    && running_ready(p)
            })
            .then_some(())
    })
    .await;
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    eventually("agent gone from n1", || async {
        let items = pods
            .list(&ListParams::default().labels("app=agent"))
            .await
            .unwrap()
            .items;
        (!items
            .iter()
            .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("n1")))
        .then_some(())
    })
    .await;
}

/// The DaemonSet controller gives its pods the `node.kubernetes.io/unschedulable:NoSchedule` toleration
/// (kubernetes `pkg/controller/daemon/util/daemonset_util.go` `AddOrUpdateDaemonPodTolerations`), so a
/// cordon does not keep them off: one evicted from a cordoned node is recreated there at once. A
/// NoSchedule taint it does not tolerate does keep the next one off, and the running one stays (only
/// NoExecute taints evict).
#[tokio::test]
async fn an_evicted_daemonset_pod_comes_back_on_a_cordoned_node_but_not_on_a_tainted_one() {
    let (_cluster, client) = start().await;
    add_nodes(&client, &[("n1", "us-east-1a"), ("n2", "us-east-1b")]).await;
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
                 "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [{"name": "c", "image": "agent"}]}}},
    }))
    .unwrap();
    dss.create(&PostParams::default(), &ds).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let on = |node: &'static str| {
        let pods = pods.clone();
        async move {
            pods.list(&ListParams::default().labels("app=agent"))
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
                .filter(|p| p.metadata.deletion_timestamp.is_none() && running_ready(p))
                .collect::<Vec<Pod>>()
        }
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let evict = |pod: Pod| {
        let pods = pods.clone();
        async move {
            let name = pod.metadata.name.clone().unwrap();
            pods.evict(&name, &Default::default())
                .await
                .expect("evicted");
            pod.metadata.uid.unwrap()
        }
    };
    // Cordoned: it comes back.
    let first = eventually("agent on n1", || async {
        on("n1").await.into_iter().next()
    })
    .await;
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    let old = evict(first).await;
    eventually("a new agent on cordoned n1", || async {
        on("n1")
            .await
            .into_iter()
            .find(|p| p.metadata.uid.as_deref() != Some(old.as_str()))
    })
    .await;
    // Tainted NoSchedule (as snapdrain does): the running pod stays, an evicted one does not return.
    let second = eventually("agent on n2", || async {
        on("n2").await.into_iter().next()
    })
    .await;
    nodes
        .patch(
            "n2",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true,
            "taints": [{"key": "snapdrain.io/draining", "effect": "NoSchedule"}]}})),
        )
        .await
        .unwrap();
    eventually("daemonset status sees n2 tainted", || async {
        let s = dss.get("agent").await.unwrap().status?;
        (s.observed_generation.is_some() && s.desired_number_scheduled == 2).then_some(())
    })
    .await;
    assert_eq!(
        on("n2").await.len(),
        1,
        "the running pod stays on the tainted node"
    );
    evict(second).await;
    eventually("daemonset status: n2 no longer scheduled", || async {
        let s = dss.get("agent").await.unwrap().status?;
        (s.desired_number_scheduled == 1 && s.current_number_scheduled == 1).then_some(())
    })
    .await;
    assert!(
        on("n2").await.is_empty(),
        "no agent comes back onto the tainted node"
    );
}

#[tokio::test]
async fn volume_attachment_exists_while_the_pod_runs() {
    let (cluster, client) = start().await;
    add_nodes(&client, &[("n1", "us-east-1a")]).await;
    let sets: Api<StatefulSet> = Api::default_namespaced(client.clone());
    sets.create(&PostParams::default(), &statefulset("pg", 1))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    eventually("pg-0 ready", || async {
        pods.get_opt("pg-0").await.unwrap().filter(running_ready)
    })
    .await;
    let pv = Api::<PersistentVolumeClaim>::default_namespaced(client.clone())
        .get("data-pg-0")
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .unwrap();
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let va = eventually("a VolumeAttachment for the volume", || async {
        vas.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|v| v.spec.source.persistent_volume_name.as_deref() == Some(pv.as_str()))
    })
    .await;
    assert_eq!(va.spec.node_name, "n1");
    assert_eq!(va.spec.attacher, "ebs.csi.aws.com");
    assert!(va.metadata.name.as_deref().unwrap().starts_with("csi-"));
    assert!(va.status.unwrap().attached);
    sets.patch(
        "pg",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 0}})),
    )
    .await
    .unwrap();
    eventually("pod gone", || async {
        pods.get_opt("pg-0").await.unwrap().is_none().then_some(())
    })
    .await;
    eventually("VolumeAttachment removed", || async {
        vas.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    let log = cluster.audit.since(0);
    let attached = log
        .iter()
        .position(|e| e.verb == "attached")
        .expect("attach audited");
    let detached = log
        .iter()
        .position(|e| e.verb == "detached")
        .expect("detach audited");
    let pod_gone = log
        .iter()
        .position(|e| e.verb == "deleted" && e.name.as_deref() == Some("pg-0"))
        .expect("pod deletion audited");
    assert!(
        attached < pod_gone && pod_gone < detached,
        "detached only after the pod left"
    );
}

#[tokio::test]
async fn deleting_a_statefulset_collects_its_pods_and_keeps_claims() {
    let (_cluster, client) = start().await;
    add_nodes(&client, &[("n1", "us-east-1a"), ("n2", "us-east-1a")]).await;
    let sets: Api<StatefulSet> = Api::default_namespaced(client.clone());
    sets.create(&PostParams::default(), &statefulset("kv", 2))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    eventually("kv-1 ready", || async {
        pods.get_opt("kv-1").await.unwrap().filter(running_ready)
    })
    .await;
    sets.delete("kv", &DeleteParams::default()).await.unwrap();
    eventually("kv pods collected", || async {
        pods.list(&ListParams::default().labels("app=kv"))
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    assert!(
        claims.get_opt("data-kv-0").await.unwrap().is_some(),
        "claims outlive their StatefulSet"
    );
}

#[tokio::test]
async fn a_pod_that_fits_nowhere_stays_pending_with_the_reason() {
    let (_cluster, client) = start().await;
    add_nodes(&client, &[("n1", "us-east-1a")]).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "huge"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "64"}}}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let cond = eventually("PodScheduled=False", || async {
        let p = pods.get("huge").await.unwrap();
        p.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
    })
    .await;
    assert_eq!(cond.reason.as_deref(), Some("Unschedulable"));
    assert!(cond.message.unwrap().contains("Insufficient cpu"));
    let p = pods.get("huge").await.unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    assert!(p.spec.unwrap().node_name.is_none());
}

#[tokio::test]
async fn pods_of_a_deleted_node_fail_and_go() {
    let (_cluster, client) = start().await;
    add_nodes(&client, &[("n1", "us-east-1a")]).await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "lone"},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually("lone running", || async {
        pods.get_opt("lone").await.unwrap().filter(running_ready)
    })
    .await;
    Api::<Node>::all(client.clone())
        .delete("n1", &DeleteParams::default())
        .await
        .unwrap();
    eventually("lone removed", || async {
        pods.get_opt("lone").await.unwrap().is_none().then_some(())
    })
    .await;
}

/// Names (`ns/name`) of objects, sorted.
fn names_of(objs: &[std::sync::Arc<serde_json::Value>]) -> Vec<String> {
    let mut v: Vec<String> = objs
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o.pointer("/metadata/namespace")
                    .and_then(|v| v.as_str())
                    .unwrap_or(""),
                o.pointer("/metadata/name")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
            )
        })
        .collect();
    v.sort();
    v
}

/// Whether every index lookup the world's controllers make (pods by node and by owner uid, nodes by
/// providerID) answers what a full scan of the store answers, for every value now present and for
/// the `extra` ones that objects have left.
fn indexes_agree_with_scan(store: &snapdrain_sim::apiserver::store::Store, extra: &[&str]) -> bool {
    use snapdrain_sim::apiserver::objects::{Field, NODE_PROVIDER_ID, POD_NODE};
    use snapdrain_sim::apiserver::resources::ResKey;
    let checks = [
        (ResKey::core("pods"), POD_NODE),
        (ResKey::core("pods"), Field::OwnerUid),
        (ResKey::core("nodes"), NODE_PROVIDER_ID),
    ];
    checks.iter().all(|(key, field)| {
        let (all, _) = store.snapshot(key);
        let mut values: std::collections::BTreeSet<String> = all
            .iter()
            .flat_map(|o| field.values(o))
            .map(str::to_string)
            .collect();
        values.extend(extra.iter().map(|s| s.to_string()));
        values.iter().all(|v| {
            let scan: Vec<_> = all
                .iter()
                .filter(|o| field.values(o).contains(&v.as_str()))
                .cloned()
                .collect();
            names_of(&store.by_field(key, *field, v)) == names_of(&scan)
        })
    })
}

/// The store's indexes (which the kubelet-free lookups of the simulated Karpenter use instead of
/// scanning 150,000 pods) follow objects that move between nodes, owners and namespaces, and that are
/// deleted and recreated under the same name; a list, served from the store's per-object JSON cache,
/// shows each write at once. Compared against a full scan of the store, not against expectations
/// computed by the index's own code.
#[tokio::test]
async fn store_indexes_and_list_cache_follow_moves_deletes_and_recreates() {
    use snapdrain_sim::apiserver::objects::{Field, NODE_PROVIDER_ID, POD_NODE};
    use snapdrain_sim::apiserver::resources::ResKey;
    let (cluster, client) = start().await;
    let store = cluster.store.clone();
    let pods_key = ResKey::core("pods");
    add_nodes(&client, &[("n1", "us-east-1a"), ("n2", "us-east-1b")]).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap(),
        )
        .await
        .unwrap();
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::default_namespaced(client.clone());
    let mut owner_uids = Vec::new();
    for name in ["owner-a", "owner-b"] {
        let cm = cms
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
            )
            .await
            .unwrap();
        owner_uids.push(cm.metadata.uid.unwrap());
    }
    let owner_ref = |i: usize| {
        let name = ["owner-a", "owner-b"][i];
        json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": owner_uids[i]}])
    };
    let pod_on = |name: &str, node: &str, owners: serde_json::Value| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "ownerReferences": owners},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
        }))
        .unwrap()
    };
    let default_pods: Api<Pod> = Api::default_namespaced(client.clone());
    let other_pods: Api<Pod> = Api::namespaced(client.clone(), "other");
    // The world's own pods too: a StatefulSet's, placed by the scheduler.
    Api::<StatefulSet>::default_namespaced(client.clone())
        .create(&PostParams::default(), &statefulset("db", 2))
        .await
        .unwrap();
    default_pods
        .create(&PostParams::default(), &pod_on("mover", "n1", owner_ref(0)))
        .await
        .unwrap();
    eventually("mover running on n1", || async {
        default_pods
            .get_opt("mover")
            .await
            .unwrap()
            .filter(running_ready)
    })
    .await;
    let first = store.list(&pods_key, None, &|_| true, None, None);
    assert!(names_of(&first.items).contains(&"default/mover".to_string()));

    // Moved between owners (ownerReferences are mutable), then between nodes and namespaces by
    // deletion and recreation under the same name.
    default_pods
        .patch(
            "mover",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": owner_ref(1), "labels": {"step": "owner-b"}}})),
        )
        .await
        .unwrap();
    let listed = default_pods
        .list(&ListParams::default().labels("step=owner-b"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1, "the list shows the write at once");
    assert_eq!(
        listed.items[0].metadata.owner_references.as_ref().unwrap()[0].uid,
        owner_uids[1]
    );
    default_pods
        .delete("mover", &DeleteParams::default())
        .await
        .unwrap();
    eventually("mover gone", || async {
        default_pods
            .get_opt("mover")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    default_pods
        .create(&PostParams::default(), &pod_on("mover", "n2", owner_ref(0)))
        .await
        .unwrap();
    other_pods
        .create(&PostParams::default(), &pod_on("mover", "n1", json!([])))
        .await
        .unwrap();

    // A node deleted and recreated under the same name with another instance behind it.
    let nodes: Api<Node> = Api::all(client.clone());
    let node_with = |pid: &str| -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n3", "labels": {"topology.kubernetes.io/zone": "us-east-1a"}},
            "spec": {"providerID": pid},
        }))
        .unwrap()
    };
    nodes
        .create(
            &PostParams::default(),
            &node_with("aws:///us-east-1a/i-old"),
        )
        .await
        .unwrap();
    nodes.delete("n3", &DeleteParams::default()).await.unwrap();
    eventually("n3 gone", || async {
        nodes.get_opt("n3").await.unwrap().is_none().then_some(())
    })
    .await;
    nodes
        .create(
            &PostParams::default(),
            &node_with("aws:///us-east-1a/i-new"),
        )
        .await
        .unwrap();

    let gone = [
        "aws:///us-east-1a/i-old",
        "n3",
        owner_uids[1].as_str(),
        owner_uids[0].as_str(),
    ];
    eventually("indexes agree with a full scan", || async {
        indexes_agree_with_scan(&store, &gone).then_some(())
    })
    .await;
    let on = |node: &str| names_of(&store.by_field(&pods_key, POD_NODE, node));
    assert!(on("n2").contains(&"default/mover".to_string()));
    assert!(!on("n1").contains(&"default/mover".to_string()));
    assert!(on("n1").contains(&"other/mover".to_string()));
    let owned = |i: usize| names_of(&store.by_field(&pods_key, Field::OwnerUid, &owner_uids[i]));
    assert_eq!(owned(0), vec!["default/mover".to_string()]);
    assert!(owned(1).is_empty());
    let node_key = ResKey::core("nodes");
    assert!(
        store
            .by_field(&node_key, NODE_PROVIDER_ID, "aws:///us-east-1a/i-old")
            .is_empty()
    );
    assert_eq!(
        names_of(&store.by_field(&node_key, NODE_PROVIDER_ID, "aws:///us-east-1a/i-new")),
        vec!["/n3".to_string()]
    );
    // A full list (cached JSON per object) shows every pod as a GET of it does, once the world is quiet.
    let all_pods: Api<Pod> = Api::all(client.clone());
    eventually("full list matches GETs", || async {
        let list = all_pods.list(&ListParams::default()).await.unwrap();
        for p in &list.items {
            let api: Api<Pod> =
                Api::namespaced(client.clone(), p.metadata.namespace.as_deref().unwrap());
            let got = api
                .get_opt(p.metadata.name.as_deref().unwrap())
                .await
                .unwrap()?;
            if serde_json::to_value(&got).unwrap() != serde_json::to_value(p).unwrap() {
                return None;
            }
        }
        Some(())
    })
    .await;
}
