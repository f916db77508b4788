//! `POST pods/{name}/eviction`, as `pkg/registry/core/pod/storage/eviction.go` in kube-apiserver does it:
//! validating admission (webhooks on `pods/eviction`), then the PodDisruptionBudget check, then the pod's
//! `DisruptionTarget` condition and its graceful deletion.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::admission::{self, AdmissionAttributes, Operation};
use super::errors::{ApiError, ApiResult};
use super::label_selector;
use super::meta::{meta_str, now_rfc3339};
use super::pdb::{self, pdb_key};
use super::request::{Query, Target};
use super::response::{Reply, json_response};
use super::store::{DeleteOptions, WriteOptions};
use super::{ApiState, MultiPdbReply};

/// More entries than this in `status.disruptedPods` means the PDB controller is not keeping up.
const MAX_DISRUPTED_PODS: usize = 2000;

/// What the eviction's `deleteOptions` ask for.
struct EvictOptions {
    grace_period_seconds: Option<i64>,
    uid: Option<String>,
    resource_version: Option<String>,
    dry_run: bool,
}

impl EvictOptions {
    /// `deleteOptions.dryRun` and the query's `dryRun` must agree when both are given.
    fn parse(body: &Value, query: &Query) -> ApiResult<Self> {
        let opts = body.get("deleteOptions");
        let str_at = |p: &str| {
            opts.and_then(|o| o.pointer(p))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let body_dry: Vec<String> = opts
            .and_then(|o| o.get("dryRun"))
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let query_dry: Vec<String> = query
            .get("dryRun")
            .map(|d| vec![d.to_string()])
            .unwrap_or_default();
        if !body_dry.is_empty() && !query_dry.is_empty() && body_dry != query_dry {
            return Err(ApiError::bad_request(format!(
                "Non-matching dry-run options in request and content: [{}] and [{}]",
                query_dry.join(" "),
                body_dry.join(" ")
            )));
        }
        Ok(Self {
            grace_period_seconds: opts
                .and_then(|o| o.get("gracePeriodSeconds"))
                .and_then(Value::as_i64),
            uid: str_at("/preconditions/uid"),
            resource_version: str_at("/preconditions/resourceVersion"),
            dry_run: body_dry.iter().chain(&query_dry).any(|d| d == "All"),
        })
    }
}

pub async fn handle(
    state: &Arc<ApiState>,
    target: &Target,
    query: &Query,
    body: Value,
    user_agent: Option<&str>,
    user: &super::auth::UserInfo,
) -> Reply {
    let name = target.name.as_deref().unwrap_or("");
    let ns = target.namespace.as_deref().unwrap_or("");
    check_body(&body, name, ns)?;
    let opts = EvictOptions::parse(&body, query)?;
    // The webhook sees the Eviction as policy/v1 whichever version was sent; its dryRun flag is the
    // request's (query) one, as in the real server.
    let mut review_object = body.clone();
    review_object["apiVersion"] = json!("policy/v1");
    review_object["kind"] = json!("Eviction");
    admission::admit(
        state,
        AdmissionAttributes {
            operation: Operation::Create,
            target,
            name,
            object: Some(&review_object),
            old_object: None,
            dry_run: query.dry_run(),
            user_agent,
            user,
        },
    )
    .await?;

    let store = &state.store;
    let pods = target.def.key();
    let pod = store
        .get(&pods, Some(ns), name)
        .ok_or_else(|| ApiError::not_found("", "pods", name))?;

    // Finished, unstarted or already terminating pods disrupt nothing more: no budget applies.
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    if matches!(phase, "Pending" | "Succeeded" | "Failed") || pdb::is_terminating(&pod) {
        // The real server retries when the pod changes meanwhile; deleting the latest pod is the same.
        delete_pod(state, ns, name, &opts, None, None)?;
        return Ok(success());
    }

    let budgets: Vec<Arc<Value>> = store
        .list(&pdb_key(), Some(ns), &|p| matches_pod(p, &pod), None, None)
        .items;
    if budgets.len() > 1 {
        return Ok(multiple_budgets(state.settings.multi_pdb_reply));
    }
    // An unready pod may go without using up the budget; the delete then requires the pod unchanged
    // (still unready) since this check.
    let mut unready_bypass: Option<String> = None;
    if let Some(budget) = budgets.first() {
        let budget_name = meta_str(budget, "name").unwrap_or("").to_string();
        let status = budget.get("status").cloned().unwrap_or_default();
        let int = |f: &str| status.get(f).and_then(Value::as_i64).unwrap_or(0);
        let always = budget
            .pointer("/spec/unhealthyPodEvictionPolicy")
            .and_then(Value::as_str)
            == Some("AlwaysAllow");
        let healthy_budget =
            int("currentHealthy") >= int("desiredHealthy") && int("desiredHealthy") > 0;
        if !pdb::is_ready(&pod) && (always || healthy_budget) {
            unready_bypass = Some(budget_name);
        } else {
            check_and_decrement(state, ns, name, &budget_name, opts.dry_run)?;
        }
    }
    let expected_rv = unready_bypass
        .as_ref()
        .and_then(|_| meta_str(&pod, "resourceVersion"))
        .map(str::to_string);
    delete_pod(
        state,
        ns,
        name,
        &opts,
        expected_rv,
        unready_bypass.as_deref(),
    )?;
    Ok(success())
}

/// The refusal for a pod covered by more than one budget, as the configured server version sends it.
fn multiple_budgets(reply: MultiPdbReply) -> axum::response::Response {
    match reply {
        // `apierrors.NewInternalError(err)`: reason InternalError, the message prefixed, the error as
        // the one cause.
        MultiPdbReply::InternalError => {
            let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("Internal error occurred: {MULTIPLE_BUDGETS}"),
                "reason": "InternalError",
                "details": {"causes": [{"message": MULTIPLE_BUDGETS}]},
                "code": 500});
            json_response(StatusCode::INTERNAL_SERVER_ERROR, &status)
        }
        // The Status returned as the REST result, written by the create handler with 201.
        MultiPdbReply::CreatedWithFailureBody => {
            let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": MULTIPLE_BUDGETS, "code": 500});
            json_response(StatusCode::CREATED, &status)
        }
    }
}

/// kube-apiserver's message for a pod covered by more than one PodDisruptionBudget.
const MULTIPLE_BUDGETS: &str = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.";

fn success() -> axum::response::Response {
    json_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    )
}

fn check_body(body: &Value, name: &str, ns: &str) -> ApiResult<()> {
    if let Some(kind) = body.get("kind").and_then(Value::as_str)
        && kind != "Eviction"
    {
        return Err(ApiError::bad_request(format!(
            "the kind of the provided object ({kind}) does not match the resource (Eviction)"
        )));
    }
    if let Some(v) = body.get("apiVersion").and_then(Value::as_str)
        && !matches!(v, "policy/v1" | "policy/v1beta1")
    {
        return Err(ApiError::bad_request(format!(
            "no kind \"Eviction\" is registered for version \"{v}\""
        )));
    }
    if meta_str(body, "name").unwrap_or("") != name {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    if let Some(body_ns) = meta_str(body, "namespace")
        && !body_ns.is_empty()
        && body_ns != ns
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

/// Whether a budget applies to the pod: same namespace (listed so) and a non-empty selector that matches.
/// A nil or empty selector matches nothing (kubernetes `pkg/registry/core/pod/storage/eviction.go`
/// `getPodDisruptionBudgets`: "If a PDB with a nil or empty selector creeps in, it should match nothing,
/// not everything"), although the PDB controller counts every pod of the namespace for an empty one.
fn matches_pod(budget: &Value, pod: &Value) -> bool {
    pdb::selector_of(budget).is_some_and(|sel| {
        // An invalid selector matches nothing.
        label_selector::matches(sel, pod.pointer("/metadata/labels")) == Ok(true)
    })
}

fn too_many_requests_stale(budget: &str) -> ApiError {
    let mut e = ApiError::too_many_requests(
        "Cannot evict pod as it would violate the pod's disruption budget.",
    )
    .with_cause(
        "DisruptionBudget",
        "",
        format!("The disruption budget {budget} is still being processed by the server."),
    );
    e.retry_after_seconds = Some(10);
    e
}

/// Uses one disruption of the budget, atomically with the check, and records the pod as disrupted.
fn check_and_decrement(
    state: &ApiState,
    ns: &str,
    pod: &str,
    budget: &str,
    dry_run: bool,
) -> ApiResult<()> {
    let write = |current: &Value| -> ApiResult<Value> {
        let status = current.get("status").cloned().unwrap_or_default();
        let int = |f: &str| status.get(f).and_then(Value::as_i64).unwrap_or(0);
        let generation = current
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if int("observedGeneration") < generation {
            return Err(too_many_requests_stale(budget));
        }
        let allowed = int("disruptionsAllowed");
        if allowed < 0 {
            return Err(ApiError::new(
                403,
                "Forbidden",
                format!(
                    "poddisruptionbudgets.policy \"{budget}\" is forbidden: pdb disruptions allowed is negative"
                ),
            ));
        }
        if pdb::disrupted_pods(current).len() > MAX_DISRUPTED_PODS {
            return Err(ApiError::new(
                403,
                "Forbidden",
                format!(
                    "poddisruptionbudgets.policy \"{budget}\" is forbidden: DisruptedPods map too big - too many evictions not confirmed by PDB controller"
                ),
            ));
        }
        if allowed == 0 {
            return Err(ApiError::too_many_requests(
                "Cannot evict pod as it would violate the pod's disruption budget.",
            )
            .with_cause(
                "DisruptionBudget",
                "",
                format!(
                    "The disruption budget {budget} needs {} healthy pods and has {} currently",
                    int("desiredHealthy"),
                    int("currentHealthy")
                ),
            ));
        }
        let mut new = current.clone();
        new["status"]["disruptionsAllowed"] = json!(allowed - 1);
        if allowed - 1 == 0 {
            let old = current.get("status").cloned().unwrap_or_default();
            pdb::set_condition(&mut new["status"], &old, "False", "InsufficientPods", "");
        }
        if !new["status"]["disruptedPods"].is_object() {
            new["status"]["disruptedPods"] = json!({});
        }
        new["status"]["disruptedPods"][pod] = json!(now_rfc3339());
        Ok(new)
    };
    let opts = WriteOptions {
        dry_run,
        internal: true,
    };
    state
        .store
        .modify(&pdb_key(), Some(ns), budget, Some("status"), opts, write)
        .map(|_| ())
        .map_err(|e| match e.code {
            // The budget went away between listing and writing: the real server retries and then no
            // longer finds it; asking the client to retry is the closest cheap answer.
            404 => too_many_requests_stale(budget),
            _ => e,
        })
}

/// Marks the pod `DisruptionTarget` and starts its graceful deletion. `expected_rv` requires the pod
/// unchanged since it was checked (the unready-pod shortcut); `bypass_budget` names the budget so that a
/// change there turns into a 429, as in the real server.
fn delete_pod(
    state: &ApiState,
    ns: &str,
    name: &str,
    opts: &EvictOptions,
    expected_rv: Option<String>,
    bypass_budget: Option<&str>,
) -> ApiResult<()> {
    let store = &state.store;
    let pods = super::resources::ResKey::core("pods");
    let client_rv = opts.resource_version.clone();
    let mut delete = DeleteOptions {
        grace_period_seconds: opts.grace_period_seconds,
        precondition_uid: opts.uid.clone(),
        precondition_rv: client_rv.clone().or(expected_rv.clone()),
        dry_run: opts.dry_run,
    };
    if !opts.dry_run {
        let conflict = |what: &str, want: &str, have: &str, tail: &str| {
            ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on Pod \"{name}\": the {what} in the precondition ({want}) does not match the {what} in record ({have}). {tail}"
                ),
            )
        };
        let marked = store.modify(
            &pods,
            Some(ns),
            name,
            Some("status"),
            WriteOptions {
                internal: true,
                ..Default::default()
            },
            |current| {
                let uid = meta_str(current, "uid").unwrap_or("");
                if let Some(want) = &opts.uid
                    && want != uid
                {
                    return Err(conflict(
                        "UID",
                        want,
                        uid,
                        "The object might have been deleted and then recreated",
                    ));
                }
                let rv = meta_str(current, "resourceVersion").unwrap_or("");
                if let Some(want) = &delete.precondition_rv
                    && want != rv
                {
                    if client_rv.is_none()
                        && let Some(budget) = bypass_budget
                    {
                        return Err(too_many_requests_stale(budget));
                    }
                    return Err(conflict(
                        "ResourceVersion",
                        want,
                        rv,
                        "The object might have been modified",
                    ));
                }
                Ok(with_disruption_target(current))
            },
        )?;
        // Our own write moved the resourceVersion on.
        if delete.precondition_rv.is_some() {
            delete.precondition_rv = meta_str(&marked, "resourceVersion").map(str::to_string);
        }
        let node = marked.pointer("/spec/nodeName").and_then(Value::as_str);
        let claims: Vec<&str> = marked
            .pointer("/spec/volumes")
            .and_then(Value::as_array)
            .map(|vs| {
                vs.iter()
                    .filter_map(|v| {
                        v.pointer("/persistentVolumeClaim/claimName")
                            .and_then(Value::as_str)
                    })
                    .collect()
            })
            .unwrap_or_default();
        store.delete(&pods, Some(ns), name, &delete)?;
        state.audit.world(
            "evicted",
            "pods",
            Some(ns),
            Some(name),
            json!({"node": node, "claims": claims, "uid": meta_str(&marked, "uid"),
                "gracePeriodSeconds": opts.grace_period_seconds}),
        );
        return Ok(());
    }
    store.delete(&pods, Some(ns), name, &delete)?;
    Ok(())
}

fn with_disruption_target(pod: &Value) -> Value {
    let mut p = pod.clone();
    let condition = json!({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting", "lastProbeTime": null, "lastTransitionTime": now_rfc3339()});
    if !p["status"].is_object() {
        p["status"] = json!({});
    }
    if !p["status"]["conditions"].is_array() {
        p["status"]["conditions"] = json!([]);
    }
    if let Some(cs) = p["status"]["conditions"].as_array_mut() {
        match cs.iter_mut().find(|c| c["type"] == "DisruptionTarget") {
            // Already a target: keep its transition time, as UpdatePodCondition does.
            Some(c) if c["status"] == "True" => {}
            Some(c) => *c = condition,
            None => cs.push(condition),
        }
    }
    p
}
