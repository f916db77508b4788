//! snapdrain: backup-aware node drain orchestrator for Kubernetes.
//!
//! Module map (one concern each):
//! - [`api`]: the DisruptionPlan CRD types; [`api_errors`]: which API errors retrying cannot fix.
//! - [`planning`]: pure decisions: which pods are protected, which backups are needed, eviction order.
//! - [`backup`]: Velero Backups and their verification in object storage.
//! - [`drain`]: cordon, eviction and waiting for pods and volumes.
//! - [`cloud`]: EC2 termination and launch, Bottlerocket user data.
//! - [`signals`]: disruption signals turned into plans, one plan per node.
//! - [`controller`]: reconcile wiring, leader election.
//! - [`webhook`]: the eviction gate (validating webhook on pods/eviction) and its certificates.
//! - [`telemetry`]: metrics and logs.
//! - [`fuzzing`]: what each parser of untrusted input holds for any bytes (the fuzz targets' bodies).

pub mod api;
pub mod api_errors;
pub mod backup;
pub mod cloud;
pub mod controller;
pub mod drain;
pub mod fuzzing;
pub mod planning;
pub mod signals;
pub mod telemetry;
pub mod webhook;
