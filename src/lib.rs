//! snapdrain: backup-aware node drain orchestrator for Kubernetes.
//!
//! Module map (one concern each):
//! - [`api`]: the DisruptionPlan CRD types.
//! - [`planning`]: pure decisions: which pods are protected, which backups are needed, eviction order.
//! - [`backup`]: Velero Backups and their verification in object storage.
//! - [`drain`]: cordon, eviction and waiting for pods and volumes.
//! - [`cloud`]: EC2 termination and launch, Bottlerocket user data.
//! - [`controller`]: reconcile wiring, leader election.
//! - [`telemetry`]: metrics and logs.
//! - [`bench`]: measurements behind `snapdrain bench`.
//! - [`demo`]: `snapdrain demo`: the simulated cluster and the controller in one process, narrated.
//! - [`report`]: `snapdrain report`: a plan as HTML or Markdown (pure renderers).
//! - [`cli`]: the command line.
//! - [`sim`]: the simulated cluster used by the demo and the tests.

pub mod api;
pub mod backup;
pub mod bench;
pub mod cli;
pub mod cloud;
pub mod controller;
pub mod demo;
pub mod drain;
pub mod planning;
pub mod report;
pub mod sim;
pub mod telemetry;
