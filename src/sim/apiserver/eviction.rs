//! TEMPORARY: eviction without the PDB check.
use super::ApiState;
use super::errors::ApiResult;
use super::handlers::{Reply, json_response};
use super::request::Target;
use super::store::DeleteOptions;
use axum::http::StatusCode;
use serde_json::{Value, json};
use std::sync::Arc;

pub async fn handle(
    state: &Arc<ApiState>,
    target: &Target,
    body: Value,
    _ua: Option<&str>,
) -> Reply {
    let name = target.name.as_deref().unwrap_or("");
    let opts = DeleteOptions {
        grace_period_seconds: body
            .pointer("/deleteOptions/gracePeriodSeconds")
            .and_then(Value::as_i64),
        precondition_uid: body
            .pointer("/deleteOptions/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string),
        ..Default::default()
    };
    state
        .store
        .delete(&target.def.key(), target.namespace.as_deref(), name, &opts)?;
    let r: ApiResult<()> = Ok(());
    r?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success","code":201}),
    ))
}
