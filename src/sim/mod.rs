//! The simulated cluster: a Kubernetes API server real clients use unchanged, and the world around it.

pub mod apiserver;
pub mod cluster;
pub mod error;
pub mod manifests;
pub mod world;

pub use cluster::{SimCluster, SimConfig};
pub use error::SimError;
