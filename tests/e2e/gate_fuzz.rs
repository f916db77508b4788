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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutated_and_random_admission_reviews_get_well_formed_answers() {
    let h = Harness::start().await;
    namespace(&h.client, "snapdrain", json!({})).await;
    let controller = h
        .controller_with(
            RunOptions {
                lease_namespace: None,
                webhook: Some(WebhookConfig {
                    addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
                    lifetimes: Lifetimes::default(),
                    resync: Duration::from_secs(30),
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
    // Trusting only the gate's CA, reaching it under the Service name, as kube-apiserver does.
    let https = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).expect("CA PEM"))
        .resolve(HOST, addr)
        .no_proxy()
        .build()
        .expect("HTTPS client");
    let url = format!("https://{HOST}:{}/validate", addr.port());

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
