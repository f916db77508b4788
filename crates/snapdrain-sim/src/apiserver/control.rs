//! The `/sim/` control surface on the API server's own port: fault injection and the audit log.
//!
//! - `GET /sim/faults`, `PUT /sim/faults` (replace with a JSON list of rules), `POST /sim/faults` (add one
//!   rule), `DELETE /sim/faults` (clear). Rules are keyed by `kind` (`api` when unset, `watch`, `s3`,
//!   `ec2`, `admission`, `velero`; see [`super::faults`]). `GET /sim/faults/injected`: how many faults
//!   were injected so far, by kind.
//! - `POST /sim/watches/drop`: cut every open watch. `POST /sim/watches/compact`: forget the event
//!   history so that resuming any earlier resourceVersion gets 410 Gone.
//! - `GET /sim/audit?since=N`: audit entries after sequence number N, as a JSON array.

use axum::http::{Method, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use serde_json::json;

use super::ApiState;
use super::errors::ApiError;
use super::faults::FaultRule;
use super::request::Query;
use super::response::json_response;

fn error(e: ApiError) -> Response {
    json_response(
        StatusCode::from_u16(e.code).unwrap_or(StatusCode::BAD_REQUEST),
        &e.to_status(),
    )
}

fn parse_rules(body: &Bytes, many: bool) -> Result<Vec<FaultRule>, ApiError> {
    let rules: Vec<FaultRule> = if many {
        serde_json::from_slice(body)
    } else {
        serde_json::from_slice::<FaultRule>(body).map(|r| vec![r])
    }
    .map_err(|e| ApiError::bad_request(format!("fault rule is not valid: {e}; expected e.g. {{\"verb\":\"create\",\"resource\":\"pods/eviction\",\"errorRate\":0.5}} or {{\"kind\":\"s3\",\"operation\":\"GetObject\",\"code\":\"SlowDown\",\"errorRate\":0.5}}")))?;
    for (i, r) in rules.iter().enumerate() {
        r.validate().map_err(|e| {
            ApiError::bad_request(if many {
                format!("fault rule #{}: {e}", i + 1)
            } else {
                format!("fault rule: {e}")
            })
        })?;
    }
    Ok(rules)
}

pub async fn handle(
    state: &ApiState,
    method: &Method,
    path: &str,
    query: &Query,
    body: &Bytes,
) -> Response {
    match (method.as_str(), path.trim_end_matches('/')) {
        ("GET", "/sim/faults") => json_response(StatusCode::OK, &json!(state.faults.rules())),
        ("GET", "/sim/faults/injected") => {
            json_response(StatusCode::OK, &json!(state.faults.injected()))
        }
        ("PUT", "/sim/faults") => match parse_rules(body, true) {
            Ok(rules) => {
                state.faults.set(rules);
                json_response(StatusCode::OK, &json!(state.faults.rules()))
            }
            Err(e) => error(e),
        },
        ("POST", "/sim/faults") => match parse_rules(body, false) {
            Ok(rules) => {
                rules.into_iter().for_each(|r| state.faults.add(r));
                json_response(StatusCode::OK, &json!(state.faults.rules()))
            }
            Err(e) => error(e),
        },
        ("DELETE", "/sim/faults") => {
            state.faults.set(Vec::new());
            json_response(StatusCode::OK, &json!([]))
        }
        ("POST", "/sim/watches/drop") => {
            state.store.drop_watches();
            json_response(StatusCode::OK, &json!({"dropped": true}))
        }
        ("POST", "/sim/watches/compact") => {
            state.store.compact();
            json_response(
                StatusCode::OK,
                &json!({"compactedAt": state.store.current_rv().to_string()}),
            )
        }
        ("GET", "/sim/audit") => {
            let since = query.get("since").and_then(|s| s.parse().ok()).unwrap_or(0);
            json_response(StatusCode::OK, &json!(state.audit.since(since)))
        }
        _ => error(ApiError::new(
            404,
            "NotFound",
            format!(
                "no simulator control endpoint {method} {path}; see /sim/faults, /sim/watches/drop, /sim/watches/compact, /sim/audit"
            ),
        )),
    }
}
