//! Errors of the simulated cluster, naming what failed and what to do.

use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot listen on {addr}: {source} (pick another --addr, or port 0 for any free port)")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the API server on {addr} cannot serve TLS: {source}")]
    Tls {
        addr: SocketAddr,
        source: crate::apiserver::tls::TlsError,
    },
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot load {what} into the simulated cluster: {message}")]
    Load { what: String, message: String },
    #[error("scenario {file}: {message}")]
    Scenario { file: String, message: String },
    #[error(transparent)]
    ScenarioFile(#[from] super::scenario::ScenarioError),
}
