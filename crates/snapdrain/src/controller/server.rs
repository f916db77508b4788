//! `/metrics` (Prometheus text format) and `/healthz` (see [`Health`]), served by every replica.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use super::health::Health;
use crate::telemetry::Metrics;

async fn metrics(
    State((m, _)): State<(Metrics, Health)>,
) -> ([(&'static str, &'static str); 1], String) {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.render(),
    )
}

/// 200 `ok` while the controller works, else 503 with what is wrong (see [`Health`]).
async fn healthz(State((_, health)): State<(Metrics, Health)>) -> (StatusCode, String) {
    match health.check() {
        Ok(()) => (StatusCode::OK, "ok".into()),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// Serves until the runtime stops; returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    metrics_handle: Metrics,
    health: Health,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state((metrics_handle, health));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok(bound)
}
