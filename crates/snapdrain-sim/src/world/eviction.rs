//! What the simulated drainers (Karpenter, Cluster Autoscaler, aws-node-termination-handler) share: an
//! Eviction POSTed to the API server over HTTP, so that admission webhooks (snapdrain's eviction gate)
//! and PodDisruptionBudgets judge it as they judge the real drainers' requests, and the pod tests they
//! apply to the pods they find on a node.

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::core::Status;
use serde_json::{Value, json};

/// Posts an Eviction of `apiVersion` (`policy/v1`, or `policy/v1beta1` as Cluster Autoscaler still
/// sends) with `delete_options`; returns the HTTP code (0 when no answer came) and the server's message.
pub async fn evict(
    client: &Client,
    api_version: &str,
    namespace: &str,
    name: &str,
    delete_options: Value,
) -> (u16, String) {
    let mut body = json!({
        "apiVersion": api_version,
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    });
    if delete_options.as_object().is_some_and(|o| !o.is_empty()) {
        body["deleteOptions"] = delete_options;
    }
    let request = http::Request::post(format!(
        "/api/v1/namespaces/{namespace}/pods/{name}/eviction"
    ))
    .header(http::header::CONTENT_TYPE, "application/json")
    .body(body.to_string().into_bytes());
    let request = match request {
        Ok(r) => r,
        Err(e) => return (0, format!("cannot build the eviction request: {e}")),
    };
    match client.request::<Status>(request).await {
        // A Failure Status in a 2xx body (as older API servers sent for the multi-PDB case) is not an
        // eviction: report its own code.
        Ok(status) if status.is_failure() => (status.code, status.message),
        Ok(_) => (201, String::new()),
        Err(kube::Error::Api(status)) => (status.code, status.message),
        Err(other) => (0, format!("eviction request failed: {other}")),
    }
}

/// A client of the simulated API server for a drainer: the admin's token, `user_agent` on every request
/// (so the audit log says who evicted), and no retries of kube-rs's own, so every answer reaches the
/// drainer's retry logic as it came.
pub fn drainer_client(admin: kube::Config, user_agent: &str) -> Result<Client, String> {
    let mut config = admin;
    config.default_retry = false;
    let value = http::HeaderValue::from_str(user_agent)
        .map_err(|e| format!("user agent {user_agent:?}: {e}"))?;
    config.headers.push((http::header::USER_AGENT, value));
    Client::try_from(config).map_err(|e| e.to_string())
}

/// The pods bound to `node`, listed as kubectl drain lists them (`fieldSelector=spec.nodeName=<node>`).
pub async fn pods_on(client: &Client, node: &str) -> Result<Vec<Pod>, kube::Error> {
    let api: Api<Pod> = Api::all(client.clone());
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    Ok(api.list(&lp).await?.items)
}

/// A static pod's mirror (`kubernetes.io/config.mirror`): no drainer evicts it.
pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
}

/// Controlled by a DaemonSet.
pub fn is_daemonset(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "DaemonSet")
}

/// Succeeded or Failed.
pub fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// `namespace/name`.
pub fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}
