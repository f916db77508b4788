//! An HTTPS client for aws-sdk-s3 that accepts any server certificate, for a BackupStorageLocation with
//! `config.insecureSkipTLSVerify: "true"`.
//!
//! Why: velero-plugin-for-aws honours that setting (`velero-plugin-for-aws/object_store.go` `Init` parses
//! it with `strconv.ParseBool`, `velero-plugin-for-aws/config.go` `WithTLSSettings` sets the transport's
//! `InsecureSkipVerify`, which wins over `caCert`), so Velero writes backups to an endpoint with a
//! self-signed or otherwise untrusted certificate, and snapdrain must be able to read them back to verify
//! them. aws-smithy-http-client 1.5 builds its rustls `ClientConfig` itself (a WebPKI verifier over a
//! trust store) and has no public way to pass another verifier or connector (`wrap_connector` is
//! crate-private, `CryptoMode::Custom` only swaps the crypto provider and needs `aws_sdk_unstable`), so
//! this is a small [`HttpClient`] over hyper-util's pooled client with hyper-rustls, used for such a
//! location only.
//!
//! The handshake is still real TLS: the server must prove it holds the key of the certificate it sent
//! (its handshake signature is checked with the crypto provider's algorithms). Only who issued the
//! certificate, its validity period and the names in it go unchecked, as with Go's `InsecureSkipVerify`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use aws_sdk_s3::config::SharedHttpClient;
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector as TcpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

type HyperClient = Client<hyper_rustls::HttpsConnector<TcpConnector>, SdkBody>;

/// The S3 client's HTTP client for a location that skips certificate verification.
pub fn http_client() -> Result<SharedHttpClient, rustls::Error> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = AnyCertificate {
        algorithms: provider.signature_verification_algorithms,
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(SharedHttpClient::new(InsecureHttpClient {
        config,
        connector: OnceLock::new(),
    }))
}

/// Accepts every certificate chain; checks the handshake signatures made with its key.
#[derive(Debug)]
struct AnyCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[derive(Debug)]
struct InsecureHttpClient {
    config: rustls::ClientConfig,
    /// Built on first use with that request's timeouts (one S3 client has one set), then shared so
    /// connections are pooled.
    connector: OnceLock<SharedHttpConnector>,
}

impl HttpClient for InsecureHttpClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        _components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        self.connector
            .get_or_init(|| {
                let mut tcp = TcpConnector::new();
                tcp.enforce_http(false);
                tcp.set_nodelay(true);
                tcp.set_connect_timeout(settings.connect_timeout());
                let https = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(self.config.clone())
                    .https_or_http()
                    .enable_http1()
                    .wrap_connector(tcp);
                SharedHttpConnector::new(Connector {
                    client: Client::builder(TokioExecutor::new()).build(https),
                    read_timeout: settings.read_timeout(),
                })
            })
            .clone()
    }
}

#[derive(Debug)]
struct Connector {
    client: HyperClient,
    read_timeout: Option<Duration>,
}

impl HttpConnector for Connector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let request = match request.try_into_http1x() {
            Ok(r) => r,
            Err(e) => return HttpConnectorFuture::ready(Err(ConnectorError::user(e.into()))),
        };
        let sending = self.client.request(request);
        let read_timeout = self.read_timeout;
        HttpConnectorFuture::new(async move {
            let answer = match read_timeout {
                Some(limit) => tokio::time::timeout(limit, sending).await.map_err(|e| {
                    ConnectorError::timeout(
                        format!("no response from the S3 endpoint within {limit:?}: {e}").into(),
                    )
                })?,
                None => sending.await,
            };
            let response = answer.map_err(|e| {
                if e.is_connect() {
                    ConnectorError::io(e.into())
                } else {
                    ConnectorError::other(e.into(), None)
                }
            })?;
            HttpResponse::try_from(response.map(SdkBody::from_body_1_x))
                .map_err(|e| ConnectorError::other(e.into(), None))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_certificate_is_accepted() {
        let v = AnyCertificate {
            algorithms: rustls::crypto::aws_lc_rs::default_provider()
                .signature_verification_algorithms,
        };
        // Not even DER: nothing about the certificate is looked at.
        let garbage = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x00]);
        let name = ServerName::try_from("s3.example").expect("a valid DNS name");
        assert!(
            v.verify_server_cert(&garbage, &[], &name, &[], UnixTime::now())
                .is_ok()
        );
        assert!(!v.supported_verify_schemes().is_empty());
    }

    #[test]
    fn the_client_builds() {
        assert!(http_client().is_ok());
    }
}
