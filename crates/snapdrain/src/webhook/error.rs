//! What can go wrong in the eviction gate: a request the gate cannot read ([`ReviewError`], answered
//! with HTTP 400) and keeping its certificates ([`CertError`]). A decision itself cannot fail: it reads
//! memory only, and a cache still loading is a 429 that says so.

use thiserror::Error;

/// An AdmissionReview body the gate cannot answer. kube-apiserver checks every answer against the
/// request's uid and `admission.k8s.io/v1` AdmissionReview kind
/// (`apiserver/pkg/admission/plugin/webhook/request/admissionreview.go`, `VerifyAdmissionResponse`), so
/// without a readable request there is no valid review to send back: these become HTTP 400 with a
/// `Status` naming the problem, a failed call for the apiserver (its failurePolicy applies).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ReviewError {
    #[error("the body is not JSON: {0} (the gate expects an admission.k8s.io/v1 AdmissionReview)")]
    NotJson(String),
    #[error(
        "expected an admission.k8s.io/v1 AdmissionReview, got apiVersion {api_version:?} kind {kind:?} (set admissionReviewVersions: [\"v1\"] in the webhook configuration)"
    )]
    WrongKind { api_version: String, kind: String },
    #[error("the AdmissionReview has no request")]
    NoRequest,
    #[error("the AdmissionReview request cannot be read: {0}")]
    BadRequest(String),
    #[error("the AdmissionReview request has no uid to answer to")]
    NoUid,
}

/// Making, storing or serving the webhook's certificates.
#[derive(Debug, Error)]
pub enum CertError {
    #[error("cannot issue a certificate valid from {0}: the clock is before 1970")]
    BeforeEpoch(jiff::Timestamp),
    #[error("cannot issue a certificate: {0}")]
    Issue(#[from] rcgen::Error),
    #[error(
        "Secret {namespace}/{name} holds no usable {key}: {problem} (delete the Secret to have snapdrain issue new certificates)"
    )]
    BadSecret {
        namespace: String,
        name: String,
        key: &'static str,
        problem: String,
    },
    #[error(
        "cannot {action} Secret {namespace}/{name}: {source} (may snapdrain get, create and update secrets in {namespace}?)"
    )]
    Secret {
        action: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "cannot patch the caBundle of ValidatingWebhookConfiguration {name}: {source} (does it exist, and may snapdrain get and patch it?)"
    )]
    CaBundle {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot build the caBundle patch: {0} (a bug: please report it)")]
    Patch(String),
    #[error("cannot serve TLS on {addr}: {source} (pick another --webhook-addr)")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the TLS configuration cannot be built: {0}")]
    Tls(#[from] rustls::Error),
}

impl CertError {
    /// Whether the same call may succeed later: an API server error that is not a refusal (a 5xx,
    /// throttling, a timeout, a dropped connection). RBAC, a bad Secret or a port in use are not.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Secret { source, .. } | Self::CaBundle { source, .. } => {
                !crate::api_errors::is_permanent(source)
                    && !matches!(source, kube::Error::Api(s) if s.code == 404)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret_error(code: u16) -> CertError {
        CertError::Secret {
            action: "read",
            namespace: "snapdrain".into(),
            name: "snapdrain-webhook-tls".into(),
            source: kube::Error::Api(Box::new(
                kube::core::Status::failure("m", "r").with_code(code),
            )),
        }
    }

    #[test]
    fn server_errors_and_throttling_are_transient_refusals_are_not() {
        for code in [429, 500, 503, 504, 409] {
            assert!(secret_error(code).is_transient(), "{code}");
        }
        for code in [400, 401, 403, 404, 422] {
            assert!(!secret_error(code).is_transient(), "{code}");
        }
        let bad = CertError::BadSecret {
            namespace: "snapdrain".into(),
            name: "snapdrain-webhook-tls".into(),
            key: "ca.crt",
            problem: "not PEM".into(),
        };
        assert!(!bad.is_transient());
    }
}
