//! The controller's shared caches (crates/snapdrain/src/controller/cache) against the simulated API
//! server: they stay exact across a watch outage that ends in 410 Gone, and a plan reads them instead of
//! listing. The simulator's watches model kube-apiserver's: a dropped watch resumes from its
//! resourceVersion, and one older than the compacted history gets a 410 ERROR event
//! (kubernetes apiserver pkg/storage/cacher watch_cache.go, "too old resource version"), after which
//! kube-runtime's watcher relists (kube-runtime watcher.rs, `err.code == 410` -> `State::default()`).

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use snapdrain::api::status::PlanPhase;
use snapdrain::controller::ControllerHandle;
use snapdrain::controller::run::RunOptions;
use snapdrain_sim::apiserver::auth::rbac::Attributes;
use snapdrain_sim::apiserver::faults::FaultRule;
use snapdrain_testkit::harness::{Harness, TIMEOUT};
use snapdrain_testkit::{eventually, eventually_within, raw_client};

/// The kinds the controller caches; a plan must make no list call for them once the caches are synced.
const CACHED: &[&str] = &[
    "pods",
    "persistentvolumeclaims",
    "statefulsets",
    "poddisruptionbudgets",
    "volumeattachments",
    "nodes",
];

/// The controller's identity: requests of a user outside system:masters are recorded by the simulator's
/// authorizer (with RBAC off here), which is how a test sees the controller's reads.
const USER: &str = "system:serviceaccount:snapdrain:cache-test";

/// A controller (one replica) whose requests the simulator records: it runs with a ServiceAccount
/// token, with authorization turned off so no role is needed.
async fn recorded_controller(h: &Harness) -> ControllerHandle {
    h.cluster.auth().set_enforced(false);
    let token = h.cluster.auth().issue("snapdrain", "cache-test");
    let mut config = h.kube_config();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    snapdrain::controller::start(
        config,
        h.settings("snapdrain-0"),
        RunOptions {
            lease_namespace: None,
            ..RunOptions::default()
        },
    )
    .await
    .expect("the controller starts")
}

/// The controller's list requests of cached kinds from the `since`-th recorded request on.
fn cached_lists(h: &Harness, since: usize) -> Vec<String> {
    h.cluster
        .auth()
        .decisions()
        .into_iter()
        .skip(since)
        .filter(|d| d.user.name == USER)
        .filter_map(|d| match d.attributes {
            Attributes::Resource {
                verb,
                resource,
                namespace,
                subresource: None,
                ..
            } if verb == "list" && CACHED.contains(&resource.as_str()) => {
                Some(format!("{resource} {namespace:?}"))
            }
            _ => None,
        })
        .collect()
}

/// A sample of the controller's own metrics: `name{kind="kind"}`.
fn metric(c: &ControllerHandle, name: &str, kind: &str) -> Option<u64> {
    let prefix = format!("{name}{{kind=\"{kind}\"}} ");
    c.metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()).map(str::to_owned))
        .and_then(|v| v.trim().parse().ok())
}

async fn sim(h: &Harness, path: &str) {
    let url = format!("{}{path}", h.cluster.api.url());
    let r = raw_client(h.cluster.ca_pem())
        .post(&url)
        .send()
        .await
        .expect("reach the simulator");
    assert!(r.status().is_success(), "POST {path}: {}", r.status());
}

/// A StatefulSet like the quickstart's postgres (a PVC per pod, file-system backup of `data`), named
/// `name`, with `replicas` pods pinned to `node`.
async fn pinned_statefulset(h: &Harness, name: &str, node: &str, replicas: i32) {
    let api: Api<StatefulSet> = Api::namespaced(h.client.clone(), "shop");
    let postgres = api
        .get("postgres")
        .await
        .expect("the quickstart's postgres");
    let mut v = serde_json::to_value(&postgres).expect("a StatefulSet serializes");
    v["metadata"] = json!({"name": name, "namespace": "shop", "labels": {"app": name}});
    if let Some(o) = v.as_object_mut() {
        o.remove("status");
    }
    v["spec"]["replicas"] = json!(replicas);
    v["spec"]["selector"] = json!({"matchLabels": {"app": name}});
    v["spec"]["template"]["metadata"]["labels"] = json!({"app": name});
    let pod_spec = &mut v["spec"]["template"]["spec"];
    if let Some(o) = pod_spec.as_object_mut() {
        o.remove("affinity");
    }
    pod_spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    let sts: StatefulSet = serde_json::from_value(v).expect("the copy is a StatefulSet");
    api.create(&PostParams::default(), &sts)
        .await
        .expect("create the StatefulSet");
}

async fn scale(h: &Harness, name: &str, replicas: i32) {
    let api: Api<StatefulSet> = Api::namespaced(h.client.clone(), "shop");
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": replicas}})),
    )
    .await
    .expect("scale the StatefulSet");
}

/// The uid of pod `name` once it runs on `node`.
async fn running_on(h: &Harness, name: &str, node: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    eventually_within(
        &format!("pod {name} running on {node}"),
        TIMEOUT,
        || async {
            let p = pods.get_opt(name).await.ok().flatten()?;
            let here = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            (here && running).then(|| p.uid().unwrap_or_default())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_after_a_watch_outage_and_a_410_sees_exactly_the_current_pods_without_listing() {
    let h = Harness::start().await;
    let c = recorded_controller(&h).await;
    let node = h.node_with_statefulset_pods().await;
    pinned_statefulset(&h, "olddb", &node, 1).await;
    pinned_statefulset(&h, "newdb", &node, 0).await;
    let old_uid = running_on(&h, "olddb-0", &node).await;
    let pods: Api<Pod> = Api::all(h.client.clone());
    eventually("the pod cache holds every pod", || async {
        let n = pods.list(&Default::default()).await.ok()?.items.len() as u64;
        (metric(&c, "snapdrain_cache_objects", "Pod") == Some(n)).then_some(())
    })
    .await;
    let lists = metric(&c, "snapdrain_cache_lists_total", "Pod").expect("the pod cache synced");

    // The outage: every pod watch is cut and cannot come back, while one protected pod goes and
    // another arrives; then the history is compacted, so resuming gets 410 Gone.
    h.cluster.faults.add(FaultRule {
        verb: Some("watch".into()),
        resource: Some("pods".into()),
        error_rate: 1.0,
        error_code: Some(500),
        ..FaultRule::default()
    });
    sim(&h, "/sim/watches/drop").await;
    scale(&h, "olddb", 0).await;
    scale(&h, "newdb", 1).await;
    let new_uid = running_on(&h, "newdb-0", &node).await;
    let shop: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    eventually("olddb-0 is gone", || async {
        shop.get_opt("olddb-0").await.ok()?.is_none().then_some(())
    })
    .await;
    sim(&h, "/sim/watches/compact").await;
    h.cluster.faults.set(Vec::new());
    eventually_within("the pod cache relists after the 410", TIMEOUT, || async {
        (metric(&c, "snapdrain_cache_lists_total", "Pod")? > lists).then_some(())
    })
    .await;

    let since = h.cluster.auth().decisions().len();
    h.create_plan(
        "after-outage",
        json!({"nodes": [node], "termination": {"terminateInstance": false, "deleteNode": false}}),
    )
    .await;
    let plan = h
        .wait_plan("after-outage", TIMEOUT, |p| p.is_terminal())
        .await;
    let status = plan.status.clone().expect("a finished plan has a status");
    assert_eq!(status.phase, PlanPhase::Completed, "{status:#?}");
    let backed_up: BTreeSet<String> = status
        .backups
        .iter()
        .filter(|b| b.namespace == "shop")
        .flat_map(|b| b.pods.clone())
        .collect();
    assert!(
        backed_up.contains("newdb-0"),
        "the protected pod created during the outage is backed up: {backed_up:?}"
    );
    assert!(
        !backed_up.contains("olddb-0"),
        "the pod deleted during the outage is not in the plan: {backed_up:?}"
    );
    let targets: Vec<String> = status.nodes[0]
        .eviction_targets
        .iter()
        .flatten()
        .map(|t| t.uid.clone())
        .collect();
    assert!(targets.contains(&new_uid), "{targets:?}");
    assert!(!targets.contains(&old_uid), "{targets:?}");

    // Every read of pods, PVCs, StatefulSets, PDBs, VolumeAttachments and Nodes came from the caches
    // (before them, this plan listed them once per pass and namespace).
    assert!(
        !cached_lists(&h, 0).is_empty(),
        "the caches' own first lists are recorded (the count below means something)"
    );
    let lists = cached_lists(&h, since);
    assert!(lists.is_empty(), "one plan listed cached kinds: {lists:?}");
    c.shutdown().await;
}

/// A lenient LIST (the plans read for backup reuse and for pods new on a released node) goes a page at
/// a time, as client-go's pager does, so its responses stay bounded however many plans the cluster
/// keeps; every object comes back once. The pages are counted by the simulator's authorizer, which
/// records the requests of a user outside system:masters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lenient_lists_go_a_page_at_a_time() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use snapdrain::api::lenient::{LIST_PAGE, list_decoded};
    use snapdrain_sim::{SimCluster, SimConfig};
    let sim = SimCluster::start(SimConfig::default())
        .await
        .expect("the simulated API server starts");
    let admin = kube::Client::try_from(sim.kube_config()).expect("a kube client");
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let n = LIST_PAGE as usize * 2 + 7;
    for i in 0..n {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("cm-{i:04}")}}))
                .expect("a ConfigMap");
        cms.create(&PostParams::default(), &cm)
            .await
            .expect("create");
    }
    let all = list_decoded::<ConfigMap>(&admin).await.expect("list").len();
    assert!(all >= n, "{all}");
    sim.auth().set_enforced(false);
    let token = sim.auth().issue("snapdrain", "pager");
    let mut config = sim.kube_config();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let client = kube::Client::try_from(config).expect("a kube client");
    let listed = list_decoded::<ConfigMap>(&client).await.expect("list");
    let names: BTreeSet<String> = listed.iter().map(|c| c.name_any()).collect();
    assert_eq!(listed.len(), all);
    assert_eq!(names.len(), listed.len(), "every object once");
    let pages = sim
        .auth()
        .decisions()
        .into_iter()
        .filter(|d| d.user.name == "system:serviceaccount:snapdrain:pager")
        .filter(|d| {
            matches!(&d.attributes, Attributes::Resource { verb, resource, .. }
                if verb == "list" && resource == "configmaps")
        })
        .count();
    assert_eq!(pages, all.div_ceil(LIST_PAGE as usize), "pages");
}
