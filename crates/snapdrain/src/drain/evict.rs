//! One eviction request, as Karpenter sends it: policy/v1 Eviction with `preconditions.uid`, so a
//! StatefulSet pod re-created under the same name is never evicted by mistake.

use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use kube::Client;
use kube::core::Status;
use serde_json::json;

use crate::planning::{EvictionOutcome, PlannedEviction, classify_eviction};
use crate::telemetry::Metrics;

/// What happened to one eviction, with the HTTP code for metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct Evicted {
    pub code: u16,
    pub outcome: EvictionOutcome,
}

/// What a 2xx answer means. kube-apiserver can answer a refusal with HTTP 201 and a `Failure` Status
/// body: the eviction REST handler returns the multi-PDB refusal as an object, not an error
/// (kubernetes `pkg/registry/core/pod/storage/eviction.go`: `Status{Status: Failure, Code: 500}`), and
/// `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go` writes any returned object with
/// `http.StatusCreated`. Go clients see the failure only because `Result.Into` turns a Failure Status
/// into an error; kube-rs checks only the HTTP status, so the body is read here. Newer servers send the
/// same refusal as HTTP 500 (handled as an API error below); both mean the pod was not evicted.
pub fn answer_body(status: Status) -> Evicted {
    if status.is_failure() || status.code >= 400 {
        let code = if status.code == 0 { 500 } else { status.code };
        return Evicted {
            code,
            outcome: classify_eviction(code, Some(&status)),
        };
    }
    Evicted {
        code: if status.code == 0 { 201 } else { status.code },
        outcome: EvictionOutcome::Evicted,
    }
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
        Ok(status) => answer_body(status),
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

/// Sends one eviction, retrying "come back later" answers with jittered exponential backoff (honouring
/// the server's retryAfter) until `budget` is spent.
pub async fn evict_with_retry(
    client: &Client,
    metrics: &Metrics,
    e: &PlannedEviction,
    grace: Option<i64>,
    budget: Duration,
) -> EvictionOutcome {
    let start = Instant::now();
    let uid = e.uid.clone().unwrap_or_default();
    let attempt = || async {
        let r = evict(client, &e.namespace, &e.name, &uid, grace).await;
        metrics.eviction(r.code);
        match r.outcome {
            retry @ EvictionOutcome::RetryAfter { .. } => Err(retry),
            other => Ok(other),
        }
    };
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(10))
        .with_jitter()
        .without_max_times();
    let result = attempt
        .retry(backoff)
        .when(|_| start.elapsed() < budget)
        .adjust(|err, dur| match (err, dur) {
            (EvictionOutcome::RetryAfter { delay, .. }, Some(d)) => Some(d.max(*delay).min(budget)),
            (_, d) => d,
        })
        .notify(|err, dur| tracing::debug!(pod = %format!("{}/{}", e.namespace, e.name), ?err, retry_in = ?dur, "eviction refused, will retry"))
        .await;
    match result {
        Ok(o) => o,
        Err(o) => o,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(v: serde_json::Value) -> Status {
        serde_json::from_value(v).expect("status")
    }

    #[test]
    fn a_failure_body_under_201_is_not_an_eviction() {
        let multi = status(
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500,
            "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."}),
        );
        let r = answer_body(multi);
        assert_eq!(r.code, 500);
        assert!(
            matches!(&r.outcome, EvictionOutcome::RetryAfter { reason, .. } if reason.contains("more than one PodDisruptionBudget")),
            "{r:?}"
        );
        let refused = status(json!({"status": "Failure", "message": "denied"}));
        assert!(matches!(
            answer_body(refused).outcome,
            EvictionOutcome::Failed { .. }
        ));
        let ok = answer_body(status(json!({"status": "Success", "code": 201})));
        assert_eq!((ok.code, ok.outcome), (201, EvictionOutcome::Evicted));
        let bare = answer_body(status(json!({"status": "Success"})));
        assert_eq!((bare.code, bare.outcome), (201, EvictionOutcome::Evicted));
    }
}
