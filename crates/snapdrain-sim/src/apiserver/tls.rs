//! The API server's TLS: a private CA made at start and a serving certificate it signed, as a
//! kubeadm-made control plane has (kubernetes `cmd/kubeadm/app/phases/certs/certlist.go`: the `ca` and
//! the `apiserver` certificate with `localhost`, the loopback addresses and the advertise address as
//! SANs). Clients trust the CA through the kubeconfig's `certificate-authority-data`; nothing skips
//! verification.

use std::net::IpAddr;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why the serving certificate could not be made or loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot issue the API server's CA or serving certificate: {0}")]
    Issue(#[from] rcgen::Error),
    #[error("cannot read back the API server's {what} PEM: {message}")]
    Pem { what: &'static str, message: String },
    #[error("cannot build the API server's TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The CA and the serving certificate (with its key) of one API server.
#[derive(Clone, Debug)]
pub struct ServingPki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl ServingPki {
    /// A fresh CA and a certificate for `localhost`, `127.0.0.1`, `::1` and `bound` (the listening
    /// address, when it is a specific one) signed by it.
    pub fn generate(bound: IpAddr) -> Result<Self, TlsError> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "snapdrain-sim kubernetes CA");
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;
        let key = rcgen::KeyPair::generate()?;
        let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
        if !bound.is_unspecified() && !bound.is_loopback() {
            names.push(bound.to_string());
        }
        // rcgen makes an IP address SAN of a name that parses as one.
        let mut params = rcgen::CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver");
        let cert = params.signed_by(&key, &ca)?;
        Ok(Self {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The CA certificate in DER, as `kube::Config::root_cert` takes it.
    pub fn ca_der(&self) -> Result<Vec<u8>, TlsError> {
        CertificateDer::from_pem_slice(self.ca_pem.as_bytes())
            .map(|c| c.as_ref().to_vec())
            .map_err(|e| TlsError::Pem {
                what: "CA",
                message: e.to_string(),
            })
    }

    /// The server side: this certificate, HTTP/2 and HTTP/1.1 offered by ALPN as kube-apiserver does
    /// (`staging/src/k8s.io/apiserver/pkg/server/secure_serving.go` `Serve`: `NextProtos` `h2`,
    /// `http/1.1`).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let certs = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Pem {
                what: "certificate",
                message: e.to_string(),
            })?;
        let key =
            PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(|e| TlsError::Pem {
                what: "key",
                message: e.to_string(),
            })?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier as _;
    use rustls::pki_types::{ServerName, UnixTime};

    /// Whether a client trusting only the CA accepts the serving certificate for `name`.
    fn verifies(pki: &ServingPki, name: &str) -> bool {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(pki.ca_der().expect("CA DER")))
            .expect("the CA is a valid root");
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("a verifier");
        let leaf = CertificateDer::from_pem_slice(pki.cert_pem.as_bytes()).expect("leaf PEM");
        let name = ServerName::try_from(name.to_string()).expect("a server name");
        verifier
            .verify_server_cert(&leaf, &[], &name, &[], UnixTime::now())
            .is_ok()
    }

    #[test]
    fn the_serving_certificate_names_loopback_and_the_bound_address_only() {
        let pki = ServingPki::generate(IpAddr::from([0, 0, 0, 0])).expect("issued");
        for name in ["localhost", "127.0.0.1", "::1"] {
            assert!(verifies(&pki, name), "{name}");
        }
        for name in ["10.0.0.7", "kubernetes.default.svc", "0.0.0.0"] {
            assert!(!verifies(&pki, name), "{name}");
        }
        let bound = ServingPki::generate(IpAddr::from([10, 0, 0, 7])).expect("issued");
        assert!(verifies(&bound, "10.0.0.7"));
        let other = ServingPki::generate(IpAddr::from([127, 0, 0, 1])).expect("issued");
        assert!(
            !verifies(
                &ServingPki {
                    ca_pem: other.ca_pem.clone(),
                    ..pki.clone()
                },
                "127.0.0.1"
            ),
            "another server's CA does not vouch for this certificate"
        );
        assert!(pki.server_config().is_ok());
    }
}
