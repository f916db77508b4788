//! kube-rs 5 (Api, watcher, reflector, Controller) against the in-process simulated API server, and raw
//! HTTP with bad input.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, DeleteParams, DynamicObject, EvictParams, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, CustomResource, CustomResourceExt, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use snapdrain_sim::SimCluster;
use snapdrain_sim::apiserver::faults::FaultRule;
use snapdrain_testkit::{data, eventually, raw_client, start_cluster};

fn client(cluster: &SimCluster) -> Client {
    let config = cluster.kube_config();
    Client::try_from(config).expect("kube client")
}

fn configmap(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name,
        "labels": labels.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>()},
        "data": {"k": "v"}}))
    .expect("ConfigMap")
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": "db"}},
        "spec": {"containers": [{"name": "main", "image": "postgres:16"}, {"name": "sidecar", "image": "envoy:1"}]}}))
    .expect("Pod")
}

/// The API error inside a kube error, or a test failure.
fn status(err: kube::Error) -> kube::core::Status {
    match err {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "test.snapdrain.io",
    version = "v1",
    kind = "Greeting",
    namespaced,
    status = "GreetingStatus"
)]
pub struct GreetingSpec {
    pub message: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct GreetingStatus {
    pub rendered: Option<String>,
}

async fn install_greeting_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Greeting::crd())
        .await
        .expect("CRD created");
}

/// Loads a fixture CRD (YAML, possibly with a comment header) and creates it.
async fn install_fixture_crd(client: &Client, file: &str) {
    let text = std::fs::read_to_string(data(file)).expect("fixture");
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).expect("CRD YAML");
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd)
        .await
        .expect("fixture CRD created");
}

#[tokio::test]
async fn crud_on_core_and_custom_kinds() {
    let cluster = start_cluster().await;
    let client = client(&cluster);
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let created = cms
        .create(&PostParams::default(), &configmap("one", &[("a", "b")]))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some() && created.metadata.resource_version.is_some());
    let mut got = cms.get("one").await.unwrap();
    assert_eq!(got.data.as_ref().unwrap()["k"], "v");
    got.data.as_mut().unwrap().insert("k".into(), "w".into());
    let replaced = cms
        .replace("one", &PostParams::default(), &got)
        .await
        .unwrap();
    assert_eq!(replaced.data.unwrap()["k"], "w");
    assert_eq!(
        cms.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    cms.delete("one", &DeleteParams::default()).await.unwrap();
    assert!(cms.get_opt("one").await.unwrap().is_none());

    // A typed custom resource.
    install_greeting_crd(&client).await;
    let greetings: Api<Greeting> = Api::default_namespaced(client.clone());
    let g = Greeting::new(
        "hello",
        GreetingSpec {
            message: "hi".into(),
        },
    );
    let g = greetings.create(&PostParams::default(), &g).await.unwrap();
    assert_eq!(g.meta().generation, Some(1));
    let list = greetings.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items[0].spec.message, "hi");
    greetings
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();

    // A real CRD from the fixtures, used through the dynamic API with the fixture example.
    install_fixture_crd(&client, "crds/velero.io_backups.yaml").await;
    let ns = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "velero"}})).unwrap(),
    )
    .await
    .unwrap();
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("velero.io", "v1", "Backup"));
    let backups: Api<DynamicObject> = Api::namespaced_with(client.clone(), "velero", &ar);
    let mut backup: DynamicObject =
        serde_json::from_str(&std::fs::read_to_string(data("velero-backup.example.json")).unwrap())
            .unwrap();
    backup.metadata.resource_version = None;
    backup.metadata.uid = None;
    let created = backups
        .create(&PostParams::default(), &backup)
        .await
        .unwrap();
    assert_eq!(created.data["spec"]["includedNamespaces"], json!(["db"]));
    // Velero's Backup CRD declares no status subresource: the status is part of the object.
    assert_eq!(created.data["status"]["phase"], "Completed");
    let name = created.name_any();
    let err = status(
        backups
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 404);
    backups
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();

    // Karpenter's NodeClaim does: create drops the status, which is then written through `/status`.
    install_fixture_crd(&client, "crds/karpenter.sh_nodeclaims.yaml").await;
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim"));
    let claims: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let mut claim: DynamicObject =
        serde_saphyr::from_str(&std::fs::read_to_string(data("karpenter-nodeclaim.yaml")).unwrap())
            .unwrap();
    claim.metadata.resource_version = None;
    claim.metadata.uid = None;
    let created = claims.create(&PostParams::default(), &claim).await.unwrap();
    assert!(created.data.get("status").is_none());
    let status_only =
        json!({"status": claim.data["status"].clone(), "spec": {"expireAfter": "1h"}});
    let patched = claims
        .patch_status(
            "default-x9wxq",
            &PatchParams::default(),
            &Patch::Merge(status_only),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.data["status"]["nodeName"],
        claim.data["status"]["nodeName"]
    );
    assert_eq!(
        patched.data["spec"]["expireAfter"], "720h0m0s",
        "status writes leave spec alone"
    );
}

#[tokio::test]
async fn stale_replace_conflicts() {
    let cluster = start_cluster().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&cluster));
    let stale = cms
        .create(&PostParams::default(), &configmap("c", &[]))
        .await
        .unwrap();
    let mut fresh = stale.clone();
    fresh.data = Some([("k".to_string(), "fresh".to_string())].into());
    cms.replace("c", &PostParams::default(), &fresh)
        .await
        .unwrap();
    let err = status(
        cms.replace("c", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message.contains("the object has been modified"),
        "{}",
        err.message
    );
    assert_eq!(cms.get("c").await.unwrap().data.unwrap()["k"], "fresh");
}

/// Server-side apply with `metadata.resourceVersion` set is a precondition, as for an update: the
/// patched object keeps the applied resourceVersion and storage's GuaranteedUpdate refuses a stale one
/// (kubernetes/kubernetes#63104, `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go`).
#[tokio::test]
async fn server_side_apply_with_a_stale_resource_version_conflicts() {
    let cluster = start_cluster().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&cluster));
    let created = cms
        .create(&PostParams::default(), &configmap("c", &[]))
        .await
        .unwrap();
    let stale = created.resource_version().unwrap();
    let apply = |rv: &str, v: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "c", "resourceVersion": rv}, "data": {"applied": v}})
    };
    let pp = PatchParams::apply("test");
    let fresh = cms
        .patch("c", &pp, &Patch::Apply(apply(&stale, "first")))
        .await
        .expect("the current resourceVersion applies");
    let err = status(
        cms.patch("c", &pp, &Patch::Apply(apply(&stale, "stale")))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message.contains("the object has been modified"),
        "{}",
        err.message
    );
    assert_eq!(
        cms.get("c").await.unwrap().data.unwrap()["applied"],
        "first"
    );
    // Without a resourceVersion, no precondition.
    let unconditional = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c"}, "data": {"applied": "any"}});
    cms.patch("c", &pp, &Patch::Apply(unconditional))
        .await
        .expect("no precondition");
    assert_ne!(fresh.resource_version(), None);
}

#[tokio::test]
async fn patches_of_every_kind() {
    let cluster = start_cluster().await;
    let client = client(&cluster);
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("db-0"))
        .await
        .unwrap();
    let pp = PatchParams::default();

    let p = pods
        .patch(
            "db-0",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "data", "app": null}}})),
        )
        .await
        .unwrap();
    assert_eq!(p.labels().get("tier").map(String::as_str), Some("data"));
    assert!(!p.labels().contains_key("app"));

    let ops: json_patch::Patch = serde_json::from_value(
        json!([{"op": "add", "path": "/metadata/annotations", "value": {"a": "1"}},
               {"op": "replace", "path": "/spec/containers/1/image", "value": "envoy:2"}]),
    )
    .unwrap();
    let p = pods
        .patch("db-0", &pp, &Patch::Json::<()>(ops))
        .await
        .unwrap();
    assert_eq!(p.annotations()["a"], "1");
    assert_eq!(
        p.spec.as_ref().unwrap().containers[1].image.as_deref(),
        Some("envoy:2")
    );

    // Server-side apply with force: creates, then updates the fields the manager owns.
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let apply = PatchParams::apply("snapdrain-test").force();
    let cm = cms
        .patch(
            "applied",
            &apply,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "applied"}, "data": {"x": "1", "y": "2"}})),
        )
        .await
        .unwrap();
    assert_eq!(cm.data.as_ref().unwrap()["x"], "1");
    let cm = cms
        .patch(
            "applied",
            &apply,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "applied"}, "data": {"x": "3", "y": "2"}})),
        )
        .await
        .unwrap();
    assert_eq!(cm.data.as_ref().unwrap()["x"], "3");

    // Patching something that does not exist is a 404 (except apply, which creates).
    let err = status(
        cms.patch("missing", &pp, &Patch::Merge(json!({"data": {}})))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 404);
    // Apply without a field manager is refused.
    let err = status(
        cms.patch(
            "applied",
            &PatchParams::default(),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}}),
            ),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 400);
}

/// Needs the strategic merge implementation in `patch/` (merge keys from the built-in schemas).
#[tokio::test]
async fn strategic_merge_patch_merges_lists_by_key() {
    let cluster = start_cluster().await;
    let pods: Api<Pod> = Api::default_namespaced(client(&cluster));
    pods.create(&PostParams::default(), &pod("db-0"))
        .await
        .unwrap();
    let pp = PatchParams::default();
    // Strategic merge: containers merge by name, so the sidecar stays.
    let p = pods
        .patch(
            "db-0",
            &pp,
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "main", "image": "postgres:17"}]}}),
            ),
        )
        .await
        .unwrap();
    let containers = &p.spec.as_ref().unwrap().containers;
    assert_eq!(containers.len(), 2, "strategic merge must keep the sidecar");
    assert_eq!(containers[0].image.as_deref(), Some("postgres:17"));
}

#[tokio::test]
async fn finalizers_hold_deletion_until_the_last_is_removed() {
    let cluster = start_cluster().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&cluster));
    let mut cm = configmap("held", &[]);
    cm.metadata.finalizers = Some(vec!["a.io/one".into(), "b.io/two".into()]);
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let deleted = cms.delete("held", &DeleteParams::default()).await.unwrap();
    let marked = deleted.left().expect("a finalizer keeps the object");
    assert!(marked.metadata.deletion_timestamp.is_some());
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["b.io/two"]}})),
    )
    .await
    .unwrap();
    assert!(
        cms.get("held")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(cms.get_opt("held").await.unwrap().is_none());
}

async fn names(store: &reflector::Store<ConfigMap>) -> BTreeSet<String> {
    store.state().iter().map(|c| c.name_any()).collect()
}

async fn server_names(cms: &Api<ConfigMap>) -> BTreeSet<String> {
    cms.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect()
}

#[tokio::test]
async fn reflector_converges_across_a_forced_410() {
    let cluster = start_cluster().await;
    let client = client(&cluster);
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    for i in 0..3 {
        cms.create(
            &PostParams::default(),
            &configmap(&format!("before-{i}"), &[]),
        )
        .await
        .unwrap();
    }
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(cms.clone(), watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let task = tokio::spawn(async move {
        // Errors (the 410 and the injected 503s) are retried by the watcher itself.
        stream.for_each(|_| async {}).await;
    });
    tokio::time::timeout(snapdrain_testkit::WAIT, reader.wait_until_ready())
        .await
        .expect("reflector syncs")
        .unwrap();
    eventually("the first objects in the store", || async {
        (names(&reader).await == server_names(&cms).await).then_some(())
    })
    .await;

    // Cut the watch and keep it down while objects change and history is compacted, so the watcher's
    // resourceVersion is too old when it comes back: it gets 410 Gone and must re-list.
    cluster.faults.set(vec![FaultRule {
        verb: Some("watch".into()),
        resource: Some("configmaps".into()),
        error_rate: 1.0,
        error_code: Some(503),
        ..Default::default()
    }]);
    let http = raw_client(cluster.ca_pem());
    let sim = |p: &str| format!("{}/sim/watches/{p}", cluster.url());
    assert!(
        http.post(sim("drop"))
            .send()
            .await
            .unwrap()
            .status()
            .is_success()
    );
    cms.delete("before-0", &DeleteParams::default())
        .await
        .unwrap();
    for i in 0..3 {
        cms.create(
            &PostParams::default(),
            &configmap(&format!("during-{i}"), &[]),
        )
        .await
        .unwrap();
    }
    assert!(
        http.post(sim("compact"))
            .send()
            .await
            .unwrap()
            .status()
            .is_success()
    );
    cluster.faults.set(Vec::new());

    let want = server_names(&cms).await;
    assert!(want.contains("during-2") && !want.contains("before-0"));
    eventually(
        "the reflector store to match the server after 410",
        || async { (names(&reader).await == want).then_some(()) },
    )
    .await;

    // And it keeps following live changes.
    cms.create(&PostParams::default(), &configmap("after", &[]))
        .await
        .unwrap();
    eventually("the live change", || async {
        names(&reader).await.contains("after").then_some(())
    })
    .await;
    task.abort();
}

struct Ctx {
    client: Client,
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct ReconcileError(#[from] kube::Error);

async fn reconcile(g: Arc<Greeting>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let ns = g.namespace().unwrap_or_default();
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let owner = g.controller_owner_ref(&()).expect("Greeting has a uid");
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("{}-rendered", g.name_any()), "ownerReferences": [owner]},
        "data": {"message": g.spec.message}});
    cms.patch(
        &format!("{}-rendered", g.name_any()),
        &PatchParams::apply("greeting-controller").force(),
        &Patch::Apply(cm),
    )
    .await?;
    let greetings: Api<Greeting> = Api::namespaced(ctx.client.clone(), &ns);
    greetings
        .patch_status(
            &g.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"rendered": g.spec.message}})),
        )
        .await?;
    Ok(Action::await_change())
}

fn error_policy(_: Arc<Greeting>, _: &ReconcileError, _: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_millis(200))
}

#[tokio::test]
async fn controller_reconciles_owned_configmaps() {
    let cluster = start_cluster().await;
    let client = client(&cluster);
    install_greeting_crd(&client).await;
    let greetings: Api<Greeting> = Api::default_namespaced(client.clone());
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let controller = Controller::new(greetings.clone(), watcher::Config::default())
        .owns(cms.clone(), watcher::Config::default())
        .run(
            reconcile,
            error_policy,
            Arc::new(Ctx {
                client: client.clone(),
            }),
        )
        .for_each(|_| async {});
    let task = tokio::spawn(controller);

    greetings
        .create(
            &PostParams::default(),
            &Greeting::new(
                "hello",
                GreetingSpec {
                    message: "hi".into(),
                },
            ),
        )
        .await
        .unwrap();
    let rendered = |want: &'static str| {
        let cms = cms.clone();
        let greetings = greetings.clone();
        async move {
            let cm = cms.get_opt("hello-rendered").await.unwrap()?;
            let g = greetings.get("hello").await.unwrap();
            let done = cm.data.as_ref()?.get("message").map(String::as_str) == Some(want)
                && g.status.as_ref()?.rendered.as_deref() == Some(want);
            done.then_some(cm)
        }
    };
    let cm = eventually("the first reconcile", || rendered("hi")).await;
    assert_eq!(cm.owner_references()[0].name, "hello");
    greetings
        .patch(
            "hello",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"message": "bye"}})),
        )
        .await
        .unwrap();
    eventually("the reconcile after a spec change", || rendered("bye")).await;
    // Deleting the owned ConfigMap triggers a reconcile of its owner, which recreates it.
    cms.delete("hello-rendered", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the owned ConfigMap to come back", || rendered("bye")).await;
    task.abort();
}

#[tokio::test]
async fn list_pages_and_selectors() {
    let cluster = start_cluster().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client(&cluster));
    for i in 0..7 {
        let tier = if i % 2 == 0 { "even" } else { "odd" };
        cms.create(
            &PostParams::default(),
            &configmap(&format!("cm-{i}"), &[("tier", tier)]),
        )
        .await
        .unwrap();
    }
    let mut seen = Vec::new();
    let mut lp = ListParams::default().limit(3);
    let mut pages = 0;
    loop {
        let page = cms.list(&lp).await.unwrap();
        pages += 1;
        assert!(page.items.len() <= 3);
        seen.extend(page.items.iter().map(|c| c.name_any()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, (0..7).map(|i| format!("cm-{i}")).collect::<Vec<_>>());

    let even = cms
        .list(&ListParams::default().labels("tier=even"))
        .await
        .unwrap();
    assert_eq!(even.items.len(), 4);
    let not_even = cms
        .list(&ListParams::default().labels("tier!=even,tier"))
        .await
        .unwrap();
    assert_eq!(not_even.items.len(), 3);
    let one = cms
        .list(&ListParams::default().fields("metadata.name=cm-3"))
        .await
        .unwrap();
    assert_eq!(one.items.len(), 1);
    assert_eq!(one.items[0].name_any(), "cm-3");
    let err = status(
        cms.list(&ListParams::default().continue_token("garbage!"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);
}

#[tokio::test]
async fn evict_removes_an_unprotected_pod() {
    let cluster = start_cluster().await;
    let pods: Api<Pod> = Api::default_namespaced(client(&cluster));
    pods.create(&PostParams::default(), &pod("victim"))
        .await
        .unwrap();
    let st = pods.evict("victim", &EvictParams::default()).await.unwrap();
    assert_eq!(st.code, 201);
    eventually("the evicted pod to be gone", || async {
        pods.get_opt("victim")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let err = status(
        pods.evict("victim", &EvictParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 404);
}

#[tokio::test]
async fn api_errors_are_status_objects() {
    let cluster = start_cluster().await;
    let client = client(&cluster);
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let err = status(cms.get("nope").await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));
    assert_eq!(err.message, "configmaps \"nope\" not found");

    cms.create(&PostParams::default(), &configmap("dup", &[]))
        .await
        .unwrap();
    let err = status(
        cms.create(&PostParams::default(), &configmap("dup", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));

    let err = status(
        cms.create(&PostParams::default(), &configmap("Not_Valid", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    let causes = err.details.expect("details").causes;
    assert!(
        causes.iter().any(|c| c.field == "metadata.name"),
        "{causes:?}"
    );

    // Lower-level requests through the same client.
    let raw = |method: &str, path: &str, ct: &str, body: &'static str| {
        http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", ct)
            .body(body.as_bytes().to_vec())
            .unwrap()
    };
    let cases = [
        (
            raw(
                "POST",
                "/api/v1/namespaces/default/configmaps",
                "application/json",
                "{not json",
            ),
            400,
        ),
        (
            raw(
                "PUT",
                "/api/v1/namespaces/default/configmaps",
                "application/json",
                "{}",
            ),
            405,
        ),
        (
            raw(
                "PATCH",
                "/api/v1/namespaces/default/configmaps/dup",
                "text/plain",
                "{}",
            ),
            415,
        ),
    ];
    for (req, code) in cases {
        let err = status(client.request::<Value>(req).await.unwrap_err());
        assert_eq!(err.code, code, "{err:?}");
    }
}

/// Raw HTTP: every bad request gets a Status with the right code, quickly, and the server stays up.
#[tokio::test]
async fn bad_input_gets_status_errors_not_hangs() {
    let cluster = start_cluster().await;
    let http = raw_client(cluster.ca_pem());
    let url = |p: &str| format!("{}{p}", cluster.url());
    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (
            http.post(url("/api/v1/namespaces/default/configmaps"))
                .header("content-type", "application/json")
                .body("{\"metadata\": {\"name\": "),
            400,
            "BadRequest",
        ),
        (
            http.post(url("/api/v1/namespaces/default/configmaps"))
                .header("content-type", "application/json"),
            400,
            "BadRequest",
        ),
        (http.get(url("/api/v1/widgets")), 404, "NotFound"),
        (http.get(url("/apis/nope.io/v1/things/x")), 404, "NotFound"),
        (
            http.get(url("/api/v1/namespaces/default/pods/a/b/c/d")),
            404,
            "NotFound",
        ),
        (
            http.put(url("/api/v1/namespaces/default/configmaps"))
                .header("content-type", "application/json")
                .body("{}"),
            405,
            "MethodNotAllowed",
        ),
        (
            http.patch(url("/api/v1/namespaces/default/configmaps/x"))
                .header("content-type", "application/xml")
                .body("<x/>"),
            415,
            "UnsupportedMediaType",
        ),
        (
            http.post(url("/api/v1/namespaces/default/configmaps"))
                .header("content-type", "application/vnd.kubernetes.protobuf")
                .body(vec![0x6b, 0x38, 0x73, 0x00]),
            // The protobuf prefix with nothing after it: apimachinery `protobuf.go` "empty body".
            400,
            "BadRequest",
        ),
        (
            http.get(url("/api/v1/namespaces/default/configmaps?limit=abc")),
            400,
            "BadRequest",
        ),
        (
            http.get(url(
                "/api/v1/namespaces/default/pods?watch=true&resourceVersion=xyz",
            )),
            400,
            "BadRequest",
        ),
    ];
    for (req, code, reason) in cases {
        let resp = req.send().await.expect("the server answers");
        let got = resp.status().as_u16();
        let body: Value = resp.json().await.expect("a JSON Status body");
        assert_eq!(got, code, "{body}");
        assert_eq!(body["kind"], "Status", "{body}");
        assert_eq!(body["code"], code, "{body}");
        assert_eq!(body["reason"], reason, "{body}");
    }
    let version = http.get(url("/version")).send().await.unwrap();
    assert!(version.status().is_success());
}

/// The `watch` kind of the fault rules: `drop` ends a watch stream before its next event and `gone`
/// answers the resumed watch with an ERROR event carrying a 410 Status (kube-apiserver's watch cache,
/// "too old resource version"); kube-runtime's watcher then lists again (`watcher.rs`: "HTTP GONE, means
/// we have desynced"), and the change the dropped stream never delivered arrives with that list.
#[tokio::test]
async fn watch_fault_rules_cut_a_stream_and_a_410_on_resume_makes_the_watcher_relist() {
    let cluster = start_cluster().await;
    let cms: Api<ConfigMap> = Api::namespaced(client(&cluster), "default");
    cms.create(&PostParams::default(), &configmap("first", &[]))
        .await
        .unwrap();
    let stream = watcher(cms.clone(), watcher::Config::default());
    let mut stream = std::pin::pin!(stream);
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("a watcher event within 20 s")
            .expect("the watcher goes on")
    };
    while !matches!(next().await, Ok(watcher::Event::InitDone)) {}
    // The watch itself starts once the watcher is polled after its list: an event on it shows it runs.
    cms.create(&PostParams::default(), &configmap("watched", &[]))
        .await
        .unwrap();
    assert!(matches!(next().await, Ok(watcher::Event::Apply(cm)) if cm.name_any() == "watched"));
    for rule in [
        json!({"kind": "watch", "resource": "configmaps", "watch": "drop", "errorRate": 1.0, "times": 1}),
        json!({"kind": "watch", "resource": "configmaps", "watch": "gone", "errorRate": 1.0, "times": 1}),
    ] {
        let r = raw_client(cluster.ca_pem())
            .post(format!("{}/sim/faults", cluster.url()))
            .json(&rule)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    }
    cms.create(&PostParams::default(), &configmap("second", &[]))
        .await
        .unwrap();
    let mut gone = false;
    let mut relisted = BTreeSet::new();
    loop {
        match next().await {
            Err(kube::runtime::watcher::Error::WatchError(s)) if s.code == 410 => gone = true,
            Ok(watcher::Event::Init) => assert!(gone, "a re-list comes after the 410"),
            Ok(watcher::Event::InitApply(cm)) => {
                relisted.insert(cm.name_any());
            }
            Ok(watcher::Event::InitDone) => break,
            Ok(watcher::Event::Apply(cm)) => panic!("{} came on the cut stream", cm.name_any()),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(gone);
    assert_eq!(
        relisted,
        BTreeSet::from(["first", "second", "watched"].map(String::from))
    );
    assert_eq!(cluster.faults.injected()["watch"], 2);
}

/// An invalid rule is refused with 400 and what its kind takes; a list names the rule at fault.
#[tokio::test]
async fn fault_rules_are_validated_by_kind() {
    let cluster = start_cluster().await;
    let http = raw_client(cluster.ca_pem());
    let url = format!("{}/sim/faults", cluster.url());
    let r = http
        .post(&url)
        .json(&json!({"kind": "s3", "verb": "get"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("verb does not apply to a rule of kind s3 (it takes operation, code)"),
        "{message}"
    );
    let r = http
        .put(&url)
        .json(&json!([{"verb": "get", "errorRate": 0.1}, {"kind": "ec2", "code": "Nope"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("fault rule #2: code \"Nope\""),
        "{body}"
    );
    let r = http
        .post(&url)
        .json(&json!({"kind": "ec2", "code": "RequestLimitExceeded", "errorRate": 0.5, "durationMs": 60000}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let rules: Value = http.get(&url).send().await.unwrap().json().await.unwrap();
    assert_eq!(rules[0]["kind"], "ec2", "{rules}");
    let injected: Value = http
        .get(format!("{url}/injected"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(injected, json!({}));
}
