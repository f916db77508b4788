//! Validating admission: every `admissionregistration.k8s.io/v1` ValidatingWebhookConfiguration is
//! honoured for the requests it selects, as kube-apiserver's validating webhook dispatcher does.
//!
//! ValidatingAdmissionPolicies run first (`policy`).
//!
//! Not simulated: mutating webhooks, `matchConditions` (CEL; a webhook with them is called as if they
//! held), `admissionReviewVersions` other than `v1`. The review's `userInfo` is the user the request's
//! bearer token authenticated (`system:anonymous` without one, see `auth`).

mod call;
mod matching;
mod policy;
mod review;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

pub use self::call::ADDRESS_ANNOTATION;
use self::matching::RequestShape;
use super::ApiState;
use super::errors::{ApiError, ApiResult};
use super::request::Target;
use super::resources::ResKey;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

pub struct AdmissionAttributes<'a> {
    pub operation: Operation,
    pub target: &'a Target,
    pub name: &'a str,
    pub object: Option<&'a Value>,
    pub old_object: Option<&'a Value>,
    pub dry_run: bool,
    pub user_agent: Option<&'a str>,
    /// Who sent the request: the review's `userInfo`.
    pub user: &'a super::auth::UserInfo,
}

/// What admission keeps between requests: HTTPS clients per trust bundle, how long webhook calls took,
/// and what became of each call (the simulator's record, for judges that must not ask the webhook).
#[derive(Default)]
pub struct Admission {
    clients: call::Clients,
    durations: CallDurations,
    outcomes: std::sync::Mutex<std::collections::BTreeMap<(String, CallOutcome), u64>>,
}

/// What became of one webhook call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CallOutcome {
    /// The webhook answered `allowed: true`.
    Allowed,
    /// The webhook answered `allowed: false` (its own code, e.g. 429).
    Denied,
    /// The call failed (down, timed out, a bad answer) and `failurePolicy: Fail` refused the request.
    FailedClosed,
    /// The call failed and `failurePolicy: Ignore` admitted the request.
    FailedOpen,
}

impl CallOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::FailedClosed => "failed-closed",
            Self::FailedOpen => "failed-open",
        }
    }
}

impl Admission {
    fn count(&self, webhook: &str, outcome: CallOutcome) {
        *self
            .outcomes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((webhook.to_string(), outcome))
            .or_default() += 1;
    }

    /// How many calls to `webhook` ended each way so far.
    pub fn outcomes(&self, webhook: &str) -> std::collections::BTreeMap<CallOutcome, u64> {
        self.outcomes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|((w, _), _)| w == webhook)
            .map(|((_, o), n)| (*o, *n))
            .collect()
    }

    /// The durations of the calls to webhook `name` so far (the newest [`KEPT_DURATIONS`]), as
    /// kube-apiserver's `apiserver_admission_webhook_admission_duration_seconds` histogram times them:
    /// around each hook's call, refusals and failed calls included
    /// (`staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/validating/dispatcher.go`: `t :=
    /// time.Now()` before `callHook`, then `admissionmetrics.Metrics.ObserveWebhook(..., time.Since(t),
    /// ...)`).
    pub fn webhook_durations(&self, name: &str) -> Vec<Duration> {
        self.durations.of(name)
    }
}

/// Webhook call durations kept per webhook: enough for a bench's minutes of evictions, bounded so a
/// long-running simulator does not grow.
pub const KEPT_DURATIONS: usize = 200_000;

#[derive(Default)]
struct CallDurations(std::sync::Mutex<std::collections::HashMap<String, VecDeque<Duration>>>);

impl CallDurations {
    fn record(&self, name: &str, took: Duration) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let kept = all.entry(name.to_string()).or_default();
        if kept.len() == KEPT_DURATIONS {
            kept.pop_front();
        }
        kept.push_back(took);
    }

    fn of(&self, name: &str) -> Vec<Duration> {
        let all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.get(name)
            .map(|d| d.iter().copied().collect())
            .unwrap_or_default()
    }
}

const DEFAULT_TIMEOUT_SECONDS: u64 = 10;
const MAX_TIMEOUT_SECONDS: u64 = 30;

fn configurations_key() -> ResKey {
    ResKey::new(
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
    )
}

/// Requests on admission configuration itself never go through webhooks, so a broken webhook can
/// always be removed.
fn exempt(t: &Target) -> bool {
    t.def.group == "admissionregistration.k8s.io"
        && matches!(
            t.def.plural.as_str(),
            "validatingwebhookconfigurations"
                | "mutatingwebhookconfigurations"
                | "validatingadmissionpolicies"
                | "validatingadmissionpolicybindings"
                | "mutatingadmissionpolicies"
                | "mutatingadmissionpolicybindings"
        )
}

/// Runs every matching validating webhook (concurrently, as the real dispatcher does) and fails the
/// request with the first refusal or failed call, in configuration-name and webhook order.
pub async fn admit(state: &Arc<ApiState>, attrs: AdmissionAttributes<'_>) -> ApiResult<()> {
    // kube-apiserver's plugin order: ValidatingAdmissionPolicy before ValidatingAdmissionWebhook.
    policy::validate(&state.store, &attrs, &uuid::Uuid::new_v4().to_string())?;
    let t = attrs.target;
    if exempt(t) {
        return Ok(());
    }
    let (configurations, _) = state.store.snapshot(&configurations_key());
    if configurations.is_empty() {
        return Ok(());
    }
    let shape = RequestShape {
        group: &t.def.group,
        version: &t.version,
        resource: &t.def.plural,
        subresource: t.subresource.as_deref().unwrap_or(""),
        operation: attrs.operation,
        namespace: t.namespace.as_deref(),
    };
    let mut calls = Vec::new();
    for configuration in &configurations {
        let hooks = configuration
            .get("webhooks")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for hook in hooks {
            if !should_call(state, hook, &shape, &attrs)? {
                continue;
            }
            calls.push(call_webhook(state, hook, &attrs));
        }
    }
    for outcome in futures::future::join_all(calls).await {
        outcome?;
    }
    Ok(())
}

fn hook_name(hook: &Value) -> &str {
    hook.get("name").and_then(Value::as_str).unwrap_or("")
}

fn should_call(
    state: &ApiState,
    hook: &Value,
    shape: &RequestShape<'_>,
    attrs: &AdmissionAttributes<'_>,
) -> ApiResult<bool> {
    if !matching::rules_match(hook, shape) {
        return Ok(false);
    }
    let selected =
        matching::namespace_matches(hook, &state.store, shape, attrs.object, attrs.old_object)
            .and_then(
                |ns| Ok(ns && matching::object_matches(hook, attrs.object, attrs.old_object)?),
            )
            .map_err(|e| ApiError::internal(format!("Internal error occurred: {e}")))?;
    if !selected {
        return Ok(false);
    }
    if attrs.dry_run {
        let side_effects = hook
            .get("sideEffects")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !matches!(side_effects, "None" | "NoneOnDryRun") {
            return Err(ApiError::bad_request(format!(
                "admission webhook \"{}\" does not support dry run",
                hook_name(hook)
            )));
        }
    }
    Ok(true)
}

async fn call_webhook(
    state: &ApiState,
    hook: &Value,
    attrs: &AdmissionAttributes<'_>,
) -> ApiResult<()> {
    let name = hook_name(hook);
    let started = Instant::now();
    let ignore = hook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
    let timeout = hook
        .get("timeoutSeconds")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_TIMEOUT_SECONDS)
        .clamp(1, MAX_TIMEOUT_SECONDS);
    let uid = uuid::Uuid::new_v4().to_string();
    let request = review::request(attrs, &uid);
    let client_config = hook.get("clientConfig").cloned().unwrap_or_default();
    let ca_bundle = client_config
        .get("caBundle")
        .and_then(Value::as_str)
        .unwrap_or("");
    let outcome = async {
        let endpoint = call::endpoint(&state.store, &client_config).map_err(Err)?;
        // Fault rules of kind `admission`: a slow webhook takes the call's time, past its timeout the
        // call fails as kube-apiserver's does; a down one fails as a refused connection.
        let injected = state.faults.admission(name);
        let limit = Duration::from_secs(timeout);
        if !injected.delay.is_zero() {
            tokio::time::sleep(injected.delay.min(limit)).await;
            if injected.delay >= limit {
                return Err(Err(format!(
                    "Post \"{}?timeout={timeout}s\": context deadline exceeded",
                    endpoint.url
                )));
            }
        }
        if injected.down {
            return Err(Err(format!(
                "Post \"{}?timeout={timeout}s\": dial tcp: connect: connection refused",
                endpoint.url
            )));
        }
        let answer = state
            .admission
            .clients
            .post(
                &endpoint,
                ca_bundle,
                // What the injected delay left of the call's time.
                limit
                    .saturating_sub(injected.delay)
                    .max(Duration::from_millis(100)),
                &request,
            )
            .await
            .map_err(Err)?;
        review::verdict(name, &uid, &answer)
    }
    .await;
    state.admission.durations.record(name, started.elapsed());
    match outcome {
        Ok(()) => {
            state.admission.count(name, CallOutcome::Allowed);
            Ok(())
        }
        Err(Ok(denied)) => {
            state.admission.count(name, CallOutcome::Denied);
            Err(denied)
        }
        Err(Err(reason)) => {
            let failure = format!("failed calling webhook \"{name}\": {reason}");
            if ignore {
                state.admission.count(name, CallOutcome::FailedOpen);
                tracing::warn!(webhook = name, error = %reason, "failed calling webhook, failing open");
                return Ok(());
            }
            state.admission.count(name, CallOutcome::FailedClosed);
            Err(
                ApiError::internal(format!("Internal error occurred: {failure}"))
                    .with_cause("", "", failure),
            )
        }
    }
}
