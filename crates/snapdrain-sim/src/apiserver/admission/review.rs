//! The `admission.k8s.io/v1` AdmissionReview sent to a webhook, and what its answer means for the request
//! (`apiserver/pkg/admission/plugin/webhook/errors/statuserror.go` for denials).

use serde_json::{Value, json};

use super::super::errors::{ApiError, Cause};
use super::AdmissionAttributes;

pub fn request(attrs: &AdmissionAttributes<'_>, uid: &str) -> Value {
    let t = attrs.target;
    let sub = t.subresource.as_deref().unwrap_or("");
    // A subresource with its own kind (eviction) reports that kind; status and the like the parent's.
    let kind = match sub {
        "eviction" => json!({"group": "policy", "version": "v1", "kind": "Eviction"}),
        "binding" => json!({"group": "", "version": "v1", "kind": "Binding"}),
        _ => json!({"group": t.def.group, "version": t.version, "kind": t.def.kind}),
    };
    let resource = json!({"group": t.def.group, "version": t.version, "resource": t.def.plural});
    let options_kind = match attrs.operation {
        super::Operation::Create => "CreateOptions",
        super::Operation::Update => "UpdateOptions",
        super::Operation::Delete => "DeleteOptions",
        super::Operation::Connect => "",
    };
    let mut options = if options_kind.is_empty() {
        Value::Null
    } else {
        json!({"kind": options_kind, "apiVersion": "meta.k8s.io/v1"})
    };
    if attrs.dry_run && options.is_object() {
        options["dryRun"] = json!(["All"]);
    }
    let mut req = json!({
        "uid": uid,
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": attrs.name,
        "operation": attrs.operation.as_str(),
        "userInfo": {"username": attrs.user.name, "groups": attrs.user.groups},
        "object": attrs.object.cloned().unwrap_or(Value::Null),
        "oldObject": attrs.old_object.cloned().unwrap_or(Value::Null),
        "dryRun": attrs.dry_run,
        "options": options,
    });
    if !sub.is_empty() {
        req["subResource"] = json!(sub);
        req["requestSubResource"] = json!(sub);
    }
    if let Some(ns) = t.namespace.as_deref() {
        req["namespace"] = json!(ns);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})
}

/// `Ok(())` when the webhook allowed the request, `Err(Ok(status))` when it denied it, and
/// `Err(Err(reason))` when the answer is not a valid review (a failed call).
pub fn verdict(webhook: &str, uid: &str, answer: &Value) -> Result<(), Result<ApiError, String>> {
    let api_version = answer
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = answer.get("kind").and_then(Value::as_str).unwrap_or("");
    if api_version != "admission.k8s.io/v1" || kind != "AdmissionReview" {
        return Err(Err(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {api_version}, Kind={kind}"
        )));
    }
    let response = answer
        .get("response")
        .filter(|r| r.is_object())
        .ok_or_else(|| Err("webhook response was absent".to_string()))?;
    let got = response.get("uid").and_then(Value::as_str).unwrap_or("");
    if got != uid {
        return Err(Err(format!("expected response.uid={uid:?}, got {got:?}")));
    }
    if response.get("allowed").and_then(Value::as_bool) == Some(true) {
        return Ok(());
    }
    Err(Ok(denial(webhook, response.get("status"))))
}

/// A denial as the client sees it: the webhook's status, never below 400, its message prefixed.
pub fn denial(webhook: &str, status: Option<&Value>) -> ApiError {
    let empty = json!({});
    let status = status.unwrap_or(&empty);
    let text = |f: &str| {
        status
            .get(f)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let code = status
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400)
        .unwrap_or(400);
    let denied = format!("admission webhook \"{webhook}\" denied the request");
    let (message, reason) = (text("message"), text("reason"));
    let message = if !message.is_empty() {
        format!("{denied}: {message}")
    } else if !reason.is_empty() {
        format!("{denied}: {reason}")
    } else {
        format!("{denied} without explanation")
    };
    let mut e = ApiError::new(code, &reason, message);
    if let Some(d) = status.get("details") {
        let s = |f: &str| d.get(f).and_then(Value::as_str).map(str::to_string);
        e.name = s("name");
        e.group = s("group");
        e.kind = s("kind");
        e.retry_after_seconds = d
            .get("retryAfterSeconds")
            .and_then(Value::as_u64)
            .and_then(|r| u32::try_from(r).ok())
            .filter(|r| *r > 0);
        e.causes = d
            .get("causes")
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .map(|c| Cause {
                        reason: c.get("reason").and_then(Value::as_str).unwrap_or("").into(),
                        message: c
                            .get("message")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .into(),
                        field: c.get("field").and_then(Value::as_str).unwrap_or("").into(),
                    })
                    .collect()
            })
            .unwrap_or_default();
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denial_keeps_429_and_raises_low_codes() {
        let e = denial(
            "gate.snapdrain.io",
            Some(&json!({"code": 429, "message": "waiting for backup b-1"})),
        );
        assert_eq!(e.code, 429);
        assert_eq!(
            e.message,
            "admission webhook \"gate.snapdrain.io\" denied the request: waiting for backup b-1"
        );
        assert_eq!(e.reason, "");
        let low = denial("w", Some(&json!({"code": 200, "reason": "Nope"})));
        assert_eq!(low.code, 400);
        assert_eq!(
            low.message,
            "admission webhook \"w\" denied the request: Nope"
        );
        assert_eq!(
            denial("w", None).message,
            "admission webhook \"w\" denied the request without explanation"
        );
    }

    #[test]
    fn malformed_answers_are_call_failures() {
        let wrong_uid = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": "x", "allowed": true}});
        assert!(matches!(verdict("w", "y", &wrong_uid), Err(Err(_))));
        assert!(matches!(verdict("w", "y", &json!({})), Err(Err(_))));
    }
}
