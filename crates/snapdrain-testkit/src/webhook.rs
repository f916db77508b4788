//! A validating webhook served over real TLS (test CA from rcgen): an eviction gate that answers 429 until
//! it is told to allow, as snapdrain's gate does while a backup is pending.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use base64::Engine;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Service;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::eviction::namespace;

pub const HOOK: &str = "gate.snapdrain.io";
pub const BACKUP_MESSAGE: &str = "pod shop/db-0 waits for backup shop-db-20260101 to be verified";

/// A test CA and a serving certificate for `names`, signed by it.
pub struct Pki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

pub fn pki(names: &[&str]) -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "snapdrain test CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let cert = rcgen::CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    Pki {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// The gate webhook: denies evictions with 429 while `deny` is set, never answers while `hang` is set,
/// and keeps every review it got.
#[derive(Clone, Default)]
pub struct Gate {
    pub deny: Arc<AtomicBool>,
    pub hang: Arc<AtomicBool>,
    pub reviews: Arc<Mutex<Vec<Value>>>,
}

impl Gate {
    pub fn reviews(&self) -> Vec<Value> {
        self.reviews.lock().unwrap().clone()
    }
}

pub async fn review(State(gate): State<Gate>, Json(review): Json<Value>) -> Json<Value> {
    let uid = review["request"]["uid"].clone();
    gate.reviews.lock().unwrap().push(review);
    if gate.hang.load(Ordering::SeqCst) {
        // The caller's own deadline is the only way out.
        std::future::pending::<()>().await;
    }
    let response = if gate.deny.load(Ordering::SeqCst) {
        json!({"uid": uid, "allowed": false,
            "status": {"code": 429, "reason": "TooManyRequests", "message": BACKUP_MESSAGE}})
    } else {
        json!({"uid": uid, "allowed": true})
    };
    Json(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
    )
}

/// Serves the gate over TLS on a loopback port.
pub async fn serve(gate: Gate, pki: &Pki) -> SocketAddr {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let tls = axum_server::tls_rustls::RustlsConfig::from_pem(
        pki.cert_pem.clone().into_bytes(),
        pki.key_pem.clone().into_bytes(),
    )
    .await
    .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new()
        .route("/validate", post(review))
        .with_state(gate);
    let server = axum_server::from_tcp_rustls(listener, tls).unwrap();
    tokio::spawn(async move {
        let _ = server.serve(app.into_make_service()).await;
    });
    addr
}

/// The Service the webhook configuration names, pointing the simulator at `addr`.
pub async fn service(client: &Client, addr: SocketAddr) {
    namespace(client, "snapdrain", json!({})).await;
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "gate", "namespace": "snapdrain",
            "annotations": {snapdrain_sim::apiserver::admission::ADDRESS_ANNOTATION: addr.to_string()}},
        "spec": {"ports": [{"port": 443, "targetPort": 8443}]}
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), "snapdrain")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
}

/// A ValidatingWebhookConfiguration gating `pods/eviction` in namespaces labelled `snapdrain.io/gate`.
pub async fn configure(client: &Client, client_config: Value, failure_policy: &str, ca_pem: &str) {
    let mut client_config = client_config;
    client_config["caBundle"] = json!(base64::engine::general_purpose::STANDARD.encode(ca_pem));
    let cfg: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "snapdrain-gate"},
        "webhooks": [{
            "name": HOOK,
            "clientConfig": client_config,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["pods/eviction"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"snapdrain.io/gate": "on"}},
            "failurePolicy": failure_policy,
            "sideEffects": "NoneOnDryRun",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5
        }]
    }))
    .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &cfg)
        .await
        .unwrap();
}

pub fn by_service() -> Value {
    json!({"service": {"namespace": "snapdrain", "name": "gate", "path": "/validate"}})
}
