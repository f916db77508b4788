//! Bad AdmissionReview bodies never break the gate: many mutated and random bodies (deterministic seed)
//! are POSTed to the running gate over TLS, and every answer is well formed: a v1 AdmissionReview
//! echoing the request's uid (a 429 hold carries a message), or a 400/500 `Status` with a message, never
//! a dropped connection. What kube-apiserver accepts as an answer: `apiserver/pkg/admission/plugin/
//! webhook/request/admissionreview.go` (`VerifyAdmissionResponse`: response present, uid matches, kind
//! `admission.k8s.io/v1, Kind=AdmissionReview`); anything else is a failed call, and failurePolicy applies.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use snapdrain::controller::ControllerHandle;
use snapdrain::controller::run::RunOptions;
use snapdrain::webhook::{Lifetimes, WebhookConfig};
use snapdrain_testkit::eviction::namespace;
use snapdrain_testkit::harness::Harness;

const HOST: &str = "snapdrain-webhook.snapdrain.svc";

fn eviction_review(pod: &str, ns: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "0b6c1e8a-1111-2222-3333-444455556666",
            "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "eviction",
            "requestKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "requestSubResource": "eviction",
            "name": pod, "namespace": ns, "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:karpenter"},
            "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod, "namespace": ns}},
            "oldObject": null, "dryRun": true,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "dryRun": ["All"]}
        }
    })
}

fn random_value(rng: &mut StdRng, depth: u32) -> Value {
    match rng.random_range(0..if depth > 2 { 5 } else { 7 }) {
        0 => Value::Null,
        1 => json!(rng.random::<bool>()),
        2 => json!(rng.random::<i64>()),
        3 => json!(rng.random::<f64>()),
        4 => {
            let pick = [
                "",
                "CREATE",
                "pods",
                "eviction",
                "v1",
                "admission.k8s.io/v1",
                "\u{0}",
                "ü",
                "AdmissionReview",
            ];
            json!(pick[rng.random_range(0..pick.len())])
        }
        5 => Value::Array(
            (0..rng.random_range(0..3))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let mut m = serde_json::Map::new();
            for i in 0..rng.random_range(0..3) {
                m.insert(format!("k{i}"), random_value(rng, depth + 1));
            }
            Value::Object(m)
        }
    }
}

/// Every object path in `v` (as JSON pointers), the root included.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => m
            .iter()
            .for_each(|(k, c)| pointers(c, format!("{at}/{k}"), out)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, c)| pointers(c, format!("{at}/{i}"), out)),
        _ => {}
    }
}

/// One bad body: a valid review with a field replaced or removed, cut short, with bytes flipped, or
/// random bytes.
fn mutated(rng: &mut StdRng, base: &Value) -> Vec<u8> {
    let mut v = base.clone();
    let mut paths = Vec::new();
    pointers(&v, String::new(), &mut paths);
    match rng.random_range(0..6) {
        0 | 1 => {
            let p = &paths[rng.random_range(0..paths.len())];
            let new = random_value(rng, 0);
            match v.pointer_mut(p) {
                Some(slot) => *slot = new,
                None => v = new,
            }
            serde_json::to_vec(&v).unwrap_or_default()
        }
        2 => {
            let p = paths[rng.random_range(1..paths.len())].clone();
            if let Some((parent, key)) = p.rsplit_once('/')
                && let Some(Value::Object(m)) = v.pointer_mut(parent)
            {
                m.remove(key);
            }
            serde_json::to_vec(&v).unwrap_or_default()
        }
        3 => {
            let bytes = serde_json::to_vec(&v).unwrap_or_default();
            bytes[..rng.random_range(0..bytes.len())].to_vec()
        }
        4 => {
            let mut bytes = serde_json::to_vec(&v).unwrap_or_default();
            for _ in 0..rng.random_range(1..4) {
                let i = rng.random_range(0..bytes.len());
                bytes[i] = rng.random();
            }
            bytes
        }
        _ => (0..rng.random_range(0..64)).map(|_| rng.random()).collect(),
    }
}

/// Checks one answer; returns a description of what is wrong, if anything.
fn malformed(sent: &[u8], status: u16, body: &[u8]) -> Option<String> {
    let answer: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Some(format!("HTTP {status}: the body is not JSON ({e})")),
    };
    match status {
        200 => {
            if answer["apiVersion"] != "admission.k8s.io/v1" || answer["kind"] != "AdmissionReview"
            {
                return Some(format!("200 but not a v1 AdmissionReview: {answer}"));
            }
            let r = &answer["response"];
            let uid = serde_json::from_slice::<Value>(sent)
                .ok()
                .and_then(|v| v.pointer("/request/uid").cloned());
            if Some(&r["uid"]) != uid.as_ref() {
                return Some(format!("the uid is not echoed: {answer}"));
            }
            match r["allowed"].as_bool() {
                Some(true) => None,
                Some(false)
                    if r["status"]["code"] == 429
                        && r["status"]["message"]
                            .as_str()
                            .is_some_and(|m| !m.is_empty()) =>
                {
                    None
                }
                _ => Some(format!(
                    "neither allowed nor a 429 with a message: {answer}"
                )),
            }
        }
        400 | 500 => (answer["kind"] != "Status"
            || answer["message"].as_str().is_none_or(str::is_empty))
        .then(|| format!("HTTP {status} without a Status message: {answer}")),
        other => Some(format!("unexpected HTTP {other}: {answer}")),
    }
}

/// The controller with its gate on a free port (`in_flight` reviews at once), and an HTTPS client that
/// trusts only the gate's CA and reaches it under the Service name, as kube-apiserver does; with the
/// URL of `/validate`.
async fn gate(h: &Harness, in_flight: usize) -> (ControllerHandle, reqwest::Client, String) {
    namespace(&h.client, "snapdrain", json!({})).await;
    let controller = h
        .controller_with(
            RunOptions {
                lease_namespace: None,
                webhook: Some(WebhookConfig {
                    addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
                    lifetimes: Lifetimes::default(),
                    resync: Duration::from_secs(30),
                    in_flight,
                    ..WebhookConfig::default()
                }),
                ..RunOptions::default()
            },
            "snapdrain-0",
        )
        .await;
    let addr = controller.webhook_addr.expect("the gate listens");
    let secret = Api::<Secret>::namespaced(h.client.clone(), "snapdrain")
        .get("snapdrain-webhook-tls")
        .await
        .expect("the gate's Secret");
    let ca = secret
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .expect("a CA")
        .0
        .clone();
    let https = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).expect("CA PEM"))
        .resolve(HOST, addr)
        .no_proxy()
        .build()
        .expect("HTTPS client");
    let url = format!("https://{HOST}:{}/validate", addr.port());
    (controller, https, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutated_and_random_admission_reviews_get_well_formed_answers() {
    let h = Harness::start().await;
    let (controller, https, url) = gate(&h, snapdrain::webhook::limits::IN_FLIGHT).await;

    let node = h.node_with_statefulset_pods().await;
    let pod = h
        .protected_pods_on(&node)
        .await
        .into_keys()
        .next()
        .expect("a protected pod");
    let (ns, name) = pod.split_once('/').expect("ns/name");
    let base = eviction_review(name, ns);
    let mut rng = StdRng::seed_from_u64(0x5eed_9a7e);
    let mut bodies = vec![serde_json::to_vec(&base).expect("JSON")];
    bodies.extend((0..400).map(|_| mutated(&mut rng, &base)));
    let mut problems = Vec::new();
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    for body in &bodies {
        let resp = https
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "the gate dropped a request ({e}) for {}",
                    String::from_utf8_lossy(body)
                )
            });
        let status = resp.status().as_u16();
        let answer = resp.bytes().await.expect("the answer's body");
        *by_status.entry(status).or_default() += 1;
        if let Some(p) = malformed(body, status, &answer) {
            problems.push(format!("{p}\n  for {}", String::from_utf8_lossy(body)));
        }
    }
    assert!(
        problems.is_empty(),
        "{} malformed answers:\n{}",
        problems.len(),
        problems.join("\n")
    );
    // The stream exercised every kind of answer: holds, allowances and refusals to read.
    for code in [200, 400] {
        assert!(
            by_status.contains_key(&code),
            "no HTTP {code} among {by_status:?}"
        );
    }
    controller.shutdown().await;
}

/// POSTs `body` to the gate; the HTTP status and the answer as JSON (Null when it is not JSON).
async fn post(https: &reqwest::Client, url: &str, body: Vec<u8>) -> (u16, Value) {
    let resp = https
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("the gate answers");
    let status = resp.status().as_u16();
    let answer = resp.bytes().await.expect("the answer's body");
    (
        status,
        serde_json::from_slice(&answer).unwrap_or(Value::Null),
    )
}

/// A review as kube-apiserver sends it for a real (not dry-run) eviction of `ns/pod`.
fn real_eviction_review(pod: &str, ns: &str) -> Vec<u8> {
    let mut review = eviction_review(pod, ns);
    review["request"]["dryRun"] = json!(false);
    review["request"]["options"] = json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"});
    serde_json::to_vec(&review).expect("JSON")
}

/// Sends `body` to the gate's `/validate` over HTTP/1.1 on its own TLS connection (trusting `ca`, under
/// the Service's name) and returns the answer's status line. The body is written while the answer is
/// read: a gate that refuses a body early answers and closes while the client still writes, which an
/// HTTP client library reports as a broken pipe instead of the answer.
async fn status_line_for(addr: std::net::SocketAddr, ca: &[u8], body: Vec<u8>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(ca) {
        roots.add(cert.expect("CA PEM")).expect("a CA certificate");
    }
    let mut tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the gate");
    let name = rustls::pki_types::ServerName::try_from(HOST).expect("a DNS name");
    let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls))
        .connect(name, tcp)
        .await
        .expect("the TLS handshake");
    let (mut rx, mut tx) = tokio::io::split(stream);
    let head = format!(
        "POST /validate HTTP/1.1\r\nHost: {HOST}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let writer = tokio::spawn(async move {
        // The gate may answer and close before all of it is sent: the write's outcome is not the test.
        let _ = tx.write_all(head.as_bytes()).await;
        let _ = tx.write_all(&body).await;
        let _ = tx.flush().await;
    });
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(2).any(|w| w == b"\r\n") {
        let n = rx.read(&mut buf).await.expect("the gate answers");
        assert!(n > 0, "the gate closed without an answer");
        answer.extend_from_slice(&buf[..n]);
    }
    writer.abort();
    let text = String::from_utf8_lossy(&answer);
    text.lines().next().unwrap_or_default().to_string()
}

/// Issue 22 item 3: a 16 MiB review is answered 413 (axum's `DefaultBodyLimit`, made explicit as
/// `webhook::limits::BODY`), and the gate still answers the next review. Without a body limit
/// (`DefaultBodyLimit::disable()`) the 16 MiB body is read and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_16_mib_review_is_answered_413() {
    let h = Harness::start().await;
    let (controller, https, url) = gate(&h, snapdrain::webhook::limits::IN_FLIGHT).await;
    let addr = controller.webhook_addr.expect("the gate listens");
    let ca = Api::<Secret>::namespaced(h.client.clone(), "snapdrain")
        .get("snapdrain-webhook-tls")
        .await
        .expect("the gate's Secret")
        .data
        .and_then(|d| d.get("ca.crt").map(|c| c.0.clone()))
        .expect("a CA");
    // A well-formed review whose user info carries 16 MiB of groups.
    let mut big = eviction_review("web-0", "shop");
    big["request"]["userInfo"]["groups"] = json!(vec!["g".repeat(1024); 16 * 1024]);
    let big = serde_json::to_vec(&big).expect("JSON");
    assert!(big.len() >= 16 * 1024 * 1024, "{}", big.len());
    let line = status_line_for(addr, &ca, big).await;
    assert!(line.starts_with("HTTP/1.1 413"), "{line}");
    let (status, answer) = post(&https, &url, real_eviction_review("no-such-pod", "shop")).await;
    assert_eq!(status, 200, "{answer}");
    controller.shutdown().await;
}

/// Over the in-flight cap the gate answers 503 with a Status naming the cap at once, never a queue, and
/// counts it as an error decision. The cap is lowered to 0 for the test: a review is answered from
/// memory in microseconds, so no client can hold 64 places open. Without the cap the review is
/// answered 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_the_in_flight_cap_a_review_is_answered_503() {
    let h = Harness::start().await;
    let (controller, https, url) = gate(&h, 0).await;
    let (status, answer) = post(&https, &url, real_eviction_review("no-such-pod", "shop")).await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["kind"], "Status", "{answer}");
    assert_eq!(answer["reason"], "ServiceUnavailable", "{answer}");
    let message = answer["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("answering 0 reviews already; retry"),
        "{message}"
    );
    controller.shutdown().await;
}

/// A caller of the gate can at most start the rate-limited backup of a node that really runs protected
/// pods (issue 22 item 3). Forged reviews for a pod the cache does not hold are allowed and start
/// nothing; a burst of forged reviews for a real protected pod starts one plan for its node (the
/// starter's one start per node, then SETTLE). A review for a protected pod on a second node is the
/// marker: once its plan exists the earlier reviews were all handled. Without the rate limit every
/// review would POST a plan (join_or_create then answers 409s, but the burst is what reaches the API).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_reviews_start_at_most_one_plan_and_only_for_a_cached_protected_pod() {
    use snapdrain::api::{DisruptionPlan, PlanSource};
    let h = Harness::start().await;
    let (controller, https, url) = gate(&h, snapdrain::webhook::limits::IN_FLIGHT).await;
    let node = h.node_with_statefulset_pods().await;
    let all = h.protected_pods_on(&node).await;
    let (ns, name) = all
        .keys()
        .next()
        .and_then(|k| k.split_once('/'))
        .expect("a protected pod");
    let (ns, name) = (ns.to_string(), name.to_string());
    // A second node with protected pods, for the marker review.
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(h.client.clone())
        .list(&Default::default())
        .await
        .expect("nodes");
    let mut marker = None;
    for n in nodes.items.iter().map(kube::ResourceExt::name_any) {
        if n == node {
            continue;
        }
        if let Some(k) = h.protected_pods_on(&n).await.keys().next().cloned() {
            marker = Some((n, k));
            break;
        }
    }
    let (marker_node, marker_pod) = marker.expect("a second node with protected pods");
    let (marker_ns, marker_name) = marker_pod.split_once('/').expect("ns/name");

    for _ in 0..20 {
        let (status, answer) = post(&https, &url, real_eviction_review("no-such-pod", &ns)).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
    }
    // Until the gate's caches hold the pod it is unknown and allowed; then every review is held.
    let mut held = 0;
    snapdrain_testkit::eventually_within(
        "the gate holds the protected pod",
        Duration::from_secs(60),
        || {
            let (https, url, ns, name) = (&https, &url, &ns, &name);
            async move {
                let (_, answer) = post(https, url, real_eviction_review(name, ns)).await;
                (answer["response"]["allowed"] == false).then_some(())
            }
        },
    )
    .await;
    for _ in 0..50 {
        let (_, answer) = post(&https, &url, real_eviction_review(&name, &ns)).await;
        if answer["response"]["allowed"] == false {
            held += 1;
        }
    }
    assert_eq!(held, 50, "every forged review of the protected pod is held");
    let (_, answer) = post(&https, &url, real_eviction_review(marker_name, marker_ns)).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    let gate_plans = h
        .wait_all(plans, "the marker node's plan", |ps| {
            ps.iter().any(|p| {
                p.spec.source == PlanSource::EvictionGate && p.spec.nodes.contains(&marker_node)
            })
        })
        .await;
    let mut by_node: Vec<Vec<String>> = gate_plans
        .iter()
        .filter(|p| p.spec.source == PlanSource::EvictionGate)
        .map(|p| p.spec.nodes.clone())
        .collect();
    by_node.sort();
    let mut want = vec![vec![node.clone()], vec![marker_node.clone()]];
    want.sort();
    assert_eq!(by_node, want, "one plan per node, none for the unknown pod");
    // The plans the API server was asked to create: one per node, not one per review.
    let creates = h
        .audit()
        .iter()
        .filter(|e| e.resource == "disruptionplans.snapdrain.io" && e.verb == "create")
        .count();
    assert_eq!(creates, 2, "plan creations");
    controller.shutdown().await;
}
