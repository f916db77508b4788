//! Whether a Kubernetes API error can go away by retrying. A permanent one (RBAC, a refused request
//! body, authentication) fails the plan with its message; a transient one (conflict, throttling,
//! timeout, connection) is retried with backoff. kube-apiserver's codes: 401 Unauthorized, 403
//! Forbidden, 422 Invalid and 400 BadRequest cannot succeed unchanged; 404 depends on what was read,
//! so the caller decides.

/// True when retrying the same request cannot succeed.
pub fn is_permanent(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => matches!(status.code, 400 | 401 | 403 | 422),
        _ => false,
    }
}

/// Retries of a replica's start-up calls (its certificates, its Lease) under a transient error: about
/// half a minute, rather than a replica that stops on one 5xx from a busy or restarting API server.
pub fn startup_backoff() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(200))
        .with_max_delay(std::time::Duration::from_secs(5))
        .with_max_times(10)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("m", "r").with_code(code),
        ))
    }

    #[test]
    fn rbac_and_invalid_bodies_are_permanent_conflicts_and_throttling_are_not() {
        for code in [400, 401, 403, 422] {
            assert!(is_permanent(&api(code)), "{code}");
        }
        for code in [404, 409, 429, 500, 503, 504] {
            assert!(!is_permanent(&api(code)), "{code}");
        }
    }
}
