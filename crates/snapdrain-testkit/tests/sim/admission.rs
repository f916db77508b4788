//! Validating admission webhooks in the simulated API server, called over real TLS: an eviction gate
//! answering 429 until a backup is done, failure policies, trust and namespace selection.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{EvictParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use snapdrain_testkit::eviction::*;
use snapdrain_testkit::webhook::*;

/// A client, the gated namespace `shop` with a running pod `db-0`, and the default namespace with one too.
async fn setup() -> (snapdrain_sim::SimCluster, Client) {
    let (sim, client) = cluster().await;
    namespace(&client, "shop", json!({"snapdrain.io/gate": "on"})).await;
    pod(&client, "shop", "db-0", Some(true)).await;
    pod(&client, "default", "db-0", Some(true)).await;
    (sim, client)
}

fn terminating(pod: Option<Value>) -> bool {
    pod.is_some_and(|p| p.pointer("/metadata/deletionTimestamp").is_some())
}

#[tokio::test]
async fn gate_answers_429_until_the_backup_then_lets_the_eviction_through() {
    let (_sim, client) = setup().await;
    let pki = pki(&["gate.snapdrain.svc"]);
    let gate = Gate::default();
    gate.deny.store(true, Ordering::SeqCst);
    let addr = serve(gate.clone(), &pki).await;
    service(&client, addr).await;
    configure(&client, by_service(), "Fail", &pki.ca_pem).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let status = api_error(pods.evict("db-0", &EvictParams::default()).await);
    assert_eq!(status.code, 429);
    assert_eq!(status.reason, "TooManyRequests");
    assert_eq!(
        status.message,
        format!("admission webhook \"{HOOK}\" denied the request: {BACKUP_MESSAGE}")
    );
    assert!(!terminating(get_pod(&client, "shop", "db-0").await));

    let reviews = gate.reviews();
    assert_eq!(reviews.len(), 1);
    let req = &reviews[0]["request"];
    assert_eq!(reviews[0]["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(
        req["kind"],
        json!({"group": "policy", "version": "v1", "kind": "Eviction"})
    );
    assert_eq!(
        req["resource"],
        json!({"group": "", "version": "v1", "resource": "pods"})
    );
    assert_eq!(req["subResource"], "eviction");
    assert_eq!(req["name"], "db-0");
    assert_eq!(req["namespace"], "shop");
    assert_eq!(req["operation"], "CREATE");
    assert_eq!(req["dryRun"], false);
    assert_eq!(req["object"]["kind"], "Eviction");
    assert!(req["uid"].as_str().is_some_and(|u| !u.is_empty()));

    gate.deny.store(false, Ordering::SeqCst);
    pods.evict("db-0", &EvictParams::default())
        .await
        .expect("eviction allowed once the backup is done");
    assert!(terminating(get_pod(&client, "shop", "db-0").await));
    assert_eq!(gate.reviews().len(), 2);
}

#[tokio::test]
async fn namespace_selector_that_does_not_match_skips_the_webhook() {
    let (_sim, client) = setup().await;
    let pki = pki(&["gate.snapdrain.svc"]);
    let gate = Gate::default();
    gate.deny.store(true, Ordering::SeqCst);
    let addr = serve(gate.clone(), &pki).await;
    service(&client, addr).await;
    configure(&client, by_service(), "Fail", &pki.ca_pem).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.evict("db-0", &EvictParams::default())
        .await
        .expect("ungated namespace");
    assert!(terminating(get_pod(&client, "default", "db-0").await));
    assert!(gate.reviews().is_empty());
}

/// A loopback address nothing listens on.
fn dead_address() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[tokio::test]
async fn unreachable_webhook_with_ignore_lets_evictions_through() {
    let (_sim, client) = setup().await;
    let pki = pki(&["gate.snapdrain.svc"]);
    service(&client, dead_address()).await;
    configure(&client, by_service(), "Ignore", &pki.ca_pem).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    pods.evict("db-0", &EvictParams::default())
        .await
        .expect("fails open");
    assert!(terminating(get_pod(&client, "shop", "db-0").await));
}

#[tokio::test]
async fn unreachable_webhook_with_fail_refuses_with_500() {
    let (_sim, client) = setup().await;
    let pki = pki(&["127.0.0.1"]);
    let url = format!("https://{}/validate", dead_address());
    configure(&client, json!({"url": url}), "Fail", &pki.ca_pem).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let status = api_error(pods.evict("db-0", &EvictParams::default()).await);
    assert_eq!(status.code, 500);
    assert_eq!(status.reason, "InternalError");
    assert!(
        status.message.starts_with(&format!(
            "Internal error occurred: failed calling webhook \"{HOOK}\": "
        )),
        "{}",
        status.message
    );
    assert!(!terminating(get_pod(&client, "shop", "db-0").await));
}

#[tokio::test]
async fn certificate_from_another_ca_is_a_failed_call() {
    let (_sim, client) = setup().await;
    let served = pki(&["gate.snapdrain.svc"]);
    let other = pki(&["gate.snapdrain.svc"]);
    let gate = Gate::default();
    let addr = serve(gate.clone(), &served).await;
    service(&client, addr).await;
    configure(&client, by_service(), "Fail", &other.ca_pem).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let status = api_error(pods.evict("db-0", &EvictParams::default()).await);
    assert_eq!(status.code, 500);
    assert!(
        status
            .message
            .contains(&format!("failed calling webhook \"{HOOK}\"")),
        "{}",
        status.message
    );
    // The handshake failed: the webhook never saw a request.
    assert!(gate.reviews().is_empty());
    assert!(!terminating(get_pod(&client, "shop", "db-0").await));
}

#[tokio::test]
async fn certificate_for_another_name_is_a_failed_call() {
    let (_sim, client) = setup().await;
    let pki = pki(&["elsewhere.snapdrain.svc"]);
    let gate = Gate::default();
    let addr = serve(gate.clone(), &pki).await;
    service(&client, addr).await;
    configure(&client, by_service(), "Fail", &pki.ca_pem).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    assert_eq!(
        api_error(pods.evict("db-0", &EvictParams::default()).await).code,
        500
    );
    assert!(gate.reviews().is_empty());
}

#[tokio::test]
async fn dry_run_reaches_only_side_effect_free_webhooks() {
    let (_sim, client) = setup().await;
    let pki = pki(&["gate.snapdrain.svc"]);
    let gate = Gate::default();
    let addr = serve(gate.clone(), &pki).await;
    service(&client, addr).await;
    configure(&client, by_service(), "Fail", &pki.ca_pem).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let dry = EvictParams {
        post_options: PostParams {
            dry_run: true,
            ..Default::default()
        },
        ..Default::default()
    };
    pods.evict("db-0", &dry)
        .await
        .expect("NoneOnDryRun webhook called on dry run");
    assert_eq!(gate.reviews()[0]["request"]["dryRun"], true);
    assert!(!terminating(get_pod(&client, "shop", "db-0").await));

    // A webhook with side effects cannot take part in a dry run: the request fails with 400.
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let patch = json!([{"op": "replace", "path": "/webhooks/0/sideEffects", "value": "Some"}]);
    api.patch(
        "snapdrain-gate",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::<Value>::Json(serde_json::from_value(patch).unwrap()),
    )
    .await
    .unwrap();
    let status = api_error(pods.evict("db-0", &dry).await);
    assert_eq!(status.code, 400);
    assert_eq!(
        status.message,
        format!("admission webhook \"{HOOK}\" does not support dry run")
    );
    assert_eq!(gate.reviews().len(), 1);
}

/// The `admission` kind of the simulator's fault rules: a down webhook fails the call as a refused
/// connection would (and `failurePolicy: Fail` refuses the eviction with 500), a slow one delays the
/// answer it still gives.
#[tokio::test]
async fn fault_rules_make_the_webhook_down_or_slow() {
    let (sim, client) = setup().await;
    let pki = pki(&["gate.snapdrain.svc"]);
    let gate = Gate::default();
    gate.deny.store(true, Ordering::SeqCst);
    let addr = serve(gate.clone(), &pki).await;
    service(&client, addr).await;
    configure(&client, by_service(), "Fail", &pki.ca_pem).await;
    let rule = |v: Value| {
        let r: snapdrain_sim::apiserver::faults::FaultRule = serde_json::from_value(v).unwrap();
        r.validate().unwrap();
        r
    };
    sim.faults.add(rule(
        json!({"kind": "admission", "webhook": HOOK, "errorRate": 1.0, "times": 1}),
    ));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let status = api_error(pods.evict("db-0", &EvictParams::default()).await);
    assert_eq!(status.code, 500, "{status:?}");
    assert!(
        status.message.contains("connection refused"),
        "{}",
        status.message
    );
    assert!(gate.reviews().is_empty(), "the webhook was never reached");
    sim.faults
        .set(vec![rule(json!({"kind": "admission", "latencyMs": 400}))]);
    let started = std::time::Instant::now();
    let status = api_error(pods.evict("db-0", &EvictParams::default()).await);
    assert_eq!(status.code, 429, "the gate's own answer, late: {status:?}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(400));
    assert_eq!(gate.reviews().len(), 1);
    assert!(!terminating(get_pod(&client, "shop", "db-0").await));
    // The simulator's own record of each call's end, which judges read instead of asking the webhook.
    sim.faults.set(Vec::new());
    gate.deny.store(false, Ordering::SeqCst);
    pods.evict("db-0", &EvictParams::default())
        .await
        .expect("the gate allows now");
    use snapdrain_sim::apiserver::admission::CallOutcome;
    assert_eq!(
        sim.api.state.admission.outcomes(HOOK),
        std::collections::BTreeMap::from([
            (CallOutcome::Allowed, 1),
            (CallOutcome::Denied, 1),
            (CallOutcome::FailedClosed, 1),
        ])
    );
}

/// A webhook that never answers is cut at its `timeoutSeconds`, as kube-apiserver's call is (kubernetes
/// `staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/validating/dispatcher.go` `callHook`: the
/// request context gets `context.WithTimeout(ctx, time.Duration(*h.TimeoutSeconds)*time.Second)`), and
/// the failure policy decides: `Fail` refuses with 500 "context deadline exceeded", `Ignore` admits.
#[tokio::test]
async fn a_webhook_that_never_answers_is_cut_at_its_timeout_seconds() {
    let (_sim, client) = setup().await;
    let pki = pki(&["gate.snapdrain.svc"]);
    let gate = Gate::default();
    gate.deny.store(true, Ordering::SeqCst);
    gate.hang.store(true, Ordering::SeqCst);
    let addr = serve(gate.clone(), &pki).await;
    service(&client, addr).await;
    configure(&client, by_service(), "Fail", &pki.ca_pem).await;
    let configs = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let set = |path: &str, value: Value| {
        let patch = json!([{"op": "replace", "path": path, "value": value}]);
        let configs = configs.clone();
        async move {
            configs
                .patch(
                    "snapdrain-gate",
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::<Value>::Json(serde_json::from_value(patch).unwrap()),
                )
                .await
                .unwrap();
        }
    };
    set("/webhooks/0/timeoutSeconds", json!(1)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    // Well under the 5 s the configuration started with, and under any client timeout.
    let bound = std::time::Duration::from_secs(4);
    let started = std::time::Instant::now();
    let status = api_error(
        tokio::time::timeout(bound, pods.evict("db-0", &EvictParams::default()))
            .await
            .expect("the eviction is answered once the webhook's 1 s is up"),
    );
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    assert_eq!(status.code, 500, "{status:?}");
    assert!(
        status.message.contains("context deadline exceeded"),
        "{}",
        status.message
    );
    assert_eq!(gate.reviews().len(), 1, "the webhook got the review");
    assert!(!terminating(get_pod(&client, "shop", "db-0").await));

    set("/webhooks/0/failurePolicy", json!("Ignore")).await;
    let started = std::time::Instant::now();
    tokio::time::timeout(bound, pods.evict("db-0", &EvictParams::default()))
        .await
        .expect("the eviction is answered once the webhook's 1 s is up")
        .expect("an Ignore webhook that timed out admits the eviction");
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    assert!(terminating(get_pod(&client, "shop", "db-0").await));
}
