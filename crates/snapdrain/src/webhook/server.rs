//! HTTPS for the gate: axum over rustls, with the certificate chosen per handshake from a slot the
//! keeper refills, so a rotation takes effect on the next connection and drops none in flight. What
//! one client may hold of it (connections, time, reviews in flight) is in [`limits`].

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use http::StatusCode;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::Semaphore;

use super::error::CertError;
use super::gate::Gate;
use super::limits;

/// The certificate every new TLS handshake gets.
#[derive(Debug, Default)]
pub struct CertSlot {
    current: RwLock<Option<(String, Arc<CertifiedKey>)>>,
}

impl CertSlot {
    /// Serves `cert_pem`/`key_pem` from the next handshake on. Returns false when it was already served.
    pub fn install(&self, cert_pem: &str, key_pem: &str) -> Result<bool, CertError> {
        if self.serving().as_deref() == Some(cert_pem) {
            return Ok(false);
        }
        let bad = |problem: String| CertError::Tls(rustls::Error::General(problem));
        let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(format!("the certificate PEM cannot be read: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| bad(format!("the key PEM cannot be read: {e}")))?;
        let signing = rustls::crypto::aws_lc_rs::sign::any_supported_type(&key)?;
        let certified = Arc::new(CertifiedKey::new(chain, signing));
        *self.current.write().unwrap_or_else(|e| e.into_inner()) =
            Some((cert_pem.to_owned(), certified));
        Ok(true)
    }

    /// The PEM served now.
    pub fn serving(&self) -> Option<String> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(pem, _)| pem.clone())
    }
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(_, k)| k.clone())
    }
}

/// What the handler shares: the gate, and the places for reviews in flight.
#[derive(Clone)]
struct Served {
    gate: Arc<Gate>,
    in_flight: Arc<Semaphore>,
    /// The number of places `in_flight` started with, for the 503's message.
    cap: usize,
}

async fn validate(State(served): State<Served>, body: Bytes) -> axum::response::Response {
    // Over the cap the answer is at once, never a queue: a failed call lets kube-apiserver's
    // failurePolicy decide now rather than after timeoutSeconds.
    let Ok(_place) = served.in_flight.try_acquire() else {
        served.gate.metrics.gate_decision("error");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                "reason": "ServiceUnavailable", "code": 503,
                "message": format!("snapdrain's eviction gate is answering {} reviews already; retry", served.cap)})),
        )
            .into_response();
    };
    let started = Instant::now();
    let answer = served.gate.answer(&body);
    served
        .gate
        .metrics
        .gate_latency
        .observe(started.elapsed().as_secs_f64());
    (answer.status, axum::Json(answer.body)).into_response()
}

/// The gate's routes: `POST /validate` (the AdmissionReview, at most [`limits::BODY`] bytes, at most
/// `in_flight` at once) and `GET /healthz`.
pub fn router(gate: Arc<Gate>, in_flight: usize) -> axum::Router {
    axum::Router::new()
        .route("/validate", post(validate))
        .route("/healthz", get(|| async { "ok" }))
        .layer(DefaultBodyLimit::max(limits::BODY))
        .with_state(Served {
            gate,
            in_flight: Arc::new(Semaphore::new(in_flight)),
            cap: in_flight,
        })
}

/// Listens on `addr` with TLS from `slot`; returns the bound address and a handle that stops it.
pub fn serve(
    addr: SocketAddr,
    slot: Arc<CertSlot>,
    gate: Arc<Gate>,
    in_flight: usize,
) -> Result<(SocketAddr, axum_server::Handle<SocketAddr>), CertError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(slot);
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let config = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(tls));
    let listen = |source| CertError::Listen { addr, source };
    let listener = std::net::TcpListener::bind(addr).map_err(listen)?;
    listener.set_nonblocking(true).map_err(listen)?;
    let bound = listener.local_addr().map_err(listen)?;
    // Capped first (a refused connection costs no handshake), then TLS.
    let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(config)
        .handshake_timeout(limits::HANDSHAKE)
        .acceptor(limits::Capped::new(limits::CONNECTIONS, limits::PER_PEER));
    let mut server = axum_server::from_tcp(listener)
        .map_err(listen)?
        .acceptor(acceptor)
        .first_request_timeout(limits::FIRST_REQUEST);
    let http = server.http_builder();
    http.http1().header_read_timeout(limits::IDLE);
    http.http2()
        .max_concurrent_streams(u32::try_from(limits::IN_FLIGHT).unwrap_or(u32::MAX));
    let handle = axum_server::Handle::new();
    let app = router(gate, in_flight);
    let server = server.handle(handle.clone());
    tokio::spawn(async move {
        if let Err(e) = server.serve(app.into_make_service()).await {
            tracing::error!(error = %e, "the eviction gate stopped serving");
        }
    });
    Ok((bound, handle))
}

/// Stops accepting, lets requests in flight finish (up to `grace`).
pub fn stop(handle: &axum_server::Handle<SocketAddr>, grace: Duration) {
    handle.graceful_shutdown(Some(grace));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhook::certs::{self, Lifetimes};

    #[test]
    fn the_slot_serves_what_was_installed_and_swaps_on_renewal() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let names = certs::service_names("snapdrain-webhook", "ops");
        let now = jiff::Timestamp::from_second(1_800_000_000).expect("in range");
        let b = certs::renew(None, &names, Lifetimes::default(), Duration::ZERO, now)
            .expect("issue")
            .expect("a new bundle");
        let slot = CertSlot::default();
        assert_eq!(slot.serving(), None);
        assert!(
            slot.install(&b.serving.cert_pem, &b.serving.key_pem)
                .expect("valid PEM")
        );
        assert!(
            !slot
                .install(&b.serving.cert_pem, &b.serving.key_pem)
                .expect("valid PEM")
        );
        assert_eq!(slot.serving().as_deref(), Some(b.serving.cert_pem.as_str()));
        let later = now
            .checked_add(jiff::SignedDuration::from_hours(24 * 80))
            .expect("in range");
        let r = certs::renew(
            Some(&b),
            &names,
            Lifetimes::default(),
            Duration::ZERO,
            later,
        )
        .expect("issue")
        .expect("due");
        assert!(
            slot.install(&r.serving.cert_pem, &r.serving.key_pem)
                .expect("valid PEM")
        );
        assert_eq!(slot.serving().as_deref(), Some(r.serving.cert_pem.as_str()));
        assert!(slot.install("not a certificate", "nor a key").is_err());
    }
}
