//! Karpenter's eviction request, modelled on karpenter `pkg/controllers/node/termination/terminator/
//! eviction.go`: a policy/v1 Eviction with `deleteOptions.preconditions.uid` sent through the API server,
//! so PDBs and admission webhooks apply to it as they do to real Karpenter. Its answer handling: 404 and
//! 409 (the pod is gone or was re-created) end the pod's drain, 429 (PDB or webhook) and 500 (several
//! PDBs) are retried by the caller's backoff.

use kube::Client;
use serde_json::json;

/// The HTTP code of one eviction (0 when no answer came) and the server's message.
pub async fn evict(client: &Client, namespace: &str, name: &str, uid: &str) -> (u16, String) {
    crate::world::eviction::evict(
        client,
        "policy/v1",
        namespace,
        name,
        json!({"preconditions": {"uid": uid}}),
    )
    .await
}
