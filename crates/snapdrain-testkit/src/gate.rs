//! snapdrain's own eviction gate in front of the simulated cluster, as the Helm chart installs it
//! (deploy/helm/snapdrain/templates/webhook.yaml): the ValidatingWebhookConfiguration on `pods/eviction`,
//! the Service the simulator dials, and the controller serving the gate over TLS with certificates it
//! issues itself.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;
use snapdrain::controller::ControllerHandle;
use snapdrain::controller::run::RunOptions;
use snapdrain::webhook::{Lifetimes, WebhookConfig};
use snapdrain_sim::apiserver::admission::ADDRESS_ANNOTATION;

use crate::eviction::namespace;
use crate::harness::Harness;

pub const NS: &str = "snapdrain";
pub const SERVICE: &str = "snapdrain-webhook";
pub const CONFIGURATION: &str = "snapdrain";
pub const HOOK: &str = "gate.snapdrain.io";

/// The ValidatingWebhookConfiguration as the Helm chart renders it (deploy/helm/snapdrain/templates/
/// webhook.yaml), with `ca_bundle` when the test sets one itself.
pub async fn configuration(client: &Client, failure_policy: &str, ca_bundle: Option<&str>) {
    let mut client_config =
        json!({"service": {"namespace": NS, "name": SERVICE, "path": "/validate", "port": 443}});
    if let Some(pem) = ca_bundle {
        // ByteString serializes as base64, as caBundle is written.
        client_config["caBundle"] = json!(k8s_openapi::ByteString(pem.as_bytes().to_vec()));
    }
    let cfg: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": CONFIGURATION},
        "webhooks": [{
            "name": HOOK,
            "clientConfig": client_config,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["pods/eviction"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                "operator": "NotIn", "values": ["kube-system", NS]}]},
            "failurePolicy": failure_policy,
            "sideEffects": "NoneOnDryRun",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5
        }]
    }))
    .expect("configuration JSON");
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &cfg)
        .await
        .expect("create the ValidatingWebhookConfiguration");
}

/// The Service in front of the gate; the simulator dials the annotated address for it.
pub async fn service(client: &Client, addr: SocketAddr) {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": SERVICE, "namespace": NS,
            "annotations": {ADDRESS_ANNOTATION: addr.to_string()}},
        "spec": {"ports": [{"port": 443, "targetPort": 8443}]}
    }))
    .expect("service JSON");
    Api::<Service>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &svc)
        .await
        .expect("create the Service");
}

pub fn webhook_config(lifetimes: Lifetimes, resync: Duration) -> WebhookConfig {
    WebhookConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        namespace: NS.into(),
        service: SERVICE.into(),
        configuration: CONFIGURATION.into(),
        lifetimes,
        resync,
        ..WebhookConfig::default()
    }
}

/// A replica that contends for the Lease in the gate's namespace and serves the gate (default
/// certificate lifetimes, 30 s resync).
pub fn leased_gate_options() -> RunOptions {
    RunOptions {
        lease_namespace: Some(NS.into()),
        webhook: Some(webhook_config(
            Lifetimes::default(),
            Duration::from_secs(30),
        )),
        ..RunOptions::default()
    }
}

/// The configuration first (so the gate patches its caBundle on its first pass), then the controller
/// with the gate, then the Service pointing at where it listens.
pub async fn controller_with_gate(
    h: &Harness,
    failure_policy: &str,
    lifetimes: Lifetimes,
    resync: Duration,
) -> ControllerHandle {
    namespace(&h.client, NS, json!({})).await;
    configuration(&h.client, failure_policy, None).await;
    let controller = h
        .controller_with(
            RunOptions {
                lease_namespace: None,
                webhook: Some(webhook_config(lifetimes, resync)),
                ..RunOptions::default()
            },
            "snapdrain-0",
        )
        .await;
    let addr = controller.webhook_addr.expect("the gate listens");
    service(&h.client, addr).await;
    controller
}
