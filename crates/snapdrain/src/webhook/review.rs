//! The `admission.k8s.io/v1` AdmissionReview: reading what kube-apiserver sends, and the three answers
//! the gate gives (allow, hold with 429, cannot read the request).

use http::StatusCode;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::{DynamicObject, Status};
use serde_json::{Value, json};

use super::error::ReviewError;

/// What an AdmissionReview asks the gate.
#[derive(Debug)]
pub struct Asked {
    pub request: AdmissionRequest<DynamicObject>,
    pub target: Target,
}

/// The request, as far as the gate cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `pods/eviction` CREATE: `name` is the pod (the object is the Eviction, which has no pod labels,
    /// so the pod must be read: research/drain-anchors.md §2).
    Eviction {
        namespace: String,
        name: String,
        dry_run: bool,
    },
    /// Anything else the webhook's rules sent by mistake: allowed, with a warning saying what it was.
    NotGated(String),
}

/// Reads a body. Never panics, whatever the bytes.
pub fn parse(body: &[u8]) -> Result<Asked, ReviewError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| ReviewError::NotJson(e.to_string()))?;
    let field = |f: &str| {
        value
            .get(f)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    if api_version != "admission.k8s.io/v1" || kind != "AdmissionReview" {
        return Err(ReviewError::WrongKind { api_version, kind });
    }
    match value.get("request") {
        None | Some(Value::Null) => return Err(ReviewError::NoRequest),
        Some(r)
            if r.get("uid")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty) =>
        {
            return Err(ReviewError::NoUid);
        }
        Some(_) => {}
    }
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_value(value).map_err(|e| ReviewError::BadRequest(e.to_string()))?;
    let request: AdmissionRequest<DynamicObject> =
        review.try_into().map_err(|_| ReviewError::NoRequest)?;
    let target = target(&request);
    Ok(Asked { request, target })
}

fn target(req: &AdmissionRequest<DynamicObject>) -> Target {
    let r = &req.resource;
    let sub = req.sub_resource.as_deref().unwrap_or("");
    let eviction = r.group.is_empty()
        && r.version == "v1"
        && r.resource == "pods"
        && sub == "eviction"
        && req.operation == Operation::Create;
    match req.namespace.as_deref() {
        Some(ns) if eviction && !ns.is_empty() && !req.name.is_empty() => Target::Eviction {
            namespace: ns.to_owned(),
            name: req.name.clone(),
            dry_run: req.dry_run,
        },
        _ => {
            let group = if r.group.is_empty() { "core" } else { &r.group };
            let res = if sub.is_empty() {
                r.resource.clone()
            } else {
                format!("{}/{sub}", r.resource)
            };
            Target::NotGated(format!(
                "{:?} {group}/{}/{res} {:?}",
                req.operation, r.version, req.name
            ))
        }
    }
}

/// An HTTP answer: status and JSON body.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Value,
}

fn review_answer(response: AdmissionResponse) -> Answer {
    Answer {
        status: StatusCode::OK,
        // An AdmissionReview of plain strings and numbers always serializes.
        body: serde_json::to_value(response.into_review()).unwrap_or(Value::Null),
    }
}

pub fn allow(req: &AdmissionRequest<DynamicObject>, warning: Option<String>) -> Answer {
    let mut response = AdmissionResponse::from(req);
    response.warnings = warning.map(|w| vec![w]);
    review_answer(response)
}

/// A refusal with code 429: kube-apiserver keeps a webhook's code (only 0 is replaced,
/// `apiserver/pkg/admission/plugin/webhook/errors/statuserror.go` `ToStatusErr`), and drainers retry a
/// 429 (`kubectl/pkg/drain/drain.go` `evictPods`: `IsTooManyRequests` → "will retry after 5s";
/// Karpenter and Cluster Autoscaler requeue), where a 400 or 403 would fail `kubectl drain` at once.
pub fn hold(req: &AdmissionRequest<DynamicObject>, message: &str) -> Answer {
    let mut response = AdmissionResponse::from(req).deny(message);
    response.result = Status::failure(message, "TooManyRequests").with_code(429);
    review_answer(response)
}

/// A body the gate cannot read: 400 with a `Status` saying why.
pub fn unreadable(err: &ReviewError) -> Answer {
    failure(StatusCode::BAD_REQUEST, "BadRequest", &err.to_string())
}

fn failure(status: StatusCode, reason: &str, message: &str) -> Answer {
    Answer {
        status,
        body: json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
            "code": status.as_u16(), "reason": reason, "message": message}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn eviction_review(dry_run: bool) -> Value {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "subResource": "eviction",
                "requestKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "requestSubResource": "eviction",
                "name": "pg-0", "namespace": "db", "operation": "CREATE",
                "userInfo": {"username": "admin", "groups": ["system:masters"]},
                "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": "pg-0", "namespace": "db"}},
                "oldObject": null, "dryRun": dry_run,
                "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
            }
        })
    }

    fn body(v: &Value) -> Vec<u8> {
        serde_json::to_vec(v).expect("JSON serializes")
    }

    #[test]
    fn an_eviction_review_is_read() {
        let asked = parse(&body(&eviction_review(true))).expect("a valid review");
        assert_eq!(
            asked.target,
            Target::Eviction {
                namespace: "db".into(),
                name: "pg-0".into(),
                dry_run: true
            }
        );
    }

    #[test]
    fn a_hold_is_a_429_review_echoing_the_uid() {
        let asked = parse(&body(&eviction_review(false))).expect("a valid review");
        let a = hold(&asked.request, "waiting for backup b-1");
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.body["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(a.body["kind"], "AdmissionReview");
        let r = &a.body["response"];
        assert_eq!(r["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(r["allowed"], false);
        assert_eq!(r["status"]["code"], 429);
        assert_eq!(r["status"]["reason"], "TooManyRequests");
        assert_eq!(r["status"]["message"], "waiting for backup b-1");
        let ok = allow(&asked.request, None);
        assert_eq!(ok.body["response"]["allowed"], true);
    }

    #[test]
    fn other_requests_are_not_gated() {
        let mut v = eviction_review(false);
        v["request"]["subResource"] = Value::Null;
        v["request"]["operation"] = json!("DELETE");
        let asked = parse(&body(&v)).expect("a valid review");
        assert_eq!(
            asked.target,
            Target::NotGated("Delete core/v1/pods \"pg-0\"".into())
        );
    }

    #[test]
    fn bad_bodies_are_named() {
        assert!(matches!(parse(b"not json"), Err(ReviewError::NotJson(_))));
        let mut v = eviction_review(false);
        v["apiVersion"] = json!("admission.k8s.io/v1beta1");
        assert!(matches!(
            parse(&body(&v)),
            Err(ReviewError::WrongKind { .. })
        ));
        let mut v = eviction_review(false);
        v["request"] = Value::Null;
        assert_eq!(parse(&body(&v)).err(), Some(ReviewError::NoRequest));
        let mut v = eviction_review(false);
        v["request"]["uid"] = json!("");
        assert_eq!(parse(&body(&v)).err(), Some(ReviewError::NoUid));
        let mut v = eviction_review(false);
        v["request"]["operation"] = json!(7);
        assert!(matches!(parse(&body(&v)), Err(ReviewError::BadRequest(_))));
        let a = unreadable(&ReviewError::NoRequest);
        assert_eq!(a.status, StatusCode::BAD_REQUEST);
        assert_eq!(a.body["message"], "the AdmissionReview has no request");
    }
}
