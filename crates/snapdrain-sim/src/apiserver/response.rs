//! What a handler returns, and a JSON response. A leaf, so that the subresource handlers (eviction) and
//! the control routes reply without importing the dispatcher that calls them.

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;

use super::errors::ApiResult;

pub type Reply = ApiResult<Response>;

pub fn json_response(code: StatusCode, v: &Value) -> Response {
    let body = serde_json::to_vec(v).unwrap_or_default();
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}
