//! One eviction request, as Karpenter sends it: policy/v1 Eviction with `preconditions.uid`, so a
//! StatefulSet pod re-created under the same name is never evicted by mistake.

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, EvictParams, Preconditions};

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
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = EvictParams {
        delete_options: Some(DeleteParams {
            grace_period_seconds: grace.map(|g| g.max(0) as u32),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        }),
        ..EvictParams::default()
    };
    match pods.evict(name, &params).await {
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
