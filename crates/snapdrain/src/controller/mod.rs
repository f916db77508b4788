//! The DisruptionPlan controller: wiring of kube-runtime's Controller, leader election, and the HTTP
//! endpoints every replica serves (`/metrics`, `/healthz`).
//!
//! - [`context`]: what reconciles share.
//! - [`reconcile`]: the plan driver: one pass over a plan (validate, call the phase's step, write, announce, decide).
//! - [`step`]: the contract between the driver and the steps.
//! - [`steps`]: the work of each phase.
//! - [`report`]: the catalogue of what a plan announces, published after the write that carries it.
//! - [`clock`]: the driver's clock, which moves with tokio's.
//! - [`leader`]: only the Lease holder acts.
//! - [`policy`]: the DisruptionPolicy in force.
//! - [`notifications`]: the notification webhook's URL (from a Secret) and the policy's condition.
//! - [`history`]: deletes finished plans the policy's history no longer keeps.
//! - [`holds`]: the hold keeper (holds on every protected pod, restored when a release is over).
//! - [`signals`]: the signal watcher (Karpenter, Cluster Autoscaler, NTH signals become plans).
//! - [`preview`]: what a plan would do, without doing it (`snapdrain plan NODE`).
//! - [`server`]: metrics and health.
//! - [`undecodable`]: plans that cannot be decoded, reported once and left alone.
//! - [`warm`]: the warm-backup Velero Schedules, one per protected namespace.
//! - [`health`]: what `/healthz` answers, and the panic hook that ends the process.

pub mod cache;
pub(crate) mod clock;
pub mod context;
pub mod error;
pub mod health;
pub mod history;
pub mod holds;
pub mod leader;
pub mod notifications;
pub mod policy;
pub mod preview;
pub(crate) mod reconcile;
pub(crate) mod report;
pub mod run;
pub mod server;
pub mod signals;
pub(crate) mod step;
pub(crate) mod steps;
pub mod undecodable;
pub mod warm;

pub use context::{Context, Settings};
pub use error::ControllerError;
pub use reconcile::FINALIZER;
pub use run::{ControllerHandle, start};
