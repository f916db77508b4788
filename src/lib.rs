//! The `snapdrain` command. The product (controller, planning, backup, drain, cloud) is the `snapdrain`
//! crate; this crate is its command line, and with the default `sim` feature also:
//! - [`demo`]: `snapdrain demo`: the simulated cluster and the controller in one process, narrated.
//! - [`bench`]: measurements behind `snapdrain bench`.
//! - [`report`]: `snapdrain report`: a plan as HTML or Markdown (pure renderers).

pub mod cli;
pub mod report;

// The build script's revision lookup, unit-tested here (build scripts have no test harness).
#[cfg(test)]
#[path = "../build/revision.rs"]
mod revision;

#[cfg(feature = "sim")]
pub mod bench;
#[cfg(feature = "sim")]
pub mod demo;
