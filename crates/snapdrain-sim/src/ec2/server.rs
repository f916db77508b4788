//! HTTP front of the EC2 simulator (axum on loopback).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use super::Shared;
use super::actions::{self, ApiError};
use super::autoscaling;
use super::params::Params;
use super::xml;

pub(super) async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    // Every path and method: the query protocol POSTs to "/", but a GET with a query string is valid too.
    let app = axum::Router::new().fallback(handle).with_state(shared);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "EC2 simulator stopped serving");
    }
}

async fn handle(State(shared): State<Arc<Shared>>, uri: Uri, body: Bytes) -> Response {
    let request_id = uuid::Uuid::new_v4().to_string();
    if shared.outage.load(Ordering::SeqCst) {
        return error_response(
            &ApiError::new(
                503,
                "ServiceUnavailable",
                "The service is unavailable (simulated outage). Please try again shortly.",
            ),
            &request_id,
        );
    }
    let mut raw = body.to_vec();
    if let Some(q) = uri.query() {
        if !raw.is_empty() {
            raw.push(b'&');
        }
        raw.extend_from_slice(q.as_bytes());
    }
    let params = Params::parse(&raw);
    let injected = shared
        .faults
        .get()
        .map(|f| f.ec2(params.get("Action").unwrap_or_default()))
        .unwrap_or_default();
    if !injected.delay.is_zero() {
        tokio::time::sleep(injected.delay).await;
    }
    if let Some((status, code)) = injected.error {
        let message = injected_message(&code, params.get("Action").unwrap_or_default());
        return error_response(&ApiError::new(status, &code, &message), &request_id);
    }
    if params.get("Action").is_some_and(autoscaling::handles) {
        return match autoscaling::dispatch(&shared, &params, &request_id) {
            Ok(doc) => (StatusCode::OK, [(header::CONTENT_TYPE, "text/xml")], doc).into_response(),
            Err(e) => (
                StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
                [(header::CONTENT_TYPE, "text/xml")],
                autoscaling::error_document(&e.code, &e.message, &request_id),
            )
                .into_response(),
        };
    }
    match actions::dispatch(&shared, &params, &request_id) {
        Ok(doc) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/xml;charset=UTF-8")],
            doc,
        )
            .into_response(),
        Err(e) => {
            tracing::debug!(code = %e.code, message = %e.message, action = ?params.get("Action"), "sim ec2: error");
            error_response(&e, &request_id)
        }
    }
}

/// The message EC2 sends with an injected error `code` for `action`.
fn injected_message(code: &str, action: &str) -> String {
    match code {
        // IAM's refusal for a role whose policies do not allow the action, in the form the IAM User
        // Guide documents ("Troubleshoot access denied error messages": "... is not authorized to
        // perform: <action> because no identity-based policy allows the <action> action").
        "UnauthorizedOperation" => format!(
            "You are not authorized to perform this operation. User: arn:aws:sts::123456789012:assumed-role/snapdrain/controller is not authorized to perform: ec2:{action} because no identity-based policy allows the ec2:{action} action"
        ),
        // The answer to a request over the account's rate (EC2 API reference, "Request throttling").
        _ => "Request limit exceeded.".to_string(),
    }
}

fn error_response(e: &ApiError, request_id: &str) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "text/xml;charset=UTF-8")],
        xml::error_document(&e.code, &e.message, request_id),
    )
        .into_response()
}
