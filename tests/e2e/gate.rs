//! The eviction gate end to end: snapdrain serves its validating webhook over TLS with certificates it
//! issues and keeps (caBundle patched into the configuration), the simulated kube-apiserver calls it for
//! `pods/eviction` as kube-apiserver's validating dispatcher does, and the real `kubectl drain` meets it.
//!
//! Upstream behaviour relied on:
//! - kube-apiserver keeps a webhook denial's `status.code` and prefixes its message with
//!   `admission webhook "<name>" denied the request: ` (kubernetes `staging/src/k8s.io/apiserver/pkg/
//!   admission/plugin/webhook/errors/statuserror.go`, `ToStatusErr`).
//! - kubectl drain retries a 429 every 5 s, printing `error when evicting pods/"<pod>" -n "<ns>" (will
//!   retry after 5s): <message>`, and fails a pod at once on any other error (kubernetes
//!   `staging/src/k8s.io/kubectl/pkg/drain/drain.go`, `evictPods`).
//! - A webhook that cannot be called lets the request through under `failurePolicy: Ignore` and fails
//!   it with an internal error under `Fail` (kubernetes `staging/src/k8s.io/apiserver/pkg/admission/
//!   plugin/webhook/validating/dispatcher.go`); the simulator's `apiserver/admission.rs` models both.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use snapdrain::api::{DisruptionPlan, PlanSource};
use snapdrain::controller::ControllerHandle;
use snapdrain::controller::run::RunOptions;
use snapdrain::webhook::Lifetimes;
use snapdrain_sim::apiserver::admission::ADDRESS_ANNOTATION;
use snapdrain_sim::apiserver::faults::FaultRule;
use snapdrain_testkit::eviction::{evict_with, namespace};
use snapdrain_testkit::gate::{
    CONFIGURATION, HOOK, NS, SERVICE, configuration, controller_with_gate, service, webhook_config,
};
use snapdrain_testkit::harness::{
    Harness, TIMEOUT, assert_no_eviction_before_verified_backup, fast_timings,
};
use snapdrain_testkit::kubectl::Kubectl;
use snapdrain_testkit::{eventually_within, webhook::pki};

async fn ca_bundle(client: &Client) -> Option<Vec<u8>> {
    let vwc = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get(CONFIGURATION)
        .await
        .expect("get the configuration");
    vwc.webhooks?
        .first()?
        .client_config
        .ca_bundle
        .as_ref()
        .map(|b| b.0.clone())
}

async fn gate_plans(client: &Client, node: &str) -> Vec<DisruptionPlan> {
    Api::<DisruptionPlan>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("list plans")
        .items
        .into_iter()
        .filter(|p| {
            p.spec.source == PlanSource::EvictionGate && p.spec.nodes.iter().any(|n| n == node)
        })
        .collect()
}

fn drain_args<'a>(node: &'a str, timeout: &'a str) -> Vec<&'a str> {
    vec![
        "drain",
        node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        timeout,
    ]
}

/// The promise against a drainer snapdrain does not run: kubectl drain is refused with 429 while the
/// backup runs, is told which plan and backup it waits for, retries, and completes once the backup is
/// verified; the oracle finds no protected eviction before its verified backup.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_drain_waits_for_the_verified_backup_the_gate_names() {
    // A backup that takes a few seconds, so kubectl's 5 s retry finds it running and is told its name.
    let h = Harness::start_with(snapdrain_sim::world::Timings {
        backup_overhead: Duration::from_secs(7),
        ..fast_timings()
    })
    .await;
    let controller =
        controller_with_gate(&h, "Ignore", Lifetimes::default(), Duration::from_secs(30)).await;
    let bundle = ca_bundle(&h.client).await.expect("the gate patched its CA");
    assert!(String::from_utf8_lossy(&bundle).contains("BEGIN CERTIFICATE"));
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    assert!(!protected.is_empty(), "the node runs protected pods");

    let k = Kubectl::new(&h.cluster);
    let (ok, stdout, stderr) = k.spawn(&drain_args(&node, "--timeout=90s")).finish().await;
    assert!(ok, "kubectl drain completes:\n{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("node/{node} drained")), "{stdout}");

    let plans = gate_plans(&h.client, &node).await;
    assert_eq!(
        plans.len(),
        1,
        "one eviction-gate plan for the node: {plans:#?}"
    );
    let plan = &plans[0];
    let backups: Vec<String> = plan
        .status
        .iter()
        .flat_map(|s| &s.backups)
        .map(|b| b.name.clone())
        .collect();
    assert!(!backups.is_empty(), "the plan backed up: {plan:#?}");
    let denied = format!(
        "(will retry after 5s): admission webhook \"{HOOK}\" denied the request: snapdrain holds the eviction of pod"
    );
    assert!(stderr.contains(&denied), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "starting DisruptionPlan {} for node {node}",
            plan.name_any()
        )),
        "the first refusal says which plan it started:\n{stderr}"
    );
    assert!(
        backups
            .iter()
            .any(|b| stderr.contains(&format!("waiting for backup {b}"))),
        "a retry names the backup it waits for ({backups:?}):\n{stderr}"
    );
    let evicted: Vec<String> = h.accepted_evictions().into_iter().map(|(p, _)| p).collect();
    for pod in protected.keys() {
        assert!(
            evicted.contains(pod),
            "{pod} was evicted by kubectl: {evicted:?}"
        );
    }
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, plan);
    // kubectl drain leaves the node: the Release plan completes once the pods it released have left it.
    let done = h
        .wait_plan(&plan.name_any(), Duration::from_secs(60), |p| {
            p.is_terminal()
        })
        .await;
    let status = done.status.expect("a terminal plan has a status");
    assert_eq!(
        status.phase,
        snapdrain::api::status::PlanPhase::Completed,
        "{status:#?}"
    );
    assert!(!status.released_pods.is_empty(), "{status:#?}");

    let metrics = controller.metrics.render();
    for decision in ["allowed", "denied"] {
        assert!(
            metrics.contains(&format!(
                "snapdrain_gate_decisions_total{{decision=\"{decision}\"}}"
            )),
            "{metrics}"
        );
    }
    assert!(
        metrics.contains("snapdrain_gate_decision_duration_seconds_count"),
        "{metrics}"
    );
    // One Event per held pod (kubectl asked again every 5 s; the gate does not repeat itself).
    let events: Vec<k8s_openapi::api::events::v1::Event> =
        Api::<k8s_openapi::api::events::v1::Event>::all(h.client.clone())
            .list(&Default::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("EvictionHeld"))
            .collect();
    for pod in protected.keys() {
        let (ns, name) = pod.split_once('/').expect("ns/name");
        let on_pod: Vec<_> = events
            .iter()
            .filter(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.namespace.as_deref() == Some(ns) && r.name.as_deref() == Some(name)
                })
            })
            .collect();
        assert_eq!(
            on_pod.len(),
            1,
            "one EvictionHeld Event on {pod}: {events:#?}"
        );
        let note = on_pod[0].note.as_deref().unwrap_or_default();
        assert!(note.contains("snapdrain holds the eviction"), "{note}");
    }
}

/// A port nothing listens on: the webhook is down.
fn dead_address() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("bound address")
    // Dropped here: connections are refused from now on.
}

/// With the gate down, `failurePolicy` decides, as the chart lets the operator choose.
async fn drain_with_the_gate_down(failure_policy: &str) -> (Harness, String, bool, String) {
    let h = Harness::start().await;
    namespace(&h.client, NS, json!({})).await;
    let ca = pki(&[&format!("{SERVICE}.{NS}.svc")]);
    configuration(&h.client, failure_policy, Some(&ca.ca_pem)).await;
    service(&h.client, dead_address()).await;
    let node = h.node_with_statefulset_pods().await;
    let k = Kubectl::new(&h.cluster);
    let (ok, _, stderr) = k.spawn(&drain_args(&node, "--timeout=30s")).finish().await;
    (h, node, ok, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_failure_policy_ignore_a_dead_gate_does_not_wedge_the_drain() {
    let (h, node, ok, stderr) = drain_with_the_gate_down("Ignore").await;
    assert!(ok, "the drain proceeds without the gate: {stderr}");
    assert!(h.protected_pods_on(&node).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_failure_policy_fail_a_dead_gate_refuses_the_eviction() {
    let (h, node, ok, stderr) = drain_with_the_gate_down("Fail").await;
    assert!(!ok, "the drain fails while the gate is down");
    assert!(
        stderr.contains(&format!("failed calling webhook \"{HOOK}\"")),
        "{stderr}"
    );
    assert!(
        !h.protected_pods_on(&node).await.is_empty(),
        "protected pods stay"
    );
}

/// The Secret's validity annotations, which change on every renewal.
async fn validity(client: &Client) -> Option<(String, String)> {
    let s = Api::<Secret>::namespaced(client.clone(), NS)
        .get_opt("snapdrain-webhook-tls")
        .await
        .expect("get the Secret")?;
    let a = s.annotations();
    Some((
        a.get("snapdrain.io/ca-not-before")?.clone(),
        a.get("snapdrain.io/cert-not-before")?.clone(),
    ))
}

/// Rotation drops no request: with lifetimes of seconds and `failurePolicy: Fail` (a failed call would
/// show as a 500), a stream of dry-run evictions of a protected pod gets the gate's 429 every time
/// while the serving certificate is renewed and the CA rotated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn certificate_rotation_under_a_stream_of_dry_run_evictions_drops_no_request() {
    let h = Harness::start().await;
    let lifetimes = Lifetimes {
        ca: Duration::from_secs(9),
        serving: Duration::from_secs(3),
    };
    let resync = Duration::from_millis(100);
    let controller = controller_with_gate(&h, "Fail", lifetimes, resync).await;
    // A second replica renews from the same Secret: at each due time both try, the resourceVersion
    // lets one win, and the other serves the winner's bundle.
    let second = h
        .controller_with(
            RunOptions {
                lease_namespace: None,
                webhook: Some(webhook_config(lifetimes, resync)),
                ..RunOptions::default()
            },
            "snapdrain-1",
        )
        .await;
    let node = h.node_with_statefulset_pods().await;
    let pod = h
        .protected_pods_on(&node)
        .await
        .into_keys()
        .next()
        .expect("a protected pod");
    let (ns, name) = pod.split_once('/').expect("ns/name");
    // 429s must reach this loop, not be retried inside the client.
    let mut cfg = h.kube_config();
    cfg.default_retry = false;
    let client = Client::try_from(cfg).expect("client");

    let (first_ca, first_cert) = validity(&h.client).await.expect("the Secret exists");
    let mut certs = std::collections::BTreeSet::from([first_cert]);
    let mut cas = std::collections::BTreeSet::from([first_ca]);
    let mut answers = 0;
    let mut most_trusted = 0;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    // Until the CA rotated once, the serving certificate three times and the caBundle was seen holding
    // the old and the new CA, every answer is the gate's. (A loaded machine can sample past one
    // rotation's overlap; the next rotation has its own.)
    while cas.len() < 2 || certs.len() < 4 || most_trusted < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no rotation within {TIMEOUT:?}: CAs {cas:?}, certificates {certs:?}, at most {most_trusted} CA(s) trusted at once"
        );
        let r = evict_with(&client, ns, name, json!({"dryRun": ["All"]}), "?dryRun=All").await;
        let status = match r {
            Err(kube::Error::Api(s)) => s,
            other => panic!("answer {answers}: expected the gate's 429, got {other:?}"),
        };
        assert_eq!(status.code, 429, "answer {answers}: {status:?}");
        assert!(
            status.message.contains("snapdrain holds the eviction")
                && status.message.contains("dry run"),
            "answer {answers}: {status:?}"
        );
        answers += 1;
        if let Some((ca, cert)) = validity(&h.client).await {
            cas.insert(ca);
            certs.insert(cert);
        }
        let trusted = ca_bundle(&h.client).await.unwrap_or_default();
        most_trusted = most_trusted.max(
            String::from_utf8_lossy(&trusted)
                .matches("BEGIN CERTIFICATE")
                .count(),
        );
    }
    assert!(answers > 10, "a stream, not a few requests: {answers}");
    assert_eq!(
        most_trusted, 2,
        "during the CA rotation the caBundle held the old and the new CA"
    );
    // A dry run creates nothing.
    assert!(gate_plans(&h.client, &node).await.is_empty());
    // Both replicas converge on the stored certificate: whichever lost a renewal race (its update got
    // 409 at the resourceVersion it read) serves the winner's bundle.
    eventually_within(
        "both replicas serve the stored certificate",
        TIMEOUT,
        || async {
            let secret = Api::<Secret>::namespaced(h.client.clone(), NS)
                .get("snapdrain-webhook-tls")
                .await
                .ok()?;
            let stored = String::from_utf8(secret.data?.get("tls.crt")?.0.clone()).ok()?;
            let served = [
                controller.webhook_certificate()?,
                second.webhook_certificate()?,
            ];
            served.iter().all(|s| *s == stored).then_some(())
        },
    )
    .await;
}

/// The gate must not leave the caBundle empty while it waits for the Service.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_gate_issues_its_certificates_once_and_patches_the_ca_bundle() {
    let h = Harness::start().await;
    let controller =
        controller_with_gate(&h, "Ignore", Lifetimes::default(), Duration::from_secs(30)).await;
    let first = validity(&h.client).await.expect("the Secret exists");
    // A second replica finds the Secret and serves the same bundle: no second CA.
    let second = second_replica(&h).await;
    assert_eq!(validity(&h.client).await, Some(first));
    let bundle = eventually_within("the caBundle is set", TIMEOUT, || async {
        ca_bundle(&h.client).await
    })
    .await;
    let secret = Api::<Secret>::namespaced(h.client.clone(), NS)
        .get("snapdrain-webhook-tls")
        .await
        .expect("get the Secret");
    let ca = secret
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .expect("the Secret holds the CA");
    assert_eq!(bundle, ca.0);
    second.shutdown().await;
    controller.shutdown().await;
}

/// A second replica of the controller with the gate (the Service still points at the first).
async fn second_replica(h: &Harness) -> ControllerHandle {
    h.controller_with(
        RunOptions {
            lease_namespace: None,
            webhook: Some(webhook_config(
                Lifetimes::default(),
                Duration::from_secs(30),
            )),
            ..RunOptions::default()
        },
        "snapdrain-1",
    )
    .await
}

/// Sets annotation `key: value` on each `namespace/name` pod, as its user would.
async fn users_own_annotation<'a>(
    h: &Harness,
    pods: impl IntoIterator<Item = &'a String>,
    key: &str,
    value: &str,
) {
    for pod in pods {
        let (ns, name) = pod.split_once('/').expect("ns/name");
        Api::<k8s_openapi::api::core::v1::Pod>::namespaced(h.client.clone(), ns)
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
            )
            .await
            .expect("the user's own annotation");
    }
}

/// Evicts `ns/name` once through the API (as a drainer does), returning the HTTP code of the answer.
async fn evict_code(client: &Client, ns: &str, name: &str) -> u16 {
    match evict_with(client, ns, name, json!({}), "").await {
        Ok(_) => 201,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("eviction of {ns}/{name} got no answer: {e}"),
    }
}

fn client_without_retries(h: &Harness) -> Client {
    let mut config = h.kube_config();
    config.default_retry = false;
    Client::try_from(config).expect("client")
}

/// The gate protects what the DisruptionPolicy protects: a pod outside `protection.podSelector` is
/// evicted at once, a pod inside it is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_gate_protects_what_the_policy_protects() {
    let h = Harness::start().await;
    let policy: snapdrain::api::DisruptionPolicy = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": "default"},
        "spec": {"protection": {"podSelector": {"matchLabels": {"app": "postgres"}}}}
    }))
    .expect("a policy");
    Api::<snapdrain::api::DisruptionPolicy>::all(h.client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("create the policy");
    let _controller =
        controller_with_gate(&h, "Fail", Lifetimes::default(), Duration::from_secs(30)).await;
    let client = client_without_retries(&h);
    // The gate reads the policy on its own watch: until then it protects both (more, never less).
    eventually_within("redis-0 let through", Duration::from_secs(30), || async {
        (evict_code(&client, "shop", "redis-0").await == 201).then_some(())
    })
    .await;
    assert_eq!(evict_code(&client, "shop", "postgres-0").await, 429);
}

/// A restart of every replica loses nothing. With `failurePolicy: Fail` an eviction while no replica
/// serves is refused (not let through); the next replica reads the same certificates from the Secret,
/// holds the pod until the plan's backup is verified, then lets the eviction through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_of_every_replica_lets_no_eviction_through_early() {
    let h = Harness::start_with(snapdrain_sim::world::Timings {
        backup_overhead: Duration::from_secs(3),
        ..fast_timings()
    })
    .await;
    let first =
        controller_with_gate(&h, "Fail", Lifetimes::default(), Duration::from_secs(30)).await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    let (ns, pod) = protected
        .keys()
        .next()
        .and_then(|k| k.split_once('/'))
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .expect("a protected pod");
    let client = client_without_retries(&h);
    // A drainer retrying: held, and the refusal starts the plan (off the request path, so it shows a
    // moment later).
    let plan = eventually_within(
        "a refusal started a plan",
        Duration::from_secs(30),
        || async {
            assert_eq!(evict_code(&client, &ns, &pod).await, 429, "held");
            gate_plans(&h.client, &node).await.pop()
        },
    )
    .await;
    let bundle = ca_bundle(&h.client).await;
    first.kill();
    // No replica serves: the API server cannot call the webhook, and Fail refuses the eviction.
    let down = evict_code(&client, &ns, &pod).await;
    assert!(down >= 500, "refused while the gate is down, got {down}");
    let second = second_replica(&h).await;
    // The Service now reaches the new replica.
    let addr = second.webhook_addr.expect("the gate listens");
    Api::<Service>::namespaced(h.client.clone(), NS)
        .patch(
            SERVICE,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {ADDRESS_ANNOTATION: addr.to_string()}}}),
            ),
        )
        .await
        .expect("point the Service at the new replica");
    assert_eq!(
        ca_bundle(&h.client).await,
        bundle,
        "the same CA: the certificates came from the Secret"
    );
    // A drainer retrying: held until the backup is verified, then let through.
    let codes = std::sync::Mutex::new(Vec::new());
    eventually_within(
        "the eviction let through",
        Duration::from_secs(60),
        || async {
            let code = evict_code(&client, &ns, &pod).await;
            codes.lock().expect("not poisoned").push(code);
            (code == 201).then_some(())
        },
    )
    .await;
    let codes = codes.into_inner().expect("not poisoned");
    assert!(
        codes.iter().all(|c| *c == 429 || *c == 201),
        "answers after the restart: {codes:?}"
    );
    let done = h
        .wait_plan_until(&plan.name_any(), Duration::from_secs(60), |p| {
            p.status.as_ref().is_some_and(|s| s.released_at.is_some())
        })
        .await;
    let one: std::collections::BTreeMap<_, _> = protected
        .iter()
        .filter(|(k, _)| *k == &format!("{ns}/{pod}"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_no_eviction_before_verified_backup(&h.audit(), &one, &done);
}

/// Waits until snapdrain holds every protected pod on `node` (`protected` as `shop/NAME`).
async fn wait_node_held(
    h: &Harness,
    node: &str,
    protected: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) {
    eventually_within("the node's pods held", TIMEOUT, || async {
        let pods = Api::<k8s_openapi::api::core::v1::Pod>::all(h.client.clone())
            .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .ok()?;
        pods.items
            .iter()
            .filter(|p| protected.contains_key(&format!("shop/{}", p.name_any())))
            .all(|p| p.annotations().contains_key("snapdrain.io/held"))
            .then_some(())
    })
    .await;
}

/// aws-node-termination-handler on a spot interruption (IMDS mode, `--taint-node`): it taints, cordons
/// and drains through the Eviction API, retrying refusals (aws-node-termination-handler
/// `pkg/node/node.go`, kubectl `pkg/drain/drain.go`). snapdrain's signal plan backs the node up, the gate
/// holds NTH's evictions of protected pods until then, and EC2 takes the instance at the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_nth_spot_drain_waits_at_the_gate_for_the_verified_backup() {
    let h = Harness::start_scenario("quickstart", |s| {
        s.node_termination_handler = Some(snapdrain_sim::world::nth::NthSettings {
            taint_node: true,
            ..Default::default()
        });
    })
    .await;
    let _controller =
        controller_with_gate(&h, "Fail", Lifetimes::default(), Duration::from_secs(30)).await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    // Holds first, so NTH is the only drainer.
    wait_node_held(&h, &node, &protected).await;
    h.cluster
        .act(
            &snapdrain_sim::scenario::timeline::Action::SpotInterruption {
                node: node.clone(),
                notice: 30_000,
            },
        )
        .expect("the spot interruption");
    eventually_within(
        "NTH drained the node's protected pods",
        Duration::from_secs(60),
        || async {
            let evicted: Vec<String> = h.accepted_evictions().into_iter().map(|(p, _)| p).collect();
            protected.keys().all(|p| evicted.contains(p)).then_some(())
        },
    )
    .await;
    let plans = h.plans_for(&node).await;
    assert_eq!(plans.len(), 1, "one plan for the node: {plans:#?}");
    let plan = &plans[0];
    // The taint and NTH's first eviction race: whichever the controller sees first makes the plan, and
    // the other joins it.
    assert!(
        matches!(
            plan.spec.source,
            PlanSource::NodeTerminationHandler | PlanSource::EvictionGate
        ),
        "{:?}",
        plan.spec.source
    );
    let by_nth: Vec<String> = snapdrain_testkit::safety::accepted_evictions(&h.audit())
        .into_iter()
        .filter(|e| e.user_agent.as_deref() == Some(snapdrain_sim::world::nth::USER_AGENT))
        .map(|e| e.pod)
        .collect();
    for p in protected.keys() {
        assert!(by_nth.contains(p), "NTH evicted {p}: {by_nth:?}");
    }
    let plan = h
        .wait_plan_until(&plan.name_any(), Duration::from_secs(60), |p| {
            p.status.as_ref().is_some_and(|s| s.released_at.is_some())
        })
        .await;
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &plan);
}

/// A spot interruption warning where Karpenter reads an interruption queue: Karpenter deletes the
/// instance's NodeClaim at once (aws/karpenter-provider-aws `pkg/controllers/interruption/controller.go`,
/// `handleNodeClaim`), and its termination drains the node, skipping held pods. snapdrain's plan for the
/// deleted NodeClaim backs the node up and releases the holds once verified; Karpenter's evictions of
/// protected pods come after that, and all of it before EC2 takes the instance at the end of the notice.
/// Without the queue Karpenter does nothing with the notice (the simulator's former behaviour): this test
/// then times out waiting for the NodeClaim's deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spot_interruption_karpenter_acts_on_is_backed_up_before_its_pods_go() {
    let h = Harness::start_scenario("quickstart", |s| {
        s.karpenter = Some(snapdrain_sim::world::karpenter::KarpenterSettings {
            interruption_queue: Some("karpenter-interruptions".into()),
        });
    })
    .await;
    let _controller =
        controller_with_gate(&h, "Fail", Lifetimes::default(), Duration::from_secs(30)).await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    wait_node_held(&h, &node, &protected).await;
    // The longest grace of the node's protected pods, read before they go.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::all(h.client.clone());
    let longest_grace = pods
        .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .expect("list the node's pods")
        .items
        .iter()
        .filter(|p| {
            protected.contains_key(&format!(
                "{}/{}",
                p.namespace().unwrap_or_default(),
                p.name_any()
            ))
        })
        .filter_map(|p| p.spec.as_ref()?.termination_grace_period_seconds)
        .max()
        .expect("protected pods have a grace");
    let claim = h.nodeclaim_of(&node).await;
    let answer = h
        .cluster
        .act(
            &snapdrain_sim::scenario::timeline::Action::SpotInterruption {
                node: node.clone(),
                notice: 120_000,
            },
        )
        .expect("the spot interruption");
    assert_eq!(answer["karpenter"], true, "{answer}");
    eventually_within(
        "Karpenter deleted the NodeClaim on the warning",
        Duration::from_secs(30),
        || async {
            h.audit()
                .iter()
                .any(|e| {
                    e.source == "world"
                        && e.verb == "disruption-started"
                        && e.name.as_deref() == Some(claim.as_str())
                        && e.detail["reason"] == "SpotInterruption"
                })
                .then_some(())
        },
    )
    .await;
    eventually_within("the node gone", Duration::from_secs(90), || async {
        h.node(&node).await.is_none().then_some(())
    })
    .await;
    let plans = h.plans_for(&node).await;
    assert_eq!(plans.len(), 1, "one plan for the node: {plans:#?}");
    assert_eq!(
        plans[0].spec.source,
        PlanSource::Karpenter,
        "{:?}",
        plans[0].spec
    );
    let plan = h
        .wait_plan(&plans[0].name_any(), TIMEOUT, |p| p.is_terminal())
        .await;
    // Review #12: the deadline comes from Karpenter's SpotInterrupted Event on the Node (EC2 takes the
    // instance two minutes after the notice), less the pods' grace and snapdrain's 10 s margin, so the
    // pods stop in the time the notice gives them instead of dying with the instance.
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(h.client.clone(), "default");
    let notice = events
        .list(&kube::api::ListParams::default().fields(&format!(
            "involvedObject.kind=Node,involvedObject.name={node},reason=SpotInterrupted"
        )))
        .await
        .expect("list events")
        .items
        .iter()
        .filter_map(|e| e.first_timestamp.as_ref().map(|t| t.0))
        .min()
        .expect("Karpenter recorded SpotInterrupted on the Node");
    assert_eq!(
        plan.spec.deadline.as_ref().map(|t| t.0),
        Some(notice + jiff::SignedDuration::from_secs(120 - longest_grace - 10)),
        "{:?}",
        plan.spec
    );
    let evicted: Vec<String> = h.accepted_evictions().into_iter().map(|(p, _)| p).collect();
    for p in protected.keys() {
        assert!(evicted.contains(p), "Karpenter evicted {p}: {evicted:?}");
    }
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &plan);
    assert!(
        !h.audit()
            .iter()
            .any(|e| e.verb == "spot-instance-reclaimed"),
        "the node was drained before EC2 took the instance"
    );
}

/// Review of e283d7a (`signals.rs` `trusts_unprotected`): a node the signal watcher found without protected
/// pods under a graceful signal is not listed again for 30 s, but under a forceful one it is listed on
/// every look. Here a protected pod arrives on such a node and EC2's spot notice (15 s, inside the 30 s)
/// follows: the plan must back it up before it goes, not leave it to die with the instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_protected_pod_arriving_on_a_node_found_unprotected_is_backed_up_before_a_spot_reclaim() {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Patch, PatchParams};
    use snapdrain_sim::apiserver::resources::ResKey;
    use snapdrain_testkit::chaos::judge::{self, Evidence, Launched};
    const NOTICE_MS: u64 = 15_000;
    let h = Harness::start_scenario("quickstart", |s| {
        s.karpenter = Some(snapdrain_sim::world::karpenter::KarpenterSettings {
            interruption_queue: Some("karpenter-interruptions".into()),
        });
    })
    .await;
    let _controller =
        controller_with_gate(&h, "Fail", Lifetimes::default(), Duration::from_secs(30)).await;
    // A: a node with protected pods; B: a Karpenter node without any.
    let a = h.node_with_statefulset_pods().await;
    wait_node_held(&h, &a, &h.protected_pods_on(&a).await).await;
    let nodes: Api<Node> = Api::all(h.client.clone());
    let mut empty = Vec::new();
    for n in nodes
        .list(&Default::default())
        .await
        .expect("list nodes")
        .items
    {
        let karpenters = n.owner_references().iter().any(|o| o.kind == "NodeClaim");
        if karpenters && h.protected_pods_on(&n.name_any()).await.is_empty() {
            empty.push(n.name_any());
        }
    }
    empty.sort();
    let b = empty
        .first()
        .cloned()
        .expect("six nodes, five protected pods: a node runs none");
    // Cluster Autoscaler's soft taint (a graceful signal) on B, then on A. The watcher's look that
    // makes A's plan has seen B's taint too (one watch of Nodes, in order): B is then on record as
    // found without protected pods.
    let candidate = json!({"spec": {"taints": [{"key": "DeletionCandidateOfClusterAutoscaler",
        "value": "1764590000", "effect": "PreferNoSchedule"}]}});
    for n in [&b, &a] {
        nodes
            .patch(n, &PatchParams::default(), &Patch::Merge(&candidate))
            .await
            .expect("taint the node as Cluster Autoscaler does");
    }
    eventually_within("a plan for A's signal", TIMEOUT, || async {
        (!h.plans_for(&a).await.is_empty()).then_some(())
    })
    .await;
    assert!(h.plans_for(&b).await.is_empty(), "B has nothing to back up");
    // A protected pod on B: a StatefulSet pod with a PVC, placed there by its nodeSelector.
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> =
        Api::namespaced(h.client.clone(), "shop");
    let set = serde_json::from_value(json!({
        "metadata": {"name": "ledger", "namespace": "shop"},
        "spec": {"replicas": 1, "serviceName": "ledger",
            "selector": {"matchLabels": {"app": "ledger"}},
            "template": {
                "metadata": {"labels": {"app": "ledger"},
                    "annotations": {"backup.velero.io/backup-volumes": "data"}},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": b},
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "main", "image": "postgres:17",
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/data"}]}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}}}]}
    }))
    .expect("a StatefulSet");
    sets.create(&PostParams::default(), &set)
        .await
        .expect("create the StatefulSet");
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    let uid = eventually_within("ledger-0 running on B", TIMEOUT, || async {
        let p = pods.get_opt("ledger-0").await.ok()??;
        let running = p.status.as_ref()?.phase.as_deref() == Some("Running");
        let on_b = p.spec.as_ref()?.node_name.as_deref() == Some(b.as_str());
        (running && on_b).then(|| p.uid())?
    })
    .await;
    let protected = h.protected_pods_on(&b).await;
    assert!(protected.contains_key("shop/ledger-0"), "{protected:?}");
    wait_node_held(&h, &b, &protected).await;
    // EC2's notice; Karpenter reads it from its queue and deletes the NodeClaim (a forceful signal).
    let answer = h
        .cluster
        .act(
            &snapdrain_sim::scenario::timeline::Action::SpotInterruption {
                node: b.clone(),
                notice: NOTICE_MS,
            },
        )
        .expect("the spot interruption");
    assert_eq!(answer["karpenter"], true, "{answer}");
    eventually_within(
        "B gone and ledger-0 off it",
        Duration::from_secs(90),
        || async {
            let gone = h.node(&b).await.is_none();
            let left = pods
                .get_opt("ledger-0")
                .await
                .ok()?
                .is_none_or(|p| p.uid().as_ref() != Some(&uid));
            (gone && left).then_some(())
        },
    )
    .await;
    // The independent judge over what the simulator recorded: no eviction before a verified backup, and
    // no protected pod lost with its node.
    let audit = h.audit();
    let store = |key: ResKey| -> Vec<serde_json::Value> {
        h.cluster
            .store
            .list(&key, None, &|_| true, None, None)
            .items
            .iter()
            .map(|v| (**v).clone())
            .collect()
    };
    let verdict = judge::judge(&Evidence {
        audit: &audit,
        protected: &protected,
        plans: &store(ResKey::new("snapdrain.io", "disruptionplans")),
        backups: &store(ResKey::new("velero.io", "backups")),
        instances: &Launched::all_of(&h.cluster),
        pods: &[],
        nodes: &[],
        pvs: &store(ResKey::core("persistentvolumes")),
        snapshots: &snapdrain_testkit::safety::Ec2Snapshot::all_of(&h.cluster),
        csi_cuts: &snapdrain_testkit::safety::csi_cuts_of(&h.cluster),
    });
    assert!(
        verdict.violations.is_empty() && verdict.let_go.is_empty(),
        "{:#?}",
        verdict
    );
    let plans = h.plans_for(&b).await;
    assert_eq!(plans.len(), 1, "one plan for B: {plans:#?}");
    assert_eq!(
        plans[0].spec.source,
        PlanSource::Karpenter,
        "{:?}",
        plans[0].spec
    );
    let plan = h
        .wait_plan(&plans[0].name_any(), TIMEOUT, |p| p.is_terminal())
        .await;
    assert_no_eviction_before_verified_backup(&audit, &protected, &plan);
}

/// Karpenter's forceful termination (a deleted NodeClaim) evicts through the Eviction API and skips
/// do-not-disrupt pods until terminationGracePeriod (kubernetes-sigs/karpenter
/// `pkg/controllers/node/termination/terminator`). A pod whose user set `do-not-disrupt: "false"` gets no
/// hold from snapdrain (a user's value is never changed), so Karpenter evicts it at once: the gate is what
/// holds it until its backup is verified, and Karpenter's retry then gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn karpenters_forceful_termination_waits_at_the_gate_for_an_unheld_pod() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    users_own_annotation(&h, protected.keys(), "karpenter.sh/do-not-disrupt", "false").await;
    let controller =
        controller_with_gate(&h, "Fail", Lifetimes::default(), Duration::from_secs(30)).await;
    let claim = h.nodeclaim_of(&node).await;
    snapdrain_testkit::karpenter::nodeclaims(&h.client)
        .delete(&claim, &Default::default())
        .await
        .expect("delete the NodeClaim");
    eventually_within("the node gone", Duration::from_secs(90), || async {
        h.node(&node).await.is_none().then_some(())
    })
    .await;
    let plans = h.plans_for(&node).await;
    assert_eq!(plans.len(), 1, "one plan for the node: {plans:#?}");
    let plan = h
        .wait_plan(&plans[0].name_any(), TIMEOUT, |p| p.is_terminal())
        .await;
    let evicted: Vec<String> = h.accepted_evictions().into_iter().map(|(p, _)| p).collect();
    for p in protected.keys() {
        assert!(evicted.contains(p), "Karpenter evicted {p}: {evicted:?}");
    }
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &plan);
    let refused = h
        .audit()
        .into_iter()
        .filter(|e| e.resource == "pods/eviction" && e.code == Some(429))
        .count();
    assert!(refused > 0, "the gate refused Karpenter at least once");
    assert!(
        controller
            .metrics
            .render()
            .contains("snapdrain_gate_decisions_total{decision=\"denied\"}"),
    );
}

/// Cluster Autoscaler's scale-down of a node whose protected pods the user marked
/// `safe-to-evict: "true"` (so snapdrain places no CA hold on them): CA drains through the Eviction API
/// and retries refusals until `--max-pod-eviction-time` (kubernetes/autoscaler
/// `cluster-autoscaler/core/scaledown/actuation/drain.go`); the gate holds each protected pod until its
/// backup is verified, and CA's retry then gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_autoscaler_scale_down_waits_at_the_gate_for_the_verified_backup() {
    let h = Harness::start().await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    users_own_annotation(
        &h,
        protected.keys(),
        "cluster-autoscaler.kubernetes.io/safe-to-evict",
        "true",
    )
    .await;
    let _controller =
        controller_with_gate(&h, "Fail", Lifetimes::default(), Duration::from_secs(30)).await;
    let ca = h
        .cluster
        .autoscaler
        .as_ref()
        .expect("every simulated world runs Cluster Autoscaler");
    assert!(ca.scale_down(&node));
    eventually_within(
        "CA drained the protected pods",
        Duration::from_secs(90),
        || async {
            let by_ca: Vec<String> = snapdrain_testkit::safety::accepted_evictions(&h.audit())
                .into_iter()
                .filter(|e| {
                    e.user_agent.as_deref() == Some(snapdrain_sim::world::autoscaler::USER_AGENT)
                })
                .map(|e| e.pod)
                .collect();
            protected.keys().all(|p| by_ca.contains(p)).then_some(())
        },
    )
    .await;
    let plans = h.plans_for(&node).await;
    assert_eq!(plans.len(), 1, "one plan for the node: {plans:#?}");
    let refused = h
        .audit()
        .into_iter()
        .filter(|e| {
            e.resource == "pods/eviction"
                && e.code == Some(429)
                && e.user_agent.as_deref() == Some(snapdrain_sim::world::autoscaler::USER_AGENT)
        })
        .count();
    assert!(
        refused > 0,
        "the gate refused Cluster Autoscaler at least once"
    );
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &plans[0]);
}

/// A value of the controller's metrics text: the sample line starting with `series` (full name and
/// labels), read as a number.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// A slow API server never turns into an admitted eviction. kube-apiserver admits an eviction whose
/// webhook does not answer within `timeoutSeconds` under `failurePolicy: Ignore` (kubernetes
/// `staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/validating/dispatcher.go`: a call error,
/// a timeout included, is ignored for an Ignore hook), and the simulator's admission does the same. Every
/// read the gate used to make inside the admission call (GET pod, GET node, LIST of every plan) takes
/// longer than the webhook's 5 s here: the gate still refuses kubectl drain's first eviction of a
/// protected pod with 429, answers every review within a second, the plan is still created, and no
/// protected pod leaves before its verified backup.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_api_server_never_lets_a_protected_pod_through_the_gate() {
    let h = Harness::start().await;
    let controller =
        controller_with_gate(&h, "Ignore", Lifetimes::default(), Duration::from_secs(30)).await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    let (ns, pod) = protected
        .keys()
        .next()
        .and_then(|k| k.split_once('/'))
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .expect("a protected pod");
    // The gate's caches are in once a dry run is held for the pod's backup, not for loading.
    let client = client_without_retries(&h);
    eventually_within("the gate has loaded", Duration::from_secs(30), || async {
        match evict_with(&client, &ns, &pod, json!({}), "?dryRun=All").await {
            Err(kube::Error::Api(s)) if s.code == 429 && !s.message.contains("loading") => Some(()),
            _ => None,
        }
    })
    .await;
    for (verb, resource) in [
        ("list", "disruptionplans.snapdrain.io"),
        ("get", "nodes"),
        ("get", "pods"),
    ] {
        h.cluster.faults.add(FaultRule {
            verb: Some(verb.into()),
            resource: Some(resource.into()),
            latency_ms: 6_000,
            ..FaultRule::default()
        });
    }

    let k = Kubectl::new(&h.cluster);
    let drain = k.spawn(&drain_args(&node, "--timeout=240s"));
    let first = eventually_within(
        "kubectl's first eviction of a protected pod",
        Duration::from_secs(30),
        || async {
            h.audit().into_iter().find(|e| {
                e.resource == "pods/eviction"
                    && e.verb == "create"
                    && protected.contains_key(&format!(
                        "{}/{}",
                        e.namespace.as_deref().unwrap_or_default(),
                        e.name.as_deref().unwrap_or_default()
                    ))
                    && e.user_agent
                        .as_deref()
                        .is_some_and(|a| a.starts_with("kubectl"))
            })
        },
    )
    .await;
    assert_eq!(
        first.code,
        Some(429),
        "the first eviction of a protected pod is refused: {first:?}"
    );
    // While the API server stays slow: the gate's plan is created, backs the node up and releases it.
    let plan = eventually_within("the gate's plan", Duration::from_secs(60), || async {
        gate_plans(&h.client, &node).await.pop()
    })
    .await;
    let plan = h
        .wait_plan_until(&plan.name_any(), Duration::from_secs(120), |p| {
            p.status.as_ref().is_some_and(|s| s.released_at.is_some())
        })
        .await;
    // kubectl waits for each evicted pod's deletion with a GET a second: the rest of the drain runs at
    // the API server's normal speed.
    h.cluster.faults.set(Vec::new());
    let (ok, stdout, stderr) = drain.finish().await;
    assert!(ok, "kubectl drain completes:\n{stdout}\n{stderr}");
    let plans = gate_plans(&h.client, &node).await;
    assert_eq!(plans.len(), 1, "one plan for the node: {plans:#?}");
    assert_no_eviction_before_verified_backup(&h.audit(), &protected, &plan);
    let metrics = controller.metrics.render();
    let answered = sample(&metrics, "snapdrain_gate_decision_duration_seconds_count ")
        .expect("the gate answered");
    let within_a_second = sample(
        &metrics,
        "snapdrain_gate_decision_duration_seconds_bucket{le=\"1.024\"} ",
    )
    .expect("the gate's latency histogram");
    assert_eq!(
        within_a_second, answered,
        "every review answered within a second:\n{metrics}"
    );
}

/// The gate's CA (PEM) from its Secret.
async fn gate_ca(client: &Client) -> Vec<u8> {
    Api::<Secret>::namespaced(client.clone(), NS)
        .get("snapdrain-webhook-tls")
        .await
        .expect("the gate's Secret")
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .expect("a CA in the Secret")
        .0
        .clone()
}

/// A slowloris client: opens TLS to the gate as kube-apiserver would (trusting its CA, under the
/// Service's name), starts a request and sends its headers a byte every half second. Returns how long
/// the gate kept the connection open.
async fn slowloris(addr: SocketAddr, ca: Vec<u8>) -> Duration {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(&ca) {
        roots.add(cert.expect("CA PEM")).expect("a CA certificate");
    }
    let mut tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the gate");
    let name =
        rustls::pki_types::ServerName::try_from(format!("{SERVICE}.{NS}.svc")).expect("a DNS name");
    let mut stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls))
        .connect(name, tcp)
        .await
        .expect("the TLS handshake");
    let opened = tokio::time::Instant::now();
    stream
        .write_all(format!("POST /validate HTTP/1.1\r\nHost: {SERVICE}.{NS}.svc\r\n").as_bytes())
        .await
        .expect("the request line");
    let mut trickle = b"content-type: application/json\r\n".iter().cycle();
    let mut buf = [0u8; 256];
    loop {
        tokio::select! {
            read = stream.read(&mut buf) => match read {
                Ok(n) if n > 0 => {}
                _ => return opened.elapsed(),
            },
            _ = tokio::time::sleep(Duration::from_millis(500)) => {
                let byte = [*trickle.next().expect("cycles forever")];
                if stream.write_all(&byte).await.is_err() || stream.flush().await.is_err() {
                    return opened.elapsed();
                }
            }
        }
    }
}

/// Slow clients never keep reviews from being answered (security review H-2): while 40 connections
/// trickle their headers, every eviction the API server sends through the gate is answered (with
/// `failurePolicy: Fail`, an unanswered call would be a 500, not the gate's 429), and the gate closes
/// each slow connection once its first request is late (`webhook::limits::FIRST_REQUEST`), so they
/// cannot pile up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_clients_never_keep_reviews_from_being_answered() {
    let h = Harness::start().await;
    let controller =
        controller_with_gate(&h, "Fail", Lifetimes::default(), Duration::from_secs(30)).await;
    let addr = controller.webhook_addr.expect("the gate listens");
    let node = h.node_with_statefulset_pods().await;
    let (ns, pod) = h
        .protected_pods_on(&node)
        .await
        .into_keys()
        .next()
        .and_then(|k| k.split_once('/').map(|(a, b)| (a.to_owned(), b.to_owned())))
        .expect("a protected pod");
    let client = client_without_retries(&h);
    let held = || async {
        match evict_with(&client, &ns, &pod, json!({}), "?dryRun=All").await {
            Err(kube::Error::Api(s)) => (s.code, s.message),
            other => (0, format!("{other:?}")),
        }
    };
    eventually_within("the gate has loaded", Duration::from_secs(30), || async {
        let (code, message) = held().await;
        (code == 429 && !message.contains("loading")).then_some(())
    })
    .await;
    let ca = gate_ca(&h.client).await;
    let slow: Vec<_> = (0..40)
        .map(|_| tokio::spawn(slowloris(addr, ca.clone())))
        .collect();
    for _ in 0..20 {
        let asked = tokio::time::Instant::now();
        let (code, message) = held().await;
        assert_eq!(code, 429, "the gate answered: {message}");
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "answered in {:?}",
            asked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let limit = snapdrain::webhook::limits::FIRST_REQUEST + Duration::from_secs(10);
    for s in slow {
        let kept = tokio::time::timeout(limit, s)
            .await
            .unwrap_or_else(|_| panic!("a slowloris connection was still open after {limit:?}"))
            .expect("the slow client ran");
        assert!(
            kept >= snapdrain::webhook::limits::FIRST_REQUEST - Duration::from_secs(1),
            "closed after {kept:?}: not before its first request was late"
        );
    }
}

/// snapdrain's own Execute plan under `backup.policy: skip` drains its node with the gate on (review
/// #9): the plan's drain evicts protected pods with no backup, as the person asked
/// (`planning::drain::gate_eviction`), and the gate lets those evictions through instead of refusing
/// them until the drain times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_gate_lets_snapdrains_own_drain_without_a_required_backup_through() {
    let h = Harness::start().await;
    // The platform team allows plans without a backup (refused by default, security review C-1).
    h.set_policy(json!({"planSettings": {"allowBackupSkip": true}}))
        .await;
    let _controller =
        controller_with_gate(&h, "Fail", Lifetimes::default(), Duration::from_secs(30)).await;
    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    h.create_plan(
        "skip-backup",
        json!({"nodes": [node], "backup": {"policy": "skip"}}),
    )
    .await;
    eventually_within(
        "the plan evicted the protected pods",
        Duration::from_secs(90),
        || async {
            let evicted: Vec<String> = h.accepted_evictions().into_iter().map(|(p, _)| p).collect();
            protected.keys().all(|p| evicted.contains(p)).then_some(())
        },
    )
    .await;
}

/// The answer to a dry-run eviction of `ns/name` (the pod stays): its code and message.
async fn dry_run_eviction(client: &Client, ns: &str, name: &str) -> (u16, String) {
    match evict_with(client, ns, name, json!({}), "?dryRun=All").await {
        Ok(_) => (201, String::new()),
        Err(kube::Error::Api(s)) => (s.code, s.message),
        Err(e) => panic!("eviction of {ns}/{name} got no answer: {e}"),
    }
}

/// A Velero Backup in `velero` labelled and annotated for plan `plan` (uid `plan_uid`) as snapdrain
/// labels its own (`planning::backups::build_velero_backup`), of namespace `ns`, at `location` (None:
/// Velero's default location).
async fn backup_for(
    h: &Harness,
    name: &str,
    plan: &str,
    plan_uid: &str,
    ns: &str,
    location: Option<&str>,
) {
    let mut backup: snapdrain::api::velero::Backup = serde_json::from_value(json!({
        "apiVersion": "velero.io/v1", "kind": "Backup",
        "metadata": {"name": name, "namespace": "velero",
            "labels": {"snapdrain.io/plan": plan, "snapdrain.io/plan-uid": plan_uid,
                       "snapdrain.io/namespace": ns},
            "annotations": {"snapdrain.io/plan-name": plan}},
        "spec": {"includedNamespaces": [ns]}
    }))
    .expect("a Backup");
    backup.spec.storage_location = location.map(str::to_owned);
    Api::<snapdrain::api::velero::Backup>::namespaced(h.client.clone(), "velero")
        .create(&PostParams::default(), &backup)
        .await
        .expect("create the Backup");
}

async fn backup_phase(h: &Harness, name: &str) -> Option<String> {
    Api::<snapdrain::api::velero::Backup>::namespaced(h.client.clone(), "velero")
        .get_opt(name)
        .await
        .expect("read the Backup")?
        .status?
        .phase
}

/// Security review M-2: the gate does not trust a plan's status alone. Here a replica serves the gate
/// while another holds the Lease (so no reconcile rewrites the plan), and the plan's status is written
/// by hand, as a status writer that is not snapdrain could (a cluster without the plan-status
/// admission policy). A verified backup that names no Backup, or a Backup Velero failed
/// (FailedValidation: its storage location does not exist, velero `pkg/controller/backup_controller.go`
/// `prepareBackupRequest`), keeps the protected pod with a message saying why; a Backup the simulated
/// Velero completed for the plan lets the (dry-run) eviction through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_status_naming_a_missing_or_failed_backup_never_lets_a_protected_pod_go() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Patch, PatchParams};

    let h = Harness::start().await;
    namespace(&h.client, NS, json!({})).await;
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "snapdrain-controller", "namespace": NS},
        "spec": {"holderIdentity": "replica-elsewhere", "leaseDurationSeconds": 3600,
                 "acquireTime": now, "renewTime": now}
    }))
    .expect("a Lease");
    Api::<Lease>::namespaced(h.client.clone(), NS)
        .create(&PostParams::default(), &lease)
        .await
        .expect("another replica holds the Lease");
    configuration(&h.client, "Fail", None).await;
    let controller = h
        .controller_with(
            snapdrain_testkit::gate::leased_gate_options(),
            "snapdrain-0",
        )
        .await;
    service(
        &h.client,
        controller.webhook_addr.expect("the gate listens"),
    )
    .await;
    assert!(
        !*controller.leading.borrow(),
        "this replica only serves the gate"
    );

    let node = h.node_with_statefulset_pods().await;
    let protected = h.protected_pods_on(&node).await;
    let (pod, claims) = protected
        .iter()
        .next()
        .expect("a protected pod on the node");
    let (ns, name) = pod.split_once('/').expect("ns/name");
    let plan = h.create_plan("forged", json!({"nodes": [node]})).await;
    let plan_uid = plan.metadata.uid.clone().expect("a stored plan has a uid");
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    let forge = |backup: &str| {
        json!({"status": {"phase": "Draining", "backups": [{
            "name": backup, "namespace": ns, "pvcs": claims, "attempt": 1, "verified": true
        }]}})
    };
    let client = client_without_retries(&h);
    let refused_for = |why: String| {
        let client = client.clone();
        async move {
            let (code, message) = dry_run_eviction(&client, ns, name).await;
            (code == 429 && message.contains(&why)).then_some(message)
        }
    };

    // 1. The status names a Backup that does not exist.
    plans
        .patch_status(
            "forged",
            &PatchParams::default(),
            &Patch::Merge(forge("made-up")),
        )
        .await
        .expect("write the plan's status by hand");
    let message = eventually_within("refused: no such Backup", TIMEOUT, || {
        refused_for("Backup velero/made-up does not exist".into())
    })
    .await;
    assert!(message.contains("not trusted"), "{message}");

    // 2. It names a Backup of the plan that Velero failed.
    backup_for(
        &h,
        "failed-one",
        "forged",
        &plan_uid,
        ns,
        Some("no-such-location"),
    )
    .await;
    eventually_within("Velero fails the Backup", TIMEOUT, || async {
        (backup_phase(&h, "failed-one").await.as_deref() == Some("FailedValidation")).then_some(())
    })
    .await;
    plans
        .patch_status(
            "forged",
            &PatchParams::default(),
            &Patch::Merge(forge("failed-one")),
        )
        .await
        .expect("write the plan's status by hand");
    eventually_within("refused: the Backup failed", TIMEOUT, || {
        refused_for("Backup velero/failed-one is FailedValidation, not Completed".into())
    })
    .await;

    // 3. A Backup Velero completed for the plan and namespace confirms the record.
    backup_for(&h, "completed-one", "forged", &plan_uid, ns, None).await;
    eventually_within("Velero completes the Backup", TIMEOUT, || async {
        (backup_phase(&h, "completed-one").await.as_deref() == Some("Completed")).then_some(())
    })
    .await;
    plans
        .patch_status(
            "forged",
            &PatchParams::default(),
            &Patch::Merge(forge("completed-one")),
        )
        .await
        .expect("write the plan's status by hand");
    eventually_within(
        "the confirmed backup lets the eviction through",
        TIMEOUT,
        || {
            let client = client.clone();
            async move { (dry_run_eviction(&client, ns, name).await.0 == 201).then_some(()) }
        },
    )
    .await;
    controller.shutdown().await;
}
