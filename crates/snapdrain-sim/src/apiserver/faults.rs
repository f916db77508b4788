//! Fault injection: error rates and latency per verb and resource, set at start or at runtime through
//! `/sim/faults`, so tests can see how clients cope with a flaky API server.

use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::errors::ApiError;

/// One rule. `verb` and `resource` default to any; `resource` is as in audit entries (`pods`,
/// `pods/eviction`, `backups.velero.io`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultRule {
    #[serde(default)]
    pub verb: Option<String>,
    #[serde(default)]
    pub resource: Option<String>,
    /// Fraction of matching requests that fail, 0.0 to 1.0.
    #[serde(default)]
    pub error_rate: f64,
    /// HTTP code of injected failures (500 unless set).
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
}

impl FaultRule {
    fn matches(&self, verb: &str, resource: &str, body: &[u8]) -> bool {
        let any =
            |v: &Option<String>, actual: &str| v.as_deref().is_none_or(|v| v == "*" || v == actual);
        let in_body = self.body_contains.as_deref().is_none_or(|text| {
            !text.is_empty() && body.windows(text.len()).any(|w| w == text.as_bytes())
        });
        any(&self.verb, verb) && any(&self.resource, resource) && in_body
    }

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
        Ok(())
    }
}

#[derive(Default)]
pub struct Faults {
    rules: Mutex<Vec<FaultRule>>,
}

/// What to do to one request.
pub struct Injection {
    pub delay: Duration,
    pub error: Option<ApiError>,
}

impl Faults {
    pub fn set(&self, rules: Vec<FaultRule>) {
        *self.rules.lock().unwrap_or_else(|e| e.into_inner()) = rules;
    }

    pub fn add(&self, rule: FaultRule) {
        self.rules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(rule);
    }

    pub fn rules(&self) -> Vec<FaultRule> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn check(&self, verb: &str, resource: &str, body: &[u8]) -> Injection {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        let mut delay = Duration::ZERO;
        let mut error = None;
        for rule in rules.iter_mut().filter(|r| r.matches(verb, resource, body)) {
            delay += Duration::from_millis(rule.latency_ms);
            if error.is_none() && rule.times != Some(0) && rand::random::<f64>() < rule.error_rate {
                if let Some(t) = rule.times.as_mut() {
                    *t -= 1;
                }
                let code = rule.error_code.unwrap_or(500);
                let reason = match code {
                    429 => "TooManyRequests",
                    503 => "ServiceUnavailable",
                    504 => "Timeout",
                    409 => "Conflict",
                    401 => "Unauthorized",
                    403 => "Forbidden",
                    422 => "Invalid",
                    404 => "NotFound",
                    _ => "InternalError",
                };
                error = Some(ApiError::new(
                    code,
                    reason,
                    format!("injected fault for {verb} {resource}"),
                ));
            }
        }
        Injection { delay, error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
