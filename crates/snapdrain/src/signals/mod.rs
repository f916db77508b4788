//! Disruption signals (Karpenter, Cluster Autoscaler, aws-node-termination-handler, the eviction gate)
//! turned into DisruptionPlans, one plan per node at a time.
//!
//! - [`detect`]: which signal a node shows and what the policy makes of it.
//! - [`let_go`]: when a node snapdrain cannot save loses its holds (review #6).
//! - [`limits`]: whether a graceful signal may start a plan now (concurrency).
//! - [`window`]: maintenance windows (five-field cron in a time zone).
//! - [`plan`]: which plan a signal joins or creates, and the spec of a new one.
//! - [`error`]: what can go wrong doing it.

pub mod detect;
pub mod error;
pub mod let_go;
pub mod limits;
pub mod plan;
pub mod window;

pub use error::SignalError;
pub use plan::{NodeSignal, Outcome, join_or_create, join_or_create_known, spec_for};
