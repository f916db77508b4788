//! `/metrics` (Prometheus text format) and `/healthz`, served by every replica.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::routing::get;

use crate::telemetry::Metrics;

async fn metrics(State(m): State<Metrics>) -> ([(&'static str, &'static str); 1], String) {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.render(),
    )
}

/// Serves until the runtime stops; returns the bound address.
pub async fn serve(addr: SocketAddr, metrics_handle: Metrics) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(metrics_handle);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok(bound)
}
