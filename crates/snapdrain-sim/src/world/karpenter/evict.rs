//! Karpenter's eviction request, modelled on karpenter `pkg/controllers/node/termination/terminator/
//! eviction.go`: a policy/v1 Eviction with `deleteOptions.preconditions.uid` sent through the API server,
//! so PDBs and admission webhooks apply to it as they do to real Karpenter. Its answer handling: 404 and
//! 409 (the pod is gone or was re-created) end the pod's drain, 429 (PDB or webhook) and 500 (several
//! PDBs) are retried by the caller's backoff.

use kube::Client;
use kube::core::Status;
use serde_json::json;

/// The HTTP code of one eviction (0 when no answer came) and the server's message.
pub async fn evict(client: &Client, namespace: &str, name: &str, uid: &str) -> (u16, String) {
    let body = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    });
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
