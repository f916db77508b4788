//! The simulated Kubernetes API server.

pub mod patch;
pub mod selectors;
