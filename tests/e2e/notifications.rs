//! The DisruptionPolicy's notification webhook: every plan Event is POSTed as JSON, in order, retried
//! while the receiver answers 5xx, and filtered by `reasons`. The receiver is a real HTTP server here.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use snapdrain::api::DisruptionPolicy;
use snapdrain::api::status::PlanPhase;
use snapdrain_sim::apiserver::faults::FaultRule;
use snapdrain_testkit::eventually_within;
use snapdrain_testkit::harness::{Harness, TIMEOUT};

/// What the receiver saw: every body, and how many requests it refused first.
#[derive(Default)]
struct Inbox {
    bodies: Vec<Value>,
    refuse_first: usize,
    refused: usize,
}

async fn receive(State(inbox): State<Arc<Mutex<Inbox>>>, body: axum::body::Bytes) -> StatusCode {
    let mut inbox = inbox.lock().expect("not poisoned");
    if inbox.refused < inbox.refuse_first {
        inbox.refused += 1;
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    match serde_json::from_slice(&body) {
        Ok(v) => {
            inbox.bodies.push(v);
            StatusCode::OK
        }
        Err(_) => StatusCode::BAD_REQUEST,
    }
}

async fn receiver(refuse_first: usize) -> (String, Arc<Mutex<Inbox>>) {
    let inbox = Arc::new(Mutex::new(Inbox {
        refuse_first,
        ..Inbox::default()
    }));
    let app = Router::new()
        .route("/hook", post(receive))
        .with_state(inbox.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the receiver");
    let addr = listener.local_addr().expect("bound");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/hook"), inbox)
}

async fn policy(h: &Harness, webhook: Value) {
    let p: DisruptionPolicy = serde_json::from_value(json!({
        "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": "default"}, "spec": {"notifications": {"webhook": webhook}}
    }))
    .expect("a policy");
    Api::<DisruptionPolicy>::all(h.client.clone())
        .create(&PostParams::default(), &p)
        .await
        .expect("create the policy");
}

fn reasons(inbox: &Mutex<Inbox>) -> Vec<String> {
    inbox
        .lock()
        .expect("not poisoned")
        .bodies
        .iter()
        .map(|b| b["reason"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_plan_event_reaches_the_webhook_in_order_despite_refusals() {
    let h = Harness::start().await;
    let (url, inbox) = receiver(2).await;
    // A loopback http receiver: both allowed explicitly (the defaults refuse them).
    policy(
        &h,
        json!({"url": url, "retries": 5, "allowInsecureHttp": true, "allowPrivateAddresses": true}),
    )
    .await;
    let controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan("notified", json!({"nodes": [node]})).await;
    let done = h.wait_plan("notified", TIMEOUT, |p| p.is_terminal()).await;
    assert_eq!(
        done.status.as_ref().map(|s| s.phase),
        Some(PlanPhase::Completed)
    );
    eventually_within(
        "PlanCompleted notified",
        Duration::from_secs(30),
        || async {
            reasons(&inbox)
                .iter()
                .any(|r| r == "PlanCompleted")
                .then_some(())
        },
    )
    .await;
    let seen = reasons(&inbox);
    let at = |r: &str| {
        seen.iter()
            .position(|x| x == r)
            .unwrap_or_else(|| panic!("{r} was notified: {seen:?}"))
    };
    assert!(at("BackingUp") < at("BackupVerified"), "{seen:?}");
    assert!(at("BackupVerified") < at("PlanCompleted"), "{seen:?}");
    let bodies = inbox.lock().expect("not poisoned").bodies.clone();
    let completed = bodies
        .iter()
        .find(|b| b["reason"] == "PlanCompleted")
        .expect("found above");
    assert_eq!(completed["kind"], "DisruptionPlanEvent");
    assert_eq!(completed["plan"], "notified");
    assert_eq!(completed["type"], "Normal");
    assert_eq!(completed["nodes"], json!([node]));
    assert_eq!(inbox.lock().expect("not poisoned").refused, 2);
    let metrics = controller.metrics.render();
    assert!(
        metrics.contains("snapdrain_notifications_total{result=\"sent\"}"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reasons_narrow_what_the_webhook_receives() {
    let h = Harness::start().await;
    let (url, inbox) = receiver(0).await;
    policy(
        &h,
        json!({"url": url, "reasons": ["PlanCompleted", "PlanFailed"],
               "allowInsecureHttp": true, "allowPrivateAddresses": true}),
    )
    .await;
    let _controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan("filtered", json!({"nodes": [node]})).await;
    h.wait_plan("filtered", TIMEOUT, |p| p.is_terminal()).await;
    eventually_within(
        "PlanCompleted notified",
        Duration::from_secs(30),
        || async { (!reasons(&inbox).is_empty()).then_some(()) },
    )
    .await;
    assert_eq!(reasons(&inbox), vec!["PlanCompleted".to_string()]);
}

/// How many times an Event with `reason` was published about plan `plan`: a series (kube-runtime's
/// Recorder folds repeats of the same Event into one object) counts each occurrence.
async fn event_count(h: &Harness, plan: &str, reason: &str) -> i32 {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(h.client.clone());
    events
        .list(&Default::default())
        .await
        .expect("list Events")
        .items
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(plan))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum()
}

/// A step's news goes out with the status write that records it: when the API server refuses that write
/// (a 500, as a lost etcd leader gives), the next pass does the step again and must not announce it
/// again. Here the write that takes the plan to Draining, which carries the verification, is refused
/// twice; BackupVerified is still published once, as Event and as notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_status_write_repeats_no_event_and_no_notification() {
    let h = Harness::start().await;
    let (url, inbox) = receiver(0).await;
    policy(
        &h,
        json!({"url": url, "allowInsecureHttp": true, "allowPrivateAddresses": true}),
    )
    .await;
    h.cluster.faults.add(FaultRule {
        verb: Some("patch".into()),
        resource: Some("disruptionplans.snapdrain.io/status".into()),
        body_contains: Some(r#""phase":"Draining""#.into()),
        error_rate: 1.0,
        times: Some(2),
        ..FaultRule::default()
    });
    let _controller = h.controller().await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan("refused-twice", json!({"nodes": [node]}))
        .await;
    let done = h
        .wait_plan("refused-twice", TIMEOUT, |p| p.is_terminal())
        .await;
    assert_eq!(
        done.status.as_ref().map(|s| s.phase),
        Some(PlanPhase::Completed)
    );
    let refused = h
        .audit()
        .iter()
        .filter(|e| {
            e.resource == "disruptionplans.snapdrain.io/status"
                && e.name.as_deref() == Some("refused-twice")
                && e.code == Some(500)
        })
        .count();
    assert_eq!(refused, 2, "the fault refused the Draining write twice");
    eventually_within(
        "PlanCompleted notified",
        Duration::from_secs(30),
        || async {
            reasons(&inbox)
                .iter()
                .any(|r| r == "PlanCompleted")
                .then_some(())
        },
    )
    .await;
    let notified = reasons(&inbox)
        .iter()
        .filter(|r| *r == "BackupVerified")
        .count();
    assert_eq!(
        notified,
        1,
        "BackupVerified notified once: {:?}",
        reasons(&inbox)
    );
    eventually_within(
        "the PlanCompleted Event",
        Duration::from_secs(30),
        || async { (event_count(&h, "refused-twice", "PlanCompleted").await > 0).then_some(()) },
    )
    .await;
    assert_eq!(event_count(&h, "refused-twice", "BackupVerified").await, 1);
    assert_eq!(event_count(&h, "refused-twice", "Draining").await, 1);
}

/// The `NotificationsReady` condition of the policy, as (status, reason, message).
async fn notifications_ready(h: &Harness) -> Option<(String, String, String)> {
    let policy = Api::<DisruptionPolicy>::all(h.client.clone())
        .get("default")
        .await
        .expect("read the policy");
    policy
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "NotificationsReady")
        .map(|c| (c.status, c.reason, c.message))
}

async fn wait_reason(h: &Harness, reason: &str) -> (String, String, String) {
    eventually_within(
        &format!("NotificationsReady reason {reason}"),
        Duration::from_secs(30),
        || async { notifications_ready(h).await.filter(|c| c.1 == reason) },
    )
    .await
}

/// Security review M-5: the webhook's URL (a chat webhook's URL is its credential) comes from a Secret
/// in snapdrain's namespace, `urlSecretRef`, not from the cluster-readable policy. A missing Secret, a
/// missing key and a URL the checks refuse (a loopback address without allowPrivateAddresses) are each
/// the policy's condition, naming the Secret and never the URL's path; the controller keeps running,
/// and once the Secret and the policy are right the plan's Events reach the receiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_webhook_url_comes_from_a_secret_and_every_problem_is_a_policy_condition() {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{Namespace, Secret};

    let h = Harness::start().await;
    let (url, inbox) = receiver(0).await;
    let namespaces: Api<Namespace> = Api::all(h.client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "snapdrain"}})).expect("a namespace");
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create namespace snapdrain: {e}"),
    }
    let by_ref = |private: bool| {
        json!({"urlSecretRef": {"name": "chat-url", "key": "url"}, "allowInsecureHttp": true,
               "allowPrivateAddresses": private})
    };
    policy(&h, by_ref(false)).await;
    // The harness's controller runs in namespace snapdrain and reads the Secret again every 500 ms.
    let _controller = h.controller().await;

    let (status, _, message) = wait_reason(&h, "SecretNotFound").await;
    assert_eq!(status, "False");
    assert!(message.contains("snapdrain/chat-url"), "{message}");

    let secrets: Api<Secret> = Api::namespaced(h.client.clone(), "snapdrain");
    let secret = |key: &str, value: &str| -> Secret {
        serde_json::from_value(json!({"metadata": {"name": "chat-url", "namespace": "snapdrain"}}))
            .map(|mut s: Secret| {
                s.data = Some([(key.to_owned(), ByteString(value.as_bytes().to_vec()))].into());
                s
            })
            .expect("a Secret")
    };
    secrets
        .create(&PostParams::default(), &secret("other", "x"))
        .await
        .expect("create the Secret");
    let (_, _, message) = wait_reason(&h, "SecretKeyNotFound").await;
    assert!(message.contains("its keys: other"), "{message}");

    // The receiver listens on loopback: refused while the policy does not allow private addresses.
    secrets
        .replace(
            "chat-url",
            &PostParams::default(),
            &secret("url", &format!("{url}\n")),
        )
        .await
        .expect("put the URL in the Secret");
    let (_, _, message) = wait_reason(&h, "URLRefused").await;
    assert!(message.contains("allowPrivateAddresses"), "{message}");
    assert!(
        !message.contains("/hook"),
        "the URL's path is not shown: {message}"
    );

    h.set_policy(json!({"notifications": {"webhook": by_ref(true)}}))
        .await;
    let (status, _, message) = wait_reason(&h, "URLResolved").await;
    assert_eq!(status, "True");
    assert!(
        !message.contains("/hook"),
        "the URL's path is not shown: {message}"
    );

    let node = h.node_with_statefulset_pods().await;
    h.create_plan("from-secret", json!({"nodes": [node]})).await;
    let done = h
        .wait_plan("from-secret", TIMEOUT, |p| p.is_terminal())
        .await;
    assert_eq!(
        done.status.as_ref().map(|s| s.phase),
        Some(PlanPhase::Completed)
    );
    eventually_within(
        "PlanCompleted notified",
        Duration::from_secs(30),
        || async {
            reasons(&inbox)
                .iter()
                .any(|r| r == "PlanCompleted")
                .then_some(())
        },
    )
    .await;
    let policy = Api::<DisruptionPolicy>::all(h.client.clone())
        .get("default")
        .await
        .expect("read the policy");
    let shown = serde_json::to_string(&policy).expect("serializes");
    assert!(
        !shown.contains("/hook"),
        "the policy never holds the URL: {shown}"
    );
}
