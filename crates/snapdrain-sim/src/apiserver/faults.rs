//! Fault injection, set at start (scenario timeline) or at runtime through `/sim/faults`: rules keyed
//! by `kind`, each modelled on how the real system fails.
//!
//! - `api` (the default, so rules written before kinds existed keep their meaning): error rates and
//!   latency per verb and resource of the Kubernetes API, optionally only for one field manager (a
//!   replica's Lease renewals: kube-lease-manager patches as `kube-lease-manager-<identity>`,
//!   `src/manager.rs` `LeaseParams::new`).
//! - `watch`: `drop` closes matching watch streams mid-way (the server ends a watch whenever it likes:
//!   kube-apiserver's `--min-request-timeout` spreads them, and a restart cuts them all); `gone` answers a
//!   watch resumed from a resourceVersion with an ERROR event carrying a 410 `Expired` Status, as
//!   kube-apiserver's watch cache does for a version older than its window (`staging/src/k8s.io/apiserver/
//!   pkg/storage/cacher/watch_cache.go` `getAllEventsSinceLocked`: "too old resource version", sent in
//!   the stream by `cacher.go` `newErrWatcher`). kube-runtime's watcher then re-lists
//!   (`kube-runtime/src/watcher.rs` `step_trampolined`: "HTTP GONE, means we have desynced").
//! - `s3`: S3's own error answers (XML `<Error><Code>`), by operation: `SlowDown` (503) and
//!   `InternalError` (500) and `ServiceUnavailable` (503), as the S3 API reference's "Error responses"
//!   list them; latency; a window (`durationMs`) for an outage.
//! - `ec2`: `RequestLimitExceeded` (EC2 throttling, any action; the AWS SDKs retry it as a throttling
//!   error: `aws-runtime` `retries/classifiers.rs` `THROTTLING_ERRORS`) and `InsufficientInstanceCapacity`
//!   on `RunInstances` / `CreateFleet` (EC2 API reference "Error codes"), in EC2's
//!   `<Response><Errors>` shape.
//! - `admission`: calls to a validating webhook slowed (`latencyMs`; past the webhook's `timeoutSeconds`
//!   the call fails with "context deadline exceeded") or failing as if the webhook were down
//!   (`errorRate`), after which the webhook's `failurePolicy` decides, as in kube-apiserver
//!   `staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/validating/dispatcher.go`.
//! - `velero`: a restart, done when the rule is added and not kept: `server` (the new server marks every
//!   InProgress Backup Failed, velero `pkg/cmd/server/server.go` `markInProgressCRsFailed`) or
//!   `node-agent` (its pods are deleted and come back from their DaemonSet; the new node-agent marks its
//!   InProgress PodVolumeBackups Failed, velero `pkg/cmd/cli/nodeagent/server.go`
//!   `markInProgressPVBsFailed`).
//!
//! Every rule may end by count (`times`) or by time (`durationMs`). What was injected is counted per
//! kind ([`Faults::injected`]).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::errors::ApiError;

/// Which system a rule makes fail.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    #[default]
    Api,
    Watch,
    S3,
    Ec2,
    Admission,
    Velero,
}

impl FaultKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Watch => "watch",
            Self::S3 => "s3",
            Self::Ec2 => "ec2",
            Self::Admission => "admission",
            Self::Velero => "velero",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }

    fn is_api(&self) -> bool {
        *self == Self::Api
    }
}

/// What a `watch` rule does to matching watches.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum WatchEffect {
    /// The stream is closed before its next event.
    Drop,
    /// A watch resumed from a resourceVersion gets an ERROR event with a 410 Status.
    Gone,
}

/// Which Velero component a `velero` rule restarts.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum VeleroComponent {
    Server,
    NodeAgent,
}

/// A restart asked for by a `velero` rule, for the simulated Velero to carry out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VeleroRestart {
    pub component: VeleroComponent,
    /// For the node-agent: only its pod on this node (every node when `None`).
    pub node: Option<String>,
}

/// One rule. `verb` and `resource` default to any; `resource` is as in audit entries (`pods`,
/// `pods/eviction`, `backups.velero.io`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultRule {
    #[serde(default, skip_serializing_if = "FaultKind::is_api")]
    pub kind: FaultKind,
    #[serde(default)]
    pub verb: Option<String>,
    #[serde(default)]
    pub resource: Option<String>,
    /// Fraction of matching requests that fail, 0.0 to 1.0.
    #[serde(default)]
    pub error_rate: f64,
    /// HTTP code of injected API failures (500 unless set).
    #[serde(default)]
    pub error_code: Option<u16>,
    #[serde(default)]
    pub latency_ms: u64,
    /// Stop after this many injected failures.
    #[serde(default)]
    pub times: Option<u32>,
    /// Only requests whose body contains this text (e.g. `"phase":"Draining"` to refuse one particular
    /// status write of a plan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_contains: Option<String>,
    /// `api`: only requests with this `fieldManager` query parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_manager: Option<String>,
    /// `watch`: what happens to matching watches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<WatchEffect>,
    /// `s3`: the operation (`GetObject`, `HeadObject`, `PutObject`, `ListObjectsV2`, ...); `ec2`: the
    /// action (`RunInstances`, `CreateFleet`, ...). Any when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// `s3` and `ec2`: the service's error code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The rule ends this long after it was added: an outage window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// `admission`: only calls to the webhook of this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
    /// `velero`: the component to restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<VeleroComponent>,
    /// `velero` node-agent restart: only on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// S3 error codes a rule may inject, with the HTTP status S3 answers them with.
pub const S3_CODES: &[(&str, u16)] = &[
    ("SlowDown", 503),
    ("InternalError", 500),
    ("ServiceUnavailable", 503),
];

/// EC2 error codes a rule may inject, with their HTTP status. `InsufficientInstanceCapacity` is a
/// server error (500), so the SDKs retry it; `RequestLimitExceeded` is EC2's throttling answer (503);
/// `UnauthorizedOperation` (403) is what an IAM role without the action's permission gets (EC2 API
/// reference, "Error codes for the Amazon EC2 API": client errors): the simulator has no IAM, so a
/// rule stands in for a policy that lacks the action.
pub const EC2_CODES: &[(&str, u16)] = &[
    ("RequestLimitExceeded", 503),
    ("InsufficientInstanceCapacity", 500),
    ("UnauthorizedOperation", 403),
];

const INSUFFICIENT_CAPACITY: &str = "InsufficientInstanceCapacity";

/// The EC2 actions that launch instances (where capacity can be short).
const LAUNCH_ACTIONS: &[&str] = &["RunInstances", "CreateFleet"];

fn status_of(codes: &[(&str, u16)], code: &str) -> Option<u16> {
    codes.iter().find(|(c, _)| *c == code).map(|(_, s)| *s)
}

impl FaultRule {
    fn matches(
        &self,
        verb: &str,
        resource: &str,
        body: &[u8],
        field_manager: Option<&str>,
    ) -> bool {
        let any =
            |v: &Option<String>, actual: &str| v.as_deref().is_none_or(|v| v == "*" || v == actual);
        let in_body = self.body_contains.as_deref().is_none_or(|text| {
            !text.is_empty() && body.windows(text.len()).any(|w| w == text.as_bytes())
        });
        let manager = self
            .field_manager
            .as_deref()
            .is_none_or(|m| field_manager == Some(m));
        any(&self.verb, verb) && any(&self.resource, resource) && in_body && manager
    }

    /// Checks the rule against its kind: the fields it may use and their values.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.error_rate) {
            return Err(format!(
                "errorRate must be between 0 and 1, got {}",
                self.error_rate
            ));
        }
        if let Some(c) = self.error_code
            && !(400..=599).contains(&c)
        {
            return Err(format!(
                "errorCode must be an HTTP error code (400-599), got {c}"
            ));
        }
        let kind = self.kind.as_str();
        let set: [(&str, bool); 11] = [
            ("verb", self.verb.is_some()),
            ("resource", self.resource.is_some()),
            ("errorCode", self.error_code.is_some()),
            ("bodyContains", self.body_contains.is_some()),
            ("fieldManager", self.field_manager.is_some()),
            ("watch", self.watch.is_some()),
            ("operation", self.operation.is_some()),
            ("code", self.code.is_some()),
            ("webhook", self.webhook.is_some()),
            ("restart", self.restart.is_some()),
            ("node", self.node.is_some()),
        ];
        let allowed: &[&str] = match self.kind {
            FaultKind::Api => &[
                "verb",
                "resource",
                "errorCode",
                "bodyContains",
                "fieldManager",
            ],
            FaultKind::Watch => &["resource", "watch"],
            FaultKind::S3 | FaultKind::Ec2 => &["operation", "code"],
            FaultKind::Admission => &["webhook"],
            FaultKind::Velero => &["restart", "node"],
        };
        if let Some((field, _)) = set
            .iter()
            .find(|(field, on)| *on && !allowed.contains(field))
        {
            return Err(format!(
                "{field} does not apply to a rule of kind {kind} (it takes {})",
                allowed.join(", ")
            ));
        }
        match self.kind {
            FaultKind::Api | FaultKind::Admission => {}
            FaultKind::Watch => {
                if self.watch.is_none() {
                    return Err(
                        "a watch rule needs watch: drop (close streams) or gone (410 on resume)"
                            .into(),
                    );
                }
            }
            FaultKind::S3 => {
                if let Some(code) = &self.code
                    && status_of(S3_CODES, code).is_none()
                {
                    return Err(format!(
                        "code {code:?} is not an S3 error this simulator injects: use one of {}",
                        names(S3_CODES)
                    ));
                }
                if self.error_rate > 0.0 && self.code.is_none() {
                    return Err(format!(
                        "an s3 rule with an errorRate needs a code ({})",
                        names(S3_CODES)
                    ));
                }
            }
            FaultKind::Ec2 => {
                let Some(code) = &self.code else {
                    return Err(format!("an ec2 rule needs a code ({})", names(EC2_CODES)));
                };
                if status_of(EC2_CODES, code).is_none() {
                    return Err(format!(
                        "code {code:?} is not an EC2 error this simulator injects: use one of {}",
                        names(EC2_CODES)
                    ));
                }
                if code == INSUFFICIENT_CAPACITY
                    && self
                        .operation
                        .as_deref()
                        .is_some_and(|o| !LAUNCH_ACTIONS.contains(&o))
                {
                    return Err(format!(
                        "InsufficientInstanceCapacity only answers a launch ({}), not {:?}",
                        LAUNCH_ACTIONS.join(", "),
                        self.operation.as_deref().unwrap_or_default()
                    ));
                }
            }
            FaultKind::Velero => {
                if self.restart.is_none() {
                    return Err("a velero rule needs restart: server or node-agent".into());
                }
                if self.node.is_some() && self.restart != Some(VeleroComponent::NodeAgent) {
                    return Err("node applies only to restart: node-agent".into());
                }
                if self.error_rate > 0.0
                    || self.latency_ms > 0
                    || self.times.is_some()
                    || self.duration_ms.is_some()
                {
                    return Err(
                        "a velero restart happens once, when the rule is added: it takes no errorRate, latencyMs, times or durationMs"
                            .into(),
                    );
                }
            }
        }
        Ok(())
    }
}

fn names(codes: &[(&str, u16)]) -> String {
    codes.iter().map(|(c, _)| *c).collect::<Vec<_>>().join(", ")
}

/// A rule in force, with when it ends.
#[derive(Clone, Debug)]
struct Active {
    rule: FaultRule,
    until: Option<Instant>,
}

impl Active {
    fn new(rule: FaultRule) -> Self {
        let until = rule
            .duration_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        Self { rule, until }
    }

    fn live(&self, now: Instant) -> bool {
        self.until.is_none_or(|u| now < u)
    }
}

pub struct Faults {
    rules: Mutex<Vec<Active>>,
    /// One bit per kind with a rule set: watches ask before every event they send, so a kind without
    /// rules is answered without the lock.
    kinds: AtomicU8,
    injected: Mutex<BTreeMap<String, u64>>,
    restarts: tokio::sync::broadcast::Sender<VeleroRestart>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            rules: Mutex::default(),
            kinds: AtomicU8::new(0),
            injected: Mutex::default(),
            restarts: tokio::sync::broadcast::channel(64).0,
        }
    }
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("rules", &self.rules())
            .finish()
    }
}

/// What to do to one request.
pub struct Injection {
    pub delay: Duration,
    pub error: Option<ApiError>,
}

/// What to do to one S3 or EC2 request: a delay, and the service error to answer with.
#[derive(Debug, Default, PartialEq)]
pub struct ServiceInjection {
    pub delay: Duration,
    /// (HTTP status, error code).
    pub error: Option<(u16, String)>,
}

/// What to do to one webhook call.
#[derive(Debug, Default, PartialEq)]
pub struct AdmissionInjection {
    pub delay: Duration,
    /// The webhook does not answer (the call fails as a refused connection would).
    pub down: bool,
}

impl Faults {
    /// Replaces every rule (a `velero` rule's restart is done at once and not kept).
    pub fn set(&self, rules: Vec<FaultRule>) {
        let kept = self.perform_restarts(rules);
        let mut rules = self.lock();
        *rules = kept.into_iter().map(Active::new).collect();
        self.mark_kinds(&rules);
    }

    fn mark_kinds(&self, rules: &[Active]) {
        let bits = rules.iter().fold(0u8, |b, a| b | a.rule.kind.bit());
        self.kinds.store(bits, Ordering::SeqCst);
    }

    pub fn add(&self, rule: FaultRule) {
        let kept = self.perform_restarts(vec![rule]);
        let mut rules = self.lock();
        rules.extend(kept.into_iter().map(Active::new));
        self.mark_kinds(&rules);
    }

    /// The rules in force (those whose window has passed are left out).
    pub fn rules(&self) -> Vec<FaultRule> {
        let now = Instant::now();
        self.lock()
            .iter()
            .filter(|a| a.live(now))
            .map(|a| a.rule.clone())
            .collect()
    }

    /// How many faults were injected so far, by kind (`api`, `watch`, `s3`, ...): failures, delays,
    /// dropped streams, restarts.
    pub fn injected(&self) -> BTreeMap<String, u64> {
        self.injected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Restarts asked for by `velero` rules from now on.
    pub fn subscribe_restarts(&self) -> tokio::sync::broadcast::Receiver<VeleroRestart> {
        self.restarts.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Active>> {
        // Plain data: a panic elsewhere cannot leave the list half-written.
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, kind: FaultKind) {
        *self
            .injected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(kind.as_str().to_string())
            .or_default() += 1;
    }

    fn perform_restarts(&self, rules: Vec<FaultRule>) -> Vec<FaultRule> {
        rules
            .into_iter()
            .filter(|r| {
                let Some(component) = r.restart.filter(|_| r.kind == FaultKind::Velero) else {
                    return true;
                };
                self.count(FaultKind::Velero);
                // No simulated Velero listening (a bare API server): nothing to restart.
                let _ = self.restarts.send(VeleroRestart {
                    component,
                    node: r.node.clone(),
                });
                false
            })
            .collect()
    }

    /// Runs `pick` over the live rules of `kind` for which `applies` holds, in order; `pick` sees each
    /// rule and whether its error fires now (its rate drawn, its `times` not used up), and a fired
    /// error uses one of `times`.
    fn each(
        &self,
        kind: FaultKind,
        applies: impl Fn(&FaultRule) -> bool,
        mut pick: impl FnMut(&FaultRule, bool) -> bool,
    ) {
        if self.kinds.load(Ordering::SeqCst) & kind.bit() == 0 {
            return;
        }
        let now = Instant::now();
        let mut rules = self.lock();
        rules.retain(|a| a.live(now));
        self.mark_kinds(&rules);
        for a in rules
            .iter_mut()
            .filter(|a| a.rule.kind == kind && applies(&a.rule))
        {
            let fires = a.rule.times != Some(0)
                && a.rule.error_rate > 0.0
                && rand::random::<f64>() < a.rule.error_rate;
            if pick(&a.rule, fires)
                && fires
                && let Some(t) = a.rule.times.as_mut()
            {
                *t -= 1;
            }
        }
    }

    /// A Kubernetes API request (any field manager).
    pub fn check(&self, verb: &str, resource: &str, body: &[u8]) -> Injection {
        self.check_request(verb, resource, body, None)
    }

    /// A Kubernetes API request, with the `fieldManager` it was sent with.
    pub fn check_request(
        &self,
        verb: &str,
        resource: &str,
        body: &[u8],
        field_manager: Option<&str>,
    ) -> Injection {
        let mut delay = Duration::ZERO;
        let mut error = None;
        self.each(
            FaultKind::Api,
            |r| r.matches(verb, resource, body, field_manager),
            |rule, fires| {
                delay += Duration::from_millis(rule.latency_ms);
                if error.is_some() || !fires {
                    return false;
                }
                let code = rule.error_code.unwrap_or(500);
                error = Some(ApiError::new(
                    code,
                    api_reason(code),
                    format!("injected fault for {verb} {resource}"),
                ));
                true
            },
        );
        if error.is_some() || !delay.is_zero() {
            self.count(FaultKind::Api);
        }
        Injection { delay, error }
    }

    /// Whether a watch of `resource` resumed from a resourceVersion is answered with 410 Gone.
    pub fn watch_gone(&self, resource: &str) -> bool {
        self.watch_effect(resource, WatchEffect::Gone)
    }

    /// Whether an open watch of `resource` is closed now (asked before each event it sends).
    pub fn watch_drop(&self, resource: &str) -> bool {
        self.watch_effect(resource, WatchEffect::Drop)
    }

    fn watch_effect(&self, resource: &str, effect: WatchEffect) -> bool {
        let mut hit = false;
        self.each(
            FaultKind::Watch,
            |r| {
                r.watch == Some(effect)
                    && r.resource
                        .as_deref()
                        .is_none_or(|x| x == "*" || x == resource)
            },
            |_, fires| {
                let first = fires && !hit;
                hit |= fires;
                first
            },
        );
        if hit {
            self.count(FaultKind::Watch);
        }
        hit
    }

    /// An S3 request for `operation`.
    pub fn s3(&self, operation: &str) -> ServiceInjection {
        self.service(FaultKind::S3, operation, S3_CODES)
    }

    /// An EC2 request for `action`: throttling and latency. Capacity is [`Faults::ec2_capacity`]'s.
    pub fn ec2(&self, action: &str) -> ServiceInjection {
        self.service(FaultKind::Ec2, action, EC2_CODES)
    }

    /// Whether the launch `action` (`RunInstances`, `CreateFleet`) finds no capacity now.
    pub fn ec2_capacity(&self, action: &str) -> bool {
        if !LAUNCH_ACTIONS.contains(&action) {
            return false;
        }
        let mut short = false;
        self.each(
            FaultKind::Ec2,
            |r| {
                r.code.as_deref() == Some(INSUFFICIENT_CAPACITY)
                    && r.operation.as_deref().is_none_or(|o| o == action)
            },
            |_, fires| {
                let first = fires && !short;
                short |= fires;
                first
            },
        );
        if short {
            self.count(FaultKind::Ec2);
        }
        short
    }

    fn service(&self, kind: FaultKind, operation: &str, codes: &[(&str, u16)]) -> ServiceInjection {
        let mut out = ServiceInjection::default();
        self.each(
            kind,
            |r| {
                r.operation.as_deref().is_none_or(|o| o == operation)
                    && r.code.as_deref() != Some(INSUFFICIENT_CAPACITY)
            },
            |rule, fires| {
                out.delay += Duration::from_millis(rule.latency_ms);
                if out.error.is_some() || !fires {
                    return false;
                }
                let Some(code) = rule.code.as_deref() else {
                    return false;
                };
                let status = status_of(codes, code).unwrap_or(500);
                out.error = Some((status, code.to_string()));
                true
            },
        );
        if out.error.is_some() || !out.delay.is_zero() {
            self.count(kind);
        }
        out
    }

    /// A call to the validating webhook `webhook`.
    pub fn admission(&self, webhook: &str) -> AdmissionInjection {
        let mut out = AdmissionInjection::default();
        self.each(
            FaultKind::Admission,
            |r| r.webhook.as_deref().is_none_or(|w| w == webhook),
            |rule, fires| {
                out.delay += Duration::from_millis(rule.latency_ms);
                let first = fires && !out.down;
                out.down |= fires;
                first
            },
        );
        if out.down || !out.delay.is_zero() {
            self.count(FaultKind::Admission);
        }
        out
    }
}

fn api_reason(code: u16) -> &'static str {
    match code {
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        409 => "Conflict",
        401 => "Unauthorized",
        403 => "Forbidden",
        422 => "Invalid",
        404 => "NotFound",
        _ => "InternalError",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(json: serde_json::Value) -> FaultRule {
        let r: FaultRule = serde_json::from_value(json).expect("a rule");
        r.validate().expect("a valid rule");
        r
    }

    #[test]
    fn rules_match_by_verb_and_resource_and_run_out() {
        let f = Faults::default();
        f.add(FaultRule {
            verb: Some("create".into()),
            resource: Some("pods/eviction".into()),
            error_rate: 1.0,
            error_code: Some(503),
            times: Some(1),
            ..Default::default()
        });
        assert!(f.check("get", "pods/eviction", b"").error.is_none());
        assert_eq!(
            f.check("create", "pods/eviction", b"").error.unwrap().code,
            503
        );
        assert!(
            f.check("create", "pods/eviction", b"").error.is_none(),
            "times: 1 allows one failure"
        );
        assert!(
            FaultRule {
                error_rate: 2.0,
                ..Default::default()
            }
            .validate()
            .is_err()
        );
        assert_eq!(f.injected().get("api"), Some(&1));
    }

    #[test]
    fn a_rule_can_pick_requests_by_their_body() {
        let f = Faults::default();
        f.add(FaultRule {
            verb: Some("patch".into()),
            body_contains: Some(r#""phase":"Draining""#.into()),
            error_rate: 1.0,
            ..Default::default()
        });
        assert!(
            f.check("patch", "x", br#"{"status":{"phase":"Verifying"}}"#)
                .error
                .is_none()
        );
        assert!(
            f.check("patch", "x", br#"{"status":{"phase":"Draining"}}"#)
                .error
                .is_some()
        );
    }

    #[test]
    fn a_rule_without_a_kind_is_an_api_rule_and_serializes_as_before() {
        let r = rule(serde_json::json!({"verb": "get", "errorRate": 0.5}));
        assert_eq!(r.kind, FaultKind::Api);
        let back = serde_json::to_value(&r).expect("serializes");
        assert!(back.get("kind").is_none(), "{back}");
        assert!(back.get("watch").is_none(), "{back}");
    }

    #[test]
    fn a_rule_can_pick_one_field_manager() {
        let f = Faults::default();
        f.add(rule(
            serde_json::json!({"verb": "patch", "resource": "leases.coordination.k8s.io",
            "fieldManager": "kube-lease-manager-replica-a", "errorRate": 1.0, "errorCode": 503}),
        ));
        let lease = "leases.coordination.k8s.io";
        assert!(
            f.check_request("patch", lease, b"", Some("kube-lease-manager-replica-b"))
                .error
                .is_none()
        );
        assert!(f.check("patch", lease, b"").error.is_none());
        assert!(
            f.check_request("patch", lease, b"", Some("kube-lease-manager-replica-a"))
                .error
                .is_some()
        );
    }

    #[test]
    fn kinds_refuse_fields_that_are_not_theirs_with_what_they_take() {
        let bad = |json: serde_json::Value| {
            serde_json::from_value::<FaultRule>(json)
                .expect("parses")
                .validate()
                .expect_err("invalid")
        };
        let e = bad(serde_json::json!({"kind": "s3", "verb": "get"}));
        assert!(
            e.contains("verb does not apply to a rule of kind s3"),
            "{e}"
        );
        assert!(e.contains("operation, code"), "{e}");
        let e = bad(serde_json::json!({"kind": "s3", "errorRate": 1.0, "code": "NoSuchKey"}));
        assert!(e.contains("SlowDown, InternalError"), "{e}");
        let e = bad(serde_json::json!({"kind": "s3", "errorRate": 1.0}));
        assert!(e.contains("needs a code"), "{e}");
        let e = bad(serde_json::json!({"kind": "ec2", "errorRate": 1.0}));
        assert!(e.contains("RequestLimitExceeded"), "{e}");
        let e = bad(
            serde_json::json!({"kind": "ec2", "code": "InsufficientInstanceCapacity", "operation": "TerminateInstances"}),
        );
        assert!(e.contains("only answers a launch"), "{e}");
        let e = bad(serde_json::json!({"kind": "watch", "resource": "pods"}));
        assert!(e.contains("drop"), "{e}");
        let e = bad(serde_json::json!({"kind": "velero", "restart": "server", "times": 2}));
        assert!(e.contains("happens once"), "{e}");
        let e = bad(serde_json::json!({"kind": "velero", "restart": "server", "node": "n1"}));
        assert!(e.contains("node-agent"), "{e}");
        assert!(serde_json::from_value::<FaultRule>(serde_json::json!({"kind": "dns"})).is_err());
    }

    #[test]
    fn s3_and_ec2_rules_answer_with_the_service_code_and_its_status() {
        let f = Faults::default();
        f.add(rule(
            serde_json::json!({"kind": "s3", "operation": "GetObject", "code": "SlowDown", "errorRate": 1.0, "times": 1}),
        ));
        assert_eq!(f.s3("HeadObject").error, None);
        assert_eq!(f.s3("GetObject").error, Some((503, "SlowDown".into())));
        assert_eq!(f.s3("GetObject").error, None, "used up");
        f.add(rule(
            serde_json::json!({"kind": "ec2", "code": "InsufficientInstanceCapacity", "errorRate": 1.0}),
        ));
        assert!(
            !f.ec2_capacity("DescribeInstances"),
            "only launches lack capacity"
        );
        assert_eq!(f.ec2("CreateFleet").error, None, "capacity is asked apart");
        assert!(f.ec2_capacity("CreateFleet"));
        f.set(vec![rule(
            serde_json::json!({"kind": "ec2", "code": "RequestLimitExceeded", "errorRate": 1.0}),
        )]);
        assert_eq!(
            f.ec2("DescribeInstances").error,
            Some((503, "RequestLimitExceeded".into()))
        );
    }

    #[test]
    fn a_window_ends_the_rule() {
        let f = Faults::default();
        f.add(rule(
            serde_json::json!({"kind": "s3", "code": "ServiceUnavailable", "errorRate": 1.0, "durationMs": 30}),
        ));
        assert!(f.s3("HeadObject").error.is_some());
        std::thread::sleep(Duration::from_millis(40));
        assert!(f.s3("HeadObject").error.is_none());
        assert!(f.rules().is_empty());
    }

    #[test]
    fn watch_and_admission_rules() {
        let f = Faults::default();
        f.add(rule(
            serde_json::json!({"kind": "watch", "resource": "pods", "watch": "gone", "errorRate": 1.0, "times": 1}),
        ));
        assert!(!f.watch_gone("nodes"));
        assert!(!f.watch_drop("pods"));
        assert!(f.watch_gone("pods"));
        assert!(!f.watch_gone("pods"), "used up");
        f.add(rule(
            serde_json::json!({"kind": "admission", "webhook": "gate.snapdrain.io", "latencyMs": 10, "errorRate": 1.0}),
        ));
        assert_eq!(f.admission("other").delay, Duration::ZERO);
        let hit = f.admission("gate.snapdrain.io");
        assert!(hit.down);
        assert_eq!(hit.delay, Duration::from_millis(10));
    }

    #[test]
    fn a_velero_restart_is_done_once_and_not_kept() {
        let f = Faults::default();
        let mut restarts = f.subscribe_restarts();
        f.add(rule(
            serde_json::json!({"kind": "velero", "restart": "node-agent", "node": "n1"}),
        ));
        assert!(f.rules().is_empty());
        assert_eq!(
            restarts.try_recv().expect("a restart"),
            VeleroRestart {
                component: VeleroComponent::NodeAgent,
                node: Some("n1".into())
            }
        );
        assert_eq!(f.injected().get("velero"), Some(&1));
    }
}
