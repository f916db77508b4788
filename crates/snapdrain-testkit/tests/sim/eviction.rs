//! The eviction subresource and PodDisruptionBudget status of the simulated API server, through kube-rs.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, EvictParams, PostParams};
use serde_json::Value;
use snapdrain_testkit::eviction::*;

fn evictions(sim: &snapdrain_sim::SimCluster) -> Vec<snapdrain_sim::apiserver::audit::AuditEntry> {
    sim.audit
        .since(0)
        .into_iter()
        .filter(|e| e.verb == "evicted")
        .collect()
}

#[tokio::test]
async fn budget_with_no_disruption_left_refuses_with_429() {
    let (sim, client) = cluster().await;
    pod(&client, "default", "db-0", Some(true)).await;
    pod(&client, "default", "db-1", Some(true)).await;
    pdb(
        &client,
        "default",
        "db",
        serde_json::json!({"minAvailable": 2}),
    )
    .await;
    wait_pdb(&client, "default", "db", |s| {
        s["currentHealthy"] == 2 && s["disruptionsAllowed"] == 0
    })
    .await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let status = api_error(pods.evict("db-0", &EvictParams::default()).await);
    assert_eq!(status.code, 429);
    assert_eq!(status.reason, "TooManyRequests");
    assert_eq!(
        status.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    let causes = status.details.expect("details").causes;
    assert_eq!(causes.len(), 1);
    assert_eq!(causes[0].reason, "DisruptionBudget");
    assert_eq!(
        causes[0].message,
        "The disruption budget db needs 2 healthy pods and has 2 currently"
    );

    let still = get_pod(&client, "default", "db-0").await.expect("pod kept");
    assert!(still.pointer("/metadata/deletionTimestamp").is_none());
    assert!(evictions(&sim).is_empty());
}

#[tokio::test]
/// Current kube-apiserver: `guardPDB` in kubernetes `pkg/registry/core/pod/storage/eviction.go` returns
/// `apierrors.NewInternalError(...)`.
async fn two_budgets_for_one_pod_give_500() {
    let (_sim, client) = cluster().await;
    pod(&client, "default", "db-0", Some(true)).await;
    pdb(
        &client,
        "default",
        "a",
        serde_json::json!({"maxUnavailable": 1}),
    )
    .await;
    pdb(
        &client,
        "default",
        "b",
        serde_json::json!({"maxUnavailable": 1}),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let status = api_error(pods.evict("db-0", &EvictParams::default()).await);
    assert_eq!(status.code, 500);
    assert_eq!(status.reason, "InternalError");
    assert_eq!(
        status.message,
        "Internal error occurred: This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    );
    assert!(get_pod(&client, "default", "db-0").await.is_some());
}

/// Older kube-apiserver: `eviction.go` returns `&metav1.Status{Status: Failure, Code: 500}` as the REST
/// result and `endpoints/handlers/create.go` writes it with `http.StatusCreated`: HTTP 201, Failure body.
#[tokio::test]
async fn two_budgets_can_also_be_refused_with_201_and_a_failure_body() {
    let (sim, client) = cluster_with(snapdrain_sim::apiserver::Settings {
        multi_pdb_reply: snapdrain_sim::apiserver::MultiPdbReply::CreatedWithFailureBody,
        ..Default::default()
    })
    .await;
    pod(&client, "default", "db-0", Some(true)).await;
    for name in ["a", "b"] {
        pdb(
            &client,
            "default",
            name,
            serde_json::json!({"maxUnavailable": 1}),
        )
        .await;
    }
    let (code, body) = evict_raw(&client, "default", "db-0").await;
    assert_eq!(code, 201);
    assert_eq!(body["status"], "Failure");
    assert_eq!(body["code"], 500);
    assert_eq!(
        body["message"],
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    );
    let kept = get_pod(&client, "default", "db-0").await.expect("pod kept");
    assert!(kept.pointer("/metadata/deletionTimestamp").is_none());
    assert!(evictions(&sim).is_empty());
}

/// kubernetes `pkg/registry/core/pod/storage/eviction.go` `getPodDisruptionBudgets`: "If a PDB with a nil
/// or empty selector creeps in, it should match nothing, not everything". Beside one real budget, an
/// empty-selector one and one without a selector make no multi-PDB refusal.
#[tokio::test]
async fn budgets_with_an_empty_or_no_selector_match_nothing() {
    let (sim, client) = cluster().await;
    pod(&client, "default", "db-0", Some(true)).await;
    pod(&client, "default", "db-1", Some(true)).await;
    pdb(
        &client,
        "default",
        "db",
        serde_json::json!({"maxUnavailable": 1}),
    )
    .await;
    pdb_raw(
        &client,
        "default",
        "everything",
        serde_json::json!({"maxUnavailable": 1, "selector": {}}),
    )
    .await;
    pdb_raw(
        &client,
        "default",
        "nothing",
        serde_json::json!({"maxUnavailable": 1}),
    )
    .await;
    wait_pdb(&client, "default", "db", |s| s["disruptionsAllowed"] == 1).await;
    let (code, body) = evict_raw(&client, "default", "db-0").await;
    assert_eq!(
        (code, &body["status"]),
        (201, &serde_json::json!("Success")),
        "{body}"
    );
    assert_eq!(evictions(&sim).len(), 1);
}

#[tokio::test]
async fn pending_pod_is_evicted_whatever_the_budget() {
    let (sim, client) = cluster().await;
    pod(&client, "default", "db-0", None).await;
    pod(&client, "default", "db-1", Some(true)).await;
    pdb(
        &client,
        "default",
        "db",
        serde_json::json!({"minAvailable": 5}),
    )
    .await;
    wait_pdb(&client, "default", "db", |s| s["disruptionsAllowed"] == 0).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.evict("db-0", &EvictParams::default())
        .await
        .expect("pending pod evicted");
    let gone = get_pod(&client, "default", "db-0").await;
    assert!(gone.is_none_or(|p| p.pointer("/metadata/deletionTimestamp").is_some()));
    let seen = evictions(&sim);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].name.as_deref(), Some("db-0"));
    // The running pod is still protected.
    assert_eq!(
        api_error(pods.evict("db-1", &EvictParams::default()).await).code,
        429
    );
}

#[tokio::test]
async fn uid_precondition_mismatch_gives_409() {
    let (_sim, client) = cluster().await;
    pod(&client, "default", "db-0", Some(true)).await;
    let wrong =
        serde_json::json!({"preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}});
    let status = api_error(evict_with(&client, "default", "db-0", wrong, "").await);
    assert_eq!(status.code, 409);
    assert_eq!(status.reason, "Conflict");
    assert!(
        status.message.contains("the UID in the precondition"),
        "{}",
        status.message
    );
    let kept = get_pod(&client, "default", "db-0").await.expect("pod kept");
    assert!(kept.pointer("/metadata/deletionTimestamp").is_none());
}

#[tokio::test]
async fn missing_pod_gives_404() {
    let (_sim, client) = cluster().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let status = api_error(pods.evict("nope", &EvictParams::default()).await);
    assert_eq!(status.code, 404);
    assert_eq!(status.reason, "NotFound");
}

#[tokio::test]
async fn dry_run_checks_but_changes_nothing() {
    let (sim, client) = cluster().await;
    for name in ["db-0", "db-1"] {
        pod(&client, "default", name, Some(true)).await;
    }
    pdb(
        &client,
        "default",
        "db",
        serde_json::json!({"maxUnavailable": 1}),
    )
    .await;
    wait_pdb(&client, "default", "db", |s| s["disruptionsAllowed"] == 1).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let params = EvictParams {
        delete_options: Some(DeleteParams {
            dry_run: true,
            ..Default::default()
        }),
        post_options: PostParams {
            dry_run: true,
            ..Default::default()
        },
    };
    pods.evict("db-0", &params)
        .await
        .expect("dry-run eviction allowed");
    let body_dry_run = serde_json::json!({"dryRun": ["All"]});
    evict_with(&client, "default", "db-1", body_dry_run, "")
        .await
        .expect("dry-run eviction allowed");
    for name in ["db-0", "db-1"] {
        let kept = get_pod(&client, "default", name).await.expect("pod kept");
        assert!(kept.pointer("/metadata/deletionTimestamp").is_none());
        assert!(!has_disruption_target(&kept));
    }
    let budget = wait_pdb(&client, "default", "db", |_| true).await;
    assert_eq!(budget["disruptionsAllowed"], 1);
    assert!(
        budget
            .get("disruptedPods")
            .is_none_or(|d| d.as_object().is_some_and(|m| m.is_empty()))
    );
    assert!(evictions(&sim).is_empty());
}

fn has_disruption_target(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c["type"] == "DisruptionTarget"
                    && c["status"] == "True"
                    && c["reason"] == "EvictionByEvictionAPI"
            })
        })
}

#[tokio::test]
async fn eviction_marks_the_pod_and_uses_the_budget() {
    let (sim, client) = cluster().await;
    for name in ["db-0", "db-1", "db-2"] {
        pod(&client, "default", name, Some(true)).await;
    }
    pdb(
        &client,
        "default",
        "db",
        serde_json::json!({"maxUnavailable": 1}),
    )
    .await;
    wait_pdb(&client, "default", "db", |s| {
        s["disruptionsAllowed"] == 1 && s["expectedPods"] == 3
    })
    .await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // With the right uid as precondition, as snapdrain evicts.
    let uid = get_pod(&client, "default", "db-0").await.unwrap()["metadata"]["uid"].clone();
    let right = serde_json::json!({"preconditions": {"uid": uid}});
    let ok = evict_with(&client, "default", "db-0", right, "")
        .await
        .expect("eviction allowed");
    assert_eq!(ok.code, 201);

    let evicted = get_pod(&client, "default", "db-0")
        .await
        .expect("terminating pod still readable");
    assert!(evicted.pointer("/metadata/deletionTimestamp").is_some());
    assert_eq!(
        evicted.pointer("/metadata/deletionGracePeriodSeconds"),
        Some(&Value::from(30))
    );
    assert!(has_disruption_target(&evicted));

    // The budget is used up at once, before the controller sees the pod terminating.
    let api: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(client.clone(), "default");
    let budget = serde_json::to_value(api.get("db").await.unwrap()).unwrap();
    assert_eq!(budget["status"]["disruptionsAllowed"], 0);
    let status = api_error(pods.evict("db-1", &EvictParams::default()).await);
    assert_eq!(status.code, 429);

    let seen = evictions(&sim);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].detail["node"], "node-1");
    assert_eq!(seen[0].detail["claims"], serde_json::json!(["data-db-0"]));
    // Once the controller has seen the pod go, the budget stays at zero: two healthy of two desired.
    wait_pdb(&client, "default", "db", |s| {
        s["currentHealthy"] == 2 && s["disruptionsAllowed"] == 0
    })
    .await;
}

#[tokio::test]
async fn budget_follows_pod_readiness() {
    let (_sim, client) = cluster().await;
    for name in ["db-0", "db-1", "db-2"] {
        pod(&client, "default", name, Some(true)).await;
    }
    pdb(
        &client,
        "default",
        "db",
        serde_json::json!({"minAvailable": 2}),
    )
    .await;
    wait_pdb(&client, "default", "db", |s| {
        s["currentHealthy"] == 3 && s["disruptionsAllowed"] == 1
    })
    .await;
    set_ready(&client, "default", "db-2", false).await;
    let s = wait_pdb(&client, "default", "db", |s| {
        s["currentHealthy"] == 2 && s["disruptionsAllowed"] == 0
    })
    .await;
    let cond = &s["conditions"][0];
    assert_eq!(cond["type"], "DisruptionAllowed");
    assert_eq!(cond["status"], "False");
    assert_eq!(cond["reason"], "InsufficientPods");
    set_ready(&client, "default", "db-2", true).await;
    wait_pdb(&client, "default", "db", |s| {
        s["currentHealthy"] == 3 && s["disruptionsAllowed"] == 1
    })
    .await;
}

#[tokio::test]
async fn unready_pods_follow_the_unhealthy_pod_eviction_policy() {
    let (_sim, client) = cluster().await;
    pod(&client, "default", "db-0", Some(true)).await;
    pod(&client, "default", "db-1", Some(false)).await;
    // IfHealthyBudget (the default): one healthy of two desired, so even the unready pod is protected.
    pdb(
        &client,
        "default",
        "db",
        serde_json::json!({"minAvailable": 2}),
    )
    .await;
    wait_pdb(&client, "default", "db", |s| {
        s["currentHealthy"] == 1 && s["desiredHealthy"] == 2
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    assert_eq!(
        api_error(pods.evict("db-1", &EvictParams::default()).await).code,
        429
    );

    // AlwaysAllow lets the unready pod go without touching the budget.
    let api: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(client.clone(), "default");
    let patch = serde_json::json!({"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}});
    api.patch(
        "db",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
    wait_pdb(&client, "default", "db", |s| s["currentHealthy"] == 1).await;
    pods.evict("db-1", &EvictParams::default())
        .await
        .expect("unready pod evicted");
    let budget = serde_json::to_value(api.get("db").await.unwrap()).unwrap();
    assert!(budget.pointer("/status/disruptedPods/db-1").is_none());
    assert_eq!(
        api_error(pods.evict("db-0", &EvictParams::default()).await).code,
        429
    );
}
