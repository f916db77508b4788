//! One eviction request, as Karpenter sends it: policy/v1 Eviction with `preconditions.uid`, so a
//! StatefulSet pod re-created under the same name is never evicted by mistake.

use kube::Client;
use kube::core::Status;
use serde_json::json;

use crate::planning::{EvictionOutcome, classify_eviction};

/// What happened to one eviction, with the HTTP code for metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct Evicted {
    pub code: u16,
    pub outcome: EvictionOutcome,
}

/// Sends one eviction. `client` must not retry 429 itself (see `controller::context`), so that the
/// answer reaches the caller's backoff and metrics.
pub async fn evict(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
    grace: Option<i64>,
) -> Evicted {
    // The body is built here rather than with kube's `EvictParams`, which sends `delete_options` in
    // snake_case: a real API server ignores that field, and with it the UID precondition.
    let mut delete_options = json!({"preconditions": {"uid": uid}});
    if let Some(g) = grace {
        delete_options["gracePeriodSeconds"] = json!(g.max(0));
    }
    let body = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": delete_options,
    });
    let request = http::Request::post(format!(
        "/api/v1/namespaces/{namespace}/pods/{name}/eviction"
    ))
    .header(http::header::CONTENT_TYPE, "application/json")
    .body(serde_json::to_vec(&body).unwrap_or_default());
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            return Evicted {
                code: 0,
                outcome: EvictionOutcome::Failed {
                    message: format!("cannot build the eviction request: {e}"),
                },
            };
        }
    };
    match client.request::<Status>(request).await {
        Ok(status) => Evicted {
            code: if status.code == 0 { 201 } else { status.code },
            outcome: EvictionOutcome::Evicted,
        },
        Err(kube::Error::Api(status)) => {
            let code = status.code;
            Evicted {
                code,
                outcome: classify_eviction(code, Some(&status)),
            }
        }
        // No answer at all (connection refused, timeout): try again later like a 429.
        Err(other) => Evicted {
            code: 0,
            outcome: EvictionOutcome::RetryAfter {
                delay: std::time::Duration::from_secs(1),
                reason: format!("eviction request failed: {other}"),
            },
        },
    }
}
