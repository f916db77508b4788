//! Scenarios: a cluster described in YAML (nodes, Karpenter pools, workloads, Velero) and a timeline of
//! events, loaded into the simulated cluster at start. Built-in scenarios are available by name.
//!
//! `format` is the file format, `load` turns it into objects (each created by `manifest`), `nodes` makes
//! Nodes, NodeClaims, NodePools and EC2NodeClasses, `materialize` pre-places workloads for large
//! clusters, `timeline` runs the timed actions, `builtin` holds the named scenarios and `crds` the
//! third-party CustomResourceDefinitions the simulated world serves.

pub mod builtin;
pub mod crds;
pub mod format;
pub mod load;
pub mod manifest;
pub mod materialize;
pub mod nodes;
pub mod timeline;

pub use format::Scenario;
pub use load::{LoadedScenario, NodeInstance, load, load_with_ca, parse, resolve};

/// Stands for the simulated S3 endpoint in scenario objects; the cluster fills it in at start.
pub const S3_URL_PLACEHOLDER: &str = "${S3_URL}";
/// What `${S3_URL}` becomes when no S3 simulator runs (MinIO's default address).
pub const S3_URL_FALLBACK: &str = "http://127.0.0.1:9000";

/// Why a scenario cannot be used. Each message names the scenario and where the problem is.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("cannot read scenario file {file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("scenario {file}: line {line}, column {column}: {message}")]
    Syntax {
        file: String,
        line: u64,
        column: u64,
        message: String,
    },
    #[error("scenario {file}: {path}: {message}")]
    Invalid {
        file: String,
        path: String,
        message: String,
    },
    #[error(
        "no scenario named {name}: it is neither a built-in scenario ({available}) nor a readable file"
    )]
    Unknown { name: String, available: String },
    #[error("scenario {file}: cannot create {what}: {message}")]
    Load {
        file: String,
        what: String,
        message: String,
    },
}
