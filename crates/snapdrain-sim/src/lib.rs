//! The simulated cluster: a Kubernetes API server real clients use unchanged, and the world around it
//! (kubelets, controllers, Velero, Karpenter, Cluster Autoscaler, aws-node-termination-handler), plus EC2
//! and S3 endpoints the real AWS SDK talks to.

pub mod apiserver;
pub mod cluster;
pub mod ec2;
pub mod error;
pub mod manifests;
pub mod s3;
pub mod scenario;
pub mod sts;
pub mod world;

pub use cluster::{ScenarioSource, SimCluster, SimConfig};
pub use error::SimError;
