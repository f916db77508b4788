//! Shared by the eviction and admission tests: an in-process simulated cluster, a kube-rs client for it,
//! and pods and budgets in the shapes the tests need.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, Client};
use serde_json::{Value, json};
use snapdrain_sim::{SimCluster, SimConfig};

use crate::WAIT;

pub async fn cluster() -> (SimCluster, Client) {
    cluster_with(snapdrain_sim::apiserver::Settings::default()).await
}

/// [`cluster`] with the API server's tunables set (e.g. which multi-PDB answer it gives).
pub async fn cluster_with(settings: snapdrain_sim::apiserver::Settings) -> (SimCluster, Client) {
    let sim = SimCluster::start(SimConfig {
        settings,
        ..SimConfig::default()
    })
    .await
    .expect("sim starts");
    let mut config = sim.kube_config();
    // kube-rs retries 429 by default (up to 15 times, backing off towards minutes): tests want each answer.
    config.default_retry = false;
    let client = Client::try_from(config).expect("client builds");
    (sim, client)
}

pub async fn namespace(client: &Client, name: &str, labels: Value) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
    api.create(&PostParams::default(), &ns)
        .await
        .expect("namespace created");
}

/// A pod bound to `node-1` with a 30 s grace period (so that it stays terminating while tests look),
/// Running and Ready unless `ready` is false; `None` leaves it Pending.
pub async fn pod(client: &Client, ns: &str, name: &str, ready: Option<bool>) -> Pod {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "db"}},
        "spec": {"nodeName": "node-1", "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "db", "image": "postgres"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": format!("data-{name}")}}]}
    }))
    .unwrap();
    let created = api
        .create(&PostParams::default(), &pod)
        .await
        .expect("pod created");
    match ready {
        None => created,
        Some(r) => set_ready(client, ns, name, r).await,
    }
}

/// Writes the pod's phase and Ready condition through the status subresource, as a kubelet does.
pub async fn set_ready(client: &Client, ns: &str, name: &str, ready: bool) -> Pod {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let status = if ready { "True" } else { "False" };
    let patch = json!({"status": {"phase": "Running",
        "conditions": [{"type": "Ready", "status": status}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("pod status patched")
}

pub async fn pdb(client: &Client, ns: &str, name: &str, spec: Value) -> PodDisruptionBudget {
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let mut spec = spec;
    spec["selector"] = json!({"matchLabels": {"app": "db"}});
    let pdb = serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
    api.create(&PostParams::default(), &pdb)
        .await
        .expect("pdb created")
}

/// Waits (by watch) until the budget's status, computed for its current generation, satisfies `cond`.
pub async fn wait_pdb(
    client: &Client,
    ns: &str,
    name: &str,
    cond: impl Fn(&Value) -> bool,
) -> Value {
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let check = |p: Option<&PodDisruptionBudget>| {
        p.is_some_and(|p| {
            let v = serde_json::to_value(p).unwrap();
            let synced =
                v.pointer("/status/observedGeneration") == v.pointer("/metadata/generation");
            synced && cond(&v["status"])
        })
    };
    let found = tokio::time::timeout(WAIT, await_condition(api, name, check))
        .await
        .unwrap_or_else(|_| panic!("PDB {ns}/{name} did not reach the expected status in time"))
        .expect("watch works");
    let found = serde_json::to_value(found.expect("pdb exists")).unwrap();
    found["status"].clone()
}

pub async fn get_pod(client: &Client, ns: &str, name: &str) -> Option<Value> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.get_opt(name)
        .await
        .expect("get works")
        .map(|p| serde_json::to_value(p).unwrap())
}

/// POSTs an Eviction the way kubectl does, with `deleteOptions` in the body. (kube-rs 5 `EvictParams`
/// serializes them as `delete_options`, a field a real API server ignores, so it cannot send them.)
pub async fn evict_with(
    client: &Client,
    ns: &str,
    name: &str,
    delete_options: Value,
    query: &str,
) -> kube::Result<kube::core::Status> {
    let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": ns}, "deleteOptions": delete_options});
    let req = http::Request::post(format!(
        "/api/v1/namespaces/{ns}/pods/{name}/eviction{query}"
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&body).unwrap())
    .unwrap();
    client.request::<kube::core::Status>(req).await
}

/// A budget with exactly `spec` (selector included, or none).
pub async fn pdb_raw(client: &Client, ns: &str, name: &str, spec: Value) -> PodDisruptionBudget {
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let pdb = serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
    api.create(&PostParams::default(), &pdb)
        .await
        .expect("pdb created")
}

/// POSTs an eviction and returns the HTTP status line's code with the body, as the server sent them
/// (kube-rs `request` would hide a 2xx code and turn a 4xx/5xx into an error).
pub async fn evict_raw(client: &Client, ns: &str, name: &str) -> (u16, Value) {
    let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": ns}});
    let req = http::Request::post(format!("/api/v1/namespaces/{ns}/pods/{name}/eviction"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    let res = client
        .send(req.map(Into::into))
        .await
        .expect("eviction answered");
    let code = res.status().as_u16();
    let bytes = res.into_body().collect_bytes().await.expect("body read");
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// The API error a call ended with.
pub fn api_error<T: std::fmt::Debug>(r: kube::Result<T>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}
